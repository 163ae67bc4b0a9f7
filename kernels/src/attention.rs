//! Causal attention of a sequence's new positions against its KV cache, with grouped-query
//! heads. A query row at position `p` sees keys `0..=p`; its scores, softmax and weighted sum
//! run in position order, so the row comes out the same whether it is computed in a prefill of
//! the whole prompt or alone in a decode step.

use rayon::prelude::*;

use crate::linear::{SERIAL_BELOW, linear_serial};

/// The shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `q (rows × heads × head_dim)` at positions `start..start + rows`; `keys[h]` and `values[h]`
/// the cache of KV head `h`, `(positions × head_dim)`, holding at least `start + rows`
/// positions; writes `out (rows × heads × head_dim)`.
pub fn causal_attention(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
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
        kv_heads > 0 && heads.is_multiple_of(kv_heads),
        "heads must be a multiple of kv_heads"
    );
    assert!(
        keys.len() == kv_heads && values.len() == kv_heads,
        "one cache per KV head"
    );
    let row = heads * head_dim;
    let rows = q.len() / row;
    assert_eq!(q.len(), rows * row, "q must be rows × {heads} × {head_dim}");
    assert_eq!(out.len(), q.len(), "out must have q's shape");
    let needed = (start + rows) * head_dim;
    assert!(
        keys.iter().chain(values).all(|c| c.len() >= needed),
        "the cache is too short"
    );
    let groups = heads / kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let one_head = |(index, out_head): (usize, &mut [f32])| {
        let (r, h) = (index / heads, index % heads);
        let positions = start + r + 1;
        let query = &q[r * row + h * head_dim..][..head_dim];
        let (key, value) = (keys[h / groups], values[h / groups]);
        let mut scores = vec![0.0; positions];
        linear_serial(
            query,
            &key[..positions * head_dim],
            head_dim,
            &mut scores,
            false,
        );
        let max = scores
            .iter()
            .fold(f32::NEG_INFINITY, |m, &s| m.max(s * scale));
        let mut total = 0.0;
        for s in &mut scores {
            *s = (*s * scale - max).exp();
            total += *s;
        }
        out_head.fill(0.0);
        for (weight, v) in scores.iter().zip(value.chunks_exact(head_dim)) {
            let p = weight / total;
            for (o, x) in out_head.iter_mut().zip(v) {
                *o += p * x;
            }
        }
    };
    // A decode step's few heads are cheaper than waking threads (callers parallelise over
    // sequences); a prefill's rows are not.
    let work = rows * heads * (start + rows) * head_dim;
    if work < SERIAL_BELOW {
        out.chunks_mut(head_dim).enumerate().for_each(one_head);
    } else {
        out.par_chunks_mut(head_dim).enumerate().for_each(one_head);
    }
}
