//! The jobs a server runs for its tenants: each submitted job file is checked whole before it is
//! accepted (its enums and settings, then what a server adds: plugins named by a digest of the
//! tenant's or as a package of the server's registry, resolved once and pinned by digest from
//! then on, a served or built-in model, no paths of the submitter's machine), recorded, and run
//! by the RL driver on the served bases as its tenant, with the plugins sandboxed as always. A
//! job's files live in its run folder `DATA/jobs/TENANT/ID/`; a restarted server resumes every
//! job that had not ended from its last checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::admission::{MemoryBudget, QueuePlace, footprint};
use super::packages::PackageSource;
use super::plugin_store::PluginStore;
use super::records::{JobRecord, JobRecords, JobState, RecordError};
use crate::api::{ApiError, ApiErrorKind, JobId, SessionId, TenantId};
use crate::client::{Engine, TenantBases, WireSamplers};
use crate::market::PackageRef;
use crate::market::{LockFile, Locked};
use crate::queue_auth::QueueLogin;
use crate::rl::METRICS;
use crate::rl::{self, JobRun, Phase, Progress, StepMetrics, check_job_plugins};
use crate::rl::{Job, SftSource, is_digest, is_package};
use crate::service::{ServedBase, Service};

/// Events kept for a follower that falls behind; one that falls further reads the metrics file.
const EVENT_BUFFER: usize = 1024;

/// What a server's jobs may use.
#[derive(Clone, Copy, Debug)]
pub struct JobQuotas {
    /// Jobs of one tenant queued or running at once.
    pub active_jobs_per_tenant: usize,
}

impl Default for JobQuotas {
    fn default() -> Self {
        JobQuotas {
            active_jobs_per_tenant: 4,
        }
    }
}

/// Something that happened to a running job, as its followers hear it.
#[derive(Clone, Debug)]
pub enum JobEvent {
    /// A line of its `metrics.jsonl` (a step, with its evaluation when one ran).
    Step(StepLine),
    /// The job ended.
    Ended {
        state: JobState,
        error: Option<String>,
    },
}

/// One metrics line: where it stands in the run, and its JSON text.
#[derive(Clone, Debug)]
pub struct StepLine {
    pub phase: Phase,
    pub step: usize,
    /// Whether the step ran an evaluation.
    pub evaluated: bool,
    pub json: Arc<str>,
}

impl StepLine {
    /// A line of `metrics.jsonl` as written; `None` for a line that is not one.
    pub fn parse(json: &str) -> Option<Self> {
        let line: StepMetrics = serde_json::from_str(json).ok()?;
        Some(StepLine {
            phase: line.phase,
            step: line.step,
            evaluated: line.eval.is_some() || !line.initial_evals.is_empty(),
            json: Arc::from(json),
        })
    }

    /// Its place in the run: warm-up steps first, then RL steps.
    pub fn position(&self) -> (u8, usize) {
        (self.phase as u8, self.step)
    }
}

/// A job's status: its record, its latest metrics line and every evaluation so far.
#[derive(Debug, serde::Serialize)]
pub struct JobStatus {
    #[serde(flatten)]
    pub record: JobRecord,
    /// The latest line of its metrics.
    pub latest: Option<serde_json::Value>,
    /// Each evaluation: its phase, step, whether it ran before the step (the evaluation before
    /// RL), the headline figures (`eval`) and each policy's.
    pub evaluations: Vec<serde_json::Value>,
    /// Where a queued job waits for memory, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueuePlace>,
}

/// A metrics line's evaluations: the one before RL (on the first RL line), then the step's.
fn evaluations_of(line: &StepMetrics) -> Vec<serde_json::Value> {
    let mut evaluations = Vec::new();
    if let Some(before) = line.initial_evals.values().next() {
        evaluations.push(serde_json::json!({
            "phase": line.phase,
            "step": line.step,
            "before_step": true,
            "eval": before,
            "policies": line.initial_evals,
        }));
    }
    if let Some(eval) = &line.eval {
        evaluations.push(serde_json::json!({
            "phase": line.phase,
            "step": line.step,
            "before_step": false,
            "eval": eval,
            "policies": line.policy_evals,
        }));
    }
    evaluations
}

/// A running job: how to stop it and whom to tell.
struct Running {
    abort: AbortHandle,
    events: broadcast::Sender<JobEvent>,
}

/// A server's rollout queue: its workers play the RL groups of the jobs on served bases,
/// sampling the jobs' versions through `service` (the server's) over the wire.
pub struct ServerRollouts {
    /// `nats://host:port`.
    pub queue: String,
    /// How the server logs in to it.
    pub login: QueueLogin,
    pub service: Arc<Service>,
}

/// A job's session for its rollout workers' samplers, finished when the job ends however it
/// ends (cancelled included): its samplers go with it.
struct RolloutSession {
    service: Arc<Service>,
    tenant: TenantId,
    session: SessionId,
}

impl Drop for RolloutSession {
    fn drop(&mut self) {
        // Not recorded, so nothing to journal; a session already finished stays so.
        let _ = self.service.finish_session(&self.tenant, &self.session);
    }
}

/// Every tenant's jobs on one server.
pub struct JobService {
    root: PathBuf,
    bases: Vec<Arc<ServedBase>>,
    plugins: Arc<PluginStore>,
    packages: Arc<dyn PackageSource>,
    records: Arc<JobRecords>,
    running: Mutex<HashMap<JobId, Running>>,
    quotas: JobQuotas,
    budget: Arc<MemoryBudget>,
    rollouts: Option<ServerRollouts>,
}

/// A submitted job as checked: what runs, and the text recorded for it.
struct Checked {
    job: Job,
    /// The memory it will hold ([`footprint`]).
    needs: u64,
    /// The job file with every plugin named by digest (packages resolved), which a restart
    /// checks again and runs as it is.
    text: String,
    /// The packages resolved, as a lock file writes them.
    resolved: Vec<Locked>,
}

/// What a submission answers: the job's record and the packages it resolved.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Submitted {
    #[serde(flatten)]
    pub record: JobRecord,
    /// The packages the job named by range, each pinned to the version and digest it runs.
    pub resolved: Vec<Locked>,
}

/// Why a job could not be listed, read or started: a request's fault or the server's.
fn record_error(error: RecordError) -> ApiError {
    ApiError::internal(error.to_string())
}

/// Run `work` on a blocking thread (the database and the run folders are files).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("a blocking task failed: {e}")))?
}

impl JobService {
    /// The jobs of the server whose data folder is `data`, run on `bases`.
    pub fn open(
        data: &Path,
        bases: Vec<Arc<ServedBase>>,
        plugins: Arc<PluginStore>,
        packages: Arc<dyn PackageSource>,
        quotas: JobQuotas,
        budget: Arc<MemoryBudget>,
        rollouts: Option<ServerRollouts>,
    ) -> Result<Self, RecordError> {
        Ok(JobService {
            root: data.join("jobs"),
            bases,
            plugins,
            packages,
            records: Arc::new(JobRecords::open(data)?),
            running: Mutex::new(HashMap::new()),
            quotas,
            budget,
            rollouts,
        })
    }

    /// The memory `job` will hold: on the served base it names, or on the tiny model it
    /// generates for itself.
    fn needs(&self, job: &Job) -> Result<u64, ApiError> {
        let served = rl::served_base_name(job);
        if let Some(base) = served.and_then(|name| self.bases.iter().find(|b| b.name == name)) {
            return Ok(footprint(job, &base.config, base.context, false));
        }
        let Some(tiny) = &job.model.init_tiny else {
            return Ok(0);
        };
        let config = tiny
            .config()
            .map_err(|e| ApiError::internal(format!("the job's tiny model: {e}")))?;
        let context = config.max_position_embeddings;
        Ok(footprint(job, &config, context, true))
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The run folder of `tenant`'s job `id`.
    pub fn folder(&self, tenant: &TenantId, id: &JobId) -> PathBuf {
        self.root.join(tenant.as_str()).join(id.as_str())
    }

    /// Check `text` (a job file whose plugins are digests of `tenant`'s or packages of the
    /// server's registry) as a job the server can run; each package is resolved, checked under
    /// the tenant's trust and stored as the tenant's plugin.
    async fn check(&self, tenant: &TenantId, name: &str, text: &str) -> Result<Checked, ApiError> {
        let origin = PathBuf::from(format!("{name}.toml"));
        let mut job = Job::parse(text, &origin).map_err(|e| ApiError::invalid(e.to_string()))?;
        let refuse = |what: &str| Err(ApiError::invalid(format!("{}: {what}", origin.display())));
        if job.model.dir.is_some() {
            return refuse(
                "model.dir names a folder of the submitter's machine: name a served model with \
                 `model.base`, or use `init_tiny`",
            );
        }
        if let Some(sft) = &job.sft
            && let SftSource::File(file) = &sft.source
        {
            return refuse(&format!(
                "sft.source {}: a file of the submitter's machine; a job on a server warms up \
                 on its environment's demonstrations",
                file.display()
            ));
        }
        if job.rl.kl_reference.is_some() {
            return refuse("rl.kl_reference names a folder of the submitter's machine");
        }
        if let Some(name) = &job.model.base
            && !self.bases.iter().any(|b| &b.name == name)
        {
            let served: Vec<&str> = self.bases.iter().map(|b| b.name.as_str()).collect();
            return refuse(&format!(
                "model.base: the server serves no model {name:?} (it serves: {})",
                served.join(", ")
            ));
        }
        let mut named = Vec::new();
        let mut resolved = Vec::new();
        let mut table: Option<toml::Table> = None;
        for (section, plugin) in job.plugin_paths_mut() {
            let mut digest = plugin.to_string_lossy().into_owned();
            if is_package(plugin) {
                let wanted: PackageRef = digest.parse().map_err(|e| {
                    ApiError::invalid(format!("{}: [{section}] plugin: {e}", origin.display()))
                })?;
                let fetched = self.packages.fetch(tenant, &wanted).await.map_err(|e| {
                    ApiError::invalid(format!(
                        "{}: [{section}] plugin {wanted}: {e}",
                        origin.display()
                    ))
                })?;
                digest = self.plugins.put(tenant, fetched.component).await?.digest;
                resolved.push(Locked {
                    wanted: wanted.to_string(),
                    version: fetched.id.version,
                    digest: fetched.info.digest,
                    registry: self.packages.location(),
                });
                let table = match &mut table {
                    Some(table) => table,
                    None => table
                        .insert(toml::from_str(text).map_err(|e| {
                            ApiError::invalid(format!("{}: {e}", origin.display()))
                        })?),
                };
                if let Some(toml::Value::Table(entry)) = table.get_mut(section) {
                    entry.insert("plugin".into(), toml::Value::String(digest.clone()));
                }
            } else if !is_digest(plugin) {
                return refuse(&format!(
                    "[{section}] plugin {digest:?}: a job on a server names its plugins by \
                     digest (`sha256:...`, as `POST /api/v1/plugins` answered; `opentinker \
                     submit` uploads them) or as a package of the server's registry \
                     (`namespace/name@RANGE`)"
                ));
            }
            let component =
                self.plugins
                    .component(tenant, &digest)
                    .await
                    .map_err(|e| match e.kind {
                        ApiErrorKind::NotFound => ApiError::invalid(format!(
                            "{}: [{section}] plugin {digest}: the tenant has no such plugin",
                            origin.display()
                        )),
                        _ => e,
                    })?;
            *plugin = component.clone();
            named.push((component, digest));
        }
        // The tenant sees its plugins by digest, never by where this server keeps them.
        check_job_plugins(self.plugins.host(), &job, name)
            .await
            .map_err(|e| {
                let message = named.iter().fold(format!("{e:#}"), |text, (path, digest)| {
                    text.replace(&path.display().to_string(), digest)
                });
                ApiError::invalid(message)
            })?;
        let text = match table {
            Some(table) => toml::to_string(&table)
                .map_err(|e| ApiError::internal(format!("writing the job with digests: {e}")))?,
            None => text.to_string(),
        };
        let needs = self.needs(&job)?;
        self.budget.check(needs)?;
        Ok(Checked {
            job,
            needs,
            text,
            resolved,
        })
    }

    /// Accept `text` as a new job of `tenant` called `name`, and start it.
    pub async fn submit(
        self: &Arc<Self>,
        tenant: &TenantId,
        name: &str,
        text: &str,
    ) -> Result<Submitted, ApiError> {
        if name.len() > 128 || name.contains('/') || !plain_path(name) {
            return Err(ApiError::invalid(format!(
                "job name {name:?}: use 1 to 128 letters, digits, `-`, `_` or `.`"
            )));
        }
        let Checked {
            job,
            needs,
            text,
            resolved,
        } = self.check(tenant, name, text).await?;
        let lock = LockFile {
            packages: resolved.clone(),
        };
        let id = JobId::random().map_err(|e| ApiError::internal(e.to_string()))?;
        let record = {
            let (records, tenant, quota) = (
                Arc::clone(&self.records),
                tenant.clone(),
                self.quotas.active_jobs_per_tenant,
            );
            let (id, name) = (id.clone(), name.to_string());
            let folder = self.folder(&tenant, &id);
            blocking(move || {
                let active = records.active(&tenant).map_err(record_error)?;
                if active >= quota {
                    return Err(ApiError::new(
                        ApiErrorKind::QuotaExceeded,
                        format!(
                            "the tenant has {active} jobs queued or running, its quota: cancel \
                             one or wait for one to end"
                        ),
                    ));
                }
                std::fs::create_dir_all(&folder)
                    .map_err(|e| ApiError::internal(format!("{}: {e}", folder.display())))?;
                crate::store::write_atomic(&folder.join(SUBMITTED), text.as_bytes())
                    .map_err(|e| ApiError::internal(format!("{}: {e}", folder.display())))?;
                if !lock.packages.is_empty() {
                    let path = crate::market::lock_path(&folder.join(SUBMITTED));
                    lock.save(&path)
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                }
                records
                    .insert(&id, &tenant, &name, &text)
                    .map_err(record_error)
            })
            .await?
        };
        self.start(record.clone(), Arc::new(job), needs, false);
        Ok(Submitted { record, resolved })
    }

    /// Start every job that had not ended when the server stopped: a job that was running
    /// continues from its last checkpoint. Returns how many.
    pub async fn resume_unfinished(self: &Arc<Self>) -> Result<usize, ApiError> {
        let records = Arc::clone(&self.records);
        let unfinished = blocking(move || records.unfinished().map_err(record_error)).await?;
        let count = unfinished.len();
        for record in unfinished {
            let Some(tenant) = record.tenant.clone() else {
                continue;
            };
            let resume = record.state == JobState::Running;
            match self.check(&tenant, &record.name, &record.spec).await {
                Ok(checked) => self.start(record, Arc::new(checked.job), checked.needs, resume),
                Err(error) => {
                    let message = format!("cannot be resumed: {error}");
                    self.finish(&record.id, JobState::Failed, Some(message), None)
                        .await;
                }
            }
        }
        Ok(count)
    }

    /// Run `job` as a task of its own, once the memory budget has room for the `needs` bytes
    /// it will hold (queued until then).
    fn start(self: &Arc<Self>, record: JobRecord, job: Arc<Job>, needs: u64, resume: bool) {
        let Some(tenant) = record.tenant.clone() else {
            return;
        };
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let out = self.folder(&tenant, &record.id);
        let run = JobRun {
            name: record.name.clone(),
            file: out.join(SUBMITTED),
            job,
            out,
        };
        let prefix = format!("jobs/{tenant}/{}/", record.id);
        let bases = TenantBases::new(self.bases.clone(), tenant.clone(), prefix);
        let (bases, rollout_session) = match &self.rollouts {
            Some(rollouts) => {
                let service = Arc::clone(&rollouts.service);
                let session = service.open_session(&tenant);
                let wire = WireSamplers::new(Arc::clone(&service), tenant.clone(), session.clone());
                let rollout_session = RolloutSession {
                    service,
                    tenant: tenant.clone(),
                    session,
                };
                (
                    bases.with_rollouts(rollouts.queue.clone(), rollouts.login.clone(), wire),
                    Some(rollout_session),
                )
            }
            None => (bases, None),
        };
        let engine = Engine::Served(bases);
        let progress: Progress = {
            let events = events.clone();
            Arc::new(move |_: &str, line: &StepMetrics| {
                if let Ok(json) = serde_json::to_string(line)
                    && let Some(line) = StepLine::parse(&json)
                {
                    // Nobody following is nothing to tell.
                    let _ = events.send(JobEvent::Step(line));
                }
            })
        };
        let service = Arc::clone(self);
        let id = record.id.clone();
        // The entry is in place before the task can end and remove it.
        let mut running = self.running();
        let task = tokio::spawn(async move {
            // Held until the job ends, is cancelled (the task aborted) or fails.
            let _rollout_session = rollout_session;
            let _reservation = service.budget.admit(&id, needs).await;
            service.set_state(&id, JobState::Running).await;
            let host = service.plugins.host();
            let outcome = rl::run_job(run, resume, &engine, host, progress).await;
            let (state, error, summary) = match outcome {
                Ok(summary) => (
                    JobState::Succeeded,
                    None,
                    serde_json::to_value(summary).ok(),
                ),
                Err(error) => (JobState::Failed, Some(format!("{error:#}")), None),
            };
            service.finish(&id, state, error, summary).await;
        });
        running.insert(
            record.id,
            Running {
                abort: task.abort_handle(),
                events,
            },
        );
    }

    async fn set_state(&self, id: &JobId, state: JobState) {
        let (records, id) = (Arc::clone(&self.records), id.clone());
        let set = blocking(move || {
            records
                .set_state(&id, state, None, None)
                .map_err(record_error)
        });
        if let Err(error) = set.await {
            tracing::warn!("recording a job's state: {error}");
        }
    }

    /// Record how job `id` ended, and tell its followers. A path of the server in the error
    /// is written from the jobs' folder on (`jobs/TENANT/ID/...`, as the job's files are
    /// named to its tenant): no path of the server's disk reaches an answer.
    async fn finish(
        &self,
        id: &JobId,
        state: JobState,
        error: Option<String>,
        summary: Option<serde_json::Value>,
    ) {
        let root = self.root.display().to_string();
        let error = error.map(|e| e.replace(&root, "jobs"));
        let (records, record_id, message) = (Arc::clone(&self.records), id.clone(), error.clone());
        let set = blocking(move || {
            records
                .set_state(&record_id, state, message.as_deref(), summary.as_ref())
                .map_err(record_error)
        });
        if let Err(error) = set.await {
            tracing::warn!("recording how job {id} ended: {error}");
        }
        if let Some(running) = self.running().remove(id) {
            let _ = running.events.send(JobEvent::Ended { state, error });
        }
    }

    /// `tenant`'s job `id`; another tenant's is answered as an unknown one.
    pub async fn get(&self, tenant: &TenantId, id: &JobId) -> Result<JobRecord, ApiError> {
        let (records, tenant, id) = (Arc::clone(&self.records), tenant.clone(), id.clone());
        let mut record = blocking(move || {
            records
                .get(&tenant, &id)
                .map_err(record_error)?
                .ok_or_else(|| ApiError::not_found(format!("job {id}")))
        })
        .await?;
        self.show_waiting(&mut record);
        Ok(record)
    }

    /// `tenant`'s jobs, newest first.
    pub async fn list(&self, tenant: &TenantId) -> Result<Vec<JobRecord>, ApiError> {
        let (records, tenant) = (Arc::clone(&self.records), tenant.clone());
        let mut listed = blocking(move || records.list(&tenant).map_err(record_error)).await?;
        for record in &mut listed {
            self.show_waiting(record);
        }
        Ok(listed)
    }

    /// Where job `id` waits for memory, if it does.
    pub fn queue_place(&self, id: &JobId) -> Option<QueuePlace> {
        self.budget.place(id)
    }

    /// A job waiting for memory is `queued`, whatever its record says: one that was running
    /// when the server stopped keeps `running` recorded (so that a restart resumes it from its
    /// checkpoint), and waits again until the budget has room.
    fn show_waiting(&self, record: &mut JobRecord) {
        if self.budget.place(&record.id).is_some() {
            record.state = JobState::Queued;
        }
    }

    /// The job's record, its latest metrics line and its evaluations.
    pub async fn status(&self, tenant: &TenantId, id: &JobId) -> Result<JobStatus, ApiError> {
        let record = self.get(tenant, id).await?;
        let lines = self.metric_lines(tenant, id).await?;
        let evaluations = lines
            .iter()
            .filter(|line| line.evaluated)
            .filter_map(|line| serde_json::from_str::<StepMetrics>(&line.json).ok())
            .flat_map(|line| evaluations_of(&line))
            .collect();
        let latest = lines
            .last()
            .and_then(|line| serde_json::from_str(&line.json).ok());
        let queue = self.budget.place(id);
        Ok(JobStatus {
            record,
            latest,
            evaluations,
            queue,
        })
    }

    /// The lines of the job's `metrics.jsonl` so far.
    pub async fn metric_lines(
        &self,
        tenant: &TenantId,
        id: &JobId,
    ) -> Result<Vec<StepLine>, ApiError> {
        let path = self.folder(tenant, id).join(METRICS);
        blocking(move || {
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(ApiError::internal(format!("{}: {e}", path.display()))),
            };
            Ok(text.lines().filter_map(StepLine::parse).collect())
        })
        .await
    }

    /// Follow `tenant`'s job `id`: the lines so far, and the events to come while it runs
    /// (`None` once it has ended). Lines in both are told once by their position.
    pub async fn follow(
        &self,
        tenant: &TenantId,
        id: &JobId,
    ) -> Result<
        (
            JobRecord,
            Vec<StepLine>,
            Option<broadcast::Receiver<JobEvent>>,
        ),
        ApiError,
    > {
        self.get(tenant, id).await?;
        // Subscribe before reading the file, so that no line falls between the two.
        let events = self.running().get(id).map(|r| r.events.subscribe());
        let lines = self.metric_lines(tenant, id).await?;
        let record = self.get(tenant, id).await?;
        Ok((record, lines, events))
    }

    /// Stop `tenant`'s job `id`, which is then `cancelled`; a job that has ended stays as it
    /// ended.
    pub async fn cancel(&self, tenant: &TenantId, id: &JobId) -> Result<JobRecord, ApiError> {
        let record = self.get(tenant, id).await?;
        if record.state.is_final() {
            return Ok(record);
        }
        if let Some(running) = self.running().get(id) {
            running.abort.abort();
        }
        self.finish(id, JobState::Cancelled, None, None).await;
        self.get(tenant, id).await
    }

    /// Every file of the job's run folder (metrics, rollouts, checkpoints).
    pub async fn files(&self, tenant: &TenantId, id: &JobId) -> Result<Vec<RunFile>, ApiError> {
        self.get(tenant, id).await?;
        let folder = self.folder(tenant, id);
        blocking(move || match files_under(&folder) {
            Ok(files) => Ok(files),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(ApiError::internal(format!("{}: {e}", folder.display()))),
        })
        .await
    }

    /// The adapter folder `which` of `tenant`'s job `id`: its final adapter (`""`), or a folder
    /// under its `checkpoints/` (`step-10/policy`, `final/x`).
    pub async fn adapter_folder(
        &self,
        tenant: &TenantId,
        id: &JobId,
        which: &str,
    ) -> Result<PathBuf, ApiError> {
        self.get(tenant, id).await?;
        let which = match which {
            "" => "final",
            which => which,
        };
        let unknown = || ApiError::not_found(format!("adapter {which:?} of job {id}"));
        if !plain_path(which) {
            return Err(unknown());
        }
        let dir = self.folder(tenant, id).join("checkpoints").join(which);
        let config = dir.join("adapter_config.json");
        let exists = blocking(move || Ok(config.is_file())).await?;
        match exists {
            true => Ok(dir),
            false => Err(unknown()),
        }
    }

    /// A file of the job's run folder, by its path there (`metrics.jsonl`,
    /// `rollouts/step-N.jsonl`, ...): only names of letters, digits, `-`, `_`, `.` and `/`,
    /// never `..`.
    pub async fn file(
        &self,
        tenant: &TenantId,
        id: &JobId,
        path: &str,
    ) -> Result<Vec<u8>, ApiError> {
        self.get(tenant, id).await?;
        if !plain_path(path) {
            return Err(ApiError::not_found(format!("file {path:?} of job {id}")));
        }
        let full = self.folder(tenant, id).join(path);
        let (id, path) = (id.clone(), path.to_string());
        blocking(move || {
            std::fs::read(&full)
                .map_err(|_| ApiError::not_found(format!("file {path:?} of job {id}")))
        })
        .await
    }
}

/// Whether `path` is a path inside a folder: `/`-separated parts of letters, digits, `-`, `_`
/// and `.`, none `.` or `..`.
fn plain_path(path: &str) -> bool {
    path.split('/').all(|part| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    })
}

/// A file of a job's run folder, as listed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunFile {
    /// Its path in the run folder, `/`-separated.
    pub path: String,
    pub bytes: u64,
}

/// Every file under `root`, by its path there, sorted.
fn files_under(root: &Path) -> std::io::Result<Vec<RunFile>> {
    let mut files = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            // Staged folders being written (`.tmp...`) are not the run's yet.
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if kind.is_dir() {
                folders.push(path);
            } else if kind.is_file()
                && let Ok(relative) = path.strip_prefix(root)
            {
                let parts: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                files.push(RunFile {
                    path: parts.join("/"),
                    bytes: entry.metadata()?.len(),
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The job file as submitted, in its run folder.
pub const SUBMITTED: &str = "submitted.toml";
