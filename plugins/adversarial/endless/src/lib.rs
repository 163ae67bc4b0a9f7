//! An episode that never ends, from an environment that declares `u32::MAX` turns: the host's
//! own turn limit must end it (`episode_limit`), with its records bounded.

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct Endless;

impl Misbehaviour for Endless {
    const NAME: &'static str = "endless";
    const MAX_TURNS: u32 = u32::MAX;

    fn new(_config: &str, _seed: u64) -> Self {
        Endless
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        Ok(StepResult::next(vec![0.0], 0))
    }
}

opentinker_sdk::export_environment!(Adversary<Endless>);
