//! The Tinker API's routes that this server does not serve, each refused by name.
//!
//! The official SDK calls these paths from public methods of its clients. A bare 404 would read
//! as a typo in the client's base URL; a 5xx would be retried by the SDK for minutes. Each is
//! answered at once with [`ApiErrorKind::NotOffered`] (400), naming the SDK method that was
//! called and why this server does not offer it. The coverage table of docs/serving.md lists them, and
//! `host/tests/tinker_sdk/coverage.py` keeps that table true.

use std::sync::Arc;

use axum::Router;
use axum::routing::{MethodFilter, on};

use super::handling::Caller;
use super::{AppState, HttpError};
use crate::api::{ApiError, ApiErrorKind};

type Shared = Arc<AppState>;

/// One refused route: where the SDK sends it, which of its methods call it, and why.
struct Refusal {
    path: &'static str,
    verbs: MethodFilter,
    methods: &'static str,
    why: &'static str,
}

/// The refused routes (paths under `/api/v1`).
const REFUSALS: &[Refusal] = &[
    Refusal {
        path: "/auth/token",
        verbs: MethodFilter::POST,
        methods: "JWT credentials (/auth/token)",
        why: "this server authenticates by API key only",
    },
    Refusal {
        path: "/join_sampling_session",
        verbs: MethodFilter::POST,
        methods: "SamplingClient's join_sampling_session",
        why: "sampling clients here need no join (the client config does not ask for one)",
    },
    Refusal {
        path: "/copy_weights",
        verbs: MethodFilter::POST,
        methods: "ServiceClient.copy_weights and RestClient.copy_weights",
        why: "copying a checkpoint is not offered yet; save_state from a client loaded \
              with load_state makes a copy",
    },
    Refusal {
        path: "/training_runs/{id}/checkpoints/{kind}/{name}/publish",
        verbs: MethodFilter::POST.or(MethodFilter::DELETE),
        methods: "RestClient.publish_checkpoint_from_tinker_path and \
                  unpublish_checkpoint_from_tinker_path",
        why: "checkpoints are never public here: each is its owner's alone",
    },
    Refusal {
        path: "/sessions/{id}/project",
        verbs: MethodFilter::PUT,
        methods: "RestClient.assign_session_project",
        why: "this server has no projects",
    },
    Refusal {
        path: "/sessions/{id}/trace_export",
        verbs: MethodFilter::GET,
        methods: "RestClient.export_session_trace",
        why: "session traces are not recorded",
    },
    Refusal {
        path: "/sessions/search",
        verbs: MethodFilter::POST,
        methods: "RestClient.search_sessions",
        why: "session search is not offered yet; RestClient.list_sessions lists them",
    },
    Refusal {
        path: "/audit",
        verbs: MethodFilter::GET,
        methods: "RestClient.get_audit_log",
        why: "this server keeps no audit log of organizations and teams",
    },
    Refusal {
        path: "/billing/usage/events",
        verbs: MethodFilter::GET,
        methods: "RestClient.get_billing_usage",
        why: "this server does not bill; the dashboard shows each tenant's usage",
    },
    Refusal {
        path: "/retrieve_futures",
        verbs: MethodFilter::POST,
        methods: "the futures' batch retrieve (retrieve_futures)",
        why: "not offered yet; retrieve_future answers one at a time",
    },
    Refusal {
        path: "/cancel_future",
        verbs: MethodFilter::POST,
        methods: "cancelling a future (cancel_future)",
        why: "a request once accepted runs to its end",
    },
];

impl Refusal {
    fn error(&self) -> HttpError {
        HttpError(ApiError::new(
            ApiErrorKind::NotOffered,
            format!(
                "{} is not offered by this server: {}",
                self.methods, self.why
            ),
        ))
    }
}

/// The routes of [`REFUSALS`], each answering its refusal to any caller with a valid key (an
/// unknown key is refused as everywhere else).
pub fn router() -> Router<Shared> {
    REFUSALS.iter().fold(Router::new(), |router, refusal| {
        let handler = move |_: Caller| async move { refusal.error() };
        router.route(refusal.path, on(refusal.verbs, handler))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_path_is_refused_twice() {
        let paths: Vec<_> = REFUSALS.iter().map(|r| r.path).collect();
        let distinct: std::collections::HashSet<_> = paths.iter().collect();
        assert_eq!(distinct.len(), paths.len(), "a path is listed twice");
    }
}
