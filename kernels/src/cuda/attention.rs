//! Attention over a paged KV cache, as vLLM pages it: the cache is a pool of blocks of
//! `block_size` positions (each holding every KV head), and a sequence owns a list of blocks, its
//! block table, so sequences grow without copying and free blocks serve any sequence. Each row of
//! a batch names its sequence and position; one call serves prefills and decodes alike.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::error::{DriverContext, GpuError, ensure};
use super::{DeviceIndices, Gpu, elementwise, grid, grid_y, int};
use crate::Heads;

/// Threads of a block of `paged_attention` (`ATTENTION_THREADS` in `kernels.cu`; a power of
/// two, which its reductions need).
const ATTENTION_THREADS: u32 = 128;
/// Shared memory a block may take without opting in (48 KiB), less the kernel's own reduction
/// scratch: the scores of one row, so at most this many positions (`/ 4`) per sequence.
const SCORES_BYTES: usize = 47 * 1024;

/// The keys and values of every sequence: `blocks × kv_heads × block_size × head_dim` each.
pub struct PagedKvCache {
    keys: CudaSlice<f32>,
    values: CudaSlice<f32>,
    blocks: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

impl PagedKvCache {
    pub fn new(
        gpu: &Gpu,
        blocks: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> Result<PagedKvCache, GpuError> {
        ensure(
            blocks > 0 && kv_heads > 0 && head_dim > 0 && block_size > 0,
            || "a KV cache needs blocks, heads, a head size and a block size".to_string(),
        )?;
        let len = blocks * kv_heads * block_size * head_dim;
        Ok(PagedKvCache {
            keys: gpu.zeros(len)?,
            values: gpu.zeros(len)?,
            blocks,
            kv_heads,
            head_dim,
            block_size,
        })
    }

    /// Copies block `from` into block `to` (keys and values): a sequence that shares a block
    /// with another gets a copy of its own before writing into it.
    pub fn copy_block(&mut self, gpu: &Gpu, from: usize, to: usize) -> Result<(), GpuError> {
        ensure(from < self.blocks && to < self.blocks, || {
            format!("blocks {from} and {to} of a cache of {}", self.blocks)
        })?;
        if from == to {
            return Ok(());
        }
        let size = self.kv_heads * self.block_size * self.head_dim;
        for buffer in [&mut self.keys, &mut self.values] {
            // Two views of one buffer: split it between the blocks.
            let (mut low, high) = buffer.split_at_mut(from.max(to) * size);
            let (source, mut target) = match from < to {
                true => (low.slice(from * size..(from + 1) * size), high),
                false => (
                    high.slice(0..size),
                    low.slice_mut(to * size..(to + 1) * size),
                ),
            };
            gpu.stream()
                .memcpy_dtod(&source, &mut target.slice_mut(0..size))
                .doing("copying a KV block")?;
        }
        Ok(())
    }
}

/// Where one row of a batch belongs: its sequence (an index into the block tables) and its
/// position in that sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceRow {
    pub sequence: usize,
    pub position: usize,
}

/// A batch's rows and block tables on the device, checked against one cache's shape.
pub struct AttentionBatch {
    sequences: CudaSlice<i32>,
    positions: DeviceIndices,
    tables: CudaSlice<i32>,
    max_blocks: usize,
    /// The shape of the cache the tables were checked against.
    cache_blocks: usize,
    block_size: usize,
}

impl AttentionBatch {
    /// The rows' positions, for [`Gpu::rope`].
    pub fn positions(&self) -> &DeviceIndices {
        &self.positions
    }

    pub fn rows(&self) -> usize {
        self.sequences.len()
    }
}

impl Gpu {
    /// Checks every row's position against its sequence's block table and every block against
    /// `cache`, then copies rows and tables to the device.
    pub fn attention_batch(
        &self,
        cache: &PagedKvCache,
        rows: &[SequenceRow],
        tables: &[Vec<usize>],
    ) -> Result<AttentionBatch, GpuError> {
        ensure(!rows.is_empty(), || {
            "an attention batch needs rows".to_string()
        })?;
        let max_blocks = tables.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut flat = vec![0; tables.len().max(1) * max_blocks];
        for (table, slots) in tables.iter().zip(flat.chunks_exact_mut(max_blocks)) {
            for (&block, slot) in table.iter().zip(slots) {
                ensure(block < cache.blocks, || {
                    format!("block {block} of a cache of {}", cache.blocks)
                })?;
                *slot = int(block, "block")?;
            }
        }
        let mut sequences = Vec::with_capacity(rows.len());
        for row in rows {
            let table = tables.get(row.sequence).ok_or_else(|| {
                GpuError::InvalidArgument(format!("sequence {} has no block table", row.sequence))
            })?;
            ensure(row.position < table.len() * cache.block_size, || {
                format!(
                    "position {} of sequence {} is past its {} blocks",
                    row.position,
                    row.sequence,
                    table.len()
                )
            })?;
            ensure((row.position + 1) * 4 <= SCORES_BYTES, || {
                format!(
                    "position {} is past the longest context the kernel holds",
                    row.position
                )
            })?;
            sequences.push(int(row.sequence, "sequence")?);
        }
        let positions: Vec<usize> = rows.iter().map(|r| r.position).collect();
        Ok(AttentionBatch {
            sequences: self.upload(&sequences)?,
            positions: self.indices(&positions)?,
            tables: self.upload(&flat)?,
            max_blocks,
            cache_blocks: cache.blocks,
            block_size: cache.block_size,
        })
    }

    /// Writes each row's `keys` and `values` (`rows × kv_heads × head_dim`) at its position.
    pub fn kv_write(
        &self,
        cache: &mut PagedKvCache,
        batch: &AttentionBatch,
        keys: &CudaSlice<f32>,
        values: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        check_cache(cache, batch)?;
        let rows = batch.rows();
        let row = cache.kv_heads * cache.head_dim;
        ensure(
            keys.len() == rows * row && values.len() == rows * row,
            || {
                format!(
                    "keys and values must be {rows} × {} × {}",
                    cache.kv_heads, cache.head_dim
                )
            },
        )?;
        let ints = [
            int(batch.max_blocks, "blocks per sequence")?,
            int(rows, "rows")?,
            int(cache.kv_heads, "kv_heads")?,
            int(cache.head_dim, "head_dim")?,
            int(cache.block_size, "block_size")?,
        ];
        let mut launch = self.stream().launch_builder(&self.kernels.kv_write);
        launch
            .arg(keys)
            .arg(values)
            .arg(&mut cache.keys)
            .arg(&mut cache.values)
            .arg(&batch.tables)
            .arg(&ints[0])
            .arg(&batch.sequences)
            .arg(&batch.positions.values)
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3])
            .arg(&ints[4]);
        // SAFETY: matches `kv_write`; every row's sequence, position and blocks were checked
        // against this cache's shape when the batch was made.
        unsafe { launch.launch(elementwise(rows * row)?) }.doing("launching kv_write")?;
        Ok(())
    }

    /// Causal attention of `q (rows × heads × head_dim)` over the cache: each row attends to
    /// its sequence's positions `0..=position` (the last `window` of them in a sliding-window
    /// layer). As [`crate::causal_attention`].
    pub fn paged_attention(
        &self,
        cache: &PagedKvCache,
        batch: &AttentionBatch,
        q: &CudaSlice<f32>,
        heads: Heads,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        check_cache(cache, batch)?;
        let rows = batch.rows();
        ensure(
            heads.kv_heads == cache.kv_heads && heads.head_dim == cache.head_dim,
            || "the heads do not match the cache's".to_string(),
        )?;
        ensure(heads.heads.is_multiple_of(heads.kv_heads), || {
            "heads must be a multiple of kv_heads".to_string()
        })?;
        ensure(q.len() == rows * heads.heads * heads.head_dim, || {
            format!("q must be {rows} × {} × {}", heads.heads, heads.head_dim)
        })?;
        ensure(out.len() == q.len(), || {
            "out must have q's shape".to_string()
        })?;
        let scale = 1.0 / (heads.head_dim as f32).sqrt();
        let ints = [
            int(batch.max_blocks, "blocks per sequence")?,
            int(heads.heads, "heads")?,
            int(heads.kv_heads, "kv_heads")?,
            int(heads.head_dim, "head_dim")?,
            int(cache.block_size, "block_size")?,
            int(heads.window.unwrap_or(0), "window")?,
        ];
        let mut launch = self.stream().launch_builder(&self.kernels.paged_attention);
        launch
            .arg(q)
            .arg(&cache.keys)
            .arg(&cache.values)
            .arg(&batch.tables)
            .arg(&ints[0])
            .arg(&batch.sequences)
            .arg(&batch.positions.values)
            .arg(out)
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3])
            .arg(&ints[4])
            .arg(&ints[5])
            .arg(&scale);
        let config = LaunchConfig {
            grid_dim: (grid(rows)?, grid_y(heads.heads)?, 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: (batch.positions.end * 4) as u32,
        };
        // SAFETY: matches `paged_attention`; positions, blocks and shapes were checked against
        // this cache, and the scores fit the shared memory asked for.
        unsafe { launch.launch(config) }.doing("launching paged_attention")?;
        Ok(())
    }
}

fn check_cache(cache: &PagedKvCache, batch: &AttentionBatch) -> Result<(), GpuError> {
    ensure(
        cache.blocks == batch.cache_blocks && cache.block_size == batch.block_size,
        || "the batch was made for another cache".to_string(),
    )
}
