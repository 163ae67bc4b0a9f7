//! The decoder stack: embedding, the layers, the final norm and the unembedding of the rows
//! whose logits are wanted.

use opentinker_kernels::Backend;

use super::attention::{AttentionWeights, Context, attention};
use super::mlp::{MlpWeights, mlp};
use super::projection::{Adapters, Linear, Run, runs};
use crate::model::{ModelConfig, OutOfVocabulary, Site};

/// One decoder layer's weights.
pub struct LayerWeights<'a, B: Backend + ?Sized> {
    pub input_norm: &'a B::Vector,
    pub attention: AttentionWeights<'a, B>,
    pub post_attention_norm: &'a B::Vector,
    pub mlp: MlpWeights<'a, B>,
}

/// The whole model's weights in the backend's storage, and its RoPE tables.
pub struct DecoderWeights<'a, B: Backend + ?Sized> {
    /// `vocab × hidden`.
    pub embed: &'a B::Matrix,
    pub layers: Vec<LayerWeights<'a, B>>,
    pub norm: &'a B::Vector,
    /// The unembedding (the embedding itself when the model ties them).
    pub lm_head: Linear<'a, B>,
    /// `(context × head_dim)` tables.
    pub cos: &'a B::Vector,
    pub sin: &'a B::Vector,
    /// Positions the tables cover.
    pub context: usize,
}

/// One sequence's part of a forward call.
#[derive(Clone, Copy, Debug)]
pub struct Sequence<'a> {
    /// New tokens, at positions `start..`.
    pub tokens: &'a [u32],
    /// Positions already in the sequence's cache.
    pub start: usize,
    /// Which of the hook's adapters the sequence goes through (`None`: the base model).
    pub adapter: Option<usize>,
    /// Logits of every new token (for prompt logprobs), or only of the last.
    pub all_logits: bool,
}

impl Sequence<'_> {
    fn logit_rows(&self) -> usize {
        if self.all_logits {
            self.tokens.len()
        } else {
            1
        }
    }
}

/// Why a forward call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError<E> {
    #[error(transparent)]
    OutOfVocabulary(#[from] OutOfVocabulary),
    #[error("a sequence has no new tokens")]
    NoTokens,
    #[error("a sequence reaches past the context of {context} positions")]
    PastContext { context: usize },
    #[error(transparent)]
    Backend(E),
}

/// Run the new tokens of every sequence through the model, appending their keys and values to
/// the caches in `batch`. Returns the logits (`rows × vocab`) of each sequence's wanted rows
/// (every new token, or the last), sequence after sequence.
pub fn forward<B: Backend, H: Adapters<B>>(
    ops: &B,
    config: &ModelConfig,
    weights: &DecoderWeights<'_, B>,
    adapters: &H,
    sequences: &[Sequence<'_>],
    batch: &mut B::Batch<'_>,
) -> Result<B::Buffer, ForwardError<B::Error>> {
    config.check_tokens(sequences.iter().flat_map(|s| s.tokens))?;
    if sequences.iter().any(|s| s.tokens.is_empty()) {
        return Err(ForwardError::NoTokens);
    }
    if sequences
        .iter()
        .any(|s| s.start + s.tokens.len() > weights.context)
    {
        return Err(ForwardError::PastContext {
            context: weights.context,
        });
    }
    let hidden = config.hidden_size;
    let eps = config.rms_norm_eps as f32;
    let rows: usize = sequences.iter().map(|s| s.tokens.len()).sum();
    let row_runs = runs(sequences.iter().map(|s| Run {
        rows: s.tokens.len(),
        adapter: s.adapter,
    }));
    let backend = ForwardError::Backend;

    let tokens: Vec<usize> = sequences
        .iter()
        .flat_map(|s| s.tokens.iter().map(|&t| t as usize))
        .collect();
    let mut x = ops.embed(weights.embed, hidden, &tokens).map_err(backend)?;
    let mut h = ops.zeros(rows * hidden).map_err(backend)?;
    let mut cx = Context {
        ops,
        config,
        adapters,
        runs: &row_runs,
        rows,
        cos: weights.cos,
        sin: weights.sin,
        batch,
    };
    for (li, layer) in weights.layers.iter().enumerate() {
        ops.rms_norm_into(&x, layer.input_norm, eps, &mut h)
            .map_err(backend)?;
        attention(&mut cx, li, &layer.attention, &h, &mut x).map_err(backend)?;
        ops.rms_norm_into(&x, layer.post_attention_norm, eps, &mut h)
            .map_err(backend)?;
        mlp(&mut cx, li, &layer.mlp, &h, &mut x).map_err(backend)?;
    }
    ops.advance(cx.batch);

    // Only the rows whose logits are wanted go through the unembedding.
    let mut kept = Vec::new();
    let mut end = 0;
    for s in sequences {
        end += s.tokens.len();
        kept.extend(end - s.logit_rows()..end);
    }
    let mut kept = ops.select_rows(&x, hidden, &kept).map_err(backend)?;
    ops.rms_norm(&mut kept, weights.norm, eps)
        .map_err(backend)?;
    let kept_runs = runs(sequences.iter().map(|s| Run {
        rows: s.logit_rows(),
        adapter: s.adapter,
    }));
    let kept_rows: usize = kept_runs.iter().map(|r| r.rows).sum();
    let mut logits = ops.zeros(kept_rows * config.vocab_size).map_err(backend)?;
    adapters
        .project(
            ops,
            Site::Unembed,
            &kept_runs,
            &kept,
            &weights.lm_head,
            &mut logits,
            false,
        )
        .map_err(backend)?;
    Ok(logits)
}
