//! Guess the number: a secret in 1..=N; each guess is answered "higher" or "lower" until the
//! policy finds it or runs out of turns. Finding it on turn t of T gives reward (T - t + 1) / T,
//! so fewer turns earn more; running out gives 0. A reply with no number is an invalid action:
//! it costs a turn and is told so.
//!
//! Demonstrations split what the hints still allow at `split` (`"demonstrations": "binary"`,
//! default, with `"split": 0.5`: binary search; a smaller split is a consistent but slower
//! searcher, so RL has turns to save), or guess a random number the hints allow (`"random"`).
//!
//! Config (JSON): `{"max": 100, "turns": 10, "demonstrations": "binary", "split": 0.5}`. Task
//! (JSON): `{"secret": 37}`.

use opentinker_sdk::text::last_number;
use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

/// The most turns any config may allow (`info().max_turns`).
const MAX_TURNS: u32 = 32;

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    max: u32,
    turns: u32,
    demonstrations: Demonstrations,
    split: f64,
    /// Restate the range the hints allow after each hint, so the latest message is the whole
    /// state (an agent may then show the policy that message alone).
    show_range: bool,
}

/// Where demonstration guesses come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Demonstrations {
    #[default]
    Binary,
    Random,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max: 100,
            turns: 10,
            demonstrations: Demonstrations::Binary,
            split: 0.5,
            show_range: false,
        }
    }
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("guess-number config: {e}")))?
    };
    if config.max < 2 {
        return Err(PluginError::new(
            "guess-number config: `max` must be at least 2",
        ));
    }
    if !(0.0..=1.0).contains(&config.split) {
        return Err(PluginError::new(
            "guess-number config: `split` must be in 0..=1",
        ));
    }
    if config.turns == 0 || config.turns > MAX_TURNS {
        return Err(PluginError::new(format!(
            "guess-number config: `turns` must be in 1..={MAX_TURNS}"
        )));
    }
    Ok(config)
}

#[derive(Debug, Serialize, Deserialize)]
struct Task {
    secret: u32,
}

pub struct GuessNumber {
    secret: u32,
    config: Config,
    turn: u32,
    /// What the hints so far allow: the secret is in `low..=high`.
    low: u32,
    high: u32,
    /// Draws random demonstrations.
    rng: SeededRng,
}

impl Environment for GuessNumber {
    fn info() -> EnvInfo {
        EnvInfo {
            name: "guess-number".into(),
            players: 1,
            max_turns: MAX_TURNS,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let secret = SeededRng::new(seed).range(1, i64::from(config.max)) as u32;
        serde_json::to_string(&Task { secret }).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, seed: u64) -> Result<Self, PluginError> {
        let config = parse_config(config)?;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("guess-number task: {e}")))?;
        if !(1..=config.max).contains(&task.secret) {
            return Err(PluginError::new(format!(
                "guess-number task: secret {} is outside 1..={}",
                task.secret, config.max
            )));
        }
        let high = config.max;
        Ok(GuessNumber {
            secret: task.secret,
            config,
            turn: 0,
            low: 1,
            high,
            // Not the task's own stream: a job may seed the task and the episode alike, and the
            // first random guess would then be the secret.
            rng: SeededRng::new(seed ^ 0xD3E0_5EED_0000_0001),
        })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![
            Message::system("Find the secret number. Reply with one number per turn."),
            Message::user(format!(
                "I am thinking of a number from 1 to {}. You have {} guesses. Your guess?",
                self.config.max, self.config.turns
            )),
        ])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        self.turn += 1;
        let turns_left = self.config.turns - self.turn;
        let guess = last_number(action)
            .filter(|g| g.fract() == 0.0 && *g >= 0.0 && *g <= f64::from(u32::MAX));
        let metrics = |result: StepResult, invalid: bool| {
            result.metric("invalid_action", if invalid { 1.0 } else { 0.0 })
        };
        let Some(guess) = guess.map(|g| g as u32) else {
            let result = self.continue_or_end("That is not a number.", turns_left);
            return Ok(metrics(result, true));
        };
        if guess == self.secret {
            let total = f64::from(self.config.turns);
            let reward = (total - f64::from(self.turn) + 1.0) / total;
            let result =
                StepResult::end(vec![reward]).say(0, Message::user(format!("Yes, it is {guess}!")));
            return Ok(metrics(result.metric("found", 1.0), false));
        }
        let hint = if guess < self.secret {
            self.low = self.low.max(guess + 1);
            "Higher."
        } else {
            self.high = self.high.min(guess.saturating_sub(1));
            "Lower."
        };
        Ok(metrics(self.continue_or_end(hint, turns_left), false))
    }

    fn demonstration(&mut self) -> Option<String> {
        let guess = match self.config.demonstrations {
            Demonstrations::Binary => {
                let width = f64::from(self.high - self.low);
                self.low + (width * self.config.split).floor() as u32
            }
            Demonstrations::Random => {
                self.rng.range(i64::from(self.low), i64::from(self.high)) as u32
            }
        };
        Some(guess.to_string())
    }
}

impl GuessNumber {
    fn continue_or_end(&self, hint: &str, turns_left: u32) -> StepResult {
        if turns_left == 0 {
            return StepResult::end(vec![0.0])
                .say(
                    0,
                    Message::user(format!("{hint} No guesses left: it was {}.", self.secret)),
                )
                .metric("found", 0.0);
        }
        let range = match self.config.show_range {
            true => format!(" It is from {} to {}.", self.low, self.high),
            false => String::new(),
        };
        StepResult::next(vec![0.0], 0).say(
            0,
            Message::user(format!(
                "{hint}{range} {turns_left} guesses left. Your guess?"
            )),
        )
    }
}

opentinker_sdk::export_environment!(GuessNumber);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_search_demonstrations_find_every_secret_within_seven_turns() {
        for secret in 1..=100 {
            let task = format!(r#"{{"secret": {secret}}}"#);
            let mut env = GuessNumber::new("{}", &task, 0).unwrap();
            let mut turns = 0;
            loop {
                turns += 1;
                let guess = env.demonstration().unwrap();
                let result = env.step(&guess).unwrap();
                if result.next_player.is_none() {
                    assert!(result.rewards[0] > 0.0, "secret {secret} not found");
                    break;
                }
            }
            assert!(turns <= 7, "secret {secret} took {turns} turns");
        }
    }

    #[test]
    fn the_range_can_be_restated_after_each_hint() {
        let config = r#"{"max": 16, "turns": 6, "show_range": true}"#;
        let mut env = GuessNumber::new(config, r#"{"secret": 11}"#, 0).unwrap();
        let result = env.step("8").unwrap();
        let text = &result.messages[0].1[0].content;
        assert!(text.starts_with("Higher. It is from 9 to 16."), "{text}");
    }

    #[test]
    fn a_quarter_split_is_a_slower_search_than_binary() {
        let total = |config: &str| -> u32 {
            (1..=16u32)
                .map(|secret| {
                    let task = format!(r#"{{"secret": {secret}}}"#);
                    let mut env = GuessNumber::new(config, &task, 0).unwrap();
                    let mut turns = 0;
                    loop {
                        turns += 1;
                        let guess = env.demonstration().unwrap();
                        if env.step(&guess).unwrap().next_player.is_none() {
                            break turns;
                        }
                    }
                })
                .sum()
        };
        // Binary search over 16 numbers: 54 guesses in all (3.375 each).
        assert_eq!(total(r#"{"max": 16, "turns": 32}"#), 54);
        assert!(total(r#"{"max": 16, "turns": 32, "split": 0.25}"#) > 60);
        assert!(GuessNumber::new(r#"{"split": 2}"#, r#"{"secret": 1}"#, 0).is_err());
    }

    #[test]
    fn random_demonstrations_stay_within_the_hints_and_take_longer() {
        let (mut binary_turns, mut random_turns) = (0, 0);
        for secret in 1..=16u32 {
            let task = format!(r#"{{"secret": {secret}}}"#);
            for (config, total) in [
                (r#"{"max": 16, "turns": 32}"#, &mut binary_turns),
                (
                    r#"{"max": 16, "turns": 32, "demonstrations": "random"}"#,
                    &mut random_turns,
                ),
            ] {
                let seed = u64::from(secret);
                let mut env = GuessNumber::new(config, &task, seed).unwrap();
                loop {
                    *total += 1;
                    let guess: u32 = env.demonstration().unwrap().parse().unwrap();
                    assert!(
                        (env.low..=env.high).contains(&guess),
                        "{guess} outside the hints"
                    );
                    if env.step(&guess.to_string()).unwrap().next_player.is_none() {
                        break;
                    }
                }
            }
        }
        assert!(
            random_turns > binary_turns,
            "{random_turns} vs {binary_turns}"
        );
    }

    #[test]
    fn random_demonstrations_do_not_know_the_secret_when_task_and_episode_share_a_seed() {
        let config = r#"{"max": 16, "turns": 6, "demonstrations": "random"}"#;
        let lucky = (0..160u64)
            .filter(|&seed| {
                let task = GuessNumber::generate_task(config, seed).unwrap();
                let secret: Task = serde_json::from_str(&task).unwrap();
                let mut env = GuessNumber::new(config, &task, seed).unwrap();
                env.demonstration() == Some(secret.secret.to_string())
            })
            .count();
        // About one in 16 by chance.
        assert!(lucky < 30, "{lucky} of 160 first guesses were the secret");
    }

    #[test]
    fn fewer_turns_earn_more_and_running_out_earns_nothing() {
        let mut env = GuessNumber::new(r#"{"turns": 4}"#, r#"{"secret": 10}"#, 0).unwrap();
        assert_eq!(env.step("10").unwrap().rewards, vec![1.0]);
        let mut env = GuessNumber::new(r#"{"turns": 4}"#, r#"{"secret": 10}"#, 0).unwrap();
        let first = env.step("50").unwrap();
        assert_eq!(first.next_player, Some(0));
        assert!(first.messages[0].1[0].content.starts_with("Lower."));
        assert_eq!(env.step("10").unwrap().rewards, vec![0.75]);
        let mut env = GuessNumber::new(r#"{"turns": 2}"#, r#"{"secret": 10}"#, 0).unwrap();
        let invalid = env.step("hmm").unwrap();
        assert!(
            invalid
                .metrics
                .iter()
                .any(|m| m.name == "invalid_action" && m.value == 1.0)
        );
        let last = env.step("11").unwrap();
        assert_eq!((last.rewards[0], last.next_player), (0.0, None));
    }

    #[test]
    fn tasks_are_in_range_and_bad_input_is_named() {
        for seed in 0..100 {
            let task: Task =
                serde_json::from_str(&GuessNumber::generate_task(r#"{"max": 20}"#, seed).unwrap())
                    .unwrap();
            assert!((1..=20).contains(&task.secret));
        }
        let err = GuessNumber::new("{}", r#"{"secret": 500}"#, 0)
            .err()
            .unwrap();
        assert!(err.message.contains("outside"), "{err}");
        let err = GuessNumber::new(r#"{"turns": 0}"#, r#"{"secret": 5}"#, 0)
            .err()
            .unwrap();
        assert!(err.message.contains("turns"), "{err}");
    }
}
