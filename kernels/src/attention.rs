//! Causal attention of a sequence's new positions against its KV cache, with grouped-query
//! heads. A query row at position `p` sees keys `0..=p`; its scores, softmax and weighted sum
//! run in position order, so the row comes out the same whether it is computed in a prefill of
//! the whole prompt or alone in a decode step.

use rayon::prelude::*;

use crate::linear::dot;

/// The shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `q (rows × heads × head_dim)` at positions `start..start + rows`; `k`, `v`
/// `(positions × kv_heads × head_dim)` holding at least `start + rows` positions; writes
/// `out (rows × heads × head_dim)`.
pub fn causal_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Heads,
    start: usize,
    out: &mut [f32],
) {
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = shape;
    assert!(
        kv_heads > 0 && heads % kv_heads == 0,
        "heads must be a multiple of kv_heads"
    );
    let row = heads * head_dim;
    let kv_row = kv_heads * head_dim;
    let rows = q.len() / row;
    assert_eq!(q.len(), rows * row, "q must be rows × {heads} × {head_dim}");
    assert_eq!(out.len(), q.len(), "out must have q's shape");
    assert!(
        k.len() >= (start + rows) * kv_row && v.len() == k.len(),
        "the cache is too short"
    );
    let groups = heads / kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    out.par_chunks_mut(head_dim)
        .enumerate()
        .for_each(|(index, out_head)| {
            let (r, h) = (index / heads, index % heads);
            let position = start + r;
            let query = &q[r * row + h * head_dim..][..head_dim];
            let kv_offset = (h / groups) * head_dim;
            let scores: Vec<f32> = (0..=position)
                .map(|j| dot(query, &k[j * kv_row + kv_offset..][..head_dim]) * scale)
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = weights.iter().sum();
            out_head.fill(0.0);
            for (j, w) in weights.iter().enumerate() {
                let p = w / total;
                let value = &v[j * kv_row + kv_offset..][..head_dim];
                for (o, x) in out_head.iter_mut().zip(value) {
                    *o += p * x;
                }
            }
        });
}
