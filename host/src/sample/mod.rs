//! Sampling: KV-cached batched generation over many adapter versions of one base model at once,
//! with per-token logprobs, on the batch-invariant kernels of `opentinker-kernels`.
//!
//! A [`SamplingEngine`] owns one base model's KV cache and serves requests for any number of
//! adapters of it. Each [`SampleRequest`] names its prompt, its [`SamplingParams`] and the
//! [`PolicyRef`] (adapter and version) to sample with; the engine admits requests into one
//! continuous batch, and every [`SamplingEngine::decode_step`] decodes one token for each running
//! sequence, whatever its adapter (the multi-LoRA kernels apply each row's own adapter). A request
//! ends in a [`SampleOutput`] with a [`Sample`] per sequence: its tokens, their logprobs and why it
//! stopped ([`StopReason`]).
//!
//! ```text
//! SampleRequest ──▶ add_request ──▶ decode_step() … decode_step() ──▶ SampleOutput
//!                 (prefix cache, KV)   (one batch, many adapters)
//! ```
//!
//! The engine is generic over its [`SamplerBackend`]: [`CpuSampler`] (the default) or, with the
//! `cuda` feature, [`CudaSampler`] on paged KV blocks. On either, a sequence's bits do not depend
//! on the batch it is decoded in (the kernels are batch-invariant): so a repeated prompt can share
//! its prefix's KV (the engine's prefix cache), and the trainer's logprobs of a sample match the
//! sampler's.
//!
//! Below the engine: [`forward`] runs one uncached forward pass of whole sequences (the reference
//! the cached path is tested against), [`choose`] picks a token from logits under the request's
//! temperature and top-p, and the prompt logprobs of a request are [`PromptAsks`] in and
//! [`PromptAnswers`] out. [`CudaModel`] is the GPU's whole-model forward, for benchmarks and the
//! GPU checks.

mod backend;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_sampler;
mod engine;
mod forward;
mod params;
mod prefix;
mod prompt;

pub use backend::{BackendError, BackendInput, BackendOutput, CpuSampler, Pick, SamplerBackend};
#[cfg(feature = "cuda")]
pub use cuda::{CudaModel, CudaModelError, CudaModelOptions, CudaSequence, WeightFormat};
#[cfg(feature = "cuda")]
pub use cuda_sampler::{BlockTable, CudaSampler};
pub use engine::{
    EngineConfig, PolicyRef, RequestId, Sample, SampleError, SampleOutput, SampleRequest,
    SamplingEngine, StopReason, TokenSink,
};
pub use forward::{SequenceInput, forward};
pub use params::{Choice, SamplingParams, Stop, TopLogprobs, choose};
pub use prompt::{AltTokens, PromptAnswers, PromptAsks, PromptTargets, TargetLogprobs};
