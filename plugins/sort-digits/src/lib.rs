//! Sort digits: one reply, the task's digits in ascending order, partial credit. One of the
//! environments issue 41 chooses RL's defaults on (a single-turn task with partial credit), not
//! one of the examples. Data-free: tasks are generated from the seed.
//!
//! The reward is the fraction of places the reply gets right (its first `digits` digits against
//! the sorted ones): a reply with the two middle digits swapped earns 0.5 of 4, one with no
//! digits 0. The `sorted` metric is 1 for a fully sorted reply. Demonstrations are of modest
//! quality, as a user's often are: the sorted digits with probability
//! `demonstration_accuracy`, otherwise the sorted digits with one neighbouring pair swapped.
//!
//! Config (JSON): `{"digits": 4, "demonstration_accuracy": 0.5}`.
//! Task (JSON): `{"digits": [7, 2, 9, 4]}`.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    digits: usize,
    demonstration_accuracy: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            digits: 4,
            demonstration_accuracy: 0.5,
        }
    }
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("sort-digits config: {e}")))?
    };
    if !(2..=9).contains(&config.digits) {
        return Err(PluginError::new(
            "sort-digits config: `digits` must be in 2..=9",
        ));
    }
    if !(0.0..=1.0).contains(&config.demonstration_accuracy) {
        return Err(PluginError::new(
            "sort-digits config: `demonstration_accuracy` must be in 0..=1",
        ));
    }
    Ok(config)
}

/// The JSON Schema of [`Config`], for the component's metadata.
const CONFIG_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "digits": {"type": "integer", "minimum": 2, "maximum": 9, "default": 4},
    "demonstration_accuracy": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5}
  }
}"#;

/// One task: the digits to sort, in the order shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub digits: Vec<u8>,
}

pub struct SortDigits {
    task: Task,
    demonstration_accuracy: f64,
    rng: SeededRng,
}

impl SortDigits {
    fn sorted(&self) -> Vec<u8> {
        let mut sorted = self.task.digits.clone();
        sorted.sort_unstable();
        sorted
    }
}

/// `digits` as the task shows them and a reply gives them: separated by spaces.
fn spaced(digits: &[u8]) -> String {
    digits
        .iter()
        .map(u8::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

impl Environment for SortDigits {
    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }

    fn info() -> EnvInfo {
        EnvInfo {
            name: "sort-digits".into(),
            players: 1,
            max_turns: 1,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let mut rng = SeededRng::new(seed);
        let digits = (0..config.digits).map(|_| rng.range(0, 9) as u8).collect();
        serde_json::to_string(&Task { digits }).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, seed: u64) -> Result<Self, PluginError> {
        let config = parse_config(config)?;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("sort-digits task: {e}")))?;
        if task.digits.len() < 2 || task.digits.iter().any(|&d| d > 9) {
            return Err(PluginError::new(
                "sort-digits task: `digits` must be at least 2 digits of 0..=9",
            ));
        }
        Ok(SortDigits {
            task,
            demonstration_accuracy: config.demonstration_accuracy,
            rng: SeededRng::new(seed),
        })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![
            Message::system("Reply with the digits in ascending order, separated by spaces."),
            Message::user(format!("Sort: {}", spaced(&self.task.digits))),
        ])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let sorted = self.sorted();
        let given: Vec<u8> = action
            .chars()
            .filter_map(|c| c.to_digit(10))
            .map(|d| d as u8)
            .take(sorted.len())
            .collect();
        let right = given.iter().zip(&sorted).filter(|(a, b)| a == b).count();
        let fraction = right as f64 / sorted.len() as f64;
        Ok(StepResult::end(vec![fraction])
            .metric("sorted", if right == sorted.len() { 1.0 } else { 0.0 })
            .metric("invalid_action", if given.is_empty() { 1.0 } else { 0.0 }))
    }

    fn demonstration(&mut self) -> Option<String> {
        let mut answer = self.sorted();
        if !self.rng.chance(self.demonstration_accuracy) {
            let at = self.rng.index(answer.len() - 1);
            answer.swap(at, at + 1);
        }
        Some(spaced(&answer))
    }
}

opentinker_sdk::export_environment!(SortDigits);

#[cfg(test)]
mod tests {
    use super::*;

    fn env(task: &str, config: &str, seed: u64) -> SortDigits {
        SortDigits::new(config, task, seed).unwrap()
    }

    #[test]
    fn each_place_right_earns_its_share() {
        let task = r#"{"digits": [7, 2, 9, 4]}"#;
        let reward = |reply: &str| env(task, "{}", 0).step(reply).unwrap().rewards[0];
        assert_eq!(reward("2 4 7 9"), 1.0);
        assert_eq!(reward("2 7 4 9"), 0.5);
        assert_eq!(reward("9 7 4 2"), 0.0);
        assert_eq!(reward("2 4"), 0.5);
        let result = env(task, "{}", 0).step("no idea").unwrap();
        assert_eq!(result.rewards, vec![0.0]);
        let invalid = result.metrics.iter().find(|m| m.name == "invalid_action");
        assert_eq!(invalid.map(|m| m.value), Some(1.0));
    }

    #[test]
    fn demonstrations_are_right_about_as_often_as_configured() {
        let mut right = 0;
        for seed in 0..400 {
            let task = SortDigits::generate_task("{}", seed).unwrap();
            let mut demo_env = env(&task, r#"{"demonstration_accuracy": 0.5}"#, seed);
            let demo = demo_env.demonstration().unwrap();
            let reward = demo_env.step(&demo).unwrap().rewards[0];
            // A swapped pair of equal digits is still sorted.
            assert!(reward == 1.0 || reward == 0.5, "{task} {demo} {reward}");
            right += usize::from(reward == 1.0);
        }
        assert!((200..=300).contains(&right), "{right} of 400 sorted");
        let task = r#"{"digits": [3, 1, 2]}"#;
        let perfect = env(task, r#"{"demonstration_accuracy": 1.0}"#, 9).demonstration();
        assert_eq!(perfect.as_deref(), Some("1 2 3"));
    }

    #[test]
    fn tasks_are_reproducible_and_bad_input_is_named() {
        for seed in 0..50 {
            let text = SortDigits::generate_task(r#"{"digits": 5}"#, seed).unwrap();
            assert_eq!(
                text,
                SortDigits::generate_task(r#"{"digits": 5}"#, seed).unwrap()
            );
            let task: Task = serde_json::from_str(&text).unwrap();
            assert_eq!(task.digits.len(), 5);
        }
        let err = SortDigits::generate_task(r#"{"digits": 1}"#, 0).unwrap_err();
        assert!(err.message.contains("digits"), "{err}");
        let err = SortDigits::generate_task(r#"{"digitz": 3}"#, 0).unwrap_err();
        assert!(err.message.contains("digitz"), "{err}");
        let err = SortDigits::new("{}", r#"{"digits": [1, 12]}"#, 0)
            .err()
            .unwrap();
        assert!(err.message.contains("0..=9"), "{err}");
    }
}
