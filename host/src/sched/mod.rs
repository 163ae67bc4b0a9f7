//! The scheduler: the loops that drive the step-level engines of a loaded base model for every
//! job that uses it. Sampling is continuously batched across adapters; training runs in clock
//! cycles that fuse the waiting `forward_backward` calls of different jobs into one pass.

pub mod anticipate;
pub mod base;
mod checkpoints;
pub mod convert;
mod custom_losses;
mod export;
pub mod fair;
mod objectives;
pub mod sampler;
mod sequences;
pub mod service;
pub mod trainer;
pub mod usage;

pub use base::{ServedBase, TINY_MODEL_NAME, tiny_model_dir};
pub use objectives::{ObjectivePlugins, PluginObjective, names_a_plugin, objective_config};
pub use sampler::{SamplerService, SamplerServiceError};
pub use service::{Service, ServiceConfig};
pub use trainer::{FairShare, TrainerService, TrainerServiceError};
