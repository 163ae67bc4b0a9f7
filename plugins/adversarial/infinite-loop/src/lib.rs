//! Loops forever in `step`: the epoch deadline must end the call (`timeout`).

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct InfiniteLoop;

fn info() -> EnvInfo {
    EnvInfo {
        name: "infinite-loop".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

impl Environment for InfiniteLoop {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(InfiniteLoop)
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let mut counter = action.len() as u64;
        loop {
            counter =
                std::hint::black_box(counter.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

opentinker_sdk::export_environment!(InfiniteLoop);
