//! The first training ops on the device: the backward of the row-wise ops (RMSNorm, RoPE, the
//! SiLU gate), of a frozen projection's input and of full-parameter weights, of the embedding
//! lookup and of the logprob head over logits, and AdamW with the global norm's clip; each as
//! the CPU trainer computes it and with no sum whose grouping follows the batch: a weight's
//! gradient adds the rows in order, a row's input gradient adds the outputs in order, and a norm
//! adds fixed chunks in chunk order; LoRA's backward per segment, its products each a thread per
//! value; causal attention over whole sequences, forward (keeping each row's log-sum-exp) and
//! backward (recomputing the probabilities); and the unembedding's logprob with its Jacobian
//! (through the logits for now: the CPU's fuses them away).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::backend::GpuMatrix;
use super::error::{DriverContext, GpuError, ensure};
use super::{DeviceIndices, Gpu, elementwise, grid, grid_y, int, row_blocks};
use crate::Heads;
use crate::ops::Activation;

/// Threads of the training attention's blocks (`ATTENTION_THREADS` in `kernels.cu`).
const ATTENTION_THREADS: u32 = 128;
/// The shared memory a training attention block may hold its scores in: one float per position
/// of the longest sequence.
const SCORES_BYTES: usize = 47 * 1024;

/// Values per block of `square_sum_partials` (`SQUARE_CHUNK` in `kernels.cu`).
const SQUARE_CHUNK: usize = 4096;
/// Threads of `square_sum_partials` (a power of two: its reduction tree is fixed by it).
const SQUARE_THREADS: u32 = 256;
/// The side of the square tile of `dx` a block of `linear_backward_input` computes
/// (`BWD_TILE` in `kernels.cu`), and its threads (each 4 × 4 values of the tile).
const BACKWARD_TILE: usize = 64;
const BACKWARD_THREADS: u32 = 256;

/// One adapter's pair on the device, for a segment of rows: `a (rank × in)`, `b (out × rank)`.
#[derive(Clone, Copy)]
pub struct GpuLoraPair<'a> {
    pub a: &'a CudaSlice<f32>,
    pub b: &'a CudaSlice<f32>,
    pub rank: usize,
    pub scale: f32,
}

/// A run of consecutive rows that share one adapter (`None`: no delta), as `crate::Segment`.
#[derive(Clone, Copy)]
pub struct GpuLoraSegment<'a> {
    pub rows: usize,
    pub pair: Option<GpuLoraPair<'a>>,
}

/// The gradients one segment's pair accumulates into: `a (rank × in)`, `b (out × rank)`.
pub struct GpuLoraGrad<'a> {
    pub a: &'a mut CudaSlice<f32>,
    pub b: &'a mut CudaSlice<f32>,
}

/// One operand of [`Gpu::small_gemm`]: a buffer, where its matrix starts, and whether it is
/// stored transposed.
struct Operand<'a> {
    values: &'a CudaSlice<f32>,
    offset: usize,
    transposed: bool,
}

impl<'a> Operand<'a> {
    fn plain(values: &'a CudaSlice<f32>, offset: usize) -> Self {
        Operand {
            values,
            offset,
            transposed: false,
        }
    }

    fn transposed(values: &'a CudaSlice<f32>, offset: usize) -> Self {
        Operand {
            values,
            offset,
            transposed: true,
        }
    }
}

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

    /// The backward of [`Gpu::gate_mul`] from its inputs: writes `d_gate` and `d_up`. As
    /// `ops::gate_mul_backward`.
    pub fn gate_mul_backward(
        &self,
        activation: Activation,
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
        let code = activation.code();
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.gate_mul_backward);
        launch
            .arg(gate)
            .arg(up)
            .arg(d_out)
            .arg(d_gate)
            .arg(d_up)
            .arg(&n)
            .arg(&code);
        // SAFETY: matches `gate_mul_backward`; one thread per element of five buffers as long.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching gate_mul_backward")?;
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

    /// `dx (rows × inp) += dy (rows × out) · W`: the input's gradient through a frozen
    /// projection `W (out × inp)`, f32 or bf16. As the CPU trainer's `project_backward` without
    /// adapters.
    pub fn project_backward_input(
        &self,
        dy: &CudaSlice<f32>,
        weight: &GpuMatrix,
        inp: usize,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let values = weight.values();
        ensure(inp > 0 && values.is_multiple_of(inp), || {
            format!("W has {values} values, not a multiple of inp {inp}")
        })?;
        let out = values / inp;
        ensure(out > 0 && dy.len().is_multiple_of(out), || {
            format!("dy has {} values, not rows × {out}", dy.len())
        })?;
        let rows = dy.len() / out;
        ensure(dx.len() == rows * inp, || {
            format!("dx must be {rows} × {inp}")
        })?;
        if rows == 0 {
            return Ok(());
        }
        let ints = [int(rows, "rows")?, int(inp, "inp")?, int(out, "out")?];
        let mut launch = match weight {
            GpuMatrix::F32(w) => {
                let mut launch = self
                    .stream()
                    .launch_builder(&self.kernels.linear_backward_input);
                launch.arg(dy).arg(w);
                launch
            }
            GpuMatrix::Bf16(w) => {
                let mut launch = self
                    .stream()
                    .launch_builder(&self.kernels.linear_backward_input_bf16);
                launch.arg(dy).arg(w);
                launch
            }
        };
        launch.arg(dx).arg(&ints[0]).arg(&ints[1]).arg(&ints[2]);
        let config = LaunchConfig {
            grid_dim: (
                grid(inp.div_ceil(BACKWARD_TILE))?,
                grid_y(rows.div_ceil(BACKWARD_TILE))?,
                1,
            ),
            block_dim: (BACKWARD_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `linear_backward_input_f32` / `_bf16`: a block per 64 × 64 tile of
        // `dx` (`rows × inp`), 256 threads, each reading rows of `dy` (`rows × out`) and `W`
        // inside their bounds and writing its tile's values inside `dx`'s.
        unsafe { launch.launch(config) }.doing("launching linear_backward_input")?;
        Ok(())
    }

    /// The weight side of a projection's backward (full-parameter training): `dweight (out ×
    /// inp) += dyᵀ · x`, `dbias += Σ dy`, the rows in order.
    pub fn weight_gradient(
        &self,
        x: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        inp: usize,
        dweight: &mut CudaSlice<f32>,
        dbias: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        ensure(inp > 0 && x.len().is_multiple_of(inp), || {
            format!("x has {} values, not rows × {inp}", x.len())
        })?;
        let rows = x.len() / inp;
        ensure(rows > 0 && dy.len().is_multiple_of(rows), || {
            format!("dy has {} values, not {rows} rows", dy.len())
        })?;
        let out = dy.len() / rows;
        ensure(dweight.len() == out * inp, || {
            format!("dweight must be {out} × {inp}")
        })?;
        ensure(dbias.as_ref().is_none_or(|b| b.len() == out), || {
            format!("dbias must have {out} values")
        })?;
        let ints = [int(rows, "rows")?, int(inp, "inp")?, int(out, "out")?];
        let mut launch = self.stream().launch_builder(&self.kernels.weight_gradient);
        launch
            .arg(dy)
            .arg(x)
            .arg(dweight)
            .arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2]);
        // SAFETY: matches `weight_gradient`; one thread per value of `dweight` (`out × inp`),
        // reading a column of `dy` (`rows × out`) and of `x` (`rows × inp`).
        unsafe { launch.launch(elementwise(out * inp)?) }.doing("launching weight_gradient")?;
        if let Some(dbias) = dbias {
            let mut launch = self.stream().launch_builder(&self.kernels.bias_gradient);
            launch.arg(dy).arg(dbias).arg(&ints[0]).arg(&ints[2]);
            // SAFETY: matches `bias_gradient`; one thread per column of `dy`.
            unsafe { launch.launch(elementwise(out)?) }.doing("launching bias_gradient")?;
        }
        Ok(())
    }

    /// The backward of the embedding lookup of `indices`: `d_table[indices[r]] += d_x[r]`,
    /// the rows in order.
    pub fn embed_backward(
        &self,
        indices: &DeviceIndices,
        width: usize,
        d_x: &CudaSlice<f32>,
        d_table: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let rows = indices.len();
        ensure(width > 0 && d_x.len() == rows * width, || {
            format!("d_x must be {rows} × {width}")
        })?;
        ensure(d_table.len().is_multiple_of(width), || {
            format!("the table has {} values, not rows × {width}", d_table.len())
        })?;
        ensure(indices.end <= d_table.len() / width, || {
            format!(
                "index {} of a table of {} rows",
                indices.end - 1,
                d_table.len() / width
            )
        })?;
        let (rows_i, width_i) = (int(rows, "rows")?, int(width, "width")?);
        let mut launch = self.stream().launch_builder(&self.kernels.embed_backward);
        launch
            .arg(&indices.values)
            .arg(d_x)
            .arg(d_table)
            .arg(&rows_i)
            .arg(&width_i);
        // SAFETY: matches `embed_backward`; one thread per column, every index below the
        // table's rows (checked above).
        unsafe { launch.launch(elementwise(width)?) }.doing("launching embed_backward")?;
        Ok(())
    }

    /// `log_softmax(logits)[target]` of each row of `logits (rows × vocab)`, the normaliser
    /// summed in f64.
    pub fn target_logprobs(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        targets: &[u32],
    ) -> Result<CudaSlice<f32>, GpuError> {
        let targets = self.targets(logits, vocab, targets)?;
        let rows = targets.len();
        let mut out = self.zeros(rows)?;
        let vocab_i = int(vocab, "vocab")?;
        let mut launch = self.stream().launch_builder(&self.kernels.target_logprobs);
        launch.arg(logits).arg(&targets).arg(&mut out).arg(&vocab_i);
        // SAFETY: matches `target_logprobs`; one block per whole row, every target below
        // `vocab` (checked by `targets`).
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching target_logprobs")?;
        Ok(out)
    }

    /// The backward of [`Gpu::target_logprobs`]: the logits' gradient per row,
    /// `g[r] · (onehot(target) - softmax)`.
    pub fn target_logprobs_backward(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        targets: &[u32],
        g: &CudaSlice<f32>,
    ) -> Result<CudaSlice<f32>, GpuError> {
        let targets = self.targets(logits, vocab, targets)?;
        let rows = targets.len();
        ensure(g.len() == rows, || {
            format!("g must have one value per row, {rows}")
        })?;
        let mut d_logits = self.zeros(logits.len())?;
        let vocab_i = int(vocab, "vocab")?;
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.target_logprobs_backward);
        launch
            .arg(logits)
            .arg(&targets)
            .arg(g)
            .arg(&mut d_logits)
            .arg(&vocab_i);
        // SAFETY: matches `target_logprobs_backward`; one block per whole row of `logits` and
        // `d_logits`, every target below `vocab`.
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching target_logprobs_backward")?;
        Ok(d_logits)
    }

    /// `targets` on the device, one per row of `logits`, each checked below `vocab`.
    fn targets(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        targets: &[u32],
    ) -> Result<CudaSlice<i32>, GpuError> {
        ensure(
            vocab > 0 && !targets.is_empty() && logits.len() == targets.len() * vocab,
            || format!("logits must be {} × {vocab}", targets.len()),
        )?;
        let device: Vec<i32> = targets
            .iter()
            .map(|&t| {
                ensure((t as usize) < vocab, || {
                    format!("target {t} of a vocabulary of {vocab}")
                })?;
                int(t as usize, "target")
            })
            .collect::<Result<_, _>>()?;
        self.upload(&device)
    }

    /// `y (rows × out) += scale · (x Aᵀ) Bᵀ` for every segment with a pair (training's LoRA
    /// forward, each adapter's pair in buffers of its own); `x` is `rows × inp`.
    pub fn lora_forward(
        &self,
        x: &CudaSlice<f32>,
        inp: usize,
        y: &mut CudaSlice<f32>,
        out: usize,
        segments: &[GpuLoraSegment<'_>],
    ) -> Result<(), GpuError> {
        let rows: usize = segments.iter().map(|s| s.rows).sum();
        ensure(x.len() == rows * inp && y.len() == rows * out, || {
            format!("x must be {rows} × {inp}, y {rows} × {out}")
        })?;
        for segment in adapted(segments, inp, out)? {
            let shrunk = self.shrink(x, inp, &segment)?;
            self.small_gemm(
                Operand::plain(&shrunk, 0),
                Operand::transposed(segment.pair.b, 0),
                (&mut *y, segment.start * out),
                [segment.rows, out, segment.pair.rank],
                1.0,
                true,
            )?;
        }
        Ok(())
    }

    /// The backward of the mixed-adapter LoRA delta `y += scale · (x Aᵀ) Bᵀ` per segment, as
    /// `crate::lora_backward`: `dx +=` each adapted segment's input gradient, and where a
    /// segment's entry in `grads` is given, its pair's `A` and `B` gradients `+=` theirs. `x` is
    /// `rows × inp`, `dy` `rows × out`.
    #[allow(clippy::too_many_arguments)]
    pub fn lora_backward(
        &self,
        x: &CudaSlice<f32>,
        inp: usize,
        dy: &CudaSlice<f32>,
        out: usize,
        segments: &[GpuLoraSegment<'_>],
        grads: &mut [Option<GpuLoraGrad<'_>>],
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let rows: usize = segments.iter().map(|s| s.rows).sum();
        ensure(grads.len() == segments.len(), || {
            "one gradient entry per segment".to_string()
        })?;
        ensure(
            x.len() == rows * inp && dx.len() == x.len() && dy.len() == rows * out,
            || format!("x and dx must be {rows} × {inp}, dy {rows} × {out}"),
        )?;
        for segment in adapted(segments, inp, out)? {
            let (start, n, pair) = (segment.start, segment.rows, segment.pair);
            let rank = pair.rank;
            // d(shrunk) = scale · dy B, the gradient in rank space.
            let mut d_shrunk = self.zeros(n * rank)?;
            self.small_gemm(
                Operand::plain(dy, start * out),
                Operand::plain(pair.b, 0),
                (&mut d_shrunk, 0),
                [n, rank, out],
                pair.scale,
                false,
            )?;
            if let Some(grad) = grads[segment.index].as_mut() {
                ensure(
                    grad.a.len() == rank * inp && grad.b.len() == out * rank,
                    || "a pair's gradients must have its shapes".to_string(),
                )?;
                // dB += dyᵀ shrunk; dA += d(shrunk)ᵀ x.
                let shrunk = self.shrink(x, inp, &segment)?;
                self.small_gemm(
                    Operand::transposed(dy, start * out),
                    Operand::plain(&shrunk, 0),
                    (&mut *grad.b, 0),
                    [out, rank, n],
                    1.0,
                    true,
                )?;
                self.small_gemm(
                    Operand::transposed(&d_shrunk, 0),
                    Operand::plain(x, start * inp),
                    (&mut *grad.a, 0),
                    [rank, inp, n],
                    1.0,
                    true,
                )?;
            }
            // dx += d(shrunk) A.
            self.small_gemm(
                Operand::plain(&d_shrunk, 0),
                Operand::plain(pair.a, 0),
                (dx, start * inp),
                [n, inp, rank],
                1.0,
                true,
            )?;
        }
        Ok(())
    }

    /// A segment's rows in rank space: `scale · x Aᵀ` (`rows × rank`).
    fn shrink(
        &self,
        x: &CudaSlice<f32>,
        inp: usize,
        segment: &Adapted<'_>,
    ) -> Result<CudaSlice<f32>, GpuError> {
        let (n, rank) = (segment.rows, segment.pair.rank);
        let mut shrunk = self.zeros(n * rank)?;
        self.small_gemm(
            Operand::plain(x, segment.start * inp),
            Operand::transposed(segment.pair.a, 0),
            (&mut shrunk, 0),
            [n, rank, inp],
            segment.pair.scale,
            false,
        )?;
        Ok(shrunk)
    }

    /// `c = alpha · op(a) · op(b)` (`+=` when `accumulate`) for `[m, n, k]`: `op(a)` is
    /// `m × k`, `op(b)` `k × n`, `c` from its offset `m × n`; every operand's extent is checked
    /// against its buffer.
    fn small_gemm(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        (c, c_offset): (&mut CudaSlice<f32>, usize),
        [m, n, k]: [usize; 3],
        alpha: f32,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        ensure(
            a.offset + m * k <= a.values.len()
                && b.offset + k * n <= b.values.len()
                && c_offset + m * n <= c.len(),
            || format!("a {m} × {k} by {k} × {n} product reaches past its buffers"),
        )?;
        if m * n == 0 {
            return Ok(());
        }
        let ints = [
            int(m, "m")?,
            int(n, "n")?,
            int(k, "k")?,
            i32::from(a.transposed),
            i32::from(b.transposed),
        ];
        let accumulate = i32::from(accumulate);
        let mut launch = self.stream().launch_builder(&self.kernels.small_gemm);
        launch
            .arg(a.values)
            .arg(&a.offset)
            .arg(b.values)
            .arg(&b.offset)
            .arg(c)
            .arg(&c_offset);
        for value in &ints {
            launch.arg(value);
        }
        launch.arg(&alpha).arg(&accumulate);
        // SAFETY: matches `small_gemm`; the operands' extents from their offsets were checked
        // against their buffers above, one thread per value of `c`'s `m × n`.
        unsafe { launch.launch(elementwise(m * n)?) }.doing("launching small_gemm")?;
        Ok(())
    }

    /// Causal attention of whole sequences (training; no cache): `q (rows × heads × head_dim)`,
    /// `k` and `v (rows × kv_heads × head_dim)`, the rows sequences of `lengths` one after
    /// another. Writes `out` (`q`'s shape) and each row and head's log-sum-exp of its scaled
    /// scores into `lse (rows × heads)`. As `crate::attention_forward`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_forward(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        shape: Heads,
        lengths: &[usize],
        out: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let rows = check_attention(shape, lengths, [q, out], [k, v])?;
        ensure(lse.len() == rows * shape.heads, || {
            format!("lse must be {rows} × {}", shape.heads)
        })?;
        if rows == 0 {
            return Ok(());
        }
        let starts = self.upload(&row_bounds(lengths, false)?)?;
        let ints = attention_ints(shape)?;
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.attention_train_forward);
        launch.arg(q).arg(k).arg(v).arg(&starts).arg(out).arg(lse);
        for value in &ints {
            launch.arg(value);
        }
        launch.arg(&scale);
        // SAFETY: matches `attention_train_forward`; one block per (row, head), every row's
        // keys inside its own sequence (`starts`), its scores in the shared memory asked for.
        unsafe { launch.launch(attention_config(rows, shape.heads, lengths)?) }
            .doing("launching attention_train_forward")?;
        Ok(())
    }

    /// The backward of [`Gpu::attention_forward`] from `d_out`: writes `dq`, `dk` and `dv`,
    /// recomputing the probabilities from `lse`. Each key's gradient adds the query heads of its
    /// group and the rows that see it in order. As `crate::attention_backward`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &CudaSlice<f32>,
        lse: &CudaSlice<f32>,
        d_out: &CudaSlice<f32>,
        shape: Heads,
        lengths: &[usize],
        dq: &mut CudaSlice<f32>,
        dk: &mut CudaSlice<f32>,
        dv: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let rows = check_attention(shape, lengths, [q, out], [k, v])?;
        ensure(
            lse.len() == rows * shape.heads
                && d_out.len() == q.len()
                && dq.len() == q.len()
                && dk.len() == k.len()
                && dv.len() == v.len(),
            || "lse, d_out and the gradients must have their inputs' shapes".to_string(),
        )?;
        ensure(shape.head_dim <= 4 * ATTENTION_THREADS as usize, || {
            format!("head_dim {} is above the kernels' 512", shape.head_dim)
        })?;
        if rows == 0 {
            return Ok(());
        }
        let starts = self.upload(&row_bounds(lengths, false)?)?;
        let ends = self.upload(&row_bounds(lengths, true)?)?;
        let ints = attention_ints(shape)?;
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.attention_train_backward_q);
        launch
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(out)
            .arg(lse)
            .arg(d_out)
            .arg(&starts)
            .arg(dq);
        for value in &ints {
            launch.arg(value);
        }
        launch.arg(&scale);
        // SAFETY: matches `attention_train_backward_q`; one block per (row, head), its keys
        // inside its sequence, its scores in the shared memory asked for.
        unsafe { launch.launch(attention_config(rows, shape.heads, lengths)?) }
            .doing("launching attention_train_backward_q")?;
        let mut launch = self
            .stream()
            .launch_builder(&self.kernels.attention_train_backward_kv);
        launch
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(out)
            .arg(lse)
            .arg(d_out)
            .arg(&ends)
            .arg(dk)
            .arg(dv);
        for value in &ints {
            launch.arg(value);
        }
        launch.arg(&scale);
        let config = LaunchConfig {
            grid_dim: (grid(rows)?, grid_y(shape.kv_heads)?, 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `attention_train_backward_kv`; one block per (key row, KV head), the
        // query rows it visits inside the key's sequence (`ends`), head_dim within the four
        // values a thread keeps.
        unsafe { launch.launch(config) }.doing("launching attention_train_backward_kv")?;
        Ok(())
    }

    /// The logprob of each row's target under a frozen unembedding `table (vocab × hidden)`,
    /// and with `jacobian` (`x`'s shape) each row's gradient of it, `W_t - Σ softmax · W`, which
    /// is all its backward needs. As the CPU trainer's `unembed_logprobs`, but through the
    /// logits (`rows × vocab`, freed on return) where the CPU never makes them.
    pub fn unembed_logprobs(
        &self,
        x: &CudaSlice<f32>,
        table: &GpuMatrix,
        hidden: usize,
        targets: &[u32],
        jacobian: Option<&mut CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>, GpuError> {
        let values = table.values();
        ensure(hidden > 0 && values.is_multiple_of(hidden), || {
            format!("the table has {values} values, not vocab × {hidden}")
        })?;
        let vocab = values / hidden;
        ensure(x.len() == targets.len() * hidden, || {
            format!("x must be {} × {hidden}", targets.len())
        })?;
        let mut logits = self.zeros(targets.len() * vocab)?;
        match table {
            GpuMatrix::F32(w) => self.linear(x, w, None, None, hidden, &mut logits, false)?,
            GpuMatrix::Bf16(w) => self.linear_bf16(x, w, None, None, hidden, &mut logits, false)?,
        }
        let logprobs = self.target_logprobs(&logits, vocab, targets)?;
        if let Some(jacobian) = jacobian {
            ensure(jacobian.len() == x.len(), || {
                "the Jacobian must have x's shape".to_string()
            })?;
            // (onehot - softmax) per row, then through the table: W_t - Σ softmax · W.
            let ones = self.upload(&vec![1.0f32; targets.len()])?;
            let d_logits = self.target_logprobs_backward(&logits, vocab, targets, &ones)?;
            let mut zero = self.zeros(x.len())?;
            self.project_backward_input(&d_logits, table, hidden, &mut zero)?;
            *jacobian = zero;
        }
        Ok(logprobs)
    }

    /// The backward of [`Gpu::unembed_logprobs`]: `dx += g · J`, row by row.
    pub fn unembed_logprobs_backward(
        &self,
        jacobian: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let rows = g.len();
        ensure(
            rows > 0 && dx.len() == jacobian.len() && jacobian.len().is_multiple_of(rows),
            || "the Jacobian and dx must be one row per value of g".to_string(),
        )?;
        let (n, width) = (dx.len(), int(jacobian.len() / rows, "width")?);
        let mut launch = self.stream().launch_builder(&self.kernels.add_scaled_rows);
        launch.arg(dx).arg(jacobian).arg(g).arg(&n).arg(&width);
        // SAFETY: matches `add_scaled_rows`; one thread per value of `dx`, `jacobian` as long,
        // one `g` per row of `width`.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching add_scaled_rows")?;
        Ok(())
    }
}

/// A segment with an adapter and rows: its index among the segments, its first row, its rows
/// and its pair.
struct Adapted<'a> {
    index: usize,
    start: usize,
    rows: usize,
    pair: GpuLoraPair<'a>,
}

/// The segments that have a pair and rows, each pair checked against `inp` and `out`.
fn adapted<'a>(
    segments: &[GpuLoraSegment<'a>],
    inp: usize,
    out: usize,
) -> Result<Vec<Adapted<'a>>, GpuError> {
    let mut adapted = Vec::new();
    let mut start = 0;
    for (index, segment) in segments.iter().enumerate() {
        let rows = segment.rows;
        start += rows;
        let Some(pair) = segment.pair else { continue };
        let rank = pair.rank;
        ensure(
            rank > 0 && pair.a.len() == rank * inp && pair.b.len() == out * rank,
            || format!("a pair of rank {rank} must be {rank} × {inp} and {out} × {rank}"),
        )?;
        if rows > 0 {
            adapted.push(Adapted {
                index,
                start: start - rows,
                rows,
                pair,
            });
        }
    }
    Ok(adapted)
}

/// Checks a training attention's shapes; returns its rows.
fn check_attention(
    shape: Heads,
    lengths: &[usize],
    [q, out]: [&CudaSlice<f32>; 2],
    [k, v]: [&CudaSlice<f32>; 2],
) -> Result<usize, GpuError> {
    let Heads {
        heads,
        kv_heads,
        head_dim,
        ..
    } = shape;
    ensure(
        kv_heads > 0 && head_dim > 0 && heads.is_multiple_of(kv_heads),
        || "heads must be a multiple of kv_heads".to_string(),
    )?;
    let rows: usize = lengths.iter().sum();
    ensure(
        q.len() == rows * heads * head_dim && out.len() == q.len(),
        || format!("q and out must be {rows} × {heads} × {head_dim}"),
    )?;
    ensure(
        k.len() == rows * kv_heads * head_dim && v.len() == k.len(),
        || format!("k and v must be {rows} × {kv_heads} × {head_dim}"),
    )?;
    let longest = lengths.iter().copied().max().unwrap_or(0);
    ensure(longest * 4 <= SCORES_BYTES, || {
        format!("a sequence of {longest} positions is past the longest the kernels hold")
    })?;
    Ok(rows)
}

/// Per row, the first row of its sequence, or (with `end`) one past its last.
fn row_bounds(lengths: &[usize], end: bool) -> Result<Vec<i32>, GpuError> {
    let mut bounds = Vec::with_capacity(lengths.iter().sum());
    let mut first = 0;
    for &n in lengths {
        let bound = int(if end { first + n } else { first }, "row")?;
        bounds.extend(std::iter::repeat_n(bound, n));
        first += n;
    }
    Ok(bounds)
}

/// The kernels' heads, kv_heads, head_dim and window (0: none).
fn attention_ints(shape: Heads) -> Result<[i32; 4], GpuError> {
    Ok([
        int(shape.heads, "heads")?,
        int(shape.kv_heads, "kv_heads")?,
        int(shape.head_dim, "head_dim")?,
        int(shape.window.unwrap_or(0), "window")?,
    ])
}

/// A block per (row, head), with shared memory for the longest sequence's scores.
fn attention_config(
    rows: usize,
    heads: usize,
    lengths: &[usize],
) -> Result<LaunchConfig, GpuError> {
    let longest = lengths.iter().copied().max().unwrap_or(0);
    Ok(LaunchConfig {
        grid_dim: (grid(rows)?, grid_y(heads)?, 1),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: (longest.max(1) * 4) as u32,
    })
}
