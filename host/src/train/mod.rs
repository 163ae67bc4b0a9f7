//! Training: the Tinker losses, and (next) forward_backward over mixed-adapter work items,
//! per-adapter optimizers and checkpoints.

pub mod loss;

pub use loss::{Loss, LossError, LossInputs};
