//! Training: the engine that runs `forward` / `forward_backward` over mixed-adapter work items on
//! the model's layers, with a per-adapter AdamW, and the adapters' PEFT checkpoints.
//!
//! A [`TrainingEngine`] holds one base model and any number of adapter slots (each a LoRA adapter
//! with its optimizer moments, [`SlotState`] when saved in memory). A [`WorkItem`] names an
//! adapter, its [`Datum`]s and a [`Loss`]: one of the Tinker losses, a custom loss sent as a
//! graph of allowed operations ([`CompiledLoss`]), or an objective computed outside the engine
//! ([`Objective`] over an [`ExternalObjective`], which the service makes of a plugin). The items
//! of one pass, of different adapters, are fused into one batch; `optim_step` then applies AdamW
//! per adapter ([`AdamParams`], [`StepReport`]). [`checkpoint`] saves and loads an adapter (and
//! its optimizer) as PEFT files.

pub mod checkpoint;
mod engine;
mod loss;
mod loss_graph;
mod objective;
mod pass;
mod shared_prefix;
mod slot_state;

pub use engine::{
    AdamParams, AdapterId, Datum, FULL_PARAMETERS, ItemOutput, PASS_BYTES, StepReport, TrainError,
    TrainingEngine, WorkItem,
};
pub use loss::{Loss, LossError, LossInputs};
pub use loss_graph::{CompiledLoss, GraphError, InputTensor, MAX_INPUTS, MAX_NODES};
pub use objective::{
    AnswerError, ExternalObjective, Objective, ObjectiveError, ObjectiveInput, ObjectiveLoss,
};
pub use pass::PassError;
pub use slot_state::{NamedState, SlotState, SlotStateError};
