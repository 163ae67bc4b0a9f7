//! Errors as HTTP answers: an [`ApiError`] becomes the status its kind calls for and the Tinker
//! SDK's JSON error shape (`error`, `category`), and so does every error answer axum makes itself.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::{ApiError, ApiErrorKind};

/// An [`ApiError`] as an HTTP answer: the status its kind calls for and a JSON body naming the
/// problem (never empty: the SDK reads an empty 400 as a proxy's and retries).
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(error: ApiError) -> Self {
        HttpError(error)
    }
}

/// The Tinker SDK's error category of a failure.
pub fn category(kind: ApiErrorKind) -> &'static str {
    if kind.is_user_error() {
        "user"
    } else {
        "server"
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = match self.0.kind {
            // 409 would be retried by the SDK; a replayed seq_id with another payload cannot
            // succeed.
            // Not 501 for what is not offered: the SDK retries every 5xx for minutes.
            ApiErrorKind::InvalidRequest | ApiErrorKind::Conflict | ApiErrorKind::NotOffered => {
                StatusCode::BAD_REQUEST
            }
            ApiErrorKind::NotFound => StatusCode::NOT_FOUND,
            // What the SDK's heartbeat reads as "the session has finished".
            ApiErrorKind::Gone => StatusCode::GONE,
            ApiErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            // Not 429: clients retry that, and a quota does not lift by waiting.
            ApiErrorKind::QuotaExceeded => StatusCode::FORBIDDEN,
            ApiErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = json!({
            "error": public_message(&self.0),
            "category": category(self.0.kind),
            "kind": self.0.kind,
        });
        // The access log reads the kind from here.
        (status, axum::Extension(self.0.kind), axum::Json(body)).into_response()
    }
}

/// What a client is told of `error`: its message, except for an internal failure's, which can
/// name the server's files and workings: that one goes to the server's log under a reference,
/// and the client is told the reference.
pub(crate) fn public_message(error: &ApiError) -> String {
    if error.kind != ApiErrorKind::Internal {
        return error.message.clone();
    }
    let mut bytes = [0u8; 4];
    let reference = match getrandom::fill(&mut bytes) {
        Ok(()) => hex::encode(bytes),
        Err(_) => "unnumbered".to_string(),
    };
    tracing::error!(reference, "internal error: {}", error.message);
    format!("internal error {reference}: the server's log has its details")
}

/// Give every error answer the Tinker error shape, also those that axum makes itself (an
/// oversized body, a wrong method): a JSON body with `error` and `category`, never empty.
pub(super) async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match text.is_empty() {
        true => status.canonical_reason().unwrap_or("error").to_string(),
        false => text,
    };
    let category = if status.is_server_error() {
        "server"
    } else {
        "user"
    };
    (
        status,
        Json(json!({ "error": message, "category": category })),
    )
        .into_response()
}
