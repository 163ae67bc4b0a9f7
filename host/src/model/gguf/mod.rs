//! GGUF files (llama.cpp's format, what llama.cpp and Ollama users hold): one file with the
//! weights, often quantized, and everything else as metadata: the model's shape, the tokenizer's
//! vocabulary and merges, its special tokens and the chat template.
//!
//! A GGUF is read into the same parts as a Hugging Face directory, so everything after loading
//! is one path: [`GgufFile::open`] reads the header (candle-core's reader, which bounds every
//! count and length by the file); [`GgufFile::config`] is the metadata as a `config.json` would
//! state it, read by the same [`ModelConfig::from_json`](super::ModelConfig::from_json);
//! [`GgufFile::tensors`] dequantizes every tensor to f32 under its Hugging Face name (llama.cpp's
//! row order of Llama's query and key projections undone); [`GgufFile::tokenizer`] builds the
//! tokenizer the metadata describes, as `transformers` builds it from the same file (the
//! reference the fixtures hold us to); [`GgufFile::chat_template`] compiles the template;
//! [`GgufFile::hf_files`] writes the same parts as a Hugging Face directory's files (what
//! `opentinker model export` and a merge or full-parameter save onto a GGUF base write).
//!
//! What the reader does not implement is refused by name before anything runs: another
//! architecture, a tensor it does not know, a tokenizer model other than byte-level BPE, a RoPE
//! scaling.

mod config;
mod tensors;
mod tokenizer;

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use candle_core::quantized::gguf_file::{Content, Value};

use crate::text::{ChatTemplate, Tokenizer};

/// What is wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}: metadata `{key}` is missing or not {expected}")]
    Metadata {
        path: PathBuf,
        key: String,
        expected: &'static str,
    },
    #[error("{path}: {what} is not supported{known}")]
    Unsupported {
        path: PathBuf,
        what: String,
        known: String,
    },
}

impl GgufError {
    /// The kind of the failure, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            GgufError::Read { .. } => "gguf_read",
            GgufError::Metadata { .. } => "gguf_metadata",
            GgufError::Unsupported { .. } => "gguf_unsupported",
        }
    }
}

/// Whether `path` names a GGUF file (by its extension, as every tool names them).
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && path.is_file()
}

/// An open GGUF file: its header read, its tensors still on disk.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
}

impl GgufFile {
    /// Read the header of `path`; the tensors are read when asked for.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path).map_err(|e| read_error(path, e))?;
        let file_size = file.metadata().map_err(|e| read_error(path, e))?.len();
        let content = Content::read(&mut BufReader::new(file)).map_err(|e| read_error(path, e))?;
        let gguf = GgufFile {
            path: path.to_path_buf(),
            content,
        };
        // Refuse what cannot be served before anything is read or built.
        config::architecture(&gguf)?;
        tensors::check_tensors(&gguf, file_size)?;
        Ok(gguf)
    }

    /// The model's shape as a Hugging Face `config.json` states it.
    pub fn config(&self) -> Result<serde_json::Value, GgufError> {
        config::hf_config(self)
    }

    /// Every tensor, dequantized to f32, by its Hugging Face name; Gemma's norms as the factor
    /// `1 + w` the file stores (as a transformer holds them), not as a Hugging Face file's `w`.
    pub fn tensors(&self) -> Result<HashMap<String, Tensor>, GgufError> {
        tensors::read_all(self)
    }

    /// The tokenizer the metadata describes.
    pub fn tokenizer(&self) -> Result<Tokenizer, GgufError> {
        tokenizer::build(self)
    }

    /// The chat template (`tokenizer.chat_template`), `None` where the file has none.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, GgufError> {
        let Some(source) = self.string("tokenizer.chat_template") else {
            return Ok(None);
        };
        let bos = self.special_token("tokenizer.ggml.bos_token_id")?;
        let eos = self.special_token("tokenizer.ggml.eos_token_id")?;
        ChatTemplate::new(source, &bos, &eos)
            .map(Some)
            .map_err(|e| read_error(&self.path, format!("chat template: {e}")))
    }

    /// The files of the Hugging Face model directory the metadata describes, but its weights:
    /// `config.json`, `tokenizer.json`, `tokenizer_config.json` (the special tokens and the
    /// context length) and `chat_template.jinja` where the file has a template. What
    /// `transformers` needs to load the directory as it loads the GGUF.
    pub fn hf_files(&self) -> Result<Vec<(&'static str, Vec<u8>)>, GgufError> {
        let json = |value: &serde_json::Value| {
            serde_json::to_vec_pretty(value).map_err(|e| read_error(&self.path, e))
        };
        let config = self.config()?;
        let mut tokenizer_config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": false,
            "model_max_length": config["max_position_embeddings"],
        });
        for (name, key) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("unk_token", "tokenizer.ggml.unknown_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ] {
            let token = self.special_token(key)?;
            if !token.is_empty() {
                tokenizer_config[name] = token.into();
            }
        }
        let mut files = vec![
            ("config.json", json(&config)?),
            ("tokenizer.json", json(&tokenizer::tokenizer_json(self)?)?),
            ("tokenizer_config.json", json(&tokenizer_config)?),
        ];
        if let Some(template) = self.string("tokenizer.chat_template") {
            files.push(("chat_template.jinja", template.as_bytes().to_vec()));
        }
        Ok(files)
    }

    /// The text of the special token whose id is at metadata `key` (empty where there is none).
    fn special_token(&self, key: &str) -> Result<String, GgufError> {
        let Some(id) = self.integer(key) else {
            return Ok(String::new());
        };
        let tokens = self.strings("tokenizer.ggml.tokens")?;
        usize::try_from(id)
            .ok()
            .and_then(|id| tokens.get(id))
            .map(|t| t.to_string())
            .ok_or_else(|| self.metadata_error(key, "a token id of the vocabulary"))
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn string(&self, key: &str) -> Option<&str> {
        self.value(key)
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
    }

    /// An integer of any width and sign.
    fn integer(&self, key: &str) -> Option<i64> {
        let value = self.value(key)?;
        value
            .to_u64()
            .ok()
            .and_then(|v| i64::try_from(v).ok())
            .or_else(|| value.to_i64().ok())
    }

    fn float(&self, key: &str) -> Option<f64> {
        let value = self.value(key)?;
        value
            .to_f64()
            .ok()
            .or_else(|| value.to_f32().ok().map(f64::from))
    }

    fn boolean(&self, key: &str) -> Option<bool> {
        self.value(key).and_then(|v| v.to_bool().ok())
    }

    /// An array of strings.
    fn strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let values = self
            .value(key)
            .and_then(|v| v.to_vec().ok())
            .ok_or_else(|| self.metadata_error(key, "an array"))?;
        values
            .iter()
            .map(|v| v.to_string().map(String::as_str))
            .collect::<Result<_, _>>()
            .map_err(|_| self.metadata_error(key, "an array of strings"))
    }

    /// An array of integers (any width), `None` where the key is absent.
    fn integers(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let Some(values) = self.value(key) else {
            return Ok(None);
        };
        let values = values
            .to_vec()
            .map_err(|_| self.metadata_error(key, "an array"))?;
        values
            .iter()
            .map(|v| {
                v.to_i32()
                    .map(i64::from)
                    .or_else(|_| v.to_u32().map(i64::from))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(|_| self.metadata_error(key, "an array of integers"))
    }

    fn metadata_error(&self, key: &str, expected: &'static str) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
        }
    }

    fn unsupported(&self, what: impl Into<String>, known: &[&str]) -> GgufError {
        GgufError::Unsupported {
            path: self.path.clone(),
            what: what.into(),
            known: match known.is_empty() {
                true => String::new(),
                false => format!(" (supported: {})", known.join(", ")),
            },
        }
    }
}

fn read_error(path: &Path, error: impl std::fmt::Display) -> GgufError {
    GgufError::Read {
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}
