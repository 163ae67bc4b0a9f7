//! The kernels under opentinker's sampler: a projection `x · Wᵀ`, the mixed-adapter LoRA apply
//! (per run of rows, shrink `x · Aᵀ` into rank space and expand `· Bᵀ`), causal attention over a
//! KV cache, and the small row-wise ops around them. All f32, all on slices.
//!
//! Beside them, the training path's kernels, each forward next to its backward and generic over
//! [`Float`] (f32, and f64 for gradient checks): RMSNorm keeping each row's inverse rms, RoPE
//! (whose backward is the opposite rotation), the gate's activation (SiLU or GELU), whole-sequence causal attention that
//! keeps one log-sum-exp per row and head and recomputes the probabilities in its backward, the
//! LoRA apply with its `A`, `B` and input gradients, and the matrix products of [`gemm`].
//! `tests/gradients.rs` checks each backward against central differences in f64.
//!
//! The contract every kernel keeps: **a row's result depends only on that row's inputs**, never
//! on what else is in the batch, how rows are grouped into adapter segments, or how many threads
//! run. Each output is summed in one fixed order, so a sequence decodes to bit-identical tokens
//! and logprobs alone or in a batch of 64, and a prompt's KV computed in one prefill equals the
//! KV computed token by token (which makes a prefix cache invisible). [`reference`](mod@reference) holds the
//! same math as plain loops, for the contract tests.
//!
//! The engine sees the kernels through two traits: [`Backend`] (the forward ops a model runs,
//! on [`Cpu`] or, with the `cuda` feature, the GPU) and [`Backward`] (the training ops, on
//! [`CpuTrain`]). The function families stay namespaced: [`ops`] (the row-wise ops and their
//! backwards), [`gemm`] (the training path's matrix products), [`unembed`] (the training
//! head's target logprobs, a block of rows at a time) and `cuda` (the GPU's kernels, compiled through NVRTC).

mod attention;
mod backend;
mod cpu;
mod cpu_train;
#[cfg(feature = "cuda")]
pub mod cuda;
mod float;
pub mod gemm;
mod linear;
mod lora;
pub mod ops;
mod quant;
pub mod reference;
pub mod unembed;

pub use attention::{Heads, Span, attention_backward, attention_forward, causal_attention};
pub use backend::{Backend, Backward};
pub use cpu::{Cpu, CpuBatch, KvCache};
pub use cpu_train::{CpuTrain, LoraGrads, TrainBatch};
pub use float::Float;
pub use linear::linear;
pub use lora::{LoraGrad, LoraPair, Segment, lora_apply, lora_backward, lora_forward};
pub use ops::Activation;
pub use quant::{BLOCK_LEN, BlockFormat, QuantMatrix, QuantizeError, Weight};
