//! The data that crosses the plugin boundary, as the host sees it: generated from the WIT
//! records (with serde), plus the size accounting that the output limit uses.

pub use super::bindings::exports::opentinker::plugin::environment::StepResult;
pub use super::bindings::opentinker::plugin::types::{
    EnvInfo, Message, Metric, PluginError as GuestError, Transcript,
};

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Bytes of text in messages, the measure of the input and output limits.
pub(crate) fn message_bytes(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| m.role.len() + m.content.len())
        .sum()
}

pub(crate) fn transcript_bytes(transcripts: &[Transcript]) -> usize {
    transcripts.iter().map(|t| message_bytes(&t.messages)).sum()
}

impl StepResult {
    pub(crate) fn output_bytes(&self) -> usize {
        let messages: usize = self.messages.iter().map(|(_, m)| message_bytes(m)).sum();
        let metrics: usize = self.metrics.iter().map(|m| m.name.len() + 8).sum();
        messages + metrics + self.rewards.len() * 8
    }
}
