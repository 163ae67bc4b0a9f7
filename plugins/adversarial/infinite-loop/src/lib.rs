//! Loops forever in `step`: the epoch deadline must end the call (`timeout`).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct InfiniteLoop;

impl Misbehaviour for InfiniteLoop {
    const NAME: &'static str = "infinite-loop";

    fn new(_config: &str, _seed: u64) -> Self {
        InfiniteLoop
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let mut counter = action.len() as u64;
        loop {
            counter =
                std::hint::black_box(counter.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

opentinker_sdk::export_environment!(Adversary<InfiniteLoop>);
