//! The bounds on plugin code: per-plugin resource limits (safe defaults, overridable by a job up
//! to the host's maxima), what one component may define (checked before compiling) and what
//! compiling it may cost, and the engine's per-component maxima behind both.

use std::time::Duration;

use serde::{Deserialize, Serialize};

const MIB: u64 = 1024 * 1024;

/// The default fuel of one call: about a second of guest code on one core of a current machine,
/// and far above what the project's plugins use per call (see docs/sandbox.md).
pub const DEFAULT_CALL_FUEL: u64 = 1_000_000_000;

/// What each list item (a message, an action, a metric, a reward, a recipient) counts in a
/// call's output on top of its text: so that a million empty messages are not free.
pub const ITEM_OVERHEAD_BYTES: u64 = 16;

/// What one plugin instance may use. Every call of the plugin is bounded by these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Bytes of all the instance's linear memories together, its tables' elements counted too.
    pub memory_bytes: u64,
    /// Fuel of one call: wasm instructions, as wasmtime meters them. The primary bound of a call:
    /// it does not depend on the machine's load, so a seed's outcome does not either.
    pub fuel: u64,
    /// Fuel of all the episode's calls together (its instantiation included).
    pub episode_fuel: u64,
    /// Wall time of one call, in milliseconds (epoch interruption, plus a timeout around the
    /// call): a backstop behind `fuel`, for a host so loaded that fuel would take too long.
    pub call_timeout_ms: u64,
    /// Wall time of the whole episode, from its instance's start, in milliseconds.
    pub episode_timeout_ms: u64,
    /// Bytes of strings passed into one call.
    pub input_bytes: u64,
    /// Bytes of strings returned by one call.
    pub output_bytes: u64,
    /// Bytes of log (stdout, stderr and the `host.log` import) kept per episode.
    pub log_bytes: u64,
    /// Players an environment may declare in `info()`.
    pub max_players: u32,
    /// Steps of one episode, whatever the environment's `max-turns` says: an episode still
    /// running at this many steps ends with `episode_limit`.
    pub max_turns: u32,
    /// Items in any list one call returns (messages, actions, metrics, rewards).
    pub max_items: u32,
    /// Bytes one episode's calls may return in all (items counted as in `output_bytes`).
    pub episode_output_bytes: u64,
    /// Bytes of a failure's message that are kept; the rest is cut, and the cut said.
    pub error_message_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 * MIB,
            fuel: DEFAULT_CALL_FUEL,
            episode_fuel: 10 * DEFAULT_CALL_FUEL,
            call_timeout_ms: 30_000,
            episode_timeout_ms: 600_000,
            input_bytes: MIB,
            output_bytes: MIB,
            log_bytes: 64 * 1024,
            max_players: 64,
            max_turns: 1_000,
            max_items: 4_096,
            episode_output_bytes: 64 * MIB,
            error_message_bytes: 4 * 1024,
        }
    }
}

impl Limits {
    /// The most any job may ask for on a host with default settings.
    pub fn default_maxima() -> Self {
        Limits {
            memory_bytes: 256 * MIB,
            fuel: 1_000 * DEFAULT_CALL_FUEL,
            episode_fuel: 10_000 * DEFAULT_CALL_FUEL,
            call_timeout_ms: 300_000,
            episode_timeout_ms: 3_600_000,
            input_bytes: 16 * MIB,
            output_bytes: 16 * MIB,
            log_bytes: 4 * MIB,
            max_players: 1_024,
            max_turns: 1_000_000,
            max_items: 1 << 20,
            episode_output_bytes: 1024 * MIB,
            error_message_bytes: 64 * 1024,
        }
    }

    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    /// Check these limits against the host's maxima, naming the first one that is too high.
    pub fn check_within(&self, maxima: &Limits) -> Result<(), LimitError> {
        let pairs = [
            ("memory_bytes", self.memory_bytes, maxima.memory_bytes),
            (
                "call_timeout_ms",
                self.call_timeout_ms,
                maxima.call_timeout_ms,
            ),
            ("fuel", self.fuel, maxima.fuel),
            ("episode_fuel", self.episode_fuel, maxima.episode_fuel),
            (
                "episode_timeout_ms",
                self.episode_timeout_ms,
                maxima.episode_timeout_ms,
            ),
            ("input_bytes", self.input_bytes, maxima.input_bytes),
            ("output_bytes", self.output_bytes, maxima.output_bytes),
            ("log_bytes", self.log_bytes, maxima.log_bytes),
            (
                "max_players",
                self.max_players.into(),
                maxima.max_players.into(),
            ),
            ("max_turns", self.max_turns.into(), maxima.max_turns.into()),
            ("max_items", self.max_items.into(), maxima.max_items.into()),
            (
                "episode_output_bytes",
                self.episode_output_bytes,
                maxima.episode_output_bytes,
            ),
            (
                "error_message_bytes",
                self.error_message_bytes,
                maxima.error_message_bytes,
            ),
        ];
        for (name, asked, max) in pairs {
            if asked > max {
                return Err(LimitError::AboveMaximum { name, asked, max });
            }
        }
        let positive = [
            ("fuel", self.fuel),
            ("episode_fuel", self.episode_fuel),
            ("call_timeout_ms", self.call_timeout_ms),
            ("episode_timeout_ms", self.episode_timeout_ms),
            ("max_players", self.max_players.into()),
            ("max_turns", self.max_turns.into()),
        ];
        if let Some((name, _)) = positive.into_iter().find(|(_, value)| *value == 0) {
            return Err(LimitError::Zero(name));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("limit `{name}` = {asked} is above this host's maximum of {max}")]
    AboveMaximum {
        name: &'static str,
        asked: u64,
        max: u64,
    },
    #[error("limit `{0}` must be positive")]
    Zero(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fit_the_default_maxima() {
        assert_eq!(
            Limits::default().check_within(&Limits::default_maxima()),
            Ok(())
        );
    }

    #[test]
    fn a_limit_above_the_maximum_is_named() {
        let limits = Limits {
            memory_bytes: 1 << 40,
            ..Limits::default()
        };
        let err = limits.check_within(&Limits::default_maxima()).unwrap_err();
        assert!(err.to_string().contains("memory_bytes"), "{err}");
    }

    #[test]
    fn a_zero_turn_limit_is_refused_by_name() {
        let limits = Limits {
            max_turns: 0,
            ..Limits::default()
        };
        let err = limits.check_within(&Limits::default_maxima()).unwrap_err();
        assert_eq!(err, LimitError::Zero("max_turns"));
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = serde_json::from_str::<Limits>(r#"{"memroy_bytes": 5}"#).unwrap_err();
        assert!(err.to_string().contains("memroy_bytes"), "{err}");
    }
}

/// Core instances one component may create: its modules' instances, and the shims of its
/// adapters (a Rust plugin has 18, a componentize-py one 66); the pool counts this many per
/// instance slot (a count, nothing is reserved), so no component can take the core instances of
/// others.
pub(crate) const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 256;
/// Linear memories one component may define; the pool holds two per slot, and a component of
/// more takes more slots (see `Plugin::slot_weight`).
pub(crate) const MAX_MEMORIES_PER_COMPONENT: u32 = 4;
pub(crate) const MAX_TABLES_PER_COMPONENT: u32 = 8;

/// The most of each thing one component may define. The defaults are far above what the
/// project's plugins define (see docs/sandbox.md for both).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StructureLimits {
    /// Core modules, nested ones included.
    pub modules: u32,
    /// Core instances the component's instance sections create.
    pub core_instances: u32,
    /// Component instances (of nested components) its sections create.
    pub component_instances: u32,
    /// Linear memories its modules define.
    pub memories: u32,
    /// Tables its modules define.
    pub tables: u32,
    /// Functions its modules define (with a body), all modules together.
    pub functions: u32,
    /// Bytes of one function body.
    pub function_bytes: u32,
    /// Locals of one function.
    pub locals: u32,
}

impl Default for StructureLimits {
    fn default() -> Self {
        StructureLimits {
            modules: 32,
            core_instances: MAX_CORE_INSTANCES_PER_COMPONENT,
            component_instances: 32,
            memories: MAX_MEMORIES_PER_COMPONENT,
            tables: MAX_TABLES_PER_COMPONENT,
            functions: 100_000,
            function_bytes: 1 << 20,
            locals: 10_000,
        }
    }
}

/// What compiling one component may cost: a base, plus a share per MiB of component, because a
/// large component is costly to compile by right (on 2 cores, an 18 MB componentize-py plugin
/// takes 25-30 s of CPU and 610 MB, a 12 MB componentize-js one, mostly SpiderMonkey, 32-37 s;
/// a busy host adds to both) while a small one that is costly is an attack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompileLimits {
    /// The worker's whole address space (`RLIMIT_AS`, so its resident memory stays below it).
    pub memory_bytes: u64,
    /// More address space for each MiB of the component.
    pub memory_bytes_per_mib: u64,
    /// CPU time of the worker, all its threads together (`RLIMIT_CPU`, whole seconds, rounded up).
    pub cpu_time_ms: u64,
    /// More CPU time for each MiB of the component.
    pub cpu_time_ms_per_mib: u64,
    /// Wall time, after which the worker is killed (at least twice its CPU time): a backstop for
    /// a host too loaded for the CPU limit to come first.
    pub wall_time_ms: u64,
    /// Bytes of compiled artifact accepted from the worker.
    pub artifact_bytes: u64,
    /// What the component may define, checked before compiling.
    pub structure: StructureLimits,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            memory_bytes: 768 << 20,
            memory_bytes_per_mib: 48 << 20,
            cpu_time_ms: 8_000,
            cpu_time_ms_per_mib: 6_000,
            wall_time_ms: 30_000,
            artifact_bytes: 256 << 20,
            structure: StructureLimits::default(),
        }
    }
}

/// What compiling one component of a given size may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileBudget {
    pub memory_bytes: u64,
    pub cpu_time_ms: u64,
    pub wall_time_ms: u64,
}

impl CompileLimits {
    /// The budget of a component of `bytes` bytes.
    pub fn budget(&self, bytes: usize) -> CompileBudget {
        let mib = |per_mib: u64| {
            let scaled = u128::from(per_mib) * bytes as u128 / (1 << 20);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        };
        let cpu_time_ms = self
            .cpu_time_ms
            .saturating_add(mib(self.cpu_time_ms_per_mib));
        CompileBudget {
            memory_bytes: self
                .memory_bytes
                .saturating_add(mib(self.memory_bytes_per_mib)),
            cpu_time_ms,
            wall_time_ms: self.wall_time_ms.max(cpu_time_ms.saturating_mul(2)),
        }
    }
}
