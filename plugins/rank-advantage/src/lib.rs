//! An advantage estimator the host does not have: each episode's return ranked within its group
//! and centred to [-1, 1] (ties share their mean rank), the same for each of its turns. Ranks
//! ignore the scale of rewards, so one outlier cannot dominate a group.

use opentinker_sdk::{Advantage, PluginError};

pub struct Rank;

impl Advantage for Rank {
    fn advantages(_config: &str, group: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, PluginError> {
        let returns: Vec<f64> = group.iter().map(|turns| turns.iter().sum()).collect();
        let n = returns.len();
        Ok(group
            .iter()
            .zip(&returns)
            .map(|(turns, r)| {
                let below = returns.iter().filter(|o| *o < r).count() as f64;
                let equal = returns.iter().filter(|o| *o == r).count() as f64;
                let rank = below + (equal - 1.0) / 2.0;
                let centred = if n > 1 {
                    2.0 * rank / (n - 1) as f64 - 1.0
                } else {
                    0.0
                };
                vec![centred; turns.len()]
            })
            .collect())
    }
}

opentinker_sdk::export_advantage!(Rank);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_centred_and_ties_share_them() {
        // Returns 1, 5, 1, -3: ranks 1.5, 3, 1.5, 0 of 0..=3.
        let group = vec![vec![0.0, 1.0], vec![5.0], vec![1.0], vec![-3.0]];
        let advantages = Rank::advantages("{}", &group).unwrap();
        assert_eq!(
            advantages,
            vec![vec![0.0, 0.0], vec![1.0], vec![0.0], vec![-1.0]]
        );
        assert_eq!(
            Rank::advantages("{}", &[vec![2.0]]).unwrap(),
            vec![vec![0.0]]
        );
    }
}
