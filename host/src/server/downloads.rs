//! Weights out: an export's files (`save_weights_external`) behind signed, time-limited URLs,
//! which is how the Tinker cookbook's `weights.download` fetches them (`urllib`, with no API
//! key). The owner asks for the URLs (`external_weights_urls`, with its key, as for any of its
//! objects); each URL names one file and its expiry, signed with a key of the server's own
//! (HMAC-SHA256, in the data folder), so it opens that file alone, until then. The files are
//! encrypted to the client's age keys when it asked for that, so a leaked URL leaks nothing
//! readable either.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::HttpError;
use super::handling::Caller;
use super::training_runs::time;
use crate::api::{ApiError, CheckpointKind, CheckpointPath, ModelId, TenantId};
use crate::store::unix_now;

type Shared = Arc<super::AppState>;
type Answered = Result<Response, HttpError>;

/// How long a signed URL opens its file.
const URL_LIFETIME_SECS: i64 = 3600;

pub fn router() -> Router<Shared> {
    Router::new()
        .route(
            "/training_runs/{id}/checkpoints/{kind}/{name}/external_weights_urls",
            get(external_weights_urls),
        )
        .route("/downloads/{tenant}/{run}/{name}/{file}", get(download))
}

/// The export `tinker://{id}/external_weights/{name}`: another kind is not downloaded.
fn export_path(id: &str, kind: &str, name: &str) -> Result<CheckpointPath, ApiError> {
    if kind != CheckpointKind::External.as_str() {
        return Err(ApiError::invalid(format!(
            "tinker://{id}/{kind}/{name}: only external weights are downloaded \
             (tinker://RUN/external_weights/NAME, saved with save_weights_external)"
        )));
    }
    let model: ModelId = id
        .parse()
        .map_err(|_| ApiError::not_found(format!("training run {id}")))?;
    CheckpointPath::new(model, CheckpointKind::External, name)
}

/// Signed URLs of every file of one of the caller's exports (the SDK's
/// `ExternalWeightsUrlsResponse`), addressed by the host the caller reached.
async fn external_weights_urls(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    UrlPath((id, kind, name)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Answered {
    let path = export_path(&id, &kind, &name)?;
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| ApiError::invalid("the request names no Host to address the URLs to"))?;
    let expires = unix_now() + URL_LIFETIME_SECS;
    let files = state.service.checkpoint_files(&tenant, &path).await?;
    let urls: serde_json::Map<String, serde_json::Value> = files
        .into_iter()
        .map(|(file, _)| {
            let signature = state.downloads.sign(&tenant, &path, &file, expires);
            let url = format!(
                "http://{host}/api/v1/downloads/{tenant}/{}/{}/{file}?expires={expires}&signature={signature}",
                path.model, path.name
            );
            (file, json!(url))
        })
        .collect();
    Ok(Json(json!({ "urls": urls, "expires": time(expires) })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Signed {
    expires: i64,
    signature: String,
}

/// One file of an export, to whoever holds its signed URL while it has not expired.
async fn download(
    State(state): State<Shared>,
    UrlPath((tenant, run, name, file)): UrlPath<(String, String, String, String)>,
    Query(signed): Query<Signed>,
) -> Answered {
    let refused = || ApiError::not_found("no such download (its URL may have expired)");
    let tenant = TenantId::new(&tenant).map_err(|_| refused())?;
    let path =
        export_path(&run, CheckpointKind::External.as_str(), &name).map_err(|_| refused())?;
    let valid = signed.expires >= unix_now()
        && state
            .downloads
            .verify(&tenant, &path, &file, signed.expires, &signed.signature);
    if !valid {
        return Err(refused().into());
    }
    let files = state.service.checkpoint_files(&tenant, &path).await?;
    let (_, location) = files
        .into_iter()
        .find(|(name, _)| *name == file)
        .ok_or_else(refused)?;
    let bytes = tokio::fs::read(&location)
        .await
        .map_err(|e| ApiError::internal(format!("reading {}: {e}", location.display())))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
