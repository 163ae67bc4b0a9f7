//! Plugins by digest (an opentinker extension of the API): a tenant uploads a component's bytes,
//! which are checked as the loader checks any plugin (a component, a supported WIT version, only
//! the imports the host provides, its structure within the limits) and compiled in the bounded
//! compile worker, a few at a time, off the request's thread; then stored under their sha256, per
//! tenant, in `DATA/plugins/TENANT/`. Another tenant's digest answers 404, as an unknown one does.
//!
//! - `POST /api/v1/plugins` (the bytes; at most the body limit, 64 MiB) answers the digest,
//!   kinds and WIT version; uploading the same bytes again answers the same.
//! - `GET /api/v1/plugins` lists the tenant's plugins; `GET /api/v1/plugins/sha256:HEX` one;
//!   `GET /api/v1/plugins/sha256:HEX/component` its bytes (a rollout worker fetches what a task
//!   names this way, and checks them against the digest).
//!
//! An uploaded objective plugin is a loss of the Tinker wire: a `forward` / `forward_backward`
//! whose `loss_fn` is `sha256:HEX` runs it under its `loss_fn_config` (checked against the
//! plugin's schema before any work). [`prepare_objective`] loads it into the service the first
//! time a call names it; [`load_objective`] loads it again after a restart, before a journalled
//! call runs again.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::get;

use super::handling::Caller;
use super::{AppState, HttpError};
use crate::api::{ApiError, ForwardBackwardInput, Op, TenantId};
use crate::jobs::StoredPlugin;
use crate::plugin::{Limits, Plugin};
use crate::service::{names_a_plugin, objective_config};

type Shared = Arc<AppState>;

/// The routes, nested under `/api/v1`.
pub fn router() -> Router<Shared> {
    Router::new()
        .route("/plugins", get(list).post(upload))
        .route("/plugins/{digest}", get(describe))
        .route("/plugins/{digest}/component", get(component))
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

/// The component's bytes, as uploaded: what a rollout worker of the tenant plays.
async fn component(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(digest): Path<String>,
) -> Result<impl axum::response::IntoResponse, HttpError> {
    let path = state.plugins.component(&tenant, &digest).await?;
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|e| ApiError::internal(format!("reading plugin {digest}: {e}")))?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/wasm")],
        bytes,
    ))
}

async fn list(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<serde_json::Value>, HttpError> {
    let plugins = state.plugins.list(&tenant).await?;
    Ok(Json(serde_json::json!({ "plugins": plugins })))
}

/// Make ready the objective plugin that `op` names as its loss, if it names one, before the
/// call is accepted: load it ([`load_objective`]) and check the call's `loss_fn_config` against
/// the plugin's schema.
pub async fn prepare_objective(
    state: &AppState,
    tenant: &TenantId,
    op: &Op,
) -> Result<(), ApiError> {
    let Some((plugin, input)) = load_objective(state, tenant, op).await? else {
        return Ok(());
    };
    let name = &input.loss_fn;
    plugin
        .check_config(&objective_config(input), &Limits::default())
        .await
        .map_err(|e| ApiError::invalid(format!("loss_fn_config of objective {name}: {e}")))
}

/// The objective plugin that `op` names as its loss (with the call's input), loaded from
/// `tenant`'s upload of that digest into the service the first time; `None` for any other op
/// or loss. Another tenant's digest answers as an unknown one. An accepted call whose plugin
/// left memory with a restart loads it here before it runs again.
pub async fn load_objective<'op>(
    state: &AppState,
    tenant: &TenantId,
    op: &'op Op,
) -> Result<Option<(Plugin, &'op ForwardBackwardInput)>, ApiError> {
    let Op::ForwardBackward { input, .. } = op else {
        return Ok(None);
    };
    let name = &input.loss_fn;
    if !names_a_plugin(name) {
        return Ok(None);
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(ApiError::invalid(format!(
            "loss_fn {name:?}: write the plugin's digest in lowercase hex"
        )));
    }
    if let Some(plugin) = state.service.objective(tenant, name) {
        return Ok(Some((plugin, input)));
    }
    let path = state.plugins.component(tenant, name).await?;
    let plugin = state
        .plugins
        .host()
        .load_file(&path)
        .await
        .map_err(|e| ApiError::invalid(format!("objective plugin {name}: {e}")))?;
    state
        .service
        .keep_objective(tenant, &plugin, &Limits::default())?;
    Ok(Some((plugin, input)))
}
