//! The CUDA backend of training: [`GpuTrain`] runs the model's one layer definition forward and
//! backward on the device as `CpuTrain` does on the CPU, over whole sequences (no KV cache). A
//! call's [`GpuTrainBatch`] names the sequences' lengths and keeps each layer's log-sum-exp for
//! the attention's backward.

use cudarc::driver::CudaSlice;

use super::backend::GpuMatrix;
use super::error::GpuError;
use super::train::{GpuLoraGrad, GpuLoraSegment};
use super::{DeviceIndices, Gpu};
use crate::attention::Heads;
use crate::backend::{Backend, Backward};
use crate::ops::Activation;

/// Training on one device.
#[derive(Clone, Copy)]
pub struct GpuTrain<'g> {
    gpu: &'g Gpu,
}

impl<'g> GpuTrain<'g> {
    pub fn new(gpu: &'g Gpu) -> Self {
        GpuTrain { gpu }
    }
}

/// A training call's sequences, one after another from position 0, and what its attention
/// keeps.
pub struct GpuTrainBatch {
    lengths: Vec<usize>,
    positions: DeviceIndices,
    /// Per layer, the log-sum-exp of each row and head.
    lse: Vec<Option<CudaSlice<f32>>>,
}

impl GpuTrainBatch {
    /// Sequences of `lengths` tokens (at least one in all).
    pub fn new(gpu: &Gpu, lengths: Vec<usize>) -> Result<Self, GpuError> {
        let positions: Vec<usize> = lengths.iter().flat_map(|&n| 0..n).collect();
        Ok(GpuTrainBatch {
            positions: gpu.indices(&positions)?,
            lengths,
            lse: Vec::new(),
        })
    }
}

/// A projection's adapters on the device, with the gradient of each segment's pair (`None`:
/// not trained, or no adapter).
pub struct GpuLoraGrads<'a> {
    pub segments: &'a [GpuLoraSegment<'a>],
    pub grads: Vec<Option<GpuLoraGrad<'a>>>,
}

impl Backend for GpuTrain<'_> {
    type Error = GpuError;
    type Elem = f32;
    type Buffer = CudaSlice<f32>;
    type Matrix<'a> = &'a GpuMatrix;
    type Vector = CudaSlice<f32>;
    type Lora<'a> = &'a [GpuLoraSegment<'a>];
    type Batch<'a> = GpuTrainBatch;

    fn zeros(&self, len: usize) -> Result<CudaSlice<f32>, GpuError> {
        self.gpu.zeros(len)
    }

    fn scratch(&self, len: usize) -> Result<CudaSlice<f32>, GpuError> {
        Backend::scratch(self.gpu, len)
    }

    fn download(&self, x: CudaSlice<f32>) -> Result<Vec<f32>, GpuError> {
        self.gpu.download(&x)
    }

    fn upload(&self, values: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
        self.gpu.upload(values)
    }

    fn copy(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<f32>, GpuError> {
        Backend::copy(self.gpu, x)
    }

    fn embed(
        &self,
        table: &GpuMatrix,
        width: usize,
        indices: &[usize],
    ) -> Result<CudaSlice<f32>, GpuError> {
        Backend::embed(self.gpu, table, width, indices)
    }

    fn select_rows(
        &self,
        x: &CudaSlice<f32>,
        width: usize,
        indices: &[usize],
    ) -> Result<CudaSlice<f32>, GpuError> {
        Backend::select_rows(self.gpu, x, width, indices)
    }

    fn rms_norm(
        &self,
        x: &mut CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f64,
    ) -> Result<(), GpuError> {
        self.gpu.rms_norm(x, weight, eps as f32)
    }

    fn rms_norm_into(
        &self,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f64,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu.rms_norm_into(x, out, weight, eps as f32)
    }

    fn project(
        &self,
        x: &CudaSlice<f32>,
        weight: &GpuMatrix,
        inp: usize,
        bias: Option<&CudaSlice<f32>>,
        lora: Option<&[GpuLoraSegment<'_>]>,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        Backend::project(self.gpu, x, weight, inp, bias, None, y, accumulate)?;
        match lora {
            Some(segments) => {
                let out = y.len() / (x.len() / inp).max(1);
                self.gpu.lora_forward(x, inp, y, out, segments)
            }
            None => Ok(()),
        }
    }

    fn rope(
        &self,
        batch: &GpuTrainBatch,
        x: &mut CudaSlice<f32>,
        head_dim: usize,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu.rope(x, head_dim, &batch.positions, cos, sin)
    }

    fn attend(
        &self,
        batch: &mut GpuTrainBatch,
        layer: usize,
        shape: Heads,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        if batch.lse.len() <= layer {
            batch.lse.resize_with(layer + 1, || None);
        }
        let mut lse = self.gpu.zeros(q.len() / shape.head_dim)?;
        self.gpu
            .attention_forward(q, k, v, shape, &batch.lengths, out, &mut lse)?;
        batch.lse[layer] = Some(lse);
        Ok(())
    }

    fn gate_mul(
        &self,
        activation: Activation,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu.gate_mul(activation, gate, up)
    }

    fn scale(&self, x: &mut CudaSlice<f32>, factor: f64) -> Result<(), GpuError> {
        self.gpu.scale(x, factor as f32)
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<(), GpuError> {
        self.gpu.add(x, y)
    }

    fn advance(&self, _batch: &mut GpuTrainBatch) {}
}

impl Backward for GpuTrain<'_> {
    type LoraGrads<'a> = GpuLoraGrads<'a>;

    fn scale_rows(&self, x: &mut CudaSlice<f32>, factors: &[f64]) -> Result<(), GpuError> {
        let factors: Vec<f32> = factors.iter().map(|&f| f as f32).collect();
        self.gpu.scale_rows(x, &factors)
    }

    fn rms_norm_backward(
        &self,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f64,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        dweight: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        self.gpu
            .rms_norm_backward(x, weight, eps as f32, dy, dx, dweight)
    }

    fn project_backward(
        &self,
        x: &CudaSlice<f32>,
        weight: &GpuMatrix,
        inp: usize,
        lora: Option<GpuLoraGrads<'_>>,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu.project_backward_input(dy, weight, inp, dx)?;
        if let Some(mut lora) = lora {
            let out = dy.len() / (x.len() / inp).max(1);
            self.gpu
                .lora_backward(x, inp, dy, out, lora.segments, &mut lora.grads, dx)?;
        }
        Ok(())
    }

    fn weight_gradient(
        &self,
        x: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        inp: usize,
        dweight: &mut CudaSlice<f32>,
        dbias: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        self.gpu.weight_gradient(x, dy, inp, dweight, dbias)
    }

    fn rope_backward(
        &self,
        batch: &GpuTrainBatch,
        dx: &mut CudaSlice<f32>,
        head_dim: usize,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu
            .rope_backward(dx, head_dim, &batch.positions, cos, sin)
    }

    fn attend_backward(
        &self,
        batch: &GpuTrainBatch,
        layer: usize,
        shape: Heads,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &CudaSlice<f32>,
        d_out: &CudaSlice<f32>,
        dq: &mut CudaSlice<f32>,
        dk: &mut CudaSlice<f32>,
        dv: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let lse = batch
            .lse
            .get(layer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                GpuError::InvalidArgument(format!(
                    "layer {layer}'s attention has no forward in this batch"
                ))
            })?;
        self.gpu
            .attention_backward(q, k, v, out, lse, d_out, shape, &batch.lengths, dq, dk, dv)
    }

    fn gate_mul_backward(
        &self,
        activation: Activation,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        d_out: &CudaSlice<f32>,
        d_gate: &mut CudaSlice<f32>,
        d_up: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu
            .gate_mul_backward(activation, gate, up, d_out, d_gate, d_up)
    }

    fn embed_backward(
        &self,
        indices: &[usize],
        width: usize,
        d_x: &CudaSlice<f32>,
        d_table: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let indices = self.gpu.indices(indices)?;
        self.gpu.embed_backward(&indices, width, d_x, d_table)
    }

    fn unembed_logprobs(
        &self,
        x: &CudaSlice<f32>,
        table: &GpuMatrix,
        hidden: usize,
        targets: &[u32],
        jacobian: Option<&mut CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>, GpuError> {
        self.gpu
            .unembed_logprobs(x, table, hidden, targets, jacobian)
    }

    fn unembed_logprobs_backward(
        &self,
        jacobian: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.gpu.unembed_logprobs_backward(jacobian, g, dx)
    }

    fn target_logprobs(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        targets: &[u32],
    ) -> Result<CudaSlice<f32>, GpuError> {
        self.gpu.target_logprobs(logits, vocab, targets)
    }

    fn target_logprobs_backward(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        targets: &[u32],
        g: &CudaSlice<f32>,
    ) -> Result<CudaSlice<f32>, GpuError> {
        self.gpu.target_logprobs_backward(logits, vocab, targets, g)
    }
}
