//! Answers `step` with an 8 MiB message: above the output limit (`output_too_large`), well below
//! the memory cap.

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{Message, PluginError, StepResult};

pub struct GiantOutput;

impl Misbehaviour for GiantOutput {
    const NAME: &'static str = "giant-output";

    fn new(_config: &str, _seed: u64) -> Self {
        GiantOutput
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        let huge = "x".repeat(8 << 20);
        Ok(StepResult::end(vec![0.0]).say(0, Message::user(huge)))
    }
}

opentinker_sdk::export_environment!(Adversary<GiantOutput>);
