//! `opentinker model init-tiny | logprobs`.

use std::path::PathBuf;

use clap::Subcommand;
use serde::Serialize;

use crate::model::tiny::{TinyShape, init_tiny};
use crate::model::{Architecture, Model};

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
        } => {
            let model = Model::load(&model)?;
            let adapter = adapter
                .map(|dir| {
                    crate::train::checkpoint::load(&dir, &model.config, candle_core::DType::F32)
                })
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
    }
}
