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
}

/// An answer body: JSON, or protobuf where the server says `application/x-protobuf`.
pub enum Reply {
    Json(Value),
    Proto(Bytes),
}

impl Reply {
    /// The JSON answer, or an error naming `what` was answered in protobuf.
    pub fn json(self, what: &str) -> Result<Value, ApiError> {
        match self {
            Reply::Json(value) => Ok(value),
            Reply::Proto(_) => Err(ApiError::internal(format!(
                "{what}: the server answered protobuf where JSON was expected"
            ))),
        }
    }

    /// The protobuf answer, or an error naming `what` was answered in JSON.
    pub fn proto(self, what: &str) -> Result<Bytes, ApiError> {
        match self {
            Reply::Proto(bytes) => Ok(bytes),
            Reply::Json(value) => Err(ApiError::internal(format!(
                "{what}: the server answered JSON where protobuf was expected: {value}"
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

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Body>,
    ) -> Result<Reply, ApiError> {
        let (bytes, content_type) = match body {
            Some(Body::Json(value)) => (Bytes::from(value.to_string()), "application/json"),
            Some(Body::Proto(bytes)) => (Bytes::from(bytes), "application/x-protobuf"),
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
        let proto = response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/x-protobuf"));
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unavailable(&e))?
            .to_bytes();
        if proto {
            return Ok((status, Reply::Proto(body)));
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
    let kind = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ApiErrorKind::Unauthorized,
        StatusCode::NOT_FOUND => ApiErrorKind::NotFound,
        StatusCode::CONFLICT => ApiErrorKind::Conflict,
        StatusCode::TOO_MANY_REQUESTS => ApiErrorKind::TooManyRequests,
        StatusCode::REQUEST_TIMEOUT | StatusCode::SERVICE_UNAVAILABLE => ApiErrorKind::Unavailable,
        s if s.is_client_error() => ApiErrorKind::InvalidRequest,
        _ => ApiErrorKind::Internal,
    };
    let message = match reply {
        Reply::Json(value) => value["error"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| value.to_string()),
        Reply::Proto(_) => String::from("(a protobuf body)"),
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
