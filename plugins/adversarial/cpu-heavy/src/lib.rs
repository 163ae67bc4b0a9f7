//! Steps that are heavy on the CPU and nothing else: each of its two steps runs `rounds` times
//! (1 + seed % 4) rounds of a hash, and rewards a number drawn from the result. Whether a step
//! fits its fuel budget depends on the seed alone, so the outcome of every seed must be the same
//! however many episodes share the machine.
//!
//! Config (JSON): `{"rounds": N}` (default 1,000,000).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct CpuHeavy {
    rounds: u64,
    state: u64,
    steps: u32,
}

impl Misbehaviour for CpuHeavy {
    const NAME: &'static str = "cpu-heavy";

    fn new(config: &str, seed: u64) -> Self {
        let rounds = serde_json::from_str::<serde_json::Value>(config)
            .ok()
            .and_then(|c| c["rounds"].as_u64())
            .unwrap_or(1_000_000);
        CpuHeavy {
            rounds: rounds.saturating_mul(1 + seed % 4),
            state: seed | 1,
            steps: 0,
        }
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        for _ in 0..self.rounds {
            // xorshift64*, kept opaque to the optimiser by feeding each round into the next.
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            self.state = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        }
        self.steps += 1;
        let reward = (self.state % 100) as f64 / 100.0;
        Ok(if self.steps == 2 {
            StepResult::end(vec![reward])
        } else {
            StepResult::next(vec![reward], 0)
        })
    }
}

opentinker_sdk::export_environment!(Adversary<CpuHeavy>);
