//! The mixed-adapter LoRA apply: a batch's rows come in runs (segments) that share an adapter
//! (or none: the base model); each adapted row gets `y += scale · (x Aᵀ) Bᵀ` with its own
//! adapter's `A (rank × in)` and `B (out × rank)`. The shrink into rank space and the expand back
//! are done per segment, segments in parallel, so sixteen adapters in one batch cost about one.

use rayon::prelude::*;

use crate::float::Float;
use crate::gemm::{matmul_nn, matmul_nt, matmul_tn};
use crate::linear::{SERIAL_BELOW, linear_serial};

/// One adapter's low-rank pair at one projection.
#[derive(Clone, Copy, Debug)]
pub struct LoraPair<'a, T = f32> {
    /// `rank × in`, row-major.
    pub a: &'a [T],
    /// `out × rank`, row-major.
    pub b: &'a [T],
    pub rank: usize,
    pub scale: T,
}

/// A run of consecutive rows that share one adapter (`None`: no delta).
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a, T = f32> {
    pub rows: usize,
    pub pair: Option<LoraPair<'a, T>>,
}

/// The gradients of one segment's pair, accumulated into by [`lora_backward`].
pub struct LoraGrad<'a, T> {
    /// `rank × in`.
    pub a: &'a mut [T],
    /// `out × rank`.
    pub b: &'a mut [T],
}

/// `y (rows × out) += scale · (x Aᵀ) Bᵀ` for every segment with an adapter; `x` is `rows × inp`.
/// Panics when the segments do not cover the rows or a pair does not fit `inp` and `out`.
pub fn lora_apply(x: &[f32], inp: usize, y: &mut [f32], out: usize, segments: &[Segment<'_>]) {
    let rows: usize = segments.iter().map(|s| s.rows).sum();
    assert_eq!(x.len(), rows * inp, "x must be {rows} × {inp}");
    assert_eq!(y.len(), rows * out, "y must be {rows} × {out}");
    // Jobs of at most `ROWS_PER_JOB` rows: a segment of many rows is split, so one adapter
    // alone still uses every thread.
    let mut jobs = Vec::with_capacity(segments.len());
    let (mut x_rest, mut y_rest) = (x, y);
    for segment in segments {
        let (x_seg, x_next) = x_rest.split_at(segment.rows * inp);
        let (y_seg, y_next) = std::mem::take(&mut y_rest).split_at_mut(segment.rows * out);
        (x_rest, y_rest) = (x_next, y_next);
        if let Some(pair) = segment.pair {
            assert_eq!(pair.a.len(), pair.rank * inp, "A must be rank × {inp}");
            assert_eq!(pair.b.len(), out * pair.rank, "B must be {out} × rank");
            jobs.push((x_seg, y_seg, pair));
        }
    }
    let work: usize = jobs
        .iter()
        .map(|(x, _, p)| x.len() / inp * p.rank * (inp + out))
        .sum();
    let run = |(x_seg, y_seg, pair): (&[f32], &mut [f32], LoraPair<'_>)| {
        let mut shrunk = vec![0.0; x_seg.len() / inp * pair.rank];
        linear_serial(x_seg, pair.a, inp, &mut shrunk, false);
        for s in &mut shrunk {
            *s *= pair.scale;
        }
        linear_serial(&shrunk, pair.b, pair.rank, y_seg, true);
    };
    if work < SERIAL_BELOW {
        jobs.into_iter().for_each(run);
        return;
    }
    let split: Vec<_> = jobs
        .into_iter()
        .flat_map(|(x_seg, y_seg, pair)| {
            x_seg
                .chunks(ROWS_PER_JOB * inp)
                .zip(y_seg.chunks_mut(ROWS_PER_JOB * out))
                .map(move |(x, y)| (x, y, pair))
        })
        .collect();
    split.into_par_iter().for_each(run);
}

/// Rows a parallel job of the apply takes at most.
const ROWS_PER_JOB: usize = 8;

/// The runs of `x (rows × inp)` and `y (rows × out)` of each segment that has an adapter.
fn adapted<'s, 'x, T: Float>(
    x: &'x [T],
    inp: usize,
    out: usize,
    segments: &'s [Segment<'s, T>],
) -> impl Iterator<Item = (usize, std::ops::Range<usize>, LoraPair<'s, T>)> + use<'s, 'x, T> {
    let rows: usize = segments.iter().map(|s| s.rows).sum();
    assert_eq!(x.len(), rows * inp, "x must be {rows} × {inp}");
    let mut start = 0;
    segments
        .iter()
        .enumerate()
        .filter_map(move |(index, segment)| {
            let range = start..start + segment.rows;
            start += segment.rows;
            segment.pair.map(|pair| {
                assert_eq!(pair.a.len(), pair.rank * inp, "A must be rank × {inp}");
                assert_eq!(pair.b.len(), out * pair.rank, "B must be {out} × rank");
                (index, range, pair)
            })
        })
}

/// The training path's apply: `y (rows × out) += scale · (x Aᵀ) Bᵀ` per segment, through the
/// blocked matrix products (not batch-invariant; training does not need it). Generic over
/// [`Float`] for gradient checks in f64.
pub fn lora_forward<T: Float>(
    x: &[T],
    inp: usize,
    y: &mut [T],
    out: usize,
    segments: &[Segment<'_, T>],
) {
    for (_, rows, pair) in adapted(x, inp, out, segments) {
        let x_seg = &x[rows.start * inp..rows.end * inp];
        let mut shrunk = vec![T::zero(); rows.len() * pair.rank];
        matmul_nt(x_seg, pair.a, inp, &mut shrunk, false);
        shrunk.iter_mut().for_each(|s| *s *= pair.scale);
        matmul_nt(
            &shrunk,
            pair.b,
            pair.rank,
            &mut y[rows.start * out..rows.end * out],
            true,
        );
    }
}

/// The backward of [`lora_forward`] from `dy (rows × out)`: `dx += ` each segment's input
/// gradient and, per segment with an adapter, its `grads` entry `+= ∂A, ∂B` (`grads` has one
/// entry per segment; `None` where a segment's pair is not trained).
pub fn lora_backward<T: Float>(
    x: &[T],
    inp: usize,
    dy: &[T],
    out: usize,
    segments: &[Segment<'_, T>],
    grads: &mut [Option<LoraGrad<'_, T>>],
    dx: &mut [T],
) {
    assert_eq!(
        grads.len(),
        segments.len(),
        "one gradient entry per segment"
    );
    assert_eq!(dx.len(), x.len(), "dx must have x's shape");
    for (index, rows, pair) in adapted(x, inp, out, segments) {
        let (x_seg, dy_seg) = (
            &x[rows.start * inp..rows.end * inp],
            &dy[rows.start * out..rows.end * out],
        );
        let rank = pair.rank;
        // d(shrunk) = scale · dy B, the gradient in rank space.
        let mut d_shrunk = vec![T::zero(); rows.len() * rank];
        matmul_nn(dy_seg, pair.b, rank, &mut d_shrunk, false);
        d_shrunk.iter_mut().for_each(|d| *d *= pair.scale);
        if let Some(grad) = grads[index].as_mut() {
            let mut shrunk = vec![T::zero(); rows.len() * rank];
            matmul_nt(x_seg, pair.a, inp, &mut shrunk, false);
            shrunk.iter_mut().for_each(|s| *s *= pair.scale);
            matmul_tn(dy_seg, &shrunk, rank, grad.b, true);
            matmul_tn(&d_shrunk, x_seg, inp, grad.a, true);
        }
        matmul_nn(
            &d_shrunk,
            pair.a,
            inp,
            &mut dx[rows.start * inp..rows.end * inp],
            true,
        );
    }
}
