//! The data that crosses the plugin boundary, as the host sees it: generated from 0.2's WIT
//! records, which 0.3 shares (with serde; `contract` adapts the others to them), plus the size
//! accounting that the output limit uses.

use super::inspect::PluginKind;

pub use super::bindings::v0_2::exports::opentinker::plugin::environment::StepResult;
pub use super::bindings::v0_2::opentinker::plugin::types::{
    EnvInfo, Message, Metric, PlayerMessages, PluginError as GuestError, Transcript,
};
pub use super::bindings::v0_3::exports::opentinker::plugin::objective::{
    Datum as ObjectiveDatum, DatumLoss, Tensor as ObjectiveTensor,
};

/// A metadata export as a component returns it, in the host's types: its config schema still
/// text (checked when it becomes a `PluginMetadata`).
pub(crate) struct MetadataExport {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) description: String,
    pub(crate) license: Option<String>,
    pub(crate) kinds: Vec<PluginKind>,
    pub(crate) config_schema: Option<String>,
    pub(crate) language: String,
}

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

/// The size of what a call returned: its text bytes and its list items.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OutputSize {
    pub bytes: usize,
    pub items: usize,
}

impl OutputSize {
    /// One string.
    pub(crate) fn text(text: &str) -> Self {
        OutputSize {
            bytes: text.len(),
            items: 1,
        }
    }

    pub(crate) fn messages(messages: &[Message]) -> Self {
        OutputSize {
            bytes: message_bytes(messages),
            items: messages.len(),
        }
    }

    /// Every string of a metadata record, and its kinds as items.
    pub(crate) fn metadata(metadata: &MetadataExport) -> Self {
        let texts = [
            &metadata.name,
            &metadata.version,
            &metadata.description,
            &metadata.language,
        ];
        let optional = [&metadata.license, &metadata.config_schema];
        OutputSize {
            bytes: texts.iter().map(|t| t.len()).sum::<usize>()
                + optional
                    .iter()
                    .flat_map(|t| t.as_deref())
                    .map(str::len)
                    .sum::<usize>(),
            items: 1 + metadata.kinds.len(),
        }
    }

    pub(crate) fn strings(strings: &[String]) -> Self {
        OutputSize {
            bytes: strings.iter().map(String::len).sum(),
            items: strings.len(),
        }
    }
}

pub(crate) fn transcript_bytes(transcripts: &[Transcript]) -> usize {
    transcripts.iter().map(|t| message_bytes(&t.messages)).sum()
}

impl StepResult {
    /// Messages, recipients, metrics and rewards are each an item (the largest list is what
    /// `max_items` bounds, the sum what the byte limits count).
    pub(crate) fn output_size(&self) -> OutputSize {
        let messages: usize = self
            .messages
            .iter()
            .map(|m| message_bytes(&m.messages))
            .sum();
        let metrics: usize = self.metrics.iter().map(|m| m.name.len() + 8).sum();
        let message_count: usize = self.messages.iter().map(|m| m.messages.len()).sum();
        OutputSize {
            bytes: messages + metrics + self.rewards.len() * 8,
            items: self.messages.len() + message_count + self.metrics.len() + self.rewards.len(),
        }
    }
}
