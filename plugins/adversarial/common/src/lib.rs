//! The harmless parts shared by the adversarial plugins: each is a one-player environment whose
//! `step` (or construction) misbehaves in one way, which the sandbox must contain.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, StepResult};

/// One way of misbehaving.
pub trait Misbehaviour: Sized + 'static {
    /// The environment's name.
    const NAME: &'static str;
    /// The players and turn limit `info()` declares.
    const PLAYERS: u32 = 1;
    const MAX_TURNS: u32 = 5;

    /// Start an episode under `config` with the episode's seed.
    fn new(config: &str, seed: u64) -> Self;

    /// The misbehaving step.
    fn step(&mut self, action: &str) -> Result<StepResult, PluginError>;
}

/// An environment that asks for anything and then misbehaves as `M` does.
pub struct Adversary<M>(M);

impl<M: Misbehaviour> Environment for Adversary<M> {
    fn info() -> EnvInfo {
        EnvInfo {
            name: M::NAME.into(),
            players: M::PLAYERS,
            max_turns: M::MAX_TURNS,
        }
    }

    fn generate_task(_config: &str, _seed: u64) -> Result<String, PluginError> {
        Ok("{}".into())
    }

    fn new(config: &str, _task: &str, seed: u64) -> Result<Self, PluginError> {
        Ok(Adversary(M::new(config, seed)))
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![Message::user("Say anything.")])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        self.0.step(action)
    }
}
