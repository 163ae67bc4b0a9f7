//! What the sampling engine runs on: a [`SamplerBackend`] runs the base model forward over many
//! sequences at once, each through its policy and with its KV cache, on one device, and draws
//! each sequence's next tokens from its last logits there. The engine owns the requests, their
//! random streams, their stops and the prefix cache; the backend owns the caches' memory, the
//! weights and adapters in its device's form, and the logits.
//!
//! [`CpuSampler`] runs the CPU forward over the candle weights, a cache per sequence, and draws
//! with [`choose`]; `CudaSampler` (feature `cuda`) runs the CUDA model, whose caches are block
//! tables of one paged cache per layer, and draws on the device, so that only the drawn tokens
//! leave it (the rows of every new token too, where prompt logprobs are asked for).

use opentinker_kernels::KvCache;
use rayon::prelude::*;

use super::forward::{SequenceInput, forward};
use super::params::{Choice, SamplingParams, choose};
use crate::lora::PolicyVersion;
use crate::model::{ModelConfig, Transformer};

/// A token to draw from the logits of an input's last new token.
#[derive(Clone, Copy, Debug)]
pub struct Pick<'a> {
    pub params: &'a SamplingParams,
    /// The draw's number in `[0, 1)`, from its sample's own stream.
    pub uniform: f64,
    /// How many of the most likely tokens to return with it.
    pub top: usize,
}

/// What a forward call gives back for one input.
#[derive(Clone, Debug, Default)]
pub struct BackendOutput {
    /// The input's picks' tokens, in order.
    pub choices: Vec<Choice>,
    /// The logits of every new token, `rows × vocab`, where the input asked for them (empty
    /// otherwise).
    pub logits: Vec<f32>,
}

/// One sequence's part of a forward call.
pub struct BackendInput<'a, C> {
    /// New tokens, at positions from the cache's length on.
    pub tokens: &'a [u32],
    /// The adapter version the sequence runs through (`None`: the base model).
    pub policy: Option<&'a PolicyVersion>,
    pub cache: &'a mut C,
    /// Return the logits of every new token (for prompt logprobs).
    pub all_logits: bool,
    /// Tokens to draw from the last new token's logits: one for a decoding sample, one per
    /// sample for a prefilled prompt.
    pub picks: Vec<Pick<'a>>,
}

/// Why a backend's call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("the model failed: {0}")]
    Model(#[from] candle_core::Error),
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] super::cuda::CudaModelError),
    #[error("one forward call runs {policies} adapters; the device holds {slots} at once")]
    AdapterSlots { policies: usize, slots: usize },
    #[error("the device's KV cache has no free block (of {blocks})")]
    KvBlocks { blocks: usize },
    #[error("the adapter has rank {rank}; this sampler's adapter slots hold ranks up to {max}")]
    AdapterRank { rank: usize, max: usize },
    #[error("the adapter adapts the unembedding, which this sampler's adapter slots do not hold")]
    AdapterUnembedding,
}

/// The base model's forward over sequences with KV caches, on one device.
pub trait SamplerBackend: Send {
    /// One sequence's KV.
    type Cache: Send;

    /// Positions a cache's memory comes in (a paged cache's block size): the engine reserves
    /// whole blocks.
    fn block_size(&self) -> usize {
        1
    }

    /// How many adapter versions one call may run (`None`: any number).
    fn max_policies(&self) -> Option<usize> {
        None
    }

    /// Whether this backend can run `policy` at all (a device's adapter slots have a largest
    /// rank): asked when a request arrives.
    fn check_policy(&self, policy: &PolicyVersion) -> Result<(), BackendError> {
        let _ = policy;
        Ok(())
    }

    /// A cache holding nothing.
    fn empty_cache(&mut self) -> Self::Cache;

    /// Positions a cache holds.
    fn cache_len(cache: &Self::Cache) -> usize;

    /// A cache of its own holding the first `len` positions of `cache` (for each of a prompt's
    /// samples, and for the prefix cache).
    fn fork(&mut self, cache: &Self::Cache, len: usize) -> Result<Self::Cache, BackendError>;

    /// Gives back the memory of a cache no longer needed.
    fn release(&mut self, cache: Self::Cache) {
        drop(cache);
    }

    /// Runs every input's new tokens through `base` and its policy, appending to its cache, and
    /// draws its picks from the logits of its last new token, as [`choose`] does. Returns per
    /// input its choices (and its logits, where it asked for them).
    fn forward(
        &mut self,
        base: &Transformer,
        inputs: &mut [BackendInput<'_, Self::Cache>],
    ) -> Result<Vec<BackendOutput>, BackendError>;
}

/// The CPU forward over the base model's candle weights, read in place; a cache per sequence.
pub struct CpuSampler {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl CpuSampler {
    /// A sampler for models of `config`'s shape.
    pub fn new(config: &ModelConfig) -> Self {
        CpuSampler {
            layers: config.num_layers,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        }
    }
}

impl SamplerBackend for CpuSampler {
    type Cache = KvCache;

    fn empty_cache(&mut self) -> KvCache {
        KvCache::new(self.layers, self.kv_heads)
    }

    fn cache_len(cache: &KvCache) -> usize {
        cache.len
    }

    fn fork(&mut self, cache: &KvCache, len: usize) -> Result<KvCache, BackendError> {
        Ok(cache.prefix(len.min(cache.len), self.head_dim))
    }

    fn forward(
        &mut self,
        base: &Transformer,
        inputs: &mut [BackendInput<'_, KvCache>],
    ) -> Result<Vec<BackendOutput>, BackendError> {
        let mut sequences: Vec<SequenceInput<'_>> = inputs
            .iter_mut()
            .map(|input| SequenceInput {
                tokens: input.tokens,
                adapter: input.policy.map(|p| &p.adapter),
                cache: &mut *input.cache,
                all_logits: input.all_logits,
            })
            .collect();
        let logits = forward(base, &mut sequences)?;
        let vocab = base.config.vocab_size;
        // Each pick draws from its own number, so they draw in parallel.
        let asks: Vec<(&[Pick<'_>], bool)> = inputs
            .iter()
            .map(|input| (&input.picks[..], input.all_logits))
            .collect();
        Ok(asks
            .into_par_iter()
            .zip(logits)
            .map(|((picks, all_logits), rows)| {
                let last = &rows[rows.len() - vocab..];
                let choices = picks
                    .iter()
                    .map(|pick| choose(last, pick.params, pick.uniform, pick.top))
                    .collect();
                let logits = if all_logits { rows } else { Vec::new() };
                BackendOutput { choices, logits }
            })
            .collect())
    }
}
