//! Agent plugins: one instance per player per episode, so an agent may keep state between turns.

use super::contract::AgentGuest;
use super::error::{CallError, ErrorKind};
use super::limits::Limits;
use super::loader::Plugin;
use super::sandbox::{Sandbox, guarded_call};
use super::types::{Message, OutputSize, message_bytes};

/// An agent instance serving one player in one episode.
pub struct AgentSession {
    sandbox: Sandbox,
    guest: AgentGuest,
}

impl Plugin {
    /// A fresh agent instance for `player` in one episode, started under `config`; a config the
    /// agent refuses is its `PluginError`.
    pub async fn start_agent(
        &self,
        config: &str,
        player: u32,
        seed: u64,
        limits: &Limits,
    ) -> Result<AgentSession, CallError> {
        let indices = self.0.agent.as_ref().ok_or_else(|| {
            CallError::new(ErrorKind::InvalidRequest, "the plugin is not an agent")
        })?;
        let mut sandbox = self.0.sandbox(limits, seed).await?;
        let mut guest = indices
            .load(&mut sandbox.store, &sandbox.instance)
            .map_err(|e| CallError::new(ErrorKind::InvalidRequest, format!("{e:#}")))?;
        guarded_call!(&mut sandbox, config.len(), |store| guest
            .start(store, config, player, seed))?
        .map_err(|e| sandbox.fail(CallError::new(ErrorKind::PluginError, e.message)))?;
        Ok(AgentSession { sandbox, guest })
    }
}

impl AgentSession {
    /// The messages the policy sees, given the conversation so far.
    pub async fn prompt(&mut self, history: &[Message]) -> Result<Vec<Message>, CallError> {
        let guest = &self.guest;
        let messages = guarded_call!(&mut self.sandbox, message_bytes(history), |store| guest
            .prompt(store, history))?
        .map_err(|e| {
            self.sandbox
                .fail(CallError::new(ErrorKind::PluginError, e.message))
        })?;
        self.sandbox.check_output(OutputSize::messages(&messages))?;
        Ok(messages)
    }

    /// The action in a sampled completion.
    pub async fn act(&mut self, completion: &str) -> Result<String, CallError> {
        let guest = &self.guest;
        let action = guarded_call!(&mut self.sandbox, completion.len(), |store| guest
            .act(store, completion))?
        .map_err(|e| {
            self.sandbox
                .fail(CallError::new(ErrorKind::PluginError, e.message))
        })?;
        self.sandbox.check_output(OutputSize::text(&action))?;
        Ok(action)
    }
}
