//! Why an episode failed: a kind to count and act on, and the failure's own words for the log.
//!
//! A failed episode ends only itself (its players get the job's `failure_reward`). The kinds
//! are the plugin host's [`ErrorKind`]s (a trap, a timeout, a plugin's own error) and the
//! host's side of an episode (the context filled up, the sampler failed, the task could not be
//! played here). On the wire and in metrics a kind is its snake_case name (`trap`,
//! `context_exceeded`): the rollout files, `metrics.jsonl` and a rollout worker's answers read
//! the same as they always have.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::plugin::ErrorKind;

/// The kind of an episode's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// A plugin call failed (the environment's, the agent's or the reward plugin's).
    Plugin(ErrorKind),
    /// The conversation outgrew the model's context.
    ContextExceeded,
    /// The sampler failed, or returned no sequence.
    Sampler,
    /// The chat template could not render the messages, or the sample could not be read back
    /// as text.
    Render,
    /// An observation or action did not extend the player's transcript.
    Transcript,
    /// A warm-up asked for a demonstration the environment does not give.
    NoDemonstration,
    /// No actor was given for a player.
    NoPolicy,
    /// The task is in a message format this build does not play.
    TaskFormat,
    /// The plugins given are not the ones the task names.
    TaskPlugin,
    /// The task names a policy not served here.
    TaskPolicy,
    /// The task has no seats.
    TaskSeats,
    /// The rollout worker's answer never came, or could not be read.
    RolloutWorker,
}

/// The host's own kinds (the plugin's are [`ErrorKind::ALL`]).
const HOST_KINDS: [FailureKind; 11] = [
    FailureKind::ContextExceeded,
    FailureKind::Sampler,
    FailureKind::Render,
    FailureKind::Transcript,
    FailureKind::NoDemonstration,
    FailureKind::NoPolicy,
    FailureKind::TaskFormat,
    FailureKind::TaskPlugin,
    FailureKind::TaskPolicy,
    FailureKind::TaskSeats,
    FailureKind::RolloutWorker,
];

impl FailureKind {
    /// The kind's snake_case name, as metrics and the rollout files write it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Plugin(kind) => kind.as_str(),
            FailureKind::ContextExceeded => "context_exceeded",
            FailureKind::Sampler => "sampler",
            FailureKind::Render => "render",
            FailureKind::Transcript => "transcript",
            FailureKind::NoDemonstration => "no_demonstration",
            FailureKind::NoPolicy => "no_policy",
            FailureKind::TaskFormat => "task_format",
            FailureKind::TaskPlugin => "task_plugin",
            FailureKind::TaskPolicy => "task_policy",
            FailureKind::TaskSeats => "task_seats",
            FailureKind::RolloutWorker => "rollout_worker",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ErrorKind> for FailureKind {
    fn from(kind: ErrorKind) -> Self {
        FailureKind::Plugin(kind)
    }
}

/// A name that is no episode failure's kind.
#[derive(Debug, thiserror::Error)]
#[error("unknown episode failure kind {0:?}")]
pub struct UnknownFailureKind(String);

impl FromStr for FailureKind {
    type Err = UnknownFailureKind;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ErrorKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .map(FailureKind::Plugin)
            .or_else(|| HOST_KINDS.into_iter().find(|kind| kind.as_str() == name))
            .ok_or_else(|| UnknownFailureKind(name.to_string()))
    }
}

impl Serialize for FailureKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FailureKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// An episode's failure: its kind, and its text where it has one (a plugin's error message,
/// bounded by the sandbox; the sampler's error).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpisodeFailure {
    pub kind: FailureKind,
    pub message: Option<String>,
}

impl EpisodeFailure {
    /// A failure of `kind` with nothing more to say.
    pub fn of(kind: FailureKind) -> Self {
        EpisodeFailure {
            kind,
            message: None,
        }
    }

    /// A failure of `kind`, in `message`'s words.
    pub fn with(kind: FailureKind, message: impl fmt::Display) -> Self {
        EpisodeFailure {
            kind,
            message: Some(message.to_string()),
        }
    }
}

impl From<&crate::plugin::CallError> for EpisodeFailure {
    fn from(error: &crate::plugin::CallError) -> Self {
        EpisodeFailure::with(error.kind.into(), &error.message)
    }
}

impl From<crate::plugin::CallError> for EpisodeFailure {
    fn from(error: crate::plugin::CallError) -> Self {
        EpisodeFailure::from(&error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name() {
        let kinds = ErrorKind::ALL
            .into_iter()
            .map(FailureKind::Plugin)
            .chain(HOST_KINDS);
        let mut names = std::collections::BTreeSet::new();
        for kind in kinds {
            let name = kind.as_str();
            assert!(names.insert(name), "two kinds are named {name}");
            assert_eq!(name.parse::<FailureKind>().unwrap(), kind);
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<FailureKind>(&json).unwrap(), kind);
        }
        let err = "exploded".parse::<FailureKind>().unwrap_err();
        assert!(err.to_string().contains("exploded"), "{err}");
    }
}
