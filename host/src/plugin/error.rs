//! The errors of loading a plugin and of calling one.

use serde::Serialize;

/// Why a plugin call (and so its episode) failed. Every kind ends only that episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The guest trapped (`unreachable`, a panic, a stack overflow, an out-of-bounds access).
    Trap,
    /// A call ran past its wall-time limit.
    Timeout,
    /// A call used up its fuel.
    OutOfFuel,
    /// The guest hit its memory cap (also when it aborted after a refused `memory.grow`).
    MemoryLimit,
    /// A call returned more bytes than allowed.
    OutputTooLarge,
    /// The host was about to pass more bytes than allowed.
    InputTooLarge,
    /// The guest returned something that breaks the contract (a NaN reward, a wrong-length
    /// reward list, a player out of range).
    InvalidOutput,
    /// The guest reported its own fault through the WIT `plugin-error`.
    PluginError,
    /// The host asked what the plugin cannot answer: a kind it does not export, a player out of
    /// range, a step after the episode ended.
    InvalidRequest,
    /// The episode went past a bound of the whole episode: the host's turn limit, or the bytes
    /// all its calls may return.
    EpisodeLimit,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::Trap,
        ErrorKind::Timeout,
        ErrorKind::OutOfFuel,
        ErrorKind::MemoryLimit,
        ErrorKind::OutputTooLarge,
        ErrorKind::InputTooLarge,
        ErrorKind::InvalidOutput,
        ErrorKind::PluginError,
        ErrorKind::InvalidRequest,
        ErrorKind::EpisodeLimit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Trap => "trap",
            ErrorKind::Timeout => "timeout",
            ErrorKind::OutOfFuel => "out_of_fuel",
            ErrorKind::MemoryLimit => "memory_limit",
            ErrorKind::OutputTooLarge => "output_too_large",
            ErrorKind::InputTooLarge => "input_too_large",
            ErrorKind::InvalidOutput => "invalid_output",
            ErrorKind::PluginError => "plugin_error",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::EpisodeLimit => "episode_limit",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed plugin call: what kind of failure, and the details for the log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct CallError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CallError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CallError {
            kind,
            message: message.into(),
        }
    }

    /// The same error with its message cut to at most `max` bytes (on a character boundary),
    /// saying how much was cut: a plugin's error text, or a trap's backtrace built from its
    /// function names, is kept per episode and must not cost unbounded memory.
    pub fn truncated(mut self, max: u64) -> Self {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        if self.message.len() > max {
            let mut end = max;
            while !self.message.is_char_boundary(end) {
                end -= 1;
            }
            let cut = self.message.len() - end;
            self.message.truncate(end);
            self.message.push_str(&format!(" [{cut} more bytes cut]"));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_character_boundary_and_the_cut_is_said() {
        let error = CallError::new(ErrorKind::PluginError, "é".repeat(10)).truncated(5);
        assert_eq!(error.message, "éé [16 more bytes cut]");
        let short = CallError::new(ErrorKind::Trap, "short").truncated(5);
        assert_eq!(short.message, "short");
    }
}

/// Why a component could not be loaded as a plugin.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the component is {size} bytes, above this host's limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),
    #[error(
        "the component exports no supported opentinker:plugin version (this host supports {supported}); it exports: {found}"
    )]
    UnsupportedVersion { supported: String, found: String },
    #[error(
        "the component imports what this host does not provide: {forbidden} (the host provides opentinker:plugin/host and a neutered WASI 0.2)"
    )]
    ForbiddenImports { forbidden: String },
    #[error(
        "the component implements opentinker:plugin 0.2 but does not export opentinker:plugin/metadata, which every 0.2 plugin must; it exports: {found}"
    )]
    MissingMetadata { found: String },
    #[error("the component cannot be instantiated by this host: {0}")]
    Link(String),
    #[error(transparent)]
    Structure(#[from] crate::plugin::structure::StructureError),
    #[error("compiling the component went past this host's limit of {limit} {}", resource.unit())]
    CompileLimit {
        resource: CompileResource,
        limit: u64,
    },
    #[error("the component could not be compiled: no compile worker: {0}")]
    CompilerUnavailable(String),
    #[error("the compile worker failed: {0}")]
    CompilerCrashed(String),
    #[error("reading {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// What compiling a component ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompileResource {
    Memory,
    CpuTime,
    WallTime,
    ArtifactBytes,
}

impl CompileResource {
    fn unit(self) -> &'static str {
        match self {
            CompileResource::Memory => "bytes of memory",
            CompileResource::CpuTime => "ms of CPU time",
            CompileResource::WallTime => "ms of wall time",
            CompileResource::ArtifactBytes => "bytes of compiled code",
        }
    }
}
