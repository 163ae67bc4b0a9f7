//! Who plays a job's groups of episodes, and the messages that say what to play.
//!
//! The RL driver does not play episodes itself: for each group it makes a [`GroupTask`] (the
//! job's plugins by digest with their configs, the group's seed, the policy version of each
//! seat, the sampling parameters and limits) and hands it to its rollouts, which answer with a
//! [`PlayedGroup`] (each episode's token transcripts with the sampler's logprobs, its turn
//! rewards and errors). Both messages are plain serde data in format [`TASK_FORMAT`], so the
//! player may be this process or another one; [`play_task`] is how any of them plays a task,
//! given the components the task names ([`TaskPlugins`]) and an [`Actor`](super::Actor) per
//! seat, so a task plays to the same bits wherever it is played.
//!
//! Inside the crate, the driver's side is the `Rollouts` interface: `InProcess` plays tasks in
//! this process with the samplers of the versions the driver has published (`Samplers`);
//! `JobTasks` makes a job's tasks from its `Launch`es; `GroupStream` keeps async mode's groups
//! playing ahead of training.

mod group_stream;
mod in_process;
mod launch;
mod play;
mod players;
mod queue;
mod task;
mod worker;

pub use play::play_task;
pub use players::Rollouts;
pub use queue::{Pool, Queue, QueueError, QueueRollouts, QueueSettings, TASKS_STREAM, serve_tasks};
pub use task::{
    GroupTask, PlayedGroup, PluginUse, PolicyRef, RewardUse, Seat, TASK_FORMAT, TaskError,
    TaskPlugins,
};
pub use worker::WorkerPlayer;

pub(crate) use group_stream::GroupStream;
pub(crate) use in_process::InProcess;
pub(crate) use launch::{JobTasks, Launch};
pub(crate) use players::Samplers;
