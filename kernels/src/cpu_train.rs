//! The CPU backend of training: whole sequences (no KV cache), projections through the blocked
//! `gemm` products, and the backward ops, generic over [`Float`] (f32; f64 for gradient checks).
//!
//! A call's [`TrainBatch`] names its sequences ([`Span`]s: whole sequences, or branches that
//! continue a shared prefix); its attention keeps each layer's log-sum-exp there for the
//! backward, which recomputes the probabilities from it.

use std::convert::Infallible;
use std::marker::PhantomData;

use crate::attention::{Heads, Span, attention_backward, attention_forward};
use crate::backend::{Backend, Backward};
use num_traits::Zero;

use crate::float::Float;
use crate::gemm::matmul_tn;
use crate::lora::{LoraGrad, Segment, lora_backward, lora_forward};
use crate::ops::Activation;
use crate::quant::Weight;
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
    spans: Vec<Span>,
    positions: Vec<usize>,
    /// Per layer, the log-sum-exp of each row and head.
    lse: Vec<Vec<T>>,
}

impl<T> TrainBatch<T> {
    /// Sequences of `lengths` tokens, each from position 0.
    pub fn new(lengths: Vec<usize>) -> Self {
        Self::of_spans(lengths.into_iter().map(Span::whole).collect())
    }

    /// The rows of `spans`, one after another: whole sequences, or branches of a shared prefix.
    pub fn of_spans(spans: Vec<Span>) -> Self {
        TrainBatch {
            positions: Span::positions(&spans),
            spans,
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

/// The backend's impls, once per float type: concrete impls are compiled (and optimised) in
/// this crate, where generic ones would be compiled in each caller's, unoptimised in its tests.
macro_rules! train_backend {
    ($t:ty) => {
        impl Backend for CpuTrain<$t> {
            type Error = Infallible;
            type Elem = $t;
            type Buffer = Vec<$t>;
            type Matrix<'a> = Weight<'a, $t>;
            type Vector = [$t];
            type Lora<'a> = &'a [Segment<'a, $t>];
            type Batch<'a> = TrainBatch<$t>;

            fn zeros(&self, len: usize) -> Result<Vec<$t>, Infallible> {
                Ok(vec![<$t>::zero(); len])
            }

            fn download(&self, x: Vec<$t>) -> Result<Vec<$t>, Infallible> {
                Ok(x)
            }

            fn upload(&self, values: &[$t]) -> Result<Vec<$t>, Infallible> {
                Ok(values.to_vec())
            }

            fn copy(&self, x: &Vec<$t>) -> Result<Vec<$t>, Infallible> {
                Ok(x.clone())
            }

            fn embed(
                &self,
                table: Weight<'_, $t>,
                width: usize,
                indices: &[usize],
            ) -> Result<Vec<$t>, Infallible> {
                Ok(table.gather(width, indices))
            }

            fn select_rows(
                &self,
                x: &Vec<$t>,
                width: usize,
                indices: &[usize],
            ) -> Result<Vec<$t>, Infallible> {
                self.embed(Weight::Dense(x), width, indices)
            }

            fn rms_norm(&self, x: &mut Vec<$t>, weight: &[$t], eps: f64) -> Result<(), Infallible> {
                ops::rms_norm(x, weight, <$t>::of(eps));
                Ok(())
            }

            fn rms_norm_into(
                &self,
                x: &Vec<$t>,
                weight: &[$t],
                eps: f64,
                out: &mut Vec<$t>,
            ) -> Result<(), Infallible> {
                out.copy_from_slice(x);
                ops::rms_norm(out, weight, <$t>::of(eps));
                Ok(())
            }

            fn project(
                &self,
                x: &Vec<$t>,
                weight: Weight<'_, $t>,
                inp: usize,
                bias: Option<&[$t]>,
                lora: Option<&[Segment<'_, $t>]>,
                y: &mut Vec<$t>,
                accumulate: bool,
            ) -> Result<(), Infallible> {
                weight.matmul_nt(x, inp, y, accumulate);
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
                batch: &TrainBatch<$t>,
                x: &mut Vec<$t>,
                head_dim: usize,
                cos: &[$t],
                sin: &[$t],
            ) -> Result<(), Infallible> {
                ops::rope(x, head_dim, &batch.positions, cos, sin);
                Ok(())
            }

            fn attend(
                &self,
                batch: &mut TrainBatch<$t>,
                layer: usize,
                shape: Heads,
                q: &Vec<$t>,
                k: &Vec<$t>,
                v: &Vec<$t>,
                out: &mut Vec<$t>,
            ) -> Result<(), Infallible> {
                if batch.lse.len() <= layer {
                    batch.lse.resize_with(layer + 1, Vec::new);
                }
                let lse = &mut batch.lse[layer];
                lse.clear();
                lse.resize(q.len() / shape.head_dim, <$t>::zero());
                attention_forward(q, k, v, shape, &batch.spans, out, lse);
                Ok(())
            }

            fn gate_mul(
                &self,
                activation: Activation,
                gate: &mut Vec<$t>,
                up: &Vec<$t>,
            ) -> Result<(), Infallible> {
                ops::gate_mul(activation, gate, up);
                Ok(())
            }

            fn scale(&self, x: &mut Vec<$t>, factor: f64) -> Result<(), Infallible> {
                ops::scale(x, <$t>::of(factor));
                Ok(())
            }

            fn add(&self, x: &mut Vec<$t>, y: &Vec<$t>) -> Result<(), Infallible> {
                for (a, &b) in x.iter_mut().zip(y) {
                    *a += b;
                }
                Ok(())
            }

            fn advance(&self, _batch: &mut TrainBatch<$t>) {}
        }

        impl Backward for CpuTrain<$t> {
            type LoraGrads<'a> = LoraGrads<'a, $t>;

            fn scale_rows(&self, x: &mut Vec<$t>, factors: &[f64]) -> Result<(), Infallible> {
                let factors: Vec<$t> = factors.iter().map(|&f| <$t>::of(f)).collect();
                ops::scale_rows(x, &factors);
                Ok(())
            }

            fn rms_norm_backward(
                &self,
                x: &Vec<$t>,
                weight: &[$t],
                eps: f64,
                dy: &Vec<$t>,
                dx: &mut Vec<$t>,
                dweight: Option<&mut Vec<$t>>,
            ) -> Result<(), Infallible> {
                let (rows, eps) = (x.len() / weight.len(), <$t>::of(eps));
                let mut inverse = vec![<$t>::zero(); rows];
                ops::inverse_rms_rows(x, weight.len(), eps, &mut inverse);
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
                x: &Vec<$t>,
                weight: Weight<'_, $t>,
                inp: usize,
                lora: Option<LoraGrads<'_, $t>>,
                dy: &Vec<$t>,
                dx: &mut Vec<$t>,
            ) -> Result<(), Infallible> {
                weight.matmul_nn(dy, inp, dx, true);
                if let Some(mut lora) = lora {
                    let out = weight.len() / inp;
                    lora_backward(x, inp, dy, out, lora.segments, &mut lora.grads, dx);
                }
                Ok(())
            }

            fn weight_gradient(
                &self,
                x: &Vec<$t>,
                dy: &Vec<$t>,
                inp: usize,
                dweight: &mut Vec<$t>,
                dbias: Option<&mut Vec<$t>>,
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
                batch: &TrainBatch<$t>,
                dx: &mut Vec<$t>,
                head_dim: usize,
                cos: &[$t],
                sin: &[$t],
            ) -> Result<(), Infallible> {
                ops::rope_backward(dx, head_dim, &batch.positions, cos, sin);
                Ok(())
            }

            fn attend_backward(
                &self,
                batch: &TrainBatch<$t>,
                layer: usize,
                shape: Heads,
                q: &Vec<$t>,
                k: &Vec<$t>,
                v: &Vec<$t>,
                out: &Vec<$t>,
                d_out: &Vec<$t>,
                dq: &mut Vec<$t>,
                dk: &mut Vec<$t>,
                dv: &mut Vec<$t>,
            ) -> Result<(), Infallible> {
                let lse = &batch.lse[layer];
                attention_backward(q, k, v, out, lse, d_out, shape, &batch.spans, dq, dk, dv);
                Ok(())
            }

            fn gate_mul_backward(
                &self,
                activation: Activation,
                gate: &Vec<$t>,
                up: &Vec<$t>,
                d_out: &Vec<$t>,
                d_gate: &mut Vec<$t>,
                d_up: &mut Vec<$t>,
            ) -> Result<(), Infallible> {
                ops::gate_mul_backward(activation, gate, up, d_out, d_gate, d_up);
                Ok(())
            }

            fn embed_backward(
                &self,
                indices: &[usize],
                width: usize,
                d_x: &Vec<$t>,
                d_table: &mut Vec<$t>,
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
                x: &Vec<$t>,
                table: Weight<'_, $t>,
                hidden: usize,
                targets: &[u32],
                jacobian: Option<&mut Vec<$t>>,
            ) -> Result<Vec<$t>, Infallible> {
                let mut logprobs = vec![<$t>::zero(); targets.len()];
                let jacobian = jacobian.map(|j| j.as_mut_slice());
                unembed::unembed_logprobs(x, table, hidden, targets, &mut logprobs, jacobian);
                Ok(logprobs)
            }

            fn unembed_logprobs_backward(
                &self,
                jacobian: &Vec<$t>,
                g: &Vec<$t>,
                dx: &mut Vec<$t>,
            ) -> Result<(), Infallible> {
                unembed::unembed_logprobs_backward(jacobian, g, dx);
                Ok(())
            }

            fn target_logprobs(
                &self,
                logits: &Vec<$t>,
                vocab: usize,
                targets: &[u32],
            ) -> Result<Vec<$t>, Infallible> {
                let mut logprobs = vec![<$t>::zero(); targets.len()];
                unembed::target_logprobs(logits, vocab, targets, &mut logprobs);
                Ok(logprobs)
            }

            fn target_logprobs_backward(
                &self,
                logits: &Vec<$t>,
                vocab: usize,
                targets: &[u32],
                g: &Vec<$t>,
            ) -> Result<Vec<$t>, Infallible> {
                let mut d_logits = vec![<$t>::zero(); logits.len()];
                unembed::target_logprobs_backward(logits, vocab, targets, g, &mut d_logits);
                Ok(d_logits)
            }
        }
    };
}

train_backend!(f32);
train_backend!(f64);
