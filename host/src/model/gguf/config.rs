//! A GGUF's metadata as the `config.json` of the same model: llama.cpp's keys are
//! `<architecture>.<name>`, and the file lists an output projection only where it is not the
//! embedding matrix.

use serde_json::{Value, json};

use super::{GgufError, GgufFile};
use crate::model::Architecture;
use crate::model::config::SLIDING_WINDOW_PATTERN;

/// The file's architecture (llama.cpp's `general.architecture` names the families as
/// `config.json`'s `model_type` does), refused unless we run it, or if it asks for a feature
/// the transformer does not implement.
pub(super) fn architecture(gguf: &GgufFile) -> Result<(&str, Architecture), GgufError> {
    let name = gguf
        .string("general.architecture")
        .ok_or_else(|| gguf.metadata_error("general.architecture", "a string"))?;
    let Some(architecture) = Architecture::from_gguf_name(name) else {
        let known = Architecture::ALL.map(Architecture::gguf_name);
        return Err(gguf.unsupported(format!("architecture {name:?}"), &known));
    };
    if let Some(scaling) = gguf.string(&format!("{name}.rope.scaling.type"))
        && scaling != "none"
    {
        return Err(gguf.unsupported(format!("RoPE scaling {scaling:?}"), &[]));
    }
    if gguf.content.tensor_infos.contains_key("rope_freqs.weight") {
        return Err(gguf.unsupported("RoPE frequency factors (`rope_freqs.weight`)", &[]));
    }
    Ok((name, architecture))
}

/// What a Gemma 3 file leaves to `transformers`' defaults, written as it writes them: the
/// sliding window and the local layers (five in six), their RoPE base, the activation and the
/// attention scale (`query_pre_attn_scalar`, 256 whatever the file).
fn gemma3_config(gguf: &GgufFile, config: &mut Value) -> Result<(), GgufError> {
    let window = gguf
        .integer("gemma3.attention.sliding_window")
        .filter(|&w| w > 0)
        .ok_or_else(|| {
            gguf.metadata_error("gemma3.attention.sliding_window", "a positive integer")
        })?;
    let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
    let layer_types: Vec<&str> = (0..layers)
        .map(|i| match (i + 1) % SLIDING_WINDOW_PATTERN {
            0 => "full_attention",
            _ => "sliding_attention",
        })
        .collect();
    let object = config
        .as_object_mut()
        .ok_or_else(|| gguf.metadata_error("general.architecture", "a model's metadata"))?;
    let global_theta = object.remove("rope_theta");
    let activation = Architecture::Gemma3.activation_name();
    object.insert("hidden_activation".into(), json!(activation));
    object.insert("sliding_window".into(), json!(window));
    object.insert("layer_types".into(), json!(layer_types));
    object.insert("query_pre_attn_scalar".into(), json!(256));
    object.insert(
        "rope_parameters".into(),
        json!({
            "full_attention": {"rope_type": "default", "rope_theta": global_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }),
    );
    Ok(())
}

/// The `config.json` the metadata states.
pub(super) fn hf_config(gguf: &GgufFile) -> Result<Value, GgufError> {
    let (arch, architecture) = architecture(gguf)?;
    let key = |name: &str| format!("{arch}.{name}");
    let count = |name: &str| -> Result<i64, GgufError> {
        gguf.integer(&key(name))
            .filter(|&v| v > 0)
            .ok_or_else(|| gguf.metadata_error(&key(name), "a positive integer"))
    };
    let heads = count("attention.head_count")?;
    // A per-layer list of key/value heads (some files have one) is not this transformer's shape.
    let kv_heads = match gguf.value(&key("attention.head_count_kv")) {
        None => heads,
        Some(_) => count("attention.head_count_kv")?,
    };
    let vocab = match gguf.integer(&key("vocab_size")) {
        Some(size) => size,
        None => gguf.strings("tokenizer.ggml.tokens")?.len() as i64,
    };
    let mut config = json!({
        "architectures": [architecture.class_name()],
        "model_type": architecture.model_type(),
        "hidden_size": count("embedding_length")?,
        "intermediate_size": count("feed_forward_length")?,
        "num_hidden_layers": count("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": count("context_length")?,
        "rms_norm_eps": gguf.float(&key("attention.layer_norm_rms_epsilon"))
            .ok_or_else(|| gguf.metadata_error(&key("attention.layer_norm_rms_epsilon"), "a number"))?,
        "rope_theta": gguf.float(&key("rope.freq_base")).unwrap_or(10_000.0),
        "tie_word_embeddings": !gguf.content.tensor_infos.contains_key("output.weight"),
        "attention_bias": arch != "qwen2" && gguf.content.tensor_infos.contains_key("blk.0.attn_output.bias"),
    });
    if let Some(head_dim) = gguf.integer(&key("attention.key_length")) {
        config["head_dim"] = json!(head_dim);
    }
    if architecture == Architecture::Gemma3 {
        gemma3_config(gguf, &mut config)?;
    }
    for (hf, gguf_key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ] {
        if let Some(id) = gguf.integer(gguf_key) {
            config[hf] = json!(id);
        }
    }
    Ok(config)
}
