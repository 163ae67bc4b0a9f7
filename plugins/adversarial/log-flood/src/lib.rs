//! Writes 6 MiB to stdout, stderr and the host log in `step`, then ends the episode normally
//! with reward 1: the episode completes, its log is truncated and the dropped bytes are counted.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct LogFlood;

fn info() -> EnvInfo {
    EnvInfo {
        name: "log-flood".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

impl Environment for LogFlood {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(LogFlood)
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        let line = "flood ".repeat(170);
        for _ in 0..2048 {
            println!("{line}");
            eprintln!("{line}");
            opentinker_sdk::log(opentinker_sdk::LogLevel::Info, &line);
        }
        Ok(StepResult::end(vec![1.0]))
    }
}

opentinker_sdk::export_environment!(LogFlood);
