//! `opentinker model init-tiny`: a complete Hugging Face model directory generated locally and
//! deterministically from a seed (no hub): random weights, a small real byte-level BPE tokenizer
//! and a ChatML chat template. It loads in `transformers` too.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, TokenizerBuilder,
    TokenizerImpl,
};

use super::config::{Architecture, ConfigError, Features, ModelConfig};
use crate::store::{write_atomic, write_atomic_via_path};

/// The sizes of a generated model, by the name a job file (`init_tiny.shape`) and
/// `model init-tiny --shape` give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TinyShape {
    /// 4 layers, hidden 128, 4 heads / 2 KV heads, intermediate 512, vocabulary 512.
    Tiny,
    /// The shapes of Qwen2.5-0.5B (24 layers, hidden 896, 14 / 2 heads, intermediate 4864,
    /// vocabulary 151,936) with random weights, for benchmarks.
    #[value(name = "qwen2.5-0.5b")]
    #[serde(rename = "qwen2.5-0.5b")]
    Qwen05b,
}

struct Dims {
    layers: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    intermediate: usize,
    vocab: usize,
    tied: bool,
}

impl TinyShape {
    fn dims(self) -> Dims {
        match self {
            TinyShape::Tiny => Dims {
                layers: 4,
                hidden: 128,
                heads: 4,
                kv_heads: 2,
                intermediate: 512,
                vocab: TOKENIZER_VOCAB,
                tied: true,
            },
            TinyShape::Qwen05b => Dims {
                layers: 24,
                hidden: 896,
                heads: 14,
                kv_heads: 2,
                intermediate: 4864,
                vocab: 151_936,
                tied: true,
            },
        }
    }
}

/// Tokens of the generated tokenizer: 256 bytes, learned merges and 3 special tokens.
pub const TOKENIZER_VOCAB: usize = 512;
const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Qwen2's pre-tokenizer split (digits one by one, words with their leading space); with it,
/// `transformers`' Qwen2 tokenizer and ours cut text the same way.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// ChatML, as Qwen2.5 writes it without tools.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Text the tokenizer's merges are learned from: chat markup, English, numbers and the words of
/// the example tasks.
const CORPUS: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\nThe answer is 42.<|im_end|>\n
We play tic-tac-toe. Cells are numbered 1-9, left to right, top to bottom. Reply with the number of a free cell.
You play X. Your move? You play O. Wait for your turn. Game over: X wins. Game over: draw. That is not a free cell: you lose.
I am thinking of a number from 1 to 100. You have 10 guesses. Your guess? Higher. Lower. Yes, it is the number! No guesses left.
Solve the problem. End your reply with the answer as a number. What is the sum? What is the product? The answer is
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 60 70 80 90 99 100 1000
the of and to in is that it for on with as was at by this be from or have an they which one you were her all she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three
Let me think step by step. First, add the numbers. Then check the result. So the final answer is 7.";

/// Generate a model directory at `dir` (created if needed; existing model files are replaced).
pub fn init_tiny(
    dir: &Path,
    shape: TinyShape,
    arch: Architecture,
    seed: u64,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let special = write_tokenizer(dir)?;
    let (bos, eos) = (special["<|endoftext|>"], special["<|im_end|>"]);
    let dims = shape.dims();
    let head_dim = dims.hidden / dims.heads;
    let config = config_json(shape, arch, bos, eos);
    write_json(&dir.join("config.json"), &config)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": bos, "eos_token_id": [eos, bos], "do_sample": true}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": null,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": 32768,
            "chat_template": CHATML_TEMPLATE,
        }),
    )?;
    let features = ModelConfig::from_json(&config)?.features;
    let tensors = random_weights(&dims, head_dim, features, seed)?;
    write_atomic_via_path(&dir.join("model.safetensors"), |temp| {
        candle_core::safetensors::save(&tensors, temp).map_err(std::io::Error::other)
    })?;
    Ok(())
}

/// The `config.json` of a tiny model of `shape` and `arch` whose special tokens are `bos` and
/// `eos`.
fn config_json(shape: TinyShape, arch: Architecture, bos: u32, eos: u32) -> serde_json::Value {
    let dims = shape.dims();
    let head_dim = dims.hidden / dims.heads;
    let mut config = json!({
        "architectures": [arch.class_name()],
        "model_type": arch.model_type(),
        "vocab_size": dims.vocab,
        "hidden_size": dims.hidden,
        "intermediate_size": dims.intermediate,
        "num_hidden_layers": dims.layers,
        "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.kv_heads,
        "head_dim": head_dim,
        "hidden_act": arch.activation_name(),
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": dims.tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    });
    if arch == Architecture::Gemma3 {
        // Local layers between global ones, the window short enough for the tiny shape's
        // sequences to pass it.
        let window = match shape {
            TinyShape::Tiny => 4,
            TinyShape::Qwen05b => 512,
        };
        let layer_types: Vec<&str> = (0..dims.layers)
            .map(|i| match i % 2 {
                0 => "sliding_attention",
                _ => "full_attention",
            })
            .collect();
        config["hidden_activation"] = json!(arch.activation_name());
        config["query_pre_attn_scalar"] = json!(head_dim);
        config["sliding_window"] = json!(window);
        config["layer_types"] = json!(layer_types);
        config["rope_parameters"] = json!({
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        });
    }
    config
}

/// The configuration of a tiny model of `shape` and `arch`, as [`init_tiny`] writes it (what a
/// server needs to count its memory before it is made).
pub fn tiny_config(shape: TinyShape, arch: Architecture) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json(&config_json(shape, arch, 0, 1))
}

fn write_json(path: &Path, value: &serde_json::Value) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    write_atomic(path, text.as_bytes())
}

/// Learn a byte-level BPE on the corpus and write `tokenizer.json`; returns the ids of the
/// special tokens.
fn write_tokenizer(dir: &Path) -> anyhow::Result<HashMap<&'static str, u32>> {
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(TOKENIZER_VOCAB)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let split = Split::new(
        SplitPattern::Regex(QWEN2_SPLIT.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| anyhow::anyhow!("the pre-tokenizer pattern: {e}"))?;
    let pre_tokenizer = Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(
            ByteLevel::default()
                .add_prefix_space(false)
                .use_regex(false),
        ),
    ]);
    let mut tokenizer: TokenizerImpl<BPE, NormalizerWrapper, Sequence, ByteLevel, ByteLevel> =
        TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(pre_tokenizer))
            .with_post_processor(Some(ByteLevel::default().trim_offsets(false)))
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .map_err(|e| anyhow::anyhow!("building the tokenizer: {e}"))?;
    let lines: Vec<String> = CORPUS.lines().map(|l| format!("{l}\n")).collect();
    tokenizer
        .train(&mut trainer, lines.iter())
        .map_err(|e| anyhow::anyhow!("training the tokenizer: {e}"))?;
    let text = tokenizer
        .to_string(true)
        .map_err(|e| anyhow::anyhow!("serialising the tokenizer: {e}"))?;
    write_atomic(&dir.join("tokenizer.json"), text.as_bytes())?;
    SPECIAL_TOKENS
        .iter()
        .map(|t| {
            let id = tokenizer
                .token_to_id(t)
                .ok_or_else(|| anyhow::anyhow!("the trained tokenizer lost {t}"))?;
            Ok((*t, id))
        })
        .collect()
}

/// Normal(0, std) samples by Box-Muller from a seeded generator.
fn normal(rng: &mut StdRng, count: usize, std: f32) -> Vec<f32> {
    let mut values = Vec::with_capacity(count + 1);
    while values.len() < count {
        let u1: f64 = rng.random_range(f64::EPSILON..1.0);
        let u2: f64 = rng.random_range(0.0..1.0);
        let radius = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        values.push((radius * angle.cos()) as f32 * std);
        values.push((radius * angle.sin()) as f32 * std);
    }
    values.truncate(count);
    values
}

fn random_weights(
    dims: &Dims,
    head_dim: usize,
    features: Features,
    seed: u64,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tensors = HashMap::new();
    let mut add = |name: String,
                   shape: &[usize],
                   rng: &mut StdRng,
                   std: Option<f32>|
     -> candle_core::Result<()> {
        let count: usize = shape.iter().product();
        // A norm multiplies by one (Gemma's files store one less than the factor).
        let values = match std {
            Some(std) => normal(rng, count, std),
            None => vec![1.0 - features.norm_offset(&name) as f32; count],
        };
        tensors.insert(name, Tensor::from_vec(values, shape, &Device::Cpu)?);
        Ok(())
    };
    let (h, q_out, kv_out) = (dims.hidden, dims.heads * head_dim, dims.kv_heads * head_dim);
    add(
        "model.embed_tokens.weight".into(),
        &[dims.vocab, h],
        &mut rng,
        Some(0.02),
    )?;
    let (mlp_norm, output_norms) = features.layer_norm_names();
    for i in 0..dims.layers {
        let p = format!("model.layers.{i}");
        let norms = ["input_layernorm", mlp_norm].into_iter();
        for norm in norms.chain(output_norms.into_iter().flatten()) {
            add(format!("{p}.{norm}.weight"), &[h], &mut rng, None)?;
        }
        for (name, out, inp) in [
            ("q_proj", q_out, h),
            ("k_proj", kv_out, h),
            ("v_proj", kv_out, h),
            ("o_proj", h, q_out),
        ] {
            add(
                format!("{p}.self_attn.{name}.weight"),
                &[out, inp],
                &mut rng,
                Some(0.02),
            )?;
            let bias = match name {
                "o_proj" => features.o_bias,
                _ => features.qkv_bias,
            };
            if bias {
                add(
                    format!("{p}.self_attn.{name}.bias"),
                    &[out],
                    &mut rng,
                    Some(0.02),
                )?;
            }
        }
        if features.qk_norm {
            add(
                format!("{p}.self_attn.q_norm.weight"),
                &[head_dim],
                &mut rng,
                None,
            )?;
            add(
                format!("{p}.self_attn.k_norm.weight"),
                &[head_dim],
                &mut rng,
                None,
            )?;
        }
        for (name, out, inp) in [
            ("gate_proj", dims.intermediate, h),
            ("up_proj", dims.intermediate, h),
            ("down_proj", h, dims.intermediate),
        ] {
            add(
                format!("{p}.mlp.{name}.weight"),
                &[out, inp],
                &mut rng,
                Some(0.02),
            )?;
        }
    }
    add("model.norm.weight".into(), &[h], &mut rng, None)?;
    if !dims.tied {
        add(
            "lm_head.weight".into(),
            &[dims.vocab, h],
            &mut rng,
            Some(0.02),
        )?;
    }
    Ok(tensors)
}
