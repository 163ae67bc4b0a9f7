//! Errors of the op API: a kind that decides the answer (who is at fault, whether to retry) and
//! a message for the person reading it.

/// Whose fault a failure is, and whether trying again can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiErrorKind {
    /// The request is wrong (bad shape, bad token, unknown loss or key): retrying cannot help.
    InvalidRequest,
    /// No such id, or not the caller's (answered the same, so that ids do not leak).
    NotFound,
    /// The caller's object has ended for good (a finished session, and its models and
    /// samplers): retrying cannot help.
    Gone,
    /// No key, or a key that is not valid.
    Unauthorized,
    /// The same idempotency key was used for a different request.
    Conflict,
    /// The caller has too much work queued; retry later.
    TooManyRequests,
    /// The request would pass one of the tenant's quotas (jobs, adapters, stored plugin
    /// bytes): retrying does not help until something of the tenant's ends or is removed.
    QuotaExceeded,
    /// The server does not offer this route or option at all (billing, JWT credentials, a
    /// route of the Tinker API not served yet); the message names it: retrying cannot help.
    NotOffered,
    /// The server could not do it now (stopping, restarting): retry.
    Unavailable,
    /// The server failed: not the caller's fault.
    Internal,
}

impl ApiErrorKind {
    /// The kind's name as the answers' `kind` field spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiErrorKind::InvalidRequest => "invalid_request",
            ApiErrorKind::NotFound => "not_found",
            ApiErrorKind::Gone => "gone",
            ApiErrorKind::Unauthorized => "unauthorized",
            ApiErrorKind::Conflict => "conflict",
            ApiErrorKind::TooManyRequests => "too_many_requests",
            ApiErrorKind::QuotaExceeded => "quota_exceeded",
            ApiErrorKind::NotOffered => "not_offered",
            ApiErrorKind::Unavailable => "unavailable",
            ApiErrorKind::Internal => "internal",
        }
    }

    /// Whether the client should send the same request again.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ApiErrorKind::TooManyRequests | ApiErrorKind::Unavailable
        )
    }

    /// Whether the fault lies with the request (a user error) rather than the server.
    pub fn is_user_error(self) -> bool {
        matches!(
            self,
            ApiErrorKind::InvalidRequest
                | ApiErrorKind::NotFound
                | ApiErrorKind::Gone
                | ApiErrorKind::Unauthorized
                | ApiErrorKind::Conflict
                | ApiErrorKind::QuotaExceeded
                | ApiErrorKind::NotOffered
        )
    }
}

/// A failed op.
#[derive(Clone, Debug, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ApiErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ApiErrorKind::InvalidRequest, message)
    }

    /// `what` (e.g. "model `s1:train:0`") is unknown, or not the caller's.
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        ApiError::new(ApiErrorKind::NotFound, format!("{what} not found"))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ApiErrorKind::Internal, message)
    }

    pub fn kind(&self) -> ApiErrorKind {
        self.kind
    }
}
