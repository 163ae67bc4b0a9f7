//! The CUDA backend (feature `cuda`): the CPU kernels' ops on device buffers, under the same
//! contract (a row's bits never depend on what else is batched). cudarc loads the driver and
//! NVRTC at run time and the kernels (`kernels.cu`) are compiled by NVRTC for the device at hand,
//! so the crate builds on a machine with no CUDA toolkit and no GPU; there [`Gpu::new`] says
//! which part is missing, and the GPU tests skip themselves.
//!
//! Buffers are cudarc's [`CudaSlice`]s, always whole allocations (256-byte aligned), which the
//! vectorised loads rely on.

mod attention;
mod backend;
mod draw;
mod error;
mod lora;
mod train;
mod train_backend;

use std::sync::Arc;

pub use attention::{AttentionBatch, PagedKvCache, SequenceRow};
pub use backend::{GpuBatch, GpuMatrix, WeightFormat};
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
pub use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
pub use draw::{Draw, Drawn};
use error::{DriverContext, ensure};

use crate::ops::Activation;
pub use error::{GpuError, GpuErrorKind};
pub use lora::{
    AdapterRef, DeviceSegment, LoraBatch, LoraPool, LoraSite, MAX_LORA_INPUT, MAX_LORA_RANK,
};
pub use train::{AdamStep, GpuLoraGrad, GpuLoraPair, GpuLoraSegment};
pub use train_backend::{GpuLoraGrads, GpuTrain, GpuTrainBatch};

/// The source of every kernel, compiled at run time.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// Rows of one tile of the projection and LoRA kernels (`ROW_TILE` in `kernels.cu`).
const ROW_TILE: usize = 8;
/// Warps per block of the projection.
const LINEAR_WARPS: u32 = 8;
/// Rows and columns of one warp's tile in the projection's wide tiling (`WIDE_ROWS` and
/// `WIDE_COLS` in `kernels.cu`).
const WIDE_ROWS: usize = 16;
const WIDE_COLS: usize = 4;
/// Threads of the row-reduction kernels (a power of two: their reduction tree is fixed by it).
const REDUCE_THREADS: u32 = 256;
/// Threads of the elementwise kernels.
const ELEMENTWISE_THREADS: u32 = 256;

/// Compiles [`KERNEL_SOURCE`] to PTX for `arch` (e.g. `compute_90`; NVRTC's default when
/// `None`). Needs only NVRTC, no GPU: the CPU test suite uses it to check the source compiles.
pub fn compile_kernels(arch: Option<&str>) -> Result<Ptx, GpuError> {
    // SAFETY: only tries to open the library; no symbol is called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoCompiler);
    }
    let mut options = vec!["--std=c++17".to_string()];
    if let Some(arch) = arch {
        options.push(format!("--gpu-architecture={arch}"));
    }
    let compile_options = CompileOptions {
        options,
        name: Some("opentinker-kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, compile_options).map_err(|error| {
        let log = match &error {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        GpuError::Compile { log }
    })
}

/// The compiled kernels of one device.
struct Kernels {
    linear: CudaFunction,
    lora_shrink: CudaFunction,
    lora_expand: CudaFunction,
    rms_norm: CudaFunction,
    rms_norm_into: CudaFunction,
    rope: CudaFunction,
    gate_mul: CudaFunction,
    scale_in_place: CudaFunction,
    scale_rows: CudaFunction,
    log_softmax: CudaFunction,
    kv_write: CudaFunction,
    paged_attention: CudaFunction,
    gather_rows: CudaFunction,
    add_bias: CudaFunction,
    add_in_place: CudaFunction,
    argmax_rows: CudaFunction,
    fill_uniform: CudaFunction,
    linear_bf16: CudaFunction,
    linear_wide: CudaFunction,
    linear_wide_bf16: CudaFunction,
    linear_row: CudaFunction,
    linear_row_bf16: CudaFunction,
    gather_rows_bf16: CudaFunction,
    to_bf16: CudaFunction,
    rms_norm_backward: CudaFunction,
    rms_norm_weight_grad: CudaFunction,
    rope_backward: CudaFunction,
    gate_mul_backward: CudaFunction,
    square_sum_partials: CudaFunction,
    adamw: CudaFunction,
    linear_backward_input: CudaFunction,
    linear_backward_input_bf16: CudaFunction,
    weight_gradient: CudaFunction,
    bias_gradient: CudaFunction,
    embed_backward: CudaFunction,
    target_logprobs: CudaFunction,
    target_logprobs_backward: CudaFunction,
    small_gemm: CudaFunction,
    attention_train_forward: CudaFunction,
    attention_train_backward_q: CudaFunction,
    attention_train_backward_kv: CudaFunction,
    add_scaled_rows: CudaFunction,
    draw_tokens: CudaFunction,
}

/// One CUDA device with its stream and compiled kernels. Every op is queued on the stream;
/// [`Gpu::download`] and [`Gpu::synchronize`] wait for it.
pub struct Gpu {
    stream: Arc<CudaStream>,
    kernels: Kernels,
    name: String,
    compute_capability: (i32, i32),
    /// Streaming multiprocessors: how many blocks fill the device.
    multiprocessors: usize,
}

impl Gpu {
    /// Opens device `ordinal` and compiles the kernels for it. Fails with a
    /// [`GpuErrorKind::NoDriver`] or [`GpuErrorKind::NoCompiler`] error on a machine without
    /// a driver, a device or NVRTC.
    pub fn new(ordinal: usize) -> Result<Gpu, GpuError> {
        // SAFETY: only tries to open the library; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(|error| GpuError::NoDevice {
            ordinal,
            count: 0,
            detail: error.to_string(),
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(GpuError::NoDevice {
                ordinal,
                count,
                detail: "no such ordinal".into(),
            });
        }
        let context = CudaContext::new(ordinal).doing("opening the device")?;
        // SAFETY: every op of a `Gpu` runs on its one stream, in order, so cudarc's per-buffer
        // events (which order work across streams) would only add two event records per launch.
        unsafe { context.disable_event_tracking() };
        keep_freed_memory(&context)?;
        let compute_capability = context
            .compute_capability()
            .doing("reading the compute capability")?;
        let name = context.name().doing("reading the device name")?;
        let multiprocessors = context
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .doing("reading the multiprocessor count")?
            .max(1) as usize;
        let (major, minor) = compute_capability;
        let arch = format!("compute_{major}{minor}");
        let ptx = compile_kernels(Some(&arch))?;
        let module = context.load_module(ptx).doing("loading the kernels")?;
        let function = |name: &'static str| module.load_function(name).doing(name);
        let kernels = Kernels {
            linear: function("linear_f32")?,
            lora_shrink: function("lora_shrink")?,
            lora_expand: function("lora_expand")?,
            rms_norm: function("rms_norm")?,
            rms_norm_into: function("rms_norm_into")?,
            rope: function("rope")?,
            gate_mul: function("gate_mul")?,
            scale_in_place: function("scale_in_place")?,
            scale_rows: function("scale_rows")?,
            log_softmax: function("log_softmax")?,
            kv_write: function("kv_write")?,
            paged_attention: function("paged_attention")?,
            gather_rows: function("gather_rows")?,
            add_bias: function("add_bias")?,
            add_in_place: function("add_in_place")?,
            argmax_rows: function("argmax_rows")?,
            fill_uniform: function("fill_uniform")?,
            linear_bf16: function("linear_bf16")?,
            linear_wide: function("linear_wide_f32")?,
            linear_wide_bf16: function("linear_wide_bf16")?,
            linear_row: function("linear_row_f32")?,
            linear_row_bf16: function("linear_row_bf16")?,
            gather_rows_bf16: function("gather_rows_bf16")?,
            to_bf16: function("to_bf16")?,
            rms_norm_backward: function("rms_norm_backward")?,
            rms_norm_weight_grad: function("rms_norm_weight_grad")?,
            rope_backward: function("rope_backward")?,
            gate_mul_backward: function("gate_mul_backward")?,
            square_sum_partials: function("square_sum_partials")?,
            adamw: function("adamw")?,
            linear_backward_input: function("linear_backward_input_f32")?,
            linear_backward_input_bf16: function("linear_backward_input_bf16")?,
            weight_gradient: function("weight_gradient")?,
            bias_gradient: function("bias_gradient")?,
            embed_backward: function("embed_backward")?,
            target_logprobs: function("target_logprobs")?,
            target_logprobs_backward: function("target_logprobs_backward")?,
            small_gemm: function("small_gemm")?,
            attention_train_forward: function("attention_train_forward")?,
            attention_train_backward_q: function("attention_train_backward_q")?,
            attention_train_backward_kv: function("attention_train_backward_kv")?,
            add_scaled_rows: function("add_scaled_rows")?,
            draw_tokens: function("draw_tokens")?,
        };
        let stream = context.default_stream();
        Ok(Gpu {
            stream,
            kernels,
            name,
            compute_capability,
            multiprocessors,
        })
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The stream every op is queued on (for timing with events).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies `host` into a new device buffer.
    pub fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>, GpuError> {
        self.stream.clone_htod(host).doing("copying to the device")
    }

    /// A new device buffer of `len` zeros.
    pub fn zeros(&self, len: usize) -> Result<CudaSlice<f32>, GpuError> {
        self.stream
            .alloc_zeros(len)
            .doing("allocating device memory")
    }

    /// Waits for the queued work and copies `device` back.
    pub fn download(&self, device: &CudaSlice<f32>) -> Result<Vec<f32>, GpuError> {
        self.stream
            .clone_dtoh(device)
            .doing("copying from the device")
    }

    /// Waits until every queued op has run.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().doing("synchronising")
    }

    /// `y (rows × out) = x (rows × inp) · Wᵀ + bias` (or `y +=` when `accumulate`), `W` being
    /// `out × inp` and `bias` (`out` wide) optional, plus each row's adapter delta when `lora`
    /// names the site's adapters; as [`crate::linear`] followed by the bias and
    /// [`crate::lora_apply`].
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        lora: Option<LoraSite<'_>>,
        inp: usize,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let kernels = [
            &self.kernels.linear_row,
            &self.kernels.linear,
            &self.kernels.linear_wide,
        ];
        self.launch_linear(kernels, x, w, bias, lora, inp, y, accumulate)
    }

    /// [`Gpu::linear`] with `W` in bf16 (raw bits, see [`bf16_bits`]), computed in f32.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_bf16(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<u16>,
        bias: Option<&CudaSlice<f32>>,
        lora: Option<LoraSite<'_>>,
        inp: usize,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let kernels = [
            &self.kernels.linear_row_bf16,
            &self.kernels.linear_bf16,
            &self.kernels.linear_wide_bf16,
        ];
        self.launch_linear(kernels, x, w, bias, lora, inp, y, accumulate)
    }

    /// Launches the projection's single-row kernel (`[0]`) for one row, its narrow tiling
    /// (`[1]`, `ROW_TILE` rows a tile) for more, or its wide one (`[2]`) where that fills the
    /// device: the same sums in the same order (see `kernels.cu`).
    #[allow(clippy::too_many_arguments)]
    fn launch_linear<W>(
        &self,
        [single, narrow, wide]: [&CudaFunction; 3],
        x: &CudaSlice<f32>,
        w: &CudaSlice<W>,
        bias: Option<&CudaSlice<f32>>,
        lora: Option<LoraSite<'_>>,
        inp: usize,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        ensure(inp > 0 && w.len().is_multiple_of(inp), || {
            format!("W has {} values, not a multiple of inp {inp}", w.len())
        })?;
        let (rows, out) = (x.len() / inp, w.len() / inp);
        ensure(x.len() == rows * inp, || {
            format!("x has {} values, not rows × {inp}", x.len())
        })?;
        ensure(y.len() == rows * out, || {
            format!("y must be {rows} × {out}, has {} values", y.len())
        })?;
        ensure(bias.is_none_or(|b| b.len() == out), || {
            format!("the bias must have {out} values")
        })?;
        if rows == 0 || out == 0 {
            return Ok(());
        }
        let mut lora = lora;
        let expand = match &mut lora {
            Some(site) => site.prepare(self, x, inp, out)?,
            None => None,
        };
        let (rows_i, inp_i, out_i) = (int(rows, "rows")?, int(inp, "inp")?, int(out, "out")?);
        let accumulate = i32::from(accumulate);
        // The wide tiling where its blocks fill the device twice over (measured on an H200:
        // with fewer, e.g. 16 rows of a 3584-wide output, the narrow one was faster).
        let wide_columns = out.div_ceil(LINEAR_WARPS as usize * WIDE_COLS);
        let wide_blocks = rows.div_ceil(WIDE_ROWS) * wide_columns;
        let (function, grid_dim) = if rows > ROW_TILE && wide_blocks >= 2 * self.multiprocessors {
            (
                wide,
                (grid(rows.div_ceil(WIDE_ROWS))?, grid_y(wide_columns)?, 1),
            )
        } else if rows == 1 {
            (single, (grid(out.div_ceil(LINEAR_WARPS as usize))?, 1, 1))
        } else {
            let columns = out.div_ceil(LINEAR_WARPS as usize);
            (
                narrow,
                (grid(columns)?, grid_y(rows.div_ceil(ROW_TILE))?, 1),
            )
        };
        let config = LaunchConfig {
            grid_dim,
            block_dim: (32 * LINEAR_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        let no_rank: i32 = 0;
        let mut launch = self.stream.launch_builder(function);
        launch.arg(x).arg(w);
        match bias {
            Some(bias) => launch.arg(bias),
            None => launch.arg(&null),
        };
        launch
            .arg(y)
            .arg(&rows_i)
            .arg(&inp_i)
            .arg(&out_i)
            .arg(&accumulate);
        match &expand {
            Some(e) => launch
                .arg(e.shrunk)
                .arg(e.b_pool)
                .arg(e.row_adapters)
                .arg(&e.max_rank)
                .arg(&e.stride),
            None => launch
                .arg(&null)
                .arg(&null)
                .arg(&null)
                .arg(&no_rank)
                .arg(&no_rank),
        };
        // SAFETY: the argument list matches `linear_f32` and `linear_bf16` (W of f32 or of bf16
        // bits as `W`; null pointers for no bias and no adapters), and the shapes were checked
        // against the buffers' lengths above, the adapters' against the pool when the site
        // shrank `x`.
        unsafe { launch.launch(config) }.doing("launching a projection")?;
        Ok(())
    }

    /// RMSNorm of each row of `x` (rows of `weight.len()`), in place; as [`crate::ops::rms_norm`].
    pub fn rms_norm(
        &self,
        x: &mut CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<(), GpuError> {
        let n = weight.len();
        ensure(n > 0 && x.len().is_multiple_of(n), || {
            format!("x has {} values, not rows × {n}", x.len())
        })?;
        let rows = x.len() / n;
        if rows == 0 {
            return Ok(());
        }
        let n_i = int(n, "row width")?;
        let mut launch = self.stream.launch_builder(&self.kernels.rms_norm);
        launch.arg(x).arg(weight).arg(&n_i).arg(&eps);
        // SAFETY: matches `rms_norm`; one block per whole row of `x`.
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching rms_norm")?;
        Ok(())
    }

    /// RMSNorm of each row of `x` into `out` (rows of `weight.len()`), leaving `x` as it is:
    /// the residual stream is normed into the next op's input without a copy.
    pub fn rms_norm_into(
        &self,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<(), GpuError> {
        let n = weight.len();
        ensure(n > 0 && x.len().is_multiple_of(n), || {
            format!("x has {} values, not rows × {n}", x.len())
        })?;
        ensure(out.len() == x.len(), || {
            "out must have x's shape".to_string()
        })?;
        let rows = x.len() / n;
        if rows == 0 {
            return Ok(());
        }
        let n_i = int(n, "row width")?;
        let mut launch = self.stream.launch_builder(&self.kernels.rms_norm_into);
        launch.arg(x).arg(out).arg(weight).arg(&n_i).arg(&eps);
        // SAFETY: matches `rms_norm_into`; one block per whole row of `x` and of `out`.
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching rms_norm_into")?;
        Ok(())
    }

    /// Indices (token ids, positions, row numbers) on the device, with their bound computed
    /// here once so that every kernel that takes them can check it against its table.
    pub fn indices(&self, values: &[usize]) -> Result<DeviceIndices, GpuError> {
        ensure(!values.is_empty(), || "no indices".to_string())?;
        let device: Vec<i32> = values
            .iter()
            .map(|&v| int(v, "index"))
            .collect::<Result<_, _>>()?;
        Ok(DeviceIndices {
            end: values.iter().max().map_or(0, |&v| v + 1),
            values: self.upload(&device)?,
        })
    }

    /// Rotary embedding of `x (rows × heads × head_dim)` in place, row `r` at its position;
    /// `cos` and `sin` are `(max_positions × head_dim)` tables. As [`crate::ops::rope`].
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        head_dim: usize,
        positions: &DeviceIndices,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.launch_rope(&self.kernels.rope, x, head_dim, positions, cos, sin)
    }

    /// The rotation of [`Gpu::rope`] (`function`: it, or its backward) after the checks they
    /// share.
    fn launch_rope(
        &self,
        function: &CudaFunction,
        x: &mut CudaSlice<f32>,
        head_dim: usize,
        positions: &DeviceIndices,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let rows = positions.values.len();
        ensure(head_dim > 0 && head_dim.is_multiple_of(2), || {
            format!("head_dim {head_dim} must be even")
        })?;
        ensure(rows > 0 && x.len().is_multiple_of(rows * head_dim), || {
            format!(
                "x has {} values, not {rows} rows of heads × {head_dim}",
                x.len()
            )
        })?;
        ensure(
            cos.len() >= positions.end * head_dim && sin.len() >= positions.end * head_dim,
            || {
                format!(
                    "the cos/sin tables hold fewer than {} positions",
                    positions.end
                )
            },
        )?;
        let heads = x.len() / (rows * head_dim);
        let (rows_i, heads_i, head_dim_i) = (
            int(rows, "rows")?,
            int(heads, "heads")?,
            int(head_dim, "head_dim")?,
        );
        let mut launch = self.stream.launch_builder(function);
        launch
            .arg(x)
            .arg(&positions.values)
            .arg(cos)
            .arg(sin)
            .arg(&rows_i)
            .arg(&heads_i)
            .arg(&head_dim_i);
        // SAFETY: matches `rope` and `rope_backward`; one thread per (row, head, pair) of `x`,
        // every position below `end`, which the tables cover.
        unsafe { launch.launch(elementwise(rows * heads * head_dim / 2)?) }
            .doing("launching rope")?;
        Ok(())
    }

    /// `gate = activation(gate) · up`, in place.
    pub fn gate_mul(
        &self,
        activation: Activation,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        ensure(gate.len() == up.len(), || {
            format!("gate has {} values, up {}", gate.len(), up.len())
        })?;
        let n = gate.len();
        if n == 0 {
            return Ok(());
        }
        let code = activation.code();
        let mut launch = self.stream.launch_builder(&self.kernels.gate_mul);
        launch.arg(gate).arg(up).arg(&n).arg(&code);
        // SAFETY: matches `gate_mul`; one thread per element.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching gate_mul")?;
        Ok(())
    }

    /// `x *= factor`, in place.
    pub fn scale(&self, x: &mut CudaSlice<f32>, factor: f32) -> Result<(), GpuError> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let mut launch = self.stream.launch_builder(&self.kernels.scale_in_place);
        launch.arg(x).arg(&n).arg(&factor);
        // SAFETY: matches `scale_in_place`; one thread per element.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching scale_in_place")?;
        Ok(())
    }

    /// `x[r, :] *= factors[r]` for each row of `x`, as many rows as `factors`.
    pub fn scale_rows(&self, x: &mut CudaSlice<f32>, factors: &[f32]) -> Result<(), GpuError> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        ensure(
            !factors.is_empty() && n.is_multiple_of(factors.len()),
            || format!("x has {n} values, not {} rows", factors.len()),
        )?;
        let width = n / factors.len();
        let factors = self.upload(factors)?;
        let mut launch = self.stream.launch_builder(&self.kernels.scale_rows);
        launch.arg(x).arg(&factors).arg(&width).arg(&n);
        // SAFETY: matches `scale_rows`; one thread per element, `factors` one per row.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching scale_rows")?;
        Ok(())
    }

    /// `log_softmax` of each row (`width` wide) of `x` into `out`, the normaliser summed in f64.
    pub fn log_softmax(
        &self,
        x: &CudaSlice<f32>,
        width: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        ensure(width > 0 && x.len().is_multiple_of(width), || {
            format!("x has {} values, not rows × {width}", x.len())
        })?;
        ensure(out.len() == x.len(), || {
            "out must have x's shape".to_string()
        })?;
        let rows = x.len() / width;
        if rows == 0 {
            return Ok(());
        }
        let width_i = int(width, "row width")?;
        let mut launch = self.stream.launch_builder(&self.kernels.log_softmax);
        launch.arg(x).arg(out).arg(&width_i);
        // SAFETY: matches `log_softmax`; one block per whole row.
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching log_softmax")?;
        Ok(())
    }
}

impl Gpu {
    /// `out (rows × width) = table[indices[r]]`: the embedding of tokens, or picking rows.
    pub fn gather_rows(
        &self,
        table: &CudaSlice<f32>,
        width: usize,
        indices: &DeviceIndices,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.launch_gather(&self.kernels.gather_rows, table, width, indices, out)
    }

    /// [`Gpu::gather_rows`] from a bf16 table, widened to f32.
    pub fn gather_rows_bf16(
        &self,
        table: &CudaSlice<u16>,
        width: usize,
        indices: &DeviceIndices,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.launch_gather(&self.kernels.gather_rows_bf16, table, width, indices, out)
    }

    fn launch_gather<T>(
        &self,
        function: &CudaFunction,
        table: &CudaSlice<T>,
        width: usize,
        indices: &DeviceIndices,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        ensure(width > 0 && table.len().is_multiple_of(width), || {
            format!("the table has {} values, not rows × {width}", table.len())
        })?;
        ensure(indices.end <= table.len() / width, || {
            format!(
                "index {} of a table of {} rows",
                indices.end - 1,
                table.len() / width
            )
        })?;
        let rows = indices.len();
        ensure(out.len() == rows * width, || {
            format!("out must be {rows} × {width}")
        })?;
        let (rows_i, width_i) = (int(rows, "rows")?, int(width, "width")?);
        let mut launch = self.stream.launch_builder(function);
        launch
            .arg(table)
            .arg(&indices.values)
            .arg(out)
            .arg(&rows_i)
            .arg(&width_i);
        // SAFETY: matches `gather_rows` and `gather_rows_bf16`; every index is below the
        // table's rows.
        unsafe { launch.launch(elementwise(rows * width)?) }.doing("launching a row gather")?;
        Ok(())
    }

    /// `x` rounded to bf16 on the device (as [`bf16_bits`]).
    pub fn to_bf16(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<u16>, GpuError> {
        let n = x.len();
        let mut out = self
            .stream
            .alloc_zeros::<u16>(n.max(1))
            .doing("allocating device memory")?;
        if n == 0 {
            return Ok(out);
        }
        let mut launch = self.stream.launch_builder(&self.kernels.to_bf16);
        launch.arg(x).arg(&mut out).arg(&n);
        // SAFETY: matches `to_bf16`; one thread per value of `x`, `out` as long.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching to_bf16")?;
        Ok(out)
    }

    /// `y[r, j] += bias[j]` for every row of `y`.
    pub fn add_bias(&self, y: &mut CudaSlice<f32>, bias: &CudaSlice<f32>) -> Result<(), GpuError> {
        let width = bias.len();
        ensure(width > 0 && y.len().is_multiple_of(width), || {
            format!("y has {} values, not rows × {width}", y.len())
        })?;
        let (n, width_i) = (y.len(), int(width, "width")?);
        if n == 0 {
            return Ok(());
        }
        let mut launch = self.stream.launch_builder(&self.kernels.add_bias);
        launch.arg(y).arg(bias).arg(&n).arg(&width_i);
        // SAFETY: matches `add_bias`; one thread per value of `y`.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching add_bias")?;
        Ok(())
    }

    /// `x += y`.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<(), GpuError> {
        ensure(x.len() == y.len(), || {
            format!("x has {} values, y {}", x.len(), y.len())
        })?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let mut launch = self.stream.launch_builder(&self.kernels.add_in_place);
        launch.arg(x).arg(y).arg(&n);
        // SAFETY: matches `add_in_place`; one thread per value.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching add_in_place")?;
        Ok(())
    }

    /// The index of each row's largest value (the first of equals), copied back: greedy
    /// sampling without moving the logits off the device.
    pub fn argmax_rows(&self, x: &CudaSlice<f32>, width: usize) -> Result<Vec<usize>, GpuError> {
        ensure(width > 0 && x.len().is_multiple_of(width), || {
            format!("x has {} values, not rows × {width}", x.len())
        })?;
        let rows = x.len() / width;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let mut out = self
            .stream
            .alloc_zeros::<i32>(rows)
            .doing("allocating device memory")?;
        let width_i = int(width, "width")?;
        let mut launch = self.stream.launch_builder(&self.kernels.argmax_rows);
        launch.arg(x).arg(&mut out).arg(&width_i);
        // SAFETY: matches `argmax_rows`; one block per whole row.
        unsafe { launch.launch(row_blocks(rows)?) }.doing("launching argmax_rows")?;
        let indices = self
            .stream
            .clone_dtoh(&out)
            .doing("copying from the device")?;
        Ok(indices.into_iter().map(|i| i.max(0) as usize).collect())
    }

    /// Fills `x` with values uniform in `[low, high)` from `seed` (a hash of the seed and the
    /// index, so the same seed gives the same values on any device).
    pub fn fill_uniform(
        &self,
        x: &mut CudaSlice<f32>,
        seed: u64,
        low: f32,
        high: f32,
    ) -> Result<(), GpuError> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let mut launch = self.stream.launch_builder(&self.kernels.fill_uniform);
        launch.arg(x).arg(&n).arg(&seed).arg(&low).arg(&high);
        // SAFETY: matches `fill_uniform`; one thread per value.
        unsafe { launch.launch(elementwise(n)?) }.doing("launching fill_uniform")?;
        Ok(())
    }
}

/// Indices on the device, every one below `end` (computed when they were made).
pub struct DeviceIndices {
    values: CudaSlice<i32>,
    end: usize,
}

impl DeviceIndices {
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// The bits of `value` rounded to bf16 (to nearest, ties to even, as `half` and candle round;
/// NaN stays NaN): how bf16 weights are stored on the device.
pub fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The f32 a bf16's bits stand for.
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Lets the device's default memory pool keep what is freed instead of handing it back to the
/// driver at every synchronisation (its default): a decode loop synchronises every step to read
/// its tokens, and would otherwise map its activations' memory anew each step.
fn keep_freed_memory(context: &CudaContext) -> Result<(), GpuError> {
    if !context.has_async_alloc() {
        return Ok(());
    }
    let mut threshold = u64::MAX;
    // SAFETY: the device is the context's own; the release threshold attribute takes a u64.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(context.cu_device())
            .doing("reading the device's memory pool")?;
        cudarc::driver::result::mem_pool::set_attribute(
            pool,
            cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
        .doing("setting the memory pool's release threshold")?;
    }
    Ok(())
}

/// A size as the kernels' `int`.
fn int(value: usize, what: &str) -> Result<i32, GpuError> {
    i32::try_from(value)
        .map_err(|_| GpuError::InvalidArgument(format!("{what} {value} is too large")))
}

fn grid(blocks: usize) -> Result<u32, GpuError> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .ok_or_else(|| GpuError::InvalidArgument(format!("{blocks} blocks is too many")))
}

/// The grid's y and z dimensions stop at 65,535.
fn grid_y(blocks: usize) -> Result<u32, GpuError> {
    ensure(blocks <= 65_535, || {
        format!("{blocks} row tiles is too many for one call")
    })?;
    Ok(blocks as u32)
}

fn row_blocks(rows: usize) -> Result<LaunchConfig, GpuError> {
    Ok(LaunchConfig {
        grid_dim: (grid(rows)?, 1, 1),
        block_dim: (REDUCE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn elementwise(n: usize) -> Result<LaunchConfig, GpuError> {
    Ok(LaunchConfig {
        grid_dim: (grid(n.div_ceil(ELEMENTWISE_THREADS as usize))?, 1, 1),
        block_dim: (ELEMENTWISE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}
