//! Writes 6 MiB to stdout, stderr and the host log in `step`, then ends the episode normally
//! with reward 1: the episode completes, its log is truncated and the dropped bytes are counted.

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct LogFlood;

impl Misbehaviour for LogFlood {
    const NAME: &'static str = "log-flood";

    fn new(_config: &str, _seed: u64) -> Self {
        LogFlood
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

opentinker_sdk::export_environment!(Adversary<LogFlood>);
