//! The scheduler: the loops that drive the step-level engines of a loaded base model for every
//! job that uses it. Sampling is continuously batched across adapters; training runs in clock
//! cycles that fuse the waiting `forward_backward` calls of different jobs into one pass.

pub mod sampler;
pub mod trainer;

pub use sampler::SamplerService;
pub use trainer::{TrainerService, TrainerServiceError};
