//! A base model served to every tenant: its weights in one adapter registry, one sampling loop
//! that batches every sampler's requests on it, and one training loop that holds every adapter
//! trained on it. The device is chosen here and nowhere else ([`DeviceOptions`]): the CPU, or a
//! CUDA device where both engines run (the sampler's KV blocks and adapter slots sized by the
//! options, the trainer's passes on the device).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use candle_core::DType;

use super::{FairShare, SamplerService, TrainerService};
use crate::lora::AdapterRegistry;
#[cfg(feature = "cuda")]
use crate::model::GpuWeights;
use crate::model::{Architecture, BaseFormat, Device, Model, ModelConfig};
use crate::model::{TinyShape, init_tiny};
#[cfg(feature = "cuda")]
use crate::sample::{CudaModelOptions, CudaSampler, WeightFormat};
use crate::sample::{EngineConfig, SamplingEngine};
use crate::text::{ChatTemplate, Tokenizer};
use crate::train::TrainingEngine;

/// The name under which a service serves the built-in tiny model.
pub const TINY_MODEL_NAME: &str = "opentinker/tiny";

/// Where a served base runs, and the room its sampler makes there.
#[derive(Clone, Copy, Debug)]
pub struct DeviceOptions {
    pub device: Device,
    /// Adapter versions a CUDA sampler holds at once (the CPU reads any number in place); a
    /// request of another version waits for a slot.
    pub adapter_slots: usize,
    /// The largest adapter rank a CUDA sampler's slots hold.
    pub max_adapter_rank: usize,
    /// The most device memory a CUDA trainer's adapters take there (weights, moments and
    /// gradients; `None`: what the device has): one more adapter is refused by name.
    pub trainer_memory: Option<u64>,
    /// How the base's matrices are held on the host: f32, or a frozen base's blocks (LoRA
    /// trains on them; a CUDA device gets them dequantized).
    pub base_format: BaseFormat,
}

impl DeviceOptions {
    /// Everything on the CPU.
    pub fn cpu() -> Self {
        DeviceOptions {
            device: Device::Cpu,
            adapter_slots: 16,
            max_adapter_rank: 64,
            trainer_memory: None,
            base_format: BaseFormat::F32,
        }
    }

    /// The sampling loop over `registry`'s base on this device.
    pub fn start_sampler(
        &self,
        registry: &Arc<AdapterRegistry>,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
        config: EngineConfig,
    ) -> anyhow::Result<SamplerService> {
        Ok(self.start(registry, tokenizer, eos, config)?.0)
    }

    /// The sampling loop and a training engine of `registry`'s base on this device. On CUDA the
    /// device is opened once and the base's weights go there once, shared by both.
    pub fn start_engines(
        &self,
        registry: &Arc<AdapterRegistry>,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
        config: EngineConfig,
    ) -> anyhow::Result<(SamplerService, TrainingEngine)> {
        let (sampler, base) = self.start(registry, tokenizer, eos, config)?;
        let trainer = TrainingEngine::new(Arc::clone(registry.base()), DType::F32);
        let trainer = match base {
            BaseOnDevice::Cpu => trainer,
            #[cfg(feature = "cuda")]
            BaseOnDevice::Cuda(gpu, weights) => trainer.on_gpu(self.device, gpu, weights)?,
        };
        let trainer = match self.trainer_memory {
            Some(bytes) => trainer.with_device_budget(bytes),
            None => trainer,
        };
        Ok((sampler, trainer))
    }

    /// The sampling loop, and where its base lives for a trainer to share.
    fn start(
        &self,
        registry: &Arc<AdapterRegistry>,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
        config: EngineConfig,
    ) -> anyhow::Result<(SamplerService, BaseOnDevice)> {
        let registry = Arc::clone(registry);
        match self.device {
            Device::Cpu => {
                let engine = SamplingEngine::new(registry, tokenizer, eos, config);
                Ok((SamplerService::start(engine).0, BaseOnDevice::Cpu))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda { .. } => {
                const BLOCK_SIZE: usize = 16;
                let device = self.device;
                let gpu = Arc::new(device.open_gpu()?);
                let weights = GpuWeights::upload(&gpu, registry.base(), WeightFormat::F32)
                    .with_context(|| format!("putting the model on {device}"))?;
                let weights = Arc::new(weights);
                let options = CudaModelOptions {
                    weights: WeightFormat::F32,
                    kv_blocks: CudaSampler::blocks_for(&config, BLOCK_SIZE),
                    block_size: BLOCK_SIZE,
                    adapter_slots: self.adapter_slots,
                    max_rank: self.max_adapter_rank,
                };
                let base = &registry.base().config;
                let backend = CudaSampler::with_weights(
                    Arc::clone(&gpu),
                    base,
                    Arc::clone(&weights),
                    options,
                )
                .with_context(|| format!("putting the sampler on {device}"))?;
                let engine =
                    SamplingEngine::with_backend(backend, registry, tokenizer, eos, config);
                let sampler = SamplerService::start(engine).0;
                Ok((sampler, BaseOnDevice::Cuda(gpu, weights)))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda { .. } => Err(crate::model::DeviceError::NotBuilt {
                device: self.device,
            }
            .into()),
        }
    }
}

/// Where a sampler's base model lives: on the CPU in its candle tensors, or on a CUDA device
/// (the device opened and the weights there), which a trainer beside it shares.
enum BaseOnDevice {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Arc<opentinker_kernels::cuda::Gpu>, Arc<GpuWeights>),
}

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
    /// Where both loops run.
    pub device: DeviceOptions,
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
        device: DeviceOptions,
    ) -> anyhow::Result<Self> {
        let Model {
            config,
            transformer,
            tokenizer,
            chat_template,
            ..
        } = Model::load_as(dir, device.base_format)
            .with_context(|| format!("loading model {name} from {}", dir.display()))?;
        let context = transformer.context_length();
        let registry = AdapterRegistry::new(Arc::new(transformer));
        let tokenizer = Arc::new(tokenizer);
        // The loops end when the last handle is dropped.
        let (sampler, engine) = device
            .start_engines(
                &registry,
                Some(Arc::clone(&tokenizer)),
                config.eos_token_ids.clone(),
                EngineConfig {
                    kv_budget_positions: kv_positions.max(context),
                    prefix_cache_positions: 0,
                },
            )
            .with_context(|| format!("serving model {name}"))?;
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
            device,
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
