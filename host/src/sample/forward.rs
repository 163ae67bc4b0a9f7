//! The sampler's forward pass: the model's one layer definition (`model::layers`) on the CPU
//! backend of `opentinker-kernels`, over the candle weights (read in place, never copied), with
//! a KV cache per sequence.
//!
//! One call serves any mix of sequences: prompts being prefilled and sequences decoding one
//! token, each through its own adapter (or the base model). Every row's result depends only on
//! its own sequence, which is what makes sampling deterministic whatever else is batched.

use opentinker_kernels::{Cpu, CpuBatch, KvCache};

use crate::lora::{Adapter, CpuAdapters};
use crate::model::layers::{self, Sequence};
use crate::model::{CpuWeights, Transformer};

/// One sequence's part of a forward pass.
pub struct SequenceInput<'a> {
    /// New tokens, at positions `cache.len..`.
    pub tokens: &'a [u32],
    pub adapter: Option<&'a Adapter>,
    pub cache: &'a mut KvCache,
    /// Logits of every new token (for prompt logprobs), or only of the last.
    pub all_logits: bool,
}

/// Run the new tokens of every sequence through the model, appending to their caches. Returns
/// per sequence its logits, `rows × vocab` (every new token, or the last).
pub fn forward(
    model: &Transformer,
    inputs: &mut [SequenceInput<'_>],
) -> candle_core::Result<Vec<Vec<f32>>> {
    let weights = CpuWeights::of(model)?;
    // Sequences of one adapter name it by one index, so their rows share a run.
    let mut adapters: Vec<&Adapter> = Vec::new();
    let sequences: Vec<Sequence<'_>> = inputs
        .iter()
        .map(|input| Sequence {
            tokens: input.tokens,
            start: input.cache.len,
            adapter: input.adapter.map(|adapter| {
                match adapters.iter().position(|a| std::ptr::eq(*a, adapter)) {
                    Some(index) => index,
                    None => {
                        adapters.push(adapter);
                        adapters.len() - 1
                    }
                }
            }),
            all_logits: input.all_logits,
        })
        .collect();
    let hook = CpuAdapters::of(&adapters)?;
    let mut batch = CpuBatch::new(
        inputs
            .iter_mut()
            .map(|input| (&mut *input.cache, input.tokens.len()))
            .collect(),
    );
    let logits = layers::forward(
        &Cpu,
        &model.config,
        &weights.decoder(),
        &hook,
        &sequences,
        &mut batch,
    )
    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let vocab = model.config.vocab_size;
    let mut per_sequence = Vec::with_capacity(sequences.len());
    let mut rest = &logits[..];
    for s in &sequences {
        let rows = if s.all_logits { s.tokens.len() } else { 1 };
        let (mine, next) = rest.split_at(rows * vocab);
        per_sequence.push(mine.to_vec());
        rest = next;
    }
    Ok(per_sequence)
}
