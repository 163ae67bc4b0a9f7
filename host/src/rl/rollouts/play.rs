//! Playing a [`GroupTask`]: the group's task generated once from its seed, its episodes played
//! at once, then the reward plugin's group scorer when the task asks for it. The driver's
//! in-process player and a rollout worker both play a task here, so a task plays the same
//! wherever it is played.

use super::super::failure::EpisodeFailure;
use super::super::render::Renderer;
use super::super::rollout::{Actor, EpisodeOutcome};
use super::task::{GroupTask, PlayedGroup, TaskPlugins};
use crate::plugin::Plugin;

/// Play `task` with `plugins` (the components it names) and the model's `renderer`, seat p
/// acting as `actors[p]`. A task this build cannot play, or whose plugins are not the ones it
/// names, fails each of its episodes with the reason; a plugin that cannot make the task fails
/// this group's episodes, not the job (nor the other jobs of the process).
pub async fn play_task(
    task: &GroupTask,
    plugins: TaskPlugins<'_>,
    renderer: &Renderer,
    actors: &[Actor],
) -> PlayedGroup {
    if let Err(error) = task.check(&plugins) {
        return PlayedGroup::failed(task, EpisodeFailure::with(error.kind(), &error));
    }
    let generated = plugins
        .environment
        .generate_task(&task.environment.config, task.seed, &task.limits)
        .await;
    let environment_task = match generated {
        Ok(environment_task) => environment_task,
        Err(error) => return PlayedGroup::failed(task, error.into()),
    };
    let rollout = task.rollout(&plugins, renderer);
    let episodes = (0..task.group_size).map(|i| {
        let (rollout, environment_task) = (&rollout, &environment_task);
        let seed = task.episode_seed(i);
        async move { (i, rollout.play(environment_task, seed, actors).await) }
    });
    let mut played = futures::future::join_all(episodes).await;
    if let (Some(reward), Some(section)) = (plugins.reward, &task.reward)
        && section.group
    {
        let failure_reward = task.failure_reward;
        let scoring = Scoring {
            reward,
            config: &section.plugin.config,
            weight: section.weight,
            failure_reward,
        };
        scoring
            .score_group(task, &environment_task, &mut played)
            .await;
    }
    PlayedGroup::of(task, played)
}

/// A reward plugin's group scorer and how its scores count.
struct Scoring<'a> {
    reward: &'a Plugin,
    config: &'a str,
    weight: f64,
    failure_reward: f64,
}

impl Scoring<'_> {
    /// Let the group scorer replace the scores of a group's whole episodes; when it fails,
    /// those episodes fail with its error kind.
    async fn score_group(
        &self,
        task: &GroupTask,
        environment_task: &str,
        played: &mut [(usize, EpisodeOutcome)],
    ) {
        let mut members: Vec<&mut EpisodeOutcome> = played
            .iter_mut()
            .filter(|(_, o)| o.failure.is_none())
            .map(|(_, o)| o)
            .collect();
        let transcripts: Vec<_> = members.iter().map(|o| o.plugin_transcripts()).collect();
        let scored = self
            .reward
            .score_group(self.config, environment_task, &transcripts, &task.limits)
            .await;
        match scored {
            Ok(Some(scores)) => {
                for (outcome, scores) in members.iter_mut().zip(scores) {
                    outcome.replace_scores(scores.iter().map(|s| s * self.weight).collect());
                }
            }
            Ok(None) => {}
            Err(error) => {
                for outcome in members {
                    outcome.fail(error.clone().into(), self.failure_reward);
                }
            }
        }
    }
}
