//! opentinker: train LLM agents with many LoRA policies over shared compute, where environments,
//! agents and reward functions are sandboxed WebAssembly components.
//!
//! One module per concern (see `DESIGN.md` in the repository): [`plugin`] runs the components,
//! [`model`] loads and runs the base model, [`lora`] holds adapters and their published
//! versions, [`train`] is the training engine, [`sample`] the generation engine, [`rl`] the data
//! path from transcripts to datums and the advantages, [`store`] writes state durably.

pub mod allocator;
pub mod api;
pub mod cli;
pub mod client;
pub mod compute_threads;
pub mod jobs;
pub mod lora;
pub mod market;
pub mod model;
pub mod plugin;
pub mod queue_auth;
pub mod rl;
pub mod sample;
pub mod server;
pub mod service;
pub mod store;
pub mod text;
pub mod train;
pub mod wire;
