//! A base kept in blocks (`--base-format q8_0 | q4_0`) against the f32 base: the memory the
//! base takes and the LoRA training step's speed.
//!
//!     RAYON_NUM_THREADS=2 cargo bench -p opentinker --bench base_formats [-- FILE.gguf]
//!
//! Memory: for the shapes of Qwen2.5-0.5B and of Llama 2 7B, a child process per format builds a
//! base of random weights matrix by matrix (`Transformer::from_source`, as loading a file does)
//! and prints its resident set after building and the bytes of its weights. The f32 7B base (27
//! GB) does not fit a 24 GB machine: its bytes are computed, not measured.
//!
//! Training: a LoRA step (rank 16, all seven projections, cross-entropy, 4 sequences of 256
//! tokens) on the 0.5B shape written to a temporary folder (or on the GGUF file given), in each
//! format, each in a child of its own: tokens per second and peak resident memory.
//!
//! No allocator is set: the children measure what the process holds after building, and glibc
//! gives a freed large block back at once where mimalloc keeps it a while.

mod support;

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use opentinker::model::{
    Architecture, BaseFormat, Model, ModelConfig, TinyShape, Transformer, init_tiny,
};
use opentinker::train::{Loss, TrainingEngine, WorkItem};
use rayon::prelude::*;

/// Each format, f32 first (the others are measured against it).
const FORMATS: [(BaseFormat, &str); 3] = [
    (BaseFormat::F32, "f32"),
    (BaseFormat::Q8_0, "q8_0"),
    (BaseFormat::Q4_0, "q4_0"),
];

/// A shape's `config.json`: Qwen2.5-0.5B's, Llama 2 7B's, or (quick) a small one.
fn shape_config(shape: &str) -> anyhow::Result<ModelConfig> {
    let (arch, vocab, hidden, inter, layers, heads, kv_heads, tied) = match shape {
        "qwen2.5-0.5b" => ("qwen2", 151_936, 896, 4864, 24, 14, 2, true),
        "llama-2-7b" => ("llama", 32_000, 4096, 11_008, 32, 32, 32, false),
        _ => ("llama", 512, 128, 512, 2, 4, 2, false),
    };
    let config = serde_json::json!({
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
        "attention_bias": arch == "qwen2",
    });
    Ok(ModelConfig::from_json(&config)?)
}

/// Small values that vary with the index, computed in parallel (a 7B shape's 6.7 billion).
fn random_tensor(shape: &[usize], seed: u64) -> candle_core::Result<Tensor> {
    let len: usize = shape.iter().product();
    let values: Vec<f32> = (0..len as u64)
        .into_par_iter()
        .map(|i| {
            let mut x = (i ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(1);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f32 / 1000.0 * 0.02 - 0.02
        })
        .collect();
    Tensor::from_vec(values, shape, &Device::Cpu)
}

/// Child: build `shape` in `format` from random weights; prints `resident_bytes weight_bytes`.
fn build_child(shape: &str, format: BaseFormat) -> anyhow::Result<()> {
    let config = shape_config(shape)?;
    let mut seed = 0;
    let model = Transformer::from_source(config, format, |name, shape| {
        seed += 1;
        Ok(Some(match name.ends_with("norm.weight") {
            true => Tensor::ones(shape, DType::F32, &Device::Cpu)?,
            false => random_tensor(shape, seed)?,
        }))
    })?;
    println!("{} {}", support::rss()?, model.weight_bytes());
    Ok(())
}

/// Child: LoRA steps on `model` held as `format`; prints `tokens_per_s peak_bytes`.
fn train_child(model: &Path, format: BaseFormat, steps: usize) -> anyhow::Result<()> {
    let model = Model::load_as(model, format)?;
    let vocab = model.config.vocab_size as u32;
    let mut engine = TrainingEngine::new(Arc::new(model.transformer), DType::F32);
    engine.add_adapter("bench", support::bench_lora())?;
    let (batch, length) = match support::quick() {
        true => (2, 16),
        false => (4, 256),
    };
    let item = WorkItem::new(
        "bench",
        support::datums(batch, length, vocab),
        Loss::CrossEntropy,
    );
    let tokens_per_s = support::steps_tokens_per_s(&mut engine, &item, steps)?;
    println!("{tokens_per_s} {}", support::peak_rss()?);
    Ok(())
}

fn format_named(name: &str) -> anyhow::Result<BaseFormat> {
    FORMATS
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(f, _)| *f)
        .ok_or_else(|| anyhow::anyhow!("no format {name}"))
}

fn main() -> anyhow::Result<()> {
    // SAFETY: the first thing `main` does; no other thread exists yet.
    unsafe { opentinker::compute_threads::fix_compute_threads() };
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--build") {
        return build_child(&args[at + 1], format_named(&args[at + 2])?);
    }
    if let Some(at) = args.iter().position(|a| a == "--train") {
        let steps = args[at + 3].parse()?;
        return train_child(
            Path::new(&args[at + 1]),
            format_named(&args[at + 2])?,
            steps,
        );
    }
    let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
    let shapes: &[&str] = match support::quick() {
        true => &["small"],
        false => &["qwen2.5-0.5b", "llama-2-7b"],
    };
    for &shape in shapes {
        // The f32 base's weights and resident set: measured, or (7B) its bytes computed.
        let mut f32_base: Option<(f64, f64)> = None;
        for (format, name) in FORMATS {
            let config = shape_config(shape)?;
            if shape == "llama-2-7b" && format == BaseFormat::F32 {
                // Every matrix and vector of the shape, 4 bytes each.
                let (h, v) = (config.hidden_size, config.vocab_size);
                let (q, kv) = (
                    config.num_heads * config.head_dim,
                    config.num_kv_heads * config.head_dim,
                );
                let per_layer = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size + 2 * h;
                let bytes = ((2 * v * h + config.num_layers * per_layer + h) * 4) as f64;
                f32_base = Some((bytes, bytes));
                println!(
                    "{shape:<13} {name:<5} weights {:>6.2} GiB (computed: it does not fit here)",
                    gib(bytes)
                );
                continue;
            }
            let args = ["--build", shape, name].map(std::ffi::OsString::from);
            let [resident, weights] = support::child_numbers(&args)?[..] else {
                anyhow::bail!("unexpected child output");
            };
            let against = match f32_base {
                None => {
                    f32_base = Some((weights, resident));
                    String::new()
                }
                Some((f32_weights, f32_resident)) => format!(
                    "; {:.3}x the f32 base's weights, {:.3}x its resident set",
                    weights / f32_weights,
                    resident / f32_resident
                ),
            };
            println!(
                "{shape:<13} {name:<5} weights {:>6.2} GiB, resident {:>6.2} GiB{against}",
                gib(weights),
                gib(resident)
            );
        }
    }

    let dir = tempfile::tempdir()?;
    let model = match args.iter().skip(1).find(|a| a.ends_with(".gguf")) {
        Some(file) => Path::new(file).to_path_buf(),
        None => {
            let written = dir.path().join("model");
            let shape = match support::quick() {
                true => TinyShape::Tiny,
                false => TinyShape::Qwen05b,
            };
            init_tiny(&written, shape, Architecture::Qwen2, 0)?;
            written
        }
    };
    let steps = if support::quick() { 1 } else { 2 };
    let mut f32_speed = None;
    for (_, name) in FORMATS {
        let args = [
            "--train".into(),
            model.as_os_str().to_owned(),
            name.into(),
            steps.to_string().into(),
        ];
        let [speed, peak] = support::child_numbers(&args)?[..] else {
            anyhow::bail!("unexpected child output");
        };
        let against = match f32_speed {
            None => {
                f32_speed = Some(speed);
                String::new()
            }
            Some(f32) => format!("  step time {:.2}x f32's", f32 / speed),
        };
        println!(
            "LoRA step     {name:<5} {speed:>8.0} tokens/s, peak {:>6.2} GiB{against}",
            gib(peak)
        );
    }
    Ok(())
}
