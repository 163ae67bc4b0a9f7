//! Tic-tac-toe. Player 0 plays X, player 1 plays O; actions are cell numbers 1-9.
//!
//! Config (JSON): `{"opponent": "random" | "minimax" | "none", "first": "player" | "opponent",
//! "demonstrations": "minimax" | "random"}`.
//! With an opponent (default `random`), the built-in opponent plays O and player 0 is the only one
//! to act; with `"none"` the two players play each other (self-play). Rewards: +1 win, -1 loss,
//! 0 draw; an illegal move ends the episode with -1 for the player who made it. Demonstrations
//! (SFT warm-up data) are perfect moves (`minimax`, default) or random legal moves (`random`:
//! teaches the rules without the strategy, so RL has something left to learn).

mod board;

pub use board::{Board, Cell, Outcome};

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};

/// Who plays O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opponent {
    Random,
    Minimax,
    SelfPlay,
}

/// The JSON config; unknown keys are refused by name.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
struct Config {
    #[serde(default)]
    opponent: OpponentName,
    #[serde(default)]
    first: FirstMover,
    #[serde(default)]
    demonstrations: Demonstrations,
}

/// Where demonstration moves come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Demonstrations {
    #[default]
    Minimax,
    Random,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum OpponentName {
    #[default]
    Random,
    Minimax,
    None,
}

#[derive(Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum FirstMover {
    #[default]
    Player,
    Opponent,
}

/// Parse the config (empty means defaults) into the opponent, whether it opens, and where
/// demonstrations come from.
fn parse_config(config: &str) -> Result<(Opponent, bool, Demonstrations), PluginError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("tictactoe config: {e}")))?
    };
    let opponent = match config.opponent {
        OpponentName::Random => Opponent::Random,
        OpponentName::Minimax => Opponent::Minimax,
        OpponentName::None => Opponent::SelfPlay,
    };
    Ok((
        opponent,
        config.first == FirstMover::Opponent,
        config.demonstrations,
    ))
}

pub struct TicTacToe {
    board: Board,
    opponent: Opponent,
    rng: SeededRng,
    demonstrations: Demonstrations,
    /// Its own stream, so asking for demonstrations does not change the opponent's moves.
    demonstration_rng: SeededRng,
}

const RULES: &str = "We play tic-tac-toe. Cells are numbered 1-9, left to right, top to bottom. \
Reply with the number of a free cell.";

impl TicTacToe {
    fn opponent_move(&mut self) {
        let cell = match self.opponent {
            Opponent::Minimax => self.board.best_move(),
            _ => {
                let free = self.board.free_cells();
                free.get(self.rng.index(free.len())).copied()
            }
        };
        if let Some(cell) = cell {
            self.board.play(cell);
        }
    }

    fn prompt_for_move(&self) -> Message {
        let mark = self.board.to_move().symbol();
        Message::user(format!("{}\nYou play {mark}. Your move?", self.board))
    }

    /// Rewards for the finished game, from X's (player 0's) point of view first.
    fn final_rewards(outcome: Outcome) -> Vec<f64> {
        match outcome {
            Outcome::Win(Cell::X) => vec![1.0, -1.0],
            Outcome::Win(_) => vec![-1.0, 1.0],
            Outcome::Draw | Outcome::Ongoing => vec![0.0, 0.0],
        }
    }
}

impl Environment for TicTacToe {
    fn info() -> EnvInfo {
        EnvInfo {
            name: "tictactoe".into(),
            players: 2,
            max_turns: 9,
        }
    }

    fn generate_task(_config: &str, _seed: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }

    fn new(config: &str, _task: &str, seed: u64) -> Result<Self, PluginError> {
        let (opponent, opponent_first, demonstrations) = parse_config(config)?;
        let mut game = TicTacToe {
            board: Board::new(),
            opponent,
            rng: SeededRng::new(seed),
            demonstrations,
            demonstration_rng: SeededRng::new(seed ^ 0x5EED_DE30),
        };
        if opponent_first && opponent != Opponent::SelfPlay {
            // The opponent opens as X; the policy then plays O but is still player 0.
            game.board = Board::new_with_o_first();
            game.opponent_move();
        }
        Ok(game)
    }

    fn observe(&mut self, player: u32) -> Result<Vec<Message>, PluginError> {
        let mut messages = vec![Message::system(RULES)];
        if player == self.to_act() {
            messages.push(self.prompt_for_move());
        } else {
            messages.push(Message::user(format!(
                "{}\nWait for your turn.",
                self.board
            )));
        }
        Ok(messages)
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let player = self.to_act();
        let cell = action.trim().trim_end_matches('.').parse::<usize>().ok();
        let legal = cell.filter(|c| (1..=9).contains(c) && self.board.is_free(c - 1));
        let Some(cell) = legal else {
            let mut rewards = vec![0.0, 0.0];
            rewards[player as usize] = -1.0;
            return Ok(StepResult::end(rewards)
                .say(
                    player,
                    Message::user(format!("{action:?} is not a free cell: you lose.")),
                )
                .metric("invalid_action", 1.0));
        };
        self.board.play(cell - 1);
        if self.opponent != Opponent::SelfPlay && self.board.outcome() == Outcome::Ongoing {
            self.opponent_move();
        }
        let outcome = self.board.outcome();
        if outcome != Outcome::Ongoing {
            let rewards = self.player_rewards(outcome);
            let text = format!("{}\nGame over: {outcome}.", self.board);
            let mut result = StepResult::end(rewards).say(0, Message::user(text.clone()));
            if self.opponent == Opponent::SelfPlay {
                result = result.say(1, Message::user(text));
            }
            return Ok(result.metric("invalid_action", 0.0));
        }
        let next = self.to_act();
        Ok(StepResult::next(vec![0.0, 0.0], next)
            .say(next, self.prompt_for_move())
            .metric("invalid_action", 0.0))
    }

    fn legal_actions(&self) -> Option<Vec<String>> {
        Some(
            self.board
                .free_cells()
                .iter()
                .map(|c| (c + 1).to_string())
                .collect(),
        )
    }

    fn demonstration(&mut self) -> Option<String> {
        let cell = match self.demonstrations {
            Demonstrations::Minimax => self.board.best_move(),
            Demonstrations::Random => {
                let free = self.board.free_cells();
                if self.board.outcome() != Outcome::Ongoing || free.is_empty() {
                    None
                } else {
                    Some(free[self.demonstration_rng.index(free.len())])
                }
            }
        };
        cell.map(|c| c + 1).map(|c| c.to_string())
    }

    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }
}

/// The JSON Schema of [`Config`], for the component's metadata.
const CONFIG_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "opponent": {"enum": ["random", "minimax", "none"], "default": "random"},
    "first": {"enum": ["player", "opponent"], "default": "player"},
    "demonstrations": {"enum": ["minimax", "random"], "default": "minimax"}
  }
}"#;

impl TicTacToe {
    /// The player whose turn it is: in self-play the mark to move decides; against the built-in
    /// opponent the policy (player 0) is the only one who acts.
    fn to_act(&self) -> u32 {
        match self.opponent {
            Opponent::SelfPlay if self.board.to_move() == Cell::O => 1,
            _ => 0,
        }
    }

    fn player_rewards(&self, outcome: Outcome) -> Vec<f64> {
        let mut rewards = Self::final_rewards(outcome);
        if self.board.policy_plays_o() && self.opponent != Opponent::SelfPlay {
            rewards.swap(0, 1);
        }
        rewards
    }
}

opentinker_sdk::export_environment!(TicTacToe);

#[cfg(test)]
mod tests {
    use super::*;

    fn play(config: &str, seed: u64, moves: &[&str]) -> Vec<StepResult> {
        let mut game = TicTacToe::new(config, "{}", seed).unwrap();
        moves.iter().map(|m| game.step(m).unwrap()).collect()
    }

    #[test]
    fn self_play_win_for_x_rewards_both_players() {
        let results = play(r#"{"opponent": "none"}"#, 1, &["1", "4", "2", "5", "3"]);
        let last = results.last().unwrap();
        assert_eq!(last.rewards, vec![1.0, -1.0]);
        assert_eq!(last.next_player, None);
        assert_eq!(results[0].next_player, Some(1));
        assert_eq!(results[1].next_player, Some(0));
    }

    #[test]
    fn illegal_move_ends_the_game_with_a_penalty() {
        let results = play(r#"{"opponent": "none"}"#, 1, &["5", "5"]);
        let last = results.last().unwrap();
        assert_eq!(last.rewards, vec![0.0, -1.0]);
        assert_eq!(last.next_player, None);
        assert!(
            last.metrics
                .iter()
                .any(|m| m.name == "invalid_action" && m.value == 1.0)
        );
        let junk = play("{}", 1, &["hello"]);
        assert_eq!(junk[0].rewards, vec![-1.0, 0.0]);
    }

    #[test]
    fn minimax_never_loses_against_random_play() {
        for seed in 0..50 {
            let mut game = TicTacToe::new(r#"{"opponent": "minimax"}"#, "{}", seed).unwrap();
            let mut rng = SeededRng::new(seed + 1000);
            loop {
                let legal = game.legal_actions().unwrap();
                let result = game.step(&legal[rng.index(legal.len())]).unwrap();
                if result.next_player.is_none() {
                    assert!(
                        result.rewards[0] <= 0.0,
                        "seed {seed}: random play beat minimax"
                    );
                    break;
                }
            }
        }
    }

    #[test]
    fn demonstrations_draw_against_minimax() {
        let mut game = TicTacToe::new(r#"{"opponent": "minimax"}"#, "{}", 3).unwrap();
        loop {
            let action = game.demonstration().unwrap();
            let result = game.step(&action).unwrap();
            if result.next_player.is_none() {
                assert_eq!(result.rewards, vec![0.0, 0.0]);
                break;
            }
        }
    }

    #[test]
    fn opponent_first_opens_and_policy_plays_o() {
        let mut game = TicTacToe::new(r#"{"first": "opponent"}"#, "{}", 9).unwrap();
        assert_eq!(game.legal_actions().unwrap().len(), 8);
        let text = &game.observe(0).unwrap()[1].content;
        assert!(text.contains("You play O"), "{text}");
    }

    #[test]
    fn random_demonstrations_are_legal_and_leave_the_opponent_alone() {
        let config = r#"{"demonstrations": "random"}"#;
        let mut game = TicTacToe::new(config, "{}", 5).unwrap();
        let mut plain = TicTacToe::new("{}", "{}", 5).unwrap();
        let mut moves = std::collections::BTreeSet::new();
        loop {
            let action = game.demonstration().unwrap();
            assert!(game.legal_actions().unwrap().contains(&action));
            moves.insert(action.clone());
            let (result, same) = (game.step(&action).unwrap(), plain.step(&action).unwrap());
            assert_eq!(result, same, "the opponent played differently");
            if result.next_player.is_none() {
                break;
            }
        }
        assert_eq!(game.demonstration(), None);
    }

    #[test]
    fn bad_config_names_the_key() {
        let err = TicTacToe::new(r#"{"opponent": "grandmaster"}"#, "{}", 0)
            .err()
            .unwrap();
        assert!(err.message.contains("grandmaster"), "{}", err.message);
    }

    #[test]
    fn same_seed_same_game() {
        let a = play("{}", 42, &["5", "1", "9"]);
        let b = play("{}", 42, &["5", "1", "9"]);
        assert_eq!(a, b);
    }
}
