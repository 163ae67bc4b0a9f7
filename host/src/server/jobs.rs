//! The job API (an opentinker extension, described by the OpenAPI document
//! `host/openapi/jobs.json`, served at `/api/v1/openapi.json`): a tenant
//! submits a job file whose plugins are digests of its uploaded plugins or packages of the
//! server's registry (`namespace/name@RANGE`), then follows, lists, cancels and downloads it. Another tenant's job is answered as an unknown one.
//!
//! - `POST /api/v1/jobs` `{"name", "job"}` (the job file's text) answers the job's record and
//!   the packages it resolved (`resolved`: wanted, version, digest, registry), which its run
//!   folder keeps as `submitted.lock`;
//! - `GET /api/v1/jobs` lists them; `GET /api/v1/jobs/{id}` is one's status (record, latest
//!   metrics line, evaluations);
//! - `GET /api/v1/jobs/{id}/events`: server-sent events, a `step` per metrics line (the lines
//!   so far first), an `evaluation` besides for a line that evaluated, and `end` when it ends;
//! - `POST /api/v1/jobs/{id}/cancel`;
//! - `GET /api/v1/jobs/{id}/files` lists its run folder; `.../files/{path}` downloads one.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::sync::broadcast;

use super::handling::Caller;
use super::{AppState, HttpError};
use crate::api::{ApiError, JobId};
use crate::jobs::{JobEvent, JobRecord, JobState, JobStatus, StepLine, Submitted};

type Shared = Arc<AppState>;

/// The OpenAPI document of the plugin and job routes.
pub const OPENAPI: &str = include_str!("../../openapi/jobs.json");

/// The routes, nested under `/api/v1`.
pub fn router() -> Router<Shared> {
    Router::new()
        .route(
            "/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .route("/jobs", get(list).post(submit))
        .route("/jobs/{id}", get(status))
        .route("/jobs/{id}/cancel", post(cancel))
        .route("/jobs/{id}/events", get(events))
        .route("/jobs/{id}/files", get(files))
        .route("/jobs/{id}/files/{*path}", get(file))
}

/// A job as submitted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    /// Names the job in lists, its progress and its adapters.
    pub name: String,
    /// The job file's text, its plugins named by digest.
    pub job: String,
}

async fn submit(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Json(submission): Json<Submission>,
) -> Result<Json<Submitted>, HttpError> {
    let submitted = state
        .jobs
        .submit(&tenant, &submission.name, &submission.job)
        .await?;
    Ok(Json(submitted))
}

async fn list(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<serde_json::Value>, HttpError> {
    let mut jobs = Vec::new();
    for record in state.jobs.list(&tenant).await? {
        let queue = state.jobs.queue_place(&record.id);
        let mut job = serde_json::to_value(record)
            .map_err(|e| ApiError::internal(format!("a job record: {e}")))?;
        if let (Some(queue), Some(fields)) = (queue, job.as_object_mut()) {
            fields.insert("queue".into(), serde_json::json!(queue));
        }
        jobs.push(job);
    }
    Ok(Json(serde_json::json!({ "jobs": jobs })))
}

async fn status(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, HttpError> {
    Ok(Json(state.jobs.status(&tenant, &JobId::parse(&id)?).await?))
}

async fn cancel(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<JobRecord>, HttpError> {
    Ok(Json(state.jobs.cancel(&tenant, &JobId::parse(&id)?).await?))
}

async fn files(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let files = state.jobs.files(&tenant, &JobId::parse(&id)?).await?;
    Ok(Json(serde_json::json!({ "files": files })))
}

async fn file(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    let bytes = state.jobs.file(&tenant, &JobId::parse(&id)?, &path).await?;
    let kind = match path.rsplit('.').next() {
        Some("json") => "application/json",
        Some("jsonl") => "application/x-ndjson",
        Some("toml") => "application/toml",
        _ => "application/octet-stream",
    };
    Ok(([(header::CONTENT_TYPE, kind)], bytes).into_response())
}

/// A metrics line as events: `step`, and `evaluation` besides when the step evaluated.
fn step_events(line: &StepLine) -> Vec<Event> {
    let mut events = vec![Event::default().event("step").data(&*line.json)];
    if line.evaluated {
        events.push(Event::default().event("evaluation").data(&*line.json));
    }
    events
}

fn end_event(state: JobState, error: Option<&str>) -> Event {
    let data = serde_json::json!({ "state": state, "error": error });
    Event::default().event("end").data(data.to_string())
}

/// What the event stream goes on from: the live events, and the last line's position told.
struct Following {
    events: broadcast::Receiver<JobEvent>,
    told: Option<(u8, usize)>,
}

/// The next events of a running job: lines not told yet, then `end`; a follower that fell
/// behind the buffer is told so and the stream ends (it reads the metrics again).
async fn next_events(mut following: Following) -> Option<(Vec<Event>, Following)> {
    loop {
        match following.events.recv().await {
            Ok(JobEvent::Step(line)) => {
                if following.told.is_some_and(|told| line.position() <= told) {
                    continue;
                }
                following.told = Some(line.position());
                return Some((step_events(&line), following));
            }
            Ok(JobEvent::Ended { state, error }) => {
                let events = vec![end_event(state, error.as_deref())];
                // The stream ends on the next call: the sender is gone.
                return Some((events, following));
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let lagged = Event::default()
                    .event("lagged")
                    .data("events were missed: read the job's metrics again");
                return Some((vec![lagged], following));
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

async fn events(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, HttpError> {
    let id = JobId::parse(&id)?;
    let (record, lines, live) = state.jobs.follow(&tenant, &id).await?;
    let told = lines.last().map(StepLine::position);
    let mut first: Vec<Event> = lines.iter().flat_map(step_events).collect();
    let rest = match live {
        Some(events) => futures::stream::unfold(Following { events, told }, next_events).boxed(),
        None => {
            // Ended before it could be followed: its end now.
            let (state, error) = (record.state, record.error.clone());
            if state.is_final() {
                first.push(end_event(state, error.as_deref()));
            }
            futures::stream::empty().boxed()
        }
    };
    let stream = futures::stream::iter(vec![first]).chain(rest);
    let events = stream
        .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>)));
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::OPENAPI;

    /// Every route of this module, of the plugin routes and of the registry's trust routes,
    /// with its method, is in the document, and the document names no other.
    #[test]
    fn the_openapi_document_describes_exactly_the_routes() {
        let document: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let mut documented: Vec<String> = Vec::new();
        for (path, methods) in document["paths"].as_object().unwrap() {
            for method in methods.as_object().unwrap().keys() {
                documented.push(format!("{method} {path}"));
            }
        }
        documented.sort();
        let mut served: Vec<String> = [
            "get /api/v1/openapi.json",
            "get /api/v1/plugins",
            "post /api/v1/plugins",
            "get /api/v1/plugins/{digest}",
            "get /api/v1/jobs",
            "post /api/v1/jobs",
            "get /api/v1/jobs/{id}",
            "post /api/v1/jobs/{id}/cancel",
            "get /api/v1/jobs/{id}/events",
            "get /api/v1/jobs/{id}/files",
            "get /api/v1/jobs/{id}/files/{path}",
            "get /api/v1/trust",
            "put /api/v1/trust",
        ]
        .map(String::from)
        .to_vec();
        served.sort();
        assert_eq!(documented, served);
        let sources = [
            include_str!("jobs.rs"),
            include_str!("plugins.rs"),
            include_str!("registry/trust.rs"),
        ];
        for route in &served {
            let path = route
                .split_once(" /api/v1")
                .unwrap()
                .1
                .replace("{path}", "{*path}");
            assert!(
                sources.iter().any(|s| s.contains(&format!("\"{path}\""))),
                "{route} is documented but not routed"
            );
        }
    }
}
