//! The access log: one line per request at `info` on the `opentinker::access` target (so
//! `OPENTINKER_LOG=info`, or `OPENTINKER_LOG=opentinker::access=info` for this log alone), with
//! the method, the route as matched (`/api/v1/samplers/{id}`, not the id), the tenant once its
//! key is checked, the status, the latency and, on a refusal or a failure, the error's kind.
//! Never a key, a body or a query string.
//!
//! It is tower-http's [`TraceLayer`]: [`RequestSpan`] opens a span per request with a request id
//! of its own (a per-process random prefix and a counter), [`AppState::authenticate`] records the
//! tenant on it, [`AnswerLine`] writes the line, reading the error's kind from the answer's
//! extensions, where [`HttpError`] puts it (or, for an answer that axum or the registry made, from
//! its status).
//!
//! [`AppState::authenticate`]: super::AppState::authenticate
//! [`HttpError`]: super::HttpError

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::MatchedPath;
use axum::http::{Request, Response, StatusCode};
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

use crate::api::ApiErrorKind;

/// The target of the access log's lines.
pub const TARGET: &str = "opentinker::access";

/// The access log as a layer over the server's routes.
pub type AccessLog =
    TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RequestSpan, (), AnswerLine, (), (), ()>;

/// The layer: a span per request, one line per answer, nothing else (no line when a request
/// starts, none per body chunk, no second line for a 5xx).
pub fn layer() -> AccessLog {
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan::new())
        .on_request(())
        .on_response(AnswerLine)
        .on_body_chunk(())
        .on_eos(())
        .on_failure(())
}

/// Opens the span of a request, named `request`, with its id, method and route, and an empty
/// `tenant` that authentication fills in.
#[derive(Clone, Debug)]
pub struct RequestSpan {
    prefix: u32,
    next: Arc<AtomicU64>,
}

impl RequestSpan {
    fn new() -> Self {
        let mut bytes = [0u8; 4];
        // An id that repeats across restarts only confuses a reader of the log; a failure of
        // the system's random source leaves the counter alone, which is still unique per run.
        let _ = getrandom::fill(&mut bytes);
        RequestSpan {
            prefix: u32::from_le_bytes(bytes),
            next: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("(no route)", MatchedPath::as_str);
        tracing::info_span!(
            target: TARGET,
            "request",
            id = %format_args!("{:08x}-{n}", self.prefix),
            method = %request.method(),
            route,
            tenant = tracing::field::Empty,
        )
    }
}

/// Writes the line of an answer: its status and latency, and the error's kind when it has one.
#[derive(Clone, Copy, Debug)]
pub struct AnswerLine;

impl<B> OnResponse<B> for AnswerLine {
    fn on_response(self, response: &Response<B>, latency: Duration, _span: &Span) {
        let status = response.status().as_u16();
        let latency_ms = (latency.as_secs_f64() * 1e6).round() / 1e3;
        let kind = response
            .extensions()
            .get::<ApiErrorKind>()
            .copied()
            .or_else(|| kind_of_status(response.status()));
        match kind {
            Some(kind) => tracing::info!(
                target: TARGET,
                status,
                latency_ms,
                error = kind.as_str(),
                "answered"
            ),
            None => tracing::info!(target: TARGET, status, latency_ms, "answered"),
        }
    }
}

/// The kind of an error answer that was not made from an [`ApiError`] (axum's own refusals, the
/// registry's OCI errors), by its status.
///
/// [`ApiError`]: crate::api::ApiError
fn kind_of_status(status: StatusCode) -> Option<ApiErrorKind> {
    let kind = match status {
        StatusCode::NOT_FOUND => ApiErrorKind::NotFound,
        StatusCode::GONE => ApiErrorKind::Gone,
        StatusCode::UNAUTHORIZED => ApiErrorKind::Unauthorized,
        StatusCode::FORBIDDEN => ApiErrorKind::QuotaExceeded,
        StatusCode::CONFLICT => ApiErrorKind::Conflict,
        StatusCode::TOO_MANY_REQUESTS => ApiErrorKind::TooManyRequests,
        StatusCode::SERVICE_UNAVAILABLE => ApiErrorKind::Unavailable,
        s if s.is_client_error() => ApiErrorKind::InvalidRequest,
        s if s.is_server_error() => ApiErrorKind::Internal,
        _ => return None,
    };
    Some(kind)
}

/// Record the tenant of the request being served on its span (a no-op outside one).
pub fn record_tenant(tenant: &str) {
    Span::current().record("tenant", tenant);
}
