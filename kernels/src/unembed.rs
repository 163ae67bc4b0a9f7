//! The training head: the logprob of each row's target token, `log_softmax(h Wᵀ)[target]`.
//!
//! With a frozen unembedding, [`unembed_logprobs`] computes it a block of rows at a time, so
//! the `(rows × vocabulary)` logits never exist at once, and keeps for the backward each row's
//! Jacobian `J = W[target] - softmaxᵀ W` (a hidden-sized vector): the gradient of the row is
//! then `g · J`. When the unembedding has an adapter or is trained itself, the logits are
//! computed by a projection and [`target_logprobs`] takes them from there.

use rayon::prelude::*;

use crate::float::Float;
use crate::quant::Weight;

/// Rows per block: the block's logits are `BLOCK × vocabulary`.
const BLOCK: usize = 64;

/// `max + ln Σ exp(x - max)` of one row.
fn log_sum_exp<T: Float>(row: &[T]) -> T {
    let max = row.iter().copied().fold(T::neg_infinity(), T::max);
    let sum: T = row.iter().map(|&v| (v - max).fast_exp()).sum();
    max + sum.ln()
}

/// `logprobs[r] = log_softmax(x[r] · Wᵀ)[targets[r]]` for `x (rows × hidden)`, `W (vocab ×
/// hidden)`; with `jacobian (rows × hidden)`, each row's `W[target] - softmaxᵀ W` too.
pub fn unembed_logprobs<T: Float>(
    x: &[T],
    w: Weight<'_, T>,
    hidden: usize,
    targets: &[u32],
    logprobs: &mut [T],
    mut jacobian: Option<&mut [T]>,
) {
    let vocab = w.len() / hidden;
    let rows = x.len() / hidden;
    assert_eq!(targets.len(), rows, "one target per row");
    assert_eq!(logprobs.len(), rows, "one logprob per row");
    assert!(
        targets.iter().all(|&t| (t as usize) < vocab),
        "targets must be in the vocabulary"
    );
    let mut logits = vec![T::zero(); BLOCK.min(rows) * vocab];
    for (block, x_block) in x.chunks(BLOCK * hidden).enumerate() {
        let n = x_block.len() / hidden;
        let first = block * BLOCK;
        let logits = &mut logits[..n * vocab];
        w.matmul_nt(x_block, hidden, logits, false);
        let block_targets = &targets[first..first + n];
        let keep_probabilities = jacobian.is_some();
        logits
            .par_chunks_mut(vocab)
            .zip(logprobs[first..first + n].par_iter_mut())
            .zip(block_targets.par_iter())
            .for_each(|((row, logprob), &t)| {
                let log_sum = log_sum_exp(row);
                *logprob = row[t as usize] - log_sum;
                if keep_probabilities {
                    row.iter_mut().for_each(|v| *v = (*v - log_sum).fast_exp());
                }
            });
        if let Some(jacobian) = jacobian.as_deref_mut() {
            let j = &mut jacobian[first * hidden..(first + n) * hidden];
            w.matmul_nn(logits, hidden, j, false);
            let mut target_row = vec![T::zero(); hidden];
            for (j_row, &t) in j.chunks_exact_mut(hidden).zip(block_targets) {
                w.read_rows(t as usize, hidden, &mut target_row);
                for (v, &wt) in j_row.iter_mut().zip(&target_row) {
                    *v = wt - *v;
                }
            }
        }
    }
}

/// The backward of [`unembed_logprobs`]: `dx[r] += g[r] · J[r]`.
pub fn unembed_logprobs_backward<T: Float>(jacobian: &[T], g: &[T], dx: &mut [T]) {
    let hidden = jacobian.len() / g.len().max(1);
    for ((d, j), &g) in dx
        .chunks_exact_mut(hidden)
        .zip(jacobian.chunks_exact(hidden))
        .zip(g)
    {
        for (d, &j) in d.iter_mut().zip(j) {
            *d += g * j;
        }
    }
}

/// `logprobs[r] = log_softmax(logits[r])[targets[r]]` of `logits (rows × vocab)`.
pub fn target_logprobs<T: Float>(logits: &[T], vocab: usize, targets: &[u32], logprobs: &mut [T]) {
    logits
        .par_chunks(vocab)
        .zip(logprobs.par_iter_mut())
        .zip(targets.par_iter())
        .for_each(|((row, logprob), &t)| *logprob = row[t as usize] - log_sum_exp(row));
}

/// The backward of [`target_logprobs`]: `d_logits[r] = g[r] · (onehot(target) - softmax)`.
pub fn target_logprobs_backward<T: Float>(
    logits: &[T],
    vocab: usize,
    targets: &[u32],
    g: &[T],
    d_logits: &mut [T],
) {
    d_logits
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .zip(targets.par_iter().zip(g.par_iter()))
        .for_each(|((d, row), (&t, &g))| {
            let log_sum = log_sum_exp(row);
            for (d, &v) in d.iter_mut().zip(row) {
                *d = -g * (v - log_sum).fast_exp();
            }
            d[t as usize] += g;
        });
}
