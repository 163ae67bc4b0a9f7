//! RL steps through the engines a served base runs on one CUDA device (feature `cuda`): the
//! sampling engine on `CudaSampler` draws a group of 16 completions of 64 tokens after a
//! 32-token prompt through the policy's latest version, the training engine on the device
//! takes an importance-sampling step on them (advantages from a toy reward: the share of even
//! tokens) and the new version is published, on the Qwen2.5-0.5B shape with random weights
//! (`model init-tiny --shape qwen2.5-0.5b`). Prints the seconds of each half and the steps per
//! second. Run by `scripts/gpu-check.sh`:
//!
//!     cargo run --release -p opentinker --features cuda --example gpu_rl_step [RESULTS.jsonl]

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;
use opentinker::lora::{AdapterRegistry, LoraConfig};
use opentinker::model::{Architecture, Device, Model};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::sample::{CudaModelOptions, WeightFormat};
use opentinker::sample::{
    CudaSampler, EngineConfig, PolicyRef, SampleRequest, SamplingEngine, SamplingParams, Stop,
};
use opentinker::train::{AdamParams, Datum, Loss, TrainingEngine, WorkItem};
use opentinker_kernels::cuda::Gpu;
use serde_json::json;

const GROUP: usize = 16;
const PROMPT: usize = 32;
const NEW_TOKENS: usize = 64;
const RANK: usize = 16;
/// Steps timed after one of warm-up.
const STEPS: usize = 3;

type Error = Box<dyn std::error::Error>;

fn main() {
    if let Err(error) = run() {
        eprintln!("gpu_rl_step: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let mut results = match std::env::args_os().nth(1) {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    };
    let dir = tempfile::tempdir()?;
    init_tiny(dir.path(), TinyShape::Qwen05b, Architecture::Qwen2, 1)?;
    let model = Model::load(dir.path())?;
    let registry = AdapterRegistry::new(Arc::new(model.transformer));
    let gpu = Arc::new(Gpu::new(0)?);
    println!("device: {}", gpu.name());

    let config = EngineConfig {
        kv_budget_positions: GROUP * (PROMPT + NEW_TOKENS),
        prefix_cache_positions: 0,
    };
    let options = CudaModelOptions {
        weights: WeightFormat::F32,
        kv_blocks: CudaSampler::blocks_for(&config, 16),
        block_size: 16,
        adapter_slots: 2,
        max_rank: RANK,
    };
    let backend = CudaSampler::new(Arc::clone(&gpu), registry.base(), options)?;
    let mut sampler =
        SamplingEngine::with_backend(backend, Arc::clone(&registry), None, Vec::new(), config);
    let mut trainer = TrainingEngine::new(Arc::clone(registry.base()), DType::F32)
        .on_device(Device::Cuda { ordinal: 0 })?;
    let lora = LoraConfig {
        rank: RANK,
        alpha: 2.0 * RANK as f64,
        seed: 1,
        ..LoraConfig::default()
    };
    trainer.add_adapter("policy", lora)?;
    let vocab = model.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..PROMPT as u32)
        .map(|t| (t * 7919 + 11) % vocab)
        .collect();

    println!(
        "\nRL step on CUDA: a group of {GROUP} x {NEW_TOKENS} new tokens sampled, an importance-sampling step on it, a version published (rank {RANK}, f32)"
    );
    println!("| shape | sample s | train s | step s | steps/s |");
    println!("|---|---:|---:|---:|---:|");
    let (mut sampling, mut training) = (0.0, 0.0);
    for step in 0..=STEPS {
        let version = registry.publish("policy", trainer.adapter("policy").ok_or("no adapter")?)?;
        let started = Instant::now();
        let mut request = SampleRequest::new(
            prompt.clone(),
            SamplingParams {
                max_tokens: NEW_TOKENS,
                temperature: 1.0,
                seed: Some(step as u64),
                stop: Some(Stop::Tokens(Vec::new())),
                num_samples: GROUP,
                ..SamplingParams::default()
            },
        );
        request.policy = Some(PolicyRef {
            name: version.name.clone(),
            version: Some(version.version),
        });
        sampler.add_request(request)?;
        let mut outputs = Vec::new();
        while sampler.has_work() {
            outputs.extend(sampler.decode_step()?);
        }
        let output = outputs.pop().ok_or("the group did not finish")?;
        let sampled = started.elapsed().as_secs_f64();

        let started = Instant::now();
        let rewards: Vec<f32> = output
            .samples
            .iter()
            .map(|s| s.tokens.iter().filter(|t| *t % 2 == 0).count() as f32 / s.tokens.len() as f32)
            .collect();
        let mean = rewards.iter().sum::<f32>() / rewards.len() as f32;
        let datums = output
            .samples
            .iter()
            .zip(&rewards)
            .map(|(sample, reward)| {
                let mut all = prompt.clone();
                all.extend(&sample.tokens);
                let n = all.len() - 1;
                let acted = |i: usize| i + 1 >= PROMPT;
                Datum {
                    input_tokens: all[..n].to_vec(),
                    target_tokens: all[1..].to_vec(),
                    mask: (0..n).map(|i| f32::from(u8::from(acted(i)))).collect(),
                    advantages: Some(
                        (0..n)
                            .map(|i| if acted(i) { reward - mean } else { 0.0 })
                            .collect(),
                    ),
                    sampler_logprobs: Some(
                        (0..n)
                            .map(|i| match acted(i) {
                                true => sample.logprobs[i + 1 - PROMPT],
                                false => 0.0,
                            })
                            .collect(),
                    ),
                    ..Datum::default()
                }
            })
            .collect();
        trainer.forward_backward(&[WorkItem::new("policy", datums, Loss::ImportanceSampling)])?;
        trainer.optim_step("policy", &AdamParams::default())?;
        let trained = started.elapsed().as_secs_f64();
        if step > 0 {
            sampling += sampled;
            training += trained;
        }
    }
    let (sampling, training) = (sampling / STEPS as f64, training / STEPS as f64);
    let total = sampling + training;
    println!(
        "| qwen2.5-0.5b | {sampling:.3} | {training:.3} | {total:.3} | {:.2} |",
        1.0 / total
    );
    if let Some(file) = &mut results {
        let line = json!({
            "kind": "rl_step", "shape": "qwen2.5-0.5b", "group": GROUP, "prompt": PROMPT,
            "new_tokens": NEW_TOKENS, "rank": RANK, "sample_s": sampling, "train_s": training,
        });
        writeln!(file, "{line}")?;
    }
    Ok(())
}
