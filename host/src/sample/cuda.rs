//! The sampler's model on a CUDA device (feature `cuda`): the model's one layer definition
//! (`model::layers`) on the CUDA backend of `opentinker-kernels`. The base weights are uploaded
//! once ([`GpuWeights`]), the KV of every sequence lives in one paged cache per layer (a sequence
//! owns a list of blocks), and adapters live in per-site slot pools ([`GpuAdapterPools`]), so one
//! call serves prefills and decodes of many sequences through many adapters, each row's bits
//! independent of the batch.
//!
//! The sampling engine runs on it through `CudaSampler`, which manages its blocks and adapter
//! slots; what is here is the model on the device, greedy decoding for the benchmarks, and what
//! the GPU tests measure.

use std::sync::Arc;

pub use opentinker_kernels::cuda::WeightFormat;
use opentinker_kernels::cuda::{
    AdapterRef, CudaSlice, Gpu, GpuBatch, GpuError, PagedKvCache, SequenceRow,
};

use crate::lora::{Adapter, GpuAdapterError, GpuAdapterPools};
use crate::model::layers::{self, ForwardError, Sequence};
use crate::model::{GpuWeights, GpuWeightsError, ModelConfig, Transformer};

/// What can go wrong with a model on the device.
#[derive(Debug, thiserror::Error)]
pub enum CudaModelError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Weights(#[from] GpuWeightsError),
    #[error(transparent)]
    Adapter(#[from] GpuAdapterError),
    #[error(transparent)]
    Forward(#[from] ForwardError<GpuError>),
    #[error(
        "{sequences} sequences of {positions} positions need {needed} KV blocks, the cache has {blocks}"
    )]
    KvBlocks {
        sequences: usize,
        positions: usize,
        needed: usize,
        blocks: usize,
    },
}

/// How much room a [`CudaModel`] makes for sequences and adapters, and its weights' format.
#[derive(Clone, Copy, Debug)]
pub struct CudaModelOptions {
    pub weights: WeightFormat,
    /// KV blocks in each layer's cache, shared by every sequence.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Adapters that can be loaded at once.
    pub adapter_slots: usize,
    /// The largest adapter rank.
    pub max_rank: usize,
}

/// One sequence's part of a forward call.
#[derive(Clone, Copy, Debug)]
pub struct CudaSequence<'a> {
    /// New tokens, at positions `start..`.
    pub tokens: &'a [u32],
    /// Positions already in the cache.
    pub start: usize,
    /// The KV blocks the sequence owns, enough for `start + tokens.len()` positions.
    pub blocks: &'a [usize],
    pub adapter: Option<AdapterRef>,
    /// Logits of every new token (for prompt logprobs), or only of the last.
    pub all_logits: bool,
}

/// A base model on one device, with its KV caches and adapter pools.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    config: ModelConfig,
    /// Shared with a trainer on the same device (the base is loaded once per device).
    weights: Arc<GpuWeights>,
    caches: Vec<PagedKvCache>,
    adapters: GpuAdapterPools,
    options: CudaModelOptions,
}

impl CudaModel {
    /// Uploads `model`'s weights (once; the caches and pools are allocated here too).
    pub fn from_transformer(
        gpu: Arc<Gpu>,
        model: &Transformer,
        options: CudaModelOptions,
    ) -> Result<CudaModel, CudaModelError> {
        let weights = GpuWeights::upload(&gpu, model, options.weights)?;
        CudaModel::assemble(gpu, model.config.clone(), Arc::new(weights), options)
    }

    /// A model over weights already on the device (`options.weights` is theirs), sharing them.
    pub fn with_weights(
        gpu: Arc<Gpu>,
        config: &ModelConfig,
        weights: Arc<GpuWeights>,
        options: CudaModelOptions,
    ) -> Result<CudaModel, CudaModelError> {
        CudaModel::assemble(gpu, config.clone(), weights, options)
    }

    /// A model of `config`'s shape with random weights made on the device (uniform, scaled by
    /// fan-in as the tiny preset's), for benchmarks of shapes too large to make on the host.
    pub fn random(
        gpu: Arc<Gpu>,
        config: &ModelConfig,
        options: CudaModelOptions,
        seed: u64,
    ) -> Result<CudaModel, CudaModelError> {
        let weights = GpuWeights::random(&gpu, config, options.weights, seed)?;
        CudaModel::assemble(gpu, config.clone(), Arc::new(weights), options)
    }

    fn assemble(
        gpu: Arc<Gpu>,
        config: ModelConfig,
        weights: Arc<GpuWeights>,
        options: CudaModelOptions,
    ) -> Result<CudaModel, CudaModelError> {
        let caches = (0..config.num_layers)
            .map(|_| {
                PagedKvCache::new(
                    &gpu,
                    options.kv_blocks,
                    config.num_kv_heads,
                    config.head_dim,
                    options.block_size,
                )
            })
            .collect::<Result<_, _>>()?;
        let adapters =
            GpuAdapterPools::new(&gpu, &config, options.adapter_slots, options.max_rank)?;
        Ok(CudaModel {
            gpu,
            config,
            weights,
            caches,
            adapters,
            options,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn options(&self) -> &CudaModelOptions {
        &self.options
    }

    /// Copies KV block `from` into block `to` in every layer's cache.
    pub fn copy_block(&mut self, from: usize, to: usize) -> Result<(), CudaModelError> {
        for cache in &mut self.caches {
            cache.copy_block(&self.gpu, from, to)?;
        }
        Ok(())
    }

    /// Copies `adapter` into `slot` of every site's pool. An adapter of the unembedding is
    /// refused: the pools do not hold one yet.
    pub fn load_adapter(
        &mut self,
        slot: usize,
        adapter: &Adapter,
    ) -> Result<AdapterRef, CudaModelError> {
        Ok(self.adapters.load(&self.gpu, slot, adapter)?)
    }

    /// A random adapter of `rank` on every projection in `slot` (`B` non-zero, so it changes the
    /// model), for benchmarks.
    pub fn random_adapter(
        &mut self,
        slot: usize,
        rank: usize,
        seed: u64,
    ) -> Result<AdapterRef, CudaModelError> {
        Ok(self
            .adapters
            .random(&self.gpu, &self.config, slot, rank, seed)?)
    }

    /// Runs every sequence's new tokens through the model, writing their KV into the caches,
    /// and returns the logits of each sequence's last new token, or of every new token where it
    /// asks for them (`rows × vocab`, on the device, sequence after sequence).
    pub fn forward(
        &mut self,
        sequences: &[CudaSequence<'_>],
    ) -> Result<CudaSlice<f32>, CudaModelError> {
        let rows: Vec<SequenceRow> = sequences
            .iter()
            .enumerate()
            .flat_map(|(sequence, s)| {
                (s.start..s.start + s.tokens.len())
                    .map(move |position| SequenceRow { sequence, position })
            })
            .collect();
        let tables: Vec<Vec<usize>> = sequences.iter().map(|s| s.blocks.to_vec()).collect();
        // Sequences of one adapter name it by one index, so their rows share a run.
        let mut adapters: Vec<AdapterRef> = Vec::new();
        let layer_sequences: Vec<Sequence<'_>> = sequences
            .iter()
            .map(|s| Sequence {
                tokens: s.tokens,
                start: s.start,
                adapter: s.adapter.map(|adapter| {
                    match adapters.iter().position(|a| *a == adapter) {
                        Some(index) => index,
                        None => {
                            adapters.push(adapter);
                            adapters.len() - 1
                        }
                    }
                }),
                all_logits: s.all_logits,
            })
            .collect();
        if layer_sequences.iter().any(|s| s.tokens.is_empty()) {
            return Err(ForwardError::NoTokens.into());
        }
        let hook = self.adapters.hook(adapters);
        let mut batch = GpuBatch::new(&self.gpu, &mut self.caches, &rows, &tables)?;
        Ok(layers::forward(
            &*self.gpu,
            &self.config,
            &self.weights.decoder(),
            &hook,
            &layer_sequences,
            &mut batch,
        )?)
    }

    /// Greedy generation of `new_tokens` tokens after each prompt (no stop token), every
    /// sequence through its adapter; block `i·per + j` is sequence `i`'s `j`-th. One prefill
    /// of every prompt, then one decode step per token for all sequences at once.
    pub fn generate_greedy(
        &mut self,
        prompts: &[Vec<u32>],
        adapters: &[Option<AdapterRef>],
        new_tokens: usize,
    ) -> Result<Vec<Vec<u32>>, CudaModelError> {
        let block_size = self.options.block_size;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + new_tokens;
        let per = longest.div_ceil(block_size);
        if prompts.len() * per > self.options.kv_blocks {
            return Err(CudaModelError::KvBlocks {
                sequences: prompts.len(),
                positions: longest,
                needed: prompts.len() * per,
                blocks: self.options.kv_blocks,
            });
        }
        let tables: Vec<Vec<usize>> = (0..prompts.len())
            .map(|i| (i * per..(i + 1) * per).collect())
            .collect();
        let adapter = |i: usize| adapters.get(i).copied().flatten();
        let mut generated: Vec<Vec<u32>> = vec![Vec::with_capacity(new_tokens); prompts.len()];
        let mut next: Vec<u32> = Vec::new();
        for step in 0..new_tokens {
            let sequences: Vec<CudaSequence<'_>> = if step == 0 {
                prompts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| CudaSequence {
                        tokens: p,
                        start: 0,
                        blocks: &tables[i],
                        adapter: adapter(i),
                        all_logits: false,
                    })
                    .collect()
            } else {
                next.iter()
                    .enumerate()
                    .map(|(i, t)| CudaSequence {
                        tokens: std::slice::from_ref(t),
                        start: prompts[i].len() + step - 1,
                        blocks: &tables[i],
                        adapter: adapter(i),
                        all_logits: false,
                    })
                    .collect()
            };
            let logits = self.forward(&sequences)?;
            let picked = self.gpu.argmax_rows(&logits, self.config.vocab_size)?;
            next = picked.into_iter().map(|t| t as u32).collect();
            for (out, &t) in generated.iter_mut().zip(&next) {
                out.push(t);
            }
        }
        Ok(generated)
    }
}
