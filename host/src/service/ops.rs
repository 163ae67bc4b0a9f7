//! The engine as a service: every tenant's sessions, models and samplers over the served base
//! models, reached through typed ops ([`Op`]) rather than closures. A tenant sees only its own
//! objects; another tenant's id is answered exactly as an unknown one.
//!
//! Ops that name a model run in the order of their `seq` for that model (the Tinker SDK numbers
//! a training client's requests 1, 2, ... and may send chunks of one call at once); everything
//! else runs as it arrives. Training work of all tenants meets in the base's training loop,
//! which fuses the `forward_backward` calls waiting in one cycle into one pass.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use candle_core::DType;
use tokio::sync::watch;

use super::base::ServedBase;
use super::checkpoints::CheckpointStore;
use super::convert::{self, sampler_error, train_error, trainer_error};
pub use super::custom_losses::LossRecord;
use super::custom_losses::{self, CustomLosses};
use super::export;
use super::objectives::{ObjectivePlugins, names_a_plugin};
use super::sequences::SequenceRecords;
use super::usage::Usage;
use crate::api::{
    AdamParams, ApiError, ApiErrorKind, BaseModelInfo, CheckpointInfo, CheckpointKind,
    CheckpointPath, ForwardBackwardInput, ForwardBackwardOutput, LossId, ModelId, ModelInfo, Op,
    OpOutput, OptimStepOutput, SampleRequest, SampleResponse, SamplerId, SamplerInfo,
    SamplerSource, SaveOptions, SessionId, TenantId, UserMetadata,
};
use crate::lora::PolicyVersion;
use crate::plugin::{Limits, Plugin};
use crate::sample::{self, PolicyRef, TokenSink};
use crate::train::{self, Loss, SlotState, SlotStateError, TrainError, TrainingEngine, WorkItem};

/// Snapshot samplers a model keeps (`save_weights_and_get_sampling_client` each RL step); the
/// oldest is let go past it, so a long loop does not hold every adapter it ever sampled with.
const MAX_SNAPSHOTS_PER_MODEL: usize = 8;
/// Sessions one tenant may have open at once; past it `create_session` is refused.
const MAX_LIVE_SESSIONS_PER_TENANT: usize = 1024;
/// Finished sessions one tenant's are remembered as finished (answered `gone`); older ones
/// are forgotten.
const MAX_FINISHED_SESSIONS_PER_TENANT: usize = 1024;
/// Sampling sessions a client session keeps (`create_sampling_client` each evaluation); the
/// oldest is let go past it.
const MAX_SAMPLERS_PER_SESSION: usize = 64;

/// Where the service keeps its files.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Checkpoints live under `data/checkpoints/TENANT/`.
    pub data: PathBuf,
    /// Models (adapters in training) one tenant may hold at once; past it `create_model` is
    /// refused with [`ApiErrorKind::QuotaExceeded`].
    pub max_models_per_tenant: usize,
    /// How far past its model's next `seq_id` a call may be numbered: one further ahead is
    /// refused, since it would hold its place waiting for calls that may never come.
    pub max_seq_ahead: u64,
    /// How long a call waits for its turn in its model's order before it is failed (and its
    /// place, body and journal entry freed).
    pub turn_deadline: Duration,
    /// The disk one tenant's checkpoints may take; past it a save is refused.
    pub max_checkpoint_bytes_per_tenant: u64,
}

impl ServiceConfig {
    /// The service with its files in `data` and the default quotas.
    pub fn new(data: PathBuf) -> Self {
        ServiceConfig {
            data,
            max_models_per_tenant: 256,
            max_seq_ahead: DEFAULT_MAX_SEQ_AHEAD,
            turn_deadline: DEFAULT_TURN_DEADLINE,
            max_checkpoint_bytes_per_tenant: DEFAULT_MAX_CHECKPOINT_BYTES_PER_TENANT,
        }
    }
}

/// [`ServiceConfig::max_seq_ahead`] unless set: a tenant's default cap on queued requests.
pub const DEFAULT_MAX_SEQ_AHEAD: u64 = 4096;
/// [`ServiceConfig::max_checkpoint_bytes_per_tenant`] unless set: 64 GiB.
pub const DEFAULT_MAX_CHECKPOINT_BYTES_PER_TENANT: u64 = 64 << 30;
/// [`ServiceConfig::turn_deadline`] unless set.
pub const DEFAULT_TURN_DEADLINE: Duration = Duration::from_secs(3600);

/// The turn of each op of one model: ops with `seq` run when every lower `seq` has run.
struct OpOrder {
    next: watch::Sender<u64>,
}

impl OpOrder {
    /// An order whose next op is `next`.
    fn new(next: u64) -> Self {
        OpOrder {
            next: watch::Sender::new(next),
        }
    }
}

/// A model's turn for one op; dropping it passes the turn to the next `seq`.
pub struct Turn {
    model: Arc<TrainedModel>,
    seq: u64,
}

impl Turn {
    /// Wait for `seq`'s turn in `model`'s order, at most `rules.turn_deadline`; a `seq` used
    /// already, or more than `rules.max_seq_ahead` past the next, is refused at once.
    async fn wait(
        model: Arc<TrainedModel>,
        id: &ModelId,
        seq: u64,
        rules: &ServiceConfig,
    ) -> Result<Turn, ApiError> {
        let mut next = model.order.next.subscribe();
        let current = *next.borrow();
        if seq < current {
            return Err(ApiError::new(
                ApiErrorKind::Conflict,
                format!("seq_id {seq} of model {id} was used already (the next is {current})"),
            ));
        }
        check_ahead(id, seq, current, rules.max_seq_ahead)?;
        let deadline = rules.turn_deadline;
        let waited = tokio::time::timeout(deadline, next.wait_for(|n| *n == seq))
            .await
            .map(|reached| reached.is_ok());
        match waited {
            Ok(true) => Ok(Turn { model, seq }),
            Ok(false) => Err(ApiError::internal("the model's op order was dropped")),
            Err(_) => Err(ApiError::invalid(format!(
                "seq_id {seq} of model {id} waited {}s for its turn; the calls before it \
                 (from seq_id {}) never came",
                deadline.as_secs_f64(),
                *next.borrow()
            ))),
        }
    }
}

/// Refuse `seq` more than `max_ahead` past `next`, its model's next turn.
fn check_ahead(id: &ModelId, seq: u64, next: u64, max_ahead: u64) -> Result<(), ApiError> {
    if seq.saturating_sub(next) > max_ahead {
        return Err(ApiError::invalid(format!(
            "seq_id {seq} of model {id} is {} past its next turn ({next}); at most {max_ahead} \
             are accepted ahead",
            seq - next
        )));
    }
    Ok(())
}

impl Drop for Turn {
    fn drop(&mut self) {
        let seq = self.seq;
        self.model.order.next.send_if_modified(|n| {
            let mine = *n == seq;
            if mine {
                *n = seq + 1;
            }
            mine
        });
    }
}

/// A change to the service's objects that a durable server records (with the answer of the op
/// that made it, in one transaction) so that a restarted service is the same ([`Service::restore`]).
#[derive(Clone, Debug)]
pub enum Change {
    Session {
        id: SessionId,
        tenant: TenantId,
    },
    /// A model made (`state` is then always given), or the op `applied_seq` of its order ran
    /// (`state`: its training state after the op, when the op changed it).
    Model {
        id: ModelId,
        tenant: TenantId,
        base: String,
        lora_rank: usize,
        applied_seq: u64,
        state: Option<Vec<u8>>,
        /// What the client attached to the run, given when the model is made.
        user_metadata: Option<UserMetadata>,
    },
    Sampler {
        id: SamplerId,
        tenant: TenantId,
        base: String,
        source: SamplerRecord,
    },
    /// A sampler let go (an old snapshot of a model that made too many).
    SamplerDropped {
        id: SamplerId,
    },
    /// A custom loss kept (`create_custom_loss`).
    CustomLoss {
        id: LossId,
        tenant: TenantId,
        loss: LossRecord,
    },
    /// A session finished (by its client, or idle too long): its models, samplers and custom
    /// losses are gone.
    SessionFinished {
        id: SessionId,
    },
}

/// What a sampling session samples from, as recorded.
#[derive(Clone, Debug)]
pub enum SamplerRecord {
    Base,
    Checkpoint(CheckpointPath),
    /// An adapter as it was when snapshotted ([`SlotState`] bytes without optimizer state), and
    /// the model it was taken of, whose latest snapshots are kept (`None`: recorded before the
    /// journal kept it; such a snapshot is kept until its session ends).
    Snapshot {
        model: Option<ModelId>,
        state: Vec<u8>,
    },
}

/// What an op made: its output, the changes besides the model's progress, and the model's
/// training state when the op changed it (taken on the training loop with the op).
struct Ran {
    output: OpOutput,
    changes: Vec<Change>,
    state: Option<Vec<u8>>,
}

impl Ran {
    fn with_state(output: OpOutput, state: Option<Vec<u8>>) -> Self {
        Ran {
            output,
            changes: Vec::new(),
            state,
        }
    }
}

impl From<(OpOutput, Vec<Change>)> for Ran {
    fn from((output, changes): (OpOutput, Vec<Change>)) -> Self {
        Ran {
            output,
            changes,
            state: None,
        }
    }
}

/// An op's result: its output (or error), the changes to record before answering, and the
/// model's turn, held until the caller drops it (after recording), so that the next op of the
/// model never runs before this one is durable.
pub struct Executed {
    pub outcome: Result<OpOutput, ApiError>,
    pub changes: Vec<Change>,
    pub hold: Hold,
}

/// The change that records `model`'s turn `seq` as taken (with its new training state, if the
/// op changed it).
fn turn_taken(
    tenant: &TenantId,
    id: ModelId,
    model: &TrainedModel,
    seq: u64,
    state: Option<Vec<u8>>,
) -> Change {
    Change::Model {
        id,
        tenant: tenant.clone(),
        base: model.base.name.clone(),
        lora_rank: model.lora_rank,
        applied_seq: seq,
        state,
        user_metadata: None,
    }
}

/// What a save writes: the adapter with its optimizer state (`save_state`), the adapter alone
/// (`save_weights_for_sampler`), or an export for download, sealed to its recipients.
enum SaveAs {
    State,
    Sampler,
    External(Vec<age::x25519::Recipient>),
}

/// A model's turn, passed on when this is dropped.
pub struct Hold {
    _turn: Option<Turn>,
}

impl Hold {
    /// Nothing held.
    pub fn none() -> Self {
        Hold { _turn: None }
    }
}

impl Executed {
    fn failed(error: ApiError) -> Self {
        Executed {
            outcome: Err(error),
            changes: Vec::new(),
            hold: Hold::none(),
        }
    }
}

/// A model being trained: one adapter in its base's training loop.
struct TrainedModel {
    tenant: TenantId,
    base: Arc<ServedBase>,
    /// The adapter's name in the training loop and the registry (unique over tenants).
    adapter: String,
    lora_rank: usize,
    order: OpOrder,
}

impl TrainedModel {
    /// The engine's work item of a `forward` / `forward_backward` call on this model, every
    /// datum checked.
    fn work(&self, input: &ForwardBackwardInput, loss: Loss) -> Result<WorkItem, ApiError> {
        let (config, context) = (&self.base.config, self.base.context);
        convert::work_item(&self.adapter, input, loss, config, context)
    }

    /// `get_info`'s answer about this model, `id`.
    fn info(&self, id: ModelId) -> ModelInfo {
        ModelInfo {
            model_id: id,
            base_model: self.base.name.clone(),
            arch: self.base.config.architecture.model_type().to_string(),
            lora_rank: self.lora_rank,
        }
    }
}

/// What [`Service::validate`] built in checking an op, handed on to [`Service::execute`] so
/// that it is not built twice: a `forward_backward`'s work item (its datums checked and
/// converted for the engine). Empty for the other ops, and for a call run again after a
/// restart, which is checked when it runs.
#[derive(Default)]
pub struct Checked {
    work: Option<CheckedWork>,
}

impl Checked {
    /// Drop `op`'s datums when this holds them converted (as a queued call would otherwise
    /// hold each of its datums twice).
    pub fn drop_datums_of(&self, op: &mut Op) {
        if let (Some(_), Op::ForwardBackward { input, .. }) = (&self.work, op) {
            input.data = Vec::new();
        }
    }
}

/// A `forward_backward`'s work item and the model it was checked against.
struct CheckedWork {
    model: Arc<TrainedModel>,
    item: WorkItem,
}

/// A sampling session: a fixed policy on a base.
struct Sampler {
    tenant: TenantId,
    base: Arc<ServedBase>,
    /// `None`: the base model. Held, so the version stays alive while the session does.
    policy: Option<Arc<PolicyVersion>>,
    model_path: Option<String>,
}

/// A client's session: whose it is, and whether it still lives.
struct Session {
    tenant: TenantId,
    /// Finished by its client or for idleness: its models and samplers are freed, and it takes
    /// no more work.
    finished: bool,
    /// The last heartbeat or op that named it (or the server's start, for a restored one).
    last_seen: std::time::Instant,
}

impl Session {
    fn new(tenant: TenantId) -> Self {
        Session {
            tenant,
            finished: false,
            last_seen: std::time::Instant::now(),
        }
    }
}

#[derive(Default)]
struct Objects {
    sessions: HashMap<SessionId, Session>,
    /// Each tenant's live sessions, counted against [`MAX_LIVE_SESSIONS_PER_TENANT`].
    live_sessions: HashMap<TenantId, usize>,
    /// Each tenant's finished sessions, kept (to answer `gone`) up to
    /// [`MAX_FINISHED_SESSIONS_PER_TENANT`], the oldest finished leaving first.
    finished_sessions: HashMap<TenantId, VecDeque<SessionId>>,
    models: HashMap<ModelId, Arc<TrainedModel>>,
    samplers: HashMap<SamplerId, Arc<Sampler>>,
    /// Each model's snapshot samplers, oldest first.
    snapshots: HashMap<ModelId, VecDeque<SamplerId>>,
    /// Each session's sampling sessions made by `create_sampling_session`, oldest first.
    session_samplers: HashMap<SessionId, VecDeque<SamplerId>>,
    /// Numbers the registry names of policies loaded from checkpoints.
    loaded_policies: u64,
}

impl Objects {
    /// Add `tenant`'s session `id`, live, or refuse it past the tenant's quota.
    fn add_session(&mut self, tenant: &TenantId, id: SessionId) -> Result<(), ApiError> {
        let live = self.live_sessions.entry(tenant.clone()).or_default();
        if *live >= MAX_LIVE_SESSIONS_PER_TENANT {
            return Err(ApiError::new(
                ApiErrorKind::QuotaExceeded,
                format!(
                    "{live} sessions of yours are open; at most {MAX_LIVE_SESSIONS_PER_TENANT} \
                     (close one, or let it go idle)"
                ),
            ));
        }
        *live += 1;
        self.sessions.insert(id, Session::new(tenant.clone()));
        Ok(())
    }

    /// Mark `id` (a live session of its tenant) finished; the tenant's oldest finished session
    /// past its quota leaves memory (naming it then answers as an unknown id).
    fn session_finished(&mut self, id: &SessionId) {
        let Some(session) = self.sessions.get_mut(id) else {
            return;
        };
        if std::mem::replace(&mut session.finished, true) {
            return;
        }
        let tenant = session.tenant.clone();
        if let Some(live) = self.live_sessions.get_mut(&tenant) {
            *live = live.saturating_sub(1);
        }
        let finished = self.finished_sessions.entry(tenant).or_default();
        finished.push_back(id.clone());
        while finished.len() > MAX_FINISHED_SESSIONS_PER_TENANT {
            if let Some(oldest) = finished.pop_front() {
                self.sessions.remove(&oldest);
            }
        }
    }

    /// Check that `session` is `tenant`'s and live (another tenant's answers as an unknown
    /// one), and count this as a sign of its life.
    fn live_session(&mut self, tenant: &TenantId, session: &SessionId) -> Result<(), ApiError> {
        match self.sessions.get_mut(session) {
            Some(entry) if &entry.tenant == tenant => match entry.finished {
                true => Err(gone(format!("session {session}"))),
                false => {
                    entry.last_seen = std::time::Instant::now();
                    Ok(())
                }
            },
            _ => Err(ApiError::not_found(format!("session {session}"))),
        }
    }

    /// The error for `what` of a finished session: gone for good, though once the caller's.
    fn finished(&self, tenant: &TenantId, session: &SessionId, what: String) -> ApiError {
        match self.sessions.get(session) {
            Some(entry) if &entry.tenant == tenant && entry.finished => gone(what),
            _ => ApiError::not_found(what),
        }
    }
}

/// A new session id: unguessable, though another tenant's would only answer "not found".
fn new_session_id() -> SessionId {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).unwrap_or_default();
    SessionId::new(&format!("s-{}", hex::encode(bytes)))
        .unwrap_or_else(|_| unreachable!("hex is a plain name"))
}

/// `what` belonged to a session that has finished.
fn gone(what: String) -> ApiError {
    ApiError::new(
        ApiErrorKind::Gone,
        format!("{what}: its session has finished (ServiceClient.close, or idle too long)"),
    )
}

/// Every served base and every tenant's objects on them.
pub struct Service {
    bases: BTreeMap<String, Arc<ServedBase>>,
    config: ServiceConfig,
    checkpoints: CheckpointStore,
    sequences: SequenceRecords,
    custom_losses: CustomLosses,
    /// Each tenant's objective plugins, loaded by the server from its uploads.
    objectives: Mutex<HashMap<TenantId, ObjectivePlugins>>,
    objects: Mutex<Objects>,
}

impl Service {
    pub fn new(bases: Vec<ServedBase>, config: ServiceConfig) -> Self {
        Service {
            bases: bases
                .into_iter()
                .map(|b| (b.name.clone(), Arc::new(b)))
                .collect(),
            checkpoints: CheckpointStore::new(&config.data),
            sequences: SequenceRecords::default(),
            custom_losses: CustomLosses::default(),
            objectives: Mutex::default(),
            config,
            objects: Mutex::new(Objects::default()),
        }
    }

    /// Give `tenant` `weight` times an equal share of every base's training and sampling.
    pub fn set_weight(&self, tenant: &TenantId, weight: u64) {
        for base in self.bases.values() {
            base.trainer.set_weight(tenant.as_str(), weight);
            base.sampler.set_weight(tenant.as_str(), weight);
        }
    }

    /// The served base called `name`, if any (its tokenizer and chat template are what clients
    /// that send text are served with).
    pub fn served_base(&self, name: &str) -> Option<Arc<ServedBase>> {
        self.bases.get(name).cloned()
    }

    /// Each served base's loops, by base name: what each tenant has been served by its
    /// training and sampling loops, and has waiting.
    pub fn usage(&self) -> Vec<(String, Usage, Usage)> {
        self.bases
            .values()
            .map(|b| {
                let training = b.trainer.usage().clone();
                (b.name.clone(), training, b.sampler.usage().clone())
            })
            .collect()
    }

    /// Every served base (jobs the server runs train on them).
    pub fn bases(&self) -> Vec<Arc<ServedBase>> {
        self.bases.values().cloned().collect()
    }

    /// The served base models.
    pub fn capabilities(&self) -> Vec<BaseModelInfo> {
        self.bases
            .values()
            .map(|b| BaseModelInfo {
                model_name: b.name.clone(),
                max_context_length: b.context,
            })
            .collect()
    }

    /// Run `op` for `tenant`, with what its [`Service::validate`] built (or
    /// `Checked::default()`: it is checked now). An op that names a model and carries `seq`
    /// waits for its turn in that model's order, and holds it until the returned [`Executed`]
    /// is dropped.
    pub async fn execute(
        &self,
        tenant: &TenantId,
        op: Op,
        seq: Option<u64>,
        checked: Checked,
    ) -> Executed {
        let model = match op.model().map(|id| self.model(tenant, id)).transpose() {
            Ok(model) => model,
            Err(error) => return Executed::failed(error),
        };
        let id = op.model().cloned();
        let turn = match (&model, seq, &id) {
            (Some(model), Some(seq), Some(id)) => {
                match Turn::wait(Arc::clone(model), id, seq, &self.config).await {
                    Ok(turn) => Some(turn),
                    Err(error) => return Executed::failed(error),
                }
            }
            _ => None,
        };
        let mutates = matches!(
            op,
            Op::ForwardBackward {
                forward_only: false,
                ..
            } | Op::OptimStep { .. }
                | Op::LoadState { .. }
        );
        let ran = self.run(tenant, op, model.clone(), checked).await;
        let (mut outcome, mut changes, captured) = match ran {
            Ok(ran) => (Ok(ran.output), ran.changes, ran.state),
            Err(error) => (Err(error), Vec::new(), None),
        };
        if let (Some(turn), Some(model), Some(id)) = (&turn, model, id) {
            // Even a failed op may have changed the state (a pass that failed half way): then
            // it is read now.
            let state = match (mutates, captured) {
                (true, Some(state)) => Some(state),
                (true, None) => match model_state(&model).await {
                    Ok(state) => Some(state),
                    Err(error) => {
                        outcome = Err(error);
                        None
                    }
                },
                (false, _) => None,
            };
            changes.push(turn_taken(tenant, id, &model, turn.seq, state));
        }
        Executed {
            outcome,
            changes,
            hold: Hold { _turn: turn },
        }
    }

    /// Refuse a call of `tenant`'s model `id` numbered `seq` more than
    /// [`ServiceConfig::max_seq_ahead`] past the model's next turn, before it is accepted (a
    /// repeat of a call that ran is not refused here: it is answered as the first was).
    pub fn check_seq(&self, tenant: &TenantId, id: &ModelId, seq: u64) -> Result<(), ApiError> {
        let model = self.model(tenant, id)?;
        let next = *model.order.next.borrow();
        check_ahead(id, seq, next, self.config.max_seq_ahead)
    }

    /// Pass `tenant`'s model `id`'s turn `seq` without running anything: the turn of a request
    /// that the SDK numbered in the model's order but that was refused before it was accepted
    /// (a bad datum, a route not offered). Waits for the ops before it; the change records the
    /// turn as taken, so that the model's next op, also after a restart, does not wait for it.
    pub async fn pass_turn(
        &self,
        tenant: &TenantId,
        id: &ModelId,
        seq: u64,
    ) -> Result<(Vec<Change>, Hold), ApiError> {
        let model = self.model(tenant, id)?;
        let turn = Turn::wait(Arc::clone(&model), id, seq, &self.config).await?;
        let change = turn_taken(tenant, id.clone(), &model, seq, None);
        Ok((vec![change], Hold { _turn: Some(turn) }))
    }

    /// The op itself, with the changes it makes besides a model's progress.
    async fn run(
        &self,
        tenant: &TenantId,
        op: Op,
        model: Option<Arc<TrainedModel>>,
        checked: Checked,
    ) -> Result<Ran, ApiError> {
        let model_of = |model: Option<Arc<TrainedModel>>| {
            model.ok_or_else(|| ApiError::internal("the op names no model"))
        };
        let output = match op {
            Op::CreateSession => {
                let id = self.create_session(tenant)?;
                let change = Change::Session {
                    id: id.clone(),
                    tenant: tenant.clone(),
                };
                return Ok((OpOutput::Session(id), vec![change]).into());
            }
            Op::CreateModel {
                session,
                model_seq,
                base_model,
                lora,
                user_metadata,
            } => {
                let config = convert::lora_config(&lora)?;
                let base = self.base(&base_model)?;
                let (id, model) = self.new_model(tenant, &session, model_seq, base, lora.rank)?;
                let adapter = model.adapter.clone();
                let add = move |e: &mut TrainingEngine| e.add_adapter(&adapter, config);
                let started = self.start_model(tenant, id, model, user_metadata, add);
                return started.await.map(Into::into);
            }
            Op::CreateModelFromState {
                session,
                model_seq,
                path,
                with_optimizer,
                user_metadata,
            } => {
                let dir = self.checkpoints.loadable(tenant, &path)?;
                let (base, lora_rank) = self.checkpoint_origin(tenant, &path, &dir)?;
                let (id, model) = self.new_model(tenant, &session, model_seq, base, lora_rank)?;
                let adapter = model.adapter.clone();
                let load =
                    move |e: &mut TrainingEngine| e.load_adapter(&adapter, &dir, with_optimizer);
                let started = self.start_model(tenant, id, model, user_metadata, load);
                return started.await.map(Into::into);
            }
            Op::GetInfo { model: id } => OpOutput::Info(model_of(model)?.info(id)),
            Op::ForwardBackward {
                model: id,
                input,
                forward_only,
            } => {
                let model = model_of(model)?;
                let ran = self.forward_backward(tenant, &id, &model, input, forward_only, checked);
                return ran.await;
            }
            Op::OptimStep { params, .. } => {
                let (output, state) = optim_step(&*model_of(model)?, params).await?;
                return Ok(Ran::with_state(OpOutput::OptimStep(output), Some(state)));
            }
            Op::SaveState {
                model: id,
                name,
                options,
            } => {
                let path = CheckpointPath::new(id, CheckpointKind::Weights, &name)?;
                let model = model_of(model)?;
                self.save(tenant, &model, &path, SaveAs::State, options)
                    .await?;
                OpOutput::Checkpoint(path)
            }
            Op::SaveWeightsForSampler {
                model: id,
                name,
                options,
            } => {
                let path = CheckpointPath::new(id, CheckpointKind::SamplerWeights, &name)?;
                let model = model_of(model)?;
                self.save(tenant, &model, &path, SaveAs::Sampler, options)
                    .await?;
                OpOutput::Checkpoint(path)
            }
            Op::SaveWeightsExternal {
                model: id,
                name,
                options,
                recipients,
            } => {
                let path = CheckpointPath::new(id, CheckpointKind::External, &name)?;
                let how = SaveAs::External(export::recipients(&recipients)?);
                let model = model_of(model)?;
                self.save(tenant, &model, &path, how, options).await?;
                OpOutput::Checkpoint(path)
            }
            Op::LoadState {
                path,
                with_optimizer,
                ..
            } => {
                let model = model_of(model)?;
                return self.load_state(tenant, &model, path, with_optimizer).await;
            }
            Op::SnapshotForSampler {
                model: id,
                sampler_seq,
            } => {
                let model = model_of(model)?;
                return self
                    .snapshot_for_sampler(tenant, id, &model, sampler_seq)
                    .await;
            }
            Op::CreateSamplingSession {
                session,
                sampler_seq,
                source,
            } => {
                let made = self.create_sampling_session(tenant, session, sampler_seq, source);
                return made.await;
            }
            Op::GetSampler { sampler: id } => {
                let sampler = self.sampler(tenant, &id)?;
                OpOutput::SamplerInfo(SamplerInfo {
                    sampler_id: id,
                    base_model: sampler.base.name.clone(),
                    model_path: sampler.model_path.clone(),
                })
            }
            Op::Sample(request) => OpOutput::Sample(self.sample(tenant, request).await?),
            Op::CreateCustomLoss {
                session,
                loss_seq,
                name,
                inputs,
                graph,
            } => {
                let record = LossRecord {
                    name,
                    inputs,
                    graph,
                };
                return self.create_custom_loss(tenant, session, loss_seq, record);
            }
        };
        Ok((output, Vec::new()).into())
    }

    /// `Op::Sample`, with each token told to `tokens` as it is sampled (for streamed answers).
    pub async fn sample_streaming(
        &self,
        tenant: &TenantId,
        request: SampleRequest,
        tokens: TokenSink,
    ) -> Result<SampleResponse, ApiError> {
        let sampler = self.sampler(tenant, &request.sampler)?;
        sample_with(&sampler, request, Some(tokens)).await
    }

    /// A `forward` or `forward_backward` on `model`, on the work its check built (or on the
    /// work built now, for a call that comes without: run again after a restart).
    async fn forward_backward(
        &self,
        tenant: &TenantId,
        id: &ModelId,
        model: &TrainedModel,
        input: ForwardBackwardInput,
        forward_only: bool,
        checked: Checked,
    ) -> Result<Ran, ApiError> {
        let item = match checked.work {
            Some(work) if std::ptr::eq(Arc::as_ptr(&work.model), model) => work.item,
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "model {id} was replaced after this call was accepted: send it again"
                )));
            }
            None => {
                let resolved = self.sequences.resolve(tenant, &id.session, &input)?;
                let input = resolved.as_ref().unwrap_or(&input);
                model.work(input, self.loss(tenant, input)?)?
            }
        };
        let (output, state) = forward_backward(model, item, input.loss_fn, forward_only).await?;
        Ok(Ran::with_state(OpOutput::ForwardBackward(output), state))
    }

    /// `load_state`: the adapter's weights (and optimizer state) from `tenant`'s checkpoint.
    async fn load_state(
        &self,
        tenant: &TenantId,
        model: &TrainedModel,
        path: CheckpointPath,
        with_optimizer: bool,
    ) -> Result<Ran, ApiError> {
        let dir = self.checkpoints.loadable(tenant, &path)?;
        let adapter = model.adapter.clone();
        let state = model
            .base
            .trainer
            .with(move |e| {
                e.load_adapter(&adapter, &dir, with_optimizer)
                    .map_err(train_error)?;
                encoded_state(e, &adapter)
            })
            .await
            .map_err(trainer_error)??;
        Ok(Ran::with_state(OpOutput::Checkpoint(path), Some(state)))
    }

    /// `save_weights_and_get_sampling_client`'s sampler: the adapter as it is now, published
    /// as a policy version; the model keeps its latest few.
    async fn snapshot_for_sampler(
        &self,
        tenant: &TenantId,
        id: ModelId,
        model: &TrainedModel,
        sampler_seq: u64,
    ) -> Result<Ran, ApiError> {
        let state = adapter_values(model).await?;
        let sampler = SamplerId::of_session(&id.session, sampler_seq);
        // One registry name per model: its versions are freed as its samplers are let go.
        let policy = publish(&model.base, &model.adapter, &state).await?;
        self.add_sampler(
            &sampler,
            Sampler {
                tenant: tenant.clone(),
                base: Arc::clone(&model.base),
                policy: Some(policy),
                model_path: None,
            },
        )?;
        let mut changes = vec![Change::Sampler {
            id: sampler.clone(),
            tenant: tenant.clone(),
            base: model.base.name.clone(),
            source: SamplerRecord::Snapshot {
                model: Some(id.clone()),
                state,
            },
        }];
        let mut objects = self.lock();
        let Objects {
            snapshots,
            samplers,
            ..
        } = &mut *objects;
        let limit = MAX_SNAPSHOTS_PER_MODEL;
        changes.extend(keep_latest(snapshots, samplers, id, &sampler, limit));
        Ok((OpOutput::Sampler(sampler), changes).into())
    }

    /// A sampling session of a base model or a checkpoint, in `session`; the session keeps
    /// its latest few.
    async fn create_sampling_session(
        &self,
        tenant: &TenantId,
        session: SessionId,
        sampler_seq: u64,
        source: SamplerSource,
    ) -> Result<Ran, ApiError> {
        self.session(tenant, &session)?;
        let id = SamplerId::of_session(&session, sampler_seq);
        let record = match &source {
            SamplerSource::Base(_) => SamplerRecord::Base,
            SamplerSource::Checkpoint(path) => SamplerRecord::Checkpoint(path.clone()),
        };
        let sampler = self.open_sampler(tenant, source).await?;
        let change = Change::Sampler {
            id: id.clone(),
            tenant: tenant.clone(),
            base: sampler.base.name.clone(),
            source: record,
        };
        self.add_sampler(&id, sampler)?;
        let mut changes = vec![change];
        let mut objects = self.lock();
        let Objects {
            session_samplers,
            samplers,
            ..
        } = &mut *objects;
        let limit = MAX_SAMPLERS_PER_SESSION;
        changes.extend(keep_latest(session_samplers, samplers, session, &id, limit));
        Ok((OpOutput::Sampler(id), changes).into())
    }

    /// A sample of `request`, its sequences recorded when it asks (`record_as`).
    async fn sample(
        &self,
        tenant: &TenantId,
        request: SampleRequest,
    ) -> Result<SampleResponse, ApiError> {
        let sampler = self.sampler(tenant, &request.sampler)?;
        let (id, record_as) = (request.sampler.clone(), request.record_as.clone());
        let prompt = request.prompt.tokens();
        let response = sample_with(&sampler, request, None).await?;
        if let Some(ids) = record_as {
            self.sequences.record(tenant, &id, &prompt, &ids, &response);
        }
        Ok(response)
    }

    /// `create_custom_loss`: the loss compiled and kept for `session`'s calls.
    fn create_custom_loss(
        &self,
        tenant: &TenantId,
        session: SessionId,
        loss_seq: u64,
        record: LossRecord,
    ) -> Result<Ran, ApiError> {
        self.session(tenant, &session)?;
        let compiled = custom_losses::compile(&record)?;
        let id = LossId {
            session,
            seq: loss_seq,
        };
        self.custom_losses.keep(tenant, id.clone(), compiled);
        let change = Change::CustomLoss {
            id: id.clone(),
            tenant: tenant.clone(),
            loss: record,
        };
        Ok((OpOutput::CustomLoss(id), vec![change]).into())
    }

    /// Check `op` for `tenant` without running it: unknown (or another tenant's) ids, bad
    /// datums and bad parameters are refused here, before a request is accepted. The op is
    /// checked again when it runs (a model may be gone by then).
    pub fn validate(&self, tenant: &TenantId, op: &Op) -> Result<Checked, ApiError> {
        if let Op::ForwardBackward { model, input, .. } = op {
            let trained = self.model(tenant, model)?;
            let resolved = self.sequences.resolve(tenant, &model.session, input)?;
            let input = resolved.as_ref().unwrap_or(input);
            let item = trained.work(input, self.loss(tenant, input)?)?;
            return Ok(Checked {
                work: Some(CheckedWork {
                    model: trained,
                    item,
                }),
            });
        }
        self.check(tenant, op).map(|()| Checked::default())
    }

    /// [`Service::validate`] of the ops whose check builds nothing to hand on.
    fn check(&self, tenant: &TenantId, op: &Op) -> Result<(), ApiError> {
        match op {
            Op::CreateSession | Op::GetInfo { .. } | Op::GetSampler { .. } => Ok(()),
            Op::CreateModel {
                session,
                base_model,
                lora,
                ..
            } => {
                self.session(tenant, session)?;
                self.base(base_model)?;
                convert::lora_config(lora).map(|_| ())
            }
            Op::CreateModelFromState { session, path, .. } => {
                self.session(tenant, session)?;
                self.checkpoints.loadable(tenant, path).map(|_| ())
            }
            // Checked by `validate` itself.
            Op::ForwardBackward { .. } => Ok(()),
            Op::OptimStep { model, params } => {
                self.model(tenant, model)?;
                convert::check_adam(params)
            }
            Op::SaveState { model, name, .. } => {
                self.model(tenant, model)?;
                CheckpointPath::new(model.clone(), CheckpointKind::Weights, name).map(|_| ())
            }
            Op::SaveWeightsForSampler { model, name, .. } => {
                self.model(tenant, model)?;
                CheckpointPath::new(model.clone(), CheckpointKind::SamplerWeights, name).map(|_| ())
            }
            Op::SaveWeightsExternal {
                model,
                name,
                recipients,
                ..
            } => {
                self.model(tenant, model)?;
                export::recipients(recipients)?;
                CheckpointPath::new(model.clone(), CheckpointKind::External, name).map(|_| ())
            }
            Op::LoadState { model, path, .. } => {
                self.model(tenant, model)?;
                self.checkpoints.loadable(tenant, path).map(|_| ())
            }
            Op::SnapshotForSampler { model, .. } => self.model(tenant, model).map(|_| ()),
            Op::CreateSamplingSession { session, .. } => self.session(tenant, session),
            Op::Sample(request) => {
                engine_request(&*self.sampler(tenant, &request.sampler)?, request).map(|_| ())
            }
            Op::CreateCustomLoss {
                session,
                name,
                inputs,
                graph,
                ..
            } => {
                self.session(tenant, session)?;
                let record = LossRecord {
                    name: name.clone(),
                    inputs: inputs.clone(),
                    graph: graph.clone(),
                };
                custom_losses::compile(&record).map(|_| ())
            }
        }
    }

    /// Take `plugin` (an objective), run under `limits`, as a loss of `tenant`'s calls; answer
    /// the name they give it as `loss_fn` (`sha256:HEX`).
    pub fn keep_objective(
        &self,
        tenant: &TenantId,
        plugin: &Plugin,
        limits: &Limits,
    ) -> Result<String, ApiError> {
        self.lock_objectives()
            .entry(tenant.clone())
            .or_default()
            .keep(plugin, limits)
    }

    /// `tenant`'s objective plugin kept under `name`.
    pub fn objective(&self, tenant: &TenantId, name: &str) -> Option<Plugin> {
        self.lock_objectives()
            .get(tenant)
            .and_then(|kept| kept.get(name).cloned())
    }

    fn lock_objectives(&self) -> MutexGuard<'_, HashMap<TenantId, ObjectivePlugins>> {
        // One insert per change: consistent across a panic.
        self.objectives.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The loss a `forward` / `forward_backward` call of `tenant` takes: a built-in one, one of
    /// its objective plugins, or the custom loss its `loss_id` names (another tenant's
    /// plugin or loss answers as unknown).
    fn loss(&self, tenant: &TenantId, input: &ForwardBackwardInput) -> Result<Loss, ApiError> {
        if names_a_plugin(&input.loss_fn) {
            let objectives = self.lock_objectives();
            return objectives
                .get(tenant)
                .and_then(|kept| kept.loss(input))
                .unwrap_or_else(|| {
                    Err(ApiError::not_found(format!(
                        "objective plugin {}: upload it first (POST /api/v1/plugins)",
                        input.loss_fn
                    )))
                });
        }
        if input.loss_fn != convert::CUSTOM_LOSS {
            return convert::builtin_loss(input);
        }
        let Some(id) = &input.custom_loss else {
            return Err(ApiError::invalid(
                "loss \"custom\" needs loss_fn_config[\"loss_id\"], a loss made by create_custom_loss",
            ));
        };
        if let Some(key) = input.loss_fn_config.keys().next() {
            return Err(ApiError::invalid(format!(
                "loss custom: unknown config key {key:?} (known: loss_id)"
            )));
        }
        self.session(tenant, &id.session)?;
        Ok(Loss::Custom(self.custom_losses.get(tenant, id)?))
    }

    /// `tenant`'s live checkpoints of its model `model` (every model's when `None`), oldest first.
    pub async fn checkpoints(
        &self,
        tenant: &TenantId,
        model: Option<&ModelId>,
    ) -> Result<Vec<CheckpointInfo>, ApiError> {
        // A model of a finished session is gone, its checkpoints are not.
        if let Some(model) = model
            && let Err(error) = self.model(tenant, model)
            && error.kind != ApiErrorKind::Gone
        {
            return Err(error);
        }
        let (store, tenant, model) = (self.checkpoints.clone(), tenant.clone(), model.cloned());
        tokio::task::spawn_blocking(move || match model {
            Some(model) => store.list(&tenant, &model),
            None => store.list_all(&tenant),
        })
        .await
        .map_err(|e| ApiError::internal(format!("listing checkpoints: {e}")))
    }

    /// Delete `tenant`'s checkpoint `path`, files and all; another tenant's is not found.
    /// Samplers opened on it keep the adapter they loaded.
    /// The files of `tenant`'s live checkpoint `path`, by name, each with where it lies: what
    /// an export's download serves.
    pub async fn checkpoint_files(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
    ) -> Result<Vec<(String, PathBuf)>, ApiError> {
        let (store, tenant, path) = (self.checkpoints.clone(), tenant.clone(), path.clone());
        tokio::task::spawn_blocking(move || store.files(&tenant, &path))
            .await
            .map_err(|e| ApiError::internal(format!("listing a checkpoint: {e}")))?
    }

    pub async fn delete_checkpoint(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
    ) -> Result<(), ApiError> {
        let (store, tenant, path) = (self.checkpoints.clone(), tenant.clone(), path.clone());
        tokio::task::spawn_blocking(move || store.delete(&tenant, &path))
            .await
            .map_err(|e| ApiError::internal(format!("deleting a checkpoint: {e}")))?
    }

    /// Keep `tenant`'s checkpoint `path` for `ttl_seconds` from now (`None`: until deleted).
    pub async fn set_checkpoint_ttl(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
        ttl_seconds: Option<u64>,
    ) -> Result<CheckpointInfo, ApiError> {
        let (store, tenant, path) = (self.checkpoints.clone(), tenant.clone(), path.clone());
        tokio::task::spawn_blocking(move || store.set_ttl(&tenant, &path, ttl_seconds))
            .await
            .map_err(|e| ApiError::internal(format!("setting a checkpoint's expiry: {e}")))?
    }

    /// Delete every tenant's expired checkpoints; the paths deleted.
    pub async fn sweep_checkpoints(&self) -> Vec<(TenantId, CheckpointPath)> {
        let store = self.checkpoints.clone();
        tokio::task::spawn_blocking(move || store.sweep(crate::store::unix_now()))
            .await
            .unwrap_or_default()
    }

    /// Restore the objects that `changes` (the latest record of each) describe: what a
    /// restarted durable server calls before it serves.
    pub async fn restore(&self, changes: Vec<Change>) -> Result<(), ApiError> {
        // The samplers kept per model and per session, rebuilt (oldest first) so that the
        // limits hold across restarts.
        let mut restored_snapshots = Vec::new();
        let mut restored_session_samplers = Vec::new();
        for change in changes {
            match change {
                Change::Session { id, tenant } => {
                    // A start recorded before the quota, or past it, is not refused again.
                    let mut objects = self.lock();
                    *objects.live_sessions.entry(tenant.clone()).or_default() += 1;
                    objects.sessions.insert(id, Session::new(tenant));
                }
                Change::SessionFinished { id } => self.lock().session_finished(&id),
                Change::Model {
                    id,
                    tenant,
                    base,
                    lora_rank,
                    applied_seq,
                    state,
                    ..
                } => {
                    // A model of a finished session is freed, though its last op may have
                    // recorded it after the session finished.
                    if self
                        .lock()
                        .sessions
                        .get(&id.session)
                        .is_none_or(|s| s.finished)
                    {
                        continue;
                    }
                    let base = self.base(&base)?;
                    let state = state.ok_or_else(|| {
                        ApiError::internal(format!("model {id} was recorded without its state"))
                    })?;
                    let model = Arc::new(TrainedModel {
                        adapter: format!("{tenant}/{id}"),
                        tenant,
                        base,
                        lora_rank,
                        order: OpOrder::new(applied_seq + 1),
                    });
                    let adapter = model.adapter.clone();
                    model
                        .base
                        .trainer
                        .with(move |e| {
                            let state = SlotState::decode(&state, DType::F32)
                                .map_err(|e| ApiError::internal(e.to_string()))?;
                            e.import_state(&adapter, state).map_err(train_error)
                        })
                        .await
                        .map_err(trainer_error)??;
                    self.lock().models.insert(id, model);
                }
                Change::Sampler {
                    id,
                    tenant,
                    base,
                    source,
                } => {
                    if !matches!(source, SamplerRecord::Snapshot { .. })
                        && let Ok(session) = SessionId::new(id.session())
                    {
                        restored_session_samplers.push((session, id.clone()));
                    }
                    let sampler = match source {
                        SamplerRecord::Base => {
                            self.open_sampler(&tenant, SamplerSource::Base(base))
                                .await?
                        }
                        SamplerRecord::Checkpoint(path) => {
                            let source = SamplerSource::Checkpoint(path.clone());
                            match self.open_sampler(&tenant, source).await {
                                Ok(sampler) => sampler,
                                // Deleted or expired since: the sampler is gone with it.
                                Err(error) if error.kind == ApiErrorKind::NotFound => {
                                    tracing::info!(%id, %path, "a sampler's checkpoint is gone");
                                    continue;
                                }
                                Err(error) => return Err(error),
                            }
                        }
                        SamplerRecord::Snapshot { model, state } => {
                            if let Some(model) = model {
                                restored_snapshots.push((model, id.clone()));
                            }
                            let base = self.base(&base)?;
                            let policy = publish(&base, &format!("{tenant}/{id}"), &state).await?;
                            Sampler {
                                tenant,
                                base,
                                policy: Some(policy),
                                model_path: None,
                            }
                        }
                    };
                    self.lock().samplers.insert(id, Arc::new(sampler));
                }
                Change::SamplerDropped { id } => {
                    self.lock().samplers.remove(&id);
                }
                Change::CustomLoss { id, tenant, loss } => {
                    let live = self
                        .lock()
                        .sessions
                        .get(&id.session)
                        .is_some_and(|s| !s.finished);
                    if live {
                        self.custom_losses
                            .keep(&tenant, id, custom_losses::compile(&loss)?);
                    }
                }
            }
        }
        let mut objects = self.lock();
        let Objects {
            samplers,
            snapshots,
            session_samplers,
            ..
        } = &mut *objects;
        restored_snapshots.sort_by_key(|(_, id)| id.seq());
        for (model, id) in restored_snapshots {
            if samplers.contains_key(&id) {
                snapshots.entry(model).or_default().push_back(id);
            }
        }
        restored_session_samplers.sort_by_key(|(_, id)| id.seq());
        for (session, id) in restored_session_samplers {
            if samplers.contains_key(&id) {
                session_samplers.entry(session).or_default().push_back(id);
            }
        }
        Ok(())
    }

    /// Put a new model's adapter in the training loop with `make`, and record the model with
    /// its state; a model whose adapter could not be made is forgotten.
    async fn start_model(
        &self,
        tenant: &TenantId,
        id: ModelId,
        model: Arc<TrainedModel>,
        user_metadata: UserMetadata,
        make: impl FnOnce(&mut TrainingEngine) -> Result<(), TrainError> + Send + 'static,
    ) -> Result<(OpOutput, Vec<Change>), ApiError> {
        let made = model
            .base
            .trainer
            .with(make)
            .await
            .map_err(trainer_error)
            .and_then(|r| r.map_err(train_error));
        let state = match made {
            Ok(()) => model_state(&model).await,
            Err(error) => Err(error),
        };
        let state = match state {
            Ok(state) => state,
            Err(error) => {
                self.forget_model(&id);
                return Err(error);
            }
        };
        let change = Change::Model {
            id: id.clone(),
            tenant: tenant.clone(),
            base: model.base.name.clone(),
            lora_rank: model.lora_rank,
            applied_seq: 0,
            state: Some(state),
            user_metadata: Some(user_metadata),
        };
        Ok((OpOutput::Model(id), vec![change]))
    }

    fn lock(&self) -> MutexGuard<'_, Objects> {
        // The maps stay consistent across a panic: every change is one insert.
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn create_session(&self, tenant: &TenantId) -> Result<SessionId, ApiError> {
        let id = new_session_id();
        self.lock().add_session(tenant, id.clone())?;
        Ok(id)
    }

    /// Check that `session` is `tenant`'s and live, and count this as a sign of its life.
    fn session(&self, tenant: &TenantId, session: &SessionId) -> Result<(), ApiError> {
        self.lock().live_session(tenant, session)
    }

    /// A heartbeat of `tenant`'s `session`: it lives on (an idle session is finished by
    /// [`Service::finish_idle_sessions`]). A finished one answers [`ApiErrorKind::Gone`], which
    /// is how the SDK's heartbeat learns to stop.
    pub fn heartbeat(&self, tenant: &TenantId, session: &SessionId) -> Result<(), ApiError> {
        self.session(tenant, session)
    }

    /// Finish `tenant`'s `session` (the SDK's `ServiceClient.close`): its models' adapters and
    /// optimizer states and its samplers are freed now, and later ops on them answer
    /// [`ApiErrorKind::Gone`]; checkpoints stay until their owner or their TTL removes them.
    /// Finishing a finished session changes nothing (the first finish wins).
    pub fn finish_session(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Vec<Change>, ApiError> {
        let mut objects = self.lock();
        match objects.sessions.get(session) {
            Some(entry) if &entry.tenant == tenant => {
                if entry.finished {
                    return Ok(Vec::new());
                }
            }
            _ => return Err(ApiError::not_found(format!("session {session}"))),
        }
        objects.session_finished(session);
        let models: Vec<ModelId> = objects
            .models
            .keys()
            .filter(|id| &id.session == session)
            .cloned()
            .collect();
        for id in models {
            objects.snapshots.remove(&id);
            if let Some(model) = objects.models.remove(&id) {
                let adapter = model.adapter.clone();
                model.base.trainer.detach(move |e| {
                    // An adapter never made (its model failed) has nothing to free.
                    let _ = e.remove_adapter(&adapter);
                });
            }
        }
        objects
            .samplers
            .retain(|id, _| id.session() != session.as_str());
        objects.session_samplers.remove(session);
        self.custom_losses.forget_session(session);
        Ok(vec![Change::SessionFinished {
            id: session.clone(),
        }])
    }

    /// Finish every session that no heartbeat or op has named for `idle` (a client that went
    /// away without `close`); the changes to record.
    pub fn finish_idle_sessions(&self, idle: std::time::Duration) -> Vec<Change> {
        let idle: Vec<(SessionId, TenantId)> = self
            .lock()
            .sessions
            .iter()
            .filter(|(_, s)| !s.finished && s.last_seen.elapsed() >= idle)
            .map(|(id, s)| (id.clone(), s.tenant.clone()))
            .collect();
        idle.into_iter()
            .flat_map(|(id, tenant)| self.finish_session(&tenant, &id).unwrap_or_default())
            .collect()
    }

    /// The base and LoRA rank of the model that saved `tenant`'s checkpoint `path` (in `dir`):
    /// the model's own while it lives, else (its session finished) as the checkpoint's config
    /// names them.
    fn checkpoint_origin(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
        dir: &Path,
    ) -> Result<(Arc<ServedBase>, usize), ApiError> {
        match self.model(tenant, &path.model) {
            Ok(model) => Ok((Arc::clone(&model.base), model.lora_rank)),
            Err(error) if error.kind == ApiErrorKind::Gone => {
                let damaged = |e: train::checkpoint::CheckpointError| {
                    ApiError::internal(format!("checkpoint {path}: {e}"))
                };
                let base = train::checkpoint::base_model_of(dir).map_err(damaged)?;
                let rank = train::checkpoint::rank_of(dir).map_err(damaged)?;
                Ok((self.base(&base)?, rank))
            }
            Err(error) => Err(error),
        }
    }

    /// `tenant`'s model `id`; naming it is a sign of its session's life.
    fn model(&self, tenant: &TenantId, id: &ModelId) -> Result<Arc<TrainedModel>, ApiError> {
        let mut objects = self.lock();
        match objects.models.get(id) {
            Some(model) if &model.tenant == tenant => {
                let model = Arc::clone(model);
                if let Some(session) = objects.sessions.get_mut(&id.session) {
                    session.last_seen = std::time::Instant::now();
                }
                Ok(model)
            }
            _ => Err(objects.finished(tenant, &id.session, format!("model {id}"))),
        }
    }

    /// `tenant`'s sampler `id`; naming it is a sign of its session's life.
    fn sampler(&self, tenant: &TenantId, id: &SamplerId) -> Result<Arc<Sampler>, ApiError> {
        let mut objects = self.lock();
        let session = SessionId::new(id.session()).ok();
        match objects.samplers.get(id) {
            Some(sampler) if &sampler.tenant == tenant => {
                let sampler = Arc::clone(sampler);
                if let Some(entry) = session.and_then(|s| objects.sessions.get_mut(&s)) {
                    entry.last_seen = std::time::Instant::now();
                }
                Ok(sampler)
            }
            _ => Err(match session {
                Some(session) => objects.finished(tenant, &session, format!("sampler {id}")),
                None => ApiError::not_found(format!("sampler {id}")),
            }),
        }
    }

    fn base(&self, name: &str) -> Result<Arc<ServedBase>, ApiError> {
        self.bases.get(name).cloned().ok_or_else(|| {
            ApiError::invalid(format!(
                "base model {name:?} is not served here (served: {})",
                self.bases.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    fn add_sampler(&self, id: &SamplerId, sampler: Sampler) -> Result<(), ApiError> {
        let mut objects = self.lock();
        if objects.samplers.contains_key(id) {
            return Err(ApiError::new(
                ApiErrorKind::Conflict,
                format!("sampler {id} exists already"),
            ));
        }
        objects.samplers.insert(id.clone(), Arc::new(sampler));
        Ok(())
    }

    /// Reserve `session`'s model number `seq` for a new model on `base`.
    fn new_model(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        seq: u64,
        base: Arc<ServedBase>,
        lora_rank: usize,
    ) -> Result<(ModelId, Arc<TrainedModel>), ApiError> {
        self.session(tenant, session)?;
        let id = ModelId {
            session: session.clone(),
            seq,
        };
        let mut objects = self.lock();
        if objects.models.contains_key(&id) {
            return Err(ApiError::new(
                ApiErrorKind::Conflict,
                format!("model {id} exists already"),
            ));
        }
        let held = objects
            .models
            .values()
            .filter(|m| &m.tenant == tenant)
            .count();
        if held >= self.config.max_models_per_tenant {
            return Err(ApiError::new(
                ApiErrorKind::QuotaExceeded,
                format!(
                    "the tenant holds {held} models, its quota: train on one of them (or a \
                     saved state of one) instead of creating another"
                ),
            ));
        }
        let model = Arc::new(TrainedModel {
            tenant: tenant.clone(),
            adapter: format!("{tenant}/{id}"),
            base,
            lora_rank,
            order: OpOrder::new(1),
        });
        objects.models.insert(id.clone(), Arc::clone(&model));
        Ok((id, model))
    }

    fn forget_model(&self, id: &ModelId) {
        self.lock().models.remove(id);
    }

    /// Save `model`'s adapter at `path`: a copy is taken on the training loop, the files are
    /// written off it, so another tenant's step does not wait for this disk.
    async fn save(
        &self,
        tenant: &TenantId,
        model: &TrainedModel,
        path: &CheckpointPath,
        how: SaveAs,
        options: SaveOptions,
    ) -> Result<(), ApiError> {
        let adapter = model.adapter.clone();
        let with_optimizer = matches!(how, SaveAs::State);
        let (copy, optimizer) = model
            .base
            .trainer
            .with(move |e| {
                let copy = e
                    .adapter(&adapter)
                    .ok_or_else(|| ApiError::internal("the model's adapter is gone"))?
                    .frozen_copy()
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                let optimizer = match with_optimizer {
                    true => e
                        .optimizer_state(&adapter)
                        .map_err(|e| ApiError::internal(e.to_string()))?,
                    false => None,
                };
                Ok::<_, ApiError>((copy, optimizer))
            })
            .await
            .map_err(trainer_error)??;
        let dir = self.checkpoints.dir(tenant, path);
        let base_name = model.base.name.clone();
        let store = self.checkpoints.clone();
        let (tenant, quota) = (tenant.clone(), self.config.max_checkpoint_bytes_per_tenant);
        tokio::task::spawn_blocking(move || {
            store.check_room(&tenant, quota)?;
            let optimizer = optimizer.as_ref().map(|(step, moments)| (*step, moments));
            match how {
                SaveAs::External(recipients) => {
                    let seal = |dir: &Path| export::seal(dir, &recipients);
                    train::checkpoint::save_external(&dir, &copy, &base_name, seal)
                }
                SaveAs::State | SaveAs::Sampler => {
                    train::checkpoint::save(&dir, &copy, &base_name, optimizer)
                }
            }
            .map_err(|e| ApiError::internal(format!("saving the checkpoint: {e}")))?;
            store.set_retention(&dir, &options).map_err(|e| {
                ApiError::internal(format!(
                    "recording the checkpoint's expiry and metadata: {e}"
                ))
            })
        })
        .await
        .map_err(|e| ApiError::internal(format!("saving the checkpoint: {e}")))?
    }

    /// The sampler of `source`: the base model, or a checkpoint's adapter published on its base.
    async fn open_sampler(
        &self,
        tenant: &TenantId,
        source: SamplerSource,
    ) -> Result<Sampler, ApiError> {
        match source {
            SamplerSource::Base(name) => Ok(Sampler {
                tenant: tenant.clone(),
                base: self.base(&name)?,
                policy: None,
                model_path: None,
            }),
            SamplerSource::Checkpoint(path) => {
                let dir = self.checkpoints.loadable(tenant, &path)?;
                let (base, _) = self.checkpoint_origin(tenant, &path, &dir)?;
                let policy = self.load_policy(tenant, &base, dir).await?;
                Ok(Sampler {
                    tenant: tenant.clone(),
                    base,
                    policy: Some(policy),
                    model_path: Some(path.to_string()),
                })
            }
        }
    }

    /// Publish the adapter saved in `dir` (trained on `base`) as a policy of `tenant`'s.
    async fn load_policy(
        &self,
        tenant: &TenantId,
        base: &ServedBase,
        dir: PathBuf,
    ) -> Result<Arc<PolicyVersion>, ApiError> {
        let name = {
            let mut objects = self.lock();
            objects.loaded_policies += 1;
            format!("{tenant}/loaded-{}", objects.loaded_policies)
        };
        let config = base.config.clone();
        let registry = Arc::clone(&base.registry);
        tokio::task::spawn_blocking(move || {
            let loaded = train::checkpoint::load(&dir, &config, DType::F32)
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            registry
                .publish(&name, &loaded.adapter)
                .map_err(|e| ApiError::invalid(e.to_string()))
        })
        .await
        .map_err(|e| ApiError::internal(format!("loading the checkpoint: {e}")))?
    }

    /// A session of `tenant` for work the server does itself (a job it runs), not recorded: it
    /// lives while its samplers are used, and ends with [`Service::finish_session`].
    /// It is not counted against the tenant's quota of sessions (its jobs have their own).
    pub fn open_session(&self, tenant: &TenantId) -> SessionId {
        let id = new_session_id();
        let mut objects = self.lock();
        *objects.live_sessions.entry(tenant.clone()).or_default() += 1;
        objects
            .sessions
            .insert(id.clone(), Session::new(tenant.clone()));
        id
    }

    /// A sampling session of `tenant`'s `session` (number `sampler_seq`) on `policy` (an
    /// adapter version a job of the tenant published; `None`: the base model) of the served
    /// base `base`: what the job's rollout workers sample over the wire. Not recorded.
    pub fn open_version_sampler(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        sampler_seq: u64,
        base: &str,
        policy: Option<Arc<PolicyVersion>>,
    ) -> Result<SamplerId, ApiError> {
        self.session(tenant, session)?;
        let base = self.base(base)?;
        let sampler = Sampler {
            tenant: tenant.clone(),
            base,
            policy,
            model_path: None,
        };
        self.keep_session_sampler(session, sampler_seq, sampler)
    }

    /// A sampling session of `tenant`'s `session` (number `sampler_seq`) on an adapter folder
    /// the server holds for the tenant (a checkpoint of a job it ran), on the served base the
    /// folder's config names. Not recorded: its maker opens it again after a restart.
    pub async fn open_adapter_folder(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        sampler_seq: u64,
        dir: PathBuf,
        shown_as: &str,
    ) -> Result<SamplerId, ApiError> {
        self.session(tenant, session)?;
        // The folder's path is the server's: not told.
        let base_name = train::checkpoint::base_model_of(&dir)
            .map_err(|_| ApiError::not_found(format!("adapter {shown_as}")))?;
        let base = self.bases.get(&base_name).cloned().ok_or_else(|| {
            ApiError::invalid(format!(
                "{shown_as} was trained on a base this server does not serve ({base_name}: a \
                 job's full-parameter warm-up makes a base of its own)"
            ))
        })?;
        let policy = self.load_policy(tenant, &base, dir).await?;
        let sampler = Sampler {
            tenant: tenant.clone(),
            base,
            policy: Some(policy),
            model_path: Some(shown_as.to_string()),
        };
        self.keep_session_sampler(session, sampler_seq, sampler)
    }

    /// Add `sampler` as `session`'s number `sampler_seq`, letting go of the session's samplers
    /// past the latest [`MAX_SAMPLERS_PER_SESSION`].
    fn keep_session_sampler(
        &self,
        session: &SessionId,
        sampler_seq: u64,
        sampler: Sampler,
    ) -> Result<SamplerId, ApiError> {
        let id = SamplerId::of_session(session, sampler_seq);
        self.add_sampler(&id, sampler)?;
        let mut objects = self.lock();
        let Objects {
            session_samplers,
            samplers,
            ..
        } = &mut *objects;
        let limit = MAX_SAMPLERS_PER_SESSION;
        keep_latest(session_samplers, samplers, session.clone(), &id, limit);
        Ok(id)
    }
}

/// Adapter `adapter`'s whole training state as bytes (on the training loop).
fn encoded_state(engine: &TrainingEngine, adapter: &str) -> Result<Vec<u8>, ApiError> {
    let state = engine.export_state(adapter).map_err(train_error)?;
    state
        .encode()
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Add `sampler` to `owner`'s list, let go of those past the `limit` latest, and return their
/// records' removal.
fn keep_latest<K: std::hash::Hash + Eq>(
    lists: &mut HashMap<K, VecDeque<SamplerId>>,
    samplers: &mut HashMap<SamplerId, Arc<Sampler>>,
    owner: K,
    sampler: &SamplerId,
    limit: usize,
) -> Vec<Change> {
    let list = lists.entry(owner).or_default();
    list.push_back(sampler.clone());
    let excess = list.len().saturating_sub(limit);
    list.drain(..excess)
        .map(|id| {
            samplers.remove(&id);
            Change::SamplerDropped { id }
        })
        .collect()
}

/// `model`'s whole training state as bytes, taken on the training loop.
async fn model_state(model: &TrainedModel) -> Result<Vec<u8>, ApiError> {
    let adapter = model.adapter.clone();
    model
        .base
        .trainer
        .with(move |e| {
            let state = e.export_state(&adapter).map_err(train_error)?;
            state
                .encode()
                .map_err(|e| ApiError::internal(e.to_string()))
        })
        .await
        .map_err(trainer_error)?
}

/// `model`'s adapter values alone (no optimizer state) as [`SlotState`] bytes.
async fn adapter_values(model: &TrainedModel) -> Result<Vec<u8>, ApiError> {
    let adapter = model.adapter.clone();
    model
        .base
        .trainer
        .with(move |e| {
            let mut state = e.export_state(&adapter).map_err(train_error)?;
            for tensor in &mut state.tensors {
                tensor.moments = None;
                tensor.gradient = None;
            }
            state
                .encode()
                .map_err(|e| ApiError::internal(e.to_string()))
        })
        .await
        .map_err(trainer_error)?
}

/// Publish the adapter of `state` bytes on `base` under `name`, off the async workers.
async fn publish(
    base: &Arc<ServedBase>,
    name: &str,
    state: &[u8],
) -> Result<Arc<PolicyVersion>, ApiError> {
    let (base, name, state) = (Arc::clone(base), name.to_string(), state.to_vec());
    tokio::task::spawn_blocking(move || {
        let damaged = |e: SlotStateError| ApiError::internal(format!("a saved adapter: {e}"));
        let state = SlotState::decode(&state, DType::F32).map_err(damaged)?;
        let adapter = state.adapter(&base.config, DType::F32).map_err(damaged)?;
        base.registry
            .publish(&name, &adapter)
            .map_err(|e| ApiError::internal(e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal(format!("publishing an adapter: {e}")))?
}

/// The engine's request of a sample request on `sampler`, checked.
fn engine_request(
    sampler: &Sampler,
    request: &SampleRequest,
) -> Result<sample::SampleRequest, ApiError> {
    let base = &sampler.base;
    let prompt_asks = sample::PromptAsks {
        logprobs: request.prompt_logprobs,
        top_k: request.topk_prompt_logprobs,
        last_n: request.prompt_logprobs_last_n,
        targets: request
            .target_prompt_logprobs
            .as_ref()
            .map(convert::prompt_targets)
            .transpose()?,
        alt_k: request.prompt_alt_tokens_k,
    };
    let mut engine_request = convert::engine_request(
        &request.prompt,
        request.num_samples,
        &request.params,
        prompt_asks,
        request.topk_sample_logprobs,
        &base.config,
        base.context,
    )?;
    engine_request.policy = sampler.policy.as_ref().map(|v| PolicyRef {
        name: v.name.clone(),
        version: Some(v.version),
    });
    Ok(engine_request)
}

/// A `forward` or `forward_backward`, with the model's training state right after a
/// `forward_backward` (taken in the same cycle, so the answer does not wait for another).
async fn forward_backward(
    model: &TrainedModel,
    item: WorkItem,
    loss_fn: String,
    forward_only: bool,
) -> Result<(ForwardBackwardOutput, Option<Vec<u8>>), ApiError> {
    let adapter = model.adapter.clone();
    let (output, state) = convert::run_forward_backward(
        &model.base.trainer,
        model.tenant.as_str(),
        item,
        loss_fn,
        forward_only,
        Some(move |e: &mut TrainingEngine| encoded_state(e, &adapter)),
    )
    .await?;
    Ok((output, state.and_then(Result::ok)))
}

/// An `optim_step`, with the model's training state after it.
async fn optim_step(
    model: &TrainedModel,
    params: AdamParams,
) -> Result<(OptimStepOutput, Vec<u8>), ApiError> {
    let trainer = &model.base.trainer;
    convert::run_optim_step(trainer, &model.adapter, params, |e, a| encoded_state(e, a)).await
}

async fn sample_with(
    sampler: &Sampler,
    request: SampleRequest,
    tokens: Option<TokenSink>,
) -> Result<SampleResponse, ApiError> {
    let mut engine_request = engine_request(sampler, &request)?;
    engine_request.tokens = tokens;
    let output = sampler
        .base
        .sampler
        .sample_for(sampler.tenant.as_str(), engine_request)
        .await
        .map_err(sampler_error)?;
    Ok(convert::sample_response(output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Datum, LoraConfig, LossInput};
    use crate::service::{DeviceOptions, FairShare, TINY_MODEL_NAME, tiny_model_dir};

    /// What the server does with a `forward_backward`: checked when accepted (its datums
    /// converted once, then dropped from the queued op), run later on what the check built.
    #[tokio::test]
    async fn a_checked_forward_backward_runs_on_what_its_check_built() {
        let data = tempfile::tempdir().unwrap();
        let dir = tiny_model_dir(data.path()).unwrap();
        let base = ServedBase::load(
            TINY_MODEL_NAME,
            &dir,
            4096,
            FairShare::unlimited(),
            DeviceOptions::cpu(),
        )
        .unwrap();
        let service = Service::new(vec![base], ServiceConfig::new(data.path().to_path_buf()));
        let tenant = TenantId::new("alice").unwrap();
        let run = |op: Op| {
            let checked = service.validate(&tenant, &op).unwrap();
            service.execute(&tenant, op, None, checked)
        };
        let OpOutput::Session(session) = run(Op::CreateSession).await.outcome.unwrap() else {
            panic!("no session");
        };
        let lora = LoraConfig {
            rank: 4,
            seed: None,
            train_unembed: false,
            train_mlp: true,
            train_attn: true,
            alpha: None,
            rslora: false,
        };
        let create = Op::CreateModel {
            session,
            model_seq: 0,
            base_model: TINY_MODEL_NAME.into(),
            lora,
            user_metadata: Default::default(),
        };
        let OpOutput::Model(model) = run(create).await.outcome.unwrap() else {
            panic!("no model");
        };
        let datum = |n: u32| {
            Datum::new((1..=n).collect(), &(2..=n + 1).collect::<Vec<_>>())
                .with(LossInput::Weights, vec![1.0; n as usize])
        };
        let mut op = Op::ForwardBackward {
            model,
            input: ForwardBackwardInput {
                data: vec![datum(5), datum(7)],
                loss_fn: "cross_entropy".into(),
                loss_fn_config: BTreeMap::new(),
                custom_loss: None,
                temperature: 1.0,
            },
            forward_only: false,
        };
        let checked = service.validate(&tenant, &op).unwrap();
        checked.drop_datums_of(&mut op);
        let Op::ForwardBackward { input, .. } = &op else {
            unreachable!()
        };
        assert!(input.data.is_empty(), "the queued op keeps no datums");
        let executed = service.execute(&tenant, op.clone(), None, checked).await;
        let OpOutput::ForwardBackward(output) = executed.outcome.unwrap() else {
            panic!("not a forward_backward's output");
        };
        assert_eq!(output.loss_fn_outputs.len(), 2, "both datums ran");
        assert_eq!(output.metrics.get("tokens:sum"), Some(&12.0));
        // Without its check, the op is checked as it runs: here, the empty call it now is.
        let unchecked = service.execute(&tenant, op, None, Checked::default()).await;
        let refused = unchecked.outcome.unwrap_err();
        assert!(refused.message.contains("at least one datum"), "{refused}");
    }

    #[test]
    fn a_tenant_opens_at_most_its_quota_of_sessions_and_finished_ones_leave_memory() {
        let mut objects = Objects::default();
        let (alice, bob) = (
            TenantId::new("alice").unwrap(),
            TenantId::new("bob").unwrap(),
        );
        let ids: Vec<SessionId> = (0..MAX_LIVE_SESSIONS_PER_TENANT)
            .map(|_| new_session_id())
            .collect();
        for id in &ids {
            objects.add_session(&alice, id.clone()).unwrap();
        }
        let refused = objects.add_session(&alice, new_session_id()).unwrap_err();
        assert_eq!(refused.kind, ApiErrorKind::QuotaExceeded, "{refused}");
        // Another tenant's quota is its own; a finished session frees a place.
        objects.add_session(&bob, new_session_id()).unwrap();
        objects.session_finished(&ids[0]);
        objects.add_session(&alice, new_session_id()).unwrap();
        assert_eq!(
            objects.live_session(&alice, &ids[0]).unwrap_err().kind,
            ApiErrorKind::Gone
        );
        // Past the finished quota, the oldest finished is forgotten: an unknown id then.
        for id in &ids[1..] {
            objects.session_finished(id);
        }
        let extra = new_session_id();
        objects.add_session(&alice, extra.clone()).unwrap();
        objects.session_finished(&extra);
        assert_eq!(
            objects.live_session(&alice, &ids[0]).unwrap_err().kind,
            ApiErrorKind::NotFound
        );
        assert_eq!(
            objects.live_session(&alice, &ids[1]).unwrap_err().kind,
            ApiErrorKind::Gone
        );
        assert!(objects.sessions.len() <= MAX_FINISHED_SESSIONS_PER_TENANT + 3);
    }
}
