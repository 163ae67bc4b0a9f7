//! Sampling: KV-cached batched generation over many adapter versions of one base model at once,
//! with per-token logprobs, on the batch-invariant kernels of `opentinker-kernels`.

mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_sampler;
pub mod engine;
pub mod forward;
pub mod params;
pub mod prefix;
mod prompt;

pub use backend::{BackendError, BackendInput, BackendOutput, CpuSampler, Pick, SamplerBackend};
#[cfg(feature = "cuda")]
pub use cuda_sampler::{BlockTable, CudaSampler};
pub use engine::{
    EngineConfig, PolicyRef, RequestId, Sample, SampleError, SampleOutput, SampleRequest,
    SamplingEngine, StopReason, TokenSink,
};
pub use params::{Choice, SamplingParams, Stop, TopLogprobs};
pub use prompt::{AltTokens, PromptAnswers, PromptAsks, PromptTargets, TargetLogprobs};
