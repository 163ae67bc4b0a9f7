//! Tokens per second and peak resident memory of a LoRA forward_backward + optim_step (rank 16,
//! alpha 32, all seven attention and MLP projections, f32, cross-entropy), beside PyTorch + PEFT
//! with the same shapes, batch and threads (`bench/python/lora_training.py`, run when `PYTHON`
//! has torch and peft). Each side runs in a process of its own that loads the model and trains,
//! so that the peaks compare like with like (the model is written beforehand).
//!
//!     RAYON_NUM_THREADS=2 PYTHON=~/.cache/opentinker/bench-venv/bin/python \
//!         cargo bench -p opentinker --bench lora_training [-- qwen2.5-0.5b | -- FILE.gguf]
//!
//! The tiny shape runs 16 sequences of 128 tokens; `qwen2.5-0.5b` 4 of 256 (it writes a 2 GB
//! model to a temporary folder first); a real model's GGUF file 4 of 256 (ours trains on the
//! file, PyTorch on its export, which `transformers` loads with the file's logits).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;
use opentinker::lora::LoraConfig;
use opentinker::model::{Architecture, Model, save_model_dir};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::train::{AdamParams, Loss, TrainingEngine, WorkItem};

/// Training allocates and frees large tensors at a high rate; glibc's malloc maps and unmaps
/// each one (page faults, zeroing), mimalloc reuses them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Our side, in this (child) process: prints `tokens_per_s peak_bytes`.
fn child(dir: &Path, batch: usize, length: usize, steps: usize) -> anyhow::Result<()> {
    let model = Model::load(dir)?;
    let vocab = model.config.vocab_size as u32;
    let mut engine = TrainingEngine::new(Arc::new(model.transformer), DType::F32);
    engine.add_adapter(
        "bench",
        LoraConfig {
            rank: 16,
            alpha: 32.0,
            ..LoraConfig::default()
        },
    )?;
    let datums = support::datums(batch, length, vocab);
    let item = WorkItem::new("bench", datums, Loss::CrossEntropy);
    let mut step = || -> anyhow::Result<()> {
        engine.forward_backward(std::slice::from_ref(&item))?;
        engine.optim_step("bench", &AdamParams::default())?;
        Ok(())
    };
    step()?;
    let started = Instant::now();
    for _ in 0..steps {
        step()?;
    }
    let seconds = started.elapsed().as_secs_f64() / steps as f64;
    println!(
        "{} {}",
        (batch * length) as f64 / seconds,
        support::peak_rss()?
    );
    Ok(())
}

/// Our side on the model at `model` in a child process: tokens per second and peak bytes.
fn ours(model: &Path, batch: usize, length: usize, steps: usize) -> anyhow::Result<(f64, f64)> {
    let mut args = vec!["--child".into(), model.as_os_str().to_owned()];
    args.extend([batch, length, steps].map(|n| n.to_string().into()));
    match support::child_numbers(&args)?[..] {
        [tokens_per_s, peak] => Ok((tokens_per_s, peak)),
        ref other => anyhow::bail!("unexpected child output {other:?}"),
    }
}

/// What PyTorch + PEFT trains: a shape of random weights, or a model directory.
enum Peer<'a> {
    Shape(&'a str),
    Model(&'a Path, usize, usize),
}

/// PyTorch + PEFT's side: tokens per second and peak bytes, when its venv is there.
fn pytorch(peer: Peer<'_>, steps: usize) -> Option<(f64, f64)> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../bench/python/lora_training.py"
    );
    let mut command = Command::new(python);
    command.args([script, "--steps", &steps.to_string(), "--threads", "2"]);
    match peer {
        Peer::Shape(shape) => command.args(["--shape", shape]),
        Peer::Model(dir, batch, length) => command.arg("--model").arg(dir).args([
            "--batch",
            &batch.to_string(),
            "--length",
            &length.to_string(),
        ]),
    };
    let output = command.output().ok()?;
    if !output.status.success() {
        eprintln!(
            "PyTorch + PEFT skipped: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    Some((
        line["tokens_per_s"].as_f64()?,
        line["peak_rss_bytes"].as_f64()?,
    ))
}

fn main() -> anyhow::Result<()> {
    // SAFETY: the first thing `main` does; no other thread exists yet.
    unsafe { opentinker::compute_threads::fix_compute_threads() };
    opentinker::allocator::configure_memory();
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let number = |i: usize| -> anyhow::Result<usize> { Ok(args[at + i].parse()?) };
        return child(Path::new(&args[at + 1]), number(2)?, number(3)?, number(4)?);
    }
    let dir = tempfile::tempdir()?;
    let written = dir.path().join("model");
    let gguf = args
        .iter()
        .skip(1)
        .find(|a| a.ends_with(".gguf"))
        .map(PathBuf::from);
    let big = args.iter().any(|a| a == "qwen2.5-0.5b");
    let (name, batch, length, steps) = match (&gguf, big) {
        _ if support::quick() => ("tiny".to_string(), 2, 16, 1),
        (Some(file), _) => {
            let stem = file.file_stem().unwrap_or_default().to_string_lossy();
            (stem.into_owned(), 4, 256, 3)
        }
        (None, true) => ("qwen2.5-0.5b".to_string(), 4, 256, 2),
        (None, false) => ("tiny".to_string(), 16, 128, 5),
    };
    // Ours trains on `model`; PyTorch on the same weights as a directory it loads.
    let (model, peer) = match &gguf {
        Some(file) => {
            let loaded = Model::load(file)?;
            save_model_dir(&loaded.transformer, file, &written)?;
            (file.clone(), Peer::Model(&written, batch, length))
        }
        None => {
            let shape = match big {
                true => TinyShape::Qwen05b,
                false => TinyShape::Tiny,
            };
            init_tiny(&written, shape, Architecture::Qwen2, 0)?;
            (written.clone(), Peer::Shape(&name))
        }
    };
    // PyTorch first, so that the two never hold a 0.5B model in memory at the same time.
    let theirs = match support::quick() {
        true => None,
        false => pytorch(peer, steps),
    };
    let (ours, our_peak) = ours(&model, batch, length, steps)?;
    let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
    println!(
        "{name:<14} {batch}x{length}  opentinker       {ours:>10.0} tokens/s  peak {:>6.2} GiB",
        gib(our_peak)
    );
    if let Some((theirs, their_peak)) = theirs {
        println!(
            "{name:<14} {batch}x{length}  PyTorch + PEFT   {theirs:>10.0} tokens/s  peak {:>6.2} GiB",
            gib(their_peak)
        );
        println!(
            "{name:<14} ours / PyTorch + PEFT: {} tokens/s, {} peak memory",
            support::ratio(ours, theirs),
            support::ratio(our_peak, their_peak)
        );
    }
    Ok(())
}
