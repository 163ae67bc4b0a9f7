//! The sampler's forward pass on a CUDA device (feature `cuda`): the transformer of
//! `forward.rs`, computed by the CUDA kernels of `opentinker-kernels`. The base weights are
//! uploaded once, the KV of every sequence lives in one paged cache per layer (a sequence owns a
//! list of blocks), and adapters live in per-site slot pools, so one call serves prefills and
//! decodes of many sequences through many adapters, each row's bits independent of the batch.
//!
//! Not yet wired into the `SamplingEngine` (which owns requests, stops, sampling parameters and
//! the prefix cache on the CPU forward); what is here is the forward itself, greedy decoding, and
//! what the GPU tests and benchmarks measure.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::Tensor;
use opentinker_kernels::cuda::{
    AdapterRef, CudaSlice, DeviceIndices, DeviceSegment, Gpu, GpuError, LoraBatch, LoraPool,
    LoraSite, PagedKvCache, SequenceRow,
};

use crate::lora::Adapter;
use crate::model::Transformer;
use crate::model::config::{Architecture, ModelConfig};
use crate::model::{Site, Target};

/// What can go wrong in the CUDA forward.
#[derive(Debug, thiserror::Error)]
pub enum CudaForwardError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("reading the model's weights: {0}")]
    Weights(#[from] candle_core::Error),
    #[error("{0}")]
    InvalidInput(String),
}

/// How the base model's matrices (projections, embedding, unembedding) are kept on the device.
/// Norms, biases and adapters stay f32, and every sum is computed in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    /// Rounded to bf16 (to nearest even) when uploaded: half the bytes a decode step streams.
    Bf16,
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
}

/// A weight matrix on the device, in the model's [`WeightFormat`].
enum Matrix {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

impl Matrix {
    fn new(gpu: &Gpu, values: CudaSlice<f32>, format: WeightFormat) -> Result<Matrix, GpuError> {
        Ok(match format {
            WeightFormat::F32 => Matrix::F32(values),
            WeightFormat::Bf16 => Matrix::Bf16(gpu.to_bf16(&values)?),
        })
    }

    /// `y = x · selfᵀ + bias` plus the rows' adapter deltas, or `y +=` that when `accumulate`.
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        lora: Option<LoraSite<'_>>,
        inp: usize,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        match self {
            Matrix::F32(m) => gpu.linear(x, m, bias, lora, inp, y, accumulate),
            Matrix::Bf16(m) => gpu.linear_bf16(x, m, bias, lora, inp, y, accumulate),
        }
    }

    fn gather(
        &self,
        gpu: &Gpu,
        width: usize,
        indices: &DeviceIndices,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        match self {
            Matrix::F32(m) => gpu.gather_rows(m, width, indices, out),
            Matrix::Bf16(m) => gpu.gather_rows_bf16(m, width, indices, out),
        }
    }
}

struct CudaLinear {
    weight: Matrix,
    bias: Option<CudaSlice<f32>>,
    inp: usize,
}

impl CudaLinear {
    /// `y = x · Wᵀ + b` (or `y +=` that when `accumulate`) plus each row's adapter delta from
    /// `pool`, the site's adapters.
    fn apply(
        &self,
        gpu: &Gpu,
        pool: Option<&LoraPool>,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        lora: &mut LoraBatch,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let site = pool.map(|pool| LoraSite { pool, batch: lora });
        self.weight
            .project(gpu, x, self.bias.as_ref(), site, self.inp, y, accumulate)
    }
}

/// The activations of a forward call, kept for the next call of the same number of rows: a
/// decode loop makes that call every step, so its buffers are allocated once.
struct Activations {
    rows: usize,
    /// The residual stream.
    x: CudaSlice<f32>,
    /// A norm of `x`: the input of the attention and of the MLP.
    normed: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    attended: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
}

impl Activations {
    fn new(gpu: &Gpu, config: &ModelConfig, rows: usize) -> Result<Activations, GpuError> {
        let (hidden, head_dim) = (config.hidden_size, config.head_dim);
        let q_width = config.num_heads * head_dim;
        let kv_width = config.num_kv_heads * head_dim;
        let inter = config.intermediate_size;
        Ok(Activations {
            rows,
            x: gpu.zeros(rows * hidden)?,
            normed: gpu.zeros(rows * hidden)?,
            q: gpu.zeros(rows * q_width)?,
            k: gpu.zeros(rows * kv_width)?,
            v: gpu.zeros(rows * kv_width)?,
            attended: gpu.zeros(rows * q_width)?,
            gate: gpu.zeros(rows * inter)?,
            up: gpu.zeros(rows * inter)?,
        })
    }
}

struct CudaLayer {
    input_norm: CudaSlice<f32>,
    q: CudaLinear,
    k: CudaLinear,
    v: CudaLinear,
    o: CudaLinear,
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
    post_attention_norm: CudaSlice<f32>,
    gate: CudaLinear,
    up: CudaLinear,
    down: CudaLinear,
}

/// A base model on one device, with its KV caches and adapter pools.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    config: ModelConfig,
    weights: Weights,
    caches: Vec<PagedKvCache>,
    pools: BTreeMap<Site, LoraPool>,
    options: CudaModelOptions,
    /// The last call's activations, reused by a call of as many rows.
    activations: Option<Activations>,
}

fn upload(gpu: &Gpu, tensor: &Tensor) -> Result<CudaSlice<f32>, CudaForwardError> {
    let values = tensor
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(gpu.upload(&values)?)
}

impl CudaModel {
    /// Uploads `model`'s weights (once; the caches and pools are allocated here too).
    pub fn from_transformer(
        gpu: Arc<Gpu>,
        model: &Transformer,
        options: CudaModelOptions,
    ) -> Result<CudaModel, CudaForwardError> {
        let matrix = |t: &Tensor| -> Result<Matrix, CudaForwardError> {
            Ok(Matrix::new(&gpu, upload(&gpu, t)?, options.weights)?)
        };
        let linear =
            |l: &crate::model::transformer::Linear| -> Result<CudaLinear, CudaForwardError> {
                Ok(CudaLinear {
                    weight: matrix(&l.weight)?,
                    bias: l.bias.as_ref().map(|b| upload(&gpu, b)).transpose()?,
                    inp: l.weight.dims2()?.1,
                })
            };
        let mut layers = Vec::with_capacity(model.layers.len());
        for layer in &model.layers {
            layers.push(CudaLayer {
                input_norm: upload(&gpu, &layer.input_norm)?,
                q: linear(&layer.q_proj)?,
                k: linear(&layer.k_proj)?,
                v: linear(&layer.v_proj)?,
                o: linear(&layer.o_proj)?,
                q_norm: layer.q_norm.as_ref().map(|n| upload(&gpu, n)).transpose()?,
                k_norm: layer.k_norm.as_ref().map(|n| upload(&gpu, n)).transpose()?,
                post_attention_norm: upload(&gpu, &layer.post_attention_norm)?,
                gate: linear(&layer.gate_proj)?,
                up: linear(&layer.up_proj)?,
                down: linear(&layer.down_proj)?,
            });
        }
        let lm_head = if model.config.tie_word_embeddings {
            None
        } else {
            Some(matrix(&model.lm_head.weight)?)
        };
        let weights = Weights {
            embed: matrix(&model.embed_tokens)?,
            layers,
            norm: upload(&gpu, &model.norm)?,
            lm_head,
            cos: upload(&gpu, &model.cos)?,
            sin: upload(&gpu, &model.sin)?,
            context: model.context_length(),
        };
        CudaModel::assemble(gpu, model.config.clone(), weights, options)
    }

    /// A model of `config`'s shape with random weights made on the device (uniform, scaled by
    /// fan-in as the tiny preset's), for benchmarks of shapes too large to make on the host.
    pub fn random(
        gpu: Arc<Gpu>,
        config: &ModelConfig,
        options: CudaModelOptions,
        seed: u64,
    ) -> Result<CudaModel, CudaForwardError> {
        let mut next_seed = seed;
        let mut random = |len: usize, bound: f32| -> Result<CudaSlice<f32>, CudaForwardError> {
            let mut values = gpu.zeros(len)?;
            next_seed = next_seed.wrapping_add(0x9E37_79B9);
            gpu.fill_uniform(&mut values, next_seed, -bound, bound)?;
            Ok(values)
        };
        let format = options.weights;
        let ones = |len: usize| gpu.upload(&vec![1.0f32; len]);
        let (h, hd) = (config.hidden_size, config.head_dim);
        let mut layers = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            let mut linear = |target: Target| -> Result<CudaLinear, CudaForwardError> {
                let (out, inp) = target.shape(config);
                let bias = matches!(target, Target::Q | Target::K | Target::V) && config.qkv_bias;
                Ok(CudaLinear {
                    weight: Matrix::new(
                        &gpu,
                        random(out * inp, 1.0 / (inp as f32).sqrt())?,
                        format,
                    )?,
                    bias: if bias { Some(random(out, 0.02)?) } else { None },
                    inp,
                })
            };
            let qwen3 = config.architecture == Architecture::Qwen3;
            layers.push(CudaLayer {
                q: linear(Target::Q)?,
                k: linear(Target::K)?,
                v: linear(Target::V)?,
                o: linear(Target::O)?,
                gate: linear(Target::Gate)?,
                up: linear(Target::Up)?,
                down: linear(Target::Down)?,
                input_norm: ones(h)?,
                q_norm: if qwen3 { Some(ones(hd)?) } else { None },
                k_norm: if qwen3 { Some(ones(hd)?) } else { None },
                post_attention_norm: ones(h)?,
            });
        }
        let (cos, sin) = crate::model::transformer::rope_tables(config)?;
        let context = cos.dims().first().copied().unwrap_or(0);
        let weights = Weights {
            embed: Matrix::new(&gpu, random(config.vocab_size * h, 1.0)?, format)?,
            layers,
            norm: ones(h)?,
            lm_head: if config.tie_word_embeddings {
                None
            } else {
                let values = random(config.vocab_size * h, 1.0 / (h as f32).sqrt())?;
                Some(Matrix::new(&gpu, values, format)?)
            },
            cos: upload(&gpu, &cos)?,
            sin: upload(&gpu, &sin)?,
            context,
        };
        CudaModel::assemble(gpu, config.clone(), weights, options)
    }

    fn assemble(
        gpu: Arc<Gpu>,
        config: ModelConfig,
        weights: Weights,
        options: CudaModelOptions,
    ) -> Result<CudaModel, CudaForwardError> {
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
        let mut pools = BTreeMap::new();
        if options.adapter_slots > 0 {
            for layer in 0..config.num_layers {
                for target in Target::ATTENTION.into_iter().chain(Target::MLP) {
                    let (out, inp) = target.shape(&config);
                    let pool =
                        LoraPool::new(&gpu, options.adapter_slots, inp, out, options.max_rank)?;
                    pools.insert(Site::Layer(layer, target), pool);
                }
            }
        }
        Ok(CudaModel {
            gpu,
            config,
            weights,
            caches,
            pools,
            options,
            activations: None,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Copies `adapter` into `slot` of every site's pool. An adapter of the unembedding is
    /// refused: the CUDA forward does not apply one yet.
    pub fn load_adapter(
        &mut self,
        slot: usize,
        adapter: &Adapter,
    ) -> Result<AdapterRef, CudaForwardError> {
        let rank = adapter.config.rank;
        if adapter.sites.contains_key(&Site::Unembed) {
            return Err(CudaForwardError::InvalidInput(
                "the CUDA forward does not apply adapters of the unembedding yet".into(),
            ));
        }
        for (site, pair) in &adapter.sites {
            let pool = self.pools.get_mut(site).ok_or_else(|| {
                CudaForwardError::InvalidInput(format!(
                    "the model has no adapter pool at {site:?} (made with no adapter slots?)"
                ))
            })?;
            let to_vec = |t: &Tensor| -> Result<Vec<f32>, CudaForwardError> {
                Ok(t.to_dtype(candle_core::DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            };
            let (a, b) = (to_vec(pair.a.as_tensor())?, to_vec(pair.b.as_tensor())?);
            pool.write(&self.gpu, slot, &a, &b, rank)?;
        }
        Ok(AdapterRef {
            slot,
            rank,
            scale: adapter.config.scale() as f32,
        })
    }

    /// A random adapter of `rank` on every projection in `slot` (`B` non-zero, so it changes the
    /// model), for benchmarks.
    pub fn random_adapter(
        &mut self,
        slot: usize,
        rank: usize,
        seed: u64,
    ) -> Result<AdapterRef, CudaForwardError> {
        for (index, (site, pool)) in self.pools.iter_mut().enumerate() {
            let (out, inp) = site.shape(&self.config);
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64;
            let mut next = |bound: f32| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
            };
            let a: Vec<f32> = (0..rank * inp)
                .map(|_| next(1.0 / (inp as f32).sqrt()))
                .collect();
            let b: Vec<f32> = (0..out * rank).map(|_| next(0.01)).collect();
            pool.write(&self.gpu, slot, &a, &b, rank)?;
        }
        Ok(AdapterRef {
            slot,
            rank,
            scale: 2.0,
        })
    }

    /// Runs every sequence's new tokens through the model, writing their KV into the caches,
    /// and returns the logits of each sequence's last new token (`sequences × vocab`, on the
    /// device).
    pub fn forward(
        &mut self,
        sequences: &[CudaSequence<'_>],
    ) -> Result<CudaSlice<f32>, CudaForwardError> {
        let c = &self.config;
        let (hidden, head_dim, vocab) = (c.hidden_size, c.head_dim, c.vocab_size);
        let eps = c.rms_norm_eps as f32;
        let shape = opentinker_kernels::Heads {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let invalid = |what: String| CudaForwardError::InvalidInput(what);
        if sequences.iter().any(|s| s.tokens.is_empty()) {
            return Err(invalid("a sequence has no new tokens".into()));
        }
        c.check_tokens(sequences.iter().flat_map(|s| s.tokens))
            .map_err(|e| invalid(e.to_string()))?;
        if let Some(s) = sequences
            .iter()
            .find(|s| s.start + s.tokens.len() > self.weights.context)
        {
            return Err(invalid(format!(
                "a sequence reaches position {} past the context of {} positions",
                s.start + s.tokens.len() - 1,
                self.weights.context
            )));
        }
        let gpu = Arc::clone(&self.gpu);
        let tokens: Vec<usize> = sequences
            .iter()
            .flat_map(|s| s.tokens.iter().map(|&t| t as usize))
            .collect();
        let total = tokens.len();
        let rows: Vec<SequenceRow> = sequences
            .iter()
            .enumerate()
            .flat_map(|(sequence, s)| {
                (s.start..s.start + s.tokens.len())
                    .map(move |position| SequenceRow { sequence, position })
            })
            .collect();
        let tables: Vec<Vec<usize>> = sequences.iter().map(|s| s.blocks.to_vec()).collect();
        let attention = gpu.attention_batch(&self.caches[0], &rows, &tables)?;
        let mut lora = gpu.lora_batch(&segments(sequences))?;
        let mut a = match self.activations.take() {
            Some(kept) if kept.rows == total => kept,
            _ => Activations::new(&gpu, c, total)?,
        };
        let pool = |layer: usize, target: Target| self.pools.get(&Site::Layer(layer, target));

        self.weights
            .embed
            .gather(&gpu, hidden, &gpu.indices(&tokens)?, &mut a.x)?;
        for (li, layer) in self.weights.layers.iter().enumerate() {
            gpu.rms_norm_into(&a.x, &mut a.normed, &layer.input_norm, eps)?;
            let h = &a.normed;
            layer
                .q
                .apply(&gpu, pool(li, Target::Q), h, &mut a.q, &mut lora, false)?;
            layer
                .k
                .apply(&gpu, pool(li, Target::K), h, &mut a.k, &mut lora, false)?;
            layer
                .v
                .apply(&gpu, pool(li, Target::V), h, &mut a.v, &mut lora, false)?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                gpu.rms_norm(&mut a.q, qn, eps)?;
                gpu.rms_norm(&mut a.k, kn, eps)?;
            }
            let (cos, sin) = (&self.weights.cos, &self.weights.sin);
            gpu.rope(&mut a.q, head_dim, attention.positions(), cos, sin)?;
            gpu.rope(&mut a.k, head_dim, attention.positions(), cos, sin)?;
            gpu.kv_write(&mut self.caches[li], &attention, &a.k, &a.v)?;
            gpu.paged_attention(&self.caches[li], &attention, &a.q, shape, &mut a.attended)?;
            // The output projections add into the residual stream in place.
            layer.o.apply(
                &gpu,
                pool(li, Target::O),
                &a.attended,
                &mut a.x,
                &mut lora,
                true,
            )?;

            gpu.rms_norm_into(&a.x, &mut a.normed, &layer.post_attention_norm, eps)?;
            let h = &a.normed;
            layer.gate.apply(
                &gpu,
                pool(li, Target::Gate),
                h,
                &mut a.gate,
                &mut lora,
                false,
            )?;
            layer
                .up
                .apply(&gpu, pool(li, Target::Up), h, &mut a.up, &mut lora, false)?;
            gpu.silu_mul(&mut a.gate, &a.up)?;
            layer.down.apply(
                &gpu,
                pool(li, Target::Down),
                &a.gate,
                &mut a.x,
                &mut lora,
                true,
            )?;
        }
        let mut last = Vec::with_capacity(sequences.len());
        let mut end = 0;
        for s in sequences {
            end += s.tokens.len();
            last.push(end - 1);
        }
        let mut kept = gpu.zeros(last.len() * hidden)?;
        gpu.gather_rows(&a.x, hidden, &gpu.indices(&last)?, &mut kept)?;
        self.activations = Some(a);
        gpu.rms_norm(&mut kept, &self.weights.norm, eps)?;
        let mut logits = gpu.zeros(last.len() * vocab)?;
        let unembedding = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        unembedding.project(&gpu, &kept, None, None, hidden, &mut logits, false)?;
        Ok(logits)
    }

    /// Greedy generation of `new_tokens` tokens after each prompt (no stop token), every
    /// sequence through its adapter; block `i·per + j` is sequence `i`'s `j`-th. One prefill
    /// of every prompt, then one decode step per token for all sequences at once.
    pub fn generate_greedy(
        &mut self,
        prompts: &[Vec<u32>],
        adapters: &[Option<AdapterRef>],
        new_tokens: usize,
    ) -> Result<Vec<Vec<u32>>, CudaForwardError> {
        let block_size = self.options.block_size;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + new_tokens;
        let per = longest.div_ceil(block_size);
        if prompts.len() * per > self.options.kv_blocks {
            return Err(CudaForwardError::InvalidInput(format!(
                "{} sequences of {longest} positions need {} KV blocks, the cache has {}",
                prompts.len(),
                prompts.len() * per,
                self.options.kv_blocks
            )));
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

/// The weights of a [`CudaModel`], however they were made.
struct Weights {
    embed: Matrix,
    layers: Vec<CudaLayer>,
    norm: CudaSlice<f32>,
    /// `None`: tied to the embedding.
    lm_head: Option<Matrix>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    context: usize,
}

/// The LoRA segments of a call: one per run of consecutive sequences with the same adapter.
fn segments(sequences: &[CudaSequence<'_>]) -> Vec<DeviceSegment> {
    let mut runs: Vec<DeviceSegment> = Vec::new();
    for s in sequences {
        match runs.last_mut() {
            Some(last) if last.adapter == s.adapter => last.rows += s.tokens.len(),
            _ => runs.push(DeviceSegment {
                rows: s.tokens.len(),
                adapter: s.adapter,
            }),
        }
    }
    runs
}
