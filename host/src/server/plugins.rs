//! Plugins by digest (an opentinker extension of the API): a tenant uploads a component's bytes,
//! which are checked as the loader checks any plugin (a component, a supported WIT version, only
//! the imports the host provides, its structure within the limits) and compiled in the bounded
//! compile worker, a few at a time, off the request's thread; then stored under their sha256, per
//! tenant, in `DATA/plugins/TENANT/`. Another tenant's digest answers 404, as an unknown one does.
//!
//! - `POST /api/v1/plugins` (the bytes; at most the body limit, 64 MiB) answers the digest,
//!   kinds and WIT version; uploading the same bytes again answers the same.
//! - `GET /api/v1/plugins` lists the tenant's plugins; `GET /api/v1/plugins/sha256:HEX` one.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::get;

use super::handling::Caller;
use super::{AppState, HttpError};
use crate::jobs::StoredPlugin;

type Shared = Arc<AppState>;

/// The routes, nested under `/api/v1`.
pub fn router() -> Router<Shared> {
    Router::new()
        .route("/plugins", get(list).post(upload))
        .route("/plugins/{digest}", get(describe))
}

async fn upload(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Result<Json<StoredPlugin>, HttpError> {
    Ok(Json(state.plugins.put(&tenant, body.to_vec()).await?))
}

async fn describe(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(digest): Path<String>,
) -> Result<Json<StoredPlugin>, HttpError> {
    Ok(Json(state.plugins.get(&tenant, &digest).await?))
}

async fn list(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<serde_json::Value>, HttpError> {
    let plugins = state.plugins.list(&tenant).await?;
    Ok(Json(serde_json::json!({ "plugins": plugins })))
}
