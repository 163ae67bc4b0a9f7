//! The kernels' math as plain loops in f64, the reference the contract tests check the fast
//! kernels against.

use crate::attention::Heads;
use crate::lora::Segment;

/// `x (m × k) · Wᵀ` in f64.
pub fn linear(x: &[f32], w: &[f32], k: usize) -> Vec<f64> {
    x.chunks_exact(k)
        .flat_map(|xr| {
            w.chunks_exact(k).map(move |wr| {
                xr.iter()
                    .zip(wr)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>()
            })
        })
        .collect()
}

/// The LoRA delta of every row (zero where a segment has no adapter), in f64.
pub fn lora_delta(x: &[f32], inp: usize, out: usize, segments: &[Segment<'_>]) -> Vec<f64> {
    let mut delta = Vec::with_capacity(x.len() / inp * out);
    let mut start = 0;
    for segment in segments {
        let x_seg = &x[start * inp..(start + segment.rows) * inp];
        match segment.pair {
            Some(pair) => {
                for xr in x_seg.chunks_exact(inp) {
                    let shrunk: Vec<f64> = pair
                        .a
                        .chunks_exact(inp)
                        .map(|ar| {
                            xr.iter()
                                .zip(ar)
                                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                                .sum()
                        })
                        .collect();
                    for br in pair.b.chunks_exact(pair.rank) {
                        let up: f64 = br.iter().zip(&shrunk).map(|(b, s)| f64::from(*b) * s).sum();
                        delta.push(f64::from(pair.scale) * up);
                    }
                }
            }
            None => delta.extend(std::iter::repeat_n(0.0, segment.rows * out)),
        }
        start += segment.rows;
    }
    delta
}

/// Causal attention in f64, as [`crate::causal_attention`] specifies it.
pub fn causal_attention(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    shape: Heads,
    start: usize,
) -> Vec<f64> {
    let Heads {
        heads,
        kv_heads,
        head_dim,
        ..
    } = shape;
    let (row, groups) = (heads * head_dim, heads / kv_heads);
    let mut out = Vec::with_capacity(q.len());
    for (r, q_row) in q.chunks_exact(row).enumerate() {
        for h in 0..heads {
            let query = &q_row[h * head_dim..][..head_dim];
            let (key, value) = (keys[h / groups], values[h / groups]);
            let first = shape.first_key(start + r);
            let scores: Vec<f64> = (first..=start + r)
                .map(|j| {
                    let k = &key[j * head_dim..][..head_dim];
                    query
                        .iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
                        / (head_dim as f64).sqrt()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..head_dim {
                out.push(
                    weights
                        .iter()
                        .enumerate()
                        .map(|(j, w)| w / total * f64::from(value[(first + j) * head_dim + d]))
                        .sum(),
                );
            }
        }
    }
    out
}
