//! The base model: what a model is made of, loaded once and shared by every engine.
//!
//! A [`Model`] is loaded from a Hugging Face model directory (`config.json`, safetensors
//! weights, `tokenizer.json`, a chat template) or from one GGUF file ([`is_gguf`]: the same
//! parts from the file's metadata and its quantized tensors, dequantized on load), or made by
//! [`init_tiny`] (the generated tiny preset the tests and examples train). Its parts:
//!
//! - [`ModelConfig`]: the shape and the [`Architecture`], whose [`Features`] (biases, norms,
//!   activation, local attention windows, soft-capping...) are data that the one layer
//!   definition reads: an architecture is a table entry, not a code path.
//! - [`Transformer`]: the weights as candle tensors; [`CpuWeights`] views them for the CPU
//!   kernels, `GpuWeights` uploads them (the `cuda` feature).
//! - [`layers`]: the transformer's layers written once over the kernels' op boundary
//!   (`opentinker-kernels`), which every forward and backward (sampling, training, scoring)
//!   runs, with the LoRA adapters applied at each [`Site`].
//!
//! [`save_model_dir`] writes a model (a merged adapter, an exported GGUF file) back as a
//! directory that `transformers` and PEFT load.

mod config;
mod cpu_view;
mod device;
mod gguf;
#[cfg(feature = "cuda")]
mod gpu_weights;
pub mod layers;
mod save;
mod site;
mod tiny;
mod transformer;

use std::path::{Path, PathBuf};

pub use config::{
    Activation, Architecture, ConfigError, Features, LocalAttention, ModelConfig, OutOfVocabulary,
};
pub use cpu_view::{CpuWeights, TensorView, sequence_logits};
pub use device::{Device, DeviceError, DeviceErrorKind};
pub use gguf::{GgufError, is_gguf};
#[cfg(feature = "cuda")]
pub use gpu_weights::{GpuWeights, GpuWeightsError};
pub use opentinker_kernels::BlockFormat;
pub use save::{save_model_dir, write_model_files};
pub use site::{Site, Target};
pub use tiny::{CHATML_TEMPLATE, TOKENIZER_VOCAB, TinyShape, init_tiny, tiny_config};
pub use transformer::{BaseFormat, Matrix, Transformer, WeightsError, target_logprobs};

use crate::text::{ChatTemplate, Tokenizer, TokenizerError, special_token};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Weights(#[from] transformer::WeightsError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("chat template of {path}: {message}")]
    ChatTemplate { path: String, message: String },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// A loaded model directory (or GGUF file).
#[derive(Debug)]
pub struct Model {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub transformer: Transformer,
    pub tokenizer: Tokenizer,
    /// `None` when the directory has no chat template.
    pub chat_template: Option<ChatTemplate>,
}

impl Model {
    /// Load `config.json`, the weights, `tokenizer.json` and the chat template of `dir`, or the
    /// same parts of a GGUF file.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        Self::load_as(dir, BaseFormat::F32)
    }

    /// [`Model::load`] with the base held as `format`: each matrix is converted as it is read.
    pub fn load_as(dir: &Path, format: BaseFormat) -> Result<Self, ModelError> {
        if gguf::is_gguf(dir) {
            let file = gguf::GgufFile::open(dir)?;
            let config = ModelConfig::from_json(&file.config()?)?;
            let mut tensors = file.tensors()?;
            let transformer = Transformer::from_source(config.clone(), format, |name, _| {
                Ok(tensors.remove(name))
            })?;
            return Ok(Model {
                dir: dir.to_path_buf(),
                config,
                transformer,
                tokenizer: file.tokenizer()?,
                chat_template: file.chat_template()?,
            });
        }
        let config = ModelConfig::from_dir(dir)?;
        let transformer = Transformer::load(config.clone(), dir, format)?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let chat_template = load_chat_template(dir)?;
        Ok(Model {
            dir: dir.to_path_buf(),
            config,
            transformer,
            tokenizer,
            chat_template,
        })
    }
}

/// The tokenizer and chat template of a model directory, without its weights (what a client of
/// a remote server renders with).
pub fn load_text(dir: &Path) -> Result<(Tokenizer, Option<ChatTemplate>), ModelError> {
    if gguf::is_gguf(dir) {
        let file = gguf::GgufFile::open(dir)?;
        return Ok((file.tokenizer()?, file.chat_template()?));
    }
    let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    Ok((tokenizer, load_chat_template(dir)?))
}

/// The chat template of a model directory: `chat_template.jinja`, else `chat_template` of
/// `tokenizer_config.json` (a string, or a list of named templates of which `default` is used).
fn load_chat_template(dir: &Path) -> Result<Option<ChatTemplate>, ModelError> {
    let config_path = dir.join("tokenizer_config.json");
    let config: serde_json::Value = std::fs::read_to_string(&config_path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let jinja_path = dir.join("chat_template.jinja");
    let source = match std::fs::read_to_string(&jinja_path) {
        Ok(source) => Some(source),
        Err(_) => match config.get("chat_template") {
            Some(serde_json::Value::String(source)) => Some(source.clone()),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str().map(String::from)),
            _ => None,
        },
    };
    let Some(source) = source else {
        return Ok(None);
    };
    let bos = special_token(&config, "bos_token").unwrap_or_default();
    let eos = special_token(&config, "eos_token").unwrap_or_default();
    ChatTemplate::new(&source, &bos, &eos)
        .map(Some)
        .map_err(|e| ModelError::ChatTemplate {
            path: dir.display().to_string(),
            message: e.to_string(),
        })
}
