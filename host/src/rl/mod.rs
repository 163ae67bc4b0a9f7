//! Reinforcement learning as a client of the engine: jobs read from their files, episodes played
//! token-in, token-out against sandboxed plugins, their conversion to masked training datums, the
//! advantage estimators, and the driver that runs a job's warm-up, RL steps, evaluations and
//! checkpoints through a [`crate::client::ServiceClient`].
//!
//! A [`Job`] is read and checked from its TOML file; [`run_jobs`] (the `train` command) and
//! [`run_job`] (one job of a server) run [`JobRun`]s on an [`Engine`], reporting each step's
//! [`StepMetrics`] and each [`Evaluation`] to a [`Progress`] and into the run folder
//! ([`METRICS`], [`SETTINGS`]). Underneath, a [`Rollout`] plays an episode between the
//! environment and its [`Actor`]s, a [`Renderer`] turns the conversation into a
//! [`TokenSequence`] of spans, and [`rl_datum`] / [`sft_datum`] make it a training datum whose
//! action tokens carry the [`advantages`] of their turns. An RL step's groups cross to whoever
//! plays them as [`GroupTask`]s and come back as [`PlayedGroup`]s, serde messages that
//! [`play_task`] plays the same wherever it runs. [`watch`] plays and replays a trained policy's
//! episodes.

mod advantage;
mod context;
mod datum;
mod diagnosis;
mod driver;
mod failure;
mod job;
mod metrics;
mod render;
mod report;
mod rollout;
mod rollouts;
mod run_folder;
mod sft;
mod train_step;
mod training_loop;
mod transcript;
pub mod watch;

pub use advantage::{Estimator, GroupReturns, advantages, fold_kl};
pub use context::{JobRun, Progress};
pub use datum::{rl_datum, sft_datum};
pub use driver::{check_job_plugins, run_job, run_jobs, served_base_name};
pub use failure::{EpisodeFailure, FailureKind, UnknownFailureKind};
pub use job::{Job, SftSource, is_digest, is_package};
pub use metrics::{Evaluation, Phase, StepMetrics};
pub use render::Renderer;
pub use rollout::{Actor, EpisodeOutcome, Rollout};
pub use rollouts::{
    GroupTask, PlayedGroup, PluginUse, PolicyRef, Pool, Queue, QueueError, QueueRollouts,
    QueueSettings, RewardUse, Rollouts, Seat, TASK_FORMAT, TASKS_STREAM, TaskError, TaskPlugins,
    WorkerPlayer, play_task, serve_tasks,
};
pub use run_folder::{METRICS, SETTINGS};
pub use transcript::{Span, SpanKind, TokenSequence, Transcript};
