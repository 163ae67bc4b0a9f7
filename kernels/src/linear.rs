//! `out = x · Wᵀ` (or `out += x · Wᵀ`) with `x (m × k)` and `W (n × k)` row-major, as Hugging
//! Face stores projection weights: every output is a dot product of two contiguous rows.
//!
//! Each dot product runs over 16 lanes in order of `k` and is reduced by one fixed tree, whatever
//! `m`, the tile it is computed in, or the thread: the batch invariance the sampler's
//! determinism rests on. Four rows of `W` are read together so that a row of `x` is loaded once
//! per four outputs; row and column blocks run in parallel.

use std::sync::LazyLock;

use rayon::prelude::*;

const LANES: usize = 16;
const TILE: usize = 4;
/// Rows of `x` per parallel task.
const ROW_BLOCK: usize = 32;
/// Problems smaller than this many multiply-adds run on the calling thread.
pub(crate) const SERIAL_BELOW: usize = 1 << 20;

/// Whether this CPU has AVX2 and FMA (then every dot product uses fused multiply-adds).
static FMA: LazyLock<bool> = LazyLock::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
});

#[inline(always)]
fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// The fixed reduction of the 16 lanes.
#[inline(always)]
fn reduce(lanes: [f32; LANES]) -> f32 {
    let mut v = lanes;
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            v[i] += v[i + width];
        }
        width /= 2;
    }
    v[0]
}

/// The dot products of `x` with four rows of `W`, each exactly as [`dot`] computes it alone.
#[inline(always)]
fn dot_tile<const FUSED: bool>(x: &[f32], w: [&[f32]; TILE]) -> [f32; TILE] {
    let k = x.len();
    let mut acc = [[0.0f32; LANES]; TILE];
    let full = k / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        let xs: &[f32; LANES] = x[c..c + LANES].try_into().expect("a full chunk");
        for t in 0..TILE {
            let ws: &[f32; LANES] = w[t][c..c + LANES].try_into().expect("a full chunk");
            for l in 0..LANES {
                acc[t][l] = madd::<FUSED>(xs[l], ws[l], acc[t][l]);
            }
        }
    }
    for i in full..k {
        for t in 0..TILE {
            acc[t][i - full] = madd::<FUSED>(x[i], w[t][i], acc[t][i - full]);
        }
    }
    acc.map(reduce)
}

/// One block of outputs: rows `rows` of `x`, columns `cols` of `W`.
#[inline(always)]
fn block<const FUSED: bool>(
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    let w_row = |j: usize| &w[j * k..(j + 1) * k];
    let mut j = cols.start;
    while j < cols.end {
        // A short last tile repeats its last row; the repeats are computed and dropped.
        let tile: [usize; TILE] = std::array::from_fn(|t| (j + t).min(cols.end - 1));
        let rows_of_w = tile.map(w_row);
        for (x_row, out_row) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
            let dots = dot_tile::<FUSED>(x_row, rows_of_w);
            for t in 0..TILE.min(cols.end - j) {
                if accumulate {
                    out_row[j + t] += dots[t];
                } else {
                    out_row[j + t] = dots[t];
                }
            }
        }
        j += TILE;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_fma(
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    block::<true>(x, w, k, cols, out, n, accumulate)
}

/// One block on this CPU's best path.
fn block_dispatch(
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if *FMA {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time above).
        unsafe { block_fma(x, w, k, cols, out, n, accumulate) };
        return;
    }
    block::<false>(x, w, k, cols, out, n, accumulate)
}

/// `out (m × n) = x (m × k) · Wᵀ`, or `out += x · Wᵀ` when `accumulate`. Panics when the lengths
/// do not fit `k`.
pub fn linear(x: &[f32], w: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "x and W must be rows of {k}"
    );
    let (m, n) = (x.len() / k, w.len() / k);
    assert_eq!(out.len(), m * n, "out must be {m} × {n}");
    if m == 0 || n == 0 {
        return;
    }
    // Below about a million multiply-adds, waking other threads costs more than it saves.
    if m * n * k < SERIAL_BELOW {
        block_dispatch(x, w, k, 0..n, out, n, accumulate);
        return;
    }
    // Column blocks give parallelism at m = 1 (decode); row blocks when m is large (prefill).
    let threads = rayon::current_num_threads().max(1);
    let col_blocks = if m >= ROW_BLOCK * threads {
        1
    } else {
        (threads * 4).min(n.div_ceil(TILE))
    };
    let cols_per_block = n.div_ceil(col_blocks).div_ceil(TILE) * TILE;
    out.par_chunks_mut(ROW_BLOCK * n)
        .zip(x.par_chunks(ROW_BLOCK * k))
        .for_each(|(out_rows, x_rows)| {
            if col_blocks == 1 {
                block_dispatch(x_rows, w, k, 0..n, out_rows, n, accumulate);
                return;
            }
            // Column blocks of one row block write disjoint columns of `out_rows`; each gets a
            // private buffer that is copied back, keeping the code free of shared mutable state.
            let rows = x_rows.len() / k;
            let parts: Vec<(std::ops::Range<usize>, Vec<f32>)> = (0..n)
                .step_by(cols_per_block)
                .collect::<Vec<_>>()
                .into_par_iter()
                .map(|start| {
                    let cols = start..(start + cols_per_block).min(n);
                    let width = cols.len();
                    let mut part = vec![0.0; rows * width];
                    let w_part = &w[cols.start * k..cols.end * k];
                    block_dispatch(x_rows, w_part, k, 0..width, &mut part, width, false);
                    (cols, part)
                })
                .collect();
            for (cols, part) in parts {
                let width = cols.len();
                for (out_row, part_row) in
                    out_rows.chunks_exact_mut(n).zip(part.chunks_exact(width))
                {
                    let target = &mut out_row[cols.clone()];
                    if accumulate {
                        for (o, p) in target.iter_mut().zip(part_row) {
                            *o += p;
                        }
                    } else {
                        target.copy_from_slice(part_row);
                    }
                }
            }
        });
}

/// [`linear`] on the calling thread only (for kernels that parallelise over something else).
/// Bit-identical to [`linear`].
pub fn linear_serial(x: &[f32], w: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "x and W must be rows of {k}"
    );
    let n = w.len() / k;
    assert_eq!(out.len(), x.len() / k * n, "out must be rows × {n}");
    if n > 0 {
        block_dispatch(x, w, k, 0..n, out, n, accumulate);
    }
}
