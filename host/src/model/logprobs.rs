//! The log-probability of each target token, `log_softmax(logits)[target]`, as one custom op.
//!
//! candle's `log_softmax` then `gather` keep four vocabulary-sized tensors per position alive
//! for the backward pass (on the 0.5B shape, 600 MB each for 1,024 tokens); this op keeps only
//! the logits and writes the gradient `g · (onehot(target) - softmax(logits))` in one pass.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::gemm::contiguous;

/// The float types the op computes in.
trait Real: WithDType + Send + Sync {
    fn exp(self) -> Self;
    fn ln(self) -> Self;
}

impl Real for f32 {
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
}

impl Real for f64 {
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
}

/// `max + ln Σ exp(x - max)` of one row.
fn log_sum_exp<T: Real>(row: &[T]) -> T {
    let max = row.iter().copied().fold(
        T::from_f64(f64::NEG_INFINITY),
        |m, x| if x > m { x } else { m },
    );
    let sum = row.iter().fold(T::zero(), |sum, &x| sum + (x - max).exp());
    max + sum.ln()
}

/// The rows of `logits` and their targets, checked.
fn rows<'a, T>(
    logits: &'a [T],
    logits_layout: &Layout,
    targets: &'a [u32],
    targets_layout: &Layout,
) -> candle_core::Result<(&'a [T], &'a [u32], usize)> {
    let logits = contiguous(logits, logits_layout, "target-logprobs")?;
    let targets = contiguous(targets, targets_layout, "target-logprobs")?;
    let vocab = *logits_layout.dims().last().unwrap_or(&0);
    if vocab == 0 || logits.len() != targets.len() * vocab {
        return Err(candle_core::Error::Msg(format!(
            "target-logprobs: logits {:?} do not match targets {:?}",
            logits_layout.dims(),
            targets_layout.dims()
        )));
    }
    if let Some(bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(candle_core::Error::Msg(format!(
            "target token {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok((logits, targets, vocab))
}

/// Applied with [`Tensor::apply_op2`] to `(logits (.., vocab), targets (..) u32)`.
pub struct TargetLogprobs;

impl TargetLogprobs {
    fn forward<T: Real>(
        logits: &[T],
        logits_layout: &Layout,
        targets: &[u32],
        targets_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (logits, targets, vocab) = rows(logits, logits_layout, targets, targets_layout)?;
        let values: Vec<T> = logits
            .par_chunks(vocab)
            .zip(targets.par_iter())
            .map(|(row, &t)| row[t as usize] - log_sum_exp(row))
            .collect();
        Ok((
            T::to_cpu_storage_owned(values),
            targets_layout.shape().clone(),
        ))
    }
}

impl CustomOp2 for TargetLogprobs {
    fn name(&self) -> &'static str {
        "target-logprobs"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        targets: &CpuStorage,
        targets_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match (logits, targets) {
            (CpuStorage::F32(l), CpuStorage::U32(t)) => {
                Self::forward(l, logits_layout, t, targets_layout)
            }
            (CpuStorage::F64(l), CpuStorage::U32(t)) => {
                Self::forward(l, logits_layout, t, targets_layout)
            }
            _ => Err(candle_core::Error::Msg(
                "target-logprobs needs f32 or f64 logits and u32 targets".into(),
            )),
        }
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad_logits =
            logits
                .detach()
                .apply_op3_no_bwd(targets, &grad.contiguous()?, &TargetLogprobsGrad)?;
        Ok((Some(grad_logits), None))
    }
}

/// `g · (onehot(target) - softmax(logits))` per row: the gradient of the logits.
struct TargetLogprobsGrad;

impl TargetLogprobsGrad {
    fn backward<T: Real>(
        logits: &[T],
        logits_layout: &Layout,
        targets: &[u32],
        targets_layout: &Layout,
        grad: &[T],
        grad_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (logits, targets, vocab) = rows(logits, logits_layout, targets, targets_layout)?;
        let grad = contiguous(grad, grad_layout, "target-logprobs")?;
        let mut out = vec![T::zero(); logits.len()];
        out.par_chunks_mut(vocab)
            .zip(logits.par_chunks(vocab))
            .zip(targets.par_iter().zip(grad.par_iter()))
            .for_each(|((out, row), (&t, &g))| {
                let lse = log_sum_exp(row);
                for (o, &x) in out.iter_mut().zip(row) {
                    *o = T::zero() - g * (x - lse).exp();
                }
                out[t as usize] += g;
            });
        Ok((T::to_cpu_storage_owned(out), logits_layout.shape().clone()))
    }
}

impl CustomOp3 for TargetLogprobsGrad {
    fn name(&self) -> &'static str {
        "target-logprobs-grad"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        targets: &CpuStorage,
        targets_layout: &Layout,
        grad: &CpuStorage,
        grad_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match (logits, targets, grad) {
            (CpuStorage::F32(l), CpuStorage::U32(t), CpuStorage::F32(g)) => {
                Self::backward(l, logits_layout, t, targets_layout, g, grad_layout)
            }
            (CpuStorage::F64(l), CpuStorage::U32(t), CpuStorage::F64(g)) => {
                Self::backward(l, logits_layout, t, targets_layout, g, grad_layout)
            }
            _ => Err(candle_core::Error::Msg(
                "target-logprobs-grad needs matching f32 or f64 logits and gradient".into(),
            )),
        }
    }
}
