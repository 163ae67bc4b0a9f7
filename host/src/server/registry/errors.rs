//! Refusals as the OCI distribution spec writes them: a status and a JSON envelope
//! `{"errors": [{"code", "message", "detail"}]}` whose message names the problem and its fix.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::{ApiError, ApiErrorKind};
use crate::market::MarketError;

/// The spec's error codes (and `UNKNOWN`, the distribution registry's for a server fault).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OciCode {
    BlobUnknown,
    BlobUploadUnknown,
    DigestInvalid,
    ManifestBlobUnknown,
    ManifestInvalid,
    ManifestUnknown,
    NameInvalid,
    NameUnknown,
    SizeInvalid,
    Unauthorized,
    Denied,
    Unsupported,
    Unknown,
}

impl OciCode {
    fn status(self) -> StatusCode {
        use OciCode as C;
        match self {
            C::BlobUnknown | C::BlobUploadUnknown | C::ManifestUnknown | C::NameUnknown => {
                StatusCode::NOT_FOUND
            }
            C::DigestInvalid
            | C::ManifestBlobUnknown
            | C::ManifestInvalid
            | C::NameInvalid
            | C::SizeInvalid => StatusCode::BAD_REQUEST,
            C::Unauthorized => StatusCode::UNAUTHORIZED,
            C::Denied => StatusCode::FORBIDDEN,
            C::Unsupported => StatusCode::METHOD_NOT_ALLOWED,
            C::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A refused registry request.
#[derive(Debug)]
pub struct OciError {
    pub code: OciCode,
    pub message: String,
}

impl OciError {
    pub fn new(code: OciCode, message: impl Into<String>) -> Self {
        OciError {
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for OciError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "errors": [{ "code": self.code, "message": self.message, "detail": null }]
        });
        let mut response = (self.code.status(), axum::Json(body)).into_response();
        if self.code == OciCode::Unauthorized {
            // Clients (oci-client, skopeo, oras) send their credentials once challenged.
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"opentinker\""),
            );
        }
        response
    }
}

impl From<ApiError> for OciError {
    fn from(error: ApiError) -> Self {
        let code = match error.kind {
            ApiErrorKind::Unauthorized => OciCode::Unauthorized,
            ApiErrorKind::QuotaExceeded | ApiErrorKind::TooManyRequests => OciCode::Denied,
            ApiErrorKind::NotFound | ApiErrorKind::Gone => OciCode::NameUnknown,
            ApiErrorKind::InvalidRequest | ApiErrorKind::Conflict => OciCode::ManifestInvalid,
            ApiErrorKind::NotOffered => OciCode::Unsupported,
            ApiErrorKind::Unavailable | ApiErrorKind::Internal => OciCode::Unknown,
        };
        OciError::new(code, error.message)
    }
}

/// A fault of the registry's own storage.
impl From<MarketError> for OciError {
    fn from(error: MarketError) -> Self {
        OciError::new(OciCode::Unknown, error.to_string())
    }
}
