//! Training: the Tinker losses, custom losses sent as graphs (`loss_graph`) or computed outside
//! the engine (`objective`: plugins), and the engine
//! that runs forward / forward_backward over mixed-adapter work items on the model's layers with
//! a per-adapter AdamW, and PEFT checkpoints.

pub mod checkpoint;
pub mod engine;
pub mod loss;
mod loss_graph;
mod objective;
pub mod slot_state;

pub use engine::{
    AdamParams, AdapterId, Datum, FULL_PARAMETERS, ItemOutput, PASS_BYTES, StepReport, TrainError,
    TrainingEngine, WorkItem,
};
pub use loss::{Loss, LossError, LossInputs};
pub use loss_graph::{CompiledLoss, GraphError, InputTensor, MAX_INPUTS, MAX_NODES};
pub use objective::{
    AnswerError, ExternalObjective, Objective, ObjectiveError, ObjectiveInput, ObjectiveLoss,
};
pub use slot_state::{NamedState, SlotState, SlotStateError};
