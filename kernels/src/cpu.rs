//! The CPU backend: this crate's batch-invariant kernels on host slices, threaded with rayon.
//!
//! Weights are [`Weight`]s: plain `[f32]` slices (read in place, wherever the caller keeps them)
//! or the blocks of a quantized frozen base; activations
//! `Vec<f32>`, and each sequence keeps its own [`KvCache`]. A call's [`CpuBatch`] borrows the
//! caches of its sequences; attention runs the sequences in parallel.

use std::convert::Infallible;

use rayon::prelude::*;

use crate::attention::{Heads, causal_attention};
use crate::backend::Backend;
use crate::lora::{Segment, lora_apply};
use crate::ops::{self, Activation};
use crate::quant::Weight;

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

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
    /// An empty cache for a model of `layers` layers of `kv_heads` KV heads.
    pub fn new(layers: usize, kv_heads: usize) -> Self {
        let empty = vec![vec![Vec::new(); kv_heads]; layers];
        KvCache {
            keys: empty.clone(),
            values: empty,
            len: 0,
        }
    }

    /// A copy of the first `len` positions.
    pub fn prefix(&self, len: usize, head_dim: usize) -> Self {
        let keep = len * head_dim;
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

    /// Bytes one position takes in a cache of `layers × kv_heads` heads of `head_dim`.
    pub fn bytes_per_position(layers: usize, kv_heads: usize, head_dim: usize) -> usize {
        2 * layers * kv_heads * head_dim * std::mem::size_of::<f32>()
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
}

/// A call's sequences on the CPU: each one's cache and how many new rows it has, in row order.
pub struct CpuBatch<'a> {
    sequences: Vec<(&'a mut KvCache, usize)>,
    positions: Vec<usize>,
}

impl<'a> CpuBatch<'a> {
    /// The sequences of a call, in row order: each one's cache (holding its positions so far)
    /// and its number of new rows.
    pub fn new(sequences: Vec<(&'a mut KvCache, usize)>) -> Self {
        let positions = sequences
            .iter()
            .flat_map(|(cache, rows)| cache.len..cache.len + rows)
            .collect();
        CpuBatch {
            sequences,
            positions,
        }
    }
}

/// `y = x · Wᵀ + bias` plus each segment's LoRA delta.
fn project_into(
    x: &[f32],
    weight: Weight<'_, f32>,
    inp: usize,
    bias: Option<&[f32]>,
    lora: Option<&[Segment<'_>]>,
    y: &mut [f32],
) {
    let out = weight.len() / inp;
    weight.linear(x, inp, y, false);
    if let Some(bias) = bias {
        for row in y.chunks_exact_mut(out) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
    if let Some(segments) = lora.filter(|s| s.iter().any(|s| s.pair.is_some())) {
        lora_apply(x, inp, y, out, segments);
    }
}

impl Backend for Cpu {
    type Error = Infallible;
    type Elem = f32;
    type Buffer = Vec<f32>;
    type Matrix<'a> = Weight<'a, f32>;
    type Vector = [f32];
    type Lora<'a> = &'a [Segment<'a>];
    type Batch<'a> = CpuBatch<'a>;

    fn zeros(&self, len: usize) -> Result<Vec<f32>, Infallible> {
        Ok(vec![0.0; len])
    }

    fn download(&self, x: Vec<f32>) -> Result<Vec<f32>, Infallible> {
        Ok(x)
    }

    fn upload(&self, values: &[f32]) -> Result<Vec<f32>, Infallible> {
        Ok(values.to_vec())
    }

    fn copy(&self, x: &Vec<f32>) -> Result<Vec<f32>, Infallible> {
        Ok(x.clone())
    }

    fn embed(
        &self,
        table: Weight<'_, f32>,
        width: usize,
        indices: &[usize],
    ) -> Result<Vec<f32>, Infallible> {
        Ok(table.gather(width, indices))
    }

    fn select_rows(
        &self,
        x: &Vec<f32>,
        width: usize,
        indices: &[usize],
    ) -> Result<Vec<f32>, Infallible> {
        self.embed(Weight::Dense(x), width, indices)
    }

    fn rms_norm(&self, x: &mut Vec<f32>, weight: &[f32], eps: f64) -> Result<(), Infallible> {
        ops::rms_norm(x, weight, eps as f32);
        Ok(())
    }

    fn rms_norm_into(
        &self,
        x: &Vec<f32>,
        weight: &[f32],
        eps: f64,
        out: &mut Vec<f32>,
    ) -> Result<(), Infallible> {
        out.copy_from_slice(x);
        ops::rms_norm(out, weight, eps as f32);
        Ok(())
    }

    fn project(
        &self,
        x: &Vec<f32>,
        weight: Weight<'_, f32>,
        inp: usize,
        bias: Option<&[f32]>,
        lora: Option<&[Segment<'_>]>,
        y: &mut Vec<f32>,
        accumulate: bool,
    ) -> Result<(), Infallible> {
        // An accumulating projection is summed on its own and then added, so its bits are
        // those of the projection alone plus the residual.
        if accumulate {
            let mut own = vec![0.0; y.len()];
            project_into(x, weight, inp, bias, lora, &mut own);
            for (a, b) in y.iter_mut().zip(&own) {
                *a += b;
            }
        } else {
            project_into(x, weight, inp, bias, lora, y);
        }
        Ok(())
    }

    fn rope(
        &self,
        batch: &CpuBatch<'_>,
        x: &mut Vec<f32>,
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
    ) -> Result<(), Infallible> {
        ops::rope(x, head_dim, &batch.positions, cos, sin);
        Ok(())
    }

    fn attend(
        &self,
        batch: &mut CpuBatch<'_>,
        layer: usize,
        shape: Heads,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), Infallible> {
        let head_dim = shape.head_dim;
        let (q_width, kv_width) = (shape.heads * head_dim, shape.kv_heads * head_dim);
        let mut chunks = Vec::with_capacity(batch.sequences.len());
        let (mut q_rest, mut out_rest) = (&q[..], &mut out[..]);
        let (mut k_rest, mut v_rest) = (&k[..], &v[..]);
        for (cache, n) in batch.sequences.iter_mut() {
            let n = *n;
            let (q_seq, q_next) = q_rest.split_at(n * q_width);
            let (k_seq, k_next) = k_rest.split_at(n * kv_width);
            let (v_seq, v_next) = v_rest.split_at(n * kv_width);
            let (out_seq, out_next) = std::mem::take(&mut out_rest).split_at_mut(n * q_width);
            (q_rest, k_rest, v_rest, out_rest) = (q_next, k_next, v_next, out_next);
            chunks.push((&mut **cache, q_seq, k_seq, v_seq, out_seq));
        }
        chunks
            .into_par_iter()
            .for_each(|(cache, q_seq, k_seq, v_seq, out_seq)| {
                let start = cache.len;
                cache.append(layer, k_seq, v_seq, head_dim);
                let keys: Vec<&[f32]> = cache.keys[layer].iter().map(Vec::as_slice).collect();
                let values: Vec<&[f32]> = cache.values[layer].iter().map(Vec::as_slice).collect();
                causal_attention(q_seq, &keys, &values, shape, start, out_seq);
            });
        Ok(())
    }

    fn gate_mul(
        &self,
        activation: Activation,
        gate: &mut Vec<f32>,
        up: &Vec<f32>,
    ) -> Result<(), Infallible> {
        ops::gate_mul(activation, gate, up);
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, factor: f64) -> Result<(), Infallible> {
        ops::scale(x, factor as f32);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<(), Infallible> {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
        Ok(())
    }

    fn advance(&self, batch: &mut CpuBatch<'_>) {
        for (cache, rows) in batch.sequences.iter_mut() {
            cache.len += *rows;
        }
    }
}
