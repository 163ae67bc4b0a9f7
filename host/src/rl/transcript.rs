//! A player's side of an episode as tokens, exactly as the policy saw and sampled them.
//!
//! Token-in, token-out: with the built-in chat agent, the next prompt is the previous prompt +
//! the sampled tokens (stop token included) + the rendered new messages + the generation prompt,
//! never a re-render of the history, so a whole multi-turn episode is one sequence. An agent that
//! rewrites the history starts a new sequence.

use serde::{Deserialize, Serialize};

/// What a run of tokens is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SpanKind {
    /// Prompt, system text, environment observations, chat-template glue: never trained on.
    Context,
    /// Tokens the policy sampled at turn `turn` (0-based, counting this player's turns).
    Action { turn: usize },
}

/// A run of tokens of one kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub kind: SpanKind,
    pub tokens: Vec<u32>,
    /// For actions: the sampler's logprob of each token.
    pub logprobs: Vec<f32>,
}

/// One sequence: what the policy saw and sampled, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenSequence {
    pub spans: Vec<Span>,
}

impl TokenSequence {
    pub fn tokens(&self) -> Vec<u32> {
        self.spans
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.spans.iter().map(|s| s.tokens.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Turns this sequence holds actions of.
    pub fn turns(&self) -> Vec<usize> {
        self.spans
            .iter()
            .filter_map(|s| match s.kind {
                SpanKind::Action { turn } => Some(turn),
                SpanKind::Context => None,
            })
            .collect()
    }
}

/// Why a transcript refused a call.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TranscriptError {
    #[error("an action has {tokens} tokens but {logprobs} logprobs")]
    LogprobCount { tokens: usize, logprobs: usize },
    #[error("an action cannot be empty")]
    EmptyAction,
    #[error("the transcript has no prompt yet")]
    NoPrompt,
}

/// A player's transcript over an episode: one or more sequences.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    finished: Vec<TokenSequence>,
    current: Option<TokenSequence>,
    turns: usize,
}

impl Transcript {
    /// A transcript whose first prompt is `prompt` (rendered messages + generation prompt).
    pub fn new(prompt: Vec<u32>) -> Self {
        Transcript {
            finished: Vec::new(),
            current: Some(TokenSequence {
                spans: vec![context(prompt)],
            }),
            turns: 0,
        }
    }

    /// The tokens of the current prompt: what the policy samples from next.
    pub fn prompt(&self) -> Vec<u32> {
        self.current
            .as_ref()
            .map(TokenSequence::tokens)
            .unwrap_or_default()
    }

    /// The policy sampled `tokens` (stop token included) with these logprobs.
    pub fn push_action(
        &mut self,
        tokens: Vec<u32>,
        logprobs: Vec<f32>,
    ) -> Result<(), TranscriptError> {
        if tokens.is_empty() {
            return Err(TranscriptError::EmptyAction);
        }
        if tokens.len() != logprobs.len() {
            return Err(TranscriptError::LogprobCount {
                tokens: tokens.len(),
                logprobs: logprobs.len(),
            });
        }
        let current = self.current.as_mut().ok_or(TranscriptError::NoPrompt)?;
        current.spans.push(Span {
            kind: SpanKind::Action { turn: self.turns },
            tokens,
            logprobs,
        });
        self.turns += 1;
        Ok(())
    }

    /// The environment answered: `tokens` are the rendered new messages and the generation
    /// prompt, appended to the sequence as context.
    pub fn push_observation(&mut self, tokens: Vec<u32>) -> Result<(), TranscriptError> {
        let current = self.current.as_mut().ok_or(TranscriptError::NoPrompt)?;
        if !tokens.is_empty() {
            current.spans.push(context(tokens));
        }
        Ok(())
    }

    /// An agent rewrote the history: the sequence so far is finished and `prompt` starts the
    /// next one.
    pub fn rewrite(&mut self, prompt: Vec<u32>) {
        if let Some(done) = self.current.take() {
            self.finished.push(done);
        }
        self.current = Some(TokenSequence {
            spans: vec![context(prompt)],
        });
    }

    /// The tokens the policy sampled, over every sequence.
    pub fn sampled_tokens(&self) -> usize {
        self.finished
            .iter()
            .chain(&self.current)
            .flat_map(|sequence| &sequence.spans)
            .filter(|span| matches!(span.kind, SpanKind::Action { .. }))
            .map(|span| span.tokens.len())
            .sum()
    }

    /// Turns the player took.
    pub fn turns(&self) -> usize {
        self.turns
    }

    /// Every sequence that holds at least one action, in order.
    pub fn into_sequences(self) -> Vec<TokenSequence> {
        self.finished
            .into_iter()
            .chain(self.current)
            .filter(|s| !s.turns().is_empty())
            .collect()
    }
}

fn context(tokens: Vec<u32>) -> Span {
    Span {
        kind: SpanKind::Context,
        tokens,
        logprobs: Vec::new(),
    }
}
