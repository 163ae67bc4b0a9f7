//! Row-wise ops around the projections: RMSNorm, rotary embedding, the SwiGLU gate, softmax,
//! each forward beside its backward. Each touches one row at a time, so they are
//! batch-invariant by construction. Generic over [`Float`]: f32 for the model, f64 for gradient
//! checks (the f32 code is the same arithmetic in the same order).
//!
//! Rows run in parallel on rayon's pool when there are enough of them (`min_rows`); a row's
//! arithmetic is the same on any thread, so the results do not depend on the split.

use rayon::prelude::*;

use crate::float::Float;

/// Values of one parallel task of a row-wise op: fewer would cost more in waking and
/// synchronising threads than they save.
const TASK_VALUES: usize = 1 << 14;

/// Rows of `n` values per parallel task. An input of no more rows is not split, and rayon runs
/// an unsplit iterator on the calling thread (a decode step's few rows never wake the pool).
fn min_rows(n: usize) -> usize {
    (TASK_VALUES / n.max(1)).max(1)
}

/// RMSNorm of each row of `x` (rows of `weight.len()`), in place.
pub fn rms_norm<T: Float>(x: &mut [T], weight: &[T], eps: T) {
    let n = weight.len();
    x.par_chunks_exact_mut(n)
        .with_min_len(min_rows(n))
        .for_each(|row| {
            let inv = inverse_rms(row, eps);
            for (v, w) in row.iter_mut().zip(weight) {
                *v = *v * inv * *w;
            }
        });
}

/// `1 / sqrt(mean(x²) + eps)` of one row.
fn inverse_rms<T: Float>(row: &[T], eps: T) -> T {
    let mean_square = row.iter().map(|&v| v * v).sum::<T>() / T::of(row.len() as f64);
    T::one() / (mean_square + eps).sqrt()
}

/// Each row's `1 / rms` of `x` (rows of `n`): what the backward of an RMSNorm needs of its
/// forward, recomputed without the normalised rows.
pub fn inverse_rms_rows<T: Float>(x: &[T], n: usize, eps: T, inverse: &mut [T]) {
    assert_eq!(inverse.len(), x.len() / n, "one inverse rms per row");
    x.par_chunks_exact(n)
        .zip(inverse.par_iter_mut())
        .with_min_len(min_rows(n))
        .for_each(|(row, inv)| *inv = inverse_rms(row, eps));
}

/// `out = ` RMSNorm of each row of `x`, keeping each row's `1 / rms` in `inverse` for the
/// backward.
pub fn rms_norm_saving<T: Float>(x: &[T], weight: &[T], eps: T, out: &mut [T], inverse: &mut [T]) {
    let n = weight.len();
    assert_eq!(out.len(), x.len(), "out must have x's shape");
    assert_eq!(inverse.len(), x.len() / n, "one inverse rms per row");
    x.par_chunks_exact(n)
        .zip(out.par_chunks_exact_mut(n))
        .zip(inverse.par_iter_mut())
        .with_min_len(min_rows(n))
        .for_each(|((row, out), inv)| {
            *inv = inverse_rms(row, eps);
            for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
                *o = *v * *inv * *w;
            }
        });
}

/// The backward of [`rms_norm_saving`]: `dx += ∂/∂x` of `Σ dy · y` and, when given,
/// `dweight += ∂/∂weight`. With `g = dy · w` and `r` the row's inverse rms,
/// `dx = r·g - r³·x·(g·x)/n`. The rows of `dx` run in parallel; `dweight`, a sum over rows, is
/// summed in row order on the calling thread.
pub fn rms_norm_backward<T: Float>(
    x: &[T],
    weight: &[T],
    inverse: &[T],
    dy: &[T],
    dx: &mut [T],
    dweight: Option<&mut [T]>,
) {
    let n = weight.len();
    x.par_chunks_exact(n)
        .zip(dy.par_chunks_exact(n))
        .zip(dx.par_chunks_exact_mut(n))
        .zip(inverse.par_iter())
        .with_min_len(min_rows(n))
        .for_each(|(((row, dy), dx), &r)| {
            let dot: T = row
                .iter()
                .zip(dy)
                .zip(weight)
                .map(|((&v, &d), &w)| d * w * v)
                .sum();
            let coefficient = r * r * r * dot / T::of(n as f64);
            for (((d, &v), &g), &w) in dx.iter_mut().zip(row).zip(dy).zip(weight) {
                *d += r * g * w - coefficient * v;
            }
        });
    if let Some(dweight) = dweight {
        let rows = x.chunks_exact(n).zip(dy.chunks_exact(n)).zip(inverse);
        for ((row, dy), &r) in rows {
            for ((dw, &v), &g) in dweight.iter_mut().zip(row).zip(dy) {
                *dw += g * v * r;
            }
        }
    }
}

/// Rotary embedding in the Hugging Face layout (rotate halves) of `x (rows × heads × head_dim)`,
/// row `r` at `positions[r]`; `cos` and `sin` are `(max_positions × head_dim)` tables.
pub fn rope<T: Float>(x: &mut [T], head_dim: usize, positions: &[usize], cos: &[T], sin: &[T]) {
    rotate::<T, false>(x, head_dim, positions, cos, sin);
}

/// The backward of [`rope`], in place on the gradient: the rotation is orthogonal, so its
/// backward is the rotation by the opposite angle.
pub fn rope_backward<T: Float>(
    dx: &mut [T],
    head_dim: usize,
    positions: &[usize],
    cos: &[T],
    sin: &[T],
) {
    rotate::<T, true>(dx, head_dim, positions, cos, sin);
}

/// Rotate each head's halves by its position's angle, or by the opposite angle (the transpose)
/// when `BACK`.
fn rotate<T: Float, const BACK: bool>(
    x: &mut [T],
    head_dim: usize,
    positions: &[usize],
    cos: &[T],
    sin: &[T],
) {
    let half = head_dim / 2;
    let row = x.len() / positions.len().max(1);
    if row == 0 {
        return;
    }
    x.par_chunks_exact_mut(row)
        .zip(positions.par_iter())
        .with_min_len(min_rows(row))
        .for_each(|(values, &p)| {
            let (c, s) = (
                &cos[p * head_dim..][..head_dim],
                &sin[p * head_dim..][..head_dim],
            );
            for head in values.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = (head[i], head[i + half]);
                    let (s_low, s_high) = if BACK {
                        (-s[i + half], -s[i])
                    } else {
                        (s[i], s[i + half])
                    };
                    head[i] = a * c[i] - b * s_low;
                    head[i + half] = b * c[i + half] + a * s_high;
                }
            }
        });
}

/// The activation of an MLP's gate, each of the form `act(g) = g · σ(z(g))`: SiLU (`z = g`)
/// and GELU's tanh approximation (Gemma's `gelu_pytorch_tanh`), where
/// `z = 2·√(2/π)·(g + 0.044715·g³)`, since `(1 + tanh u) / 2 = σ(2u)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

impl Activation {
    /// `z(g)` and `dz/dg`.
    #[inline(always)]
    fn argument<T: Float>(self, g: T) -> (T, T) {
        match self {
            Activation::Silu => (g, T::one()),
            Activation::GeluTanh => {
                let (c, cubic) = (
                    T::of(2.0 * (2.0 / std::f64::consts::PI).sqrt()),
                    T::of(0.044715),
                );
                let g2 = g * g;
                (
                    c * (g + cubic * g2 * g),
                    c * (T::one() + T::of(3.0) * cubic * g2),
                )
            }
        }
    }

    /// The number the CUDA kernels know it by.
    pub fn code(self) -> i32 {
        match self {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
        }
    }
}

/// `gate = act(gate) · up`, in place.
pub fn gate_mul<T: Float>(activation: Activation, gate: &mut [T], up: &[T]) {
    gate.par_chunks_mut(TASK_VALUES)
        .zip(up.par_chunks(TASK_VALUES))
        .for_each(|(gate, up)| {
            for (g, &u) in gate.iter_mut().zip(up) {
                let (z, _) = activation.argument(*g);
                *g = *g / (T::one() + (-z).fast_exp()) * u;
            }
        });
}

/// The backward of `out = act(gate) · up` from the inputs: writes `d_gate` and `d_up`.
pub fn gate_mul_backward<T: Float>(
    activation: Activation,
    gate: &[T],
    up: &[T],
    d_out: &[T],
    d_gate: &mut [T],
    d_up: &mut [T],
) {
    let chunks = gate.par_chunks(TASK_VALUES).zip(up.par_chunks(TASK_VALUES));
    let chunks = chunks.zip(d_out.par_chunks(TASK_VALUES));
    let outputs = d_gate
        .par_chunks_mut(TASK_VALUES)
        .zip(d_up.par_chunks_mut(TASK_VALUES));
    chunks
        .zip(outputs)
        .for_each(|(((gate, up), d_out), (d_gate, d_up))| {
            let values = gate.iter().zip(up).zip(d_out);
            for (((&g, &u), &d), (dg, du)) in values.zip(d_gate.iter_mut().zip(d_up.iter_mut())) {
                let (z, slope) = activation.argument(g);
                let sigmoid = T::one() / (T::one() + (-z).fast_exp());
                *du = d * g * sigmoid;
                *dg = d * u * sigmoid * (T::one() + g * (T::one() - sigmoid) * slope);
            }
        });
}

/// `x[r, :] *= factors[r]` for each row of `x` (`x.len() / factors.len()` wide), in place.
pub fn scale_rows<T: Float>(x: &mut [T], factors: &[T]) {
    debug_assert!(factors.is_empty() || x.len().is_multiple_of(factors.len()));
    let Some(width) = x.len().checked_div(factors.len()) else {
        return;
    };
    x.par_chunks_mut(width.max(1))
        .zip(factors)
        .for_each(|(row, &factor)| {
            for value in row {
                *value *= factor;
            }
        });
}

/// `x *= factor`, in place.
pub fn scale<T: Float>(x: &mut [T], factor: T) {
    x.par_chunks_mut(TASK_VALUES).for_each(|x| {
        for value in x {
            *value *= factor;
        }
    });
}

/// `log_softmax` of one row, the normaliser summed in f64: the logprobs the sampler returns.
pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    let log_sum = sum.ln() as f32 + max;
    row.iter().map(|&x| x - log_sum).collect()
}
