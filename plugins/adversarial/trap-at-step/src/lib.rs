//! Rewards steps 1 and 2, then panics at step 3 (`trap` at step 3; the earlier rewards stay in
//! the record).

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct TrapAtStep {
    steps: u32,
}

fn info() -> EnvInfo {
    EnvInfo {
        name: "trap-at-step".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

impl Environment for TrapAtStep {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(TrapAtStep { steps: 0 })
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        self.steps += 1;
        if self.steps == 3 {
            panic!("deliberate fault at step 3");
        }
        Ok(StepResult::next(vec![0.5], 0))
    }
}

opentinker_sdk::export_environment!(TrapAtStep);
