//! Causal attention of a sequence's new positions against its KV cache, with grouped-query
//! heads. A query row at position `p` sees keys `0..=p` (the last `window` of them in a
//! sliding-window layer); its scores, softmax and weighted sum run in position order, so the
//! row comes out the same whether it is computed in a prefill of the whole prompt or alone in a
//! decode step.

use std::ops::Range;

use rayon::prelude::*;

use crate::float::Float;
use crate::gemm::{matmul_nn, matmul_nt, matmul_tn};
use crate::linear::{SERIAL_BELOW, linear_serial};

/// The shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// A sliding window: the query at position `p` sees only keys `p + 1 - window..=p`
    /// (`None`: all keys up to its own).
    pub window: Option<usize>,
}

impl Heads {
    /// The first key the query at `position` sees.
    pub fn first_key(&self, position: usize) -> usize {
        self.window
            .map_or(0, |window| (position + 1).saturating_sub(window))
    }
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
        ..
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
        let (first, end) = (shape.first_key(start + r), start + r + 1);
        let query = &q[r * row + h * head_dim..][..head_dim];
        let (key, value) = (keys[h / groups], values[h / groups]);
        let mut scores = vec![0.0; end - first];
        linear_serial(
            query,
            &key[first * head_dim..end * head_dim],
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
        let value = &value[first * head_dim..];
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

/// Query rows per block of the whole-sequence attention: a block's scores are one
/// `BLOCK × keys` tile, never a `positions × positions` matrix per head.
const BLOCK: usize = 64;

/// One head's `(n × head_dim)` slice of rows `start..start + n` of `x`, whose rows hold
/// `row` values, the head's at `offset`: gathered contiguous so that blocks of it go through
/// the matrix products.
fn gather<T: Float>(
    x: &[T],
    row: usize,
    offset: usize,
    start: usize,
    n: usize,
    head_dim: usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(n * head_dim);
    for r in start..start + n {
        out.extend_from_slice(&x[r * row + offset..][..head_dim]);
    }
    out
}

/// The inverse of [`gather`]: writes `part (n × head_dim)` into the head's slots of rows
/// `start..` of `x`, or adds it there with `accumulate`.
fn scatter<T: Float>(
    part: &[T],
    x: &mut [T],
    row: usize,
    offset: usize,
    start: usize,
    head_dim: usize,
    accumulate: bool,
) {
    for (i, values) in part.chunks_exact(head_dim).enumerate() {
        let slots = &mut x[(start + i) * row + offset..][..head_dim];
        match accumulate {
            true => slots.iter_mut().zip(values).for_each(|(s, &v)| *s += v),
            false => slots.copy_from_slice(values),
        }
    }
}

/// A run of rows that training attends as one sequence: `len` rows of its own, one after
/// another in the call, and, for a branch of a shared prefix, the rows of that `prefix` (a range
/// of the call's rows), which its rows see before their own. A branch's first row is at position
/// `prefix.len()`: its rows attend as the same sequence written out whole would, and the
/// prefix's rows are computed once for every branch that continues them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub len: usize,
    pub prefix: Option<Range<usize>>,
}

impl Span {
    /// A whole sequence of `len` rows, from position 0.
    pub fn whole(len: usize) -> Span {
        Span { len, prefix: None }
    }

    /// `len` rows that continue the rows `prefix`.
    pub fn branch(len: usize, prefix: Range<usize>) -> Span {
        Span {
            len,
            prefix: Some(prefix),
        }
    }

    /// The position of the span's first row.
    pub fn first_position(&self) -> usize {
        self.prefix.as_ref().map_or(0, Range::len)
    }

    /// Each row's position, span after span.
    pub fn positions(spans: &[Span]) -> Vec<usize> {
        spans
            .iter()
            .flat_map(|span| {
                let first = span.first_position();
                first..first + span.len
            })
            .collect()
    }
}

/// The non-empty spans with their first rows (rows one after another), checked against the
/// call's `rows`.
fn placed(spans: &[Span], rows: usize) -> Vec<(usize, &Span)> {
    let mut start = 0;
    let mut placed = Vec::with_capacity(spans.len());
    for span in spans {
        if let Some(prefix) = &span.prefix {
            assert!(
                prefix.end <= rows && prefix.start <= prefix.end,
                "a span's prefix {prefix:?} lies outside the call's {rows} rows"
            );
        }
        if span.len > 0 {
            placed.push((start, span));
        }
        start += span.len;
    }
    assert_eq!(start, rows, "the spans cover {start} rows of {rows}");
    placed
}

/// One head's rows as `span` sees them: its prefix's, then its own from `start`.
fn context<T: Float>(
    x: &[T],
    row: usize,
    offset: usize,
    start: usize,
    span: &Span,
    head_dim: usize,
) -> Vec<T> {
    match &span.prefix {
        Some(prefix) => {
            let mut out = gather(x, row, offset, prefix.start, prefix.len(), head_dim);
            out.extend(gather(x, row, offset, start, span.len, head_dim));
            out
        }
        None => gather(x, row, offset, start, span.len, head_dim),
    }
}

/// Causal attention of whole sequences, as training computes it (no cache): `q (rows × heads ×
/// head_dim)`, `k` and `v (rows × kv_heads × head_dim)`, the rows being the `spans` one after
/// another (each a whole sequence, or a branch that continues a shared prefix). Writes `out`
/// (`q`'s shape) and, per row and head, the log-sum-exp of its scaled scores (`rows × heads`),
/// all the backward needs besides the inputs: it recomputes the probabilities, so no
/// `positions × positions` matrix is ever kept.
///
/// Each span and head runs as a task of its own, in blocks of `BLOCK` (64) query rows whose
/// scores, softmax and weighted sum are matrix products over the keys the block can see.
pub fn attention_forward<T: Float>(
    q: &[T],
    k: &[T],
    v: &[T],
    shape: Heads,
    spans: &[Span],
    out: &mut [T],
    lse: &mut [T],
) {
    let Heads {
        heads,
        kv_heads,
        head_dim,
        ..
    } = shape;
    let rows: usize = spans.iter().map(|s| s.len).sum();
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
    let scale = T::one() / T::of(head_dim as f64).sqrt();
    let units: Vec<(usize, &Span, usize)> = placed(spans, rows)
        .into_iter()
        .flat_map(|(start, span)| (0..heads).map(move |h| (start, span, h)))
        .collect();
    let parts: Vec<(Vec<T>, Vec<T>)> = units
        .par_iter()
        .map(|&(start, span, h)| {
            let (n, first) = (span.len, span.first_position());
            let kv = (h / groups) * head_dim;
            let query = gather(q, row, h * head_dim, start, n, head_dim);
            let keys = context(k, kv_row, kv, start, span, head_dim);
            let values = context(v, kv_row, kv, start, span, head_dim);
            let mut out_h = vec![T::zero(); n * head_dim];
            let mut lse_h = vec![T::zero(); n];
            let mut scores = Vec::new();
            for a in (0..n).step_by(BLOCK) {
                let b = (a + BLOCK).min(n);
                let seen = first + b;
                scores.clear();
                scores.resize((b - a) * seen, T::zero());
                let block = a * head_dim..b * head_dim;
                matmul_nt(
                    &query[block.clone()],
                    &keys[..seen * head_dim],
                    head_dim,
                    &mut scores,
                    false,
                );
                for (i, (scores, lse)) in scores
                    .chunks_exact_mut(seen)
                    .zip(&mut lse_h[a..b])
                    .enumerate()
                {
                    let position = first + a + i;
                    let (scores, unseen) = scores.split_at_mut(position + 1);
                    let (outside, seen) = scores.split_at_mut(shape.first_key(position));
                    outside.fill(T::zero());
                    let max = seen
                        .iter()
                        .fold(T::neg_infinity(), |m, &s| m.max(s * scale));
                    let mut total = T::zero();
                    for s in seen.iter_mut() {
                        *s = (*s * scale - max).fast_exp();
                        total += *s;
                    }
                    *lse = max + total.ln();
                    let inverse = T::one() / total;
                    seen.iter_mut().for_each(|s| *s *= inverse);
                    unseen.fill(T::zero());
                }
                matmul_nn(
                    &scores,
                    &values[..seen * head_dim],
                    head_dim,
                    &mut out_h[block],
                    false,
                );
            }
            (out_h, lse_h)
        })
        .collect();
    for (&(start, _, h), (out_h, lse_h)) in units.iter().zip(parts) {
        scatter(&out_h, out, row, h * head_dim, start, head_dim, false);
        for (i, value) in lse_h.into_iter().enumerate() {
            lse[(start + i) * heads + h] = value;
        }
    }
}

/// The gradients one span's KV head gathers: `dq` of each query head of its group (its own
/// rows), and `dk` and `dv` of every row it sees (its prefix's, then its own).
struct KvHeadGradients<T> {
    dq: Vec<Vec<T>>,
    dk: Vec<T>,
    dv: Vec<T>,
}

/// The backward of [`attention_forward`]: writes `dq`, `dk` and `dv` (the inputs' shapes) from
/// `d_out`, recomputing each block's probabilities from `lse`. Spans and KV heads run in
/// parallel (each one's keys gather the gradient of every query head of their group), in
/// blocks of `BLOCK` (64) query rows whose five products are matrix products. A shared prefix's
/// keys and values get the sum of what its own rows and every branch's give them, added in the
/// spans' order.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Float>(
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    lse: &[T],
    d_out: &[T],
    shape: Heads,
    spans: &[Span],
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    let Heads {
        heads,
        kv_heads,
        head_dim,
        ..
    } = shape;
    let (row, kv_row, groups) = (heads * head_dim, kv_heads * head_dim, heads / kv_heads);
    assert_eq!(dq.len(), q.len(), "dq must have q's shape");
    assert_eq!(dk.len(), k.len(), "dk must have k's shape");
    assert_eq!(dv.len(), v.len(), "dv must have v's shape");
    let rows = q.len() / row;
    let scale = T::one() / T::of(head_dim as f64).sqrt();
    let units: Vec<(usize, &Span, usize)> = placed(spans, rows)
        .into_iter()
        .flat_map(|(start, span)| (0..kv_heads).map(move |kvh| (start, span, kvh)))
        .collect();
    let parts: Vec<KvHeadGradients<T>> = units
        .par_iter()
        .map(|&(start, span, kvh)| {
            let (n, first) = (span.len, span.first_position());
            let kv = kvh * head_dim;
            let keys = context(k, kv_row, kv, start, span, head_dim);
            let values = context(v, kv_row, kv, start, span, head_dim);
            let mut dk_part = vec![T::zero(); (first + n) * head_dim];
            let mut dv_part = vec![T::zero(); (first + n) * head_dim];
            let (mut p, mut ds) = (Vec::new(), Vec::new());
            let dq_parts = (0..groups)
                .map(|g| {
                    let h = kvh * groups + g;
                    let query = gather(q, row, h * head_dim, start, n, head_dim);
                    let d_o = gather(d_out, row, h * head_dim, start, n, head_dim);
                    let o = gather(out, row, h * head_dim, start, n, head_dim);
                    let mut dq_part = vec![T::zero(); n * head_dim];
                    for a in (0..n).step_by(BLOCK) {
                        let b = (a + BLOCK).min(n);
                        let seen = first + b;
                        let block = a * head_dim..b * head_dim;
                        let (seen_keys, seen_values) =
                            (&keys[..seen * head_dim], &values[..seen * head_dim]);
                        p.clear();
                        p.resize((b - a) * seen, T::zero());
                        ds.clear();
                        ds.resize((b - a) * seen, T::zero());
                        matmul_nt(&query[block.clone()], seen_keys, head_dim, &mut p, false);
                        for (i, p) in p.chunks_exact_mut(seen).enumerate() {
                            let l = lse[(start + a + i) * heads + h];
                            let position = first + a + i;
                            let (p, unseen) = p.split_at_mut(position + 1);
                            let (outside, seen) = p.split_at_mut(shape.first_key(position));
                            outside.fill(T::zero());
                            seen.iter_mut()
                                .for_each(|s| *s = (*s * scale - l).fast_exp());
                            unseen.fill(T::zero());
                        }
                        // dV += Pᵀ·dO and dP = dO·Vᵀ.
                        matmul_tn(
                            &p,
                            &d_o[block.clone()],
                            head_dim,
                            &mut dv_part[..seen * head_dim],
                            true,
                        );
                        matmul_nt(&d_o[block.clone()], seen_values, head_dim, &mut ds, false);
                        // dS = P ⊙ (dP - rowsum(dO ⊙ O)) · scale, then dQ = dS·K, dK += dSᵀ·Q.
                        for (i, (ds, p)) in ds
                            .chunks_exact_mut(seen)
                            .zip(p.chunks_exact(seen))
                            .enumerate()
                        {
                            let r = (a + i) * head_dim..(a + i + 1) * head_dim;
                            let delta = dot(&d_o[r.clone()], &o[r]);
                            for (d, &p) in ds.iter_mut().zip(p) {
                                *d = p * (*d - delta) * scale;
                            }
                        }
                        matmul_nn(&ds, seen_keys, head_dim, &mut dq_part[block.clone()], false);
                        matmul_tn(
                            &ds,
                            &query[block],
                            head_dim,
                            &mut dk_part[..seen * head_dim],
                            true,
                        );
                    }
                    dq_part
                })
                .collect();
            KvHeadGradients {
                dq: dq_parts,
                dk: dk_part,
                dv: dv_part,
            }
        })
        .collect();
    // Every row's own gradients first, then what the branches add to their prefixes.
    for (&(start, span, kvh), part) in units.iter().zip(&parts) {
        for (g, dq_part) in part.dq.iter().enumerate() {
            let h = kvh * groups + g;
            scatter(dq_part, dq, row, h * head_dim, start, head_dim, false);
        }
        let own = span.first_position() * head_dim..;
        scatter(
            &part.dk[own.clone()],
            dk,
            kv_row,
            kvh * head_dim,
            start,
            head_dim,
            false,
        );
        scatter(
            &part.dv[own],
            dv,
            kv_row,
            kvh * head_dim,
            start,
            head_dim,
            false,
        );
    }
    for (&(_, span, kvh), part) in units.iter().zip(&parts) {
        if let Some(prefix) = &span.prefix {
            let seen = ..prefix.len() * head_dim;
            let kv = kvh * head_dim;
            scatter(&part.dk[seen], dk, kv_row, kv, prefix.start, head_dim, true);
            scatter(&part.dv[seen], dv, kv_row, kv, prefix.start, head_dim, true);
        }
    }
}
