//! Frozen weights kept in blocks (QLoRA's idea on this crate's kernels): a [`QuantMatrix`] holds
//! each row as blocks of 32 small integers and one f32 scale, a quarter (Q8_0) or an eighth
//! (Q4_0) of the f32 matrix's bytes, and the products dequantize a panel of rows at a time into
//! a scratch buffer and run the f32 kernels on it. A model's frozen base can then stay in blocks
//! while LoRA trains on top; no f32 copy of the whole matrix ever exists.
//!
//! A [`Weight`] is what the CPU backends take for a matrix: dense f32 (or f64) rows, or blocks.
//! Its products give, for blocks, what the dense products give on the dequantized matrix:
//! [`Weight::linear`] bit for bit (the sampler's kernel keeps a row's result independent of the
//! tile it lands in, so computing panel by panel changes nothing), the training products up to
//! the summation order of `gemm`.
//!
//! The formats are llama.cpp's, with the scale kept in f32: Q8_0 rounds `x / d` with
//! `d = max|x| / 127`; Q4_0 takes `d = m / -8` for the value `m` of largest magnitude and keeps
//! `x / d + 8` in 4 bits, the block's first 16 values in the low halves of its 16 bytes and the
//! last 16 in the high halves.

use rayon::prelude::*;

use crate::float::Float;
use crate::gemm::{matmul_nn, matmul_nn_from, matmul_nt, matmul_nt_into};
use crate::linear::{SERIAL_BELOW, block_dispatch, fused, linear, reduce};

/// Values per block.
pub const BLOCK_LEN: usize = 32;

/// Values of `W` dequantized at a time by the training products (a panel of rows: 1 MiB of f32).
const PANEL_VALUES: usize = 1 << 18;
/// Rows of `W` per panel in the sampler's product.
const LINEAR_PANEL_ROWS: usize = 64;
/// Rows of `x` up to which the sampler's product of Q8_0 blocks converts them in registers
/// rather than dequantizing a panel (decoding a batch: the bytes of `W` are the cost).
const IN_REGISTERS_UP_TO: usize = 16;

/// How a [`QuantMatrix`] stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// 8-bit integers and a scale per block: 36 bytes for 32 values (0.28x of f32).
    Q8_0,
    /// 4-bit integers and a scale per block: 20 bytes for 32 values (0.16x of f32).
    Q4_0,
}

impl BlockFormat {
    /// Bytes of one block's integers.
    const fn quant_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => BLOCK_LEN,
            BlockFormat::Q4_0 => BLOCK_LEN / 2,
        }
    }

    /// The block's scale and integers of `values` (32 of them).
    fn quantize_block(self, values: &[f32], quants: &mut [u8]) -> f32 {
        match self {
            BlockFormat::Q8_0 => {
                let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
                for (q, &v) in quants.iter_mut().zip(values) {
                    *q = (v * inverse).round() as i8 as u8;
                }
                d
            }
            BlockFormat::Q4_0 => {
                let extreme = values
                    .iter()
                    .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = extreme / -8.0;
                let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
                let nibble = |v: f32| ((v * inverse + 8.5) as u8).min(15);
                let (low, high) = values.split_at(BLOCK_LEN / 2);
                for ((q, &l), &h) in quants.iter_mut().zip(low).zip(high) {
                    *q = nibble(l) | (nibble(h) << 4);
                }
                d
            }
        }
    }

    /// The 32 values of a block.
    fn dequantize_block<T: Float>(self, d: f32, quants: &[u8], out: &mut [T]) {
        match self {
            BlockFormat::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(quants) {
                    *o = T::of(f64::from(f32::from(q as i8) * d));
                }
            }
            BlockFormat::Q4_0 => {
                let (low, high) = out.split_at_mut(BLOCK_LEN / 2);
                for ((l, h), &q) in low.iter_mut().zip(high).zip(quants) {
                    *l = T::of(f64::from((i32::from(q & 0xf) - 8) as f32 * d));
                    *h = T::of(f64::from((i32::from(q >> 4) - 8) as f32 * d));
                }
            }
        }
    }
}

/// Why a matrix cannot be kept in blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizeError {
    /// The length of the matrix's rows.
    pub cols: usize,
}

impl std::fmt::Display for QuantizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rows of {} values do not split into blocks of {BLOCK_LEN}",
            self.cols
        )
    }
}

impl std::error::Error for QuantizeError {}

/// A row-major matrix `rows × cols` in blocks of [`BLOCK_LEN`] values along each row.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    format: BlockFormat,
    cols: usize,
    /// One per block, row by row.
    scales: Vec<f32>,
    /// [`BlockFormat::quant_bytes`] per block, in the scales' order.
    quants: Vec<u8>,
}

impl QuantMatrix {
    /// `values` (rows of `cols`) in `format`. Refuses rows that do not split into blocks.
    pub fn quantize(
        values: &[f32],
        cols: usize,
        format: BlockFormat,
    ) -> Result<Self, QuantizeError> {
        if cols == 0 || !cols.is_multiple_of(BLOCK_LEN) || !values.len().is_multiple_of(cols) {
            return Err(QuantizeError { cols });
        }
        let blocks = values.len() / BLOCK_LEN;
        let bytes = format.quant_bytes();
        let mut scales = vec![0.0f32; blocks];
        let mut quants = vec![0u8; blocks * bytes];
        scales
            .par_iter_mut()
            .zip(quants.par_chunks_mut(bytes))
            .zip(values.par_chunks(BLOCK_LEN))
            .for_each(|((d, q), v)| *d = format.quantize_block(v, q));
        Ok(QuantMatrix {
            format,
            cols,
            scales,
            quants,
        })
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.scales.len() * BLOCK_LEN / self.cols
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (scales and integers).
    pub fn bytes(&self) -> usize {
        self.scales.len() * std::mem::size_of::<f32>() + self.quants.len()
    }

    /// Rows `first..first + out.len() / cols`, dequantized into `out`.
    pub fn dequantize_rows<T: Float>(&self, first: usize, out: &mut [T]) {
        let start = first * self.cols / BLOCK_LEN;
        let bytes = self.format.quant_bytes();
        for (b, chunk) in out.chunks_exact_mut(BLOCK_LEN).enumerate() {
            let block = start + b;
            let quants = &self.quants[block * bytes..][..bytes];
            self.format
                .dequantize_block(self.scales[block], quants, chunk);
        }
    }

    /// Every value, dequantized.
    pub fn dequantize<T: Float>(&self) -> Vec<T> {
        let mut out = vec![T::zero(); self.rows() * self.cols];
        out.par_chunks_mut(self.cols)
            .enumerate()
            .for_each(|(row, values)| self.dequantize_rows(row, values));
        out
    }

    /// Rows `first..first + out.len() / cols` into `out`, in parallel when they are many.
    fn dequantize_panel<T: Float>(&self, first: usize, out: &mut [T]) {
        let cols = self.cols;
        if out.len() < 1 << 16 {
            self.dequantize_rows(first, out);
        } else {
            out.par_chunks_mut(cols)
                .enumerate()
                .for_each(|(r, row)| self.dequantize_rows(first + r, row));
        }
    }

    /// Rows per panel of the training products.
    fn panel_rows(&self) -> usize {
        (PANEL_VALUES / self.cols).clamp(16, self.rows().max(16))
    }

    /// `visit(first, panel)` for each panel of rows in order, dequantized into one buffer.
    fn for_each_panel<T: Float>(&self, mut visit: impl FnMut(usize, &[T])) {
        let (n, k, panel_rows) = (self.rows(), self.cols, self.panel_rows());
        let mut buffer = vec![T::zero(); panel_rows.min(n) * k];
        for first in (0..n).step_by(panel_rows) {
            let panel = &mut buffer[..panel_rows.min(n - first) * k];
            self.dequantize_panel(first, panel);
            visit(first, panel);
        }
    }
}

/// A weight matrix `out × in` as the CPU backends read it.
#[derive(Clone, Copy, Debug)]
pub enum Weight<'a, T> {
    /// Row-major values.
    Dense(&'a [T]),
    /// Blocks, dequantized a panel at a time.
    Blocks(&'a QuantMatrix),
}

impl<'a, T> From<&'a [T]> for Weight<'a, T> {
    fn from(values: &'a [T]) -> Self {
        Weight::Dense(values)
    }
}

impl<'a, T> From<&'a Vec<T>> for Weight<'a, T> {
    fn from(values: &'a Vec<T>) -> Self {
        Weight::Dense(values)
    }
}

impl<T: Float> Weight<'_, T> {
    /// Values held: `out × in`.
    pub fn len(&self) -> usize {
        match self {
            Weight::Dense(values) => values.len(),
            Weight::Blocks(matrix) => matrix.rows() * matrix.cols(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `indices` (of `width` values each), one after another: the embedding lookup.
    pub fn gather(&self, width: usize, indices: &[usize]) -> Vec<T> {
        let mut out = vec![T::zero(); indices.len() * width];
        for (&i, row) in indices.iter().zip(out.chunks_exact_mut(width)) {
            self.read_rows(i, width, row);
        }
        out
    }

    /// Rows `first..` of `width` values into `out`.
    pub fn read_rows(&self, first: usize, width: usize, out: &mut [T]) {
        match self {
            Weight::Dense(values) => out.copy_from_slice(&values[first * width..][..out.len()]),
            Weight::Blocks(matrix) => {
                debug_assert_eq!(matrix.cols(), width);
                matrix.dequantize_rows(first, out);
            }
        }
    }

    /// `out (m × n) = x (m × k) · Wᵀ`, `+=` when `accumulate`: a projection in training
    /// ([`crate::gemm::matmul_nt`]).
    pub fn matmul_nt(&self, x: &[T], k: usize, out: &mut [T], accumulate: bool) {
        match self {
            Weight::Dense(w) => matmul_nt(x, w, k, out, accumulate),
            Weight::Blocks(matrix) => {
                assert_eq!(matrix.cols(), k, "W must be rows of {k}");
                let n = matrix.rows();
                matrix.for_each_panel(|first, panel| {
                    matmul_nt_into(x, panel, k, (&mut out[first..], n), accumulate);
                });
            }
        }
    }

    /// `out (m × k) = a (m × n) · W`, `+=` when `accumulate`: a projection's input gradient
    /// ([`crate::gemm::matmul_nn`]).
    pub fn matmul_nn(&self, a: &[T], k: usize, out: &mut [T], accumulate: bool) {
        match self {
            Weight::Dense(w) => matmul_nn(a, w, k, out, accumulate),
            Weight::Blocks(matrix) => {
                assert_eq!(matrix.cols(), k, "W must be rows of {k}");
                let n = matrix.rows();
                matrix.for_each_panel(|first, panel| {
                    let keep = accumulate || first > 0;
                    matmul_nn_from((&a[first..], n), panel, k, out, keep);
                });
            }
        }
    }
}

impl Weight<'_, f32> {
    /// `out (m × n) = x (m × k) · Wᵀ`, `+=` when `accumulate`: the sampler's batch-invariant
    /// product ([`crate::linear`]); for blocks, bit for bit what it gives on the dequantized
    /// matrix.
    pub fn linear(&self, x: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
        match self {
            Weight::Dense(w) => linear(x, w, k, out, accumulate),
            Weight::Blocks(matrix) => linear_blocks(x, matrix, out, accumulate),
        }
    }
}

/// [`linear`] of blocks: panels of [`LINEAR_PANEL_ROWS`] rows of `W` run in parallel, each
/// dequantized once and multiplied with every row of `x` into its own columns of `out`.
fn linear_blocks(x: &[f32], matrix: &QuantMatrix, out: &mut [f32], accumulate: bool) {
    let (k, n) = (matrix.cols(), matrix.rows());
    assert!(x.len().is_multiple_of(k), "x must be rows of {k}");
    let m = x.len() / k;
    assert_eq!(out.len(), m * n, "out must be {m} × {n}");
    if m == 0 || n == 0 {
        return;
    }
    let in_registers = cfg!(target_arch = "x86_64")
        && matrix.format == BlockFormat::Q8_0
        && m <= IN_REGISTERS_UP_TO
        && fused();
    let panel_product = |first: usize, rows: usize| {
        if in_registers {
            return q8_0_in_registers(x, matrix, first..first + rows);
        }
        let mut panel = vec![0.0f32; rows * k];
        matrix.dequantize_rows(first, &mut panel);
        let mut part = vec![0.0f32; m * rows];
        block_dispatch(x, &panel, k, 0..rows, &mut part, rows, false);
        part
    };
    let panel = |first: usize| {
        (
            first,
            panel_product(first, LINEAR_PANEL_ROWS.min(n - first)),
        )
    };
    let firsts = (0..n).step_by(LINEAR_PANEL_ROWS);
    // Below about a million multiply-adds, waking other threads costs more than it saves.
    let parts: Vec<(usize, Vec<f32>)> = if m * n * k < SERIAL_BELOW {
        firsts.map(panel).collect()
    } else {
        firsts
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(panel)
            .collect()
    };
    for (first, part) in parts {
        let rows = part.len() / m;
        for (out_row, part_row) in out.chunks_exact_mut(n).zip(part.chunks_exact(rows)) {
            let target = &mut out_row[first..first + rows];
            if accumulate {
                for (o, p) in target.iter_mut().zip(part_row) {
                    *o += p;
                }
            } else {
                target.copy_from_slice(part_row);
            }
        }
    }
}

/// Rows `rows` of Q8_0 `matrix` against every row of `x` (`m × rows`), each value converted
/// and scaled in registers as it is used: the same values and fused multiply-adds in the same
/// lanes and order as [`linear`]'s tiles on the dequantized matrix, so the same bits.
fn q8_0_in_registers(x: &[f32], matrix: &QuantMatrix, rows: std::ops::Range<usize>) -> Vec<f32> {
    let k = matrix.cols;
    let (m, width) = (x.len() / k, rows.len());
    let blocks_per_row = k / BLOCK_LEN;
    let mut part = vec![0.0f32; m * width];
    for (t, row) in rows.enumerate() {
        let scales = &matrix.scales[row * blocks_per_row..][..blocks_per_row];
        let quants = &matrix.quants[row * k..][..k];
        let mut store = |first: usize, dots: &[f32]| {
            for (r, &dot) in dots.iter().enumerate() {
                part[(first + r) * width + t] = dot;
            }
        };
        // Four rows of `x` share each converted vector of `W`; the rest go one at a time.
        let tiled = m / 4 * 4;
        for first in (0..tiled).step_by(4) {
            let xs = std::array::from_fn(|r| &x[(first + r) * k..][..k]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: only called where the CPU has AVX2 and FMA (`fused`); every row of `x`
            // and `quants` hold `k` values, `scales` one per block of them.
            store(first, &unsafe { dot_q8_0_avx2::<4>(xs, scales, quants) });
        }
        for first in tiled..m {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            store(first, &unsafe {
                dot_q8_0_avx2::<1>([&x[first * k..][..k]], scales, quants)
            });
        }
    }
    part
}

/// `x[r] · w` of `XR` rows of `x` and a row `w` of Q8_0 blocks, each product's 16 lanes two
/// 8-lane registers (see `linear.rs`).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `quants` and every row of `x` must hold the same number of
/// values, a multiple of 32, and `scales` one per 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_0_avx2<const XR: usize>(
    x: [&[f32]; XR],
    scales: &[f32],
    quants: &[u8],
) -> [f32; XR] {
    use std::arch::x86_64::{
        __m128i, _mm_loadl_epi64, _mm256_cvtepi8_epi32, _mm256_cvtepi32_ps, _mm256_fmadd_ps,
        _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    debug_assert!(x.iter().all(|r| r.len() == quants.len()));
    debug_assert!(scales.len() * BLOCK_LEN == quants.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; XR];
    for (block, &d) in scales.iter().enumerate() {
        let d = _mm256_set1_ps(d);
        // A block is two steps of 16 lanes, each two halves of 8.
        for eighth in 0..4 {
            let at = block * BLOCK_LEN + eighth * 8;
            // SAFETY: at + 8 <= the length of `quants` (checked by the caller).
            let q = unsafe { _mm_loadl_epi64(quants.as_ptr().add(at).cast::<__m128i>()) };
            let w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
            for (row, acc) in x.iter().zip(acc.iter_mut()) {
                // SAFETY: as above: every row of `x` is as long as `quants`.
                let xs = unsafe { _mm256_loadu_ps(row.as_ptr().add(at)) };
                acc[eighth % 2] = _mm256_fmadd_ps(xs, w, acc[eighth % 2]);
            }
        }
    }
    acc.map(|[low, high]| {
        let mut lanes = [0.0f32; 16];
        // SAFETY: `lanes` holds 16 floats, two registers of 8.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), low);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), high);
        }
        reduce(lanes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_values(len: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.max(1);
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state as f32 / u32::MAX as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn each_value_comes_back_within_half_a_step_of_its_block() {
        let values = random_values(4 * 96, 7);
        // Q4_0's top value clamps to 7 steps where the scale is 8 of them: one step off.
        for (format, steps, within) in [
            (BlockFormat::Q8_0, 127.0, 0.5),
            (BlockFormat::Q4_0, 8.0, 1.0),
        ] {
            let matrix = QuantMatrix::quantize(&values, 96, format).expect("blocks of 32");
            assert_eq!((matrix.rows(), matrix.cols()), (4, 96));
            let back: Vec<f32> = matrix.dequantize();
            for (block, (v, b)) in values
                .chunks(BLOCK_LEN)
                .zip(back.chunks(BLOCK_LEN))
                .enumerate()
            {
                let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let step = amax / steps;
                for (x, y) in v.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= step * within + 1e-7,
                        "{format:?} block {block}: {x} came back as {y} (step {step})"
                    );
                }
            }
        }
    }

    #[test]
    fn the_bytes_are_a_quarter_and_an_eighth_of_f32() {
        let values = vec![0.25f32; 64 * 128];
        let f32_bytes = values.len() * 4;
        let q8 = QuantMatrix::quantize(&values, 128, BlockFormat::Q8_0).expect("blocks");
        let q4 = QuantMatrix::quantize(&values, 128, BlockFormat::Q4_0).expect("blocks");
        assert_eq!(q8.bytes() * 128, f32_bytes * 36);
        assert_eq!(q4.bytes() * 128, f32_bytes * 20);
    }

    #[test]
    fn rows_that_do_not_split_into_blocks_are_refused_by_length() {
        let err = QuantMatrix::quantize(&[0.0; 40], 20, BlockFormat::Q8_0).unwrap_err();
        assert_eq!(err, QuantizeError { cols: 20 });
        assert_eq!(
            err.to_string(),
            "rows of 20 values do not split into blocks of 32"
        );
    }

    /// The sampler's product of blocks is, bit for bit, the dense product of their values,
    /// whatever the batch (so a sequence samples the same tokens alone or in a batch): Q8_0
    /// converted in registers for a few rows, panels dequantized for more and for Q4_0.
    #[test]
    fn the_samplers_product_of_blocks_has_the_bits_of_the_dense_product() {
        for (m, k, n, format) in [
            (1, 64, 7, BlockFormat::Q8_0),
            (4, 576, 70, BlockFormat::Q8_0),
            (11, 96, 66, BlockFormat::Q8_0),
            (3, 96, 130, BlockFormat::Q4_0),
            (33, 128, 200, BlockFormat::Q8_0),
        ] {
            let w = random_values(n * k, 11);
            let x = random_values(m * k, 13);
            let matrix = QuantMatrix::quantize(&w, k, format).expect("blocks");
            let dense: Vec<f32> = matrix.dequantize();
            for accumulate in [false, true] {
                let mut want = random_values(m * n, 17);
                let mut got = want.clone();
                linear(&x, &dense, k, &mut want, accumulate);
                Weight::Blocks(&matrix).linear(&x, k, &mut got, accumulate);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{m} × {k} × {n}, {format:?}");
            }
        }
    }

    /// The training products of blocks match the dense products of their values, across
    /// several panels, into and onto their outputs.
    #[test]
    fn the_training_products_of_blocks_match_the_dense_products() {
        let (m, k, n) = (5, 4096, 200); // 64 rows a panel: four panels, the last short
        let w = random_values(n * k, 3);
        let matrix = QuantMatrix::quantize(&w, k, BlockFormat::Q8_0).expect("blocks");
        assert!(matrix.panel_rows() < n);
        let dense: Vec<f64> = matrix.dequantize();
        let blocks = Weight::<f64>::Blocks(&matrix);
        let x: Vec<f64> = random_values(m * k, 5).into_iter().map(f64::from).collect();
        let a: Vec<f64> = random_values(m * n, 9).into_iter().map(f64::from).collect();
        for accumulate in [false, true] {
            let start: Vec<f64> = random_values(m * n, 21)
                .into_iter()
                .map(f64::from)
                .collect();
            let (mut want, mut got) = (start.clone(), start);
            matmul_nt(&x, &dense, k, &mut want, accumulate);
            blocks.matmul_nt(&x, k, &mut got, accumulate);
            assert_close(&got, &want);

            let start: Vec<f64> = random_values(m * k, 23)
                .into_iter()
                .map(f64::from)
                .collect();
            let (mut want, mut got) = (start.clone(), start);
            matmul_nn(&a, &dense, k, &mut want, accumulate);
            blocks.matmul_nn(&a, k, &mut got, accumulate);
            assert_close(&got, &want);
        }
        assert_eq!(blocks.gather(k, &[2, 0])[..k], dense[2 * k..3 * k]);
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-9 * (1.0 + w.abs()), "[{i}] {g} vs {w}");
        }
    }
}
