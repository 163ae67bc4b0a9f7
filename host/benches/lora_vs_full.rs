//! A LoRA forward_backward against a full-parameter one on the same model and batch: time and
//! peak resident memory, each mode in a process of its own so that one's memory does not hide
//! the other's (rank 16, alpha 32, all seven projections, f32, cross-entropy).
//!
//!     RAYON_NUM_THREADS=2 cargo bench -p opentinker --bench lora_vs_full [-- tiny]
//!
//! The default is the 0.5B shape with 4 sequences of 256 tokens (it writes a 2 GB model to a
//! temporary folder first). Goals: LoRA at most 0.8 times the full-parameter time, and a peak
//! lower by at least the size of the base weights.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;
use opentinker::model::{Architecture, Model};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::train::{FULL_PARAMETERS, Loss, TrainingEngine, WorkItem};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One mode, in this (child) process: prints `seconds peak_bytes weight_bytes`.
fn child(mode: &str, dir: &Path, batch: usize, length: usize) -> anyhow::Result<()> {
    let model = Model::load(dir)?;
    let vocab = model.config.vocab_size as u32;
    let weight_bytes = model.transformer.weight_bytes();
    let (mut engine, id) = if mode == "full" {
        let engine = TrainingEngine::full_parameters(model.transformer, DType::F32)?;
        (engine, FULL_PARAMETERS.to_string())
    } else {
        let mut engine = TrainingEngine::new(Arc::new(model.transformer), DType::F32);
        engine.add_adapter("bench", support::bench_lora())?;
        (engine, "bench".to_string())
    };
    let datums = support::datums(batch, length, vocab);
    let item = WorkItem::new(id.clone(), datums, Loss::CrossEntropy);
    engine.forward_backward(std::slice::from_ref(&item))?;
    engine.discard_gradients(&id)?;
    let started = Instant::now();
    engine.forward_backward(std::slice::from_ref(&item))?;
    let seconds = started.elapsed().as_secs_f64();
    println!("{seconds} {} {weight_bytes}", support::peak_rss()?);
    Ok(())
}

fn run_child(
    mode: &str,
    dir: &Path,
    batch: usize,
    length: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut args = vec!["--child".into(), mode.into(), dir.as_os_str().to_owned()];
    args.extend([batch, length].map(|n| n.to_string().into()));
    match support::child_numbers(&args)?[..] {
        [seconds, peak, weights] => Ok((seconds, peak, weights)),
        ref other => anyhow::bail!("unexpected {mode} child output {other:?}"),
    }
}

fn main() -> anyhow::Result<()> {
    // SAFETY: the first thing `main` does; no other thread exists yet.
    unsafe { opentinker::compute_threads::fix_compute_threads() };
    opentinker::allocator::configure_memory();
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let (mode, dir) = (&args[at + 1], Path::new(&args[at + 2]));
        return child(mode, dir, args[at + 3].parse()?, args[at + 4].parse()?);
    }
    let tiny = args.iter().any(|a| a == "tiny");
    let (shape, name, batch, length) = if support::quick() {
        (TinyShape::Tiny, "tiny", 2, 16)
    } else if tiny {
        (TinyShape::Tiny, "tiny", 16, 128)
    } else {
        (TinyShape::Qwen05b, "qwen2.5-0.5b", 4, 256)
    };
    let dir = tempfile::tempdir()?;
    init_tiny(dir.path(), shape, Architecture::Qwen2, 0)?;
    let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
    let (lora_s, lora_peak, weights) = run_child("lora", dir.path(), batch, length)?;
    let (full_s, full_peak, _) = run_child("full", dir.path(), batch, length)?;
    println!("{name:<14} {batch}x{length}  forward_backward   time      peak RSS");
    println!(
        "  LoRA (rank 16)                   {lora_s:>8.2} s  {:>6.2} GiB",
        gib(lora_peak)
    );
    println!(
        "  full parameters                  {full_s:>8.2} s  {:>6.2} GiB",
        gib(full_peak)
    );
    println!(
        "  LoRA / full time: {:.2} (goal <= 0.80); peak saved {:.2} GiB, base weights {:.2} GiB",
        lora_s / full_s,
        gib(full_peak - lora_peak),
        gib(weights)
    );
    Ok(())
}
