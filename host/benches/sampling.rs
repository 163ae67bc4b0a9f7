//! The sampler, side by side in one run (f32; run with `RAYON_NUM_THREADS=2`):
//! - decode tokens/s at batch 1 against the memory-bandwidth floor of this machine (bytes of
//!   weights read per token over the measured read bandwidth);
//! - the decode step of 64 sequences at context 256 (rank-16 adapters) spread over 1, 4, 16 and
//!   64 distinct adapters, against the same batch on the base model alone;
//! - end-to-end generation (prompt 16, 32 new tokens, greedy) against Hugging Face
//!   `transformers` `generate` at batch 1 and 16 (`bench/python/sampling.py`, run when `PYTHON`
//!   has torch and transformers).
//!
//! Run on the tiny preset, on Qwen2.5-0.5B's shapes (random weights), or on a real model's GGUF
//! file (which `transformers` reads as its `opentinker model export`):
//!
//!     RAYON_NUM_THREADS=2 PYTHON=~/.cache/opentinker/bench-venv/bin/python \
//!         cargo bench -p opentinker --bench sampling [-- qwen2.5-0.5b | -- FILE.gguf]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Tensor};
use opentinker::lora::{Adapter, AdapterRegistry, LoraConfig};
use opentinker::model::{Architecture, Model, Transformer, save_model_dir};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::sample::{EngineConfig, SampleRequest, SamplingEngine, SamplingParams, Stop};
use opentinker::sample::{SequenceInput, forward};
use opentinker_kernels::KvCache;
use rayon::prelude::*;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Read bandwidth in bytes/s: the best of a few parallel sums over 1 GiB.
fn read_bandwidth() -> f64 {
    let data = vec![1.0f32; 1 << 28];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let started = Instant::now();
        let sum: f32 = data
            .par_chunks(1 << 16)
            .map(|chunk| {
                // Sixteen independent lanes, so that the sum vectorises and memory is the limit.
                let mut lanes = [0.0f32; 16];
                for values in chunk.chunks_exact(16) {
                    for (lane, v) in lanes.iter_mut().zip(values) {
                        *lane += v;
                    }
                }
                lanes.iter().sum::<f32>()
            })
            .sum();
        std::hint::black_box(sum);
        best = best.min(started.elapsed().as_secs_f64());
    }
    (data.len() * 4) as f64 / best
}

/// Bytes of weights one decode step reads: every projection and the unembedding.
fn bytes_per_token(model: &Transformer) -> f64 {
    let projections: usize = model
        .layers
        .iter()
        .flat_map(|l| {
            [
                &l.q_proj,
                &l.k_proj,
                &l.v_proj,
                &l.o_proj,
                &l.gate_proj,
                &l.up_proj,
                &l.down_proj,
            ]
        })
        .map(|p| p.weight.bytes())
        .sum();
    (projections + model.lm_head.weight.bytes()) as f64
}

/// Seconds per step of greedy decoding `new` tokens after a prompt of `prompt` tokens, for
/// `batch` requests (end to end through the engine, prefill included).
fn generate(registry: &Arc<AdapterRegistry>, batch: usize, prompt: usize, new: usize) -> f64 {
    let vocab = registry.base().config.vocab_size as u32;
    let mut engine = SamplingEngine::new(
        Arc::clone(registry),
        None,
        Vec::new(),
        EngineConfig {
            kv_budget_positions: batch * (prompt + new),
            prefix_cache_positions: 0,
        },
    );
    let started = Instant::now();
    for b in 0..batch {
        let tokens: Vec<u32> = (0..prompt as u32)
            .map(|i| ((b as u32 * 131 + i) * 7919) % (vocab - 8) + 3)
            .collect();
        let params = SamplingParams {
            max_tokens: new,
            temperature: 0.0,
            stop: Some(Stop::Tokens(Vec::new())),
            ..SamplingParams::default()
        };
        engine
            .add_request(SampleRequest::new(tokens, params))
            .expect("a valid request");
    }
    while engine.has_work() {
        engine.decode_step().expect("a step");
    }
    started.elapsed().as_secs_f64()
}

/// Decode-step seconds of 64 sequences at context 256 over `distinct` adapters (0: base).
fn mixed_step(model: &Transformer, adapters: &[Adapter], distinct: usize) -> f64 {
    let config = &model.config;
    let context = 255;
    let cache = |salt: usize| -> Vec<Vec<Vec<f32>>> {
        (0..config.num_layers)
            .map(|l| {
                (0..config.num_kv_heads)
                    .map(|h| {
                        let mut head = Vec::with_capacity((context + 1) * config.head_dim);
                        head.extend(
                            (0..context * config.head_dim)
                                .map(|i| ((i * salt + l + h) % 97) as f32 * 0.01),
                        );
                        head
                    })
                    .collect()
            })
            .collect()
    };
    // Fresh caches each time, with room to append (as a running sequence's cache has).
    let filled = || KvCache {
        keys: cache(1),
        values: cache(3),
        len: context,
    };
    let tokens: Vec<u32> = (0..64).map(|i| i * 5 + 3).collect();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let mut caches: Vec<KvCache> = (0..64).map(|_| filled()).collect();
        let mut inputs: Vec<SequenceInput> = caches
            .iter_mut()
            .enumerate()
            .map(|(i, cache)| SequenceInput {
                tokens: std::slice::from_ref(&tokens[i]),
                adapter: (distinct > 0).then(|| &adapters[i * distinct / 64]),
                cache,
                all_logits: false,
            })
            .collect();
        let started = Instant::now();
        forward(model, &mut inputs).expect("a decode step");
        best = best.min(started.elapsed().as_secs_f64());
    }
    best
}

fn python(model: &Path, batch: usize) -> Option<f64> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/python/sampling.py");
    let output = Command::new(python)
        .arg(script)
        .arg("--model")
        .arg(model)
        .args([
            "--batch",
            &batch.to_string(),
            "--prompt",
            "16",
            "--new",
            "32",
            "--threads",
            "2",
        ])
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "transformers skipped: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    line["tokens_per_s"].as_f64()
}

fn main() -> anyhow::Result<()> {
    // SAFETY: the first thing `main` does; no other thread exists yet.
    unsafe { opentinker::compute_threads::fix_compute_threads() };
    opentinker::allocator::configure_memory();
    let dir = tempfile::tempdir()?;
    let export = dir.path().join("export");
    let gguf = std::env::args().skip(1).find(|a| a.ends_with(".gguf"));
    // A real model from its GGUF file: ours reads the file; `transformers` its export (which
    // it loads with the GGUF's logits: host/tests/model_dirs.rs).
    let (source, name) = match gguf {
        Some(file) => {
            let file = PathBuf::from(file);
            let model = Model::load(&file)?;
            save_model_dir(&model.transformer, &file, &export)?;
            let name = file
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (file, name)
        }
        None => {
            let big = std::env::args().any(|a| a == "qwen2.5-0.5b");
            let (shape, name) = match big {
                true => (TinyShape::Qwen05b, "qwen2.5-0.5b"),
                false => (TinyShape::Tiny, "tiny"),
            };
            init_tiny(&export, shape, Architecture::Qwen2, 0)?;
            (export.clone(), name.to_string())
        }
    };
    // transformers first, so that the two never hold a 0.5B model at the same time.
    let theirs: Vec<(usize, Option<f64>)> = [1, 16]
        .into_iter()
        .map(|b| (b, (!support::quick()).then(|| python(&export, b)).flatten()))
        .collect();

    let model = Model::load(&source)?;
    let config = model.config.clone();
    let base = Arc::new(model.transformer);
    let registry = AdapterRegistry::new(Arc::clone(&base));

    let bandwidth = read_bandwidth();
    let floor = bandwidth / bytes_per_token(&base);
    let seconds = generate(&registry, 1, 16, 64) - generate(&registry, 1, 16, 32);
    let decode = 32.0 / seconds;
    println!("{name}: decode at batch 1");
    println!(
        "  opentinker {decode:>9.1} tokens/s; floor {floor:.1} tokens/s ({:.1} GB/s read, {:.0} MB per token): {:.0}% of the floor",
        bandwidth / 1e9,
        bytes_per_token(&base) / 1e6,
        100.0 * decode / floor
    );

    let adapters: Vec<Adapter> = (0..64)
        .map(|i| {
            let lora = LoraConfig {
                rank: 16,
                alpha: 32.0,
                seed: i,
                ..LoraConfig::default()
            };
            let adapter = Adapter::new(&config, lora, DType::F32)?;
            for pair in adapter.sites.values() {
                let b = pair.b.as_tensor();
                pair.b.set(&(Tensor::ones_like(b)? * 0.01)?)?;
            }
            Ok(adapter)
        })
        .collect::<anyhow::Result<_>>()?;
    let base_step = mixed_step(&base, &adapters, 0);
    println!("{name}: decode step of 64 sequences at context 256, rank-16 adapters");
    println!("  base model only      {:>8.2} ms", base_step * 1e3);
    for distinct in [1, 4, 16, 64] {
        let step = mixed_step(&base, &adapters, distinct);
        println!(
            "  {distinct:>2} distinct adapters {:>8.2} ms  ({:.2}x the base model)",
            step * 1e3,
            step / base_step
        );
    }

    println!("{name}: generate (prompt 16, 32 new tokens, greedy)");
    for (batch, theirs) in theirs {
        let ours = (batch * 32) as f64 / generate(&registry, batch, 16, 32);
        match theirs {
            Some(theirs) => println!(
                "  batch {batch:>2}: opentinker {ours:>9.1} tokens/s, transformers {theirs:>9.1} tokens/s: {}",
                support::ratio(ours, theirs)
            ),
            None => println!("  batch {batch:>2}: opentinker {ours:>9.1} tokens/s"),
        }
    }
    Ok(())
}
