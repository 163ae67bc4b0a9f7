//! `opentinker model init-tiny | logprobs | merge`.

use std::path::PathBuf;

use anyhow::Context;
use candle_core::DType;
use clap::Subcommand;
use serde::Serialize;

use crate::model::tiny::{TinyShape, init_tiny};
use crate::model::{Architecture, Device, Model};

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a model directory generated from a seed: random weights, a small byte-level
    /// tokenizer and a ChatML template (nothing is downloaded).
    InitTiny {
        dir: PathBuf,
        #[arg(long, value_enum, default_value = "tiny")]
        shape: TinyShape,
        #[arg(long, value_enum, default_value = "qwen2")]
        arch: ArchArg,
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
        /// The device to run on: `cpu`, or `cuda` / `cuda:N` (refused, naming why, until the
        /// engines run there: a build without the `cuda` feature, a machine without a driver or
        /// that device, or the engine not on CUDA yet).
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
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ArchArg {
    Qwen2,
    Llama,
    Qwen3,
}

impl From<ArchArg> for Architecture {
    fn from(arch: ArchArg) -> Self {
        match arch {
            ArchArg::Qwen2 => Architecture::Qwen2,
            ArchArg::Llama => Architecture::Llama,
            ArchArg::Qwen3 => Architecture::Qwen3,
        }
    }
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
            init_tiny(&dir, shape, arch.into(), seed)?;
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
            device.cpu_only("scoring")?;
            let model = Model::load(&model)?;
            let adapter = adapter
                .map(|dir| crate::train::checkpoint::load(&dir, &model.config, DType::F32))
                .transpose()?
                .map(|loaded| loaded.adapter);
            let tokens = model.tokenizer.encode(&text)?;
            let logprobs = crate::lora::token_logprobs(&model, &tokens, adapter.as_ref())?;
            let rows = tokens
                .iter()
                .zip(logprobs)
                .map(|(&token, logprob)| {
                    Ok(TokenLogprob {
                        token,
                        text: model.tokenizer.piece(token)?,
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
            anyhow::ensure!(
                !out.exists(),
                "{} exists: give a new folder for the merged model",
                out.display()
            );
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
    }
}
