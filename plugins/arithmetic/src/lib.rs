//! Arithmetic: one question, `a + b` or `a * b`, one answer. Data-free: tasks are generated from
//! the seed. Reward 1 for the right number (the last number in the reply), else 0; with
//! `"reward": false` the environment gives no reward (a reward plugin such as `math-answer`
//! scores the answer) but still reports the `correct` metric.
//!
//! Config (JSON): `{"max_operand": 99, "operations": ["+", "*"], "reward": true}`.
//! Task (JSON): `{"a": 12, "b": 30, "op": "+", "answer": 42}`.

use opentinker_sdk::text::last_number;
use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    max_operand: i64,
    operations: Vec<String>,
    reward: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_operand: 99,
            operations: vec!["+".into(), "*".into()],
            reward: true,
        }
    }
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("arithmetic config: {e}")))?
    };
    if config.max_operand < 1 || config.max_operand > 1_000_000 {
        return Err(PluginError::new(
            "arithmetic config: `max_operand` must be in 1..=1000000",
        ));
    }
    if config.operations.is_empty() || config.operations.iter().any(|op| op != "+" && op != "*") {
        return Err(PluginError::new(
            "arithmetic config: `operations` must be a non-empty list of \"+\" and \"*\"",
        ));
    }
    Ok(config)
}

/// The JSON Schema of [`Config`], for the component's metadata: the host checks a job's config
/// against it before any work.
const CONFIG_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "max_operand": {"type": "integer", "minimum": 1, "maximum": 1000000, "default": 99},
    "operations": {
      "type": "array", "minItems": 1, "items": {"enum": ["+", "*"]}, "default": ["+", "*"]
    },
    "reward": {"type": "boolean", "default": true}
  }
}"#;

/// One problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub a: i64,
    pub b: i64,
    pub op: String,
    pub answer: i64,
}

pub struct Arithmetic {
    task: Task,
    /// Whether the environment rewards the answer itself.
    rewards: bool,
}

impl Environment for Arithmetic {
    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }

    fn info() -> EnvInfo {
        EnvInfo {
            name: "arithmetic".into(),
            players: 1,
            max_turns: 1,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let mut rng = SeededRng::new(seed);
        let a = rng.range(0, config.max_operand);
        let b = rng.range(0, config.max_operand);
        let op = config.operations[rng.index(config.operations.len())].clone();
        let answer = if op == "+" { a + b } else { a * b };
        let task = Task { a, b, op, answer };
        serde_json::to_string(&task).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, _seed: u64) -> Result<Self, PluginError> {
        let config = parse_config(config)?;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("arithmetic task: {e}")))?;
        Ok(Arithmetic {
            task,
            rewards: config.reward,
        })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        let Task { a, b, op, .. } = &self.task;
        Ok(vec![
            Message::system("Solve the problem. End your reply with the answer as a number."),
            Message::user(format!("What is {a} {op} {b}?")),
        ])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let answer = last_number(action);
        let correct = answer == Some(self.task.answer as f64);
        let correct = if correct { 1.0 } else { 0.0 };
        let reward = if self.rewards { correct } else { 0.0 };
        Ok(StepResult::end(vec![reward])
            .metric("correct", correct)
            .metric("invalid_action", if answer.is_none() { 1.0 } else { 0.0 }))
    }

    fn demonstration(&mut self) -> Option<String> {
        Some(format!("The answer is {}.", self.task.answer))
    }
}

opentinker_sdk::export_environment!(Arithmetic);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_its_own_reward_the_answer_is_still_measured() {
        let task = Arithmetic::generate_task("{}", 3).unwrap();
        let answer: Task = serde_json::from_str(&task).unwrap();
        let mut silent = Arithmetic::new(r#"{"reward": false}"#, &task, 0).unwrap();
        let result = silent.step(&answer.answer.to_string()).unwrap();
        assert_eq!(result.rewards, vec![0.0]);
        assert!(
            result
                .metrics
                .iter()
                .any(|m| m.name == "correct" && m.value == 1.0)
        );
        let mut scoring = Arithmetic::new("{}", &task, 0).unwrap();
        assert_eq!(
            scoring.step(&answer.answer.to_string()).unwrap().rewards,
            vec![1.0]
        );
    }

    #[test]
    fn generated_tasks_are_right_and_reproducible() {
        for seed in 0..200 {
            let text = Arithmetic::generate_task("{}", seed).unwrap();
            assert_eq!(text, Arithmetic::generate_task("{}", seed).unwrap());
            let task: Task = serde_json::from_str(&text).unwrap();
            let expected = if task.op == "+" {
                task.a + task.b
            } else {
                task.a * task.b
            };
            assert_eq!(task.answer, expected);
            assert!((0..=99).contains(&task.a) && (0..=99).contains(&task.b));
        }
    }

    #[test]
    fn reward_one_only_for_the_right_final_number() {
        let task = r#"{"a": 12, "b": 30, "op": "+", "answer": 42}"#;
        let mut env = Arithmetic::new("{}", task, 0).unwrap();
        assert_eq!(env.step("12 + 30 = 42").unwrap().rewards, vec![1.0]);
        let mut env = Arithmetic::new("{}", task, 0).unwrap();
        assert_eq!(env.step("42? no, 41").unwrap().rewards, vec![0.0]);
        let mut env = Arithmetic::new("{}", task, 0).unwrap();
        let result = env.step("no idea").unwrap();
        assert_eq!(result.rewards, vec![0.0]);
        assert!(
            result
                .metrics
                .iter()
                .any(|m| m.name == "invalid_action" && m.value == 1.0)
        );
        let mut env = Arithmetic::new("{}", task, 0).unwrap();
        let demo = env.demonstration().unwrap();
        assert_eq!(env.step(&demo).unwrap().rewards, vec![1.0]);
    }

    #[test]
    fn bad_config_and_task_are_named() {
        let err = Arithmetic::generate_task(r#"{"max_operand": 0}"#, 1).unwrap_err();
        assert!(err.message.contains("max_operand"), "{err}");
        let err = Arithmetic::generate_task(r#"{"operations": ["-"]}"#, 1).unwrap_err();
        assert!(err.message.contains("operations"), "{err}");
        let err = Arithmetic::new("{}", "not json", 1).err().unwrap();
        assert!(err.message.contains("arithmetic task"), "{err}");
        let err = Arithmetic::generate_task(r#"{"max_operant": 5}"#, 1).unwrap_err();
        assert!(err.message.contains("max_operant"), "{err}");
    }
}
