//! The plain Rust types plugin authors work with; `adapters` converts them to the WIT bindings.

use std::fmt;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::new("system", content)
    }

    /// A user message (what environments say to the policy).
    pub fn user(content: impl Into<String>) -> Self {
        Message::new("user", content)
    }

    /// An assistant message (what the policy said).
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::new("assistant", content)
    }
}

/// A named number for logging.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: String,
    pub value: f64,
}

/// A fault of the plugin itself (bad config, unparseable task), not a policy's mistake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    pub message: String,
}

impl PluginError {
    pub fn new(message: impl fmt::Display) -> Self {
        PluginError {
            message: message.to_string(),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PluginError {}

impl From<String> for PluginError {
    fn from(message: String) -> Self {
        PluginError { message }
    }
}

impl From<&str> for PluginError {
    fn from(message: &str) -> Self {
        PluginError::new(message)
    }
}

/// What an environment says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvInfo {
    pub name: String,
    pub players: u32,
    pub max_turns: u32,
}

/// The messages one player saw and produced in a finished episode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transcript {
    pub player: u32,
    pub messages: Vec<Message>,
}

/// What a step returns: new messages per player, a reward per player, who moves next, metrics.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StepResult {
    pub messages: Vec<(u32, Vec<Message>)>,
    pub rewards: Vec<f64>,
    pub next_player: Option<u32>,
    pub metrics: Vec<Metric>,
}

impl StepResult {
    /// The episode goes on; `next_player` moves next.
    pub fn next(rewards: Vec<f64>, next_player: u32) -> Self {
        StepResult {
            rewards,
            next_player: Some(next_player),
            ..StepResult::default()
        }
    }

    /// The episode is over.
    pub fn end(rewards: Vec<f64>) -> Self {
        StepResult {
            rewards,
            ..StepResult::default()
        }
    }

    /// Show `player` a message.
    pub fn say(mut self, player: u32, message: Message) -> Self {
        match self.messages.iter_mut().find(|(p, _)| *p == player) {
            Some((_, messages)) => messages.push(message),
            None => self.messages.push((player, vec![message])),
        }
        self
    }

    /// Report a named number for this step. The host adds up each metric over the episode's
    /// steps: report a count's increments, or a total once, on the last step.
    pub fn metric(mut self, name: impl Into<String>, value: f64) -> Self {
        self.metrics.push(Metric {
            name: name.into(),
            value,
        });
        self
    }
}

/// A named tensor of one datum, flattened row-major.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Tensor {
    /// `mask`, `weights`, `advantages`, `logprobs` (the sampler's), or a name the datum's
    /// `loss_fn_inputs` gave it.
    pub name: String,
    pub shape: Vec<u32>,
    pub values: Vec<f32>,
}

/// What an [`Objective`](crate::Objective) sees of one datum.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ObjectiveDatum {
    /// The policy's logprob of each target token: what the loss is differentiated by.
    pub logprobs: Vec<f32>,
    /// The datum's other inputs, each named once.
    pub inputs: Vec<Tensor>,
}

impl ObjectiveDatum {
    /// The values of the input `name`, if the datum has it.
    pub fn input(&self, name: &str) -> Option<&[f32]> {
        self.inputs
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.values.as_slice())
    }

    /// The values of the input `name`, or an error that names it.
    pub fn require(&self, name: &str) -> Result<&[f32], PluginError> {
        self.input(name)
            .ok_or_else(|| PluginError::new(format!("the datum has no input {name:?}")))
    }
}

/// The loss on one datum.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DatumLoss {
    pub value: f64,
    /// The loss's derivative with respect to each of the datum's logprobs.
    pub gradient: Vec<f32>,
    /// Added over the call's datums; a name ending in `:mean` is averaged instead.
    pub metrics: Vec<Metric>,
}
