//! Step results that break the contract, chosen by config `{"break": ...}`: `"nan"` (a NaN
//! reward), `"infinite"` (an infinite reward), `"length"` (two rewards for one player), `"player"`
//! (names player 5 to move), `"recipient"` (messages for player 9). Each must end the episode with
//! `invalid_output`. And two that cost the host without breaking the contract: `"flood"` (100,000
//! empty messages, no text bytes at all: `output_too_large` by item count) and `"long-error"` (a
//! `plugin-error` of 200,000 bytes: `plugin_error`, its message cut to the host's limit).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{Message, PluginError, StepResult};

pub struct BadOutput {
    how: String,
}

impl Misbehaviour for BadOutput {
    const NAME: &'static str = "bad-output";

    fn new(config: &str, _seed: u64) -> Self {
        let how = [
            "nan",
            "infinite",
            "length",
            "player",
            "recipient",
            "flood",
            "long-error",
        ]
        .into_iter()
        .find(|how| config.contains(&format!("\"{how}\"")))
        .unwrap_or("nan");
        BadOutput { how: how.into() }
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        Ok(match self.how.as_str() {
            "nan" => StepResult::end(vec![f64::NAN]),
            "infinite" => StepResult::end(vec![f64::INFINITY]),
            "length" => StepResult::end(vec![1.0, 1.0]),
            "player" => StepResult::next(vec![0.0], 5),
            "flood" => StepResult {
                messages: vec![(0, vec![Message::new("", ""); 100_000])],
                ..StepResult::next(vec![0.0], 0)
            },
            "long-error" => return Err(PluginError::new("x".repeat(200_000))),
            _ => StepResult::end(vec![0.0]).say(9, Message::user("to nobody")),
        })
    }
}

opentinker_sdk::export_environment!(Adversary<BadOutput>);
