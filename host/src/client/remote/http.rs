//! The HTTP side of the remote client, as the Tinker SDK speaks it: every request carries the
//! API key and an idempotency key; what the wire says to retry (no connection, 408, 429, 5xx) is
//! sent again with the same key, with a growing pause, for a bounded time (a server restarting
//! after a crash comes back within it); a long op is answered with a request id whose future is
//! polled until its result.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::api::{ApiError, ApiErrorKind};

/// How long one request is retried (the SDK retries for minutes).
const RETRY_FOR: Duration = Duration::from_secs(300);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// The longest a single HTTP exchange may take (a `retrieve_future` poll is held ~30 s).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(90);

/// A request body.
pub enum Body {
    Json(Value),
    /// A protobuf message (`forward_backward`).
    Proto(Vec<u8>),
    /// Bytes as they are (a plugin's component).
    Raw(Vec<u8>),
}

/// An answer body: JSON, or protobuf where the server says `application/x-protobuf`.
pub enum Reply {
    Json(Value),
    Proto(Bytes),
    /// Any other type: a file.
    Raw(Bytes),
}

impl Reply {
    /// The JSON answer, or an error naming `what` was answered in protobuf.
    pub fn json(self, what: &str) -> Result<Value, ApiError> {
        match self {
            Reply::Json(value) => Ok(value),
            Reply::Proto(_) | Reply::Raw(_) => Err(ApiError::internal(format!(
                "{what}: the server answered bytes where JSON was expected"
            ))),
        }
    }

    /// The bytes answered (a JSON file's text, as the server sent it, re-encoded).
    pub fn bytes(self) -> Bytes {
        match self {
            Reply::Raw(bytes) | Reply::Proto(bytes) => bytes,
            Reply::Json(value) => Bytes::from(value.to_string()),
        }
    }

    /// The protobuf answer, or an error naming `what` was answered in JSON.
    pub fn proto(self, what: &str) -> Result<Bytes, ApiError> {
        match self {
            Reply::Proto(bytes) => Ok(bytes),
            Reply::Json(value) => Err(ApiError::internal(format!(
                "{what}: the server answered JSON where protobuf was expected: {value}"
            ))),
            Reply::Raw(_) => Err(ApiError::internal(format!(
                "{what}: the server answered bytes of another type where protobuf was expected"
            ))),
        }
    }
}

/// A field of a JSON answer that must be a string.
pub fn text_field(value: &Value, field: &str, what: &str) -> Result<String, ApiError> {
    value[field]
        .as_str()
        .map(String::from)
        .ok_or_else(|| ApiError::internal(format!("{what}: the answer has no `{field}`: {value}")))
}

/// One server's API, reached with one tenant's key.
pub struct Connection {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `http://host:port/api/v1`, without a trailing slash.
    base: String,
    key: String,
}

impl Connection {
    /// A connection to the server at `url` (`http://host:port`) with API key `key`.
    pub fn new(url: &str, key: &str) -> Result<Self, ApiError> {
        let url = url.trim_end_matches('/');
        if url.starts_with("https://") {
            return Err(ApiError::invalid(format!(
                "{url}: https is not spoken yet; reach the server over http (a TLS-terminating \
                 proxy in front of it, or an SSH tunnel)"
            )));
        }
        if !url.starts_with("http://") {
            return Err(ApiError::invalid(format!(
                "{url}: not an http:// URL of an opentinker (or Tinker) server"
            )));
        }
        if !key.starts_with("tml-") {
            return Err(ApiError::new(
                ApiErrorKind::Unauthorized,
                "the API key must start with `tml-` (`opentinker tenant create` prints one); \
                 give it with --api-key or TINKER_API_KEY",
            ));
        }
        let base = match url.ends_with("/api/v1") {
            true => url.to_string(),
            false => format!("{url}/api/v1"),
        };
        Ok(Connection {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base,
            key: key.to_string(),
        })
    }

    /// GET `path` (under `/api/v1`).
    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.send(Method::GET, path, None).await?.json(path)
    }

    /// POST `body` to `path` and return the answer as it comes (no future).
    pub async fn post(&self, path: &str, body: Body) -> Result<Reply, ApiError> {
        self.send(Method::POST, path, Some(body)).await
    }

    /// POST an op to `path` and wait for its result: the answer is a request id, whose future
    /// is polled until it holds the result or an error.
    pub async fn call(&self, path: &str, body: Body) -> Result<Reply, ApiError> {
        let submitted = self.post(path, body).await?.json(path)?;
        let request_id = text_field(&submitted, "request_id", path)?;
        self.wait(&request_id, path).await
    }

    /// Poll the future of `request_id` (an op sent to `path`) until its result or error.
    pub async fn wait(&self, request_id: &str, path: &str) -> Result<Reply, ApiError> {
        loop {
            let poll = json!({ "request_id": request_id, "allow_metadata_only": false });
            match self.post("retrieve_future", Body::Json(poll)).await? {
                Reply::Json(value) if value["type"] == "try_again" => continue,
                Reply::Json(value) if value.get("error").is_some() => {
                    return Err(future_error(&value, path));
                }
                reply => return Ok(reply),
            }
        }
    }

    /// Store the component `bytes` on the server (`POST /api/v1/plugins`, an opentinker
    /// extension) unless it is there already; its digest (`sha256:HEX`) and whether it was
    /// uploaded now.
    pub async fn upload_plugin(&self, bytes: Vec<u8>) -> Result<(String, bool), ApiError> {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        match self.get(&format!("plugins/{digest}")).await {
            Ok(_) => return Ok((digest, false)),
            Err(error) if error.kind == ApiErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let stored = self
            .post("plugins", Body::Raw(bytes))
            .await?
            .json("plugins")?;
        let answered = stored["digest"].as_str().unwrap_or_default();
        if answered != digest {
            return Err(ApiError::internal(format!(
                "the server stored the plugin as {answered:?}, not {digest}"
            )));
        }
        Ok((digest, true))
    }

    /// GET `path` as it comes (a file).
    pub async fn get_bytes(&self, path: &str) -> Result<Bytes, ApiError> {
        Ok(self.send(Method::GET, path, None).await?.bytes())
    }

    /// Read the server-sent events of `path` as they come, telling each (its `event` and `data`)
    /// to `each` until the server ends the stream or `each` answers false. Not retried: a
    /// follower whose stream breaks connects again.
    pub async fn events(
        &self,
        path: &str,
        mut each: impl FnMut(&str, &str) -> bool,
    ) -> Result<(), ApiError> {
        let uri = format!("{}/{}", self.base, path.trim_start_matches('/'));
        let request = Request::builder()
            .method(Method::GET)
            .uri(&uri)
            .header("X-API-Key", &self.key)
            .header(header::ACCEPT, "text/event-stream")
            .body(Full::new(Bytes::new()))
            .map_err(|e| ApiError::invalid(format!("{uri}: {e}")))?;
        let unavailable = |e: &dyn std::fmt::Display| {
            ApiError::new(ApiErrorKind::Unavailable, format!("{path}: {e}"))
        };
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| unavailable(&e))?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .map_err(|e| unavailable(&e))?
                .to_bytes();
            let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            return Err(status_error(status, &Reply::Json(value), path));
        }
        let mut pending = Vec::new();
        let mut event = ServerEvent::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| unavailable(&e))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                if let Some(done) = event.feed(line.trim_end_matches(['\r', '\n']))
                    && !each(&done.event, &done.data)
                {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Body>,
    ) -> Result<Reply, ApiError> {
        let (bytes, content_type) = match body {
            Some(Body::Json(value)) => (Bytes::from(value.to_string()), "application/json"),
            Some(Body::Proto(bytes)) => (Bytes::from(bytes), "application/x-protobuf"),
            Some(Body::Raw(bytes)) => (Bytes::from(bytes), "application/octet-stream"),
            None => (Bytes::new(), "application/json"),
        };
        let idempotency = idempotency_key()?;
        let uri = format!("{}/{}", self.base, path.trim_start_matches('/'));
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let request = Request::builder()
                .method(method.clone())
                .uri(&uri)
                .header("X-API-Key", &self.key)
                .header("X-Idempotency-Key", &idempotency)
                .header(header::CONTENT_TYPE, content_type)
                .body(Full::new(bytes.clone()))
                .map_err(|e| ApiError::invalid(format!("{uri}: {e}")))?;
            let failure = match tokio::time::timeout(EXCHANGE_TIMEOUT, self.exchange(request)).await
            {
                Ok(Ok((status, reply))) if status.is_success() => return Ok(reply),
                Ok(Ok((status, reply))) => {
                    let error = status_error(status, &reply, path);
                    if !retried(status) {
                        return Err(error);
                    }
                    error
                }
                Ok(Err(error)) => error,
                Err(_) => ApiError::new(
                    ApiErrorKind::Unavailable,
                    format!("{path}: no answer within {EXCHANGE_TIMEOUT:?}"),
                ),
            };
            if started.elapsed() + pause > RETRY_FOR {
                return Err(failure);
            }
            tracing::debug!(path, error = %failure, "retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// One HTTP exchange: the status and the whole body. A connection that fails is
    /// `Unavailable` (retried: the server may be restarting).
    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Reply), ApiError> {
        let unavailable = |e: &dyn std::fmt::Display| {
            ApiError::new(
                ApiErrorKind::Unavailable,
                format!("{}: {e}", request_target(&self.base)),
            )
        };
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| unavailable(&e))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|t| t.as_bytes().to_vec())
            .unwrap_or_default();
        let proto = content_type.starts_with(b"application/x-protobuf");
        let raw = status.is_success()
            && !content_type.is_empty()
            && !proto
            && !content_type.starts_with(b"application/json");
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unavailable(&e))?
            .to_bytes();
        if proto {
            return Ok((status, Reply::Proto(body)));
        }
        if raw {
            return Ok((status, Reply::Raw(body)));
        }
        let value = match body.is_empty() {
            true => Value::Null,
            false => serde_json::from_slice(&body).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&body).chars().take(500).collect())
            }),
        };
        Ok((status, Reply::Json(value)))
    }
}

/// A server-sent event being read, line by line.
#[derive(Default)]
struct ServerEvent {
    event: String,
    data: String,
}

impl ServerEvent {
    /// Take one line; the event it completes, on the blank line that ends one.
    fn feed(&mut self, line: &str) -> Option<ServerEvent> {
        if line.is_empty() {
            let done = std::mem::take(self);
            return (!done.data.is_empty() || !done.event.is_empty()).then_some(done);
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
            }
            // Comments (keep-alives) and ids.
            _ => {}
        }
        None
    }
}

/// The server's address, for errors.
fn request_target(base: &str) -> &str {
    base.trim_end_matches("/api/v1")
}

/// Statuses the wire says to send again.
fn retried(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// The error of an HTTP answer that is not a success.
fn status_error(status: StatusCode, reply: &Reply, path: &str) -> ApiError {
    let named = match reply {
        Reply::Json(value) => serde_json::from_value::<ApiErrorKind>(value["kind"].clone()).ok(),
        _ => None,
    };
    let kind = named.unwrap_or(match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ApiErrorKind::Unauthorized,
        StatusCode::NOT_FOUND => ApiErrorKind::NotFound,
        StatusCode::GONE => ApiErrorKind::Gone,
        StatusCode::CONFLICT => ApiErrorKind::Conflict,
        StatusCode::TOO_MANY_REQUESTS => ApiErrorKind::TooManyRequests,
        StatusCode::REQUEST_TIMEOUT | StatusCode::SERVICE_UNAVAILABLE => ApiErrorKind::Unavailable,
        s if s.is_client_error() => ApiErrorKind::InvalidRequest,
        _ => ApiErrorKind::Internal,
    });
    let message = match reply {
        Reply::Json(value) => value["error"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| value.to_string()),
        Reply::Proto(_) => String::from("(a protobuf body)"),
        Reply::Raw(bytes) => String::from_utf8_lossy(bytes).chars().take(500).collect(),
    };
    ApiError::new(kind, format!("{path}: {status}: {message}"))
}

/// The error a future ended with: `{"error", "category", "kind"?}`.
fn future_error(value: &Value, path: &str) -> ApiError {
    let kind = serde_json::from_value::<ApiErrorKind>(value["kind"].clone()).unwrap_or(
        match value["category"].as_str() {
            Some("user") => ApiErrorKind::InvalidRequest,
            _ => ApiErrorKind::Internal,
        },
    );
    let message = value["error"].as_str().unwrap_or("(no message)");
    ApiError::new(kind, format!("{path}: {message}"))
}

/// A fresh idempotency key: the same for every try of one request.
fn idempotency_key() -> Result<String, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness for an idempotency key: {e}")))?;
    Ok(format!("ot-{}", hex::encode(bytes)))
}
