//! `opentinker serve`: the service over HTTP in the Tinker wire protocol, so that the official
//! `tinker` Python SDK drives it unmodified (`TINKER_BASE_URL`, `TINKER_API_KEY`). Long ops answer
//! at once with a request id and run as futures the client polls; every request is made by a
//! tenant whose key is checked before any work.
//!
//! [`serve`] runs an [`AppState`] (what every handler reaches, in `state`; assembled here by
//! [`AppState::start`] from a [`ServerConfig`]) on the one axum [`router`] over that state,
//! composed here from each concern's own routes, with the layers every answer passes: the body
//! limit, the Tinker error shape ([`HttpError`], in `error`) and the access log.
//!
//! One file per concern: `routes` maps the Tinker SDK's paths to ops ([`FutureRoute`],
//! [`accept`]), `wire` converts their bodies, `futures` holds running and finished ops,
//! `journal` records them durably, [`Tenants`] keeps the keys; `openai` serves the
//! OpenAI-compatible routes, `jobs` the jobs API, `plugins` the tenants' uploads, `rollouts` the
//! rollout workers' logins to the queue, `registry` the OCI distribution API, `dashboard` the web
//! page, `training_runs` the checkpoints' listing, expiry and deletion, `sessions` the sessions'
//! listing, `downloads` signed download URLs (signed by `url_signer`), and `not_offered` refuses
//! by name what the SDK has and this server does not serve.

mod access_log;
mod dashboard;
mod downloads;
mod error;
mod futures;
mod handling;
mod jobs;
mod journal;
mod not_offered;
mod openai;
mod plugins;
mod registry;
mod rollouts;
mod routes;
mod sessions;
mod state;
mod tenants;
mod training_runs;
mod url_signer;
mod wire;

pub use error::{HttpError, category};
pub use routes::{FutureRoute, accept};
pub use state::{AppState, KEY_RECHECK};
pub use tenants::Tenants;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};

use crate::api::{ApiError, ApiErrorKind};
use crate::jobs::{
    JobQuotas, JobService, MemoryBudget, PluginStore, RolloutAccess, ServerRollouts, human_bytes,
    served_base_bytes,
};
use crate::queue_auth::{QueueAuthority, QueueLogin};
use crate::service::Change;
use crate::service::DeviceOptions;
use crate::service::{
    FairShare, ServedBase, Service, ServiceConfig, TINY_MODEL_NAME, tiny_model_dir,
};
use futures::Futures;
use journal::Journal;
use registry::HostedRegistry;
use state::KnownKeys;
use url_signer::UrlSigner;

/// The largest request body accepted (the SDK sends `forward_backward` in chunks of about
/// 5 MB); larger ones are answered 413.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// How long a `retrieve_future` poll waits for an unfinished op before answering `try_again`
/// (the SDK's poll times out at 45 s).
pub const DEFAULT_POLL_WAIT: Duration = Duration::from_secs(20);

/// What `opentinker serve` is told.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// The database, checkpoints and generated models live here.
    pub data: PathBuf,
    /// Base models by name, from local directories; the built-in tiny model is served as
    /// [`TINY_MODEL_NAME`] besides these.
    pub models: Vec<(String, PathBuf)>,
    pub poll_wait: Duration,
    /// KV positions of running samples per base model.
    pub kv_positions: usize,
    /// How each base's training passes are shared between tenants.
    pub share: FairShare,
    /// Requests a tenant may have queued or running; more are answered 429 (the SDK backs off
    /// and sends them again).
    pub max_queued_per_tenant: usize,
    /// What each tenant's jobs may use.
    pub job_quotas: JobQuotas,
    /// The most bytes of plugins one tenant may store.
    pub max_plugin_bytes_per_tenant: u64,
    /// Models (adapters in training through the Tinker API) one tenant may hold.
    pub max_models_per_tenant: usize,
    /// How often expired checkpoints (`ttl_seconds`) are deleted; they are gone for every
    /// reader as they expire, this frees their files.
    pub checkpoint_sweep: Duration,
    /// How long an answered request's answer is kept for `retrieve_future` (the SDK asks for
    /// it within seconds); older ones are pruned from the journal by the sweep.
    pub answer_retention: Duration,
    /// How long a session may go without a heartbeat or an op before the sweep finishes it
    /// (frees its models and samplers), as if its client had closed it.
    pub session_idle: Duration,
    /// How long a training call waits for its turn in its model's order before it is failed.
    pub turn_deadline: Duration,
    /// The disk one tenant's checkpoints may take; past it a save is refused.
    pub max_checkpoint_bytes_per_tenant: u64,
    /// The memory the server may hold, in bytes; `None`: the machine's less a headroom
    /// (`jobs::machine_budget`). The served bases take their share first; jobs are
    /// admitted under the rest.
    pub memory_budget: Option<u64>,
    /// The rollout queue (`nats://host:port`) whose workers play the RL groups of the jobs on
    /// served bases; `None`: each job plays its own.
    pub rollouts: Option<String>,
    /// The key of the queue's account (`opentinker rollout-keys`), with which the server logs in
    /// and signs each worker a user limited to its tenant's pool; `None`: the queue is open.
    pub rollout_key: Option<PathBuf>,
    /// The device every served base runs on, and the room its samplers make there.
    pub device: DeviceOptions,
}

/// What a start found recorded from earlier runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Restored {
    pub sessions: usize,
    pub models: usize,
    pub samplers: usize,
    /// Requests answered again as they were.
    pub finished: usize,
    /// Requests accepted and not finished, run again.
    pub unfinished: usize,
    /// Jobs that had not ended, started again.
    pub jobs: usize,
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "restored {} sessions, {} models, {} samplers, {} finished requests; resumed {} \
             unfinished requests and {} jobs",
            self.sessions, self.models, self.samplers, self.finished, self.unfinished, self.jobs
        )
    }
}

impl AppState {
    /// Load the models, open the database of `config`, restore what it records (sessions,
    /// models with their training state, samplers, finished requests' answers) and run again the
    /// requests that were accepted and had not finished.
    pub async fn start(config: &ServerConfig) -> anyhow::Result<(Arc<Self>, Restored)> {
        let (data, addr) = (config.data.clone(), config.addr);
        let open = move || -> anyhow::Result<(Tenants, Journal, HostedRegistry)> {
            let tenants = Tenants::open(&data).context("opening the server database")?;
            let journal = Journal::open(&data).context("opening the server journal")?;
            let registry =
                HostedRegistry::open(&data, addr).context("opening the plugin registry")?;
            Ok((tenants, journal, registry))
        };
        let (tenants, journal, registry) = tokio::task::spawn_blocking(open).await??;
        let registry = Arc::new(registry);
        let plugins = PluginStore::open(&config.data, config.max_plugin_bytes_per_tenant)
            .context("starting the plugin host")?;
        let plugins = Arc::new(plugins);
        let rollout_access = match (&config.rollouts, &config.rollout_key) {
            (Some(url), Some(key)) => {
                let authority = QueueAuthority::load(key)?;
                let access = RolloutAccess::connect(url, authority)
                    .await
                    .with_context(|| format!("logging in to the rollout queue {url}"))?;
                Some(access)
            }
            (None, Some(_)) => anyhow::bail!("--rollout-key needs --rollouts URL, the queue"),
            _ => None,
        };
        let driver_login = match &rollout_access {
            Some(access) => access.driver_login()?,
            None => QueueLogin::default(),
        };
        let service = {
            let config = config.clone();
            Arc::new(tokio::task::spawn_blocking(move || Self::service(&config)).await??)
        };
        let journal = Arc::new(journal);
        let recorded = {
            let journal = Arc::clone(&journal);
            tokio::task::spawn_blocking(move || journal.load(futures::KEEP_FINISHED)).await??
        };
        let mut restored = Restored {
            finished: recorded.finished.len(),
            unfinished: recorded.pending.len(),
            ..Restored::default()
        };
        for object in &recorded.objects {
            match object {
                Change::Session { .. } => restored.sessions += 1,
                // Follows its session's record: only live sessions are counted.
                Change::SessionFinished { .. } => restored.sessions -= 1,
                Change::Model { .. } => restored.models += 1,
                Change::Sampler { .. } => restored.samplers += 1,
                Change::SamplerDropped { .. } | Change::CustomLoss { .. } => {}
            }
        }
        service
            .restore(recorded.objects)
            .await
            .context("restoring the recorded models and samplers")?;
        let jobs = {
            let (data, bases, plugins) =
                (config.data.clone(), service.bases(), Arc::clone(&plugins));
            let packages = Arc::new(registry::JobPackages(Arc::clone(&registry)));
            let quotas = config.job_quotas;
            let total = config
                .memory_budget
                .or_else(crate::jobs::machine_budget)
                .unwrap_or(u64::MAX);
            let held: u64 = bases
                .iter()
                .map(|b| served_base_bytes(&b.config, config.kv_positions.max(b.context)))
                .sum();
            let budget = MemoryBudget::new(total.saturating_sub(held));
            tracing::info!(
                "memory budget {}: {} for jobs, {} held by the served bases",
                human_bytes(total),
                human_bytes(budget.total()),
                human_bytes(held)
            );
            let rollouts = config.rollouts.clone().map(|queue| ServerRollouts {
                queue,
                login: driver_login.clone(),
                service: Arc::clone(&service),
            });
            tokio::task::spawn_blocking(move || {
                JobService::open(&data, bases, plugins, packages, quotas, budget, rollouts)
            })
            .await?
            .context("opening the jobs table")?
        };
        let jobs = Arc::new(jobs);
        let state = Arc::new(AppState {
            service,
            tenants,
            futures: Futures::new(Arc::clone(&journal), config.max_queued_per_tenant),
            journal,
            poll_wait: config.poll_wait,
            known_keys: KnownKeys::default(),
            openai: openai::Samplers::default(),
            plugins,
            registry,
            jobs: Arc::clone(&jobs),
            downloads: UrlSigner::open(&config.data)
                .context("opening the download URLs' signing key")?,
            rollout_access,
        });
        state.futures.restore(recorded.finished);
        routes::resume(&state, recorded.pending);
        sweep_expired(&state, config).await;
        restored.jobs = jobs
            .resume_unfinished()
            .await
            .context("resuming the unfinished jobs")?;
        Ok((state, restored))
    }

    /// The service over the served base models.
    fn service(config: &ServerConfig) -> anyhow::Result<Service> {
        let mut bases = vec![ServedBase::load(
            TINY_MODEL_NAME,
            &tiny_model_dir(&config.data)?,
            config.kv_positions,
            config.share,
            config.device,
        )?];
        for (name, dir) in &config.models {
            anyhow::ensure!(
                name != TINY_MODEL_NAME,
                "--model {name}=...: that name is the built-in tiny model's"
            );
            bases.push(ServedBase::load(
                name,
                dir,
                config.kv_positions,
                config.share,
                config.device,
            )?);
        }
        Ok(Service::new(
            bases,
            ServiceConfig {
                data: config.data.clone(),
                max_models_per_tenant: config.max_models_per_tenant,
                // A call further ahead waits on more calls than its tenant may queue.
                max_seq_ahead: config.max_queued_per_tenant as u64,
                turn_deadline: config.turn_deadline,
                max_checkpoint_bytes_per_tenant: config.max_checkpoint_bytes_per_tenant,
            },
        ))
    }
}

/// Delete the expired checkpoints, finish the sessions idle for `session_idle` and prune the
/// answers older than `answer_retention` now, and every `checkpoint_sweep` for as long as the
/// server runs.
async fn sweep_expired(state: &Arc<AppState>, config: &ServerConfig) {
    let (interval, answer_retention) = (config.checkpoint_sweep, config.answer_retention);
    let session_idle = config.session_idle;
    let sweep = move |state: Arc<AppState>| async move {
        for (tenant, path) in state.service.sweep_checkpoints().await {
            tracing::info!(%tenant, %path, "expired checkpoint deleted");
        }
        let finished = state.service.finish_idle_sessions(session_idle);
        if !finished.is_empty() {
            let count = finished.len();
            let recorded = state
                .journal
                .off_thread(move |journal| journal.record(&finished))
                .await;
            match recorded {
                Ok(()) => tracing::info!(count, "idle sessions finished"),
                Err(error) => tracing::warn!("recording finished idle sessions: {error}"),
            }
        }
        let pruned = state
            .journal
            .off_thread(move |journal| journal.prune_answers(answer_retention))
            .await;
        match pruned {
            Ok(0) => {}
            Ok(count) => tracing::info!(count, "answers past their retention pruned"),
            Err(error) => tracing::warn!("pruning old answers: {error}"),
        }
    };
    sweep(Arc::clone(state)).await;
    let state = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval.max(Duration::from_secs(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            // The server is gone: so is the sweeper.
            let Some(state) = state.upgrade() else { return };
            sweep(state).await;
        }
    });
}

/// The whole HTTP surface over `state`: the Tinker SDK's routes and each concern's beside them
/// under `/api/v1`, the dashboard's page, the OCI registry under `/v2`, the OpenAI-compatible
/// routes under `/v1`; a JSON 404 for any other path; every answer in the Tinker error shape and
/// one access-log line per request.
pub fn router(state: Arc<AppState>) -> Router {
    let api = routes::router()
        .merge(plugins::router())
        .merge(rollouts::router())
        .merge(training_runs::router())
        .merge(sessions::router())
        .merge(jobs::router())
        .merge(registry::api_router())
        .merge(dashboard::router())
        .merge(downloads::router())
        .merge(not_offered::router());
    Router::new()
        .nest("/api/v1", api)
        .merge(dashboard::page_router())
        .merge(registry::router())
        .nest("/v1", openai::router())
        .fallback(|method: Method, uri: Uri| async move {
            let path = uri.path();
            HttpError(ApiError::new(
                ApiErrorKind::NotFound,
                format!("no such endpoint: {method} {path}"),
            ))
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(error::json_errors))
        .layer(access_log::layer())
        .with_state(state)
}

/// Serve on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving HTTP")
}
