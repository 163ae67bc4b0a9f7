//! Calls of reward plugins: each call in a fresh instance, each score checked.

use super::error::{CallError, ErrorKind};
use super::limits::Limits;
use super::loader::Plugin;
use super::sandbox::guarded_call;
use super::types::{Transcript, transcript_bytes};

impl Plugin {
    /// One score per player of a finished episode of `task`, under the reward's `config`.
    pub async fn score(
        &self,
        config: &str,
        task: &str,
        transcripts: &[Transcript],
        limits: &Limits,
    ) -> Result<Vec<f64>, CallError> {
        let indices = self.0.reward.as_ref().ok_or_else(not_a_reward)?;
        let mut sandbox = self.0.sandbox(limits, 0).await?;
        let guest = indices
            .load(&mut sandbox.store, &sandbox.instance)
            .map_err(|e| CallError::new(ErrorKind::InvalidRequest, format!("{e:#}")))?;
        let input = config.len() + task.len() + transcript_bytes(transcripts);
        let scores = guarded_call!(&mut sandbox, input, |store| guest.score(
            store,
            config,
            task,
            transcripts
        ))?
        .map_err(|e| sandbox.fail(CallError::new(ErrorKind::PluginError, e.message)))?;
        check_scores(&scores, transcripts.len())
            .map_err(|problem| sandbox.fail(CallError::new(ErrorKind::InvalidOutput, problem)))?;
        Ok(scores)
    }

    /// Scores for a group of episodes of one task, or `None` when the plugin has no group scorer.
    pub async fn score_group(
        &self,
        config: &str,
        task: &str,
        episodes: &[Vec<Transcript>],
        limits: &Limits,
    ) -> Result<Option<Vec<Vec<f64>>>, CallError> {
        let indices = self.0.reward.as_ref().ok_or_else(not_a_reward)?;
        let mut sandbox = self.0.sandbox(limits, 0).await?;
        let guest = indices
            .load(&mut sandbox.store, &sandbox.instance)
            .map_err(|e| CallError::new(ErrorKind::InvalidRequest, format!("{e:#}")))?;
        let input =
            config.len() + task.len() + episodes.iter().map(|e| transcript_bytes(e)).sum::<usize>();
        let scores = guarded_call!(&mut sandbox, input, |store| guest
            .score_group(store, config, task, episodes))?
        .map_err(|e| sandbox.fail(CallError::new(ErrorKind::PluginError, e.message)))?;
        if let Some(groups) = &scores {
            if groups.len() != episodes.len() {
                return Err(sandbox.fail(CallError::new(
                    ErrorKind::InvalidOutput,
                    format!(
                        "score-group returned {} lists for {} episodes",
                        groups.len(),
                        episodes.len()
                    ),
                )));
            }
            for (group, episode) in groups.iter().zip(episodes) {
                check_scores(group, episode.len()).map_err(|problem| {
                    sandbox.fail(CallError::new(ErrorKind::InvalidOutput, problem))
                })?;
            }
        }
        Ok(scores)
    }
}

fn not_a_reward() -> CallError {
    CallError::new(
        ErrorKind::InvalidRequest,
        "the plugin is not a reward function",
    )
}

fn check_scores(scores: &[f64], players: usize) -> Result<(), String> {
    if scores.len() != players {
        return Err(format!("{} scores for {players} players", scores.len()));
    }
    if let Some(bad) = scores.iter().find(|s| !s.is_finite()) {
        return Err(format!("a score of {bad}"));
    }
    Ok(())
}
