//! The CPU backend of training: whole sequences (no KV cache), projections through the blocked
//! `gemm` products, and the backward ops, generic over [`Float`] (f32; f64 for gradient checks).
//!
//! A call's [`TrainBatch`] names the sequences' lengths; its attention keeps each layer's
//! log-sum-exp there for the backward, which recomputes the probabilities from it.

use std::convert::Infallible;
use std::marker::PhantomData;

use crate::attention::{Heads, attention_backward, attention_forward};
use crate::backend::{Backend, Backward};
use crate::float::Float;
use crate::gemm::{matmul_nn, matmul_nt, matmul_tn};
use crate::lora::{LoraGrad, Segment, lora_backward, lora_forward};
use crate::{ops, unembed};

/// The CPU training backend in `T`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTrain<T>(PhantomData<T>);

impl<T> CpuTrain<T> {
    pub fn new() -> Self {
        CpuTrain(PhantomData)
    }
}

/// A training call's sequences, one after another, and what its attention keeps.
pub struct TrainBatch<T> {
    lengths: Vec<usize>,
    positions: Vec<usize>,
    /// Per layer, the log-sum-exp of each row and head.
    lse: Vec<Vec<T>>,
}

impl<T> TrainBatch<T> {
    /// Sequences of `lengths` tokens, each from position 0.
    pub fn new(lengths: Vec<usize>) -> Self {
        let positions = lengths.iter().flat_map(|&n| 0..n).collect();
        TrainBatch {
            lengths,
            positions,
            lse: Vec::new(),
        }
    }
}

/// A projection's adapters on the CPU, with the gradient of each segment's pair (`None`: not
/// trained, or no adapter).
pub struct LoraGrads<'a, T> {
    pub segments: &'a [Segment<'a, T>],
    pub grads: Vec<Option<LoraGrad<'a, T>>>,
}

fn add_rows<T: Float>(y: &mut [T], bias: &[T]) {
    for row in y.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

impl<T: Float> Backend for CpuTrain<T> {
    type Error = Infallible;
    type Elem = T;
    type Buffer = Vec<T>;
    type Matrix = [T];
    type Vector = [T];
    type Lora<'a> = &'a [Segment<'a, T>];
    type Batch<'a> = TrainBatch<T>;

    fn zeros(&self, len: usize) -> Result<Vec<T>, Infallible> {
        Ok(vec![T::zero(); len])
    }

    fn download(&self, x: Vec<T>) -> Result<Vec<T>, Infallible> {
        Ok(x)
    }

    fn upload(&self, values: &[T]) -> Result<Vec<T>, Infallible> {
        Ok(values.to_vec())
    }

    fn copy(&self, x: &Vec<T>) -> Result<Vec<T>, Infallible> {
        Ok(x.clone())
    }

    fn embed(&self, table: &[T], width: usize, indices: &[usize]) -> Result<Vec<T>, Infallible> {
        Ok(indices
            .iter()
            .flat_map(|&i| table[i * width..][..width].iter().copied())
            .collect())
    }

    fn select_rows(
        &self,
        x: &Vec<T>,
        width: usize,
        indices: &[usize],
    ) -> Result<Vec<T>, Infallible> {
        self.embed(x, width, indices)
    }

    fn rms_norm(&self, x: &mut Vec<T>, weight: &[T], eps: f64) -> Result<(), Infallible> {
        ops::rms_norm(x, weight, T::of(eps));
        Ok(())
    }

    fn rms_norm_into(
        &self,
        x: &Vec<T>,
        weight: &[T],
        eps: f64,
        out: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        out.copy_from_slice(x);
        ops::rms_norm(out, weight, T::of(eps));
        Ok(())
    }

    fn project(
        &self,
        x: &Vec<T>,
        weight: &[T],
        inp: usize,
        bias: Option<&[T]>,
        lora: Option<&[Segment<'_, T>]>,
        y: &mut Vec<T>,
        accumulate: bool,
    ) -> Result<(), Infallible> {
        matmul_nt(x, weight, inp, y, accumulate);
        if let Some(bias) = bias {
            add_rows(y, bias);
        }
        if let Some(segments) = lora {
            lora_forward(x, inp, y, weight.len() / inp, segments);
        }
        Ok(())
    }

    fn rope(
        &self,
        batch: &TrainBatch<T>,
        x: &mut Vec<T>,
        head_dim: usize,
        cos: &[T],
        sin: &[T],
    ) -> Result<(), Infallible> {
        ops::rope(x, head_dim, &batch.positions, cos, sin);
        Ok(())
    }

    fn attend(
        &self,
        batch: &mut TrainBatch<T>,
        layer: usize,
        shape: Heads,
        q: &Vec<T>,
        k: &Vec<T>,
        v: &Vec<T>,
        out: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        if batch.lse.len() <= layer {
            batch.lse.resize_with(layer + 1, Vec::new);
        }
        let lse = &mut batch.lse[layer];
        lse.clear();
        lse.resize(q.len() / shape.head_dim, T::zero());
        attention_forward(q, k, v, shape, &batch.lengths, out, lse);
        Ok(())
    }

    fn silu_mul(&self, gate: &mut Vec<T>, up: &Vec<T>) -> Result<(), Infallible> {
        ops::silu_mul(gate, up);
        Ok(())
    }

    fn advance(&self, _batch: &mut TrainBatch<T>) {}
}

impl<T: Float> Backward for CpuTrain<T> {
    type LoraGrads<'a> = LoraGrads<'a, T>;

    fn add(&self, x: &mut Vec<T>, y: &Vec<T>) -> Result<(), Infallible> {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
        Ok(())
    }

    fn rms_norm_backward(
        &self,
        x: &Vec<T>,
        weight: &[T],
        eps: f64,
        dy: &Vec<T>,
        dx: &mut Vec<T>,
        dweight: Option<&mut Vec<T>>,
    ) -> Result<(), Infallible> {
        let (rows, eps) = (x.len() / weight.len(), T::of(eps));
        let mut normed = vec![T::zero(); x.len()];
        let mut inverse = vec![T::zero(); rows];
        ops::rms_norm_saving(x, weight, eps, &mut normed, &mut inverse);
        ops::rms_norm_backward(
            x,
            weight,
            &inverse,
            dy,
            dx,
            dweight.map(|d| d.as_mut_slice()),
        );
        Ok(())
    }

    fn project_backward(
        &self,
        x: &Vec<T>,
        weight: &[T],
        inp: usize,
        lora: Option<LoraGrads<'_, T>>,
        dy: &Vec<T>,
        dx: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        matmul_nn(dy, weight, inp, dx, true);
        if let Some(mut lora) = lora {
            let out = weight.len() / inp;
            lora_backward(x, inp, dy, out, lora.segments, &mut lora.grads, dx);
        }
        Ok(())
    }

    fn weight_gradient(
        &self,
        x: &Vec<T>,
        dy: &Vec<T>,
        inp: usize,
        dweight: &mut Vec<T>,
        dbias: Option<&mut Vec<T>>,
    ) -> Result<(), Infallible> {
        matmul_tn(dy, x, inp, dweight, true);
        if let Some(dbias) = dbias {
            for row in dy.chunks_exact(dbias.len()) {
                for (d, &g) in dbias.iter_mut().zip(row) {
                    *d += g;
                }
            }
        }
        Ok(())
    }

    fn rope_backward(
        &self,
        batch: &TrainBatch<T>,
        dx: &mut Vec<T>,
        head_dim: usize,
        cos: &[T],
        sin: &[T],
    ) -> Result<(), Infallible> {
        ops::rope_backward(dx, head_dim, &batch.positions, cos, sin);
        Ok(())
    }

    fn attend_backward(
        &self,
        batch: &TrainBatch<T>,
        layer: usize,
        shape: Heads,
        q: &Vec<T>,
        k: &Vec<T>,
        v: &Vec<T>,
        out: &Vec<T>,
        d_out: &Vec<T>,
        dq: &mut Vec<T>,
        dk: &mut Vec<T>,
        dv: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        let lse = &batch.lse[layer];
        attention_backward(q, k, v, out, lse, d_out, shape, &batch.lengths, dq, dk, dv);
        Ok(())
    }

    fn silu_mul_backward(
        &self,
        gate: &Vec<T>,
        up: &Vec<T>,
        d_out: &Vec<T>,
        d_gate: &mut Vec<T>,
        d_up: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        ops::silu_mul_backward(gate, up, d_out, d_gate, d_up);
        Ok(())
    }

    fn embed_backward(
        &self,
        indices: &[usize],
        width: usize,
        d_x: &Vec<T>,
        d_table: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        for (&i, row) in indices.iter().zip(d_x.chunks_exact(width)) {
            for (d, &g) in d_table[i * width..][..width].iter_mut().zip(row) {
                *d += g;
            }
        }
        Ok(())
    }

    fn unembed_logprobs(
        &self,
        x: &Vec<T>,
        table: &[T],
        hidden: usize,
        targets: &[u32],
        jacobian: Option<&mut Vec<T>>,
    ) -> Result<Vec<T>, Infallible> {
        let mut logprobs = vec![T::zero(); targets.len()];
        let jacobian = jacobian.map(|j| j.as_mut_slice());
        unembed::unembed_logprobs(x, table, hidden, targets, &mut logprobs, jacobian);
        Ok(logprobs)
    }

    fn unembed_logprobs_backward(
        &self,
        jacobian: &Vec<T>,
        g: &Vec<T>,
        dx: &mut Vec<T>,
    ) -> Result<(), Infallible> {
        unembed::unembed_logprobs_backward(jacobian, g, dx);
        Ok(())
    }

    fn target_logprobs(
        &self,
        logits: &Vec<T>,
        vocab: usize,
        targets: &[u32],
    ) -> Result<Vec<T>, Infallible> {
        let mut logprobs = vec![T::zero(); targets.len()];
        unembed::target_logprobs(logits, vocab, targets, &mut logprobs);
        Ok(logprobs)
    }

    fn target_logprobs_backward(
        &self,
        logits: &Vec<T>,
        vocab: usize,
        targets: &[u32],
        g: &Vec<T>,
    ) -> Result<Vec<T>, Infallible> {
        let mut d_logits = vec![T::zero(); logits.len()];
        unembed::target_logprobs_backward(logits, vocab, targets, g, &mut d_logits);
        Ok(d_logits)
    }
}
