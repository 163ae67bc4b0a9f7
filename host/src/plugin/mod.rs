//! The plugin host: runs environment, agent, reward, objective and advantage components
//! sandboxed.
//!
//! Load a component once with [`PluginHost::load`] (compiled once, cached on disk, checked,
//! pre-instantiated); then every episode gets a fresh instance from the pooling allocator, and
//! every call runs under the plugin's [`Limits`]. A trap, timeout or limit hit ends only that
//! episode, as a [`CallError`] of a typed [`ErrorKind`].

mod agent;
mod bindings;
pub mod builders;
mod cache;
mod cache_file;
pub mod compiler;
mod config_check;
mod contract;
mod engine;
mod environment;
mod error;
mod function_cache;
mod inspect;
mod limits;
mod loader;
mod objective;
pub mod random_play;
mod reward;
mod sandbox;
pub mod structure;
pub mod template;
mod types;
mod wasi;

pub use agent::AgentSession;
pub use config_check::ConfigError;
pub use engine::HostConfig;
pub use environment::{EnvironmentEpisode, EpisodeRecord, RecordedError};
pub use error::{CallError, CompileResource, ErrorKind, LoadError};
pub use inspect::{
    ContractVersion, PluginDescription, PluginKind, PluginMetadata, supported_wit_range,
    supports_wit_version, wit_version,
};
pub use limits::StructureLimits;
pub use limits::{CompileBudget, CompileLimits, LimitError, Limits};
pub use loader::{LoadReport, Plugin, PluginHost};
pub use sandbox::FuelUse;
pub use structure::{Structure, StructureError};
pub use types::{
    DatumLoss, EnvInfo, GuestError, Message, Metric, ObjectiveDatum, ObjectiveTensor,
    PlayerMessages, StepResult, Transcript,
};
pub use wasi::LogSink;
