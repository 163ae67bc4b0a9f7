//! The mixed-adapter LoRA apply: a batch's rows come in runs (segments) that share an adapter
//! (or none: the base model); each adapted row gets `y += scale · (x Aᵀ) Bᵀ` with its own
//! adapter's `A (rank × in)` and `B (out × rank)`. The shrink into rank space and the expand back
//! are done per segment, segments in parallel, so sixteen adapters in one batch cost about one.

use rayon::prelude::*;

use crate::linear::{SERIAL_BELOW, linear_serial};

/// One adapter's low-rank pair at one projection.
#[derive(Clone, Copy, Debug)]
pub struct LoraPair<'a> {
    /// `rank × in`, row-major.
    pub a: &'a [f32],
    /// `out × rank`, row-major.
    pub b: &'a [f32],
    pub rank: usize,
    pub scale: f32,
}

/// A run of consecutive rows that share one adapter (`None`: no delta).
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    pub rows: usize,
    pub pair: Option<LoraPair<'a>>,
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
