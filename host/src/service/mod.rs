//! The service: every base model a server (or an in-process client) serves, with the loops that
//! drive its step-level engines for every tenant and job that uses it. Sampling is continuously
//! batched across adapters; training runs in clock cycles that fuse the waiting
//! `forward_backward` calls of different jobs into one pass; both share the device fairly
//! between tenants by weight.
//!
//! A server starts from [`Service::new`] over [`ServedBase`]s (each a loaded model with its
//! [`TrainerService`] and [`SamplerService`] loops) and runs the op API through
//! [`Service::execute`], which answers an [`Executed`]: the op's output, the [`Change`]s it made
//! to the objects a durable server records (sessions, models, [`SamplerRecord`]s), and a [`Hold`]
//! on the model's turn until the record is written. [`Service::restore`] brings recorded changes
//! back after a restart. An in-process client drives the same loops directly and shares the
//! service's conversions between the op API and the engine ([`convert`]). Objectives written
//! as plugins become losses through [`ObjectivePlugins`] and [`PluginObjective`].
//!
//! ```text
//! op API ──▶ Service ──▶ TrainerService (fused passes) ──▶ train::TrainingEngine
//!                    └─▶ SamplerService (continuous batching) ──▶ sample::SamplingEngine
//! ```

mod anticipate;
mod base;
mod checkpoints;
pub mod convert;
mod custom_losses;
mod export;
mod fair;
mod objectives;
mod ops;
mod sampler;
mod sequences;
mod trainer;
mod usage;

pub use base::{DeviceOptions, ServedBase, TINY_MODEL_NAME, tiny_model_dir};
pub use objectives::{ObjectivePlugins, PluginObjective, names_a_plugin, objective_config};
pub use ops::{Change, Checked, Executed, Hold, SamplerRecord, Service, ServiceConfig};
pub use sampler::{SamplerService, SamplerServiceError};
pub use trainer::{FairShare, TrainerService, TrainerServiceError};
pub use usage::{TenantUsage, Usage};
