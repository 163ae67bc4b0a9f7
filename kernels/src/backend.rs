//! The op boundary: what a transformer asks of the device it runs on.
//!
//! The model's layers (in the host's `model` module) are written once against [`Backend`]; a
//! backend owns the memory and the kernels. [`crate::Cpu`] runs the batch-invariant kernels of
//! this crate on host slices; the CUDA backend (feature `cuda`) runs `cuda`'s kernels on device
//! buffers. A layer never names a device: it holds weights as `B::Matrix<'_>` and `&B::Vector`,
//! activations as `B::Buffer`, and asks the backend for each op.
//!
//! Every op keeps the crate's contract: a row's result depends only on that row's inputs, so
//! whatever a backend batches together, each sequence comes out bit for bit as it would alone.
//!
//! A forward call's rows are the new tokens of its sequences, one after another. Where each row
//! sits (its sequence and position) and the sequences' KV caches are the backend's
//! [`Backend::Batch`], made by the backend's own constructor for the call; [`Backend::rope`]
//! and [`Backend::attend`] read it, [`Backend::advance`] commits the new positions at the end.

use crate::attention::Heads;
use crate::ops::Activation;

/// A device and its kernels, as the transformer's layers use them.
pub trait Backend: Sync {
    /// What a failed op says (a device error; the CPU's ops cannot fail).
    type Error: std::error::Error + Send + Sync + 'static;
    /// The element type of buffers and weights (f32; f64 for gradient checks).
    type Elem: Copy;
    /// An owned row-major activation (`rows × width`; the caller knows the shape).
    type Buffer;
    /// A weight matrix `out × in`, row-major, in the backend's storage format, as the ops
    /// borrow it (on the CPU: f32 rows, or blocks of a quantized frozen base).
    type Matrix<'a>: Copy;
    /// A weight vector: norm weights, biases, RoPE tables.
    type Vector: ?Sized;
    /// The adapters of one projection over a call's rows (mixed LoRA: a run of rows per
    /// adapter).
    type Lora<'a>;
    /// Where a call's rows sit and the KV caches of its sequences.
    type Batch<'a>;

    /// `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer, Self::Error>;

    /// A buffer of `len` values for an op that writes every one of them before anything reads
    /// it (a projection's output, the attention's): a device backend leaves it unset rather
    /// than queue a fill that the op overwrites. Zeros unless a backend says otherwise.
    fn scratch(&self, len: usize) -> Result<Self::Buffer, Self::Error> {
        self.zeros(len)
    }

    /// The buffer's values on the host.
    fn download(&self, x: Self::Buffer) -> Result<Vec<Self::Elem>, Self::Error>;

    /// Host values in a buffer.
    fn upload(&self, values: &[Self::Elem]) -> Result<Self::Buffer, Self::Error>;

    /// A copy of `x`.
    fn copy(&self, x: &Self::Buffer) -> Result<Self::Buffer, Self::Error>;

    /// Rows `indices` of `table` (`width` columns): the embedding lookup.
    fn embed(
        &self,
        table: Self::Matrix<'_>,
        width: usize,
        indices: &[usize],
    ) -> Result<Self::Buffer, Self::Error>;

    /// Rows `indices` of `x` (`width` columns).
    fn select_rows(
        &self,
        x: &Self::Buffer,
        width: usize,
        indices: &[usize],
    ) -> Result<Self::Buffer, Self::Error>;

    /// RMSNorm of each row of `x` (rows of the weight's length), in place.
    fn rms_norm(
        &self,
        x: &mut Self::Buffer,
        weight: &Self::Vector,
        eps: f64,
    ) -> Result<(), Self::Error>;

    /// `out = ` RMSNorm of each row of `x`; `out` has `x`'s shape.
    fn rms_norm_into(
        &self,
        x: &Self::Buffer,
        weight: &Self::Vector,
        eps: f64,
        out: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// `y = x · Wᵀ + bias + ` each run's LoRA delta (`y +=` all that when `accumulate`);
    /// `x` is `rows × inp`.
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        x: &Self::Buffer,
        weight: Self::Matrix<'_>,
        inp: usize,
        bias: Option<&Self::Vector>,
        lora: Option<Self::Lora<'_>>,
        y: &mut Self::Buffer,
        accumulate: bool,
    ) -> Result<(), Self::Error>;

    /// Rotary embedding (Hugging Face halves) of `x (rows × heads × head_dim)`, each row at its
    /// position in `batch`; `cos` and `sin` are `(positions × head_dim)` tables.
    fn rope(
        &self,
        batch: &Self::Batch<'_>,
        x: &mut Self::Buffer,
        head_dim: usize,
        cos: &Self::Vector,
        sin: &Self::Vector,
    ) -> Result<(), Self::Error>;

    /// Causal grouped-query attention at `layer`: append the rows' keys `k` and values `v`
    /// (`rows × kv_heads × head_dim`) to their sequences' caches, then attend each query row of
    /// `q` over its sequence's positions up to its own, into `out` (`q`'s shape).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        batch: &mut Self::Batch<'_>,
        layer: usize,
        shape: Heads,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// `gate = activation(gate) · up`, in place.
    fn gate_mul(
        &self,
        activation: Activation,
        gate: &mut Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// `x *= factor`, in place (Gemma's embedding scale).
    fn scale(&self, x: &mut Self::Buffer, factor: f64) -> Result<(), Self::Error>;

    /// `x += y`.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer) -> Result<(), Self::Error>;

    /// Commit the call's positions: every cache in `batch` now holds its new rows.
    fn advance(&self, batch: &mut Self::Batch<'_>);
}

/// The backward ops of training, for a backend whose forward keeps what they need (the
/// attention's log-sum-exp in its [`Backend::Batch`]). Each accumulates into its gradient
/// outputs (`+=`) unless it says it writes them.
pub trait Backward: Backend {
    /// A projection's adapters with the gradients their pairs accumulate into.
    type LoraGrads<'a>;

    /// `x[r, :] *= factors[r]` for each of the `factors.len()` rows of `x`, in place (a
    /// training pass's hidden states divided by each sequence's sampling temperature).
    fn scale_rows(&self, x: &mut Self::Buffer, factors: &[f64]) -> Result<(), Self::Error>;

    /// The backward of [`Backend::rms_norm_into`]: `dx += ∂x`, `dweight += ∂weight` when given.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_backward(
        &self,
        x: &Self::Buffer,
        weight: &Self::Vector,
        eps: f64,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
        dweight: Option<&mut Self::Buffer>,
    ) -> Result<(), Self::Error>;

    /// The input side of [`Backend::project`]'s backward: `dx += dy · W` plus each run's LoRA
    /// input gradient, and each trained pair's `A` and `B` gradients.
    #[allow(clippy::too_many_arguments)]
    fn project_backward(
        &self,
        x: &Self::Buffer,
        weight: Self::Matrix<'_>,
        inp: usize,
        lora: Option<Self::LoraGrads<'_>>,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// The weight side of a projection's backward (full-parameter training): `dweight += dyᵀ ·
    /// x`, `dbias += Σ dy`.
    fn weight_gradient(
        &self,
        x: &Self::Buffer,
        dy: &Self::Buffer,
        inp: usize,
        dweight: &mut Self::Buffer,
        dbias: Option<&mut Self::Buffer>,
    ) -> Result<(), Self::Error>;

    /// The backward of [`Backend::rope`], in place on the gradient.
    fn rope_backward(
        &self,
        batch: &Self::Batch<'_>,
        dx: &mut Self::Buffer,
        head_dim: usize,
        cos: &Self::Vector,
        sin: &Self::Vector,
    ) -> Result<(), Self::Error>;

    /// The backward of [`Backend::attend`] at `layer` from `d_out`, given its inputs and
    /// output: writes `dq`, `dk` and `dv`.
    #[allow(clippy::too_many_arguments)]
    fn attend_backward(
        &self,
        batch: &Self::Batch<'_>,
        layer: usize,
        shape: Heads,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &Self::Buffer,
        d_out: &Self::Buffer,
        dq: &mut Self::Buffer,
        dk: &mut Self::Buffer,
        dv: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// The backward of [`Backend::gate_mul`] from its inputs: writes `d_gate` and `d_up`.
    fn gate_mul_backward(
        &self,
        activation: Activation,
        gate: &Self::Buffer,
        up: &Self::Buffer,
        d_out: &Self::Buffer,
        d_gate: &mut Self::Buffer,
        d_up: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// The backward of [`Backend::embed`]: `d_table[indices[r]] += d_x[r]`.
    fn embed_backward(
        &self,
        indices: &[usize],
        width: usize,
        d_x: &Self::Buffer,
        d_table: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// The logprob of each row's target under a frozen unembedding `table`, without the logits;
    /// with `jacobian` (`x`'s shape), it also writes what its backward needs.
    fn unembed_logprobs(
        &self,
        x: &Self::Buffer,
        table: Self::Matrix<'_>,
        hidden: usize,
        targets: &[u32],
        jacobian: Option<&mut Self::Buffer>,
    ) -> Result<Self::Buffer, Self::Error>;

    /// The backward of [`Backward::unembed_logprobs`]: `dx += g · J` per row.
    fn unembed_logprobs_backward(
        &self,
        jacobian: &Self::Buffer,
        g: &Self::Buffer,
        dx: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// `log_softmax(logits)[target]` of each row of `logits (rows × vocab)`.
    fn target_logprobs(
        &self,
        logits: &Self::Buffer,
        vocab: usize,
        targets: &[u32],
    ) -> Result<Self::Buffer, Self::Error>;

    /// The backward of [`Backward::target_logprobs`]: the logits' gradient.
    fn target_logprobs_backward(
        &self,
        logits: &Self::Buffer,
        vocab: usize,
        targets: &[u32],
        g: &Self::Buffer,
    ) -> Result<Self::Buffer, Self::Error>;
}
