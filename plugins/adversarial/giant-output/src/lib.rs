//! Answers `step` with an 8 MiB message: above the output limit (`output_too_large`), well below
//! the memory cap.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct GiantOutput;

fn info() -> EnvInfo {
    EnvInfo {
        name: "giant-output".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

impl Environment for GiantOutput {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(GiantOutput)
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        let huge = "x".repeat(8 << 20);
        Ok(StepResult::end(vec![0.0]).say(0, Message::user(huge)))
    }
}

opentinker_sdk::export_environment!(GiantOutput);
