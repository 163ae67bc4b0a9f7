//! LoRA: the adapters (low-rank deltas on a frozen base model) and the registry of immutable
//! adapter versions that the trainer publishes and the sampler reads.

pub mod adapter;
pub mod linear;
pub mod registry;

pub use adapter::{Adapter, AdapterError, LoraConfig, LoraError, LowRank, Site, Target};
pub use registry::{AdapterRegistry, PolicyVersion, RegistryError};
