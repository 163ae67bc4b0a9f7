//! Rewards steps 1 and 2, then panics at step 3 (`trap` at step 3; the earlier rewards stay in
//! the record).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct TrapAtStep {
    steps: u32,
}

impl Misbehaviour for TrapAtStep {
    const NAME: &'static str = "trap-at-step";

    fn new(_config: &str) -> Self {
        TrapAtStep { steps: 0 }
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        self.steps += 1;
        if self.steps == 3 {
            panic!("deliberate fault at step 3");
        }
        Ok(StepResult::next(vec![0.5], 0))
    }
}

opentinker_sdk::export_environment!(Adversary<TrapAtStep>);
