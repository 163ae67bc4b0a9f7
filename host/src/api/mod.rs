//! The typed op API of the engine as a service, shaped like Tinker's data model: what a client
//! (the HTTP server for the Tinker SDK, the RL driver in process, a future Rust client) sends
//! and gets back. It imports nothing of the engine, so a client crate could depend on it alone.
//!
//! Ids are typed ([`ModelId`], [`SamplerId`], [`CheckpointPath`]...), every op is one variant of [`Op`] answered by one of [`OpOutput`],
//! and every failure is an [`ApiError`] whose [`ApiErrorKind`] says whose fault it was and
//! whether a retry can help.

mod custom_loss;
mod error;
mod ids;
mod limits;
mod types;

pub use custom_loss::{Arg, CustomLossInput, LossGraph, Node, NodeOp};
pub use error::{ApiError, ApiErrorKind};
pub use ids::{
    CheckpointKind, CheckpointPath, JobId, LossId, ModelId, SamplerId, SequenceId, SessionId,
    TenantId,
};
pub use limits::{
    DECODE_BYTES_PER_BODY_BYTE, DECODE_FLOOR_BYTES, DecodeBudget, MAX_METADATA_BYTES,
    MAX_SAMPLES_PER_REQUEST, check_num_samples, check_user_metadata,
};
pub use types::{
    AdamParams, BaseModelInfo, CheckpointInfo, Chunk, Datum, ForwardBackwardInput,
    ForwardBackwardOutput, LoraConfig, LossInput, LossName, ModelInfo, ModelInput, Op, OpOutput,
    OptimStepOutput, PromptAltTokens, ProvenanceSpan, SampleRequest, SampleResponse,
    SampledSequence, SamplerInfo, SamplerSource, SamplingParams, SaveOptions, SpanSource, Stop,
    StopReason, TensorData, TensorValues, TopLogprobs, UNIT_TEMPERATURE, UserMetadata,
};
