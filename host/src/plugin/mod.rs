//! The plugin host: runs environment, agent, reward, objective and advantage components
//! sandboxed, as untrusted tenant code.
//!
//! A plugin is a WebAssembly component of the versioned WIT contract, written in any language.
//! [`build_plugin`] builds one from its source folder (Rust with `cargo`, Python with
//! `componentize-py`, JavaScript with `componentize-js`); [`write_plugin`] writes a new folder
//! from a template ([`TemplateLanguage`]).
//!
//! Load a component once with [`PluginHost::load`] (compiled once in a separate process under
//! [`CompileLimits`], cached on disk, its [`Structure`] checked, pre-instantiated). Then every
//! episode gets a fresh instance from the pooling allocator ([`EnvironmentEpisode`],
//! [`AgentSession`]), and every call runs under the plugin's [`Limits`] (fuel, wall time,
//! memory, bytes in and out). A trap, timeout or limit hit ends only that episode, as a
//! [`CallError`] of a typed [`ErrorKind`]; the host and the other episodes go on.
//!
//! ```text
//! source ──build_plugin──▶ .wasm ──PluginHost::load──▶ Plugin ──▶ a fresh instance per episode
//!                                   (compile, check, cache)        (calls under Limits)
//! ```
//!
//! [`play_random`] plays a plugin's environment with random actions for many episodes and
//! summarizes what failed and why ([`PlaySummary`]): the quick check of a new plugin and what
//! `opentinker plugin run` prints. [`PluginDescription`] is what `opentinker plugin inspect`
//! shows of a component without running it.

mod agent;
mod bindings;
mod builders;
mod cache;
mod cache_file;
mod compiler;
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
mod random_play;
mod reward;
mod sandbox;
mod structure;
mod template;
mod types;
mod wasi;

pub use agent::AgentSession;
pub use builders::{build_plugin, component_path};
pub use compiler::run_worker as run_compile_worker;
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
pub use random_play::{MESSAGES_PER_KIND, PlayOptions, PlaySummary, SampledMessage, play_random};
pub use sandbox::FuelUse;
pub use structure::{Structure, StructureError, measure as measure_structure};
pub use template::{TemplateLanguage, write_plugin};
pub use types::{
    DatumLoss, EnvInfo, GuestError, Message, Metric, ObjectiveDatum, ObjectiveTensor,
    PlayerMessages, StepResult, Transcript,
};
pub use wasi::LogSink;
