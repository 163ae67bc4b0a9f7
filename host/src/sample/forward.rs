//! The sampler's forward pass: the same transformer as `model::transformer`, computed on the
//! batch-invariant kernels of `opentinker-kernels` over the candle weights (read in place, never
//! copied), with a KV cache per sequence.
//!
//! One call serves any mix of sequences: prompts being prefilled and sequences decoding one
//! token, each through its own adapter (or the base model). Every row's result depends only on
//! its own sequence, which is what makes sampling deterministic whatever else is batched.

use candle_core::{CpuStorage, Storage, Tensor};
use opentinker_kernels::{Heads, LoraPair, Segment, causal_attention, linear, lora_apply, ops};
use rayon::prelude::*;

use crate::lora::{Adapter, Site, Target};
use crate::model::Transformer;
use crate::model::config::ModelConfig;
use crate::model::transformer::Linear;

/// Keys and values of one sequence's positions so far: per layer, per KV head,
/// `(positions × head_dim)`.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub keys: Vec<Vec<Vec<f32>>>,
    pub values: Vec<Vec<Vec<f32>>>,
    /// Positions held.
    pub len: usize,
}

impl KvCache {
    pub fn new(config: &ModelConfig) -> Self {
        let empty = vec![vec![Vec::new(); config.num_kv_heads]; config.num_layers];
        KvCache {
            keys: empty.clone(),
            values: empty,
            len: 0,
        }
    }

    /// A copy of the first `len` positions.
    pub fn prefix(&self, len: usize, config: &ModelConfig) -> Self {
        let keep = len * config.head_dim;
        let cut = |layers: &[Vec<Vec<f32>>]| {
            layers
                .iter()
                .map(|heads| heads.iter().map(|h| h[..keep].to_vec()).collect())
                .collect()
        };
        KvCache {
            keys: cut(&self.keys),
            values: cut(&self.values),
            len,
        }
    }

    /// Append rows `(rows × kv_heads × head_dim)` of keys and values to layer `layer`.
    fn append(&mut self, layer: usize, keys: &[f32], values: &[f32], head_dim: usize) {
        let heads = self.keys[layer].len();
        for (cache, new) in [
            (&mut self.keys[layer], keys),
            (&mut self.values[layer], values),
        ] {
            for row in new.chunks_exact(heads * head_dim) {
                for (head, part) in cache.iter_mut().zip(row.chunks_exact(head_dim)) {
                    head.extend_from_slice(part);
                }
            }
        }
    }

    /// Bytes one position takes in a cache of `config`'s model.
    pub fn bytes_per_position(config: &ModelConfig) -> usize {
        2 * config.num_layers * config.num_kv_heads * config.head_dim * std::mem::size_of::<f32>()
    }
}

/// One sequence's part of a forward pass.
pub struct SequenceInput<'a> {
    /// New tokens, at positions `cache.len..`.
    pub tokens: &'a [u32],
    pub adapter: Option<&'a Adapter>,
    pub cache: &'a mut KvCache,
    /// Logits of every new token (for prompt logprobs), or only of the last.
    pub all_logits: bool,
}

/// A tensor's f32 data, read in place under its storage lock.
struct View<'a> {
    guard: candle_core::StorageRef<'a>,
    range: std::ops::Range<usize>,
}

impl<'a> View<'a> {
    fn of(tensor: &'a Tensor) -> candle_core::Result<Self> {
        let (guard, layout) = tensor.storage_and_layout();
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("the sampler needs contiguous weights".into())
        })?;
        if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
            return Err(candle_core::Error::Msg(
                "the sampler computes in f32 on the CPU".into(),
            ));
        }
        Ok(View {
            guard,
            range: start..end,
        })
    }

    fn slice(&self) -> &[f32] {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(data)) => &data[self.range.clone()],
            _ => &[],
        }
    }
}

/// Which rows each adapter serves: runs of consecutive rows.
struct Rows<'a> {
    runs: Vec<(usize, Option<&'a Adapter>)>,
}

impl<'a> Rows<'a> {
    fn new(per_sequence: impl Iterator<Item = (usize, Option<&'a Adapter>)>) -> Self {
        let mut runs: Vec<(usize, Option<&'a Adapter>)> = Vec::new();
        for (rows, adapter) in per_sequence {
            match runs.last_mut() {
                Some((n, last)) if same(*last, adapter) => *n += rows,
                _ => runs.push((rows, adapter)),
            }
        }
        Rows { runs }
    }

    fn total(&self) -> usize {
        self.runs.iter().map(|(n, _)| n).sum()
    }
}

fn same(a: Option<&Adapter>, b: Option<&Adapter>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => std::ptr::eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// `x · Wᵀ + b`, plus each run's LoRA delta at `site`.
fn project(
    linear_weights: &Linear,
    site: Site,
    x: &[f32],
    rows: &Rows<'_>,
) -> candle_core::Result<Vec<f32>> {
    let (out, inp) = linear_weights.weight.dims2()?;
    let weight = View::of(&linear_weights.weight)?;
    let mut y = vec![0.0f32; rows.total() * out];
    linear(x, weight.slice(), inp, &mut y, false);
    if let Some(bias) = &linear_weights.bias {
        let bias = View::of(bias)?;
        for row in y.chunks_exact_mut(out) {
            for (v, b) in row.iter_mut().zip(bias.slice()) {
                *v += b;
            }
        }
    }
    let pairs: Vec<Option<(View<'_>, View<'_>, usize, f32)>> = rows
        .runs
        .iter()
        .map(|(_, adapter)| {
            adapter
                .and_then(|a| a.sites.get(&site).map(|pair| (a, pair)))
                .map(|(a, pair)| -> candle_core::Result<_> {
                    Ok((
                        View::of(pair.a.as_tensor())?,
                        View::of(pair.b.as_tensor())?,
                        a.config.rank,
                        a.config.scale() as f32,
                    ))
                })
                .transpose()
        })
        .collect::<candle_core::Result<_>>()?;
    if pairs.iter().any(Option::is_some) {
        let segments: Vec<Segment<'_>> = rows
            .runs
            .iter()
            .zip(&pairs)
            .map(|((n, _), pair)| Segment {
                rows: *n,
                pair: pair.as_ref().map(|(a, b, rank, scale)| LoraPair {
                    a: a.slice(),
                    b: b.slice(),
                    rank: *rank,
                    scale: *scale,
                }),
            })
            .collect();
        lora_apply(x, inp, &mut y, out, &segments);
    }
    Ok(y)
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// The attention shape of `config`'s model, as the kernels take it.
pub(crate) fn attention_heads(config: &ModelConfig) -> Heads {
    Heads {
        heads: config.num_heads,
        kv_heads: config.num_kv_heads,
        head_dim: config.head_dim,
    }
}

/// Run the new tokens of every sequence through the model, appending to their caches. Returns
/// per sequence its logits, `rows × vocab` (every new token, or the last).
pub fn forward(
    model: &Transformer,
    inputs: &mut [SequenceInput<'_>],
) -> candle_core::Result<Vec<Vec<f32>>> {
    let c = &model.config;
    let (hidden, head_dim, vocab) = (c.hidden_size, c.head_dim, c.vocab_size);
    let eps = c.rms_norm_eps as f32;
    let shape = attention_heads(c);
    let (q_width, kv_width) = (c.num_heads * head_dim, c.num_kv_heads * head_dim);
    c.check_tokens(inputs.iter().flat_map(|i| i.tokens))
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let rows = Rows::new(inputs.iter().map(|i| (i.tokens.len(), i.adapter)));
    let total = rows.total();
    let positions: Vec<usize> = inputs
        .iter()
        .flat_map(|i| i.cache.len..i.cache.len + i.tokens.len())
        .collect();
    if positions.iter().any(|&p| p >= model.context_length()) {
        return Err(candle_core::Error::Msg(format!(
            "a sequence reaches past the context of {} positions",
            model.context_length()
        )));
    }
    let (cos, sin) = (View::of(&model.cos)?, View::of(&model.sin)?);

    let mut x = vec![0.0f32; total * hidden];
    {
        let embed = View::of(&model.embed_tokens)?;
        let tokens = inputs.iter().flat_map(|i| i.tokens);
        for (row, &t) in x.chunks_exact_mut(hidden).zip(tokens) {
            row.copy_from_slice(&embed.slice()[t as usize * hidden..][..hidden]);
        }
    }
    for (li, layer) in model.layers.iter().enumerate() {
        let site = |target| Site::Layer(li, target);
        let mut h = x.clone();
        ops::rms_norm(&mut h, View::of(&layer.input_norm)?.slice(), eps);
        let mut q = project(&layer.q_proj, site(Target::Q), &h, &rows)?;
        let mut k = project(&layer.k_proj, site(Target::K), &h, &rows)?;
        let v = project(&layer.v_proj, site(Target::V), &h, &rows)?;
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            ops::rms_norm(&mut q, View::of(qn)?.slice(), eps);
            ops::rms_norm(&mut k, View::of(kn)?.slice(), eps);
        }
        ops::rope(&mut q, head_dim, &positions, cos.slice(), sin.slice());
        ops::rope(&mut k, head_dim, &positions, cos.slice(), sin.slice());

        let mut attended = vec![0.0f32; total * q_width];
        let mut chunks = Vec::with_capacity(inputs.len());
        let (mut q_rest, mut out_rest) = (&q[..], &mut attended[..]);
        let (mut k_rest, mut v_rest) = (&k[..], &v[..]);
        for input in inputs.iter_mut() {
            let n = input.tokens.len();
            let (q_seq, q_next) = q_rest.split_at(n * q_width);
            let (k_seq, k_next) = k_rest.split_at(n * kv_width);
            let (v_seq, v_next) = v_rest.split_at(n * kv_width);
            let (out_seq, out_next) = std::mem::take(&mut out_rest).split_at_mut(n * q_width);
            (q_rest, k_rest, v_rest, out_rest) = (q_next, k_next, v_next, out_next);
            chunks.push((input, q_seq, k_seq, v_seq, out_seq));
        }
        chunks
            .into_par_iter()
            .for_each(|(input, q_seq, k_seq, v_seq, out_seq)| {
                let start = input.cache.len;
                input.cache.append(li, k_seq, v_seq, head_dim);
                let keys: Vec<&[f32]> = input.cache.keys[li].iter().map(Vec::as_slice).collect();
                let values: Vec<&[f32]> =
                    input.cache.values[li].iter().map(Vec::as_slice).collect();
                causal_attention(q_seq, &keys, &values, shape, start, out_seq);
            });
        add(
            &mut x,
            &project(&layer.o_proj, site(Target::O), &attended, &rows)?,
        );

        let mut h = x.clone();
        ops::rms_norm(&mut h, View::of(&layer.post_attention_norm)?.slice(), eps);
        let mut gate = project(&layer.gate_proj, site(Target::Gate), &h, &rows)?;
        let up = project(&layer.up_proj, site(Target::Up), &h, &rows)?;
        ops::silu_mul(&mut gate, &up);
        add(
            &mut x,
            &project(&layer.down_proj, site(Target::Down), &gate, &rows)?,
        );
    }
    for input in inputs.iter_mut() {
        input.cache.len += input.tokens.len();
    }

    // Only the rows whose logits are wanted go through the unembedding.
    let mut kept = Vec::new();
    let mut start = 0;
    for input in inputs.iter() {
        let n = input.tokens.len();
        let first = if input.all_logits {
            start
        } else {
            start + n - 1
        };
        kept.extend_from_slice(&x[first * hidden..(start + n) * hidden]);
        start += n;
    }
    ops::rms_norm(&mut kept, View::of(&model.norm)?.slice(), eps);
    let kept_rows = Rows::new(
        inputs
            .iter()
            .map(|i| (if i.all_logits { i.tokens.len() } else { 1 }, i.adapter)),
    );
    let logits = project(&model.lm_head, Site::Unembed, &kept, &kept_rows)?;
    let mut per_sequence = Vec::with_capacity(inputs.len());
    let mut rest = &logits[..];
    for input in inputs.iter() {
        let n = if input.all_logits {
            input.tokens.len()
        } else {
            1
        };
        let (mine, next) = rest.split_at(n * vocab);
        per_sequence.push(mine.to_vec());
        rest = next;
    }
    Ok(per_sequence)
}
