//! [`InProcess`]: the job's groups played in the driver's process, on the job's loaded plugins,
//! with the samplers of the policy versions the driver has published into its [`Samplers`].

use std::sync::Arc;

use futures::future::BoxFuture;

use super::super::context::JobContext;
use super::super::failure::EpisodeFailure;
use super::super::rollout::Actor;
use super::play::play_task;
use super::players::{Rollouts, Samplers};
use super::task::{GroupTask, PlayedGroup, TaskError, TaskPlugins};

/// Plays a job's groups in this process.
pub(crate) struct InProcess {
    cx: Arc<JobContext>,
    samplers: Samplers,
}

impl InProcess {
    /// The player of the job of `cx`, sampling the versions published into `samplers`.
    pub(crate) fn new(cx: Arc<JobContext>, samplers: Samplers) -> Self {
        InProcess { cx, samplers }
    }
}

impl Rollouts for InProcess {
    fn start(&self, task: GroupTask) -> BoxFuture<'static, anyhow::Result<PlayedGroup>> {
        let actors: Result<Vec<Actor>, TaskError> = task
            .seats
            .iter()
            .map(|seat| self.samplers.resolve(&seat.policy).map(Actor::Policy))
            .collect();
        let cx = Arc::clone(&self.cx);
        Box::pin(async move {
            let actors = match actors {
                Ok(actors) => actors,
                Err(error) => {
                    let failure = EpisodeFailure::with(error.kind(), &error);
                    return Ok(PlayedGroup::failed(&task, failure));
                }
            };
            let plugins = TaskPlugins {
                environment: cx.environment()?,
                agent: cx.agent.as_ref(),
                reward: cx.reward.as_ref(),
            };
            Ok(play_task(&task, plugins, &cx.model.renderer, &actors).await)
        })
    }
}
