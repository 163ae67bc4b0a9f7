//! The training-run and checkpoint routes of the SDK's `RestClient`: a tenant's runs (its models,
//! with the `user_metadata` attached when each was made and its latest checkpoints), one run's
//! checkpoints, the tenant's checkpoints across runs, and a checkpoint's deletion and expiry.
//! Another tenant's run or checkpoint is answered as an unknown one. Times are RFC 3339, UTC.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::HttpError;
use super::handling::{Caller, parse};
use super::journal::RunRecord;
use crate::api::{ApiError, CheckpointInfo, CheckpointKind, CheckpointPath, ModelId, TenantId};

type Shared = std::sync::Arc<super::AppState>;
type Answered = Result<Response, HttpError>;

/// The SDK's page size for runs when it names none.
const DEFAULT_RUNS_LIMIT: u64 = 20;
/// The SDK's page size for checkpoints when it names none.
const DEFAULT_CHECKPOINTS_LIMIT: u64 = 100;

pub fn router() -> Router<Shared> {
    Router::new()
        .route("/training_runs", get(list_runs))
        .route("/training_runs/{id}", get(get_run))
        .route("/training_runs/{id}/checkpoints", get(run_checkpoints))
        .route(
            "/training_runs/{id}/checkpoints/{kind}/{name}",
            delete(delete_checkpoint),
        )
        .route(
            "/training_runs/{id}/checkpoints/{kind}/{name}/ttl",
            put(set_ttl),
        )
        .route("/checkpoints", get(tenant_checkpoints))
        .route("/weights_info", post(weights_info))
        .route("/billing/usage/checkpoints/current", get(storage_usage))
}

/// Whose runs to list: `accessible` adds others' public ones, and nothing is public here.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum AccessScope {
    #[default]
    Owned,
    Accessible,
}

/// A page of a listing, as the RestClient asks for one (runs, checkpoints, sessions).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Page {
    limit: Option<u64>,
    #[serde(default)]
    pub(super) offset: u64,
    /// Accepted, and the same as `owned`: nothing is published on this server.
    #[serde(default)]
    #[allow(dead_code)]
    access_scope: AccessScope,
    project_id: Option<String>,
}

impl Page {
    /// The page's size (`default` when the client names none), or a refusal of what is not
    /// offered.
    pub(super) fn limit(&self, default: u64) -> Result<u64, ApiError> {
        match &self.project_id {
            Some(_) => Err(ApiError::invalid(
                "project_id: projects are not offered by this server (list without it)",
            )),
            None => Ok(self.limit.unwrap_or(default)),
        }
    }

    /// The SDK's `Cursor` of this page of `limit` out of `total`.
    fn cursor(&self, limit: u64, total: u64) -> Value {
        json!({ "offset": self.offset, "limit": limit, "total_count": total })
    }
}

/// The query of a read of one object (a run, a session).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScopeQuery {
    /// As [`Page::access_scope`].
    #[serde(default)]
    #[allow(dead_code)]
    access_scope: AccessScope,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsInfoRequest {
    tinker_path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    project_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ttl {
    ttl_seconds: Option<u64>,
}

/// A run id from a path: one that cannot be an id is no run of the caller's.
fn run_id(id: &str) -> Result<ModelId, ApiError> {
    id.parse()
        .map_err(|_| ApiError::not_found(format!("training run {id}")))
}

/// A checkpoint from a path's `{kind}/{name}`, as the SDK's `checkpoint_id` spells it.
fn checkpoint_path(id: &str, kind: &str, name: &str) -> Result<CheckpointPath, ApiError> {
    let kind = CheckpointKind::from_segment(kind).ok_or_else(|| {
        ApiError::not_found(format!("checkpoint {kind}/{name} of training run {id}"))
    })?;
    CheckpointPath::new(run_id(id)?, kind, name)
}

/// A Unix time as the SDK's JSON reads one (RFC 3339, UTC); null where it is out of range.
pub(super) fn time(unix_seconds: i64) -> Value {
    match chrono::DateTime::from_timestamp(unix_seconds, 0) {
        Some(at) => json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        None => Value::Null,
    }
}

/// A checkpoint as the SDK's `Checkpoint` reads it.
fn checkpoint_json(checkpoint: &CheckpointInfo) -> Value {
    let path = &checkpoint.path;
    json!({
        "checkpoint_id": format!("{}/{}", path.kind.as_str(), path.name),
        "checkpoint_type": match path.kind {
            CheckpointKind::Weights => "training",
            CheckpointKind::SamplerWeights => "sampler",
            CheckpointKind::External => "external",
        },
        "time": time(checkpoint.saved_at),
        "tinker_path": path.to_string(),
        "size_bytes": checkpoint.size_bytes,
        "public": false,
        "expires_at": checkpoint.expires_at.map_or(Value::Null, time),
        "user_metadata": checkpoint.user_metadata,
    })
}

/// A run as the SDK's `TrainingRun` reads it; `checkpoints` are the run's, oldest first.
fn run_json(tenant: &TenantId, run: &RunRecord, checkpoints: &[CheckpointInfo]) -> Value {
    let last = |kind: CheckpointKind| {
        checkpoints
            .iter()
            .rev()
            .find(|c| c.path.kind == kind)
            .map_or(Value::Null, checkpoint_json)
    };
    json!({
        "training_run_id": run.id,
        "base_model": run.base,
        "model_owner": tenant,
        "is_lora": true,
        "corrupted": false,
        "lora_rank": run.lora_rank,
        "last_request_time": time(run.last_request_at),
        "last_checkpoint": last(CheckpointKind::Weights),
        "last_sampler_checkpoint": last(CheckpointKind::SamplerWeights),
        "user_metadata": run.user_metadata,
    })
}

async fn list_runs(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(page): Query<Page>,
) -> Answered {
    let limit = page.limit(DEFAULT_RUNS_LIMIT)?;
    let (runs, total) = {
        let (tenant, offset) = (tenant.clone(), page.offset);
        state
            .journal
            .off_thread(move |j| j.training_runs(&tenant, limit, offset))
            .await
            .map_err(ApiError::from)?
    };
    // Only the page's runs' checkpoints are read.
    let mut listed = Vec::with_capacity(runs.len());
    for run in &runs {
        let checkpoints = state.service.checkpoints(&tenant, Some(&run.id)).await?;
        listed.push(run_json(&tenant, run, &checkpoints));
    }
    Ok(Json(json!({
        "training_runs": listed,
        "cursor": page.cursor(limit, total),
    }))
    .into_response())
}

async fn get_run(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    Query(_): Query<ScopeQuery>,
) -> Answered {
    let id = run_id(&id)?;
    let run = {
        let (owner, run) = (tenant.clone(), id.clone());
        state
            .journal
            .off_thread(move |j| j.training_run(&owner, &run))
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| ApiError::not_found(format!("training run {id}")))?
    };
    let checkpoints = state.service.checkpoints(&tenant, Some(&id)).await?;
    Ok(Json(run_json(&tenant, &run, &checkpoints)).into_response())
}

/// What a client needs to load a checkpoint (the SDK's `WeightsInfoResponse`): its run's base
/// model and LoRA rank.
async fn weights_info(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: axum::body::Bytes,
) -> Answered {
    let request: WeightsInfoRequest = parse(&body)?;
    let path: CheckpointPath = request.tinker_path.parse()?;
    let unknown = || ApiError::not_found(format!("checkpoint {}", request.tinker_path));
    let checkpoints = state
        .service
        .checkpoints(&tenant, Some(&path.model))
        .await?;
    if !checkpoints.iter().any(|c| c.path == path) {
        return Err(unknown().into());
    }
    let run = {
        let (owner, run) = (tenant.clone(), path.model.clone());
        state
            .journal
            .off_thread(move |j| j.training_run(&owner, &run))
            .await
            .map_err(ApiError::from)?
            .ok_or_else(unknown)?
    };
    Ok(Json(json!({
        "base_model": run.base,
        "is_lora": true,
        "lora_rank": run.lora_rank,
    }))
    .into_response())
}

/// The storage the caller's live checkpoints take (the SDK's
/// `CurrentCheckpointStorageUsageResponse`): one row, the caller's, with no price (this server
/// does not bill).
async fn storage_usage(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(query): Query<UsageQuery>,
) -> Answered {
    if query.project_id.is_some() {
        return Err(ApiError::invalid(
            "project_id: projects are not offered by this server (ask without it)",
        )
        .into());
    }
    let checkpoints = state.service.checkpoints(&tenant, None).await?;
    let size_bytes: u64 = checkpoints.iter().map(|c| c.size_bytes).sum();
    Ok(Json(json!({
        "effective_rate_usd_per_gigabyte_month": null,
        "data": [{
            "project_id": null,
            "user_name": tenant,
            "checkpoint_count": checkpoints.len(),
            "size_bytes": size_bytes,
            "size_gigabytes": size_bytes as f64 / 1e9,
            "estimated_monthly_cost_usd": null,
        }],
    }))
    .into_response())
}

async fn run_checkpoints(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Answered {
    let id = run_id(&id)?;
    let checkpoints = state.service.checkpoints(&tenant, Some(&id)).await?;
    let listed: Vec<Value> = checkpoints.iter().map(checkpoint_json).collect();
    Ok(Json(json!({ "checkpoints": listed, "cursor": null })).into_response())
}

async fn tenant_checkpoints(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(page): Query<Page>,
) -> Answered {
    let limit = page.limit(DEFAULT_CHECKPOINTS_LIMIT)?;
    let checkpoints = state.service.checkpoints(&tenant, None).await?;
    let total = checkpoints.len() as u64;
    // Newest first, as a person looking for what to clean up wants them.
    let listed: Vec<Value> = checkpoints
        .iter()
        .rev()
        .skip(usize::try_from(page.offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .map(checkpoint_json)
        .collect();
    Ok(Json(json!({ "checkpoints": listed, "cursor": page.cursor(limit, total) })).into_response())
}

async fn delete_checkpoint(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, kind, name)): Path<(String, String, String)>,
) -> Answered {
    let path = checkpoint_path(&id, &kind, &name)?;
    state.service.delete_checkpoint(&tenant, &path).await?;
    tracing::info!(%tenant, %path, "checkpoint deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_ttl(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, kind, name)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> Answered {
    let path = checkpoint_path(&id, &kind, &name)?;
    let ttl: Ttl = parse(&body)?;
    let checkpoint = state
        .service
        .set_checkpoint_ttl(&tenant, &path, ttl.ttl_seconds)
        .await?;
    Ok(Json(checkpoint_json(&checkpoint)).into_response())
}
