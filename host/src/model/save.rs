//! Writing a model directory: the weights of a [`Transformer`] (trained in full, or with an
//! adapter merged in) beside the other files of the model it came from (tokenizer, chat
//! template, generation config; a GGUF file's metadata as those files), so that any loader of
//! Hugging Face models reads it as it reads the original.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use super::gguf::{self, GgufFile};
use super::transformer::{Transformer, WeightsError};

/// Write `transformer` as the model directory `out`, whole or not at all (staged beside it and
/// renamed): see [`write_model_files`].
pub fn save_model_dir(
    transformer: &Transformer,
    source: &Path,
    out: &Path,
) -> Result<(), WeightsError> {
    crate::store::write_atomic_dir(out, |temp| write_model_files(transformer, source, temp))
        .map_err(|source| WeightsError::Write {
            path: out.display().to_string(),
            source,
        })
}

/// Write `transformer`'s files into the folder `into` (made if missing): the files of the model
/// `source` but its weights (a model directory's files but `model.safetensors` or its shards;
/// a GGUF file's as the GGUF reader writes them), `config.json` with
/// `tie_word_embeddings` as the transformer has it (merging into the unembedding unties it),
/// and the weights by their Hugging Face names in one `model.safetensors`.
pub fn write_model_files(
    transformer: &Transformer,
    source: &Path,
    into: &Path,
) -> std::io::Result<()> {
    std::fs::create_dir_all(into)?;
    for (name, bytes) in source_files(source)? {
        let bytes = match name.as_str() {
            "config.json" => {
                let mut config: serde_json::Value = serde_json::from_slice(&bytes)?;
                config["tie_word_embeddings"] = transformer.config.tie_word_embeddings.into();
                serde_json::to_vec_pretty(&config)?
            }
            _ => bytes,
        };
        std::fs::write(into.join(name), bytes)?;
    }
    let tensors: HashMap<String, Tensor> = transformer
        .hf_weights()
        .map_err(std::io::Error::other)?
        .into_iter()
        .collect();
    candle_core::safetensors::save(&tensors, into.join("model.safetensors"))
        .map_err(std::io::Error::other)
}

/// The files of the model `source` but its weights, by name.
fn source_files(source: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    if gguf::is_gguf(source) {
        let files = GgufFile::open(source)
            .and_then(|file| file.hf_files())
            .map_err(std::io::Error::other)?;
        return Ok(files
            .into_iter()
            .map(|(name, bytes)| (name.to_string(), bytes))
            .collect());
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(source)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let weights = name.starts_with("model.safetensors") || name.starts_with("model-");
        if path.is_file() && !weights {
            files.push((name.to_string(), std::fs::read(&path)?));
        }
    }
    Ok(files)
}
