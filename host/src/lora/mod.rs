//! LoRA: the adapters (low-rank deltas on a frozen base model) and the registry of immutable
//! adapter versions that the trainer publishes and the sampler reads.

pub mod adapter;
mod apply;
pub mod registry;
mod score;

pub use adapter::{Adapter, AdapterError, LoraConfig, LoraError, LowRank};
pub use apply::CpuAdapters;
pub use registry::{AdapterRegistry, PolicyVersion, RegistryError};
pub use score::{RowAdapters, token_logprobs};
