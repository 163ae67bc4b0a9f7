//! Two policies on one task: a *proposer* (player 0) writes an addition or subtraction problem
//! with two whole numbers within stated bounds, a *solver* (player 1) answers it. Each has its
//! own reward: the proposer 1 when its problem is well formed and within the bounds, the solver 1
//! when its reply's last number is the answer. When the proposal is not a valid problem the
//! solver gets one generated from the seed instead, so that it always plays.
//!
//! The task (generated from the seed) states the operation and the bounds:
//! `{"op": "+", "low": 4, "high": 12}`, and with `stated_answer` the problem's answer too
//! (`"answer": 13`), and with `stated_first` the first number, the second to differ from it
//! (`"first": 9`): a proposer paid for any valid problem settles on the easiest one (`4 + 4`),
//! one given the answer or the first number has no trivial problem to settle on.
//!
//! Config (JSON): `role`: `"both"` (default; two players), `"proposer"` (player 0 proposes,
//! and the episode ends: how a proposer is evaluated on its own) or `"solver"` (player 0 answers
//! a problem generated from the seed: how a solver is evaluated on its own); `stated_answer`
//! (false: whether the task names the answer the problem must have); `stated_first` (false:
//! whether it names the problem's first number).
//! Metrics: `valid` (the proposal was a problem within the bounds), `correct` (the solver's
//! answer was right).

use opentinker_sdk::text::last_number;
use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

/// What a generated task states besides its operation and bounds.
#[derive(Clone, Copy, Debug)]
struct Stated {
    answer: bool,
    first: bool,
}

/// The largest upper bound of a task with an answer or a first number (such a task lists its
/// problems).
const MAX_BOUND: i64 = 1000;

/// The solver's answer format, as `plugins/word-problems` states it.
const FORMAT: &str = "End your reply with the answer as a number.";

/// Who plays: both policies, or one of them alone as player 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    #[default]
    Both,
    Proposer,
    Solver,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    role: Role,
    stated_answer: bool,
    stated_first: bool,
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    if config.trim().is_empty() {
        return Ok(Config::default());
    }
    serde_json::from_str(config).map_err(|e| PluginError::new(format!("propose-solve config: {e}")))
}

/// The JSON Schema of [`Config`], for the component's metadata.
const CONFIG_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "role": {"enum": ["both", "proposer", "solver"], "default": "both"},
    "stated_answer": {"type": "boolean", "default": false},
    "stated_first": {"type": "boolean", "default": false}
  }
}"#;

/// The operation a problem uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    #[serde(rename = "+")]
    Add,
    #[serde(rename = "-")]
    Subtract,
}

impl Op {
    fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Subtract => '-',
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Add => "an addition",
            Op::Subtract => "a subtraction",
        }
    }

    fn apply(self, a: i64, b: i64) -> i64 {
        match self {
            Op::Add => a + b,
            Op::Subtract => a - b,
        }
    }
}

/// What the proposer is asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub op: Op,
    pub low: i64,
    pub high: i64,
    /// The answer the problem must have, when the task states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<i64>,
    /// The problem's first number, when the task states it (the second must then differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<i64>,
}

impl Task {
    fn generate(seed: u64, stated: Stated) -> Task {
        let mut rng = SeededRng::new(seed);
        let op = if rng.chance(0.5) {
            Op::Add
        } else {
            Op::Subtract
        };
        let low = rng.range(1, 10);
        let task = Task {
            op,
            low,
            high: low + rng.range(3, 10),
            answer: None,
            first: None,
        };
        let answer = stated.answer.then(|| task.example(seed).answer());
        // A subtraction's stated first number leaves a smaller, different second one.
        let lowest_first = match op {
            Op::Add => task.low,
            Op::Subtract => task.low + 1,
        };
        let mut rng = SeededRng::new(seed ^ 0xf125_7000);
        let first = stated.first.then(|| rng.range(lowest_first, task.high));
        Task {
            answer,
            first,
            ..task
        }
    }

    /// The proposer's instruction.
    fn instruction(&self) -> String {
        let (op, low, high) = (self.op, self.low, self.high);
        let order = match op {
            Op::Add => "",
            Op::Subtract => ", the larger number first",
        };
        let answer = match self.answer {
            Some(answer) => format!(" whose answer is {answer},"),
            None => String::new(),
        };
        let numbers = match (self.first, op) {
            (Some(first), Op::Add) => format!(
                "whose first number is {first} and whose second is a different whole number \
                 from {low} to {high}"
            ),
            (Some(first), Op::Subtract) => format!(
                "whose first number is {first} and whose second is a smaller whole number from \
                 {low} to {high}"
            ),
            (None, _) => format!("with two whole numbers from {low} to {high}{order}"),
        };
        format!(
            "Write {} problem for a student{answer} {numbers}. Reply with the problem only, \
             written as: number {} number",
            op.name(),
            op.symbol()
        )
    }

    /// Whether `problem` is one this task asks for.
    fn accepts(&self, problem: &Problem) -> bool {
        let bounds = self.low..=self.high;
        problem.op == self.op
            && bounds.contains(&problem.a)
            && bounds.contains(&problem.b)
            && (problem.op == Op::Add || problem.a >= problem.b)
            && self.answer.is_none_or(|answer| problem.answer() == answer)
            && self
                .first
                .is_none_or(|first| problem.a == first && problem.b != first)
    }

    /// Whether the task states more than its operation and bounds.
    fn states_more(&self) -> bool {
        self.answer.is_some() || self.first.is_some()
    }

    /// The problems this task accepts, in order.
    fn problems(&self) -> Vec<Problem> {
        let numbers = || self.low..=self.high;
        numbers()
            .flat_map(|a| numbers().map(move |b| (a, b)))
            .map(|(a, b)| Problem { a, op: self.op, b })
            .filter(|problem| self.accepts(problem))
            .collect()
    }

    /// A valid problem of this task drawn from `seed` (`None` when a stated answer has none).
    fn example(&self, seed: u64) -> Problem {
        let mut rng = SeededRng::new(seed ^ 0x5eed_5017);
        if self.states_more() {
            let problems = self.problems();
            let index = rng.range(0, problems.len().saturating_sub(1) as i64) as usize;
            return problems[index];
        }
        let (x, y) = (
            rng.range(self.low, self.high),
            rng.range(self.low, self.high),
        );
        let (a, b) = match self.op {
            Op::Add => (x, y),
            Op::Subtract => (x.max(y), x.min(y)),
        };
        Problem { a, op: self.op, b }
    }
}

/// `a op b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub a: i64,
    pub op: Op,
    pub b: i64,
}

impl Problem {
    /// The first `A + B` or `A - B` in `text` (spaces around the sign allowed; a minus may be
    /// written `−` or `–`).
    pub fn find(text: &str) -> Option<Problem> {
        let chars: Vec<char> = text.chars().collect();
        let number = |i: &mut usize| -> Option<i64> {
            let start = *i;
            while *i < chars.len() && chars[*i].is_ascii_digit() {
                *i += 1;
            }
            let digits: String = chars[start..*i].iter().collect();
            digits.parse().ok()
        };
        let skip_spaces = |i: &mut usize| {
            while *i < chars.len() && chars[*i] == ' ' {
                *i += 1;
            }
        };
        let mut start = 0;
        while start < chars.len() {
            let starts_number =
                chars[start].is_ascii_digit() && (start == 0 || !chars[start - 1].is_ascii_digit());
            if starts_number {
                let mut i = start;
                if let Some(a) = number(&mut i) {
                    skip_spaces(&mut i);
                    let op = match chars.get(i) {
                        Some('+') => Some(Op::Add),
                        Some('-' | '−' | '–') => Some(Op::Subtract),
                        _ => None,
                    };
                    if let Some(op) = op {
                        i += 1;
                        skip_spaces(&mut i);
                        if let Some(b) = number(&mut i) {
                            return Some(Problem { a, op, b });
                        }
                    }
                }
            }
            start += 1;
        }
        None
    }

    fn answer(&self) -> i64 {
        self.op.apply(self.a, self.b)
    }

    fn question(&self) -> String {
        format!(
            "What is {} {} {}? {FORMAT}",
            self.a,
            self.op.symbol(),
            self.b
        )
    }
}

pub struct ProposeSolve {
    role: Role,
    task: Task,
    seed: u64,
    /// The problem the solver answers, once it is set.
    problem: Option<Problem>,
}

impl Environment for ProposeSolve {
    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }

    fn info() -> EnvInfo {
        EnvInfo {
            name: "propose-solve".into(),
            players: 2,
            max_turns: 2,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let stated = Stated {
            answer: config.stated_answer,
            first: config.stated_first,
        };
        serde_json::to_string(&Task::generate(seed, stated)).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, seed: u64) -> Result<Self, PluginError> {
        let role = parse_config(config)?.role;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("propose-solve task: {e}")))?;
        if task.low < 0 || task.high < task.low {
            return Err(PluginError::new(
                "propose-solve task: the bounds must satisfy 0 <= low <= high",
            ));
        }
        if task.states_more() && task.high > MAX_BOUND {
            return Err(PluginError::new(format!(
                "propose-solve task: with an answer or a first number, the bounds must be at \
                 most {MAX_BOUND}"
            )));
        }
        if task.states_more() && task.problems().is_empty() {
            let stated: Vec<String> = [
                task.answer.map(|answer| format!("the answer {answer}")),
                task.first.map(|first| format!("the first number {first}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            return Err(PluginError::new(format!(
                "propose-solve task: no problem within the bounds has {}",
                stated.join(" and ")
            )));
        }
        // A solver on its own answers a problem of the task from the seed.
        let problem = (role == Role::Solver).then(|| task.example(seed));
        Ok(ProposeSolve {
            role,
            task,
            seed,
            problem,
        })
    }

    fn observe(&mut self, player: u32) -> Result<Vec<Message>, PluginError> {
        let proposing = player == 0 && self.role != Role::Solver;
        let text = match (proposing, self.problem) {
            (true, _) => self.task.instruction(),
            (false, Some(problem)) => problem.question(),
            (false, None) => {
                return Err(PluginError::new(
                    "propose-solve: the solver was asked before the proposer proposed",
                ));
            }
        };
        Ok(vec![Message::user(text)])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        match (self.role, self.problem) {
            // The proposal: valid problems go to the solver; otherwise one from the seed does.
            (Role::Both | Role::Proposer, None) => {
                let proposed = Problem::find(action).filter(|p| self.task.accepts(p));
                let valid = if proposed.is_some() { 1.0 } else { 0.0 };
                if self.role == Role::Proposer {
                    return Ok(StepResult::end(vec![valid, 0.0]).metric("valid", valid));
                }
                self.problem = Some(proposed.unwrap_or_else(|| self.task.example(self.seed)));
                Ok(StepResult::next(vec![valid, 0.0], 1).metric("valid", valid))
            }
            // The answer, by player 1 after a proposal or by player 0 alone.
            (role, Some(problem)) => {
                let correct = if last_number(action) == Some(problem.answer() as f64) {
                    1.0
                } else {
                    0.0
                };
                let rewards = match role {
                    Role::Solver => vec![correct, 0.0],
                    _ => vec![0.0, correct],
                };
                Ok(StepResult::end(rewards).metric("correct", correct))
            }
            (Role::Solver, None) => Err(PluginError::new("propose-solve: no problem to solve")),
        }
    }

    fn demonstration(&mut self) -> Option<String> {
        Some(match self.problem {
            None => {
                let problem = self.task.example(self.seed);
                format!("{} {} {}", problem.a, problem.op.symbol(), problem.b)
            }
            Some(problem) => format!("The answer is {}.", problem.answer()),
        })
    }
}

opentinker_sdk::export_environment!(ProposeSolve);

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> String {
        r#"{"op": "-", "low": 4, "high": 12}"#.to_string()
    }

    fn env(role: &str) -> ProposeSolve {
        ProposeSolve::new(&format!(r#"{{"role": "{role}"}}"#), &task(), 7).unwrap()
    }

    #[test]
    fn generated_tasks_are_reproducible_and_their_examples_valid() {
        let mut ops = (0, 0);
        for seed in 0..300 {
            let text = ProposeSolve::generate_task("{}", seed).unwrap();
            assert_eq!(text, ProposeSolve::generate_task("{}", seed).unwrap());
            let task: Task = serde_json::from_str(&text).unwrap();
            assert!(task.low >= 1 && task.high >= task.low + 3, "{task:?}");
            assert!(task.accepts(&task.example(seed)), "{task:?}");
            match task.op {
                Op::Add => ops.0 += 1,
                Op::Subtract => ops.1 += 1,
            }
        }
        assert!(ops.0 > 100 && ops.1 > 100, "{ops:?}");
    }

    #[test]
    fn problems_are_found_in_their_written_forms() {
        let found = |text: &str| Problem::find(text).map(|p| (p.a, p.op, p.b));
        assert_eq!(found("12 - 5"), Some((12, Op::Subtract, 5)));
        assert_eq!(found("Sure! What is 7+8 = ?"), Some((7, Op::Add, 8)));
        assert_eq!(found("Problem: 10 − 3."), Some((10, Op::Subtract, 3)));
        assert_eq!(found("Take 2024, 12 - 5"), Some((12, Op::Subtract, 5)));
        assert_eq!(found("twelve minus five"), None);
        assert_eq!(found("12 -"), None);
    }

    #[test]
    fn the_proposer_is_rewarded_for_a_problem_within_the_bounds() {
        let reward = |reply: &str| {
            let result = env("both").step(reply).unwrap();
            assert_eq!(result.next_player, Some(1));
            assert_eq!(result.rewards[1], 0.0);
            result.rewards[0]
        };
        assert_eq!(reward("12 - 4"), 1.0);
        assert_eq!(reward("Here it is: 9 - 9 = ?"), 1.0);
        assert_eq!(reward("4 - 12"), 0.0, "the larger number first");
        assert_eq!(reward("13 - 4"), 0.0, "above the bounds");
        assert_eq!(reward("12 + 4"), 0.0, "the wrong operation");
        assert_eq!(reward("I cannot"), 0.0);
    }

    #[test]
    fn the_solver_answers_the_proposal_or_the_seeds_problem() {
        let mut game = env("both");
        game.step("11 - 5").unwrap();
        let shown = game.observe(1).unwrap();
        assert_eq!(shown[0].content, format!("What is 11 - 5? {FORMAT}"));
        let result = game.step("11 - 5 = 6").unwrap();
        assert_eq!(result.rewards, vec![0.0, 1.0]);
        assert_eq!(result.next_player, None);

        // An invalid proposal: the solver still plays, on a problem of the task.
        let mut game = env("both");
        game.step("no idea").unwrap();
        let question = game.observe(1).unwrap().remove(0).content;
        let problem = Problem::find(&question).unwrap();
        assert!(game.task.accepts(&problem), "{question}");
        let reply = format!("It is {}", problem.answer());
        assert_eq!(game.step(&reply).unwrap().rewards, vec![0.0, 1.0]);
    }

    #[test]
    fn each_role_plays_alone_as_player_zero() {
        let mut proposer = env("proposer");
        assert!(
            proposer.observe(0).unwrap()[0]
                .content
                .contains("from 4 to 12")
        );
        let result = proposer.step("12 - 4").unwrap();
        assert_eq!((result.rewards, result.next_player), (vec![1.0, 0.0], None));

        let mut solver = env("solver");
        let question = solver.observe(0).unwrap().remove(0).content;
        let problem = Problem::find(&question).unwrap();
        let result = solver.step(&problem.answer().to_string()).unwrap();
        assert_eq!((result.rewards, result.next_player), (vec![1.0, 0.0], None));
        let mut solver = env("solver");
        let result = solver.step("-1000").unwrap();
        assert_eq!(result.rewards, vec![0.0, 0.0]);
    }

    #[test]
    fn demonstrations_earn_the_rewards() {
        let mut game = env("both");
        let proposal = game.demonstration().unwrap();
        assert_eq!(game.step(&proposal).unwrap().rewards[0], 1.0);
        let answer = game.demonstration().unwrap();
        assert_eq!(game.step(&answer).unwrap().rewards[1], 1.0);
    }

    /// The proposer's reward for `reply` to `task` (JSON).
    fn proposal_reward(task: &str, reply: &str) -> f64 {
        let mut game = ProposeSolve::new("{}", task, 3).unwrap();
        game.step(reply).unwrap().rewards[0]
    }

    #[test]
    fn a_stated_answer_is_part_of_the_task() {
        let config = r#"{"stated_answer": true}"#;
        for seed in 0..200 {
            let text = ProposeSolve::generate_task(config, seed).unwrap();
            let task: Task = serde_json::from_str(&text).unwrap();
            let answer = task.answer.unwrap();
            let example = task.example(seed);
            assert!(task.accepts(&example), "{task:?} {example:?}");
            assert_eq!(example.answer(), answer);
            // Without the setting the task is the one it always was.
            let plain: Task =
                serde_json::from_str(&ProposeSolve::generate_task("{}", seed).unwrap()).unwrap();
            assert_eq!(
                Task {
                    answer: None,
                    ..task
                },
                plain
            );
            let text = ProposeSolve::generate_task(r#"{"stated_first": true}"#, seed).unwrap();
            let task: Task = serde_json::from_str(&text).unwrap();
            let example = task.example(seed);
            assert!(task.accepts(&example), "{task:?} {example:?}");
            assert_eq!(Some(example.a), task.first);
            assert_eq!(
                Task {
                    first: None,
                    ..task
                },
                plain
            );
        }
        let task = r#"{"op": "-", "low": 4, "high": 12, "answer": 5}"#;
        let mut game = ProposeSolve::new("{}", task, 3).unwrap();
        let instruction = game.observe(0).unwrap().remove(0).content;
        assert!(instruction.contains("whose answer is 5,"), "{instruction}");
        let reward = |reply: &str| proposal_reward(task, reply);
        assert_eq!(reward("11 - 6"), 1.0);
        assert_eq!(reward("12 - 4"), 0.0, "the wrong answer");
        assert_eq!(reward("5 - 0"), 0.0, "below the bounds");
        let proposal = game.demonstration().unwrap();
        assert_eq!(game.step(&proposal).unwrap().rewards[0], 1.0, "{proposal}");
    }

    #[test]
    fn a_stated_first_number_leaves_the_second_to_the_proposer() {
        let task = r#"{"op": "-", "low": 4, "high": 12, "first": 9}"#;
        let mut game = ProposeSolve::new("{}", task, 3).unwrap();
        let instruction = game.observe(0).unwrap().remove(0).content;
        assert!(instruction.contains("first number is 9"), "{instruction}");
        let reward = |reply: &str| proposal_reward(task, reply);
        assert_eq!(reward("9 - 4"), 1.0);
        assert_eq!(reward("9 - 9"), 0.0, "the same number twice");
        assert_eq!(reward("10 - 4"), 0.0, "another first number");
        assert_eq!(reward("9 - 3"), 0.0, "below the bounds");
        let proposal = game.demonstration().unwrap();
        assert_eq!(game.step(&proposal).unwrap().rewards[0], 1.0, "{proposal}");
        let err = ProposeSolve::new("{}", r#"{"op": "-", "low": 4, "high": 12, "first": 4}"#, 1)
            .err()
            .unwrap();
        assert!(err.message.contains("the first number 4"), "{err}");
    }

    #[test]
    fn bad_config_and_task_are_named() {
        let err = ProposeSolve::generate_task(r#"{"role": "judge"}"#, 1).unwrap_err();
        assert!(err.message.contains("judge"), "{err}");
        let err = ProposeSolve::new("{}", r#"{"op": "*", "low": 1, "high": 2}"#, 1)
            .err()
            .unwrap();
        assert!(err.message.contains("propose-solve task"), "{err}");
        let err = ProposeSolve::new("{}", r#"{"op": "+", "low": 5, "high": 2}"#, 1)
            .err()
            .unwrap();
        assert!(err.message.contains("bounds"), "{err}");
        let err = ProposeSolve::new("{}", r#"{"op": "+", "low": 5, "high": 9, "answer": 3}"#, 1)
            .err()
            .unwrap();
        assert!(err.message.contains("the answer 3"), "{err}");
    }
}
