//! Word problems for a chat model: one short story with a question (how many apples now, how
//! many in each bag), one reply. Data-free: problems are generated from the seed at a
//! difficulty. The question states the answer format, "End your reply with the answer as a
//! number."; the reward is 1 when the reply's last number is the problem's answer, else 0 (a
//! reply that runs on past its answer, or ends on another number, scores 0).
//!
//! Difficulty 1: one addition or subtraction of numbers up to 10. 2: one of `+ - × ÷` with
//! numbers up to 20 (products and quotients of factors up to 10). 3: two steps (buy then give
//! away, boxes then loose items) with numbers up to 50.
//!
//! Config (JSON): `{"difficulty": 1, "reward": true}`; with `"reward": false` the environment
//! gives no reward (a reward plugin such as `math-answer` scores the reply) but still reports
//! its metrics.
//! Task (JSON): `{"question": "...", "answer": 8, "steps": "3 + 5 = 8"}`.
//! Metrics: `correct` (the reward's value), `ends_with_number` (the reply's last word is a
//! number, as the format asks).

use opentinker_sdk::text::last_number;
use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

/// The answer format, stated after each question; the reward reads the reply's last number.
const FORMAT: &str = "End your reply with the answer as a number.";

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    difficulty: u32,
    reward: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            difficulty: 1,
            reward: true,
        }
    }
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("word-problems config: {e}")))?
    };
    if !(1..=3).contains(&config.difficulty) {
        return Err(PluginError::new(
            "word-problems config: `difficulty` must be 1, 2 or 3",
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
    "difficulty": {"type": "integer", "minimum": 1, "maximum": 3, "default": 1},
    "reward": {"type": "boolean", "default": true}
  }
}"#;

/// One problem: the question, its answer and the arithmetic that reaches it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub question: String,
    pub answer: i64,
    pub steps: String,
}

const NAMES: [&str; 10] = [
    "Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Emma", "Ravi", "Zoe",
];
const ITEMS: [&str; 10] = [
    "apples", "pencils", "marbles", "stickers", "cookies", "books", "shells", "cards", "eggs",
    "coins",
];

/// A problem of `difficulty` from the generator `rng`.
fn generate(difficulty: u32, rng: &mut SeededRng) -> Task {
    let name = NAMES[rng.index(NAMES.len())];
    let items = ITEMS[rng.index(ITEMS.len())];
    let story = rng.index(2);
    match difficulty {
        1 => {
            if rng.chance(0.5) {
                add(name, items, story, rng.range(1, 10), rng.range(1, 10))
            } else {
                let a = rng.range(2, 10);
                subtract(name, items, story, a, rng.range(1, a - 1))
            }
        }
        2 => match rng.index(4) {
            0 => add(name, items, story, rng.range(2, 20), rng.range(2, 20)),
            1 => {
                let a = rng.range(3, 20);
                subtract(name, items, story, a, rng.range(1, a - 1))
            }
            2 => multiply(name, items, story, rng.range(2, 10), rng.range(2, 10)),
            _ => divide(name, items, story, rng.range(2, 10), rng.range(2, 10)),
        },
        _ => {
            if rng.chance(0.5) {
                let (a, b) = (rng.range(5, 50), rng.range(2, 50));
                let c = rng.range(1, (a + b - 1).min(50));
                Task {
                    question: format!(
                        "{name} has {a} {items}, buys {b} more, then gives {c} away. How many \
                         {items} does {name} have now?"
                    ),
                    answer: a + b - c,
                    steps: format!("{a} + {b} = {}, {} - {c} = {}", a + b, a + b, a + b - c),
                }
            } else {
                let (a, b, c) = (rng.range(2, 9), rng.range(2, 9), rng.range(1, 50));
                Task {
                    question: format!(
                        "{name} has {a} boxes with {b} {items} in each box and {c} more {items} \
                         outside the boxes. How many {items} does {name} have in all?"
                    ),
                    answer: a * b + c,
                    steps: format!("{a} × {b} = {}, {} + {c} = {}", a * b, a * b, a * b + c),
                }
            }
        }
    }
}

fn add(name: &str, items: &str, story: usize, a: i64, b: i64) -> Task {
    let question = if story == 0 {
        format!("{name} has {a} {items} and gets {b} more. How many {items} does {name} have now?")
    } else {
        format!(
            "There are {a} {items} in a basket. {name} puts in {b} more. How many {items} are in \
             the basket now?"
        )
    };
    let answer = a + b;
    Task {
        question,
        answer,
        steps: format!("{a} + {b} = {answer}"),
    }
}

fn subtract(name: &str, items: &str, story: usize, a: i64, b: i64) -> Task {
    let question = if story == 0 {
        format!(
            "{name} has {a} {items} and gives {b} to a friend. How many {items} does {name} have \
             left?"
        )
    } else {
        format!(
            "There are {a} {items} on a table. {name} takes {b} of them away. How many {items} \
             are left on the table?"
        )
    };
    let answer = a - b;
    Task {
        question,
        answer,
        steps: format!("{a} - {b} = {answer}"),
    }
}

fn multiply(name: &str, items: &str, story: usize, a: i64, b: i64) -> Task {
    let question = if story == 0 {
        format!(
            "{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} buy \
             in all?"
        )
    } else {
        format!(
            "There are {a} rows of {items} with {b} {items} in each row. How many {items} are there?"
        )
    };
    let answer = a * b;
    Task {
        question,
        answer,
        steps: format!("{a} × {b} = {answer}"),
    }
}

fn divide(name: &str, items: &str, story: usize, friends: i64, each: i64) -> Task {
    let total = friends * each;
    let question = if story == 0 {
        format!(
            "{name} shares {total} {items} equally among {friends} friends. How many {items} does \
             each friend get?"
        )
    } else {
        format!(
            "{name} puts {total} {items} into {friends} bags, the same number in each bag. How \
             many {items} are in each bag?"
        )
    };
    Task {
        question,
        answer: each,
        steps: format!("{total} ÷ {friends} = {each}"),
    }
}

/// Whether the reply ends with a number (trailing punctuation aside), as the format asks.
pub fn ends_with_number(reply: &str) -> bool {
    reply
        .trim_end()
        .trim_end_matches(['.', '!', '*', ')'])
        .ends_with(|c: char| c.is_ascii_digit())
}

pub struct WordProblems {
    task: Task,
    /// Whether the environment rewards the answer itself.
    rewards: bool,
}

impl Environment for WordProblems {
    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }

    fn info() -> EnvInfo {
        EnvInfo {
            name: "word-problems".into(),
            players: 1,
            max_turns: 1,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let task = generate(config.difficulty, &mut SeededRng::new(seed));
        serde_json::to_string(&task).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, _seed: u64) -> Result<Self, PluginError> {
        let config = parse_config(config)?;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("word-problems task: {e}")))?;
        Ok(WordProblems {
            task,
            rewards: config.reward,
        })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![Message::user(format!(
            "{} {FORMAT}",
            self.task.question
        ))])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let correct = if last_number(action) == Some(self.task.answer as f64) {
            1.0
        } else {
            0.0
        };
        let reward = if self.rewards { correct } else { 0.0 };
        let formatted = if ends_with_number(action) { 1.0 } else { 0.0 };
        Ok(StepResult::end(vec![reward])
            .metric("correct", correct)
            .metric("ends_with_number", formatted))
    }

    fn demonstration(&mut self) -> Option<String> {
        Some(format!(
            "{}. The answer is {}.",
            self.task.steps, self.task.answer
        ))
    }
}

opentinker_sdk::export_environment!(WordProblems);

#[cfg(test)]
mod tests {
    use super::*;

    fn task(difficulty: u32, seed: u64) -> Task {
        let config = format!(r#"{{"difficulty": {difficulty}}}"#);
        serde_json::from_str(&WordProblems::generate_task(&config, seed).unwrap()).unwrap()
    }

    /// The answer the numbers in `steps` reach: each step's result is its last number.
    fn evaluate(steps: &str) -> i64 {
        let mut result = 0;
        for step in steps.split(", ") {
            let (expression, claimed) = step.split_once(" = ").unwrap();
            let parts: Vec<&str> = expression.split(' ').collect();
            let (a, op, b) = (
                parts[0].parse::<i64>().unwrap(),
                parts[1],
                parts[2].parse::<i64>().unwrap(),
            );
            result = match op {
                "+" => a + b,
                "-" => a - b,
                "×" => a * b,
                "÷" => {
                    assert_eq!(a % b, 0, "{step}: not a whole quotient");
                    a / b
                }
                other => panic!("unknown operation {other}"),
            };
            assert_eq!(result, claimed.parse::<i64>().unwrap(), "{step}");
        }
        result
    }

    #[test]
    fn generated_problems_are_right_reproducible_and_in_their_bounds() {
        // The largest number a question of each difficulty states (a quotient's total is a
        // product of two factors up to 10).
        for (difficulty, largest) in [(1, 10), (2, 100), (3, 50)] {
            for seed in 0..300 {
                let task = task(difficulty, seed);
                assert_eq!(task, self::task(difficulty, seed));
                assert_eq!(evaluate(&task.steps), task.answer, "{task:?}");
                assert!(task.answer >= 0, "{task:?}");
                let stated = task
                    .question
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|n| n.parse::<i64>().ok());
                for number in stated {
                    assert!((1..=largest).contains(&number), "{task:?}");
                }
            }
        }
    }

    #[test]
    fn difficulty_two_uses_all_four_operations() {
        let steps: String = (0..200).map(|seed| task(2, seed).steps).collect();
        for op in ['+', '-', '×', '÷'] {
            assert!(steps.contains(op), "no {op} in 200 problems");
        }
    }

    #[test]
    fn only_the_right_last_number_earns_the_reward() {
        let problem = r#"{"question": "q", "answer": 8, "steps": "3 + 5 = 8"}"#;
        let outcome = |reply: &str| {
            let mut env = WordProblems::new("{}", problem, 0).unwrap();
            let result = env.step(reply).unwrap();
            let metric = |name: &str| {
                result
                    .metrics
                    .iter()
                    .find(|m| m.name == name)
                    .map(|m| m.value)
            };
            assert_eq!(metric("correct"), Some(result.rewards[0]));
            (result.rewards[0], metric("ends_with_number").unwrap())
        };
        assert_eq!(outcome("3 + 5 = 8"), (1.0, 1.0));
        assert_eq!(outcome("3 + 5 = 8. The answer is 8."), (1.0, 1.0));
        assert_eq!(outcome("The answer is **8**"), (1.0, 1.0));
        assert_eq!(
            outcome("She has 8 apples."),
            (1.0, 0.0),
            "right, not in the format"
        );
        assert_eq!(outcome("8 apples, then 2 more days"), (0.0, 0.0));
        assert_eq!(outcome("3 + 5 = 80"), (0.0, 1.0));
        assert_eq!(outcome("8.5"), (0.0, 1.0));
        assert_eq!(outcome("eight"), (0.0, 0.0));
        let mut env = WordProblems::new("{}", problem, 0).unwrap();
        let demonstration = env.demonstration().unwrap();
        assert_eq!(env.step(&demonstration).unwrap().rewards, vec![1.0]);
    }

    #[test]
    fn the_question_states_the_format() {
        let problem = r#"{"question": "How many?", "answer": 8, "steps": "3 + 5 = 8"}"#;
        let mut env = WordProblems::new("{}", problem, 0).unwrap();
        let messages = env.observe(0).unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].role, "user");
        assert_eq!(messages[0].content, format!("How many? {FORMAT}"));
    }

    #[test]
    fn without_its_own_reward_the_answer_is_still_measured() {
        let problem = r#"{"question": "q", "answer": 8, "steps": "3 + 5 = 8"}"#;
        let mut env = WordProblems::new(r#"{"reward": false}"#, problem, 0).unwrap();
        let result = env.step("8").unwrap();
        assert_eq!(result.rewards, vec![0.0]);
        assert!(
            result
                .metrics
                .iter()
                .any(|m| m.name == "correct" && m.value == 1.0)
        );
    }

    #[test]
    fn bad_config_and_task_are_named() {
        let err = WordProblems::generate_task(r#"{"difficulty": 4}"#, 1).unwrap_err();
        assert!(err.message.contains("difficulty"), "{err}");
        let err = WordProblems::generate_task(r#"{"level": 2}"#, 1).unwrap_err();
        assert!(err.message.contains("level"), "{err}");
        let err = WordProblems::new("{}", "not json", 1).err().unwrap();
        assert!(err.message.contains("word-problems task"), "{err}");
    }
}
