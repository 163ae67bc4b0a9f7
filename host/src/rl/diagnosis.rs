//! Whether a run can learn, in figures: each step's signal (the share of groups whose returns all
//! tie, which teach nothing, and the size of the advantages), how much the greedy policy changed
//! between evaluations, and, at the end of a run whose evaluation did not improve, a short report
//! naming the likely cause from those figures and the setting to change.

use super::advantage::{GroupReturns, StepAdvantages};
use super::job::{Job, PolicySection};
use super::metrics::Evaluation;
use super::rollout::EpisodeOutcome;

/// The learning signal of one RL step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Signal {
    /// The fraction of (group, trained seat) pairs whose returns all tie.
    pub(super) tied_groups: f64,
    /// The mean absolute advantage of the trained seats' turns.
    pub(super) advantage_abs_mean: f64,
}

/// The signal of a step's episodes, `played` as (group, index in group, outcome), with the
/// step's `advantages`.
pub(super) fn signal_of(
    played: &[(usize, usize, EpisodeOutcome)],
    job: &Job,
    policies: &[PolicySection],
    advantages: &StepAdvantages,
) -> Signal {
    let seats = played
        .iter()
        .map(|(_, _, o)| o.turn_rewards.len())
        .max()
        .unwrap_or(0);
    let trained = |seat: usize| policies.iter().any(|p| p.trainable && p.controls(seat));
    let (mut tied, mut pairs, mut abs_sum, mut turns) = (0usize, 0usize, 0.0, 0usize);
    for g in 0..job.rl.groups_per_batch {
        let group: Vec<&EpisodeOutcome> = played
            .iter()
            .filter(|(i, _, _)| *i == g)
            .map(|(_, _, o)| o)
            .collect();
        for seat in (0..seats).filter(|&s| trained(s)) {
            let returns = GroupReturns {
                turn_rewards: group
                    .iter()
                    .map(|o| o.turn_rewards.get(seat).cloned().unwrap_or_default())
                    .collect(),
            };
            if returns.turn_rewards.iter().all(Vec::is_empty) {
                continue;
            }
            pairs += 1;
            tied += usize::from(returns.ties());
            let answered = advantages.get(g).and_then(|group| group.get(seat));
            for episode in answered.into_iter().flatten() {
                abs_sum += episode.iter().map(|a| a.abs()).sum::<f64>();
                turns += episode.len();
            }
        }
    }
    Signal {
        tied_groups: if pairs == 0 {
            0.0
        } else {
            tied as f64 / pairs as f64
        },
        advantage_abs_mean: if turns == 0 {
            0.0
        } else {
            abs_sum / turns as f64
        },
    }
}

/// A digest of what `player` did in each episode (its messages' text), to tell whether two
/// evaluations on the same seeds acted alike. FNV-1a over the texts, each followed by a 0xff
/// byte (which UTF-8 never holds): the same in every process and every build, since a resumed
/// run compares against digests its checkpoint kept.
pub(super) fn action_digests(outcomes: &[EpisodeOutcome], player: usize) -> Vec<u64> {
    outcomes
        .iter()
        .map(|o| {
            let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
            let assistant = o.messages.get(player).into_iter().flatten();
            for message in assistant.filter(|m| m.role == "assistant") {
                for &byte in message.content.as_bytes().iter().chain(&[0xff]) {
                    digest = (digest ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
                }
            }
            digest
        })
        .collect()
}

/// The fraction of evaluation episodes in which the policy acted exactly as at the previous
/// evaluation (the same seeds, greedy), when both were digested.
pub(super) fn greedy_agreement(previous: &Evaluation, now: &Evaluation) -> Option<f64> {
    let (a, b) = (&previous.actions, &now.actions);
    (!a.is_empty() && a.len() == b.len())
        .then(|| a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64)
}

/// What a run's steps said, for the report at its end.
#[derive(Debug, Default)]
pub(super) struct RunSignals {
    steps: usize,
    tied_sum: f64,
    advantage_sum: f64,
    entropy_sum: f64,
    failed_sum: f64,
    /// Each training step's update norm relative to the weights.
    update_ratios: Vec<f64>,
    /// Each evaluation's agreement with the one before.
    agreements: Vec<f64>,
}

impl RunSignals {
    pub(super) fn step(&mut self, signal: Signal, entropy: f64, failed_fraction: f64) {
        self.steps += 1;
        self.tied_sum += signal.tied_groups;
        self.advantage_sum += signal.advantage_abs_mean;
        self.entropy_sum += entropy;
        self.failed_sum += failed_fraction;
    }

    pub(super) fn update(&mut self, ratio: Option<f64>) {
        self.update_ratios.extend(ratio);
    }

    pub(super) fn evaluation(&mut self, agreement: Option<f64>) {
        self.agreements.extend(agreement);
    }

    /// The report of a run whose evaluation (`initial` -> `last`) did not improve, naming the
    /// likely cause; `None` when it improved or no RL step ran.
    pub(super) fn report(
        &self,
        job: &Job,
        initial: &Evaluation,
        last: &Evaluation,
    ) -> Option<String> {
        let improved = last.success_rate > initial.success_rate + 1e-9
            || last.reward_mean > initial.reward_mean + 1e-9;
        if improved || self.steps == 0 {
            return None;
        }
        let n = self.steps as f64;
        let (tied, advantage, entropy, failed) = (
            self.tied_sum / n,
            self.advantage_sum / n,
            self.entropy_sum / n,
            self.failed_sum / n,
        );
        let unchanged = !self.agreements.is_empty() && self.agreements.iter().all(|&a| a >= 0.999);
        let updates = match self.update_ratios.is_empty() {
            true => String::new(),
            false => format!(
                ", updates {:.1e} of the adapter's weights a step",
                self.update_ratios.iter().sum::<f64>() / self.update_ratios.len() as f64
            ),
        };
        let figures = format!(
            "over {} RL steps: {:.0}% of groups tied, mean |advantage| {advantage:.3}, sampled \
             entropy {entropy:.3}, {:.0}% of episodes failed{updates}{}",
            self.steps,
            tied * 100.0,
            failed * 100.0,
            match self.agreements.last() {
                Some(a) => format!(
                    ", greedy actions {:.0}% as at the evaluation before",
                    a * 100.0
                ),
                None => String::new(),
            }
        );
        let cause = if failed > 0.5 {
            "most episodes failed: read their errors in metrics.jsonl (error_messages) and fix the \
             plugin or its config"
                .to_string()
        } else if tied > 0.9 {
            format!(
                "no signal: in nearly every group all episodes got the same return, so every \
                 advantage was zero and nothing was learned; give the task graded or more varied \
                 rewards, raise rl.group_size (now {}), or raise rl.temperature (now {}) so that \
                 episodes differ",
                job.rl.group_size, job.rl.temperature
            )
        } else if entropy < 0.05 {
            format!(
                "the sampling policy is nearly deterministic (entropy {entropy:.3}), so groups \
                 explore little; shorten the warm-up or raise rl.temperature (now {})",
                job.rl.temperature
            )
        } else if unchanged {
            format!(
                "the greedy policy did not change between evaluations: the updates were too small \
                 to flip any greedy choice; raise rl.learning_rate (now {}) or train more steps",
                job.rl.learning_rate
            )
        } else {
            "the signal was there but did not carry over to greedy play: train more steps, or \
             evaluate more episodes to see a smaller change"
                .to_string()
        };
        Some(format!(
            "the evaluation did not improve ({:.3} -> {:.3} success, {:.3} -> {:.3} reward); \
             {figures}. Likely cause: {cause}.",
            initial.success_rate, last.success_rate, initial.reward_mean, last.reward_mean
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluation(success_rate: f64, actions: Vec<u64>) -> Evaluation {
        Evaluation {
            episodes: actions.len(),
            success_rate,
            reward_mean: success_rate,
            actions,
            ..Evaluation::default()
        }
    }

    fn signals(tied: f64, entropy: f64, failed: f64, agreements: &[f64]) -> RunSignals {
        let mut run = RunSignals::default();
        for _ in 0..4 {
            let signal = Signal {
                tied_groups: tied,
                advantage_abs_mean: 0.1,
            };
            run.step(signal, entropy, failed);
        }
        for &a in agreements {
            run.evaluation(Some(a));
        }
        run
    }

    #[test]
    fn greedy_agreement_counts_the_episodes_that_acted_alike() {
        let before = evaluation(0.5, vec![1, 2, 3, 4]);
        assert_eq!(
            greedy_agreement(&before, &evaluation(0.5, vec![1, 9, 3, 4])),
            Some(0.75)
        );
        assert_eq!(greedy_agreement(&evaluation(0.5, vec![]), &before), None);
    }

    #[test]
    fn the_report_names_the_likeliest_cause_and_is_silent_when_the_run_improved() {
        let job: Job = toml::from_str("[model]\ninit_tiny = { seed = 0 }\n").unwrap();
        let (before, flat, better) = (
            evaluation(0.5, vec![]),
            evaluation(0.5, vec![]),
            evaluation(0.6, vec![]),
        );
        let report = |run: RunSignals| run.report(&job, &before, &flat).unwrap_or_default();
        assert_eq!(
            signals(1.0, 1.0, 0.0, &[]).report(&job, &before, &better),
            None
        );
        assert!(report(signals(0.8, 1.0, 0.6, &[])).contains("most episodes failed"));
        assert!(report(signals(1.0, 1.0, 0.0, &[])).contains("no signal"));
        assert!(report(signals(0.2, 0.01, 0.0, &[])).contains("nearly deterministic"));
        let unchanged = report(signals(0.2, 1.0, 0.0, &[1.0, 1.0]));
        assert!(unchanged.contains("did not change") && unchanged.contains("rl.learning_rate"));
        assert!(report(signals(0.2, 1.0, 0.0, &[0.7])).contains("did not carry over"));
    }
}
