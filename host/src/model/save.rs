//! Writing a model directory: the weights of a [`Transformer`] (trained in full, or with an
//! adapter merged in) beside the other files of the directory it came from (tokenizer, chat
//! template, generation config), so that any loader of Hugging Face models reads it as it reads
//! the original.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

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
/// directory `source` but its weights (`model.safetensors`, or shards), `config.json` as
/// `source`'s with `tie_word_embeddings` as the transformer has it (merging into the
/// unembedding unties it), and the weights by their Hugging Face names in one
/// `model.safetensors`.
pub fn write_model_files(
    transformer: &Transformer,
    source: &Path,
    into: &Path,
) -> std::io::Result<()> {
    std::fs::create_dir_all(into)?;
    for entry in std::fs::read_dir(source)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let weights = name.starts_with("model.safetensors") || name.starts_with("model-");
        if !path.is_file() || weights {
            continue;
        }
        if name == "config.json" {
            let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
            config["tie_word_embeddings"] = transformer.config.tie_word_embeddings.into();
            std::fs::write(
                into.join("config.json"),
                serde_json::to_vec_pretty(&config)?,
            )?;
        } else {
            std::fs::copy(&path, into.join(&*name))?;
        }
    }
    let tensors: HashMap<String, Tensor> = transformer.named_weights().into_iter().collect();
    candle_core::safetensors::save(&tensors, into.join("model.safetensors"))
        .map_err(std::io::Error::other)
}
