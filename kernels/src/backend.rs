//! The op boundary: what a transformer asks of the device it runs on.
//!
//! The model's layers (in the host's `model` module) are written once against [`Backend`]; a
//! backend owns the memory and the kernels. [`crate::Cpu`] runs the batch-invariant kernels of
//! this crate on host slices; the CUDA backend (feature `cuda`) runs `cuda`'s kernels on device
//! buffers. A layer never names a device: it holds weights as `&B::Matrix` and `&B::Vector`,
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

/// A device and its kernels, as the transformer's layers use them.
pub trait Backend: Sync {
    /// What a failed op says (a device error; the CPU's ops cannot fail).
    type Error: std::error::Error + Send + Sync + 'static;
    /// An owned row-major f32 activation (`rows × width`; the caller knows the shape).
    type Buffer;
    /// A weight matrix `out × in`, row-major, in the backend's storage format.
    type Matrix: ?Sized;
    /// An f32 weight vector: norm weights, biases, RoPE tables.
    type Vector: ?Sized;
    /// The adapters of one projection over a call's rows (mixed LoRA: a run of rows per
    /// adapter).
    type Lora<'a>;
    /// Where a call's rows sit and the KV caches of its sequences.
    type Batch<'a>;

    /// `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer, Self::Error>;

    /// The buffer's values on the host.
    fn download(&self, x: Self::Buffer) -> Result<Vec<f32>, Self::Error>;

    /// Rows `indices` of `table` (`width` columns): the embedding lookup.
    fn embed(
        &self,
        table: &Self::Matrix,
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
        eps: f32,
    ) -> Result<(), Self::Error>;

    /// `out = ` RMSNorm of each row of `x`; `out` has `x`'s shape.
    fn rms_norm_into(
        &self,
        x: &Self::Buffer,
        weight: &Self::Vector,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// `y = x · Wᵀ + bias + ` each run's LoRA delta (`y +=` all that when `accumulate`);
    /// `x` is `rows × inp`.
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        x: &Self::Buffer,
        weight: &Self::Matrix,
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

    /// `gate = silu(gate) · up`, in place.
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer) -> Result<(), Self::Error>;

    /// Commit the call's positions: every cache in `batch` now holds its new rows.
    fn advance(&self, batch: &mut Self::Batch<'_>);
}
