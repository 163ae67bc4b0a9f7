//! LoRA training steps on the CUDA device (feature `cuda`) on the Qwen2.5-0.5B and Qwen2.5-7B
//! shapes with random f32 weights made on the device: one step is the layers' forward and
//! backward over 16 sequences of 64 tokens (cross-entropy on every token), the gradients of
//! rank-16 adapters on every projection, and AdamW on the device, through one adapter and through
//! 16 (a sequence each, fused in one batch: the same tokens). Run by `scripts/gpu-check.sh`:
//!
//!     cargo run --release -p opentinker --features cuda --example gpu_train [RESULTS.jsonl]
//!
//! With a path, each figure is also written there as a JSON line (with the model's config),
//! which `bench/python/gpu_peer.py` reads to time PyTorch + PEFT on the same shapes and tokens.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;
use opentinker::lora::{
    Adapter, GpuAdapterWeights, GpuTrainAdapters, GpuTrainedAdapter, LoraConfig,
};
use opentinker::model::layers::{TrainSequence, train_backward, train_forward};
use opentinker::model::{GpuWeights, ModelConfig};
use opentinker_kernels::Backend;
use opentinker_kernels::cuda::{AdamStep, Gpu, GpuTrain, GpuTrainBatch, WeightFormat};
use serde_json::json;

#[path = "common/shapes.rs"]
mod shapes;
use shapes::shapes;

const SEQUENCES: usize = 16;
const TOKENS: usize = 64;
const RANK: usize = 16;
/// Steps timed after one of warm-up; the figure is their mean.
const STEPS: usize = 3;

type Error = Box<dyn std::error::Error>;

/// One training step of `tokens` (a sequence per entry), sequence `i` through adapter
/// `assignment[i]`.
fn step(
    gpu: &Gpu,
    config: &ModelConfig,
    weights: &GpuWeights,
    adapters: &mut [GpuTrainedAdapter],
    assignment: &[usize],
    tokens: &[Vec<u32>],
) -> Result<(), Error> {
    let ops = GpuTrain::new(gpu);
    let hook = GpuTrainAdapters::training(adapters.iter().map(|a| &a.weights).collect());
    let sequences: Vec<TrainSequence<'_>> = tokens
        .iter()
        .zip(assignment)
        .map(|(tokens, &adapter)| TrainSequence {
            tokens: &tokens[..TOKENS],
            targets: &tokens[1..],
            adapter: Some(adapter),
            temperature: 1.0,
        })
        .collect();
    let decoder = weights.decoder::<GpuTrain<'_>>();
    let mut batch = GpuTrainBatch::new(gpu, vec![TOKENS; tokens.len()])?;
    let forward = train_forward(
        &ops, config, &decoder, &hook, &sequences, &mut batch, true, false,
    )?;
    let tape = forward.tape.ok_or("the forward kept no tape")?;
    // The summed cross-entropy: each target's logprob with gradient -1.
    let d_logprobs = ops.upload(&vec![-1.0; tokens.len() * TOKENS])?;
    train_backward(
        &ops,
        config,
        &decoder,
        &hook,
        &sequences,
        &mut batch,
        &tape,
        &d_logprobs,
        None,
    )?;
    drop((tape, batch, forward.logprobs));
    let gradients = hook.into_device_gradients();
    let adam = AdamStep {
        learning_rate: 1e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-12,
        weight_decay: 0.0,
        step: 0,
        clip: 1.0,
    };
    for (adapter, gradients) in adapters.iter_mut().zip(&gradients) {
        if !gradients.is_empty() {
            adapter.adamw(gpu, gradients, adam, 1.0)?;
        }
    }
    gpu.synchronize()?;
    Ok(())
}

fn main() {
    if let Err(error) = run() {
        eprintln!("gpu_train: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let mut results = match std::env::args_os().nth(1) {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    };
    let gpu = Arc::new(Gpu::new(0)?);
    println!("device: {}", gpu.name());
    println!(
        "\nLoRA training step on CUDA (forward, backward, AdamW; {SEQUENCES} x {TOKENS} tokens, rank {RANK} on every projection, f32)"
    );
    println!("| shape | adapters | step ms | tokens/s | step / one adapter's |");
    println!("|---|---:|---:|---:|---:|");
    for (name, json) in shapes() {
        let config = ModelConfig::from_json(&json)?;
        let weights = GpuWeights::random(&gpu, &config, WeightFormat::F32, 1)?;
        let vocab = config.vocab_size as u32;
        let tokens: Vec<Vec<u32>> = (0..SEQUENCES as u32)
            .map(|s| {
                (0..=TOKENS as u32)
                    .map(|t| (t * 7919 + s * 104_729) % vocab)
                    .collect()
            })
            .collect();
        let mut one = None;
        for count in [1usize, SEQUENCES] {
            let mut adapters = (0..count)
                .map(|i| {
                    let lora = LoraConfig {
                        rank: RANK,
                        alpha: 2.0 * RANK as f64,
                        seed: i as u64 + 1,
                        ..LoraConfig::default()
                    };
                    let adapter = Adapter::new(&config, lora, DType::F32)?;
                    let weights = GpuAdapterWeights::upload(&gpu, &adapter)?;
                    Ok(GpuTrainedAdapter::new(&gpu, weights)?)
                })
                .collect::<Result<Vec<_>, Error>>()?;
            // Sequences grouped by adapter, as the engine fuses them.
            let assignment: Vec<usize> = (0..SEQUENCES).map(|i| i * count / SEQUENCES).collect();
            step(&gpu, &config, &weights, &mut adapters, &assignment, &tokens)?;
            let started = Instant::now();
            for _ in 0..STEPS {
                step(&gpu, &config, &weights, &mut adapters, &assignment, &tokens)?;
            }
            let ms = started.elapsed().as_secs_f64() * 1000.0 / STEPS as f64;
            let base = *one.get_or_insert(ms);
            let tokens_per_second = (SEQUENCES * TOKENS) as f64 / ms * 1000.0;
            println!(
                "| {name} | {count} | {ms:.1} | {tokens_per_second:.0} | {:.2} |",
                ms / base
            );
            if let Some(file) = &mut results {
                let line = json!({
                    "kind": "train", "shape": name, "config": json, "weights": "f32",
                    "adapters": count, "rank": RANK, "sequences": SEQUENCES, "tokens": TOKENS,
                    "step_ms": ms,
                });
                writeln!(file, "{line}")?;
            }
        }
    }
    Ok(())
}
