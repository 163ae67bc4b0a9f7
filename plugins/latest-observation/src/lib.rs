//! Latest observation: an agent that shows the policy only the environment's latest message,
//! not the conversation so far. In a game whose every observation is the whole state (the
//! current tic-tac-toe board), the policy loses nothing, and each turn's prompt stays short
//! instead of growing with the game: every turn becomes a datum of its own.
//!
//! The action is the completion's first line, trimmed.

use opentinker_sdk::{Agent, Message, PluginError};

/// The agent of one player: it keeps nothing between turns.
pub struct LatestObservation;

impl Agent for LatestObservation {
    fn new(_config: &str, _player: u32, _seed: u64) -> Result<Self, PluginError> {
        Ok(LatestObservation)
    }

    fn prompt(&mut self, history: Vec<Message>) -> Result<Vec<Message>, PluginError> {
        let latest = history
            .into_iter()
            .rev()
            .find(|m| m.role != "assistant")
            .ok_or_else(|| {
                PluginError::new("latest-observation: the history has no observation")
            })?;
        Ok(vec![Message::user(latest.content)])
    }

    fn act(&mut self, completion: &str) -> Result<String, PluginError> {
        Ok(completion.lines().next().unwrap_or("").trim().to_string())
    }
}

opentinker_sdk::export_agent!(LatestObservation);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_only_the_latest_observation() {
        let history = vec![
            Message::system("rules"),
            Message::user("board 1"),
            Message::assistant("5"),
            Message::user("board 2"),
        ];
        let mut agent = LatestObservation::new("{}", 0, 0).unwrap();
        let prompt = agent.prompt(history).unwrap();
        assert_eq!(prompt, vec![Message::user("board 2")]);
        assert!(agent.prompt(vec![Message::assistant("5")]).is_err());
    }

    #[test]
    fn the_action_is_the_first_line_trimmed() {
        let mut agent = LatestObservation::new("{}", 0, 0).unwrap();
        assert_eq!(agent.act(" 7 \nmore").unwrap(), "7");
        assert_eq!(agent.act("").unwrap(), "");
    }
}
