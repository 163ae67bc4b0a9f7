//! The CUDA device behind the op boundary: [`Gpu`] as a [`Backend`], so the model's one layer
//! definition runs on device buffers as it runs on the CPU's slices.
//!
//! Weights are [`GpuMatrix`]es (f32, or bf16 bits computed in f32) and f32 vectors on the
//! device; activations are [`CudaSlice`]s. A call's [`GpuBatch`] holds the model's paged KV
//! caches (one per layer) and the call's rows on the device; a projection's adapters are a
//! [`LoraSite`], whose expand the projection kernel does as it stores.

use cudarc::driver::CudaSlice;

use super::attention::{AttentionBatch, PagedKvCache, SequenceRow};
use super::error::{DriverContext, GpuError, ensure};
use super::lora::LoraSite;
use super::{DeviceIndices, Gpu};
use crate::attention::Heads;
use crate::backend::Backend;
use crate::ops::Activation;

/// How a model's matrices (projections, embedding, unembedding) are kept on the device. Norms,
/// biases and adapters stay f32, and every sum is computed in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    /// Rounded to bf16 (to nearest even) when uploaded: half the bytes a decode step streams.
    Bf16,
}

/// A weight matrix on the device, in its [`WeightFormat`].
pub enum GpuMatrix {
    F32(CudaSlice<f32>),
    /// Raw bf16 bits (see [`super::bf16_bits`]).
    Bf16(CudaSlice<u16>),
}

impl GpuMatrix {
    /// `values` kept as `format` (rounded on the device for bf16).
    pub fn new(
        gpu: &Gpu,
        values: CudaSlice<f32>,
        format: WeightFormat,
    ) -> Result<GpuMatrix, GpuError> {
        Ok(match format {
            WeightFormat::F32 => GpuMatrix::F32(values),
            WeightFormat::Bf16 => GpuMatrix::Bf16(gpu.to_bf16(&values)?),
        })
    }

    /// How many values the matrix holds.
    pub(super) fn values(&self) -> usize {
        match self {
            GpuMatrix::F32(m) => m.len(),
            GpuMatrix::Bf16(m) => m.len(),
        }
    }

    /// Rows `indices` of the matrix (`width` columns) into `out`, widened to f32.
    fn gather(
        &self,
        gpu: &Gpu,
        width: usize,
        indices: &DeviceIndices,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        match self {
            GpuMatrix::F32(m) => gpu.gather_rows(m, width, indices, out),
            GpuMatrix::Bf16(m) => gpu.gather_rows_bf16(m, width, indices, out),
        }
    }
}

/// A forward call's sequences on the device: the model's KV caches, one per layer, and where
/// each of the call's rows sits (its sequence's block table and position).
pub struct GpuBatch<'a> {
    caches: &'a mut [PagedKvCache],
    rows: AttentionBatch,
}

impl<'a> GpuBatch<'a> {
    /// The call's `rows` (sequence after sequence, in the order of the call's tokens), each
    /// naming its sequence's block table in `tables`; every row's position and every block is
    /// checked against the caches here, before any launch.
    pub fn new(
        gpu: &Gpu,
        caches: &'a mut [PagedKvCache],
        rows: &[SequenceRow],
        tables: &[Vec<usize>],
    ) -> Result<GpuBatch<'a>, GpuError> {
        let first = caches
            .first()
            .ok_or_else(|| GpuError::InvalidArgument("a model with no KV cache".into()))?;
        let rows = gpu.attention_batch(first, rows, tables)?;
        Ok(GpuBatch { caches, rows })
    }
}

impl Backend for Gpu {
    type Error = GpuError;
    type Elem = f32;
    type Buffer = CudaSlice<f32>;
    type Matrix<'a> = &'a GpuMatrix;
    type Vector = CudaSlice<f32>;
    type Lora<'a> = LoraSite<'a>;
    type Batch<'a> = GpuBatch<'a>;

    fn zeros(&self, len: usize) -> Result<CudaSlice<f32>, GpuError> {
        Gpu::zeros(self, len)
    }

    fn scratch(&self, len: usize) -> Result<CudaSlice<f32>, GpuError> {
        if len == 0 {
            return Gpu::zeros(self, 0);
        }
        // SAFETY: the memory is the stream's own, ordered on it; the op given the buffer writes
        // every value before anything reads it (the trait's contract for `scratch`), so no
        // memset is queued for values about to be overwritten.
        unsafe { self.stream().alloc::<f32>(len) }.doing("allocating device memory")
    }

    fn download(&self, x: CudaSlice<f32>) -> Result<Vec<f32>, GpuError> {
        Gpu::download(self, &x)
    }

    fn upload(&self, values: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
        Gpu::upload(self, values)
    }

    fn copy(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<f32>, GpuError> {
        self.stream().clone_dtod(x).doing("copying on the device")
    }

    fn embed(
        &self,
        table: &GpuMatrix,
        width: usize,
        indices: &[usize],
    ) -> Result<CudaSlice<f32>, GpuError> {
        let mut out = self.scratch(indices.len() * width)?;
        table.gather(self, width, &self.indices(indices)?, &mut out)?;
        Ok(out)
    }

    fn select_rows(
        &self,
        x: &CudaSlice<f32>,
        width: usize,
        indices: &[usize],
    ) -> Result<CudaSlice<f32>, GpuError> {
        let mut out = self.scratch(indices.len() * width)?;
        self.gather_rows(x, width, &self.indices(indices)?, &mut out)?;
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &mut CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f64,
    ) -> Result<(), GpuError> {
        Gpu::rms_norm(self, x, weight, eps as f32)
    }

    fn rms_norm_into(
        &self,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f64,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        Gpu::rms_norm_into(self, x, out, weight, eps as f32)
    }

    fn project(
        &self,
        x: &CudaSlice<f32>,
        weight: &GpuMatrix,
        inp: usize,
        bias: Option<&CudaSlice<f32>>,
        lora: Option<LoraSite<'_>>,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        match weight {
            GpuMatrix::F32(w) => self.linear(x, w, bias, lora, inp, y, accumulate),
            GpuMatrix::Bf16(w) => self.linear_bf16(x, w, bias, lora, inp, y, accumulate),
        }
    }

    fn rope(
        &self,
        batch: &GpuBatch<'_>,
        x: &mut CudaSlice<f32>,
        head_dim: usize,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        Gpu::rope(self, x, head_dim, batch.rows.positions(), cos, sin)
    }

    fn attend(
        &self,
        batch: &mut GpuBatch<'_>,
        layer: usize,
        shape: Heads,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let layers = batch.caches.len();
        ensure(layer < layers, || {
            format!("layer {layer} of a model of {layers} KV caches")
        })?;
        let cache = &mut batch.caches[layer];
        self.kv_write(cache, &batch.rows, k, v)?;
        self.paged_attention(cache, &batch.rows, q, shape, out)
    }

    fn gate_mul(
        &self,
        activation: Activation,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        Gpu::gate_mul(self, activation, gate, up)
    }

    fn scale(&self, x: &mut CudaSlice<f32>, factor: f64) -> Result<(), GpuError> {
        Gpu::scale(self, x, factor as f32)
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<(), GpuError> {
        Gpu::add(self, x, y)
    }

    /// The rows' positions were given with the batch: the caller's block tables and starts say
    /// what each cache holds, so there is nothing to commit.
    fn advance(&self, _batch: &mut GpuBatch<'_>) {}
}
