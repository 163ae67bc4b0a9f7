//! A Hugging Face `config.json` of the Llama, Qwen2, Qwen3 and Gemma 3 families, read into the
//! one shape our transformer needs; configurations we do not support are refused by name.
//!
//! An architecture is data: [`Architecture`] is the one list of the families' names, and
//! [`Architecture::features`] the one place that says what sets each family's layers apart
//! ([`Features`]: biases, query/key norms, the norms around each block, the activation, the
//! embedding's scale); a config's [`LocalAttention`] says which layers see a sliding window.
//! Everything after this module (the layers, the weight readers, the memory counts) reads the
//! [`Features`] of a [`ModelConfig`], never the name; so a new family is a new variant here,
//! its features, and whatever new feature its layers need.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

pub use opentinker_kernels::Activation;

/// The families we run, by the `model_type` of their `config.json` (also a GGUF's
/// `general.architecture`, a job file's `init_tiny.arch` and `model init-tiny --arch`). They
/// differ in their [`Features`], not in structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2/3 (and SmolLM2): no biases.
    Llama,
    /// Qwen2 / Qwen2.5: biases on the q, k and v projections.
    Qwen2,
    /// Qwen3: no biases, RMSNorm of each head's queries and keys.
    Qwen3,
    /// Gemma 3 (its text model): query/key norms, four norms per layer in the `1 + w` form,
    /// a GELU (tanh) gate, scaled embeddings, local sliding-window layers between global ones.
    #[serde(rename = "gemma3_text")]
    #[value(name = "gemma3_text")]
    Gemma3,
}

impl Architecture {
    pub const ALL: [Architecture; 4] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
    ];

    /// The name of `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3_text",
        }
    }

    /// The name of a GGUF file's `general.architecture` (llama.cpp's): the `model_type` but for
    /// Gemma 3, whose files say `gemma3` for the text model.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Gemma3 => "gemma3",
            other => other.model_type(),
        }
    }

    /// The architecture of a GGUF's `general.architecture`, `None` for one we do not run.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|arch| arch.gguf_name() == name)
    }

    /// The `transformers` class a `config.json`'s `architectures` names.
    pub fn class_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// The architecture of a `model_type`, `None` for one we do not run.
    pub fn from_model_type(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|arch| arch.model_type() == name)
    }

    /// The `model_type`s we run, for messages that list them.
    pub fn names() -> String {
        Self::ALL.map(Architecture::model_type).join(", ")
    }

    /// The features of this family's layers, where `config.json`'s `attention_bias` and
    /// `mlp_bias` say whether its projections have biases (Qwen2's q, k and v always do).
    pub fn features(self, attention_bias: bool, mlp_bias: bool) -> Features {
        let llama = Features {
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            mlp_bias,
            qk_norm: false,
            block_output_norms: false,
            activation: Activation::Silu,
            scaled_embeddings: false,
            unit_offset_norms: false,
        };
        match self {
            Architecture::Llama => llama,
            Architecture::Qwen2 => Features {
                qkv_bias: true,
                o_bias: false,
                ..llama
            },
            Architecture::Qwen3 => Features {
                qk_norm: true,
                ..llama
            },
            Architecture::Gemma3 => Features {
                qk_norm: true,
                block_output_norms: true,
                activation: Activation::GeluTanh,
                scaled_embeddings: true,
                unit_offset_norms: true,
                ..llama
            },
        }
    }

    /// The activation `config.json` must name (`hidden_act` or `hidden_activation`), as
    /// `transformers` spells it.
    pub fn activation_name(self) -> &'static str {
        match self.features(false, false).activation {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
        }
    }
}

/// What sets one family's layers apart from another's: the one description that the layer
/// definition, the weight readers and writers and the memory counts read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// A bias on the attention's output projection.
    pub o_bias: bool,
    /// Biases on the MLP's projections.
    pub mlp_bias: bool,
    /// RMSNorm of each head's queries and keys, before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of each block's output before it joins the residual stream (Gemma's four norms
    /// per layer; the MLP's input norm is then `pre_feedforward_layernorm`).
    pub block_output_norms: bool,
    /// The MLP gate's activation.
    pub activation: Activation,
    /// Embeddings multiplied by the square root of the width (the tied unembedding is not).
    pub scaled_embeddings: bool,
    /// Norm weights applied as `1 + w` (Gemma). The engine holds the factor `1 + w` itself, as
    /// llama.cpp's files store it, so its layers run one RMSNorm; Hugging Face files store `w`,
    /// converted where they are read and written ([`Features::norm_offset`]).
    pub unit_offset_norms: bool,
}

impl Features {
    /// The Hugging Face names of a layer's norms after `model.layers.N.`: the MLP's input norm,
    /// and the norms of the attention's and the MLP's outputs where the model has them (Gemma
    /// calls its MLP's input norm `pre_feedforward_layernorm`, and its attention's output norm
    /// what Llama calls its MLP's input norm).
    pub fn layer_norm_names(&self) -> (&'static str, Option<[&'static str; 2]>) {
        match self.block_output_norms {
            true => (
                "pre_feedforward_layernorm",
                Some(["post_attention_layernorm", "post_feedforward_layernorm"]),
            ),
            false => ("post_attention_layernorm", None),
        }
    }

    /// The offset a Hugging Face file's value of weight `name` takes when read (its opposite when
    /// written): 1 for Gemma's norms, 0 otherwise.
    pub fn norm_offset(&self, name: &str) -> f64 {
        match self.unit_offset_norms && name.ends_with("norm.weight") {
            true => 1.0,
            false => 0.0,
        }
    }
}

/// Gemma 3's layers come in runs of this many, the last of each global and the others local,
/// where a config does not list its `layer_types` (`transformers`' default).
pub const SLIDING_WINDOW_PATTERN: usize = 6;

/// Which layers attend over a sliding window of the latest positions, and their RoPE base
/// (Gemma 3: five local layers to each global one).
#[derive(Clone, Debug, PartialEq)]
pub struct LocalAttention {
    /// Positions a local layer's query sees: its own and the `window - 1` before it.
    pub window: usize,
    /// RoPE's base in the local layers (the global ones use [`ModelConfig::rope_theta`]).
    pub rope_theta: f64,
    /// For each layer, whether it is local.
    pub layers: Vec<bool>,
}

/// How RoPE frequencies are scaled for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3's frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Everything the transformer needs to know about a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub features: Features,
    /// Sliding-window layers, where the model has them.
    pub local_attention: Option<LocalAttention>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("config.json: missing or invalid `{0}`")]
    Missing(&'static str),
    #[error("config.json: model type {0:?} is not supported (supported: {names})", names = Architecture::names())]
    UnsupportedArchitecture(String),
    #[error("config.json: {0} is not supported")]
    Unsupported(String),
}

fn get_usize(config: &Value, key: &'static str) -> Result<usize, ConfigError> {
    config
        .get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or(ConfigError::Missing(key))
}

fn token_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|v| v as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// A token id the model's vocabulary does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("token id {token} is outside the vocabulary of {vocab}")]
pub struct OutOfVocabulary {
    pub token: u32,
    pub vocab: usize,
}

impl ModelConfig {
    /// Refuse the first of `tokens` outside the vocabulary, naming it.
    pub fn check_tokens<'a>(
        &self,
        tokens: impl IntoIterator<Item = &'a u32>,
    ) -> Result<(), OutOfVocabulary> {
        let vocab = self.vocab_size;
        match tokens.into_iter().find(|&&t| t as usize >= vocab) {
            Some(&token) => Err(OutOfVocabulary { token, vocab }),
            None => Ok(()),
        }
    }

    /// Read `config.json` of a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Self::from_json(&value)?;
        // `generation_config.json`, when present, names the ids that end a generation.
        let generation = dir.join("generation_config.json");
        if let Ok(text) = std::fs::read_to_string(&generation) {
            let value: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json {
                path: generation.display().to_string(),
                source,
            })?;
            let eos = token_ids(value.get("eos_token_id"));
            if !eos.is_empty() {
                config.eos_token_ids = eos;
            }
        }
        Ok(config)
    }

    /// Interpret a parsed `config.json`.
    pub fn from_json(config: &Value) -> Result<Self, ConfigError> {
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let architecture = Architecture::from_model_type(model_type)
            .ok_or_else(|| ConfigError::UnsupportedArchitecture(model_type.to_string()))?;
        refuse_unsupported(architecture, config)?;
        let hidden_size = get_usize(config, "hidden_size")?;
        let num_heads = get_usize(config, "num_attention_heads")?;
        let num_kv_heads = config
            .get("num_key_value_heads")
            .and_then(Value::as_u64)
            .map_or(num_heads, |v| v as usize);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(ConfigError::Unsupported(format!(
                "{num_heads} attention heads over {num_kv_heads} key/value heads"
            )));
        }
        let head_dim = match config.get("head_dim").and_then(Value::as_u64) {
            Some(dim) => dim as usize,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => return Err(ConfigError::Missing("head_dim")),
        };
        // The weights' shapes are products of these: one that cannot be counted is no model.
        let vocab_size = get_usize(config, "vocab_size")?;
        let intermediate_size = get_usize(config, "intermediate_size")?;
        for (what, product) in [
            (
                "num_attention_heads x head_dim",
                num_heads.checked_mul(head_dim),
            ),
            (
                "num_key_value_heads x head_dim",
                num_kv_heads.checked_mul(head_dim),
            ),
            (
                "vocab_size x hidden_size",
                vocab_size.checked_mul(hidden_size),
            ),
            (
                "intermediate_size x hidden_size",
                intermediate_size.checked_mul(hidden_size),
            ),
        ] {
            if product.is_none() {
                return Err(ConfigError::Unsupported(format!(
                    "{what} past what a size holds"
                )));
            }
        }
        let (rope_theta, rope_scaling) = rope(config)?;
        let num_layers = get_usize(config, "num_hidden_layers")?;
        let local_attention = local_attention(architecture, config, num_layers, head_dim)?;
        let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
        Ok(ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: config
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: config
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .map_or(4096, |v| v as usize),
            tie_word_embeddings: flag("tie_word_embeddings"),
            features: architecture.features(flag("attention_bias"), flag("mlp_bias")),
            local_attention,
            bos_token_id: config
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .map(|v| v as u32),
            eos_token_ids: token_ids(config.get("eos_token_id")),
        })
    }

    /// Query heads per key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// The window of positions layer `layer` attends over (`None`: all before it).
    pub fn attention_window(&self, layer: usize) -> Option<usize> {
        let local = self.local_attention.as_ref()?;
        let is_local = local.layers.get(layer).copied().unwrap_or(false);
        is_local.then_some(local.window)
    }
}

/// Gemma 3's sliding-window layers: `layer_types` (or every layer but each
/// `sliding_window_pattern`-th, 6 by default, as `transformers` makes them), the window, and the
/// local layers' RoPE base. Its attention scale must be the head size's, as the kernels' is.
fn local_attention(
    architecture: Architecture,
    config: &Value,
    num_layers: usize,
    head_dim: usize,
) -> Result<Option<LocalAttention>, ConfigError> {
    if architecture != Architecture::Gemma3 {
        return Ok(None);
    }
    let scalar = config
        .get("query_pre_attn_scalar")
        .and_then(Value::as_f64)
        .unwrap_or(256.0);
    if scalar != head_dim as f64 {
        return Err(ConfigError::Unsupported(format!(
            "an attention scale of query_pre_attn_scalar {scalar} with head_dim {head_dim}"
        )));
    }
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if config.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ConfigError::Unsupported(format!(
                "logit soft-capping (`{key}`)"
            )));
        }
    }
    if config
        .get("use_bidirectional_attention")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Err(ConfigError::Unsupported(
            "bidirectional attention (`use_bidirectional_attention`)".into(),
        ));
    }
    let layers = match config.get("layer_types").and_then(Value::as_array) {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(ConfigError::Unsupported(format!("layer type {t}"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => {
            let pattern = ["sliding_window_pattern", "_sliding_window_pattern"]
                .iter()
                .find_map(|key| config.get(*key).and_then(Value::as_u64))
                .map_or(SLIDING_WINDOW_PATTERN, |p| p.max(1) as usize);
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    if layers.len() != num_layers {
        return Err(ConfigError::Unsupported(format!(
            "{} layer types for {num_layers} layers",
            layers.len()
        )));
    }
    let window = config
        .get("sliding_window")
        .and_then(Value::as_u64)
        .unwrap_or(4096) as usize;
    if window == 0 {
        return Err(ConfigError::Missing("sliding_window"));
    }
    let rope_theta = config
        .get("rope_parameters")
        .and_then(|p| p.get("sliding_attention"))
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| config.get("rope_local_base_freq"))
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    Ok(Some(LocalAttention {
        window,
        rope_theta,
        layers,
    }))
}

/// Refuse the features our transformer does not implement, naming them (Gemma 3's sliding
/// windows are read by [`local_attention`]; another family's are not run).
fn refuse_unsupported(architecture: Architecture, config: &Value) -> Result<(), ConfigError> {
    if config.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(ConfigError::Unsupported(
            "sliding-window attention (`use_sliding_window`)".into(),
        ));
    }
    if let Some(layers) = config.get("layer_types").and_then(Value::as_array)
        && architecture != Architecture::Gemma3
        && layers.iter().any(|l| l.as_str() != Some("full_attention"))
    {
        return Err(ConfigError::Unsupported(
            "sliding-window attention (`layer_types`)".into(),
        ));
    }
    for key in ["num_experts", "num_local_experts", "n_routed_experts"] {
        if config
            .get(key)
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 0)
        {
            return Err(ConfigError::Unsupported(format!(
                "mixture of experts (`{key}`)"
            )));
        }
    }
    let expected = architecture.activation_name();
    let act = ["hidden_activation", "hidden_act"]
        .iter()
        .find_map(|key| config.get(*key).and_then(Value::as_str))
        .unwrap_or(expected);
    if act != expected {
        return Err(ConfigError::Unsupported(format!(
            "activation `hidden_act` = {act:?}"
        )));
    }
    Ok(())
}

/// RoPE theta and scaling, from `rope_theta` / `rope_scaling` or (newer transformers)
/// `rope_parameters`. Where `rope_parameters` holds one entry per layer type (Gemma 3), the
/// global layers' is read here (the local layers' by [`local_attention`]).
fn rope(config: &Value) -> Result<(f64, RopeScaling), ConfigError> {
    let parameters = config
        .get("rope_parameters")
        .map(|p| p.get("full_attention").unwrap_or(p));
    let theta = config
        .get("rope_theta")
        .or_else(|| parameters.and_then(|p| p.get("rope_theta")))
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    let scaling = config
        .get("rope_scaling")
        .filter(|s| !s.is_null())
        .or(parameters);
    let Some(scaling) = scaling else {
        return Ok((theta, RopeScaling::None));
    };
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let number = |key: &'static str| {
        scaling
            .get(key)
            .and_then(Value::as_f64)
            .ok_or(ConfigError::Missing(key))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: number("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")?,
        },
        other => {
            return Err(ConfigError::Unsupported(format!(
                "rope scaling type {other:?}"
            )));
        }
    };
    Ok((theta, scaling))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen2() -> Value {
        json!({
            "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "vocab_size": 300, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": true, "eos_token_id": [1, 2], "use_sliding_window": false
        })
    }

    #[test]
    fn reads_a_qwen2_config() {
        let config = ModelConfig::from_json(&qwen2()).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen2);
        assert_eq!((config.head_dim, config.kv_groups()), (16, 2));
        assert!(config.features.qkv_bias && !config.features.o_bias);
        assert_eq!(config.eos_token_ids, vec![1, 2]);
        assert_eq!(config.rope_theta, 1e6);
    }

    #[test]
    fn refuses_what_it_cannot_run_by_name() {
        let mut sliding = qwen2();
        sliding["use_sliding_window"] = json!(true);
        let err = ModelConfig::from_json(&sliding).unwrap_err().to_string();
        assert!(err.contains("sliding"), "{err}");
        let mut moe = qwen2();
        moe["num_experts"] = json!(8);
        assert!(
            ModelConfig::from_json(&moe)
                .unwrap_err()
                .to_string()
                .contains("mixture of experts")
        );
        let mut yarn = qwen2();
        yarn["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        assert!(
            ModelConfig::from_json(&yarn)
                .unwrap_err()
                .to_string()
                .contains("\"yarn\"")
        );
        let mut mistral = qwen2();
        mistral["model_type"] = json!("mistral");
        assert!(
            ModelConfig::from_json(&mistral)
                .unwrap_err()
                .to_string()
                .contains("mistral")
        );
    }

    #[test]
    fn reads_rope_parameters_of_newer_transformers() {
        let mut config = qwen2();
        config.as_object_mut().unwrap().remove("rope_theta");
        config["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5000.0});
        let config = ModelConfig::from_json(&config).unwrap();
        assert_eq!(
            (config.rope_theta, config.rope_scaling),
            (5000.0, RopeScaling::None)
        );
    }
}
