//! An environment that declares 100,000,000 players, which would make the host allocate (and
//! call `observe`) per player: refused from `info()` as `invalid_output`.

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct Crowd;

impl Misbehaviour for Crowd {
    const NAME: &'static str = "crowd";
    const PLAYERS: u32 = 100_000_000;

    fn new(_config: &str, _seed: u64) -> Self {
        Crowd
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        Ok(StepResult::end(vec![0.0; Self::PLAYERS as usize]))
    }
}

opentinker_sdk::export_environment!(Adversary<Crowd>);
