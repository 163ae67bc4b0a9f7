//! What an objective plugin adds to a training step: a LoRA `forward_backward` + `optim_step`
//! (rank 16, alpha 32, f32) on RL datums with the engine's `ppo`, and the same with
//! `plugins/ppo-loss` (the same loss as a Wasm component, called in the engine's pass), the two
//! alternating step by step on one engine so that the machine's drift touches both alike.
//!
//!     RAYON_NUM_THREADS=2 cargo bench -p opentinker --bench objective_cost [-- qwen2.5-0.5b]
//!
//! The tiny shape runs 16 sequences of 128 tokens; `qwen2.5-0.5b` 4 of 256 (it writes a 2 GB
//! model to a temporary folder first). Prints each loss's median step and the plugin's share.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;
use opentinker::model::{Architecture, Model};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::plugin::build_plugin;
use opentinker::plugin::{HostConfig, Limits, PluginHost};
use opentinker::service::PluginObjective;
use opentinker::train::{AdamParams, Datum, Loss, Objective, TrainingEngine, WorkItem};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let shape = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "tiny".into());
    let (tiny_shape, batch, length) = match shape.as_str() {
        "tiny" => (TinyShape::Tiny, 16, 128),
        "qwen2.5-0.5b" => (TinyShape::Qwen05b, 4, 256),
        other => anyhow::bail!("unknown shape {other:?} (tiny, qwen2.5-0.5b)"),
    };
    let steps = if support::quick() { 1 } else { 10 };
    let runtime = tokio::runtime::Runtime::new()?;
    let host = PluginHost::new(HostConfig::default())?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let wasm = build_plugin(&root.join("plugins/ppo-loss"))?;
    let plugin = runtime.block_on(host.load_file(&wasm))?;

    let dir = tempfile::tempdir()?;
    init_tiny(dir.path(), tiny_shape, Architecture::Qwen2, 1)?;
    let model = Model::load(dir.path())?;
    let vocab = model.config.vocab_size as u32;
    let mut engine = TrainingEngine::new(Arc::new(model.transformer), DType::F32);
    engine.add_adapter("bench", support::bench_lora())?;
    // RL datums: each token with an advantage and the sampler's logprob.
    let datums: Vec<Datum> = support::datums(batch, length, vocab)
        .into_iter()
        .enumerate()
        .map(|(row, datum)| Datum {
            advantages: Some(
                (0..length)
                    .map(|i| ((i + row) as f32 * 0.3).sin())
                    .collect(),
            ),
            sampler_logprobs: Some(vec![-(vocab as f32).ln(); length]),
            ..datum
        })
        .collect();
    let builtin = Loss::Ppo {
        clip_low: 0.8,
        clip_high: 1.2,
    };
    let objective = Loss::Objective(Objective::new(PluginObjective::new(
        plugin,
        "ppo-loss",
        "{}",
        Limits::default(),
        runtime.handle().clone(),
    )));
    let mut step = |loss: &Loss| -> anyhow::Result<f64> {
        let item = WorkItem::new("bench", datums.clone(), loss.clone());
        let started = Instant::now();
        engine.forward_backward(std::slice::from_ref(&item))?;
        engine.optim_step("bench", &AdamParams::default())?;
        Ok(started.elapsed().as_secs_f64())
    };
    step(&builtin)?;
    step(&objective)?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        ours.push(step(&builtin)?);
        theirs.push(step(&objective)?);
    }
    let (ours, theirs) = (median(ours), median(theirs));
    println!("shape {shape}, {batch} x {length} tokens, LoRA rank 16, {steps} steps of each");
    println!("| loss | step (median) |");
    println!("|---|---|");
    println!("| built-in ppo | {:.1} ms |", ours * 1e3);
    println!("| ppo-loss plugin | {:.1} ms |", theirs * 1e3);
    match support::busy() {
        Some(why) => println!("| the plugin's share | not reported: {why} |"),
        None => println!(
            "| the plugin's share | {:+.1}% of the step (goal: at most 5%) |",
            (theirs / ours - 1.0) * 100.0
        ),
    }
    Ok(())
}
