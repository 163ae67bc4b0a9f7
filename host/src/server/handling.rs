//! What the route handlers share: the calling tenant ([`Caller`], from its key), a JSON body
//! parsed or refused by name ([`parse`]), an op run directly with its changes recorded before
//! the answer ([`direct`]), the turn of a refused request passed ([`pass_refused_turn`]), and
//! work that takes long on a request's bytes run off the async workers ([`off_the_workers`]).

use std::sync::{Arc, LazyLock};

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use super::{AppState, HttpError};
use crate::api::{ApiError, ApiErrorKind, ModelId, Op, OpOutput, TenantId};
use crate::service::{Change, Checked};

type Shared = Arc<AppState>;

/// The tenant making a request, from its `X-API-Key` (or `Authorization: Bearer`) header.
pub struct Caller(pub TenantId);

impl FromRequestParts<Shared> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, HttpError> {
        let headers = &parts.headers;
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .or_else(|| {
                headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
            })
            .ok_or_else(|| ApiError::new(ApiErrorKind::Unauthorized, "no API key (X-API-Key)"))?;
        Ok(Caller(state.authenticate(key).await?))
    }
}

/// A JSON body, or a 400 naming what is wrong with it.
pub(super) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("request body: {e}")))
}

/// Run `work` on the blocking pool, so that reading a large body (JSON, protobuf), tokenizing a
/// long prompt or rendering a chat never holds an async worker: the server's few workers answer
/// every tenant's requests, and `healthz`, while one tenant's request is prepared.
///
/// At most one preparation fewer than the cores runs at once (one on a single core): requests
/// that all arrive with megabytes to read would otherwise take every core, and the workers'
/// answers would wait on the operating system's scheduler instead of on nothing.
pub(super) async fn off_the_workers<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    static PREPARING: LazyLock<Semaphore> = LazyLock::new(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Semaphore::new(cores.saturating_sub(1).max(1))
    });
    let _place = PREPARING
        .acquire()
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Run an op that answers directly, recording its changes before the answer.
pub(super) async fn direct(
    state: &Shared,
    tenant: &TenantId,
    op: Op,
) -> Result<OpOutput, ApiError> {
    let executed = state
        .service
        .execute(tenant, op, None, Checked::default())
        .await;
    let output = executed.outcome?;
    record(state, executed.changes).await?;
    Ok(output)
}

/// Pass `model`'s turn `seq` in the background: the turn of a request that the SDK numbered in
/// the model's order but that is refused before it is accepted, for which the model's next
/// request would otherwise wait forever. The turn is taken after the ops before it and recorded.
pub(super) fn pass_refused_turn(state: &Shared, tenant: &TenantId, model: ModelId, seq: u64) {
    let (state, tenant) = (Arc::clone(state), tenant.clone());
    tokio::spawn(async move {
        match state.service.pass_turn(&tenant, &model, seq).await {
            Ok((changes, hold)) => {
                if let Err(error) = record(&state, changes).await {
                    tracing::warn!(%model, seq, "a refused request's turn was not recorded: {error}");
                }
                drop(hold);
            }
            // Not the tenant's model, or a turn already taken: nothing waits for it.
            Err(error) => tracing::debug!(%model, seq, "no turn to pass: {error}"),
        }
    });
}

/// Record `changes` in the journal, off the async workers.
pub(super) async fn record(state: &Shared, changes: Vec<Change>) -> Result<(), ApiError> {
    if changes.is_empty() {
        return Ok(());
    }
    state
        .journal
        .off_thread(move |j| j.record(&changes))
        .await
        .map_err(ApiError::from)
}
