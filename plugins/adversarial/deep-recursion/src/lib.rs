//! Recurses without end in `step`: the native stack budget traps (`trap`, stack overflow).

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct DeepRecursion;

/// Not tail-recursive (the rotate keeps LLVM from turning it into a loop) and with no
/// address-taken locals, so it uses the wasm call stack, not the shadow stack in linear memory.
#[inline(never)]
fn descend(depth: u64) -> u64 {
    if depth == 0 {
        return 1;
    }
    descend(depth - 1).rotate_left(7) ^ depth
}

impl Misbehaviour for DeepRecursion {
    const NAME: &'static str = "deep-recursion";

    fn new(_config: &str, _seed: u64) -> Self {
        DeepRecursion
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let depth = u64::MAX - action.len() as u64;
        Ok(StepResult::end(vec![descend(depth) as f64]))
    }
}

opentinker_sdk::export_environment!(Adversary<DeepRecursion>);
