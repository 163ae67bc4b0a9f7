//! opentinker: train LLM agents with many LoRA policies over shared compute, where environments,
//! agents and reward functions are sandboxed WebAssembly components.
//!
//! One module per concern (see `DESIGN.md` in the repository): [`plugin`] runs the components.

pub mod cli;
pub mod plugin;
