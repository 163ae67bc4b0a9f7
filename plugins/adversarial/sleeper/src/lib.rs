//! Sleeps in a loop in `step`. The virtual clock makes each sleep return at once, so the guest
//! spins through host calls until the epoch deadline ends it (`timeout`).

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct Sleeper;

fn info() -> EnvInfo {
    EnvInfo {
        name: "sleeper".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

impl Environment for Sleeper {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(Sleeper)
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

opentinker_sdk::export_environment!(Sleeper);
