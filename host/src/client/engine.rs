//! Where a program's jobs train, and opening a base model there: a driver is given an
//! [`Engine`], asks it for the base its jobs name ([`BaseRequest`]), and gets back either a
//! [`ReadyBase`] (a service that trains adapters on a base as it is: a server's, or one a server
//! serves this tenant) or a [`LocalBase`] (a model loaded in this process, whose weights a
//! full-parameter warm-up may train before it is served). The driver never builds a service
//! itself, as the tinker-cookbook's loop is handed its `ServiceClient`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use super::local::{FullParameterTrainer, LocalModel, LocalService};
use super::remote::RemoteService;
use super::served::{RolloutQueue, TenantBases};
use super::{ModelText, ServiceClient, TrainingClient};
use crate::service::DeviceOptions;

/// Where the jobs' adapters are trained and sampled.
pub enum Engine {
    /// On this process's engines, one per base model, on this device.
    InProcess(DeviceOptions),
    /// On a server of the Tinker wire (`opentinker serve`), through one tenant's key.
    Remote(RemoteEngine),
    /// Inside a server, on the bases it serves, for one tenant: a job on a served base
    /// (`model.base`, or the built-in tiny model) shares the base's loops with every other
    /// client; a job whose full-parameter warm-up makes a base of its own trains it (and then its
    /// adapters on it) in the served base's training loop too, as a guest engine in the same fair
    /// queue.
    Served(TenantBases),
}

/// A server to train on, and the name under which it serves the jobs' base model.
pub struct RemoteEngine {
    /// `http://host:port`.
    pub url: String,
    pub api_key: String,
    /// The served model the jobs train on; their own `[model]` gives the tokenizer and chat
    /// template (the same model's files, on this machine).
    pub base_model: String,
    /// The rollout queue whose workers play the jobs' RL groups on the server's samplers;
    /// `None`: this process plays them.
    pub rollouts: Option<RolloutQueue>,
}

/// The base model a group of jobs trains on, as their job file names it.
pub struct BaseRequest<'a> {
    /// The served base they name (`model.base`, or the built-in tiny model's name); `None` for a
    /// model of their own. Only a [`Engine::Served`] reads it.
    pub served: Option<&'a str>,
    /// Whether their warm-up trains every weight of the base first (`sft.full_parameters`).
    pub full_parameters: bool,
    /// The model folder (or GGUF file) of their own on this machine, made when first asked
    /// (a tiny model is generated): its weights where they load here, else its tokenizer and
    /// chat template only.
    pub model_dir: &'a (dyn Fn() -> anyhow::Result<PathBuf> + Sync),
}

/// A base model opened for a group of jobs.
pub enum BaseModel {
    /// A service that trains adapters on a base as it is.
    Ready(Box<ReadyBase>),
    /// A model loaded in this process.
    Local(Box<LocalBase>),
}

/// A service that trains adapters on a base as it is, with the model's text.
pub struct ReadyBase {
    pub service: Arc<dyn ServiceClient>,
    pub text: ModelText,
    /// The rollout queue whose workers play the jobs' groups; `None`: the driver plays them.
    pub rollouts: Option<RolloutQueue>,
}

/// A model loaded in this process, to be trained whole first or served as it is. On a server it
/// trains as a guest of a served base's loops (`beside`), in their fair queue as the tenant.
pub struct LocalBase {
    model: LocalModel,
    dir: PathBuf,
    beside: Option<LocalService>,
    device: DeviceOptions,
}

/// A [`LocalBase`] whose every weight trains (a full-parameter warm-up).
pub struct BaseWarmUp {
    trainer: FullParameterTrainer,
    dir: PathBuf,
    beside: Option<LocalService>,
    device: DeviceOptions,
}

impl Engine {
    /// Open the base `request` asks for: connect to the server, take a base it serves this
    /// tenant, or load a model here.
    pub async fn open(&self, request: BaseRequest<'_>) -> anyhow::Result<BaseModel> {
        match self {
            Engine::InProcess(device) => {
                let dir = (request.model_dir)()?;
                Ok(BaseModel::Local(Box::new(LocalBase::load(&dir, *device)?)))
            }
            Engine::Remote(remote) => Ok(BaseModel::Ready(Box::new(remote.open(request).await?))),
            Engine::Served(bases) => open_served(bases, request),
        }
    }
}

impl RemoteEngine {
    async fn open(&self, request: BaseRequest<'_>) -> anyhow::Result<ReadyBase> {
        anyhow::ensure!(
            !request.full_parameters,
            "its warm-up trains every weight of the base model (`sft.full_parameters`), which {} \
             cannot do: a server trains adapters only. Warm up with LoRA \
             (`full_parameters = false`) or train this job in process",
            self.url
        );
        let text = ModelText::load(&(request.model_dir)()?)?;
        let service = RemoteService::connect(&self.url, &self.api_key, &self.base_model)
            .await
            .with_context(|| format!("connecting to {}", self.url))?;
        Ok(ReadyBase {
            service: Arc::new(service),
            text,
            rollouts: self.rollouts.clone(),
        })
    }
}

/// A base a server serves (`request.served`), as it is or as the start of a full-parameter
/// warm-up; else a model of the job's own, trained beside the built-in tiny model's loops.
fn open_served(bases: &TenantBases, request: BaseRequest<'_>) -> anyhow::Result<BaseModel> {
    let served = match request.served {
        Some(name) => Some(bases.base(name).with_context(|| {
            format!(
                "model.base: the server serves no model {name:?} (it serves: {})",
                bases.names().join(", ")
            )
        })?),
        None => None,
    };
    let (dir, beside) = match served {
        Some(served) if !request.full_parameters => {
            return Ok(BaseModel::Ready(Box::new(ReadyBase {
                service: Arc::new(served.service),
                text: served.text,
                rollouts: served.rollouts,
            })));
        }
        Some(served) => (served.dir, Some(served.service)),
        None => (
            (request.model_dir)()?,
            bases
                .base(TenantBases::built_in_tiny())
                .map(|tiny| tiny.service),
        ),
    };
    let device = beside
        .as_ref()
        .map_or_else(DeviceOptions::cpu, LocalService::device);
    let mut base = LocalBase::load(&dir, device)?;
    base.beside = beside;
    Ok(BaseModel::Local(Box::new(base)))
}

impl LocalBase {
    /// The model in folder (or GGUF file) `dir`, to run on `device`.
    pub fn load(dir: &Path, device: DeviceOptions) -> anyhow::Result<Self> {
        Ok(LocalBase {
            model: LocalModel::load(dir, device.base_format)?,
            dir: dir.to_path_buf(),
            beside: None,
            device,
        })
    }

    /// Where the model came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tokenizer and chat template, shared.
    pub fn text(&self) -> ModelText {
        self.model.text()
    }

    pub fn context_length(&self) -> usize {
        self.model.context_length()
    }

    /// Take the weights a warm-up saved (a model folder that [`BaseWarmUp`]'s trainer wrote).
    pub fn load_weights(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.model.load_weights(dir)
    }

    /// Train every weight of the model: its trainer, and [`BaseWarmUp::finish`] to serve it
    /// after.
    pub fn warm_up(self) -> anyhow::Result<BaseWarmUp> {
        let trainer = self
            .model
            .full_parameter_trainer(self.beside.as_ref(), self.device.device)?;
        Ok(BaseWarmUp {
            trainer,
            dir: self.dir,
            beside: self.beside,
            device: self.device,
        })
    }

    /// Serve the model as `name` (what adapters' checkpoints record as their base), its sampler
    /// holding at most `kv_budget_positions` KV positions at once.
    pub fn serve(
        self,
        name: String,
        kv_budget_positions: usize,
    ) -> anyhow::Result<Arc<dyn ServiceClient>> {
        let service =
            self.model
                .serve(name, kv_budget_positions, self.beside.as_ref(), self.device)?;
        Ok(Arc::new(service))
    }
}

impl BaseWarmUp {
    /// The training client of every weight.
    pub fn trainer(&self) -> &dyn TrainingClient {
        &self.trainer
    }

    /// The model as trained so far, to serve.
    pub async fn finish(self) -> anyhow::Result<LocalBase> {
        Ok(LocalBase {
            model: self.trainer.finish().await?,
            dir: self.dir,
            beside: self.beside,
            device: self.device,
        })
    }
}
