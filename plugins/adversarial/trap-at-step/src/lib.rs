//! Rewards steps 1 and 2, then panics at step 3 (`trap` at step 3; the earlier rewards stay in
//! the record).
//!
//! Config (JSON): `{"trap_every": N}` (default 1): only episodes whose seed is a multiple of N
//! trap; the others go on rewarding every step, so a training job sees some episodes fail.

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct TrapAtStep {
    steps: u32,
    traps: bool,
}

impl Misbehaviour for TrapAtStep {
    const NAME: &'static str = "trap-at-step";

    fn new(config: &str, seed: u64) -> Self {
        let every = serde_json::from_str::<serde_json::Value>(config)
            .ok()
            .and_then(|c| c["trap_every"].as_u64())
            .unwrap_or(1)
            .max(1);
        TrapAtStep {
            steps: 0,
            traps: seed.is_multiple_of(every),
        }
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        self.steps += 1;
        if self.traps && self.steps == 3 {
            panic!("deliberate fault at step 3");
        }
        Ok(StepResult::next(vec![0.5], 0))
    }
}

opentinker_sdk::export_environment!(Adversary<TrapAtStep>);
