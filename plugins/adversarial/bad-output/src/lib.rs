//! Step results that break the contract, chosen by config `{"break": ...}`: `"nan"` (a NaN
//! reward), `"infinite"` (an infinite reward), `"length"` (two rewards for one player), `"player"`
//! (names player 5 to move), `"recipient"` (messages for player 9). Each must end the episode with
//! `invalid_output`.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct BadOutput {
    how: String,
}

impl Environment for BadOutput {
    fn info() -> EnvInfo {
        EnvInfo {
            name: "bad-output".into(),
            players: 1,
            max_turns: 5,
        }
    }

    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }

    fn new(config: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        let how = ["nan", "infinite", "length", "player", "recipient"]
            .into_iter()
            .find(|how| config.contains(&format!("\"{how}\"")))
            .unwrap_or("nan");
        Ok(BadOutput { how: how.into() })
    }

    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![Message::user("Say anything.")])
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        Ok(match self.how.as_str() {
            "nan" => StepResult::end(vec![f64::NAN]),
            "infinite" => StepResult::end(vec![f64::INFINITY]),
            "length" => StepResult::end(vec![1.0, 1.0]),
            "player" => StepResult::next(vec![0.0], 5),
            _ => StepResult::end(vec![0.0]).say(9, Message::user("to nobody")),
        })
    }
}

opentinker_sdk::export_environment!(BadOutput);
