//! A base model served to every tenant: its weights in one adapter registry, one sampling loop
//! that batches every sampler's requests on it, and one training loop that holds every adapter
//! trained on it. The device is chosen here and nowhere else: the CPU runs everything; CUDA is
//! checked and refused by name until the engines run on it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use candle_core::DType;

use super::{FairShare, SamplerService, TrainerService};
use crate::lora::AdapterRegistry;
use crate::model::tiny::{TinyShape, init_tiny};
use crate::model::{Architecture, Device, Model, ModelConfig};
use crate::sample::{EngineConfig, SamplingEngine};
use crate::text::{ChatTemplate, Tokenizer};
use crate::train::TrainingEngine;

/// The name under which a service serves the built-in tiny model.
pub const TINY_MODEL_NAME: &str = "opentinker/tiny";

/// A loaded base model and the loops that serve it.
pub struct ServedBase {
    /// The name clients use (`base_model`).
    pub name: String,
    /// The model directory (its tokenizer is what clients tokenize with).
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub context: usize,
    /// What text is turned into tokens with (and back), and chats rendered with.
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    pub registry: Arc<AdapterRegistry>,
    pub sampler: SamplerService,
    pub trainer: TrainerService,
}

impl ServedBase {
    /// Load the model in `dir` on `device` and start its loops. `kv_positions` bounds the KV
    /// cache of the running samples (requests beyond it wait); `share` is how training passes
    /// are shared between tenants.
    pub fn load(
        name: &str,
        dir: &Path,
        kv_positions: usize,
        share: FairShare,
        device: Device,
    ) -> anyhow::Result<Self> {
        device
            .check("serving (the sampling engine and the trainer)")
            .with_context(|| format!("serving model {name}"))?;
        let Model {
            config,
            transformer,
            tokenizer,
            chat_template,
            ..
        } = Model::load(dir)
            .with_context(|| format!("loading model {name} from {}", dir.display()))?;
        let context = transformer.context_length();
        let registry = AdapterRegistry::new(Arc::new(transformer));
        let tokenizer = Arc::new(tokenizer);
        let engine = SamplingEngine::new(
            Arc::clone(&registry),
            Some(Arc::clone(&tokenizer)),
            config.eos_token_ids.clone(),
            EngineConfig {
                kv_budget_positions: kv_positions.max(context),
                prefix_cache_positions: 0,
            },
        );
        // The loops end when the last handle is dropped.
        let (sampler, _thread) = SamplerService::start(engine);
        let engine = TrainingEngine::new(Arc::clone(registry.base()), DType::F32);
        let (trainer, _thread) = TrainerService::start_sharing(engine, share);
        Ok(ServedBase {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config,
            context,
            tokenizer,
            chat_template,
            registry,
            sampler,
            trainer,
        })
    }
}

/// The built-in tiny model's directory under `data`, generated (whole or not at all) the first
/// time.
pub fn tiny_model_dir(data: &Path) -> anyhow::Result<PathBuf> {
    let dir = data.join("models").join("opentinker-tiny");
    if !dir.is_dir() {
        crate::store::write_atomic_dir(&dir, |temp| {
            init_tiny(temp, TinyShape::Tiny, Architecture::Qwen2, 0).map_err(std::io::Error::other)
        })
        .with_context(|| format!("generating the tiny model in {}", dir.display()))?;
    }
    Ok(dir)
}
