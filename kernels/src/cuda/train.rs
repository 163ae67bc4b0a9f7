//! The first training ops on the device: the backward of the row-wise ops (RMSNorm, RoPE, the
//! SiLU gate) and AdamW with the global norm's clip, each as the CPU trainer computes it and with
//! no sum whose grouping follows the batch: a weight's gradient adds the rows in order, and a
//! norm adds fixed chunks in chunk order.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::error::{DriverContext, GpuError, ensure};
use super::{DeviceIndices, Gpu, elementwise, grid, int, row_blocks};

/// Values per block of `square_sum_partials` (`SQUARE_CHUNK` in `kernels.cu`).
const SQUARE_CHUNK: usize = 4096;
/// Threads of `square_sum_partials` (a power of two: its reduction tree is fixed by it).
const SQUARE_THREADS: u32 = 256;

/// One AdamW step's settings, as the trainer's `optim_step` takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The step's number, from 1: the bias corrections are `1 - beta^step`.
    pub step: i32,
    /// The factor the gradient is scaled by (the global norm's clip; 1 for none).
    pub clip: f64,
}

impl Gpu {
    /// The backward of [`Gpu::rms_norm_into`] for rows of `weight.len()`: `dx += ∂x` from `dy`,
    /// and `dweight += ∂weight` when given; the inverse rms is recomputed from `x`. As
    /// `ops::rms_norm_backward`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_backward(
        &self,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f32,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        dweight: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        let n = weight.len();
        ensure(n > 0 && x.len().is_multiple_of(n), || {
            format!("x has {} values, not rows × {n}", x.len())
        })?;
        ensure(dy.len() == x.len() && dx.len() == x.len(), || {
            "dy and dx must have x's shape".to_string()
        })?;
        ensure(dweight.as_ref().is_none_or(|d| d.len() == n), || {
            format!("dweight must have the weight's {n} values")
        })?;
        let rows = x.len() / n;
        if rows == 0 {
            return Ok(());
        }
        let mut inverse = self.zeros(rows)?;
        let n_i = int(n, "row width")?;
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.rms_norm_backward);
        launch
            .arg(x)
            .arg(weight)
            .arg(dy)
            .arg(&mut *dx)
            .arg(&mut inverse)
            .arg(&n_i)
            .arg(&eps);
        // SAFETY: matches `rms_norm_backward`; one block per whole row of `x`, `dy` and `dx`,
        // one inverse per row.
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching rms_norm_backward")?;
        if let Some(dweight) = dweight {
            let rows_i = int(rows, "rows")?;
            let mut launch = self
                .stream()
                .launch_builder(&self.kernels.rms_norm_weight_grad);
            launch
                .arg(x)
                .arg(dy)
                .arg(&inverse)
                .arg(dweight)
                .arg(&rows_i)
                .arg(&n_i);
            // SAFETY: matches `rms_norm_weight_grad`; one thread per column of the `rows × n`
            // inputs, the inverses written above on the same stream.
            unsafe { launch.launch(elementwise(n)?) }.doing("launching rms_norm_weight_grad")?;
        }
        Ok(())
    }

    /// The backward of [`Gpu::rope`], in place on the gradient: the rotation by the opposite
    /// angle. As `ops::rope_backward`.
    pub fn rope_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        head_dim: usize,
        positions: &DeviceIndices,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.launch_rope(
            &self.kernels.rope_backward,
            dx,
            head_dim,
            positions,
            cos,
            sin,
        )
    }

    /// The backward of [`Gpu::silu_mul`] from its inputs: writes `d_gate` and `d_up`. As
    /// `ops::silu_mul_backward`.
    pub fn silu_mul_backward(
        &self,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        d_out: &CudaSlice<f32>,
        d_gate: &mut CudaSlice<f32>,
        d_up: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let n = gate.len();
        ensure(
            [up.len(), d_out.len(), d_gate.len(), d_up.len()]
                .iter()
                .all(|&len| len == n),
            || "gate, up and the gradients must be as long".to_string(),
        )?;
        if n == 0 {
            return Ok(());
        }
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.silu_mul_backward);
        launch
            .arg(gate)
            .arg(up)
            .arg(d_out)
            .arg(d_gate)
            .arg(d_up)
            .arg(&n);
        // SAFETY: matches `silu_mul_backward`; one thread per element of five buffers as long.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching silu_mul_backward")?;
        Ok(())
    }

    /// `Σ x²` in f64, waiting for the queued work: fixed chunks summed on the device, their sums
    /// added in order here, so the result depends on `x` alone (the gradient norm that AdamW's
    /// clip needs).
    pub fn square_sum(&self, x: &CudaSlice<f32>) -> Result<f64, GpuError> {
        let n = x.len();
        if n == 0 {
            return Ok(0.0);
        }
        let chunks = n.div_ceil(SQUARE_CHUNK);
        let mut partials = self
            .stream()
            .alloc_zeros::<f64>(chunks)
            .doing("allocating device memory")?;
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.square_sum_partials);
        launch.arg(x).arg(&n).arg(&mut partials);
        let config = LaunchConfig {
            grid_dim: (grid(chunks)?, 1, 1),
            block_dim: (SQUARE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `square_sum_partials`; one block per chunk of `x`, one partial each.
        unsafe { launch.launch(config) }.doing("launching square_sum_partials")?;
        let partials = self
            .stream()
            .clone_dtoh(&partials)
            .doing("copying from the device")?;
        Ok(partials.iter().sum())
    }

    /// One AdamW step of `weights` from `grad`, with the moments `m` and `v` (all as long), in
    /// the CPU trainer's order: the gradient scaled by `step.clip`, the moments, the decoupled
    /// decay, the bias-corrected update.
    pub fn adamw(
        &self,
        weights: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        step: AdamStep,
    ) -> Result<(), GpuError> {
        let n = weights.len();
        ensure(grad.len() == n && m.len() == n && v.len() == n, || {
            "weights, gradient and moments must be as long".to_string()
        })?;
        ensure(step.step >= 1, || {
            format!("AdamW steps count from 1, not {}", step.step)
        })?;
        if n == 0 {
            return Ok(());
        }
        let bias1 = (1.0 - step.beta1.powi(step.step)) as f32;
        let bias2 = (1.0 - step.beta2.powi(step.step)) as f32;
        let floats = [
            step.clip as f32,
            step.learning_rate as f32,
            step.beta1 as f32,
            step.beta2 as f32,
            step.eps as f32,
            step.weight_decay as f32,
            bias1,
            bias2,
        ];
        let mut launch = self.stream().launch_builder(&self.kernels.adamw);
        launch.arg(weights).arg(grad).arg(m).arg(v).arg(&n);
        for value in &floats {
            launch.arg(value);
        }
        // SAFETY: matches `adamw`; one thread per element of four buffers as long.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching adamw")?;
        Ok(())
    }
}
