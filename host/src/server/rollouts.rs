//! Rollout workers' access to the queue (an opentinker extension of the API): a worker asks with
//! its tenant's key and is given a user of the queue's account that may play its tenant's pool
//! only, signed by the account key the server holds (`serve --rollout-key`).
//!
//! - `POST /api/v1/rollout_access` answers a [`WorkerAccess`]: the pool (the tenant's), the login
//!   (a fresh user's JWT and seed, and its inbox prefix) and the pool consumer's settings. A
//!   server whose queue has no accounts (or that has no queue) answers `not_offered`, and the
//!   worker goes on as on an open queue.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::post;

use super::handling::Caller;
use super::{AppState, HttpError};
use crate::api::{ApiError, ApiErrorKind};
use crate::queue_auth::WorkerAccess;

type Shared = Arc<AppState>;

/// The routes, nested under `/api/v1`.
pub fn router() -> Router<Shared> {
    Router::new().route("/rollout_access", post(access))
}

async fn access(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<WorkerAccess>, HttpError> {
    let Some(rollouts) = &state.rollout_access else {
        return Err(ApiError::new(
            ApiErrorKind::NotOffered,
            "this server signs no rollout workers (its queue has no accounts: `serve --rollout-key`)",
        )
        .into());
    };
    Ok(Json(rollouts.worker(&tenant).await?))
}
