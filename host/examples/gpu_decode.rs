//! Decode throughput of the sampler's CUDA forward (feature `cuda`) on the Qwen2.5-0.5B and
//! Qwen2.5-7B shapes with random weights made on the device, with f32 and bf16 matrices: the
//! time of one decode step at batch 1, 16 and 64 for the base model, and at 16 and 64 with the
//! batch spread over 16 adapters (rank 16 on every projection) against the base step. Run by `scripts/gpu-check.sh`:
//!
//!     cargo run --release -p opentinker --features cuda --example gpu_decode [RESULTS.jsonl]
//!
//! With a path, each figure is also written there as a JSON line (with the model's config),
//! which `bench/python/gpu_peer.py` reads to time `transformers` generate on the same shapes.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use opentinker::model::ModelConfig;
use opentinker::sample::{CudaModel, CudaModelOptions, CudaSequence, WeightFormat};
use opentinker_kernels::cuda::{AdapterRef, Gpu};
use serde_json::json;

#[path = "common/shapes.rs"]
mod shapes;
use shapes::shapes;

const PROMPT: usize = 32;
const NEW_TOKENS: usize = 32;
const RANK: usize = 16;

/// Seconds of a greedy generation of `new_tokens` after `batch` prompts of `PROMPT` tokens.
fn generate_seconds(
    model: &mut CudaModel,
    batch: usize,
    adapters: &[Option<AdapterRef>],
    new_tokens: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let vocab = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|i| {
            (0..PROMPT as u32)
                .map(|t| (t * 7919 + i as u32 * 104_729) % vocab)
                .collect()
        })
        .collect();
    model.gpu().synchronize()?;
    let started = Instant::now();
    model.generate_greedy(&prompts, adapters, new_tokens)?;
    model.gpu().synchronize()?;
    Ok(started.elapsed().as_secs_f64())
}

/// Milliseconds of one decode step: a generation of `NEW_TOKENS` less one of a single token
/// (the prefill), over the steps between them, after a warm-up generation.
fn step_ms(
    model: &mut CudaModel,
    batch: usize,
    adapters: &[Option<AdapterRef>],
) -> Result<f64, Box<dyn std::error::Error>> {
    generate_seconds(model, batch, adapters, 4)?;
    let full = generate_seconds(model, batch, adapters, NEW_TOKENS)?;
    let prefill = generate_seconds(model, batch, adapters, 1)?;
    Ok((full - prefill) / (NEW_TOKENS - 1) as f64 * 1000.0)
}

/// Milliseconds the host takes to queue one decode step of `batch` sequences at position
/// `PROMPT` (the forward returns once its launches are queued, before the device has run them),
/// the mean of 20 steps, each waited for before the next: when this is close to the step's
/// time, the step is bound by the host's launches, not by the device.
fn enqueue_ms(
    model: &mut CudaModel,
    batch: usize,
    adapters: &[Option<AdapterRef>],
) -> Result<f64, Box<dyn std::error::Error>> {
    let per = (PROMPT + 1).div_ceil(16);
    let tables: Vec<Vec<usize>> = (0..batch)
        .map(|i| (i * per..(i + 1) * per).collect())
        .collect();
    let tokens: Vec<u32> = (0..batch as u32).collect();
    let sequences: Vec<CudaSequence<'_>> = (0..batch)
        .map(|i| CudaSequence {
            tokens: &tokens[i..=i],
            start: PROMPT,
            blocks: &tables[i],
            adapter: adapters.get(i).copied().flatten(),
            all_logits: false,
        })
        .collect();
    let mut total = 0.0;
    for round in 0..23 {
        model.gpu().synchronize()?;
        let started = Instant::now();
        let logits = model.forward(&sequences)?;
        let elapsed = started.elapsed().as_secs_f64();
        model.gpu().synchronize()?;
        drop(logits);
        if round >= 3 {
            total += elapsed;
        }
    }
    Ok(total / 20.0 * 1000.0)
}

fn main() {
    if let Err(error) = run() {
        eprintln!("gpu_decode: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut results = match std::env::args_os().nth(1) {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    };
    let gpu = Arc::new(Gpu::new(0)?);
    println!("device: {}", gpu.name());
    println!(
        "\ndecode step of the CUDA forward (greedy; prompt {PROMPT}, {NEW_TOKENS} new tokens)"
    );
    println!(
        "| shape | weights | batch | adapters | step ms | tokens/s | step / base step | host queues a step in (ms) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for ((name, json), weights) in shapes().into_iter().flat_map(|shape| {
        [
            (shape.clone(), WeightFormat::F32),
            (shape, WeightFormat::Bf16),
        ]
    }) {
        let config = ModelConfig::from_json(&json)?;
        let dtype = match weights {
            WeightFormat::F32 => "f32",
            WeightFormat::Bf16 => "bf16",
        };
        let options = CudaModelOptions {
            weights,
            kv_blocks: 64 * (PROMPT + NEW_TOKENS).div_ceil(16),
            block_size: 16,
            adapter_slots: 16,
            max_rank: RANK,
        };
        let mut model = CudaModel::random(Arc::clone(&gpu), &config, options, 1)?;
        let adapters: Vec<AdapterRef> = (0..16)
            .map(|slot| model.random_adapter(slot, RANK, slot as u64 + 1))
            .collect::<Result<_, _>>()?;
        for batch in [1usize, 16, 64] {
            let base = step_ms(&mut model, batch, &[])?;
            let mut runs = vec![(0usize, base, enqueue_ms(&mut model, batch, &[])?)];
            if batch >= 16 {
                // Rows sorted by adapter, as the sampler batches them: 16 equal runs.
                let spread: Vec<Option<AdapterRef>> =
                    (0..batch).map(|i| Some(adapters[i * 16 / batch])).collect();
                let ms = step_ms(&mut model, batch, &spread)?;
                runs.push((16, ms, enqueue_ms(&mut model, batch, &spread)?));
            }
            for (count, ms, host_ms) in runs {
                let tokens_per_second = batch as f64 / ms * 1000.0;
                println!(
                    "| {name} | {dtype} | {batch} | {count} | {ms:.2} | {tokens_per_second:.0} | {:.2} | {host_ms:.2} |",
                    ms / base
                );
                if let Some(file) = &mut results {
                    let line = json!({
                        "kind": "decode", "shape": name, "config": json, "weights": dtype,
                        "batch": batch,
                        "adapters": count, "rank": RANK, "prompt": PROMPT,
                        "new_tokens": NEW_TOKENS, "step_ms": ms, "host_ms": host_ms,
                    });
                    writeln!(file, "{line}")?;
                }
            }
        }
    }
    Ok(())
}
