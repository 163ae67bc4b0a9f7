//! `out = x · Wᵀ` (or `out += x · Wᵀ`) with `x (m × k)` and `W (n × k)` row-major, as Hugging
//! Face stores projection weights: every output is a dot product of two contiguous rows.
//!
//! Each dot product runs over 16 lanes in order of `k` and is reduced by one fixed tree, whatever
//! `m`, the tile it is computed in, or the thread: the batch invariance the sampler's
//! determinism rests on. Outputs are computed in register tiles (up to 4 rows of `x` by 4 rows
//! of `W`, so that each load feeds several multiply-adds); row and column blocks run in
//! parallel.

use std::sync::LazyLock;

use rayon::prelude::*;

const LANES: usize = 16;
/// Column blocks are a multiple of the widest tile of `W` rows.
const TILE: usize = 4;
/// Rows of `x` per parallel task.
const ROW_BLOCK: usize = 32;
/// Problems smaller than this many multiply-adds run on the calling thread.
pub(crate) const SERIAL_BELOW: usize = 1 << 20;

#[inline(always)]
fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// The fixed reduction of the 16 lanes.
#[inline(always)]
pub(crate) fn reduce(lanes: [f32; LANES]) -> f32 {
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

/// The dot products of `XR` rows of `x` with `WR` rows of `W`. Every product has its own 16
/// accumulator lanes and sees the same sequence of multiply-adds whatever the tile, so a tile of
/// any shape gives each output bit for bit what a 1 × 1 tile would.
#[inline(always)]
fn dot_tile<const FUSED: bool, const XR: usize, const WR: usize>(
    x: [&[f32]; XR],
    w: [&[f32]; WR],
) -> [[f32; WR]; XR] {
    let k = x[0].len();
    let mut acc = [[[0.0f32; LANES]; WR]; XR];
    let full = k / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        for r in 0..XR {
            let xs = &x[r][c..c + LANES];
            for t in 0..WR {
                let ws = &w[t][c..c + LANES];
                for l in 0..LANES {
                    acc[r][t][l] = madd::<FUSED>(xs[l], ws[l], acc[r][t][l]);
                }
            }
        }
    }
    for i in full..k {
        for r in 0..XR {
            for t in 0..WR {
                acc[r][t][i - full] = madd::<FUSED>(x[r][i], w[t][i], acc[r][t][i - full]);
            }
        }
    }
    acc.map(|row| row.map(reduce))
}

/// Row `i` of a row-major matrix of rows of `k`.
#[inline(always)]
fn row_of(data: &[f32], k: usize, i: usize) -> &[f32] {
    &data[i * k..(i + 1) * k]
}

/// One block of outputs: every row of `x`, columns `cols` of `W`, in tiles of `XR` rows of `x`
/// by `WR` rows of `W` (`tile`); rows of `x` past the last full tile go one at a time (`single`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block<const XR: usize, const WR: usize>(
    tile: impl Fn([&[f32]; XR], [&[f32]; WR]) -> [[f32; WR]; XR],
    single: impl Fn([&[f32]; 1], [&[f32]; WR]) -> [[f32; WR]; 1],
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    let rows = x.len() / k;
    let mut store = |i: usize, j: usize, value: f32| {
        if accumulate {
            out[i * n + j] += value;
        } else {
            out[i * n + j] = value;
        }
    };
    let tiled_rows = rows / XR * XR;
    let mut j = cols.start;
    while j < cols.end {
        // A short last tile repeats its last row of `W`; the repeats are computed and dropped.
        let width = WR.min(cols.end - j);
        let rows_of_w: [&[f32]; WR] =
            std::array::from_fn(|t| row_of(w, k, (j + t).min(cols.end - 1)));
        for i in (0..tiled_rows).step_by(XR) {
            let rows_of_x: [&[f32]; XR] = std::array::from_fn(|r| row_of(x, k, i + r));
            let dots = tile(rows_of_x, rows_of_w);
            for (r, dots) in dots.iter().enumerate() {
                for (t, &value) in dots.iter().enumerate().take(width) {
                    store(i + r, j + t, value);
                }
            }
        }
        for i in tiled_rows..rows {
            let [dots] = single([row_of(x, k, i)], rows_of_w);
            for (t, &value) in dots.iter().enumerate().take(width) {
                store(i, j + t, value);
            }
        }
        j += WR;
    }
}

/// [`dot_tile`] for 4 × 4 rows with AVX-512: one 16-lane register per product, the same
/// multiply-adds in the same order, so the same bits.
///
/// # Safety
/// The CPU must have AVX-512F; every row must have the length of `x[0]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_tile_avx512(x: [&[f32]; 4], w: [&[f32]; 4]) -> [[f32; 4]; 4] {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    let k = x[0].len();
    let full = k / LANES * LANES;
    let mut acc: [[__m512; 4]; 4] = [[_mm512_setzero_ps(); 4]; 4];
    let mut c = 0;
    while c < full {
        let mut xs = [_mm512_setzero_ps(); 4];
        let mut ws = [_mm512_setzero_ps(); 4];
        for r in 0..4 {
            // SAFETY: c + 16 <= full <= k, the length of every row.
            unsafe {
                xs[r] = _mm512_loadu_ps(x[r].as_ptr().add(c));
                ws[r] = _mm512_loadu_ps(w[r].as_ptr().add(c));
            }
        }
        for r in 0..4 {
            for t in 0..4 {
                acc[r][t] = _mm512_fmadd_ps(xs[r], ws[t], acc[r][t]);
            }
        }
        c += LANES;
    }
    let mut dots = [[0.0f32; 4]; 4];
    for r in 0..4 {
        for t in 0..4 {
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` holds 16 floats.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r][t]) };
            for i in full..k {
                lanes[i - full] = x[r][i].mul_add(w[t][i], lanes[i - full]);
            }
            dots[r][t] = reduce(lanes);
        }
    }
    dots
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn block_avx512(
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    let tile = |x: [&[f32]; 4], w: [&[f32]; 4]| {
        debug_assert!(x.iter().chain(&w).all(|r| r.len() == k));
        // SAFETY: this function only runs on CPUs with AVX-512F; rows are `k` long.
        unsafe { dot_tile_avx512(x, w) }
    };
    // Closures, not function items: they inherit this function's target features, so the
    // multiply-adds compile to FMA instructions rather than calls.
    let single = |x: [&[f32]; 1], w: [&[f32]; 4]| dot_tile::<true, 1, 4>(x, w);
    block::<4, 4>(tile, single, x, w, k, cols, out, n, accumulate)
}

/// [`dot_tile`] for `XR × WR` rows with AVX2: each product's 16 lanes are two 8-lane registers,
/// fed the same fused multiply-adds in the same order, so the same bits as every other path.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every row must have the length of `x[0]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
// Indices, as in the other tiles: the registers of a product are addressed by (row, W row, half).
#[allow(clippy::needless_range_loop)]
unsafe fn dot_tile_avx2<const XR: usize, const WR: usize>(
    x: [&[f32]; XR],
    w: [&[f32]; WR],
) -> [[f32; WR]; XR] {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let k = x[0].len();
    let full = k / LANES * LANES;
    let mut acc: [[[__m256; 2]; WR]; XR] = [[[_mm256_setzero_ps(); 2]; WR]; XR];
    let mut c = 0;
    while c < full {
        for half in 0..2 {
            let at = c + half * 8;
            let mut xs = [_mm256_setzero_ps(); XR];
            for r in 0..XR {
                // SAFETY: at + 8 <= full <= k, the length of every row.
                xs[r] = unsafe { _mm256_loadu_ps(x[r].as_ptr().add(at)) };
            }
            for t in 0..WR {
                // SAFETY: as above.
                let ws = unsafe { _mm256_loadu_ps(w[t].as_ptr().add(at)) };
                for r in 0..XR {
                    acc[r][t][half] = _mm256_fmadd_ps(xs[r], ws, acc[r][t][half]);
                }
            }
        }
        c += LANES;
    }
    let mut dots = [[0.0f32; WR]; XR];
    for r in 0..XR {
        for t in 0..WR {
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` holds 16 floats, two registers of 8.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][t][0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r][t][1]);
            }
            for i in full..k {
                lanes[i - full] = x[r][i].mul_add(w[t][i], lanes[i - full]);
            }
            dots[r][t] = reduce(lanes);
        }
    }
    dots
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    // SAFETY (both): this function only runs on CPUs with AVX2 and FMA; rows are `k` long.
    let tile = |x: [&[f32]; 2], w: [&[f32]; 4]| unsafe { dot_tile_avx2::<2, 4>(x, w) };
    let single = |x: [&[f32]; 1], w: [&[f32]; 4]| unsafe { dot_tile_avx2::<1, 4>(x, w) };
    block::<2, 4>(tile, single, x, w, k, cols, out, n, accumulate)
}

/// The instruction sets this CPU offers the kernels. AVX2 and AVX-512 both use fused
/// multiply-adds in the same order, so they give the same bits; only CPUs without FMA differ.
#[derive(Clone, Copy, PartialEq)]
enum Isa {
    Portable,
    Avx2,
    Avx512,
}

static ISA: LazyLock<Isa> = LazyLock::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if fma && is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if fma {
            return Isa::Avx2;
        }
    }
    Isa::Portable
});

/// Whether this CPU's path uses fused multiply-adds (every path but the portable one): a kernel
/// that keeps the same bits must then use them too.
pub(crate) fn fused() -> bool {
    *ISA != Isa::Portable
}

/// One block on this CPU's best path.
pub(crate) fn block_dispatch(
    x: &[f32],
    w: &[f32],
    k: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    n: usize,
    accumulate: bool,
) {
    match *ISA {
        // SAFETY: the CPU has the instruction sets these paths are compiled for (checked at run
        // time when `ISA` was set).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { block_avx512(x, w, k, cols, out, n, accumulate) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { block_avx2(x, w, k, cols, out, n, accumulate) },
        _ => {
            let tile = dot_tile::<false, 1, 4>;
            block::<1, 4>(tile, tile, x, w, k, cols, out, n, accumulate)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path of this CPU gives each output the bits of a 1 × 1 tile of fused multiply-adds,
    /// whatever the tile it falls in (full tiles, the last rows alone, a short last column tile)
    /// and however `k` splits into 16 lanes.
    #[test]
    fn this_cpus_tiles_give_the_bits_of_one_product_at_a_time() {
        let mut state = 0x2545_f491_u32;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as f32 / u32::MAX as f32 - 0.5
        };
        for (m, k, n) in [
            (1, 1, 1),
            (3, 17, 5),
            (2, 16, 4),
            (5, 40, 9),
            (7, 576, 6),
            (4, 33, 8),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| random()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| random()).collect();
            let mut fast = vec![0.0; m * n];
            block_dispatch(&x, &w, k, 0..n, &mut fast, n, false);
            let mut one = vec![0.0; m * n];
            let tile = dot_tile::<true, 1, 1>;
            block::<1, 1>(tile, tile, &x, &w, k, 0..n, &mut one, n, false);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&one), "m {m} k {k} n {n}");
        }
    }
}
