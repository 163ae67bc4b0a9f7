//! Advantages from the returns of a group of episodes of one task (GRPO-style): each episode is
//! compared with its group, so no value model is needed.

use serde::{Deserialize, Serialize};

/// How a group's returns become advantages (`rl.estimator`, by these names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// `R_i - mean(R)`, the same for every turn of episode `i` (the default).
    #[default]
    GroupMean,
    /// `(R_i - mean(R)) / (std(R) + 1e-6)`.
    GroupMeanStd,
    /// Per turn `t`, the discounted return from `t` on, `G_t = Σ_{t' >= t} γ^(t'-t) r_t'`
    /// (`rl.gamma`), normalised by the mean and std of every `G` of the group: credit to each
    /// turn.
    PerTurn,
}

/// One group: per episode, the reward each of the player's turns earned (the reward plugin's
/// score belongs to the last turn). An episode's return is the sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupReturns {
    pub turn_rewards: Vec<Vec<f64>>,
}

impl GroupReturns {
    pub fn returns(&self) -> Vec<f64> {
        self.turn_rewards.iter().map(|r| r.iter().sum()).collect()
    }

    /// Whether every episode's return is the same: the group has nothing to teach.
    pub fn ties(&self) -> bool {
        self.returns()
            .windows(2)
            .all(|w| (w[0] - w[1]).abs() < 1e-12)
    }
}

/// A step's advantages, as the estimator answered them (a group whose returns tie included):
/// per group, per seat, per episode of the group, per turn.
pub type StepAdvantages = Vec<Vec<Vec<Vec<f64>>>>;

const STD_EPS: f64 = 1e-6;

fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, variance.sqrt())
}

/// Per episode, per turn, the advantage (`gamma` discounts [`Estimator::PerTurn`]'s returns);
/// `None` when `skip_equal` and every return of the group is the same (nothing to learn from the
/// group).
pub fn advantages(
    group: &GroupReturns,
    estimator: Estimator,
    gamma: f64,
    skip_equal: bool,
) -> Option<Vec<Vec<f64>>> {
    if skip_equal && group.ties() {
        return None;
    }
    let returns = group.returns();
    let (mean, std) = mean_std(&returns);
    let per_episode = |scale: f64| -> Vec<Vec<f64>> {
        group
            .turn_rewards
            .iter()
            .zip(&returns)
            .map(|(turns, r)| vec![(r - mean) / scale; turns.len()])
            .collect()
    };
    Some(match estimator {
        Estimator::GroupMean => per_episode(1.0),
        Estimator::GroupMeanStd => per_episode(std + STD_EPS),
        Estimator::PerTurn => {
            let discounted: Vec<Vec<f64>> = group
                .turn_rewards
                .iter()
                .map(|turns| {
                    let mut to_go = vec![0.0; turns.len()];
                    let mut running = 0.0;
                    for (t, r) in turns.iter().enumerate().rev() {
                        running = r + gamma * running;
                        to_go[t] = running;
                    }
                    to_go
                })
                .collect();
            let all: Vec<f64> = discounted.iter().flatten().copied().collect();
            let (mean, std) = mean_std(&all);
            discounted
                .into_iter()
                .map(|g| {
                    g.into_iter()
                        .map(|v| (v - mean) / (std + STD_EPS))
                        .collect()
                })
                .collect()
        }
    })
}

/// Fold a KL penalty into per-token advantages: `A -= coef · (log π(t) - log π_ref(t))` on the
/// tokens that count (`mask` 1), with the policy's and the reference's logprobs of each token.
pub fn fold_kl(advantages: &mut [f32], mask: &[f32], policy: &[f32], reference: &[f32], coef: f64) {
    for (((a, m), p), r) in advantages.iter_mut().zip(mask).zip(policy).zip(reference) {
        if *m > 0.0 {
            *a -= (coef * f64::from(p - r)) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(turns: &[&[f64]]) -> GroupReturns {
        GroupReturns {
            turn_rewards: turns.iter().map(|t| t.to_vec()).collect(),
        }
    }

    #[test]
    fn group_mean_and_std_centre_each_episode_on_its_group() {
        let g = group(&[&[1.0], &[0.0, 0.0], &[0.0, 1.0, 1.0], &[0.0]]);
        // Returns 1, 0, 2, 0: mean 0.75, std sqrt(0.6875).
        let a = advantages(&g, Estimator::GroupMean, 1.0, true).unwrap();
        assert_eq!(
            a,
            vec![vec![0.25], vec![-0.75; 2], vec![1.25; 3], vec![-0.75]]
        );
        let s = advantages(&g, Estimator::GroupMeanStd, 1.0, true).unwrap();
        let std = 0.6875f64.sqrt() + STD_EPS;
        assert!((s[2][0] - 1.25 / std).abs() < 1e-12);
        assert!((s[0][0] - 0.25 / std).abs() < 1e-12);
    }

    #[test]
    fn equal_returns_skip_the_group_when_asked() {
        let g = group(&[&[1.0], &[0.5, 0.5]]);
        assert_eq!(advantages(&g, Estimator::GroupMean, 1.0, true), None);
        assert_eq!(
            advantages(&g, Estimator::GroupMean, 1.0, false),
            Some(vec![vec![0.0], vec![0.0, 0.0]])
        );
    }

    #[test]
    fn per_turn_returns_credit_each_turn_and_are_normalised_by_the_group() {
        let g = group(&[&[0.0, 1.0], &[0.0, 0.0]]);
        let a = advantages(&g, Estimator::PerTurn, 0.5, true).unwrap();
        // G = [0.5, 1.0] and [0, 0]: mean 0.375, std sqrt(((0.125)^2 + (0.625)^2 + 2 (0.375)^2)/4).
        let (mean, std) = mean_std(&[0.5, 1.0, 0.0, 0.0]);
        let want = |g: f64| (g - mean) / (std + STD_EPS);
        assert!((a[0][0] - want(0.5)).abs() < 1e-12 && (a[0][1] - want(1.0)).abs() < 1e-12);
        assert!((a[1][0] - want(0.0)).abs() < 1e-12);
        assert!(a[0][1] > a[0][0] && a[0][0] > a[1][0]);
    }

    #[test]
    fn the_kl_penalty_lowers_advantages_where_the_policy_moved_up() {
        let mut a = vec![1.0, 1.0, 1.0];
        fold_kl(
            &mut a,
            &[0.0, 1.0, 1.0],
            &[-1.0, -1.0, -2.0],
            &[-2.0, -2.0, -1.0],
            0.5,
        );
        assert_eq!(a, vec![1.0, 0.5, 1.5]);
    }
}
