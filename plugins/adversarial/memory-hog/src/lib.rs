//! Allocates without end in `step`: the memory cap refuses the growth and the guest aborts
//! (`memory_limit`).

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct MemoryHog;

fn info() -> EnvInfo {
    EnvInfo {
        name: "memory-hog".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

impl Environment for MemoryHog {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(MemoryHog)
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

opentinker_sdk::export_environment!(MemoryHog);
