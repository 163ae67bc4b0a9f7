//! `opentinker sample`: generate from a model directory (and optionally a LoRA adapter) with the
//! sampling engine.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;

use crate::lora::AdapterRegistry;
use crate::model::{BaseFormat, Device, Model};
use crate::sample::{EngineConfig, PolicyRef, SampleRequest, SamplingParams, StopReason};
use crate::service::DeviceOptions;
use crate::text::ChatMessage;

#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    #[arg(long)]
    model: PathBuf,
    /// A LoRA adapter checkpoint (PEFT format) to sample from.
    #[arg(long)]
    adapter: Option<PathBuf>,
    #[arg(long)]
    prompt: String,
    /// Render the prompt as a user message with the model's chat template, opening the
    /// assistant's turn.
    #[arg(long)]
    chat: bool,
    /// Number of samples.
    #[arg(long, default_value_t = 1)]
    n: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 samples greedily.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long)]
    seed: Option<u64>,
    /// Print JSON: each sample's text (special tokens left out), tokens (all of them),
    /// logprobs and stop reason.
    #[arg(long)]
    json: bool,
    /// The device to run on: `cpu`, or `cuda` / `cuda:N` (a build without the `cuda` feature, a
    /// machine without a driver or without that device each says so).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// How the base's matrices are held in memory (LoRA trains on each; full-parameter
    /// training needs `f32`).
    #[arg(long, value_enum, default_value = "f32")]
    base_format: BaseFormat,
}

#[derive(Serialize)]
struct SampleJson {
    text: String,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    stop_reason: StopReason,
}

pub fn run(args: SampleArgs) -> anyhow::Result<()> {
    args.device.check()?;
    let Model {
        config,
        transformer,
        tokenizer,
        chat_template,
        ..
    } = Model::load_as(&args.model, args.base_format)?;
    let prompt = if args.chat {
        let template = chat_template
            .with_context(|| format!("{} has no chat template", args.model.display()))?;
        let text = template.render(
            &[ChatMessage {
                role: "user".into(),
                content: args.prompt.clone(),
            }],
            true,
        )?;
        tokenizer.encode_without_special_tokens(&text)?
    } else {
        tokenizer.encode(&args.prompt)?
    };
    let registry = AdapterRegistry::new(Arc::new(transformer));
    let version = args
        .adapter
        .as_ref()
        .map(|dir| -> anyhow::Result<_> {
            let loaded = crate::train::checkpoint::load(dir, &config, candle_core::DType::F32)?;
            Ok(registry.publish("adapter", &loaded.adapter)?)
        })
        .transpose()?;
    let tokenizer = Arc::new(tokenizer);
    let positions = (prompt.len() + args.max_tokens) * args.n.max(1);
    let device = DeviceOptions {
        device: args.device,
        ..DeviceOptions::cpu()
    };
    let sampler = device.start_sampler(
        &registry,
        Some(Arc::clone(&tokenizer)),
        config.eos_token_ids.clone(),
        EngineConfig {
            kv_budget_positions: positions,
            prefix_cache_positions: 0,
        },
    )?;
    let mut request = SampleRequest::new(
        prompt,
        SamplingParams {
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
            stop: None,
            num_samples: args.n,
        },
    );
    request.policy = version.as_ref().map(|v| PolicyRef {
        name: v.name.clone(),
        version: Some(v.version),
    });
    let output = futures::executor::block_on(sampler.sample(request))?;
    let samples = output
        .samples
        .into_iter()
        .map(|s| {
            Ok(SampleJson {
                text: tokenizer.decode_text(&s.tokens)?,
                tokens: s.tokens,
                logprobs: s.logprobs,
                stop_reason: s.stop_reason,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "samples": samples }))?
        );
    } else {
        for (i, sample) in samples.iter().enumerate() {
            let reason = match sample.stop_reason {
                StopReason::Stop => "stop",
                StopReason::Length => "length",
            };
            println!("--- sample {i} ({} tokens, {reason})", sample.tokens.len());
            println!("{}", sample.text);
        }
    }
    Ok(())
}
