//! `opentinker model init-tiny | logprobs | merge`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::DType;
use clap::Subcommand;
use serde::Serialize;

use std::sync::Arc;

use crate::lora::{AdapterRegistry, PolicyVersion};
use crate::model::{Architecture, Device, Model};
use crate::model::{TinyShape, init_tiny};
use crate::sample::{EngineConfig, PolicyRef, PromptAsks, SampleRequest, SamplingParams};
use crate::service::DeviceOptions;

/// Each token's logprob given the ones before it (`None` for the first), under `registry`'s
/// base or `version`, on `device`: the sampling engine's prompt logprobs.
fn score(
    registry: &Arc<AdapterRegistry>,
    tokens: &[u32],
    version: Option<&PolicyVersion>,
    device: Device,
) -> anyhow::Result<Vec<Option<f32>>> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let options = DeviceOptions {
        device,
        ..DeviceOptions::cpu()
    };
    let sampler = options.start_sampler(
        registry,
        None,
        Vec::new(),
        EngineConfig {
            kv_budget_positions: tokens.len() + 1,
            prefix_cache_positions: 0,
        },
    )?;
    let mut request = SampleRequest::new(
        tokens.to_vec(),
        SamplingParams {
            max_tokens: 1,
            temperature: 0.0,
            ..SamplingParams::default()
        },
    );
    request.policy = version.map(|v| PolicyRef {
        name: v.name.clone(),
        version: Some(v.version),
    });
    request.prompt_asks = PromptAsks {
        logprobs: true,
        ..PromptAsks::default()
    };
    let output = futures::executor::block_on(sampler.sample(request))?;
    output
        .prompt
        .logprobs
        .context("the sampler answered no prompt logprobs")
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a model directory generated from a seed: random weights, a small byte-level
    /// tokenizer and a ChatML template (nothing is downloaded).
    InitTiny {
        dir: PathBuf,
        #[arg(long, value_enum, default_value = "tiny")]
        shape: TinyShape,
        #[arg(long, value_enum, default_value = "qwen2")]
        arch: Architecture,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Print each token of TEXT with its logprob under the model.
    Logprobs {
        #[arg(long)]
        model: PathBuf,
        /// A LoRA adapter checkpoint (PEFT format) to apply.
        #[arg(long)]
        adapter: Option<PathBuf>,
        #[arg(long)]
        text: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The device to run on: `cpu`, or `cuda` / `cuda:N` (a build without the `cuda`
        /// feature, a machine without a driver or without that device each says so).
        #[arg(long, default_value = "cpu")]
        device: Device,
    },
    /// Write a model directory with a LoRA adapter (PEFT format) merged into the base's weights:
    /// it computes what the base computes with the adapter, and loads wherever a Hugging Face
    /// model does (`transformers`, vLLM, `opentinker serve --model`).
    Merge {
        /// The base model directory.
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        adapter: PathBuf,
        /// The new model directory (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a GGUF file as a Hugging Face model directory: its weights dequantized to f32 in
    /// `model.safetensors`, and `config.json`, `tokenizer.json`, `tokenizer_config.json` and
    /// `chat_template.jinja` from its metadata. `transformers` and PEFT load it as they load
    /// the GGUF.
    Export {
        /// The GGUF file.
        file: PathBuf,
        /// The new model directory (must not exist).
        out: PathBuf,
    },
}

#[derive(Serialize)]
struct TokenLogprob {
    token: u32,
    text: String,
    logprob: Option<f32>,
}

pub fn run(command: ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::InitTiny {
            dir,
            shape,
            arch,
            seed,
        } => {
            init_tiny(&dir, shape, arch, seed)?;
            println!("{}", dir.display());
            Ok(())
        }
        ModelCommand::Logprobs {
            model,
            adapter,
            text,
            json,
            device,
        } => {
            device.check()?;
            let Model {
                config,
                transformer,
                tokenizer,
                ..
            } = Model::load(&model)?;
            let tokens = tokenizer.encode(&text)?;
            let registry = AdapterRegistry::new(Arc::new(transformer));
            let version = adapter
                .map(|dir| -> anyhow::Result<_> {
                    let loaded = crate::train::checkpoint::load(&dir, &config, DType::F32)?;
                    Ok(registry.publish("adapter", &loaded.adapter)?)
                })
                .transpose()?;
            let logprobs = score(&registry, &tokens, version.as_deref(), device)?;
            let rows = tokens
                .iter()
                .zip(logprobs)
                .map(|(&token, logprob)| {
                    Ok(TokenLogprob {
                        token,
                        text: tokenizer.piece(token)?,
                        logprob,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&serde_json::json!({ "tokens": rows }))?
                );
            } else {
                for row in rows {
                    let logprob = row.logprob.map_or("-".to_string(), |l| format!("{l:.4}"));
                    println!("{:>8} {:>10} {:?}", row.token, logprob, row.text);
                }
            }
            Ok(())
        }
        ModelCommand::Merge {
            model,
            adapter,
            out,
        } => {
            refuse_existing(&out)?;
            let base = Model::load(&model)?;
            let loaded = crate::train::checkpoint::load(&adapter, &base.config, DType::F32)?;
            let merged =
                crate::lora::merge(&base.transformer, &loaded.adapter).with_context(|| {
                    format!("merging {} into {}", adapter.display(), model.display())
                })?;
            crate::model::save_model_dir(&merged, &model, &out)?;
            println!("{}", out.display());
            Ok(())
        }
        ModelCommand::Export { file, out } => {
            refuse_existing(&out)?;
            anyhow::ensure!(
                crate::model::is_gguf(&file),
                "{} is not a GGUF file (a .gguf file to export)",
                file.display()
            );
            let model = Model::load(&file)?;
            crate::model::save_model_dir(&model.transformer, &file, &out)?;
            println!("{}", out.display());
            Ok(())
        }
    }
}

/// A command that writes a new model directory never writes over an existing one.
fn refuse_existing(out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !out.exists(),
        "{} exists: give a new folder for the model",
        out.display()
    );
    Ok(())
}
