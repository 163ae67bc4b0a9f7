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
//!
//! Then ours alone on an RL step's shape: 4 groups of 8 sequences of 80 tokens whose first 48
//! (the prompt) a group shares, which a pass computes once, against the same sequences
//! interleaved so that no neighbours share (tokens per second count every sequence's tokens).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use candle_core::DType;
use opentinker::model::{Architecture, Model, save_model_dir};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::train::{Loss, TrainingEngine, WorkItem};

/// Training allocates and frees large tensors at a high rate; glibc's malloc maps and unmaps
/// each one (page faults, zeroing), mimalloc reuses them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a child trains: `groups` groups of `group` sequences of `length` tokens whose first
/// `prompt` a group shares, in order or `interleaved` (the groups' first sequences, then their
/// second...).
#[derive(Clone, Copy)]
struct Layout {
    groups: usize,
    group: usize,
    prompt: usize,
    length: usize,
    interleaved: bool,
}

impl Layout {
    /// `batch` sequences of `length` tokens, none alike.
    fn distinct(batch: usize, length: usize) -> Layout {
        Layout {
            groups: batch,
            group: 1,
            prompt: 0,
            length,
            interleaved: false,
        }
    }

    fn args(self) -> [usize; 5] {
        let interleaved = usize::from(self.interleaved);
        [
            self.groups,
            self.group,
            self.prompt,
            self.length,
            interleaved,
        ]
    }

    fn datums(self, vocab: u32) -> Vec<opentinker::train::Datum> {
        let datums =
            support::group_datums(self.groups, self.group, self.prompt, self.length, vocab);
        if !self.interleaved {
            return datums;
        }
        let (groups, group) = (self.groups, self.group);
        (0..groups * group)
            .map(|i| datums[(i % groups) * group + i / groups].clone())
            .collect()
    }
}

/// Our side, in this (child) process: prints `tokens_per_s peak_bytes`.
fn child(dir: &Path, layout: Layout, steps: usize) -> anyhow::Result<()> {
    let model = Model::load(dir)?;
    let vocab = model.config.vocab_size as u32;
    let mut engine = TrainingEngine::new(Arc::new(model.transformer), DType::F32);
    engine.add_adapter("bench", support::bench_lora())?;
    let item = WorkItem::new("bench", layout.datums(vocab), Loss::CrossEntropy);
    let tokens_per_s = support::steps_tokens_per_s(&mut engine, &item, steps)?;
    println!("{tokens_per_s} {}", support::peak_rss()?);
    Ok(())
}

/// Our side on the model at `model` in a child process: tokens per second and peak bytes.
fn ours(model: &Path, layout: Layout, steps: usize) -> anyhow::Result<(f64, f64)> {
    let mut args = vec!["--child".into(), model.as_os_str().to_owned()];
    args.extend(layout.args().map(|n| n.to_string().into()));
    args.push(steps.to_string().into());
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
        let layout = Layout {
            groups: number(2)?,
            group: number(3)?,
            prompt: number(4)?,
            length: number(5)?,
            interleaved: number(6)? == 1,
        };
        return child(Path::new(&args[at + 1]), layout, number(7)?);
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
    let (ours_tps, our_peak) = ours(&model, Layout::distinct(batch, length), steps)?;
    let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
    println!(
        "{name:<14} {batch}x{length}  opentinker       {ours_tps:>10.0} tokens/s  peak {:>6.2} GiB",
        gib(our_peak)
    );
    if let Some((theirs, their_peak)) = theirs {
        println!(
            "{name:<14} {batch}x{length}  PyTorch + PEFT   {theirs:>10.0} tokens/s  peak {:>6.2} GiB",
            gib(their_peak)
        );
        println!(
            "{name:<14} ours / PyTorch + PEFT: {} tokens/s, {} peak memory",
            support::ratio(ours_tps, theirs),
            support::ratio(our_peak, their_peak)
        );
    }
    // An RL step's shape: a group's shared prompt trained once, against nothing shared.
    let (groups, group, prompt, length) = match support::quick() {
        true => (2, 2, 8, 16),
        false => (4, 8, 48, 80),
    };
    let grouped = Layout {
        groups,
        group,
        prompt,
        length,
        interleaved: false,
    };
    let (shared, _) = ours(&model, grouped, steps)?;
    let interleaved = Layout {
        interleaved: true,
        ..grouped
    };
    let (unshared, _) = ours(&model, interleaved, steps)?;
    println!(
        "{name:<14} RL groups {groups}x{group} of {length} tokens, {prompt} shared: \
         {shared:.0} tokens/s; interleaved, nothing shared: {unshared:.0} tokens/s; {}",
        support::ratio(shared, unshared)
    );
    Ok(())
}
