//! Row-wise ops around the projections: RMSNorm, rotary embedding, the SwiGLU gate, softmax,
//! each forward beside its backward. Each touches one row at a time, so they are
//! batch-invariant by construction. Generic over [`Float`]: f32 for the model, f64 for gradient
//! checks (the f32 code is the same arithmetic in the same order).

use crate::float::Float;

/// RMSNorm of each row of `x` (rows of `weight.len()`), in place.
pub fn rms_norm<T: Float>(x: &mut [T], weight: &[T], eps: T) {
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let inv = inverse_rms(row, eps);
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * inv * *w;
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)` of one row.
fn inverse_rms<T: Float>(row: &[T], eps: T) -> T {
    let mean_square = row.iter().map(|&v| v * v).sum::<T>() / T::of(row.len() as f64);
    T::one() / (mean_square + eps).sqrt()
}

/// `out = ` RMSNorm of each row of `x`, keeping each row's `1 / rms` in `inverse` for the
/// backward.
pub fn rms_norm_saving<T: Float>(x: &[T], weight: &[T], eps: T, out: &mut [T], inverse: &mut [T]) {
    let n = weight.len();
    assert_eq!(out.len(), x.len(), "out must have x's shape");
    assert_eq!(inverse.len(), x.len() / n, "one inverse rms per row");
    for ((row, out), inv) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)).zip(inverse) {
        *inv = inverse_rms(row, eps);
        for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
            *o = *v * *inv * *w;
        }
    }
}

/// The backward of [`rms_norm_saving`]: `dx += ∂/∂x` of `Σ dy · y` and, when given,
/// `dweight += ∂/∂weight`. With `g = dy · w` and `r` the row's inverse rms,
/// `dx = r·g - r³·x·(g·x)/n`.
pub fn rms_norm_backward<T: Float>(
    x: &[T],
    weight: &[T],
    inverse: &[T],
    dy: &[T],
    dx: &mut [T],
    mut dweight: Option<&mut [T]>,
) {
    let n = weight.len();
    let rows = x.chunks_exact(n).zip(dy.chunks_exact(n));
    for (((row, dy), dx), &r) in rows.zip(dx.chunks_exact_mut(n)).zip(inverse) {
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
        if let Some(dweight) = dweight.as_deref_mut() {
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
    for (values, &p) in x.chunks_exact_mut(row).zip(positions) {
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
    }
}

/// `gate = silu(gate) · up`, in place.
pub fn silu_mul<T: Float>(gate: &mut [T], up: &[T]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (T::one() + (-*g).exp()) * u;
    }
}

/// The backward of `out = silu(gate) · up` from the inputs: writes `d_gate` and `d_up`.
pub fn silu_mul_backward<T: Float>(
    gate: &[T],
    up: &[T],
    d_out: &[T],
    d_gate: &mut [T],
    d_up: &mut [T],
) {
    let values = gate.iter().zip(up).zip(d_out);
    for (((&g, &u), &d), (dg, du)) in values.zip(d_gate.iter_mut().zip(d_up.iter_mut())) {
        let sigmoid = T::one() / (T::one() + (-g).exp());
        *du = d * g * sigmoid;
        *dg = d * u * sigmoid * (T::one() + g * (T::one() - sigmoid));
    }
}

/// `log_softmax` of one row, the normaliser summed in f64: the logprobs the sampler returns.
pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    let log_sum = sum.ln() as f32 + max;
    row.iter().map(|&x| x - log_sum).collect()
}
