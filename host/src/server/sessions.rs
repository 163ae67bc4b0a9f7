//! The RestClient's session reads: a tenant's sessions, and what one of them made (its training
//! runs and its samplers not yet freed). A session is its tenant's alone: another tenant's id is
//! answered as unknown.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::HttpError;
use super::handling::Caller;
use super::training_runs::{Page, ScopeQuery};
use crate::api::{ApiError, SessionId};

type Shared = Arc<super::AppState>;
type Answered = Result<Response, HttpError>;

/// The SDK's page size for sessions when it names none.
const DEFAULT_SESSIONS_LIMIT: u64 = 20;

pub fn router() -> Router<Shared> {
    Router::new()
        .route("/sessions", get(list_sessions))
        .route("/sessions/{id}", get(get_session))
}

/// The caller's sessions, oldest first (the SDK's `ListSessionsResponse`).
async fn list_sessions(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(page): Query<Page>,
) -> Answered {
    let limit = page.limit(DEFAULT_SESSIONS_LIMIT)?;
    let offset = page.offset;
    let sessions = state
        .journal
        .off_thread(move |j| j.sessions(&tenant, limit, offset))
        .await
        .map_err(ApiError::from)?;
    Ok(Json(json!({ "sessions": sessions })).into_response())
}

/// One of the caller's sessions (the SDK's `GetSessionResponse`).
async fn get_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    Query(_): Query<ScopeQuery>,
) -> Answered {
    let unknown = || ApiError::not_found(format!("session {id}"));
    let session = SessionId::new(&id).map_err(|_| unknown())?;
    let record = state
        .journal
        .off_thread(move |j| j.session(&tenant, &session))
        .await
        .map_err(ApiError::from)?
        .ok_or_else(unknown)?;
    Ok(Json(json!({
        "training_run_ids": record.training_runs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "sampler_ids": record.samplers,
    }))
    .into_response())
}
