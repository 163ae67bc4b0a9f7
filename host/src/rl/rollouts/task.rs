//! The two messages between the driver and whoever plays its episodes: a [`GroupTask`] names a
//! group's episodes completely (plugins by digest with their configs, seeds, the policy of each
//! seat, the sampling parameters and limits), and a [`PlayedGroup`] carries back what they left
//! (per player its token transcript with the sampler's logprobs, turn rewards, errors). Both are
//! plain serde data so that a process other than the driver can play a task and be trusted to
//! have played that task: a task played twice with the same policy versions gives the same bits.

use serde::{Deserialize, Serialize};

use super::super::failure::{EpisodeFailure, FailureKind};
use super::super::rollout::{EpisodeOutcome, Rollout};
use crate::api::SamplingParams;
use crate::plugin::{Limits, Plugin};

/// The version of the task and trajectory messages; a player refuses a task of another.
pub const TASK_FORMAT: u32 = 1;

/// Where a seat's actions come from, by name: resolved to a sampler by whoever plays the task.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicyRef {
    /// The base model (a frozen policy).
    Base,
    /// A trainable policy's adapter after `version` training steps.
    Adapter { policy: String, version: usize },
}

impl std::fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyRef::Base => f.write_str("the base model"),
            PolicyRef::Adapter { policy, version } => {
                write!(f, "policy `{policy}` at version {version}")
            }
        }
    }
}

/// Who acts in a seat: a policy version by name, and where it can be sampled from outside the
/// driver's process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Seat {
    pub policy: PolicyRef,
    /// The version's sampling session on the server, when the driver trains on one: a rollout
    /// worker samples it there. `None` when it lives in the driver's process.
    #[serde(default)]
    pub sampler: Option<String>,
}

/// A plugin a task uses: its component by digest and the config it is called with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PluginUse {
    /// sha256 of the component, hex.
    pub digest: String,
    /// The plugin's config (JSON text).
    pub config: String,
}

/// The reward plugin of a task and how its scores count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RewardUse {
    #[serde(flatten)]
    pub plugin: PluginUse,
    /// What each score is multiplied by before it is added to the player's last turn.
    pub weight: f64,
    /// Whether the plugin's group scorer replaces the scores of the group's episodes.
    pub group: bool,
}

/// One group's episodes to play: one task generated from `seed`, played `group_size` times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupTask {
    /// [`TASK_FORMAT`] of the driver that wrote it.
    pub format: u32,
    /// The job the group belongs to.
    pub job: String,
    /// The group's id in the job: RL step `s` trains groups `s * groups_per_batch ..` unless
    /// some were stale.
    pub group: u64,
    /// Training steps done when the group was launched (the version its seats sample).
    pub version: usize,
    /// The seed of the group's task; episode `i` plays with seed `seed * 1000 + i`.
    pub seed: u64,
    pub group_size: usize,
    /// Who acts in each seat (the last serves any seat beyond).
    pub seats: Vec<Seat>,
    pub environment: PluginUse,
    pub agent: Option<PluginUse>,
    pub reward: Option<RewardUse>,
    /// What each plugin instance may use.
    pub limits: Limits,
    /// Every turn's sampling parameters (each turn's seed is derived from the episode's).
    pub sampling: SamplingParams,
    /// The job's turn limit.
    pub max_turns: usize,
    /// The model's context, in tokens.
    pub context: usize,
    /// The return of each player who acted in an episode that failed.
    pub failure_reward: f64,
}

/// The plugins a task names, loaded (each is checked against the task's digest).
#[derive(Clone, Copy)]
pub struct TaskPlugins<'a> {
    pub environment: &'a Plugin,
    pub agent: Option<&'a Plugin>,
    pub reward: Option<&'a Plugin>,
}

/// Why a task cannot be played here.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TaskError {
    #[error("the task is in message format {found}; this build plays format {TASK_FORMAT}")]
    Format { found: u32 },
    #[error("the task names {role} plugin {wanted}, but the plugin given is {given}")]
    Digest {
        role: &'static str,
        wanted: String,
        given: String,
    },
    #[error("the task names {role} plugin {wanted}, but none was given")]
    MissingPlugin { role: &'static str, wanted: String },
    #[error("the task names no {role} plugin, but one was given")]
    ExtraPlugin { role: &'static str },
    #[error("the task's {0} is not served here")]
    UnknownPolicy(PolicyRef),
    #[error("the task has no seats")]
    NoSeats,
}

impl TaskError {
    /// The kind of the failure, as an episode's failure names it.
    pub fn kind(&self) -> FailureKind {
        match self {
            TaskError::Format { .. } => FailureKind::TaskFormat,
            TaskError::Digest { .. } | TaskError::MissingPlugin { .. } => FailureKind::TaskPlugin,
            TaskError::ExtraPlugin { .. } => FailureKind::TaskPlugin,
            TaskError::UnknownPolicy(_) => FailureKind::TaskPolicy,
            TaskError::NoSeats => FailureKind::TaskSeats,
        }
    }
}

impl GroupTask {
    /// The seed of the group's episode `index`.
    pub fn episode_seed(&self, index: usize) -> u64 {
        self.seed.wrapping_mul(1000).wrapping_add(index as u64)
    }

    /// Check that this build plays the task's format and that `plugins` are the components
    /// the task names, each in its role.
    pub fn check(&self, plugins: &TaskPlugins<'_>) -> Result<(), TaskError> {
        if self.format != TASK_FORMAT {
            return Err(TaskError::Format { found: self.format });
        }
        if self.seats.is_empty() {
            return Err(TaskError::NoSeats);
        }
        check_digest(
            "environment",
            Some(&self.environment),
            Some(plugins.environment),
        )?;
        check_digest("agent", self.agent.as_ref(), plugins.agent)?;
        check_digest(
            "reward",
            self.reward.as_ref().map(|r| &r.plugin),
            plugins.reward,
        )
    }

    /// How each of the task's episodes plays, with `plugins` (checked by [`GroupTask::check`])
    /// and the model's `renderer`.
    pub fn rollout<'a>(
        &'a self,
        plugins: &TaskPlugins<'a>,
        renderer: &'a super::super::render::Renderer,
    ) -> Rollout<'a> {
        Rollout {
            environment: plugins.environment,
            config: &self.environment.config,
            agent: plugins.agent,
            agent_config: self.agent.as_ref().map_or("{}", |a| &a.config),
            reward: plugins.reward.zip(self.reward.as_ref().map(|r| r.weight)),
            reward_config: self.reward.as_ref().map_or("{}", |r| &r.plugin.config),
            limits: &self.limits,
            renderer,
            params: self.sampling.clone(),
            max_turns: self.max_turns,
            context: self.context,
            failure_reward: self.failure_reward,
        }
    }
}

fn check_digest(
    role: &'static str,
    wanted: Option<&PluginUse>,
    given: Option<&Plugin>,
) -> Result<(), TaskError> {
    match (wanted, given) {
        (Some(wanted), Some(given)) if wanted.digest == given.digest() => Ok(()),
        (Some(wanted), Some(given)) => Err(TaskError::Digest {
            role,
            wanted: wanted.digest.clone(),
            given: given.digest().to_string(),
        }),
        (Some(wanted), None) => Err(TaskError::MissingPlugin {
            role,
            wanted: wanted.digest.clone(),
        }),
        (None, Some(_)) => Err(TaskError::ExtraPlugin { role }),
        (None, None) => Ok(()),
    }
}

/// A group that finished playing: the answer to a [`GroupTask`].
#[derive(Debug, Serialize, Deserialize)]
pub struct PlayedGroup {
    /// [`TASK_FORMAT`] of whoever played it.
    pub format: u32,
    pub job: String,
    /// The task's group id.
    pub id: u64,
    /// The task's version: training steps done when the group was launched.
    pub version: usize,
    /// The digests of the plugins that played it (environment, then agent and reward if any).
    pub plugins: Vec<String>,
    /// (index in the group, outcome), in index order.
    pub episodes: Vec<(usize, EpisodeOutcome)>,
}

impl PlayedGroup {
    /// The answer to `task` whose episodes are `episodes`.
    pub fn of(task: &GroupTask, episodes: Vec<(usize, EpisodeOutcome)>) -> Self {
        let agent = task.agent.as_ref();
        let reward = task.reward.as_ref().map(|r| &r.plugin);
        PlayedGroup {
            format: TASK_FORMAT,
            job: task.job.clone(),
            id: task.group,
            version: task.version,
            plugins: std::iter::once(&task.environment)
                .chain(agent)
                .chain(reward)
                .map(|p| p.digest.clone())
                .collect(),
            episodes,
        }
    }

    /// The answer to `task` that could not be played: each of its episodes failed before it
    /// started, with `failure`.
    pub fn failed(task: &GroupTask, failure: EpisodeFailure) -> Self {
        let episodes = (0..task.group_size)
            .map(|i| {
                let seed = task.episode_seed(i);
                (i, EpisodeOutcome::not_started(seed, failure.clone()))
            })
            .collect();
        PlayedGroup::of(task, episodes)
    }
}
