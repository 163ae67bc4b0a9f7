//! Row-wise ops around the projections: RMSNorm, rotary embedding, the SwiGLU gate, softmax.
//! Each touches one row at a time, so they are batch-invariant by construction.

/// RMSNorm of each row of `x` (rows of `weight.len()`), in place.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * inv * w;
        }
    }
}

/// Rotary embedding in the Hugging Face layout (rotate halves) of `x (rows × heads × head_dim)`,
/// row `r` at `positions[r]`; `cos` and `sin` are `(max_positions × head_dim)` tables.
pub fn rope(x: &mut [f32], head_dim: usize, positions: &[usize], cos: &[f32], sin: &[f32]) {
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
                head[i] = a * c[i] - b * s[i];
                head[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

/// `gate = silu(gate) · up`, in place.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `log_softmax` of one row, the normaliser summed in f64: the logprobs the sampler returns.
pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    let log_sum = sum.ln() as f32 + max;
    row.iter().map(|&x| x - log_sum).collect()
}
