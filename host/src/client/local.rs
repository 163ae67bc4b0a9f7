//! The clients on this process's engines: a [`LocalModel`] loaded from a model folder (optionally
//! warmed up by training every weight with a [`FullParameterTrainer`]) is served as a
//! [`LocalService`], whose training clients share one training loop (fusing their
//! `forward_backward` calls) and whose sampling clients share one continuously batched sampler.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use async_trait::async_trait;
use candle_core::DType;

use super::{ModelText, SamplingClient, ServiceClient, TrainingClient};
use crate::api::{
    AdamParams, ApiError, ForwardBackwardInput, ForwardBackwardOutput, LoraConfig, ModelInput,
    OptimStepOutput, SampleResponse, SamplingParams, SessionId, TenantId,
};
use crate::lora::{AdapterRegistry, PolicyVersion};
use crate::market::Digest;
use crate::model::{Architecture, BaseFormat, Model, ModelConfig, Transformer};
use crate::model::{TinyShape, init_tiny};
use crate::plugin::{Limits, Plugin};
use crate::sample::{EngineConfig, PolicyRef};
use crate::service::convert::{self, sampler_error, train_error, trainer_error};
use crate::service::{
    DeviceOptions, ObjectivePlugins, SamplerService, ServedBase, Service, TrainerService,
};
use crate::text::{ChatTemplate, Tokenizer};
use crate::train::{FULL_PARAMETERS, Loss, TrainingEngine, WorkItem};

/// The settings of a generated tiny model, as a job file's `model.init_tiny` gives them (each
/// a serde enum: a wrong name is refused with the accepted ones).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TinyModelSpec {
    pub shape: TinyShape,
    pub arch: Architecture,
    pub seed: u64,
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        TinyModelSpec {
            shape: TinyShape::Tiny,
            arch: Architecture::Qwen2,
            seed: 0,
        }
    }
}

impl TinyModelSpec {
    /// The model `opentinker serve` serves as `opentinker/tiny`.
    pub fn built_in() -> Self {
        TinyModelSpec::default()
    }

    /// The configuration of the model [`TinyModelSpec::generate`] makes.
    pub fn config(&self) -> Result<ModelConfig, crate::model::ConfigError> {
        crate::model::tiny_config(self.shape, self.arch)
    }

    /// Generate the model into `dir` unless it is there: whole or absent, so a run killed
    /// while generating it generates it again.
    pub fn generate(&self, dir: &Path) -> anyhow::Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        crate::store::write_atomic_dir(dir, |temp| {
            init_tiny(temp, self.shape, self.arch, self.seed).map_err(std::io::Error::other)
        })
        .with_context(|| format!("generating the tiny model in {}", dir.display()))
    }
}

/// A model folder loaded into this process, before it is served.
pub struct LocalModel {
    dir: PathBuf,
    config: ModelConfig,
    transformer: Transformer,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<ChatTemplate>,
}

impl LocalModel {
    /// The model in `dir`, its base held as `format`.
    pub fn load(dir: &Path, format: BaseFormat) -> anyhow::Result<Self> {
        let Model {
            config,
            transformer,
            tokenizer,
            chat_template,
            ..
        } = Model::load_as(dir, format)?;
        Ok(LocalModel {
            dir: dir.to_path_buf(),
            config,
            transformer,
            tokenizer: Arc::new(tokenizer),
            chat_template,
        })
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// `None` when the folder has no chat template.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    pub fn context_length(&self) -> usize {
        self.transformer.context_length()
    }

    /// The tokenizer and chat template, shared.
    pub fn text(&self) -> ModelText {
        ModelText {
            tokenizer: Arc::clone(&self.tokenizer),
            chat_template: self.chat_template.clone(),
        }
    }

    /// Take the weights of a model folder that [`FullParameterTrainer::save_state`] wrote.
    pub fn load_weights(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.transformer = Transformer::load(self.config.clone(), dir, BaseFormat::F32)
            .with_context(|| format!("loading the weights of {}", dir.display()))?;
        Ok(())
    }

    /// A training client of every weight of the model (a full-parameter warm-up);
    /// [`FullParameterTrainer::finish`] gives the model back, trained. With `beside`, it trains
    /// as a guest of that service's training loop, in its fair queue as its tenant (a job on a
    /// server takes its tenant's share of a served base's passes); else on a loop of its own.
    pub fn full_parameter_trainer(
        self,
        beside: Option<&LocalService>,
        device: crate::model::Device,
    ) -> anyhow::Result<FullParameterTrainer> {
        let LocalModel {
            dir,
            config,
            transformer,
            tokenizer,
            chat_template,
        } = self;
        let context = transformer.context_length();
        let engine = TrainingEngine::full_parameters(transformer, DType::F32)?.on_device(device)?;
        let (trainer, tenant) = match beside {
            Some(service) => (service.0.trainer.attach(engine), service.0.tenant.clone()),
            None => (TrainerService::start(engine).0, String::new()),
        };
        Ok(FullParameterTrainer {
            trainer,
            tenant,
            dir,
            config,
            context,
            tokenizer,
            chat_template,
        })
    }

    /// Serve the model as `name` (what adapters' checkpoints record as their base) on `device`,
    /// its sampler holding at most `kv_budget_positions` KV positions at once. With `beside`,
    /// its adapters train as a guest of that service's training loop, as its tenant and with
    /// its adapter names, and its sampler is a loop of its own; else both loops are its own.
    pub fn serve(
        self,
        name: String,
        kv_budget_positions: usize,
        beside: Option<&LocalService>,
        device: DeviceOptions,
    ) -> anyhow::Result<LocalService> {
        let context = self.transformer.context_length();
        let registry = AdapterRegistry::new(Arc::new(self.transformer));
        // The loops' threads end when the last client drops its handles.
        let (sampler, engine) = device.start_engines(
            &registry,
            Some(self.tokenizer),
            self.config.eos_token_ids.clone(),
            EngineConfig {
                kv_budget_positions,
                // The next turn of an episode, and an RL group's repeats of one prompt, start
                // from the KV computed before.
                prefix_cache_positions: kv_budget_positions / 2,
            },
        )?;
        let (trainer, tenant, adapter_prefix) = match beside {
            Some(service) => (
                service.0.trainer.attach(engine),
                service.0.tenant.clone(),
                service.0.adapter_prefix.clone(),
            ),
            None => (
                TrainerService::start(engine).0,
                String::new(),
                String::new(),
            ),
        };
        Ok(LocalService(Arc::new(Served {
            name,
            config: self.config,
            context,
            registry,
            sampler,
            trainer,
            tenant,
            adapter_prefix,
            next_adapter: AtomicU64::new(0),
            objectives: Mutex::default(),
            wire: None,
            device,
        })))
    }
}

impl LocalService {
    /// Where its loops run (a guest model of a served base runs where the base does).
    pub fn device(&self) -> DeviceOptions {
        self.0.device
    }

    /// A base a server already serves, as `tenant` reaches it: its training and sampling share
    /// the base's loops fairly with every other tenant's. `adapter_prefix` keeps this client's
    /// adapter names apart from every other client's on the base (a job's id, say). With
    /// `wire`, its versions can be opened as samplers over the wire (for rollout workers).
    pub fn on_base(
        base: &ServedBase,
        tenant: &TenantId,
        adapter_prefix: &str,
        wire: Option<WireSamplers>,
    ) -> Self {
        LocalService(Arc::new(Served {
            name: base.name.clone(),
            config: base.config.clone(),
            context: base.context,
            registry: Arc::clone(&base.registry),
            sampler: base.sampler.clone(),
            trainer: base.trainer.clone(),
            tenant: tenant.as_str().to_string(),
            adapter_prefix: adapter_prefix.to_string(),
            next_adapter: AtomicU64::new(0),
            objectives: Mutex::default(),
            wire,
            device: base.device,
        }))
    }
}

/// A whole model in training (see [`LocalModel::full_parameter_trainer`]).
pub struct FullParameterTrainer {
    trainer: TrainerService,
    /// Whose share of the loop its work takes.
    tenant: String,
    /// The folder the model came from, whose other files a saved model copies.
    dir: PathBuf,
    config: ModelConfig,
    context: usize,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<ChatTemplate>,
}

impl FullParameterTrainer {
    /// The model as trained so far.
    pub async fn finish(self) -> anyhow::Result<LocalModel> {
        let transformer = self.trainer.with(|e| e.model_snapshot()).await??;
        Ok(LocalModel {
            dir: self.dir,
            config: self.config,
            transformer,
            tokenizer: self.tokenizer,
            chat_template: self.chat_template,
        })
    }

    /// The engine's work item of a call on the whole model, every datum checked.
    fn work(&self, input: &ForwardBackwardInput) -> Result<WorkItem, ApiError> {
        let loss = convert::builtin_loss(input)?;
        convert::work_item(FULL_PARAMETERS, input, loss, &self.config, self.context)
    }
}

#[async_trait]
impl TrainingClient for FullParameterTrainer {
    async fn forward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        let item = self.work(&input)?;
        train_call(&self.trainer, &self.tenant, item, input.loss_fn, true).await
    }

    async fn forward_backward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        let item = self.work(&input)?;
        train_call(&self.trainer, &self.tenant, item, input.loss_fn, false).await
    }

    async fn optim_step(&self, params: AdamParams) -> Result<OptimStepOutput, ApiError> {
        let step = convert::run_optim_step(&self.trainer, FULL_PARAMETERS, params, |_, _| Ok(()));
        Ok(step.await?.0)
    }

    async fn save_weights_and_get_sampling_client(
        &self,
    ) -> Result<Arc<dyn SamplingClient>, ApiError> {
        Err(ApiError::invalid(
            "a full-parameter warm-up is sampled only once it is served as a base model",
        ))
    }

    /// Write the whole model as a model folder: the source folder's files (config, tokenizer,
    /// chat template) and the trained weights.
    async fn save_state(&self, dir: &Path, _with_optimizer: bool) -> Result<(), ApiError> {
        let (source, dir) = (self.dir.clone(), dir.to_path_buf());
        self.trainer
            .with(move |e| -> anyhow::Result<()> {
                let model = e.model_snapshot()?;
                crate::model::write_model_files(&model, &source, &dir)?;
                Ok(())
            })
            .await
            .map_err(trainer_error)?
            .map_err(|e| ApiError::internal(format!("saving the model: {e:#}")))
    }
}

/// A model served in this process; clone it freely.
#[derive(Clone)]
pub struct LocalService(Arc<Served>);

struct Served {
    name: String,
    config: ModelConfig,
    context: usize,
    registry: Arc<AdapterRegistry>,
    sampler: SamplerService,
    trainer: TrainerService,
    /// Whose share of the loops this client's work takes (empty: the loops are this client's).
    tenant: String,
    /// Begins the name of every adapter made here.
    adapter_prefix: String,
    /// Numbers the adapters, so that two clients of one label never share a slot.
    next_adapter: AtomicU64,
    /// The objective plugins taken as losses, by the name `forward_backward` calls them.
    objectives: Mutex<ObjectivePlugins>,
    /// Where its versions are opened as samplers over the wire, for rollout workers (a served
    /// base's job on a server with a rollout queue); `None`: they live in this process only.
    wire: Option<WireSamplers>,
    /// Where the loops run.
    device: DeviceOptions,
}

/// Opens a served base's policy versions as sampling sessions of one session of the tenant, so
/// that the tenant's rollout workers can sample them over the Tinker wire.
#[derive(Clone)]
pub struct WireSamplers {
    service: Arc<Service>,
    tenant: TenantId,
    session: SessionId,
    next: Arc<AtomicU64>,
}

impl WireSamplers {
    /// Samplers opened in `tenant`'s `session` of `service` (the server's).
    pub fn new(service: Arc<Service>, tenant: TenantId, session: SessionId) -> Self {
        WireSamplers {
            service,
            tenant,
            session,
            next: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The session they are opened in.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// A new sampling session on `policy` (`None`: the base model) of base `base`: its id.
    fn open(&self, base: &str, policy: Option<Arc<PolicyVersion>>) -> Result<String, ApiError> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let id =
            self.service
                .open_version_sampler(&self.tenant, &self.session, seq, base, policy)?;
        Ok(id.to_string())
    }
}

impl LocalService {
    async fn new_client(
        &self,
        label: &str,
        make: impl FnOnce(&mut TrainingEngine, &str) -> Result<(), crate::train::TrainError>
        + Send
        + 'static,
    ) -> Result<Arc<dyn TrainingClient>, ApiError> {
        let n = self.0.next_adapter.fetch_add(1, Ordering::Relaxed);
        let adapter = format!("{}{label}#{n}", self.0.adapter_prefix);
        let id = adapter.clone();
        self.0
            .trainer
            .with(move |e| make(e, &id))
            .await
            .map_err(trainer_error)?
            .map_err(train_error)?;
        Ok(Arc::new(LocalTraining {
            served: Arc::clone(&self.0),
            adapter,
            label: label.to_string(),
        }))
    }
}

#[async_trait]
impl ServiceClient for LocalService {
    fn base_model(&self) -> &str {
        &self.0.name
    }

    fn context_length(&self) -> usize {
        self.0.context
    }

    async fn create_lora_training_client(
        &self,
        label: &str,
        config: &LoraConfig,
    ) -> Result<Arc<dyn TrainingClient>, ApiError> {
        let config = convert::lora_config(config)?;
        self.new_client(label, move |e, id| e.add_adapter(id, config))
            .await
    }

    async fn create_training_client_from_state(
        &self,
        label: &str,
        dir: &Path,
        with_optimizer: bool,
    ) -> Result<Arc<dyn TrainingClient>, ApiError> {
        let dir = dir.to_path_buf();
        self.new_client(label, move |e, id| e.load_adapter(id, &dir, with_optimizer))
            .await
    }

    fn base_sampling_client(&self) -> Arc<dyn SamplingClient> {
        Arc::new(LocalSampling {
            served: Arc::clone(&self.0),
            policy: None,
        })
    }

    async fn objective_loss(
        &self,
        plugin: &Plugin,
        _component: &Path,
        limits: &Limits,
    ) -> Result<String, ApiError> {
        self.0
            .objectives
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keep(plugin, limits)
    }

    /// A served base's job runs on plugins the tenant has stored on the server (a job there
    /// names them by digest), where its workers fetch them: nothing to store, only the digest.
    async fn share_plugin(&self, component: &Path) -> Result<String, ApiError> {
        if self.0.wire.is_none() {
            return Err(ApiError::invalid(format!(
                "{}: rollout workers fetch plugins from a server; this service runs in process",
                component.display()
            )));
        }
        let bytes = tokio::fs::read(component).await.map_err(|e| {
            ApiError::internal(format!("reading the plugin {}: {e}", component.display()))
        })?;
        Ok(Digest::of(&bytes).as_str().to_string())
    }
}

/// An adapter slot in the served model's training loop.
struct LocalTraining {
    served: Arc<Served>,
    /// The slot's name in the training loop.
    adapter: String,
    /// What its published versions are called in the adapter registry.
    label: String,
}

impl LocalTraining {
    /// The engine's work item of a call on this adapter, every datum checked.
    fn work(&self, input: &ForwardBackwardInput) -> Result<WorkItem, ApiError> {
        convert::work_item(
            &self.adapter,
            input,
            self.loss(input)?,
            &self.served.config,
            self.served.context,
        )
    }

    /// `input`'s loss: an objective plugin taken under its name, else a built-in one.
    fn loss(&self, input: &ForwardBackwardInput) -> Result<Loss, ApiError> {
        let objectives = self
            .served
            .objectives
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        objectives
            .loss(input)
            .unwrap_or_else(|| convert::builtin_loss(input))
    }
}

#[async_trait]
impl TrainingClient for LocalTraining {
    async fn forward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        let item = self.work(&input)?;
        let (trainer, tenant) = (&self.served.trainer, &self.served.tenant);
        train_call(trainer, tenant, item, input.loss_fn, true).await
    }

    async fn forward_backward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        let item = self.work(&input)?;
        let (trainer, tenant) = (&self.served.trainer, &self.served.tenant);
        train_call(trainer, tenant, item, input.loss_fn, false).await
    }

    async fn optim_step(&self, params: AdamParams) -> Result<OptimStepOutput, ApiError> {
        let trainer = &self.served.trainer;
        let step = convert::run_optim_step(trainer, &self.adapter, params, |_, _| Ok(()));
        Ok(step.await?.0)
    }

    async fn save_weights_and_get_sampling_client(
        &self,
    ) -> Result<Arc<dyn SamplingClient>, ApiError> {
        let (id, name) = (
            self.adapter.clone(),
            format!("{}{}", self.served.adapter_prefix, self.label),
        );
        let registry = Arc::clone(&self.served.registry);
        let version = self
            .served
            .trainer
            .with(move |e| -> Result<Arc<PolicyVersion>, ApiError> {
                let adapter = e
                    .adapter(&id)
                    .ok_or_else(|| ApiError::internal(format!("no adapter {id}")))?;
                registry
                    .publish(&name, adapter)
                    .map_err(|e| ApiError::internal(e.to_string()))
            })
            .await
            .map_err(trainer_error)??;
        Ok(Arc::new(LocalSampling {
            served: Arc::clone(&self.served),
            policy: Some(version),
        }))
    }

    async fn save_state(&self, dir: &Path, with_optimizer: bool) -> Result<(), ApiError> {
        let (id, dir) = (self.adapter.clone(), dir.to_path_buf());
        let base = self.served.name.clone();
        self.served
            .trainer
            .with(move |e| e.save_adapter(&id, &dir, &base, with_optimizer))
            .await
            .map_err(trainer_error)?
            .map_err(train_error)
    }
}

impl Drop for LocalTraining {
    fn drop(&mut self) {
        let id = self.adapter.clone();
        self.served.trainer.detach(move |e| {
            // A slot already gone has nothing to free.
            let _ = e.remove_adapter(&id);
        });
    }
}

/// A frozen adapter version (held, so the registry keeps it), or the base model.
struct LocalSampling {
    served: Arc<Served>,
    policy: Option<Arc<PolicyVersion>>,
}

#[async_trait]
impl SamplingClient for LocalSampling {
    async fn sample(
        &self,
        prompt: ModelInput,
        num_samples: usize,
        params: SamplingParams,
    ) -> Result<SampleResponse, ApiError> {
        let served = &self.served;
        let mut request = convert::engine_request(
            &prompt,
            num_samples,
            &params,
            Default::default(),
            0,
            &served.config,
            served.context,
        )?;
        request.policy = self.policy.as_ref().map(|v| PolicyRef {
            name: v.name.clone(),
            version: Some(v.version),
        });
        let output = served
            .sampler
            .sample_for(&served.tenant, request)
            .await
            .map_err(sampler_error)?;
        Ok(convert::sample_response(output))
    }

    async fn address(&self) -> Result<Option<String>, ApiError> {
        let served = &self.served;
        match &served.wire {
            Some(wire) => wire.open(&served.name, self.policy.clone()).map(Some),
            None => Ok(None),
        }
    }
}

/// A `forward` (`forward_only`) or `forward_backward` of one work item of a local client.
async fn train_call(
    trainer: &TrainerService,
    tenant: &str,
    item: WorkItem,
    loss_fn: String,
    forward_only: bool,
) -> Result<ForwardBackwardOutput, ApiError> {
    let none = None::<fn(&mut TrainingEngine)>;
    let call = convert::run_forward_backward(trainer, tenant, item, loss_fn, forward_only, none);
    Ok(call.await?.0)
}
