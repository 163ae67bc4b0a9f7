//! Recurses without end in `step`: the native stack budget traps (`trap`, stack overflow).

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

pub struct DeepRecursion;

fn info() -> EnvInfo {
    EnvInfo {
        name: "deep-recursion".into(),
        players: 1,
        max_turns: 5,
    }
}

fn observe() -> Result<Vec<Message>, PluginError> {
    Ok(vec![Message::user("Say anything.")])
}

/// Not tail-recursive (the rotate keeps LLVM from turning it into a loop) and with no
/// address-taken locals, so it uses the wasm call stack, not the shadow stack in linear memory.
#[inline(never)]
fn descend(depth: u64) -> u64 {
    if depth == 0 {
        return 1;
    }
    descend(depth - 1).rotate_left(7) ^ depth
}

impl Environment for DeepRecursion {
    fn info() -> EnvInfo {
        info()
    }
    fn generate_task(_: &str, _: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }
    fn new(_: &str, _: &str, _: u64) -> Result<Self, PluginError> {
        Ok(DeepRecursion)
    }
    fn observe(&mut self, _: u32) -> Result<Vec<Message>, PluginError> {
        observe()
    }
    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        let depth = u64::MAX - action.len() as u64;
        Ok(StepResult::end(vec![descend(depth) as f64]))
    }
}

opentinker_sdk::export_environment!(DeepRecursion);
