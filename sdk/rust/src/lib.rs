//! Write opentinker plugins in plain Rust.
//!
//! An opentinker plugin is a WebAssembly component that the host runs sandboxed: an
//! [`Environment`] (a game, a tool task, a math problem), an [`Agent`] (how a policy's text becomes
//! an action), a [`Reward`] function, a training [`Objective`] (a loss with its gradient) or an
//! [`Advantage`] estimator. Implement the trait on your own type and call the matching
//! export macro once; the WIT bindings stay behind this crate.
//!
//! A complete environment, a coin the policy must call:
//!
//! ```
//! use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};
//!
//! struct CallTheCoin { heads: bool }
//!
//! impl Environment for CallTheCoin {
//!     fn info() -> EnvInfo {
//!         EnvInfo { name: "call-the-coin".into(), players: 1, max_turns: 1 }
//!     }
//!
//!     fn new(_config: &str, _task: &str, seed: u64) -> Result<Self, PluginError> {
//!         Ok(CallTheCoin { heads: seed % 2 == 0 })
//!     }
//!
//!     fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
//!         Ok(vec![Message::user("I flipped a coin. Answer `heads` or `tails`.")])
//!     }
//!
//!     fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
//!         let called_heads = action.trim().eq_ignore_ascii_case("heads");
//!         let reward = if called_heads == self.heads { 1.0 } else { 0.0 };
//!         Ok(StepResult::end(vec![reward]))
//!     }
//!
//!     fn legal_actions(&self) -> Option<Vec<String>> {
//!         Some(vec!["heads".into(), "tails".into()])
//!     }
//! }
//!
//! opentinker_sdk::export_environment!(CallTheCoin);
//!
//! # fn main() {
//! let mut episode = CallTheCoin::new("{}", "", 2).unwrap();
//! assert_eq!(episode.step("heads").unwrap().rewards, vec![1.0]);
//! # }
//! ```
//!
//! Build it with `opentinker plugin build DIR` (or `cargo build --release --target
//! wasm32-wasip2`); the crate must have `crate-type = ["cdylib"]` (add `"rlib"` to unit-test it
//! natively, as the examples in `plugins/` do).

// The bindings name this crate by its path, from inside and outside it alike.
extern crate self as opentinker_sdk;

mod adapters;
#[doc(hidden)]
pub mod bindings;
mod rng;
pub mod text;
mod types;

pub use rng::SeededRng;
pub use types::{
    DatumLoss, EnvInfo, Message, Metric, ObjectiveDatum, PluginError, StepResult, Tensor,
    Transcript,
};

#[doc(hidden)]
pub use wit_bindgen::rt as __wit_bindgen_rt;

#[doc(hidden)]
pub use adapters::{
    AdvantageAdapter, AdvantageKind, AgentAdapter, AgentKind, EnvironmentAdapter, EnvironmentKind,
    EpisodeAdapter, MetadataAdapter, ObjectiveAdapter, ObjectiveKind, PlayerAgentAdapter,
    RewardAdapter, RewardKind,
};

/// The plugin crate's package fields, which the export macros read from Cargo (`name`,
/// `version`, `description`, `license`) for the component's metadata export.
#[doc(hidden)]
pub trait Package: 'static {
    const NAME: &'static str;
    const VERSION: &'static str;
    const DESCRIPTION: &'static str;
    /// Empty when the crate declares none.
    const LICENSE: &'static str;
}

/// A task environment. The host makes one value per episode with [`Environment::new`], asks each
/// player what it sees with [`Environment::observe`], then calls [`Environment::step`] with the
/// action of the player to move until a step says no one moves next.
pub trait Environment: Sized + 'static {
    /// The environment's name, number of players and turn limit.
    fn info() -> EnvInfo;

    /// Make a task for a data-free environment; the same config and seed must give the same task.
    /// The default says the environment needs tasks from a dataset.
    fn generate_task(_config: &str, _seed: u64) -> Result<String, PluginError> {
        Err(PluginError::new(
            "this environment does not generate tasks: give the job a task dataset",
        ))
    }

    /// Start an episode; an error here (a bad config or task) refuses it.
    fn new(config: &str, task: &str, seed: u64) -> Result<Self, PluginError>;

    /// What `player` sees before its first action.
    fn observe(&mut self, player: u32) -> Result<Vec<Message>, PluginError>;

    /// Apply the action of the player to move. An illegal action is a normal result (a penalty,
    /// metric `invalid_action`), not an error: errors are for the plugin's own faults.
    fn step(&mut self, action: &str) -> Result<StepResult, PluginError>;

    /// The legal actions of the player to move, if the environment can list them.
    fn legal_actions(&self) -> Option<Vec<String>> {
        None
    }

    /// A legal, ideally good, action for the player to move.
    fn demonstration(&mut self) -> Option<String> {
        None
    }

    /// A JSON Schema (as JSON text) of the config [`Environment::new`] takes, for the
    /// component's metadata; `None` (the default) declares none.
    fn config_schema() -> Option<String> {
        None
    }
}

/// How a policy talks to an environment: what it is shown, and how its text becomes an action.
/// The host makes one value per player per episode with [`Agent::new`], so an agent may keep
/// state from turn to turn.
pub trait Agent: Sized + 'static {
    /// Start the agent of `player` under `config` (the job's `[agent] config`, JSON; `{}` when
    /// absent); an error here (a bad config) ends the episode.
    fn new(config: &str, player: u32, seed: u64) -> Result<Self, PluginError>;

    /// The chat messages the policy sees, given the conversation so far.
    fn prompt(&mut self, history: Vec<Message>) -> Result<Vec<Message>, PluginError>;

    /// Parse a sampled completion into an action.
    fn act(&mut self, completion: &str) -> Result<String, PluginError>;

    /// A JSON Schema (as JSON text) of the config [`Agent::new`] takes; `None` declares none.
    fn config_schema() -> Option<String> {
        None
    }
}

/// A reward function over finished episodes.
pub trait Reward: 'static {
    /// One score per player of a finished episode of `task`, under `config` (the job's
    /// `[reward] config`, JSON; `{}` when absent).
    fn score(config: &str, task: &str, transcripts: &[Transcript])
    -> Result<Vec<f64>, PluginError>;

    /// Scores for a group of episodes of one task, one list per episode; `None` (the default)
    /// when the reward has no group scorer.
    fn score_group(
        _config: &str,
        _task: &str,
        _episodes: &[Vec<Transcript>],
    ) -> Result<Option<Vec<Vec<f64>>>, PluginError> {
        Ok(None)
    }

    /// A JSON Schema (as JSON text) of the config the scorers take; `None` declares none.
    fn config_schema() -> Option<String> {
        None
    }
}

/// A training objective: the loss of one datum as a function of the policy's logprobs, with its
/// gradient, which the host back-propagates through the model (contract 0.3). The loss of a
/// step is the sum over its datums, so a datum's loss must depend on that datum alone.
///
/// REINFORCE with the datum's advantages, `-Σ_t A_t · logp_t`:
///
/// ```
/// use opentinker_sdk::{DatumLoss, Objective, ObjectiveDatum, PluginError};
///
/// struct Reinforce;
///
/// impl Objective for Reinforce {
///     fn loss(_config: &str, datum: &ObjectiveDatum) -> Result<DatumLoss, PluginError> {
///         let advantages = datum.require("advantages")?;
///         let value = -datum.logprobs.iter().zip(advantages).map(|(l, a)| f64::from(l * a)).sum::<f64>();
///         let gradient = advantages.iter().map(|a| -a).collect();
///         Ok(DatumLoss { value, gradient, metrics: Vec::new() })
///     }
/// }
///
/// opentinker_sdk::export_objective!(Reinforce);
/// # fn main() {}
/// ```
pub trait Objective: 'static {
    /// The loss of `datum` under `config` (JSON; `{}` when absent) and its derivative with
    /// respect to each of `datum.logprobs`.
    fn loss(config: &str, datum: &ObjectiveDatum) -> Result<DatumLoss, PluginError>;

    /// A JSON Schema (as JSON text) of the config [`Objective::loss`] takes; `None` declares none.
    fn config_schema() -> Option<String> {
        None
    }
}

/// An advantage estimator: how a group of episodes of one task turns the rewards of their turns
/// into each turn's advantage (contract 0.3).
pub trait Advantage: 'static {
    /// Per episode of `group` (each given as its turns' rewards), the advantage of each turn, as
    /// many as it has rewards, under `config` (JSON; `{}` when absent).
    fn advantages(config: &str, group: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, PluginError>;

    /// A JSON Schema (as JSON text) of the config [`Advantage::advantages`] takes; `None`
    /// declares none.
    fn config_schema() -> Option<String> {
        None
    }
}

/// The `Package` of the crate that calls an export macro, from Cargo's variables.
#[doc(hidden)]
#[macro_export]
macro_rules! __package {
    () => {
        pub struct Package;
        impl $crate::Package for Package {
            const NAME: &'static str = env!("CARGO_PKG_NAME");
            const VERSION: &'static str = env!("CARGO_PKG_VERSION");
            const DESCRIPTION: &'static str = env!("CARGO_PKG_DESCRIPTION");
            const LICENSE: &'static str = env!("CARGO_PKG_LICENSE");
        }
    };
}

/// How important a log line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Append a line to the episode's log, kept by the host within a byte budget (lines beyond it are
/// dropped and counted). Outside a component (native unit tests) the line goes to stderr.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use bindings::imports::opentinker::plugin::host;
        let level = match level {
            LogLevel::Trace => host::LogLevel::Trace,
            LogLevel::Debug => host::LogLevel::Debug,
            LogLevel::Info => host::LogLevel::Info,
            LogLevel::Warn => host::LogLevel::Warn,
            LogLevel::Error => host::LogLevel::Error,
        };
        host::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Export a type implementing [`Environment`] as this component's environment. The
/// exports exist only in a `wasm32` build; a native build (unit tests) compiles the type alone.
#[macro_export]
macro_rules! export_environment {
    ($environment:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __opentinker_environment_export {
            #[allow(unused_imports)]
            use super::*;
            $crate::__package!();
            type Exported = $crate::EnvironmentAdapter<$environment>;
            $crate::bindings::environment_plugin::__export_environment_plugin!(
                Exported with_types_in $crate::bindings::environment_plugin
            );
            type Described = $crate::MetadataAdapter<$environment, Package, $crate::EnvironmentKind>;
            $crate::bindings::metadata_plugin::__export_metadata_plugin!(
                Described with_types_in $crate::bindings::metadata_plugin
            );
        }
        // Natively, check the type at least: a non-environment fails to compile everywhere.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            const fn implements_environment<T: $crate::Environment>() {}
            implements_environment::<$environment>();
        };
    };
}

/// Export a type implementing [`Agent`] as this component's agent. The
/// exports exist only in a `wasm32` build; a native build (unit tests) compiles the type alone.
#[macro_export]
macro_rules! export_agent {
    ($agent:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __opentinker_agent_export {
            #[allow(unused_imports)]
            use super::*;
            $crate::__package!();
            type Exported = $crate::AgentAdapter<$agent>;
            $crate::bindings::agent_plugin::__export_agent_plugin!(
                Exported with_types_in $crate::bindings::agent_plugin
            );
            type Described = $crate::MetadataAdapter<$agent, Package, $crate::AgentKind>;
            $crate::bindings::metadata_plugin::__export_metadata_plugin!(
                Described with_types_in $crate::bindings::metadata_plugin
            );
        }
        // Natively, check the type at least: a non-agent fails to compile everywhere.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            const fn implements_agent<T: $crate::Agent>() {}
            implements_agent::<$agent>();
        };
    };
}

/// Export a type implementing [`Reward`] as this component's reward function. The
/// exports exist only in a `wasm32` build; a native build (unit tests) compiles the type alone.
#[macro_export]
macro_rules! export_reward {
    ($reward:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __opentinker_reward_export {
            #[allow(unused_imports)]
            use super::*;
            $crate::__package!();
            type Exported = $crate::RewardAdapter<$reward>;
            $crate::bindings::reward_plugin::__export_reward_plugin!(
                Exported with_types_in $crate::bindings::reward_plugin
            );
            type Described = $crate::MetadataAdapter<$reward, Package, $crate::RewardKind>;
            $crate::bindings::metadata_plugin::__export_metadata_plugin!(
                Described with_types_in $crate::bindings::metadata_plugin
            );
        }
        // Natively, check the type at least: a non-reward fails to compile everywhere.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            const fn implements_reward<T: $crate::Reward>() {}
            implements_reward::<$reward>();
        };
    };
}

/// Export a type implementing [`Objective`] as this component's training objective. The
/// exports exist only in a `wasm32` build; a native build (unit tests) compiles the type alone.
#[macro_export]
macro_rules! export_objective {
    ($objective:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __opentinker_objective_export {
            #[allow(unused_imports)]
            use super::*;
            $crate::__package!();
            type Exported = $crate::ObjectiveAdapter<$objective>;
            $crate::bindings::objective_plugin::__export_objective_plugin!(
                Exported with_types_in $crate::bindings::objective_plugin
            );
            type Described = $crate::MetadataAdapter<$objective, Package, $crate::ObjectiveKind>;
            $crate::bindings::metadata_plugin::__export_metadata_plugin!(
                Described with_types_in $crate::bindings::metadata_plugin
            );
        }
        // Natively, check the type at least: a non-objective fails to compile everywhere.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            const fn implements_objective<T: $crate::Objective>() {}
            implements_objective::<$objective>();
        };
    };
}

/// Export a type implementing [`Advantage`] as this component's advantage estimator. The
/// exports exist only in a `wasm32` build; a native build (unit tests) compiles the type alone.
#[macro_export]
macro_rules! export_advantage {
    ($advantage:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __opentinker_advantage_export {
            #[allow(unused_imports)]
            use super::*;
            $crate::__package!();
            type Exported = $crate::AdvantageAdapter<$advantage>;
            $crate::bindings::advantage_plugin::__export_advantage_plugin!(
                Exported with_types_in $crate::bindings::advantage_plugin
            );
            type Described = $crate::MetadataAdapter<$advantage, Package, $crate::AdvantageKind>;
            $crate::bindings::metadata_plugin::__export_metadata_plugin!(
                Described with_types_in $crate::bindings::metadata_plugin
            );
        }
        // Natively, check the type at least: a non-estimator fails to compile everywhere.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            const fn implements_advantage<T: $crate::Advantage>() {}
            implements_advantage::<$advantage>();
        };
    };
}
