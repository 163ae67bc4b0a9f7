//! Sleeps in a loop in `step`. The virtual clock makes each sleep return at once, so the guest
//! spins through host calls until the epoch deadline ends it (`timeout`).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct Sleeper;

impl Misbehaviour for Sleeper {
    const NAME: &'static str = "sleeper";

    fn new(_config: &str, _seed: u64) -> Self {
        Sleeper
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

opentinker_sdk::export_environment!(Adversary<Sleeper>);
