//! Causal attention of a sequence's new positions against its KV cache, with grouped-query
//! heads. A query row at position `p` sees keys `0..=p`; its scores, softmax and weighted sum
//! run in position order, so the row comes out the same whether it is computed in a prefill of
//! the whole prompt or alone in a decode step.

use rayon::prelude::*;

use crate::float::Float;
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

/// Where each row of a training batch starts its sequence: rows are whole sequences one after
/// another, of `lengths`.
fn sequence_starts(lengths: &[usize]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(lengths.iter().sum());
    let mut start = 0;
    for &n in lengths {
        starts.extend(std::iter::repeat_n(start, n));
        start += n;
    }
    starts
}

/// `a · b` in eight interleaved partial sums, which the compiler keeps in vector registers (one
/// running sum would wait on every addition).
fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    const LANES: usize = 8;
    let mut lanes = [T::zero(); LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: T = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(&x, &y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for i in 0..LANES {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().copied().sum::<T>() + tail
}

/// Causal attention of whole sequences, as training computes it (no cache): `q (rows × heads ×
/// head_dim)`, `k` and `v (rows × kv_heads × head_dim)`, the rows being sequences of `lengths`
/// one after another. Writes `out` (`q`'s shape) and, per row and head, the log-sum-exp of its
/// scaled scores (`rows × heads`), all the backward needs besides the inputs: it recomputes
/// the probabilities, so no `positions × positions` matrix is ever kept.
pub fn attention_forward<T: Float>(
    q: &[T],
    k: &[T],
    v: &[T],
    shape: Heads,
    lengths: &[usize],
    out: &mut [T],
    lse: &mut [T],
) {
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = shape;
    let rows: usize = lengths.iter().sum();
    let (row, kv_row, groups) = (heads * head_dim, kv_heads * head_dim, heads / kv_heads);
    assert!(
        heads.is_multiple_of(kv_heads),
        "heads must be a multiple of kv_heads"
    );
    assert_eq!(
        q.len(),
        rows * row,
        "q must be {rows} × {heads} × {head_dim}"
    );
    assert_eq!(
        k.len(),
        rows * kv_row,
        "k must be {rows} × {kv_heads} × {head_dim}"
    );
    assert_eq!(v.len(), k.len(), "v must have k's shape");
    assert_eq!(out.len(), q.len(), "out must have q's shape");
    assert_eq!(lse.len(), rows * heads, "one log-sum-exp per row and head");
    let starts = sequence_starts(lengths);
    let scale = T::one() / T::of(head_dim as f64).sqrt();
    out.par_chunks_mut(head_dim)
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(index, (out_head, lse))| {
            let (r, h) = (index / heads, index % heads);
            let query = &q[r * row + h * head_dim..][..head_dim];
            let kv = (h / groups) * head_dim;
            let keys = starts[r]..=r;
            let scores: Vec<T> = keys
                .clone()
                .map(|j| dot(query, &k[j * kv_row + kv..][..head_dim]) * scale)
                .collect();
            let max = scores.iter().copied().fold(T::neg_infinity(), T::max);
            let total: T = scores.iter().map(|&s| (s - max).exp()).sum();
            *lse = max + total.ln();
            out_head.fill(T::zero());
            for (&s, j) in scores.iter().zip(keys) {
                let p = (s - *lse).exp();
                for (o, &x) in out_head.iter_mut().zip(&v[j * kv_row + kv..][..head_dim]) {
                    *o += p * x;
                }
            }
        });
}

/// The backward of [`attention_forward`]: writes `dq`, `dk` and `dv` (the inputs' shapes) from
/// `d_out`, recomputing each row's probabilities from `lse`. Sequences and KV heads run in
/// parallel; each one's keys gather the gradient of every query of their group.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Float>(
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    lse: &[T],
    d_out: &[T],
    shape: Heads,
    lengths: &[usize],
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = shape;
    let (row, kv_row, groups) = (heads * head_dim, kv_heads * head_dim, heads / kv_heads);
    assert_eq!(dq.len(), q.len(), "dq must have q's shape");
    assert_eq!(dk.len(), k.len(), "dk must have k's shape");
    assert_eq!(dv.len(), v.len(), "dv must have v's shape");
    let scale = T::one() / T::of(head_dim as f64).sqrt();
    let mut units = Vec::with_capacity(lengths.len() * kv_heads);
    let mut start = 0;
    for &n in lengths {
        units.extend((0..kv_heads).map(|kvh| (start, n, kvh)));
        start += n;
    }
    // Per unit: dq of its group's heads (n × groups × head_dim), dk and dv (n × head_dim).
    let parts: Vec<(Vec<T>, Vec<T>, Vec<T>)> = units
        .par_iter()
        .map(|&(start, n, kvh)| {
            let kv = kvh * head_dim;
            let mut dq_part = vec![T::zero(); n * groups * head_dim];
            let mut dk_part = vec![T::zero(); n * head_dim];
            let mut dv_part = vec![T::zero(); n * head_dim];
            let mut ds = vec![T::zero(); n];
            for i in 0..n {
                let r = start + i;
                for g in 0..groups {
                    let h = kvh * groups + g;
                    let at = r * row + h * head_dim;
                    let (query, d_o) = (&q[at..][..head_dim], &d_out[at..][..head_dim]);
                    let delta = dot(d_o, &out[at..][..head_dim]);
                    let l = lse[r * heads + h];
                    for j in 0..=i {
                        let key = &k[(start + j) * kv_row + kv..][..head_dim];
                        let value = &v[(start + j) * kv_row + kv..][..head_dim];
                        let p = (dot(query, key) * scale - l).exp();
                        ds[j] = p * (dot(d_o, value) - delta) * scale;
                        for (d, &o) in dv_part[j * head_dim..][..head_dim].iter_mut().zip(d_o) {
                            *d += p * o;
                        }
                    }
                    let dq_row = &mut dq_part[(i * groups + g) * head_dim..][..head_dim];
                    for j in 0..=i {
                        let key = &k[(start + j) * kv_row + kv..][..head_dim];
                        let dk_row = &mut dk_part[j * head_dim..][..head_dim];
                        for t in 0..head_dim {
                            dq_row[t] += ds[j] * key[t];
                            dk_row[t] += ds[j] * query[t];
                        }
                    }
                }
            }
            (dq_part, dk_part, dv_part)
        })
        .collect();
    for (&(start, n, kvh), (dq_part, dk_part, dv_part)) in units.iter().zip(parts) {
        let kv = kvh * head_dim;
        for i in 0..n {
            let r = start + i;
            let group = kvh * groups * head_dim;
            dq[r * row + group..][..groups * head_dim]
                .copy_from_slice(&dq_part[i * groups * head_dim..][..groups * head_dim]);
            dk[r * kv_row + kv..][..head_dim].copy_from_slice(&dk_part[i * head_dim..][..head_dim]);
            dv[r * kv_row + kv..][..head_dim].copy_from_slice(&dv_part[i * head_dim..][..head_dim]);
        }
    }
}
