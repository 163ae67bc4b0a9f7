//! The engine as its clients see it, in the shape of the Tinker SDK: a [`ServiceClient`] of one
//! base model makes [`TrainingClient`]s (one LoRA adapter and its optimizer each) and
//! [`SamplingClient`]s (a frozen version of an adapter, or the base model). Every value that
//! crosses is an op API type ([`crate::api`]); every error is an [`ApiError`].
//!
//! The RL driver, SFT and evaluations are written against these traits only, as the
//! tinker-cookbook's RL loop is a client of Tinker. Three services implement them:
//!
//! - [`LocalModel`] loads a model directory (or makes the tiny preset, [`TinyModelSpec`]) into
//!   this process, and its [`LocalService`] runs the ops on the service's loops; a whole-model
//!   warm-up trains through its [`FullParameterTrainer`].
//! - [`RemoteService`] speaks the Tinker wire to a server (`train --server`); a checkpoint saved
//!   there leaves a [`RemoteCheckpoint`] in the local folder. [`JobsClient`] drives a server's
//!   jobs API.
//! - [`TenantBases`] gives the jobs a server runs the bases it serves, each a [`ServedModel`]
//!   whose work shares the loops fairly with every other tenant's.
//!
//! A driver (`opentinker train`, the server's jobs) is handed an [`Engine`] and opens the base
//! its jobs name on it ([`Engine::open`]): a [`ReadyBase`] whose service trains adapters, or a
//! [`LocalBase`] loaded here that a full-parameter warm-up trains first ([`LocalBase::warm_up`])
//! and that is then served. It never builds one of the services above itself.

mod engine;
mod local;
mod remote;
mod served;

/// Where a [`LocalModel`]'s engines run (the device, and the room its sampler makes there).
pub use crate::service::DeviceOptions;
/// The name under which a server serves the built-in tiny model (a job on its settings trains
/// there).
pub use crate::service::TINY_MODEL_NAME;
pub use engine::{BaseModel, BaseRequest, BaseWarmUp, Engine, LocalBase, ReadyBase, RemoteEngine};
pub use local::{FullParameterTrainer, LocalModel, LocalService, TinyModelSpec, WireSamplers};
pub use remote::{JobsClient, REMOTE_CHECKPOINT, RemoteCheckpoint, RemoteService};
pub use served::{RolloutQueue, ServedModel, TenantBases};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::plugin::{Limits, Plugin};

use crate::api::{
    AdamParams, ApiError, ForwardBackwardInput, ForwardBackwardOutput, LoraConfig, ModelInput,
    OptimStepOutput, SampleResponse, SamplingParams,
};

/// What a client renders text with: a model's tokenizer and chat template.
pub struct ModelText {
    pub tokenizer: Arc<crate::text::Tokenizer>,
    pub chat_template: Option<crate::text::ChatTemplate>,
}

impl ModelText {
    /// Read them from a model directory, without its weights.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let (tokenizer, chat_template) = crate::model::load_text(dir)?;
        Ok(ModelText {
            tokenizer: Arc::new(tokenizer),
            chat_template,
        })
    }
}

/// Refuse a loss name or config that no `forward_backward` would take (the engine's own rules,
/// so that a job is refused before any model is loaded or request sent).
pub fn check_loss(loss_fn: &str, config: &BTreeMap<String, f64>) -> Result<(), ApiError> {
    crate::train::Loss::from_config(loss_fn, config)
        .map(|_| ())
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// One base model and what can be made on it.
#[async_trait]
pub trait ServiceClient: Send + Sync {
    /// The base model's name, as the adapters' checkpoints record it.
    fn base_model(&self) -> &str;

    /// The base model's context, in tokens.
    fn context_length(&self) -> usize;

    /// A new adapter of `config` and a fresh optimizer. `label` names it in logs and in the
    /// sampling clients made from it.
    async fn create_lora_training_client(
        &self,
        label: &str,
        config: &LoraConfig,
    ) -> Result<Arc<dyn TrainingClient>, ApiError>;

    /// An adapter loaded from a checkpoint folder that [`TrainingClient::save_state`] wrote,
    /// with its optimizer state when `with_optimizer` (else a fresh optimizer).
    async fn create_training_client_from_state(
        &self,
        label: &str,
        dir: &Path,
        with_optimizer: bool,
    ) -> Result<Arc<dyn TrainingClient>, ApiError>;

    /// Samples of the base model with no adapter.
    fn base_sampling_client(&self) -> Arc<dyn SamplingClient>;

    /// Take `plugin` (an objective, loaded from the component file `component`) as a loss of
    /// this service's training clients, its calls bounded by `limits`: the loss name
    /// `forward_backward` takes for it (the plugin's digest, `sha256:HEX`), whose
    /// `loss_fn_config` becomes the plugin's config (a JSON object of the numbers). An
    /// in-process service keeps the loaded plugin; a remote one uploads the component, and the
    /// server runs it under its own limits.
    async fn objective_loss(
        &self,
        plugin: &Plugin,
        component: &Path,
        limits: &Limits,
    ) -> Result<String, ApiError>;

    /// Store the plugin component at `component` where this service's rollout workers fetch
    /// it by digest (its `sha256:HEX`, answered): on the server. An in-process service has no
    /// workers and refuses.
    async fn share_plugin(&self, component: &Path) -> Result<String, ApiError> {
        Err(ApiError::invalid(format!(
            "{}: rollout workers fetch plugins from a server; this service runs in process",
            component.display()
        )))
    }

    /// The version of a policy that sampling session `address` serves (another client of the
    /// same tenant made it: [`SamplingClient::address`]): on a server. An in-process service
    /// has no such sessions and refuses.
    fn sampling_client_at(&self, address: &str) -> Result<Arc<dyn SamplingClient>, ApiError> {
        Err(ApiError::invalid(format!(
            "sampling session {address}: sessions live on a server; this service runs in process"
        )))
    }

    /// The bytes of plugin `digest` (`sha256:HEX`) that [`ServiceClient::share_plugin`] stored,
    /// checked against the digest: from the server. An in-process service refuses.
    async fn download_plugin(&self, digest: &str) -> Result<Vec<u8>, ApiError> {
        Err(ApiError::invalid(format!(
            "plugin {digest}: rollout workers fetch plugins from a server; this service runs in \
             process"
        )))
    }
}

/// One trainable adapter and its optimizer. Dropping the last handle frees it on the service.
#[async_trait]
pub trait TrainingClient: Send + Sync {
    /// The logprobs and loss of `input`'s datums, without gradients.
    async fn forward(&self, input: ForwardBackwardInput)
    -> Result<ForwardBackwardOutput, ApiError>;

    /// The logprobs and loss of `input`'s datums, accumulating gradients (fused by the service
    /// with other clients' calls of the same cycle).
    async fn forward_backward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError>;

    /// An AdamW step on the accumulated gradients.
    async fn optim_step(&self, params: AdamParams) -> Result<OptimStepOutput, ApiError>;

    /// A sampling client on the adapter as it is now; later training does not change it.
    async fn save_weights_and_get_sampling_client(
        &self,
    ) -> Result<Arc<dyn SamplingClient>, ApiError>;

    /// Write the adapter (with its optimizer state when `with_optimizer`) as a checkpoint folder
    /// `dir` on this machine.
    async fn save_state(&self, dir: &Path, with_optimizer: bool) -> Result<(), ApiError>;
}

/// Samples of one frozen policy.
#[async_trait]
pub trait SamplingClient: Send + Sync {
    /// `num_samples` continuations of `prompt`.
    async fn sample(
        &self,
        prompt: ModelInput,
        num_samples: usize,
        params: SamplingParams,
    ) -> Result<SampleResponse, ApiError>;

    /// Where another process of the same tenant can sample this version: its sampling
    /// session on the server ([`ServiceClient::sampling_client_at`] opens it). `None` for a version
    /// that lives in this process only.
    async fn address(&self) -> Result<Option<String>, ApiError> {
        Ok(None)
    }
}
