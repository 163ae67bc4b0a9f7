//! The typed op API of the engine as a service, shaped like Tinker's data model: what a client
//! (the HTTP server for the Tinker SDK, the RL driver in process, a future Rust client) sends
//! and gets back. It imports nothing of the engine, so a client crate could depend on it alone.
//!
//! Ids are typed ([`ids`]), every op is one variant of [`Op`] answered by one of [`OpOutput`],
//! and every failure is an [`ApiError`] whose [`ApiErrorKind`] says whose fault it was and
//! whether a retry can help.

pub mod custom_loss;
pub mod error;
pub mod ids;
pub mod limits;
pub mod types;

pub use custom_loss::{Arg, CustomLossInput, LossGraph, Node, NodeOp};
pub use error::{ApiError, ApiErrorKind};
pub use ids::{
    CheckpointKind, CheckpointPath, JobId, LossId, ModelId, SamplerId, SequenceId, SessionId,
    TenantId,
};
pub use limits::DecodeBudget;
pub use types::*;
