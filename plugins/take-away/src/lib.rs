//! Take-away: a pile of stones, the policy and a built-in random opponent take 1 to `max_take`
//! in turn, the policy first; whoever takes the last stone wins. One of the environments issue
//! 41 chooses RL's defaults on (a game against a fixed opponent, several turns), not one of the
//! examples. The winning move leaves a multiple of `max_take + 1`, which a policy can learn from
//! the number it is shown.
//!
//! Rewards: +1 win, -1 loss; a move that is not a number from 1 to `max_take`, or more than the
//! pile, ends the game with -1. Demonstrations are of modest quality: the winning move (where
//! there is one) with probability `demonstration_accuracy`, otherwise a random legal one.
//!
//! Config (JSON): `{"min_stones": 10, "max_stones": 21, "max_take": 3,
//! "demonstration_accuracy": 0.3}`. Task (JSON): `{"stones": 13}`.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    min_stones: u32,
    max_stones: u32,
    max_take: u32,
    demonstration_accuracy: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_stones: 10,
            max_stones: 21,
            max_take: 3,
            demonstration_accuracy: 0.3,
        }
    }
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("take-away config: {e}")))?
    };
    if !(2..=9).contains(&config.max_take) {
        return Err(PluginError::new(
            "take-away config: `max_take` must be in 2..=9",
        ));
    }
    if config.min_stones < 1 || config.min_stones > config.max_stones || config.max_stones > 99 {
        return Err(PluginError::new(
            "take-away config: `min_stones` to `max_stones` must be a range within 1..=99",
        ));
    }
    if !(0.0..=1.0).contains(&config.demonstration_accuracy) {
        return Err(PluginError::new(
            "take-away config: `demonstration_accuracy` must be in 0..=1",
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
    "min_stones": {"type": "integer", "minimum": 1, "maximum": 99, "default": 10},
    "max_stones": {"type": "integer", "minimum": 1, "maximum": 99, "default": 21},
    "max_take": {"type": "integer", "minimum": 2, "maximum": 9, "default": 3},
    "demonstration_accuracy": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.3}
  }
}"#;

/// One game: the pile it starts with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub stones: u32,
}

pub struct TakeAway {
    stones: u32,
    max_take: u32,
    demonstration_accuracy: f64,
    /// The opponent's moves.
    rng: SeededRng,
    /// The demonstrations' choices, a stream of their own.
    demonstration_rng: SeededRng,
}

impl TakeAway {
    fn prompt(&self) -> String {
        let most = self.max_take.min(self.stones);
        format!("There are {} stones. Take 1 to {most}.", self.stones)
    }

    /// The move that leaves the opponent a multiple of `max_take + 1`, when there is one.
    fn winning_move(&self) -> Option<u32> {
        let take = self.stones % (self.max_take + 1);
        (take > 0).then_some(take)
    }

    fn random_move(rng: &mut SeededRng, stones: u32, max_take: u32) -> u32 {
        rng.range(1, i64::from(max_take.min(stones))) as u32
    }
}

impl Environment for TakeAway {
    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }

    fn info() -> EnvInfo {
        EnvInfo {
            name: "take-away".into(),
            players: 1,
            max_turns: 50,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let mut rng = SeededRng::new(seed);
        let stones = rng.range(i64::from(config.min_stones), i64::from(config.max_stones)) as u32;
        serde_json::to_string(&Task { stones }).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, seed: u64) -> Result<Self, PluginError> {
        let config = parse_config(config)?;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("take-away task: {e}")))?;
        if task.stones == 0 {
            return Err(PluginError::new(
                "take-away task: `stones` must be at least 1",
            ));
        }
        Ok(TakeAway {
            stones: task.stones,
            max_take: config.max_take,
            demonstration_accuracy: config.demonstration_accuracy,
            rng: SeededRng::new(seed),
            demonstration_rng: SeededRng::new(seed ^ 0x5EED_DE30),
        })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![
            Message::system(
                "Take-away: you and your opponent take stones from a pile in turn. Whoever \
                 takes the last stone wins. Reply with how many stones you take.",
            ),
            Message::user(self.prompt()),
        ])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let take = action.trim().trim_end_matches('.').parse::<u32>().ok();
        let legal = take.filter(|t| (1..=self.max_take.min(self.stones)).contains(t));
        let Some(take) = legal else {
            return Ok(StepResult::end(vec![-1.0])
                .say(
                    0,
                    Message::user(format!("{action:?} is not a move: you lose.")),
                )
                .metric("invalid_action", 1.0));
        };
        self.stones -= take;
        if self.stones == 0 {
            return Ok(StepResult::end(vec![1.0]).metric("invalid_action", 0.0));
        }
        let reply = Self::random_move(&mut self.rng, self.stones, self.max_take);
        self.stones -= reply;
        if self.stones == 0 {
            let text = format!("The opponent took {reply}, the last: you lose.");
            return Ok(StepResult::end(vec![-1.0])
                .say(0, Message::user(text))
                .metric("invalid_action", 0.0));
        }
        let text = format!("The opponent took {reply}. {}", self.prompt());
        Ok(StepResult::next(vec![0.0], 0)
            .say(0, Message::user(text))
            .metric("invalid_action", 0.0))
    }

    fn demonstration(&mut self) -> Option<String> {
        let right = self.demonstration_rng.chance(self.demonstration_accuracy);
        let take = match self.winning_move() {
            Some(take) if right => take,
            _ => Self::random_move(&mut self.demonstration_rng, self.stones, self.max_take),
        };
        Some(take.to_string())
    }
}

opentinker_sdk::export_environment!(TakeAway);

#[cfg(test)]
mod tests {
    use super::*;

    fn game(stones: u32, config: &str, seed: u64) -> TakeAway {
        TakeAway::new(config, &format!(r#"{{"stones": {stones}}}"#), seed).unwrap()
    }

    /// Plays `policy` to the end; the final reward.
    fn play(mut game: TakeAway, policy: impl Fn(&TakeAway) -> String) -> f64 {
        for _ in 0..50 {
            let result = game.step(&policy(&game)).unwrap();
            if result.next_player.is_none() {
                return result.rewards[0];
            }
        }
        panic!("the game did not end");
    }

    #[test]
    fn the_winning_move_always_wins_and_an_illegal_one_loses() {
        let winning = |g: &TakeAway| g.winning_move().unwrap_or(1).to_string();
        for seed in 0..100 {
            // 13 is not a multiple of 4: the first player wins with the right moves.
            assert_eq!(play(game(13, "{}", seed), winning), 1.0, "seed {seed}");
        }
        let mut g = game(13, "{}", 0);
        let result = g.step("4").unwrap();
        assert_eq!(result.rewards, vec![-1.0]);
        assert_eq!(result.next_player, None);
        let mut g = game(2, "{}", 0);
        assert_eq!(g.step("3").unwrap().rewards, vec![-1.0]);
        assert_eq!(game(2, "{}", 0).step("2").unwrap().rewards, vec![1.0]);
    }

    #[test]
    fn random_play_wins_sometimes_and_demonstrations_are_legal_and_partly_right() {
        let random = |g: &TakeAway| {
            let mut rng = SeededRng::new(u64::from(g.stones) * 7);
            TakeAway::random_move(&mut rng, g.stones, g.max_take).to_string()
        };
        let wins = (0..200)
            .filter(|&s| play(game(13 + (s % 8) as u32, "{}", s), random) > 0.0)
            .count();
        assert!((40..=160).contains(&wins), "random play won {wins} of 200");
        let (mut right, mut positions) = (0, 0);
        for seed in 0..400 {
            let mut g = game(10 + (seed % 12) as u32, "{}", seed);
            let demo: u32 = g.demonstration().unwrap().parse().unwrap();
            assert!((1..=3).contains(&demo) && demo <= g.stones);
            if let Some(best) = g.winning_move() {
                positions += 1;
                right += usize::from(demo == best);
            }
        }
        // 30% chosen, and a third of the random rest by chance: about 0.53.
        let share = right as f64 / positions as f64;
        assert!((0.4..0.67).contains(&share), "{share}");
    }

    #[test]
    fn tasks_are_reproducible_and_bad_input_is_named() {
        for seed in 0..50 {
            let text = TakeAway::generate_task("{}", seed).unwrap();
            assert_eq!(text, TakeAway::generate_task("{}", seed).unwrap());
            let task: Task = serde_json::from_str(&text).unwrap();
            assert!((10..=21).contains(&task.stones));
        }
        let err = TakeAway::generate_task(r#"{"max_take": 1}"#, 0).unwrap_err();
        assert!(err.message.contains("max_take"), "{err}");
        let err =
            TakeAway::generate_task(r#"{"min_stones": 30, "max_stones": 20}"#, 0).unwrap_err();
        assert!(err.message.contains("min_stones"), "{err}");
        let err = TakeAway::new("{}", r#"{"stones": 0}"#, 0).err().unwrap();
        assert!(err.message.contains("stones"), "{err}");
    }
}
