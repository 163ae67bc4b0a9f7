//! A job's groups as tasks: what every task of the job shares (plugins by digest with their
//! configs, limits, sampling, turn and context limits) and what each launch adds (its id, its
//! seed, the policy version of each seat).

use super::super::context::{JobContext, sampling_params};
use super::super::job::Job;
use super::task::{GroupTask, PluginUse, RewardUse, Seat, TASK_FORMAT};

/// The policies a group is launched with.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Launch {
    /// Who acts in each seat (the last serves any seat beyond).
    pub(crate) seats: Vec<Seat>,
    /// Training steps done when the group was launched.
    pub(crate) version: usize,
}

/// Makes the tasks of one job's groups.
pub(crate) struct JobTasks {
    /// A task of the job with no group, seed or seats yet.
    shape: GroupTask,
    /// The job's RL seed, from which each group's seed derives.
    rl_seed: u64,
}

impl JobTasks {
    /// The tasks of job `name` (`job`, with its plugins loaded in `cx`).
    pub(crate) fn new(name: &str, cx: &JobContext, job: &Job) -> anyhow::Result<Self> {
        let environment = PluginUse {
            digest: cx.environment()?.digest().to_string(),
            config: cx.config.clone(),
        };
        let agent = cx.agent.as_ref().map(|agent| PluginUse {
            digest: agent.digest().to_string(),
            config: cx.agent_config.clone(),
        });
        let reward = cx
            .reward
            .as_ref()
            .zip(job.reward.as_ref())
            .map(|(reward, section)| RewardUse {
                plugin: PluginUse {
                    digest: reward.digest().to_string(),
                    config: cx.reward_config.clone(),
                },
                weight: section.weight,
                group: section.group,
            });
        Ok(JobTasks {
            shape: GroupTask {
                format: TASK_FORMAT,
                job: name.to_string(),
                group: 0,
                version: 0,
                seed: 0,
                group_size: job.rl.group_size,
                seats: Vec::new(),
                environment,
                agent,
                reward,
                limits: job.limits.clone(),
                sampling: sampling_params(job),
                max_turns: job.rl.max_turns,
                context: cx.model.context,
                failure_reward: job.rl.failure_reward,
            },
            rl_seed: job.rl.seed,
        })
    }

    /// The task of group `id`, launched with `launch`.
    pub(crate) fn task(&self, id: u64, launch: &Launch) -> GroupTask {
        GroupTask {
            group: id,
            version: launch.version,
            seed: self.rl_seed.wrapping_mul(1_000_003).wrapping_add(id),
            seats: launch.seats.clone(),
            ..self.shape.clone()
        }
    }
}
