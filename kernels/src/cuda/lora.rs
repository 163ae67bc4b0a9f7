//! The mixed-adapter LoRA apply on the device, laid out as S-LoRA and Punica lay it out: each
//! projection site keeps every adapter slot's `A` and `B` in one pool (padded to the site's
//! largest rank), and a batch's segments become tiles of at most `ROW_TILE` rows of one adapter,
//! made once per forward pass and used at every site. Prefill and training segments (many rows
//! of one adapter: SGMV) and decode batches (a row per sequence, each its own adapter: BGMV) run
//! the same kernels, a shrink into the batch's rank-space scratch, then the expand (its own
//! kernel in [`Gpu::lora_apply`], or done by the projection as it stores, through
//! [`LoraSite`]); only the tiles differ.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::error::{DriverContext, GpuError, ensure};
use super::{Gpu, ROW_TILE, grid, grid_y, int};

/// Threads of a block of `lora_shrink` and of `lora_expand`.
const APPLY_THREADS: u32 = 256;
/// The widest input a pool takes: `lora_shrink` keeps one partial sum per 512 inputs, at most
/// 64 (`SHRINK_SEGMENT` and `SHRINK_MAX_SEGMENTS` in `kernels.cu`).
pub const MAX_LORA_INPUT: usize = 512 * 64;
/// Output columns per block of `lora_expand` (`LORA_COLUMNS` in `kernels.cu`).
const APPLY_COLUMNS: usize = 256;
/// The largest rank of a pool (`MAX_LORA_RANK` in `kernels.cu`): a tile's rank-space rows live
/// in the block's shared memory.
pub const MAX_LORA_RANK: usize = 128;

/// One projection site's adapters: slot `s` holds `A (max_rank × inp)` and `B (out × max_rank)`,
/// an adapter of smaller rank using the first `rank` rows of `A` and columns of `B`.
pub struct LoraPool {
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    slots: usize,
    inp: usize,
    out: usize,
    max_rank: usize,
}

impl LoraPool {
    /// A pool of `slots` empty (zero) adapters for a projection `inp -> out`.
    pub fn new(
        gpu: &Gpu,
        slots: usize,
        inp: usize,
        out: usize,
        max_rank: usize,
    ) -> Result<LoraPool, GpuError> {
        ensure(slots > 0 && max_rank > 0 && inp > 0 && out > 0, || {
            "a LoRA pool needs slots, a rank and both widths".to_string()
        })?;
        ensure(inp <= MAX_LORA_INPUT, || {
            format!(
                "input width {inp} is above the widest the GPU LoRA kernels take, {MAX_LORA_INPUT}"
            )
        })?;
        ensure(max_rank <= MAX_LORA_RANK, || {
            format!("rank {max_rank} is above the largest the GPU kernels take, {MAX_LORA_RANK}")
        })?;
        Ok(LoraPool {
            a: gpu.zeros(slots * max_rank * inp)?,
            b: gpu.zeros(slots * out * max_rank)?,
            slots,
            inp,
            out,
            max_rank,
        })
    }

    /// Writes an adapter of `rank` into `slot`: `a` is `rank × inp`, `b` is `out × rank`
    /// (row-major, as [`crate::LoraPair`]).
    /// `(in, out)`: the projection's shape.
    pub fn shape(&self) -> (usize, usize) {
        (self.inp, self.out)
    }

    pub fn write(
        &mut self,
        gpu: &Gpu,
        slot: usize,
        a: &[f32],
        b: &[f32],
        rank: usize,
    ) -> Result<(), GpuError> {
        let (inp, out, max_rank) = (self.inp, self.out, self.max_rank);
        ensure(slot < self.slots, || {
            format!("slot {slot} of a pool of {}", self.slots)
        })?;
        ensure(rank > 0 && rank <= max_rank, || {
            format!("rank {rank} does not fit the pool's {max_rank}")
        })?;
        ensure(a.len() == rank * inp, || {
            format!("A must be {rank} × {inp}")
        })?;
        ensure(b.len() == out * rank, || {
            format!("B must be {out} × {rank}")
        })?;
        let mut a_slot = vec![0.0; max_rank * inp];
        a_slot[..a.len()].copy_from_slice(a);
        let mut b_slot = vec![0.0; out * max_rank];
        for (padded, row) in b_slot.chunks_exact_mut(max_rank).zip(b.chunks_exact(rank)) {
            padded[..rank].copy_from_slice(row);
        }
        let stream = gpu.stream();
        let a_at = slot * max_rank * inp;
        stream
            .memcpy_htod(&a_slot, &mut self.a.slice_mut(a_at..a_at + a_slot.len()))
            .doing("writing an adapter's A")?;
        let b_at = slot * out * max_rank;
        stream
            .memcpy_htod(&b_slot, &mut self.b.slice_mut(b_at..b_at + b_slot.len()))
            .doing("writing an adapter's B")?;
        Ok(())
    }
}

/// The adapter a run of rows uses: its slot in the pools, its rank and its scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdapterRef {
    pub slot: usize,
    pub rank: usize,
    pub scale: f32,
}

/// A run of consecutive rows that share one adapter (`None`: no delta), as [`crate::Segment`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSegment {
    pub rows: usize,
    pub adapter: Option<AdapterRef>,
}

/// A batch's segments as device tiles, for every site of one forward pass, with the scratch its
/// shrinks write (`rows × max_rank`, reused by each site in turn).
pub struct LoraBatch {
    /// `{first row, rows, slot, rank}` per tile (`LoraTile` in `kernels.cu`).
    tiles: CudaSlice<i32>,
    /// `{slot, rank}` per row, rank 0 for a row without an adapter: how a projection that
    /// expands as it stores finds each row's `B`.
    row_adapters: CudaSlice<i32>,
    scales: CudaSlice<f32>,
    shrunk: CudaSlice<f32>,
    tile_count: usize,
    rows: usize,
    /// The highest slot and rank any tile uses, checked against each pool at apply.
    slot_end: usize,
    max_rank: usize,
}

impl Gpu {
    /// Cuts `segments` into tiles of at most `ROW_TILE` rows and copies them to the device.
    pub fn lora_batch(&self, segments: &[DeviceSegment]) -> Result<LoraBatch, GpuError> {
        let (mut tiles, mut scales, mut row_adapters) = (Vec::new(), Vec::new(), Vec::new());
        let (mut row, mut slot_end, mut max_rank) = (0, 0, 0);
        for segment in segments {
            let (slot, rank) = match segment.adapter {
                Some(adapter) => (int(adapter.slot, "slot")?, int(adapter.rank, "rank")?),
                None => (0, 0),
            };
            for _ in 0..segment.rows {
                row_adapters.extend([slot, rank]);
            }
            if let Some(adapter) = segment.adapter {
                ensure(adapter.rank > 0, || "an adapter of rank 0".to_string())?;
                slot_end = slot_end.max(adapter.slot + 1);
                max_rank = max_rank.max(adapter.rank);
                let mut first = row;
                while first < row + segment.rows {
                    let rows = ROW_TILE.min(row + segment.rows - first);
                    tiles.extend([
                        int(first, "row")?,
                        int(rows, "rows")?,
                        int(adapter.slot, "slot")?,
                        int(adapter.rank, "rank")?,
                    ]);
                    scales.push(adapter.scale);
                    first += rows;
                }
            }
            row += segment.rows;
        }
        // An empty upload is refused by the driver; a batch without adapters keeps one unused
        // tile's worth of memory.
        let tile_count = scales.len();
        if tile_count == 0 {
            tiles.extend([0; 4]);
            scales.push(0.0);
        }
        if row_adapters.is_empty() {
            row_adapters.extend([0; 2]);
        }
        Ok(LoraBatch {
            tiles: self.upload(&tiles)?,
            row_adapters: self.upload(&row_adapters)?,
            scales: self.upload(&scales)?,
            shrunk: self.zeros(row.max(1) * max_rank.max(1))?,
            tile_count,
            rows: row,
            slot_end,
            max_rank,
        })
    }

    /// `y (rows × out) += scale · (x Aᵀ) Bᵀ` for every row of the batch with an adapter, `A`
    /// and `B` from that adapter's slot of `pool`; `x` is `rows × inp`. As [`crate::lora_apply`].
    /// Two launches: the shrink into the batch's scratch, then the expand into `y`. (The
    /// sampler's projections expand as they store instead: [`LoraSite`].)
    pub fn lora_apply(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        pool: &LoraPool,
        batch: &mut LoraBatch,
    ) -> Result<(), GpuError> {
        let (rows, out) = (batch.rows, pool.out);
        ensure(y.len() == rows * out, || {
            format!("y must be {rows} × {out}")
        })?;
        if !self.lora_shrink(x, pool, batch)? {
            return Ok(());
        }
        let (out_i, max_rank_i, stride_i) = (
            int(out, "out")?,
            int(pool.max_rank, "rank")?,
            int(batch.max_rank, "rank")?,
        );
        let mut expand = self.stream().launch_builder(&self.kernels.lora_expand);
        expand
            .arg(&batch.shrunk)
            .arg(&pool.b)
            .arg(&batch.tiles)
            .arg(y)
            .arg(&out_i)
            .arg(&max_rank_i)
            .arg(&stride_i);
        let config = LaunchConfig {
            grid_dim: (
                grid(batch.tile_count)?,
                grid_y(out.div_ceil(APPLY_COLUMNS))?,
                1,
            ),
            block_dim: (APPLY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `lora_expand`; the same tiles, inside `y` and the scratch the shrink
        // just wrote, on the same stream.
        unsafe { expand.launch(config) }.doing("launching lora_expand")?;
        Ok(())
    }

    /// Checks `x` and the batch against `pool` and launches the shrink into the batch's
    /// scratch; `false` when no row has an adapter (nothing launched).
    pub(super) fn lora_shrink(
        &self,
        x: &CudaSlice<f32>,
        pool: &LoraPool,
        batch: &mut LoraBatch,
    ) -> Result<bool, GpuError> {
        let (rows, inp, max_rank) = (batch.rows, pool.inp, pool.max_rank);
        ensure(x.len() == rows * inp, || {
            format!("x must be {rows} × {inp}")
        })?;
        ensure(batch.slot_end <= pool.slots, || {
            format!(
                "the batch uses slot {} of a pool of {}",
                batch.slot_end - 1,
                pool.slots
            )
        })?;
        ensure(batch.max_rank <= max_rank, || {
            format!(
                "the batch uses rank {} in a pool of rank {max_rank}",
                batch.max_rank
            )
        })?;
        if batch.tile_count == 0 {
            return Ok(false);
        }
        let (inp_i, max_rank_i, stride_i) = (
            int(inp, "inp")?,
            int(max_rank, "rank")?,
            int(batch.max_rank, "rank")?,
        );
        let mut shrink = self.stream().launch_builder(&self.kernels.lora_shrink);
        shrink
            .arg(x)
            .arg(&pool.a)
            .arg(&batch.tiles)
            .arg(&batch.scales)
            .arg(&mut batch.shrunk)
            .arg(&inp_i)
            .arg(&max_rank_i)
            .arg(&stride_i);
        let config = LaunchConfig {
            grid_dim: (grid(batch.tile_count)?, grid_y(batch.max_rank)?, 1),
            block_dim: (APPLY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `lora_shrink`; every tile's rows are inside `x` and the scratch
        // (`rows × batch.max_rank`), its slot and rank inside the pool (checked above and when
        // the batch was made).
        unsafe { shrink.launch(config) }.doing("launching lora_shrink")?;
        Ok(true)
    }
}

/// A projection site's adapters for one batch: given to [`Gpu::linear`], the projection adds
/// each row's `scale · (x Aᵀ) Bᵀ` as it stores its output, after one shrink launch, with the
/// same sums as [`Gpu::lora_apply`] after the projection (so the same bits), one launch fewer.
pub struct LoraSite<'a> {
    pub pool: &'a LoraPool,
    pub batch: &'a mut LoraBatch,
}

/// What the projection kernels take for a fused expand: the scratch, `B`'s pool, each row's
/// adapter, the pool's rank and the scratch's row stride; null pointers for none.
pub(super) struct FusedExpand<'a> {
    pub(super) shrunk: &'a CudaSlice<f32>,
    pub(super) b_pool: &'a CudaSlice<f32>,
    pub(super) row_adapters: &'a CudaSlice<i32>,
    pub(super) max_rank: i32,
    pub(super) stride: i32,
}

impl LoraSite<'_> {
    /// Shrinks `x` (a projection `inp -> out`'s input) and says what the projection needs to
    /// expand; `None` when no row has an adapter.
    pub(super) fn prepare<'s>(
        &'s mut self,
        gpu: &Gpu,
        x: &CudaSlice<f32>,
        inp: usize,
        out: usize,
    ) -> Result<Option<FusedExpand<'s>>, GpuError> {
        ensure(self.pool.inp == inp && self.pool.out == out, || {
            format!(
                "a LoRA pool of {} -> {} on a projection of {inp} -> {out}",
                self.pool.inp, self.pool.out
            )
        })?;
        if !gpu.lora_shrink(x, self.pool, self.batch)? {
            return Ok(None);
        }
        Ok(Some(FusedExpand {
            shrunk: &self.batch.shrunk,
            b_pool: &self.pool.b,
            row_adapters: &self.batch.row_adapters,
            max_rank: int(self.pool.max_rank, "rank")?,
            stride: int(self.batch.max_rank, "rank")?,
        }))
    }
}
