//! Async mode's stream of groups: groups are played ahead of training, each with the policy
//! versions current when it was launched, and handed to training a batch at a time in the order
//! they finished (a slow group does not hold a batch back). A group whose version is more than
//! `rl.max_policy_lag` versions behind the step that would train on it is stale: its task is
//! played again with the current versions (`rl.stale = "resample"`) or it is dropped for a new
//! task (`"drop"`); either way it is counted.
//!
//! The stream keeps `groups_per_batch * max_policy_lag` groups (at least one batch) playing or
//! waiting. Each group plays as a task of its own, so groups play on whatever the job awaits
//! (training, evaluation, a checkpoint); while a step trains (`while_training`) the stream also
//! launches new groups as groups finish, so sampling and training overlap. With a lag of 1 every batch is the groups launched while the previous step trained,
//! so the run is deterministic; with 0, those groups are all stale, and resampling them makes
//! the run the same as in sync mode.

use std::sync::Arc;

use anyhow::Context;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::task::JoinHandle;

use super::super::job::{Job, StaleGroups};
use super::launch::{JobTasks, Launch};
use super::players::Rollouts;
use super::task::PlayedGroup;

/// Groups played ahead of training, for the steps of one job.
pub(crate) struct GroupStream {
    rollouts: Arc<dyn Rollouts>,
    tasks: Arc<JobTasks>,
    groups_per_batch: usize,
    playing: FuturesUnordered<JoinHandle<anyhow::Result<PlayedGroup>>>,
    finished: Vec<PlayedGroup>,
    /// The id of the next new task.
    next_id: u64,
    max_lag: usize,
    stale: StaleGroups,
    /// Stale groups since the last batch.
    stale_count: usize,
    /// Groups still to be handed to training: no new task is launched beyond them.
    to_train: usize,
}

impl GroupStream {
    /// A stream for RL steps `first_step..` of `job`, its groups played by `rollouts`: its
    /// first new task is that step's first group.
    pub(crate) fn new(
        rollouts: Arc<dyn Rollouts>,
        tasks: Arc<JobTasks>,
        job: &Job,
        first_step: usize,
    ) -> Self {
        let groups = job.rl.groups_per_batch;
        GroupStream {
            rollouts,
            tasks,
            groups_per_batch: groups,
            playing: FuturesUnordered::new(),
            finished: Vec::new(),
            next_id: (first_step * groups) as u64,
            max_lag: job.rl.max_policy_lag,
            stale: job.rl.stale,
            stale_count: 0,
            to_train: job.rl.steps.saturating_sub(first_step) * groups,
        }
    }

    fn capacity(&self) -> usize {
        self.groups_per_batch.saturating_mul(self.max_lag.max(1))
    }

    fn launch(&mut self, id: u64, launch: &Launch) {
        let task = self.tasks.task(id, launch);
        self.playing.push(tokio::spawn(self.rollouts.start(task)));
    }

    /// A finished group, or the error that ended it.
    fn finish(
        &mut self,
        played: Result<anyhow::Result<PlayedGroup>, tokio::task::JoinError>,
    ) -> anyhow::Result<()> {
        self.finished
            .push(played.context("a group's task failed")??);
        Ok(())
    }

    /// Launch new tasks until the stream holds its capacity (or every group still to train).
    fn fill(&mut self, launch: &Launch) {
        let target = self.capacity().min(self.to_train);
        while self.playing.len() + self.finished.len() < target {
            let id = self.next_id;
            self.next_id += 1;
            self.launch(id, launch);
        }
    }

    /// Resample or drop the finished groups that are stale for a step at `launch.version`.
    fn retire_stale(&mut self, launch: &Launch) {
        let max_lag = self.max_lag;
        let (stale, fresh): (Vec<_>, Vec<_>) = std::mem::take(&mut self.finished)
            .into_iter()
            .partition(|g| launch.version - g.version > max_lag);
        self.finished = fresh;
        self.stale_count += stale.len();
        if self.stale == StaleGroups::Resample {
            for group in stale {
                self.launch(group.id, launch);
            }
        }
    }

    /// The next batch for the step at `launch.version` (training steps done): the first
    /// `groups_per_batch` groups to finish that are not stale, in id order. Also the largest
    /// lag among them and the stale groups counted since the last batch.
    pub(crate) async fn next_batch(
        &mut self,
        launch: &Launch,
    ) -> anyhow::Result<(Vec<PlayedGroup>, usize, usize)> {
        let wanted = self.groups_per_batch;
        loop {
            self.retire_stale(launch);
            if self.finished.len() >= wanted {
                break;
            }
            self.fill(launch);
            match self.playing.next().await {
                Some(played) => self.finish(played)?,
                None => anyhow::bail!("the group stream ran dry"),
            }
        }
        let mut batch: Vec<PlayedGroup> = self.finished.drain(..wanted).collect();
        batch.sort_by_key(|g| g.id);
        self.to_train = self.to_train.saturating_sub(wanted);
        let lag = batch
            .iter()
            .map(|g| launch.version - g.version)
            .max()
            .unwrap_or(0);
        Ok((batch, lag, std::mem::take(&mut self.stale_count)))
    }

    /// Await `work` (a training step) while the stream plays on, launching new tasks with
    /// `launch` as groups finish.
    pub(crate) async fn while_training<T>(
        &mut self,
        work: impl Future<Output = T>,
        launch: &Launch,
    ) -> anyhow::Result<T> {
        self.fill(launch);
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                Some(played) = self.playing.next(), if !self.playing.is_empty() => {
                    self.finish(played)?;
                    self.fill(launch);
                }
            }
        }
    }
}

impl Drop for GroupStream {
    /// Groups still playing when the job ends (or fails) are stopped, not left to run.
    fn drop(&mut self) {
        for group in self.playing.iter() {
            group.abort();
        }
    }
}
