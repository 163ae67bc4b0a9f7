//! Allocates without end in `step`: the memory cap refuses the growth and the guest aborts
//! (`memory_limit`).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct MemoryHog;

impl Misbehaviour for MemoryHog {
    const NAME: &'static str = "memory-hog";

    fn new(_config: &str, _seed: u64) -> Self {
        MemoryHog
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

opentinker_sdk::export_environment!(Adversary<MemoryHog>);
