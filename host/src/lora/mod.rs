//! LoRA: the adapters (low-rank deltas on a frozen base model), the registry of immutable
//! adapter versions that the trainer publishes and the sampler reads, the projection hook through
//! which adapters enter the model's layers on the CPU backends ([`CpuAdapters`]) and on a CUDA
//! device (feature `cuda`: `GpuAdapterPools` for sampling, `GpuTrainAdapters` for training),
//! scoring sequences through adapters, and merging an adapter into its base ([`merge`]).

mod adapter;
mod apply;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_train;
mod merge;
mod registry;
mod score;

pub use adapter::{Adapter, AdapterError, AdapterMismatch, LoraConfig, LoraError, LowRank};
pub use apply::{CpuAdapters, PairGradients};
#[cfg(feature = "cuda")]
pub use gpu::{GpuAdapterError, GpuAdapterPools, GpuAdapters};
#[cfg(feature = "cuda")]
pub use gpu_train::{
    GpuAdapterWeights, GpuPair, GpuPairGradients, GpuTrainAdapters, GpuTrainedAdapter,
    add_gradients, copy_gradients, download_gradients, gradients_finite,
};
pub use merge::merge;
pub use registry::{AdapterRegistry, PolicyVersion, RegistryError};
pub use score::{RowAdapters, token_logprobs};
