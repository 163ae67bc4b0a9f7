//! Grid walk: the policy stands on a square grid and must reach a goal, one step a turn (`up`,
//! `down`, `left` or `right`), within a turn limit. One of the environments issue 41 chooses
//! RL's defaults on (a multi-turn search), not one of the examples. Each turn shows both
//! positions, so the right step can be read from them.
//!
//! Reward 1 for reaching the goal, else 0. A step off the grid stays in place (the `bumps`
//! metric counts them); a reply that is not a direction ends the episode. Demonstrations are of
//! modest quality: a step towards the goal with probability `demonstration_accuracy`, otherwise
//! a random direction.
//!
//! Config (JSON): `{"size": 4, "turns": 8, "demonstration_accuracy": 0.6}`.
//! Task (JSON): `{"start": [0, 3], "goal": [2, 1]}` (column, row; row 0 at the top).

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    size: u32,
    turns: u32,
    demonstration_accuracy: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            size: 4,
            turns: 8,
            demonstration_accuracy: 0.6,
        }
    }
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("grid-walk config: {e}")))?
    };
    if !(2..=9).contains(&config.size) {
        return Err(PluginError::new(
            "grid-walk config: `size` must be in 2..=9",
        ));
    }
    if !(1..=50).contains(&config.turns) {
        return Err(PluginError::new(
            "grid-walk config: `turns` must be in 1..=50",
        ));
    }
    if !(0.0..=1.0).contains(&config.demonstration_accuracy) {
        return Err(PluginError::new(
            "grid-walk config: `demonstration_accuracy` must be in 0..=1",
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
    "size": {"type": "integer", "minimum": 2, "maximum": 9, "default": 4},
    "turns": {"type": "integer", "minimum": 1, "maximum": 50, "default": 8},
    "demonstration_accuracy": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.6}
  }
}"#;

/// One walk: where it starts and where the goal is, as (column, row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub start: (u32, u32),
    pub goal: (u32, u32),
}

const DIRECTIONS: [&str; 4] = ["up", "down", "left", "right"];

pub struct GridWalk {
    at: (u32, u32),
    goal: (u32, u32),
    size: u32,
    turns_left: u32,
    bumps: u32,
    demonstration_accuracy: f64,
    demonstration_rng: SeededRng,
}

impl GridWalk {
    fn prompt(&self) -> String {
        let ((x, y), (gx, gy)) = (self.at, self.goal);
        format!(
            "You are at column {x}, row {y}. The goal is at column {gx}, row {gy}. \
             {} moves left. Move up, down, left or right.",
            self.turns_left
        )
    }

    /// The directions that bring the walk closer to the goal.
    fn towards(&self) -> Vec<&'static str> {
        let ((x, y), (gx, gy)) = (self.at, self.goal);
        let mut good = Vec::new();
        if gy < y {
            good.push("up");
        }
        if gy > y {
            good.push("down");
        }
        if gx < x {
            good.push("left");
        }
        if gx > x {
            good.push("right");
        }
        good
    }

    fn end(&self, reward: f64) -> StepResult {
        StepResult::end(vec![reward])
            .metric("bumps", f64::from(self.bumps))
            .metric("invalid_action", 0.0)
    }
}

impl Environment for GridWalk {
    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }

    fn info() -> EnvInfo {
        EnvInfo {
            name: "grid-walk".into(),
            players: 1,
            max_turns: 50,
        }
    }

    fn generate_task(config: &str, seed: u64) -> Result<String, PluginError> {
        let config = parse_config(config)?;
        let mut rng = SeededRng::new(seed);
        let mut cell = || {
            let last = i64::from(config.size - 1);
            (rng.range(0, last) as u32, rng.range(0, last) as u32)
        };
        let start = cell();
        let mut goal = cell();
        while goal == start {
            goal = cell();
        }
        serde_json::to_string(&Task { start, goal }).map_err(PluginError::new)
    }

    fn new(config: &str, task: &str, seed: u64) -> Result<Self, PluginError> {
        let config = parse_config(config)?;
        let task: Task = serde_json::from_str(task)
            .map_err(|e| PluginError::new(format!("grid-walk task: {e}")))?;
        let inside = |(x, y): (u32, u32)| x < config.size && y < config.size;
        if !inside(task.start) || !inside(task.goal) {
            return Err(PluginError::new(
                "grid-walk task: `start` and `goal` must be on the grid",
            ));
        }
        Ok(GridWalk {
            at: task.start,
            goal: task.goal,
            size: config.size,
            turns_left: config.turns,
            bumps: 0,
            demonstration_accuracy: config.demonstration_accuracy,
            demonstration_rng: SeededRng::new(seed ^ 0x5EED_DE30),
        })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![
            Message::system("Walk to the goal, one step a turn. Reply with one direction."),
            Message::user(self.prompt()),
        ])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let word = action.trim().trim_end_matches('.').to_lowercase();
        let (x, y) = self.at;
        let next = match word.as_str() {
            "up" => (x, y.checked_sub(1)),
            "down" => (x, Some(y + 1).filter(|&y| y < self.size)),
            "left" => (x.checked_sub(1).unwrap_or(self.size), Some(y)),
            "right" => (x + 1, Some(y)),
            _ => {
                return Ok(StepResult::end(vec![0.0])
                    .say(0, Message::user(format!("{action:?} is not a direction.")))
                    .metric("bumps", f64::from(self.bumps))
                    .metric("invalid_action", 1.0));
            }
        };
        match next {
            (nx, Some(ny)) if nx < self.size => self.at = (nx, ny),
            _ => self.bumps += 1,
        }
        self.turns_left -= 1;
        if self.at == self.goal {
            return Ok(self.end(1.0));
        }
        if self.turns_left == 0 {
            return Ok(self.end(0.0));
        }
        Ok(StepResult::next(vec![0.0], 0)
            .say(0, Message::user(self.prompt()))
            .metric("invalid_action", 0.0))
    }

    fn demonstration(&mut self) -> Option<String> {
        let good = self.towards();
        let rng = &mut self.demonstration_rng;
        let right = rng.chance(self.demonstration_accuracy);
        let step = match good.is_empty() || !right {
            true => DIRECTIONS[rng.index(DIRECTIONS.len())],
            false => good[rng.index(good.len())],
        };
        Some(step.to_string())
    }
}

opentinker_sdk::export_environment!(GridWalk);

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(task: &str, config: &str) -> GridWalk {
        GridWalk::new(config, task, 0).unwrap()
    }

    /// Plays `policy` to the end; the final reward and the turns taken.
    fn play(mut walk: GridWalk, mut policy: impl FnMut(&mut GridWalk) -> String) -> (f64, u32) {
        for turn in 1..=50 {
            let step = policy(&mut walk);
            let result = walk.step(&step).unwrap();
            if result.next_player.is_none() {
                return (result.rewards[0], turn);
            }
        }
        panic!("the walk did not end");
    }

    #[test]
    fn walking_towards_the_goal_reaches_it_in_the_fewest_turns() {
        let task = r#"{"start": [0, 3], "goal": [2, 1]}"#;
        let (reward, turns) = play(walk(task, "{}"), |w| w.towards()[0].to_string());
        assert_eq!((reward, turns), (1.0, 4));
        // Away from it, the turns run out; off the grid, the walk stays and bumps.
        let (reward, turns) = play(walk(task, "{}"), |_| "down".into());
        assert_eq!((reward, turns), (0.0, 8));
        let mut w = walk(task, "{}");
        let result = w.step("left").unwrap();
        assert_eq!(w.at, (0, 3));
        assert!(result.next_player.is_some());
        let result = w.step("jump").unwrap();
        assert_eq!(result.rewards, vec![0.0]);
        assert_eq!(result.next_player, None);
        let metric = |name: &str| {
            result
                .metrics
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.value)
        };
        assert_eq!(
            (metric("invalid_action"), metric("bumps")),
            (Some(1.0), Some(1.0))
        );
    }

    #[test]
    fn demonstrations_are_directions_and_mostly_reach_the_goal() {
        let mut reached = 0;
        for seed in 0..200 {
            let task = GridWalk::generate_task("{}", seed).unwrap();
            let demo = GridWalk::new("{}", &task, seed).unwrap();
            let (reward, _) = play(demo, |w| {
                let step = w.demonstration().unwrap();
                assert!(DIRECTIONS.contains(&step.as_str()));
                step
            });
            reached += usize::from(reward == 1.0);
        }
        // Better than a random walk, short of always.
        assert!(
            (100..200).contains(&reached),
            "{reached} of 200 reached the goal"
        );
    }

    #[test]
    fn tasks_are_reproducible_and_bad_input_is_named() {
        for seed in 0..50 {
            let text = GridWalk::generate_task("{}", seed).unwrap();
            assert_eq!(text, GridWalk::generate_task("{}", seed).unwrap());
            let task: Task = serde_json::from_str(&text).unwrap();
            assert_ne!(task.start, task.goal);
            assert!(task.goal.0 < 4 && task.goal.1 < 4);
        }
        let err = GridWalk::generate_task(r#"{"size": 1}"#, 0).unwrap_err();
        assert!(err.message.contains("size"), "{err}");
        let err = GridWalk::new("{}", r#"{"start": [0, 4], "goal": [1, 1]}"#, 0)
            .err()
            .unwrap();
        assert!(err.message.contains("on the grid"), "{err}");
    }
}
