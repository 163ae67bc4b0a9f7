//! The decoder-only transformer of the Llama, Qwen2 and Qwen3 families, in candle, f32.
//!
//! Built only from differentiable candle ops (candle's fused softmax, RMSNorm and RoPE kernels
//! silently drop gradients; see `engine-facts.md`), so the same forward serves sampling and
//! training.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{D, DType, Device, Tensor, Var};

use super::config::{ModelConfig, RopeScaling};
use super::frozen::FrozenLinear;
use super::site::{Site, Target};
use super::unembed::UnembedLogprobs;
use crate::lora::Adapter;
use crate::lora::linear::LoraLinear;

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("reading weights {path}: {message}")]
    Read { path: String, message: String },
    #[error("the weights have no tensor `{0}`")]
    Missing(String),
    #[error("tensor `{name}` has shape {found:?}, the config says {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// A projection `y = x Wᵀ + b`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// The projection. A base weight is frozen: when `x` is part of a gradient graph (training an
    /// adapter), the frozen op passes gradients to `x` only, never computing the weight's. A
    /// weight that is a variable (full-parameter training) gets its gradient.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if x.track_op() && !self.weight.is_variable() {
            let frozen = FrozenLinear {
                weight: self.weight.clone(),
                bias: self.bias.clone(),
            };
            return x.contiguous()?.apply_op1(frozen);
        }
        let y = x.broadcast_matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Layer {
    pub input_norm: Tensor,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Qwen3's per-head RMSNorm of queries and keys.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub post_attention_norm: Tensor,
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

/// The model's weights and the RoPE tables.
#[derive(Clone, Debug)]
pub struct Transformer {
    pub config: ModelConfig,
    pub embed_tokens: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    /// The unembedding; the embedding matrix itself when the model ties them.
    pub lm_head: Linear,
    /// RoPE tables `(context_length, head_dim)`.
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
}

/// Read every tensor of a model directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`; converted to f32.
pub fn read_safetensors(dir: &Path) -> Result<HashMap<String, Tensor>, WeightsError> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<std::path::PathBuf> = if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| WeightsError::Read {
            path: index.display().to_string(),
            message: e.to_string(),
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| WeightsError::Read {
                path: index.display().to_string(),
                message: e.to_string(),
            })?;
        let mut shards: Vec<String> = value["weight_map"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        shards.sort();
        shards.dedup();
        shards.into_iter().map(|s| dir.join(s)).collect()
    } else {
        vec![dir.join("model.safetensors")]
    };
    let mut tensors = HashMap::new();
    for file in files {
        let loaded = candle_core::safetensors::load(&file, &Device::Cpu).map_err(|e| {
            WeightsError::Read {
                path: file.display().to_string(),
                message: e.to_string(),
            }
        })?;
        for (name, tensor) in loaded {
            tensors.insert(name, tensor.to_dtype(DType::F32)?);
        }
    }
    Ok(tensors)
}

struct WeightReader<'a> {
    tensors: &'a HashMap<String, Tensor>,
}

impl WeightReader<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, WeightsError> {
        let tensor = self
            .tensors
            .get(name)
            .ok_or_else(|| WeightsError::Missing(name.to_string()))?;
        if tensor.dims() != shape {
            return Err(WeightsError::Shape {
                name: name.to_string(),
                found: tensor.dims().to_vec(),
                expected: shape.to_vec(),
            });
        }
        Ok(tensor.clone())
    }

    fn linear(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, WeightsError> {
        Ok(Linear {
            weight: self.get(&format!("{prefix}.weight"), &[out, inp])?,
            bias: if bias {
                Some(self.get(&format!("{prefix}.bias"), &[out])?)
            } else {
                None
            },
        })
    }
}

impl Transformer {
    /// Build the transformer from named tensors (Hugging Face names), checking every shape.
    pub fn from_tensors(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
    ) -> Result<Self, WeightsError> {
        let w = WeightReader { tensors };
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (q_out, kv_out) = (config.num_heads * hd, config.num_kv_heads * hd);
        let inter = config.intermediate_size;
        let embed_tokens = w.get("model.embed_tokens.weight", &[config.vocab_size, h])?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            let qwen3 = config.architecture == super::config::Architecture::Qwen3;
            layers.push(Layer {
                input_norm: w.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                q_proj: w.linear(&format!("{p}.self_attn.q_proj"), q_out, h, config.qkv_bias)?,
                k_proj: w.linear(&format!("{p}.self_attn.k_proj"), kv_out, h, config.qkv_bias)?,
                v_proj: w.linear(&format!("{p}.self_attn.v_proj"), kv_out, h, config.qkv_bias)?,
                o_proj: w.linear(&format!("{p}.self_attn.o_proj"), h, q_out, config.o_bias)?,
                q_norm: if qwen3 {
                    Some(w.get(&format!("{p}.self_attn.q_norm.weight"), &[hd])?)
                } else {
                    None
                },
                k_norm: if qwen3 {
                    Some(w.get(&format!("{p}.self_attn.k_norm.weight"), &[hd])?)
                } else {
                    None
                },
                post_attention_norm: w
                    .get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_proj: w.linear(&format!("{p}.mlp.gate_proj"), inter, h, config.mlp_bias)?,
                up_proj: w.linear(&format!("{p}.mlp.up_proj"), inter, h, config.mlp_bias)?,
                down_proj: w.linear(&format!("{p}.mlp.down_proj"), h, inter, config.mlp_bias)?,
            });
        }
        let norm = w.get("model.norm.weight", &[h])?;
        let lm_head = Linear {
            weight: if config.tie_word_embeddings {
                embed_tokens.clone()
            } else {
                w.get("lm_head.weight", &[config.vocab_size, h])?
            },
            bias: None,
        };
        let (cos, sin) = rope_tables(&config)?;
        let (cos, sin) = (
            cos.to_dtype(embed_tokens.dtype())?,
            sin.to_dtype(embed_tokens.dtype())?,
        );
        Ok(Transformer {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            cos,
            sin,
        })
    }

    /// Positions the model can attend over: its `max_position_embeddings` (capped at 65,536).
    pub fn context_length(&self) -> usize {
        self.cos.dims().first().copied().unwrap_or(0)
    }

    /// The same model computing in `dtype` (f64 for gradient checks).
    pub fn to_dtype(&self, dtype: DType) -> candle_core::Result<Self> {
        let linear = |l: &Linear| -> candle_core::Result<Linear> {
            Ok(Linear {
                weight: l.weight.to_dtype(dtype)?,
                bias: l.bias.as_ref().map(|b| b.to_dtype(dtype)).transpose()?,
            })
        };
        let norm = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_dtype(dtype)).transpose();
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    input_norm: l.input_norm.to_dtype(dtype)?,
                    q_proj: linear(&l.q_proj)?,
                    k_proj: linear(&l.k_proj)?,
                    v_proj: linear(&l.v_proj)?,
                    o_proj: linear(&l.o_proj)?,
                    q_norm: norm(&l.q_norm)?,
                    k_norm: norm(&l.k_norm)?,
                    post_attention_norm: l.post_attention_norm.to_dtype(dtype)?,
                    gate_proj: linear(&l.gate_proj)?,
                    up_proj: linear(&l.up_proj)?,
                    down_proj: linear(&l.down_proj)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Transformer {
            config: self.config.clone(),
            embed_tokens: self.embed_tokens.to_dtype(dtype)?,
            layers,
            norm: self.norm.to_dtype(dtype)?,
            lm_head: linear(&self.lm_head)?,
            cos: self.cos.to_dtype(dtype)?,
            sin: self.sin.to_dtype(dtype)?,
        })
    }

    /// Every weight with its Hugging Face name (the unembedding only when it is not tied).
    pub fn named_weights(&self) -> Vec<(String, Tensor)> {
        let mut named = vec![(
            "model.embed_tokens.weight".to_string(),
            self.embed_tokens.clone(),
        )];
        for (i, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mut push = |name: String, t: &Tensor| named.push((name, t.clone()));
            push(format!("{p}.input_layernorm.weight"), &layer.input_norm);
            push(
                format!("{p}.post_attention_layernorm.weight"),
                &layer.post_attention_norm,
            );
            if let Some(t) = &layer.q_norm {
                push(format!("{p}.self_attn.q_norm.weight"), t);
            }
            if let Some(t) = &layer.k_norm {
                push(format!("{p}.self_attn.k_norm.weight"), t);
            }
            let linears = [
                ("self_attn.q_proj", &layer.q_proj),
                ("self_attn.k_proj", &layer.k_proj),
                ("self_attn.v_proj", &layer.v_proj),
                ("self_attn.o_proj", &layer.o_proj),
                ("mlp.gate_proj", &layer.gate_proj),
                ("mlp.up_proj", &layer.up_proj),
                ("mlp.down_proj", &layer.down_proj),
            ];
            for (module, linear) in linears {
                push(format!("{p}.{module}.weight"), &linear.weight);
                if let Some(bias) = &linear.bias {
                    push(format!("{p}.{module}.bias"), bias);
                }
            }
        }
        named.push(("model.norm.weight".to_string(), self.norm.clone()));
        if !self.config.tie_word_embeddings {
            named.push(("lm_head.weight".to_string(), self.lm_head.weight.clone()));
        }
        named
    }

    /// The same model with every weight a variable, for full-parameter training (a model that
    /// is not shared). Returns the variables by Hugging Face name; tied embeddings stay one
    /// variable. Each weight is copied once and its original dropped as it goes.
    pub fn into_trainable(self) -> Result<(Self, Vec<(String, Var)>), WeightsError> {
        let config = self.config.clone();
        let named = self.named_weights();
        drop(self);
        let mut tensors = HashMap::with_capacity(named.len());
        let mut vars = Vec::with_capacity(named.len());
        for (name, tensor) in named {
            let var = Var::from_tensor(&tensor)?;
            drop(tensor);
            tensors.insert(name.clone(), var.as_tensor().clone());
            vars.push((name, var));
        }
        let model = Self::from_tensors(config, &tensors)?;
        Ok((model, vars))
    }

    /// A copy whose weights are plain tensors again (detached from any training graph).
    pub fn detached(&self) -> Result<Self, WeightsError> {
        let tensors = self
            .named_weights()
            .into_iter()
            .map(|(name, t)| Ok((name, t.detach().copy()?)))
            .collect::<candle_core::Result<HashMap<_, _>>>()?;
        Self::from_tensors(self.config.clone(), &tensors)
    }

    /// Load the weights of a model directory.
    pub fn load(config: ModelConfig, dir: &Path) -> Result<Self, WeightsError> {
        let tensors = read_safetensors(dir)?;
        Self::from_tensors(config, &tensors)
    }

    /// Logits `(batch, time, vocab)` for token ids `(batch, time)` (u32), with causal attention.
    pub fn forward(&self, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, time) = tokens.dims2()?;
        let embedded = self
            .embed_tokens
            .embedding(&tokens.flatten_all()?)?
            .reshape((batch, time, self.config.hidden_size))?;
        self.forward_embeddings(&embedded)
    }

    /// Logits `(batch, time, vocab)` for input embeddings `(batch, time, hidden)`.
    pub fn forward_embeddings(&self, embedded: &Tensor) -> candle_core::Result<Tensor> {
        self.run(embedded, None)
    }

    /// Logits `(batch, time, vocab)` for token ids `(batch, time)`, each run of rows through its
    /// own adapter (or the base model).
    pub fn forward_with_adapters(
        &self,
        tokens: &Tensor,
        adapters: &RowAdapters<'_>,
    ) -> candle_core::Result<Tensor> {
        let (batch, time) = tokens.dims2()?;
        if adapters.rows() != batch {
            return Err(candle_core::Error::Msg(format!(
                "adapters cover {} rows of a batch of {batch}",
                adapters.rows()
            )));
        }
        let embedded = self
            .embed_tokens
            .embedding(&tokens.flatten_all()?)?
            .reshape((batch, time, self.config.hidden_size))?;
        self.run(&embedded, Some(adapters))
    }

    /// The logprob of each target token `(batch, time)` after token ids `(batch, time)`, each
    /// run of rows through its own adapter. With a frozen, unadapted unembedding the logits are
    /// never materialised ([`UnembedLogprobs`]); `for_backward` says a backward pass follows.
    pub fn target_logprobs_with_adapters(
        &self,
        tokens: &Tensor,
        targets: &Tensor,
        adapters: &RowAdapters<'_>,
        for_backward: bool,
    ) -> candle_core::Result<Tensor> {
        let unembed_adapted = adapters
            .runs
            .iter()
            .any(|(_, a)| a.is_some_and(|a| a.sites.contains_key(&Site::Unembed)));
        if unembed_adapted || self.lm_head.weight.is_variable() || self.lm_head.bias.is_some() {
            let logits = self.forward_with_adapters(tokens, adapters)?;
            return target_logprobs(&logits, targets);
        }
        let (batch, time) = tokens.dims2()?;
        if adapters.rows() != batch {
            return Err(candle_core::Error::Msg(format!(
                "adapters cover {} rows of a batch of {batch}",
                adapters.rows()
            )));
        }
        let embedded = self
            .embed_tokens
            .embedding(&tokens.flatten_all()?)?
            .reshape((batch, time, self.config.hidden_size))?;
        let hidden = self.hidden_states(&embedded, Some(adapters))?;
        let op = UnembedLogprobs::new(
            self.lm_head.weight.clone(),
            targets.flatten_all()?.to_vec1::<u32>()?,
            for_backward,
        );
        hidden.contiguous()?.apply_op1(op)
    }

    fn run(
        &self,
        embedded: &Tensor,
        adapters: Option<&RowAdapters<'_>>,
    ) -> candle_core::Result<Tensor> {
        let x = self.hidden_states(embedded, adapters)?;
        project(&self.lm_head, Site::Unembed, &x, adapters)
    }

    /// The final hidden states (after the last RMSNorm) `(batch, time, hidden)`.
    fn hidden_states(
        &self,
        embedded: &Tensor,
        adapters: Option<&RowAdapters<'_>>,
    ) -> candle_core::Result<Tensor> {
        let (_, time, _) = embedded.dims3()?;
        let c = &self.config;
        let mut x = embedded.clone();
        let mask = causal_mask(time, embedded.device())?.to_dtype(embedded.dtype())?;
        let cos = self.cos.narrow(0, 0, time)?;
        let sin = self.sin.narrow(0, 0, time)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let project = |linear: &Linear, target: Target, input: &Tensor| {
                project(linear, Site::Layer(i, target), input, adapters)
            };
            let h = rms_norm(&x, &layer.input_norm, c.rms_norm_eps)?;
            let attention = self.attention(layer, &h, &mask, &cos, &sin, &project)?;
            x = (x + attention)?;
            let h = rms_norm(&x, &layer.post_attention_norm, c.rms_norm_eps)?;
            let gate = candle_nn::ops::silu(&project(&layer.gate_proj, Target::Gate, &h)?)?;
            let up = project(&layer.up_proj, Target::Up, &h)?;
            let mlp = project(&layer.down_proj, Target::Down, &(gate * up)?)?;
            x = (x + mlp)?;
        }
        rms_norm(&x, &self.norm, c.rms_norm_eps)
    }

    fn attention(
        &self,
        layer: &Layer,
        h: &Tensor,
        mask: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        project: &dyn Fn(&Linear, Target, &Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let (batch, time, _) = h.dims3()?;
        let heads = |proj: &Linear,
                     target: Target,
                     n: usize,
                     norm: Option<&Tensor>|
         -> candle_core::Result<Tensor> {
            let x = project(proj, target, h)?.reshape((batch, time, n, c.head_dim))?;
            let x = match norm {
                Some(weight) => rms_norm(&x, weight, c.rms_norm_eps)?,
                None => x,
            };
            x.transpose(1, 2)?.contiguous()
        };
        let q = apply_rope(
            &heads(&layer.q_proj, Target::Q, c.num_heads, layer.q_norm.as_ref())?,
            cos,
            sin,
        )?;
        let k = apply_rope(
            &heads(
                &layer.k_proj,
                Target::K,
                c.num_kv_heads,
                layer.k_norm.as_ref(),
            )?,
            cos,
            sin,
        )?;
        let v = heads(&layer.v_proj, Target::V, c.num_kv_heads, None)?;
        let (k, v) = (repeat_kv(&k, c.kv_groups())?, repeat_kv(&v, c.kv_groups())?);
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let out =
            probs
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((batch, time, c.num_heads * c.head_dim))?;
        project(&layer.o_proj, Target::O, &out)
    }
}

/// Which adapter serves each run of consecutive batch rows (`None`: the base model).
#[derive(Clone, Debug, Default)]
pub struct RowAdapters<'a> {
    pub runs: Vec<(usize, Option<&'a Adapter>)>,
}

impl RowAdapters<'_> {
    pub fn rows(&self) -> usize {
        self.runs.iter().map(|(rows, _)| rows).sum()
    }
}

/// A projection of the base model plus, for each run of rows, its adapter's delta at `site`.
fn project(
    linear: &Linear,
    site: Site,
    x: &Tensor,
    adapters: Option<&RowAdapters<'_>>,
) -> candle_core::Result<Tensor> {
    let Some(adapters) = adapters else {
        return linear.forward(x);
    };
    let targeted = |a: &Option<&Adapter>| a.is_some_and(|a| a.sites.contains_key(&site));
    if !adapters.runs.iter().any(|(_, a)| targeted(a)) {
        return linear.forward(x);
    }
    if let [(_, adapter)] = adapters.runs.as_slice() {
        return project_rows(linear, site, x, *adapter);
    }
    let mut outputs = Vec::with_capacity(adapters.runs.len());
    let mut start = 0;
    for (rows, adapter) in &adapters.runs {
        outputs.push(project_rows(
            linear,
            site,
            &x.narrow(0, start, *rows)?,
            *adapter,
        )?);
        start += rows;
    }
    Tensor::cat(&outputs, 0)
}

/// The projection of rows that share one adapter (or none), fused with the adapter's delta.
fn project_rows(
    linear: &Linear,
    site: Site,
    x: &Tensor,
    adapter: Option<&Adapter>,
) -> candle_core::Result<Tensor> {
    match adapter.and_then(|a| a.sites.get(&site).map(|pair| (a, pair))) {
        Some((adapter, pair)) => x.contiguous()?.apply_op3(
            pair.a.as_tensor(),
            pair.b.as_tensor(),
            LoraLinear::new(linear, adapter.config.scale()),
        ),
        None => linear.forward(x),
    }
}

/// RMSNorm over the last dimension, from differentiable ops.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let mean_square = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(mean_square + eps)?.sqrt()?)?
        .broadcast_mul(weight)
}

/// 0 on and below the diagonal, -inf above: `(time, time)`.
fn causal_mask(time: usize, device: &Device) -> candle_core::Result<Tensor> {
    let mask: Vec<f32> = (0..time)
        .flat_map(|i| (0..time).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(mask, (time, time), device)
}

/// Repeat each key/value head `groups` times, for grouped-query attention.
fn repeat_kv(x: &Tensor, groups: usize) -> candle_core::Result<Tensor> {
    if groups == 1 {
        return Ok(x.clone());
    }
    let (batch, heads, time, dim) = x.dims4()?;
    x.unsqueeze(2)?
        .expand((batch, heads, groups, time, dim))?
        .reshape((batch, heads * groups, time, dim))
}

/// Rotary embedding in the Hugging Face layout (halves rotated, not interleaved pairs).
fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let first = x.narrow(D::Minus1, 0, half)?;
    let second = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&second.neg()?, &first], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// The inverse frequencies of RoPE, with the configured scaling.
fn inverse_frequencies(config: &ModelConfig) -> Vec<f64> {
    let dim = config.head_dim;
    let base: Vec<f64> = (0..dim / 2)
        .map(|i| 1.0 / config.rope_theta.powf(2.0 * i as f64 / dim as f64))
        .collect();
    match config.rope_scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        } => base
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / factor
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect(),
    }
}

/// cos and sin tables `(max_positions, head_dim)`, halves repeated as Hugging Face lays them out.
pub(crate) fn rope_tables(config: &ModelConfig) -> candle_core::Result<(Tensor, Tensor)> {
    let inv = inverse_frequencies(config);
    let positions = config.max_position_embeddings.min(1 << 16);
    let mut cos = Vec::with_capacity(positions * config.head_dim);
    let mut sin = Vec::with_capacity(positions * config.head_dim);
    for p in 0..positions {
        for _ in 0..2 {
            for f in &inv {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
    }
    let shape = (positions, config.head_dim);
    Ok((
        Tensor::from_vec(cos, shape, &Device::Cpu)?,
        Tensor::from_vec(sin, shape, &Device::Cpu)?,
    ))
}

/// Log-probability of each target token: `logits (batch, time, vocab)`, `targets (batch, time)`
/// u32 → `(batch, time)`.
pub fn target_logprobs(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    logits
        .contiguous()?
        .apply_op2(&targets.contiguous()?, super::logprobs::TargetLogprobs)
}
