//! The frozen unembedding fused with the target-token logprob: `log_softmax(h Wᵀ)[target]` for
//! each row of final hidden states `h`, computed a block of rows at a time so that the
//! `(tokens × vocabulary)` logits never exist at once (on the 0.5B shape, 600 MB for 1,024
//! tokens, and as much again for their gradient).
//!
//! A row's logprob depends on that row alone, so its gradient is `g · J` with the row's
//! Jacobian `J = W[target] - softmaxᵀ W`, a hidden-sized vector. When a backward pass will
//! follow, the forward computes `J` while the block's probabilities are at hand (one more
//! matrix product, the one the backward would need anyway) and keeps only it.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, D, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::gemm::{Float, contiguous, matmul_nn, matmul_nt, storage, with_slice};

/// Rows per block: the block's logits are `ROWS × vocabulary`.
const ROWS: usize = 64;

/// Applied with [`Tensor::apply_op1`] to hidden states `(.., hidden)`; gives `(..)` logprobs.
pub struct UnembedLogprobs {
    /// The unembedding `(vocabulary × hidden)`, frozen.
    pub weight: Tensor,
    /// One target per row.
    pub targets: Vec<u32>,
    /// Keep each row's Jacobian for a backward pass.
    pub for_backward: bool,
    jacobian: Mutex<Option<Tensor>>,
}

impl UnembedLogprobs {
    pub fn new(weight: Tensor, targets: Vec<u32>, for_backward: bool) -> Self {
        UnembedLogprobs {
            weight,
            targets,
            for_backward,
            jacobian: Mutex::new(None),
        }
    }

    fn forward<T: Float>(
        &self,
        data: &[T],
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous(data, layout, "unembed-logprobs")?;
        let (vocab, hidden) = self.weight.dims2()?;
        let dims = layout.dims();
        let rows = x.len() / hidden;
        if dims.last() != Some(&hidden) || rows != self.targets.len() {
            return Err(candle_core::Error::Msg(format!(
                "unembed-logprobs: input {dims:?} does not fit {} targets of hidden size {hidden}",
                self.targets.len()
            )));
        }
        if let Some(bad) = self.targets.iter().find(|&&t| t as usize >= vocab) {
            return Err(candle_core::Error::Msg(format!(
                "target token {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let mut logprobs = vec![T::zero(); rows];
        let mut jacobian = if self.for_backward {
            vec![T::zero(); rows * hidden]
        } else {
            Vec::new()
        };
        let mut logits = vec![T::zero(); ROWS.min(rows) * vocab];
        with_slice(&self.weight, |w: &[T]| {
            for (block, x_block) in x.chunks(ROWS * hidden).enumerate() {
                let n = x_block.len() / hidden;
                let first = block * ROWS;
                let logits = &mut logits[..n * vocab];
                matmul_nt(x_block, w, hidden, logits, false);
                let targets = &self.targets[first..first + n];
                // Each row: its logprob, and its logits turned into probabilities.
                logits
                    .par_chunks_mut(vocab)
                    .zip(logprobs[first..first + n].par_iter_mut())
                    .zip(targets.par_iter())
                    .for_each(|((row, logprob), &t)| {
                        let max = row
                            .iter()
                            .fold(T::neg_infinity(), |m, &v| num_traits::Float::max(m, v));
                        let sum = row.iter().fold(T::zero(), |s, &v| s + (v - max).exp());
                        let log_sum = max + sum.ln();
                        *logprob = row[t as usize] - log_sum;
                        if self.for_backward {
                            for v in row.iter_mut() {
                                *v = (*v - log_sum).exp();
                            }
                        }
                    });
                if self.for_backward {
                    // J = W[target] - P W for the block's rows.
                    let j = &mut jacobian[first * hidden..(first + n) * hidden];
                    matmul_nn(logits, w, vocab, j);
                    for (j_row, &t) in j.chunks_exact_mut(hidden).zip(targets) {
                        let target_row = &w[t as usize * hidden..][..hidden];
                        for (v, wt) in j_row.iter_mut().zip(target_row) {
                            *v = *wt - *v;
                        }
                    }
                }
            }
            Ok(())
        })?;
        if self.for_backward {
            let jacobian = Tensor::from_vec(jacobian, dims, &candle_core::Device::Cpu)?;
            *self.jacobian.lock().unwrap_or_else(|e| e.into_inner()) = Some(jacobian);
        }
        Ok((storage(logprobs), Shape::from(&dims[..dims.len() - 1])))
    }
}

impl CustomOp1 for UnembedLogprobs {
    fn name(&self) -> &'static str {
        "unembed-logprobs"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match storage {
            CpuStorage::F32(data) => self.forward(data, layout),
            CpuStorage::F64(data) => self.forward(data, layout),
            _ => Err(candle_core::Error::Msg(
                "unembed-logprobs supports f32 and f64".into(),
            )),
        }
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let jacobian = self
            .jacobian
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                candle_core::Error::Msg(
                    "unembed-logprobs was run without `for_backward`; it has no gradient".into(),
                )
            })?;
        Ok(Some(jacobian.broadcast_mul(&grad.unsqueeze(D::Minus1)?)?))
    }
}
