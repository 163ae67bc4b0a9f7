//! The kernels under opentinker's sampler: a projection `x · Wᵀ`, the mixed-adapter LoRA apply
//! (per run of rows, shrink `x · Aᵀ` into rank space and expand `· Bᵀ`), causal attention over a
//! KV cache, and the small row-wise ops around them. All f32, all on slices.
//!
//! The contract every kernel keeps: **a row's result depends only on that row's inputs**, never
//! on what else is in the batch, how rows are grouped into adapter segments, or how many threads
//! run. Each output is summed in one fixed order, so a sequence decodes to bit-identical tokens
//! and logprobs alone or in a batch of 64, and a prompt's KV computed in one prefill equals the
//! KV computed token by token (which makes a prefix cache invisible). [`reference`] holds the
//! same math as plain loops, for the contract tests.

pub mod attention;
pub mod backend;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod linear;
pub mod lora;
pub mod ops;
pub mod reference;

pub use attention::{Heads, causal_attention};
pub use backend::Backend;
pub use cpu::{Cpu, CpuBatch, KvCache};
pub use linear::linear;
pub use lora::{LoraPair, Segment, lora_apply};
