//! The web dashboard: one static page (`host/dashboard/index.html`, no build step) served at
//! `/dashboard`, which a tenant opens with its key and which reads the JSON API as any client
//! does: its jobs and their phase, live training and evaluation curves (the job's event stream),
//! recent rollouts rendered as conversations, its share of each base's training and sampling
//! (`GET /api/v1/dashboard/usage`), tokens per second and failed plugin calls by kind.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;

use super::AppState;
use super::handling::Caller;
use crate::service::TenantUsage;

type Shared = Arc<AppState>;

/// The page.
const PAGE: &str = include_str!("../../dashboard/index.html");

/// `/dashboard`, outside the API.
pub fn page_router() -> Router<Shared> {
    Router::new().route(
        "/dashboard",
        get(|| async {
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-store"),
                ],
                PAGE,
            )
        }),
    )
}

/// The routes, nested under `/api/v1`.
pub fn router() -> Router<Shared> {
    Router::new().route("/dashboard/usage", get(usage))
}

/// A tenant's part of one loop, beside everyone else's together (other tenants are not named).
#[derive(Debug, Default, Serialize)]
pub struct Share {
    /// Tokens served to the tenant so far.
    pub yours: u64,
    /// Tokens served to every other tenant together.
    pub others: u64,
    /// The tenant's requests waiting now.
    pub your_waiting: usize,
    /// Other tenants' requests waiting now.
    pub others_waiting: usize,
    /// Whether a count reached its largest value and stopped there.
    pub saturated: bool,
}

impl Share {
    fn of(usage: &std::collections::BTreeMap<String, TenantUsage>, tenant: &str) -> Self {
        let mut share = Share::default();
        for (key, figures) in usage {
            let (served, waiting) = match key == tenant {
                true => (&mut share.yours, &mut share.your_waiting),
                false => (&mut share.others, &mut share.others_waiting),
            };
            let (sum, wrapped) = served.overflowing_add(figures.served);
            *served = if wrapped { u64::MAX } else { sum };
            *waiting = waiting.saturating_add(figures.waiting);
            share.saturated |= wrapped || figures.saturated;
        }
        share
    }
}

/// One base's loops, as a tenant sees them.
#[derive(Debug, Serialize)]
pub struct BaseUsage {
    pub base: String,
    pub training: Share,
    pub sampling: Share,
}

async fn usage(State(state): State<Shared>, Caller(tenant): Caller) -> impl IntoResponse {
    let bases: Vec<BaseUsage> = state
        .service
        .usage()
        .into_iter()
        .map(|(base, training, sampling)| BaseUsage {
            base,
            training: Share::of(&training.snapshot(), tenant.as_str()),
            sampling: Share::of(&sampling.snapshot(), tenant.as_str()),
        })
        .collect();
    Json(serde_json::json!({ "tenant": tenant, "bases": bases }))
}
