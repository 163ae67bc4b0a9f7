//! The weights of the decoder-only transformer of the Llama, Qwen2, Qwen3 and Gemma 3 families,
//! as candle tensors (f32, or f64 for gradient checks): read from a Hugging Face directory with
//! every shape checked, named as Hugging Face names them, made trainable for full-parameter
//! training, and the RoPE tables. The layers that compute with them are `model::layers`.
//!
//! A frozen base can keep its matrices in blocks ([`BaseFormat`], QLoRA's idea on the kernels'
//! [`QuantMatrix`]): the projections and the embedding become [`Matrix::Blocks`] (a quarter of
//! the f32 bytes for Q8_0), which the CPU kernels dequantize a panel at a time. Loading converts
//! each matrix as it is read ([`Transformer::from_source`]), so the base never exists whole in
//! f32. LoRA trains on top as on an f32 base; full-parameter training needs the f32 base.
//!
//! Gemma's norms multiply by `1 + w` where its files store `w`: a transformer holds the factor
//! itself (as llama.cpp's files store it), so a Hugging Face directory's norms gain 1 when read
//! ([`Transformer::load`]) and lose it when written ([`Transformer::hf_weights`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use opentinker_kernels::{BlockFormat, QuantMatrix, QuantizeError};

use super::config::{ModelConfig, RopeScaling};
use super::site::Target;

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("reading weights {path}: {message}")]
    Read { path: String, message: String },
    #[error("writing the model directory {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the weights have no tensor `{0}`")]
    Missing(String),
    #[error("tensor `{name}` has shape {found:?}, the config says {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("keeping `{name}` in blocks: {source}")]
    Quantize { name: String, source: QuantizeError },
    #[error(
        "full-parameter training updates the base, and this base is kept in blocks \
         ({0:?}): load it in f32 to train it whole (LoRA trains on a base in blocks)"
    )]
    BaseInBlocks(BlockFormat),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// How a loaded model holds its base's matrices (`--base-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BaseFormat {
    /// f32 tensors.
    #[default]
    #[value(name = "f32")]
    F32,
    /// Blocks of 32 8-bit values and a scale: 0.28x of the f32 bytes.
    #[value(name = "q8_0")]
    Q8_0,
    /// Blocks of 32 4-bit values and a scale: 0.16x of the f32 bytes.
    #[value(name = "q4_0")]
    Q4_0,
}

impl BaseFormat {
    /// The blocks this format keeps, `None` for f32.
    pub fn blocks(self) -> Option<BlockFormat> {
        match self {
            BaseFormat::F32 => None,
            BaseFormat::Q8_0 => Some(BlockFormat::Q8_0),
            BaseFormat::Q4_0 => Some(BlockFormat::Q4_0),
        }
    }
}

/// A weight matrix `out × in`: a tensor, or (a frozen base's) blocks.
#[derive(Clone, Debug)]
pub enum Matrix {
    Dense(Tensor),
    /// Shared: a tied unembedding is the embedding's blocks.
    Blocks(Arc<QuantMatrix>),
}

impl Matrix {
    /// `(out, in)`.
    pub fn dims2(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            Matrix::Dense(t) => t.dims2(),
            Matrix::Blocks(m) => Ok((m.rows(), m.cols())),
        }
    }

    /// The values as a tensor: the tensor itself, or the blocks dequantized (a new f32 tensor,
    /// for what needs every value at once: saving, merging, uploading to a GPU).
    pub fn dense(&self) -> candle_core::Result<Tensor> {
        match self {
            Matrix::Dense(t) => Ok(t.clone()),
            Matrix::Blocks(m) => {
                Tensor::from_vec(m.dequantize::<f32>(), (m.rows(), m.cols()), &Device::Cpu)
            }
        }
    }

    /// The tensor, where the matrix is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Matrix::Dense(t) => Some(t),
            Matrix::Blocks(_) => None,
        }
    }

    /// Bytes the values take.
    pub fn bytes(&self) -> usize {
        match self {
            Matrix::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Matrix::Blocks(m) => m.bytes(),
        }
    }

    fn to_dtype(&self, dtype: DType) -> candle_core::Result<Matrix> {
        Ok(match self {
            Matrix::Dense(t) => Matrix::Dense(t.to_dtype(dtype)?),
            Matrix::Blocks(m) => Matrix::Blocks(Arc::clone(m)),
        })
    }

    /// This matrix in `format` (blocks stay as they are).
    fn in_blocks(&self, name: &str, format: BlockFormat) -> Result<Matrix, WeightsError> {
        let Matrix::Dense(t) = self else {
            return Ok(self.clone());
        };
        let cols = t.dims2()?.1;
        let values = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let blocks = QuantMatrix::quantize(&values, cols, format).map_err(|source| {
            WeightsError::Quantize {
                name: name.to_string(),
                source,
            }
        })?;
        Ok(Matrix::Blocks(Arc::new(blocks)))
    }
}

/// A projection `y = x Wᵀ + b`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Tensor>,
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
    /// The MLP's input norm.
    pub post_attention_norm: Tensor,
    /// The norms of the attention's and the MLP's outputs (Gemma).
    pub attention_output_norm: Option<Tensor>,
    pub mlp_output_norm: Option<Tensor>,
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Layer {
    /// The projection `target` names.
    pub fn linear(&self, target: Target) -> &Linear {
        match target {
            Target::Q => &self.q_proj,
            Target::K => &self.k_proj,
            Target::V => &self.v_proj,
            Target::O => &self.o_proj,
            Target::Gate => &self.gate_proj,
            Target::Up => &self.up_proj,
            Target::Down => &self.down_proj,
        }
    }

    /// The projection `target` names.
    pub fn linear_mut(&mut self, target: Target) -> &mut Linear {
        match target {
            Target::Q => &mut self.q_proj,
            Target::K => &mut self.k_proj,
            Target::V => &mut self.v_proj,
            Target::O => &mut self.o_proj,
            Target::Gate => &mut self.gate_proj,
            Target::Up => &mut self.up_proj,
            Target::Down => &mut self.down_proj,
        }
    }
}

/// The model's weights and the RoPE tables.
#[derive(Clone, Debug)]
pub struct Transformer {
    pub config: ModelConfig,
    pub embed_tokens: Matrix,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    /// The unembedding; the embedding matrix itself when the model ties them.
    pub lm_head: Linear,
    /// RoPE tables `(context_length, head_dim)`.
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    /// The local (sliding-window) layers' tables, where their RoPE base differs.
    pub(crate) local_rope: Option<(Tensor, Tensor)>,
}

/// The safetensors files of a model directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`.
fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, WeightsError> {
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
    Ok(files)
}

/// The tensors of a model directory's safetensors files, each read when asked for (in f32), so
/// that a model is never held whole twice.
struct SafetensorsReader {
    files: candle_core::safetensors::MmapedSafetensors,
    names: std::collections::HashSet<String>,
    dir: String,
}

impl SafetensorsReader {
    fn open(dir: &Path) -> Result<Self, WeightsError> {
        let files = safetensors_files(dir)?;
        let read_error = |e: candle_core::Error| WeightsError::Read {
            path: dir.display().to_string(),
            message: e.to_string(),
        };
        // SAFETY: the files are mapped read-only for the load and each tensor is copied out of
        // the map; a model directory is not written while it is being loaded (the assumption of
        // every loader that maps its files, as transformers' and candle's do).
        let files = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
            .map_err(read_error)?;
        let names = files.tensors().into_iter().map(|(name, _)| name).collect();
        Ok(SafetensorsReader {
            files,
            names,
            dir: dir.display().to_string(),
        })
    }

    /// The tensor `name` in f32; `None` when no file has it.
    fn read(&self, name: &str) -> Result<Option<Tensor>, WeightsError> {
        if !self.names.contains(name) {
            return Ok(None);
        }
        let tensor = self
            .files
            .load(name, &Device::Cpu)
            .map_err(|e| WeightsError::Read {
                path: self.dir.clone(),
                message: format!("tensor `{name}`: {e}"),
            })?;
        Ok(Some(tensor.to_dtype(DType::F32)?))
    }
}

/// Hands out each tensor of a model by name, checking its shape; the matrices come out in the
/// base's format, each converted as it is read.
struct WeightReader<F> {
    source: F,
    format: BaseFormat,
}

impl<F: FnMut(&str, &[usize]) -> Result<Option<Tensor>, WeightsError>> WeightReader<F> {
    fn get(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, WeightsError> {
        let tensor =
            (self.source)(name, shape)?.ok_or_else(|| WeightsError::Missing(name.to_string()))?;
        if tensor.dims() != shape {
            return Err(WeightsError::Shape {
                name: name.to_string(),
                found: tensor.dims().to_vec(),
                expected: shape.to_vec(),
            });
        }
        Ok(tensor)
    }

    /// A matrix, in the base's format.
    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Matrix, WeightsError> {
        let dense = Matrix::Dense(self.get(name, &shape)?);
        match self.format.blocks() {
            Some(format) => dense.in_blocks(name, format),
            None => Ok(dense),
        }
    }

    fn linear(
        &mut self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, WeightsError> {
        Ok(Linear {
            weight: self.matrix(&format!("{prefix}.weight"), [out, inp])?,
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
        Self::from_source(config, BaseFormat::F32, |name, _| {
            Ok(tensors.get(name).cloned())
        })
    }

    /// Build the transformer from `source`, which gives each tensor by its Hugging Face name and
    /// the shape the config gives it (`None`: the model has no such tensor) and is asked for
    /// each once, checking every shape;
    /// the matrices are held as `format` says, each converted as it arrives, so that a base in
    /// blocks never exists whole in f32.
    pub fn from_source(
        config: ModelConfig,
        format: BaseFormat,
        source: impl FnMut(&str, &[usize]) -> Result<Option<Tensor>, WeightsError>,
    ) -> Result<Self, WeightsError> {
        let mut w = WeightReader { source, format };
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (q_out, kv_out) = (config.num_heads * hd, config.num_kv_heads * hd);
        let inter = config.intermediate_size;
        let embed_tokens = w.matrix("model.embed_tokens.weight", [config.vocab_size, h])?;
        let dtype = match &embed_tokens {
            Matrix::Dense(t) => t.dtype(),
            Matrix::Blocks(_) => DType::F32,
        };
        let (mlp_norm, output_norms) = config.features.layer_norm_names();
        // Not sized by the config: a layer count past the tensors is refused at the first missing one.
        let mut layers = Vec::new();
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            let qk_norm = config.features.qk_norm;
            layers.push(Layer {
                input_norm: w.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                q_proj: w.linear(
                    &format!("{p}.self_attn.q_proj"),
                    q_out,
                    h,
                    config.features.qkv_bias,
                )?,
                k_proj: w.linear(
                    &format!("{p}.self_attn.k_proj"),
                    kv_out,
                    h,
                    config.features.qkv_bias,
                )?,
                v_proj: w.linear(
                    &format!("{p}.self_attn.v_proj"),
                    kv_out,
                    h,
                    config.features.qkv_bias,
                )?,
                o_proj: w.linear(
                    &format!("{p}.self_attn.o_proj"),
                    h,
                    q_out,
                    config.features.o_bias,
                )?,
                q_norm: if qk_norm {
                    Some(w.get(&format!("{p}.self_attn.q_norm.weight"), &[hd])?)
                } else {
                    None
                },
                k_norm: if qk_norm {
                    Some(w.get(&format!("{p}.self_attn.k_norm.weight"), &[hd])?)
                } else {
                    None
                },
                post_attention_norm: w.get(&format!("{p}.{mlp_norm}.weight"), &[h])?,
                attention_output_norm: output_norms
                    .map(|[name, _]| w.get(&format!("{p}.{name}.weight"), &[h]))
                    .transpose()?,
                mlp_output_norm: output_norms
                    .map(|[_, name]| w.get(&format!("{p}.{name}.weight"), &[h]))
                    .transpose()?,
                gate_proj: w.linear(
                    &format!("{p}.mlp.gate_proj"),
                    inter,
                    h,
                    config.features.mlp_bias,
                )?,
                up_proj: w.linear(
                    &format!("{p}.mlp.up_proj"),
                    inter,
                    h,
                    config.features.mlp_bias,
                )?,
                down_proj: w.linear(
                    &format!("{p}.mlp.down_proj"),
                    h,
                    inter,
                    config.features.mlp_bias,
                )?,
            });
        }
        let norm = w.get("model.norm.weight", &[h])?;
        let lm_head = Linear {
            weight: if config.tie_word_embeddings {
                embed_tokens.clone()
            } else {
                w.matrix("lm_head.weight", [config.vocab_size, h])?
            },
            bias: None,
        };
        let tables = |theta: f64| -> candle_core::Result<(Tensor, Tensor)> {
            let (cos, sin) = rope_tables(&config, theta)?;
            Ok((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?))
        };
        let (cos, sin) = tables(config.rope_theta)?;
        let local_rope = config
            .local_attention
            .as_ref()
            .map(|local| tables(local.rope_theta))
            .transpose()?;
        Ok(Transformer {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            cos,
            sin,
            local_rope,
        })
    }

    /// Positions the model can attend over: its `max_position_embeddings` (capped at 65,536).
    pub fn context_length(&self) -> usize {
        self.cos.dims().first().copied().unwrap_or(0)
    }

    /// The same model with its projections, embedding and unembedding kept in `format`'s blocks
    /// (norms and biases stay tensors). Each matrix's tensor is dropped as its blocks are made,
    /// unless something else holds it.
    pub fn keep_base_in(mut self, format: BlockFormat) -> Result<Self, WeightsError> {
        self.embed_tokens = self
            .embed_tokens
            .in_blocks("model.embed_tokens.weight", format)?;
        self.lm_head.weight = match self.config.tie_word_embeddings {
            true => self.embed_tokens.clone(),
            false => self.lm_head.weight.in_blocks("lm_head.weight", format)?,
        };
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for target in Target::ALL {
                let name = format!("model.layers.{i}.{}.weight", target.module());
                let linear = layer.linear_mut(target);
                linear.weight = linear.weight.in_blocks(&name, format)?;
            }
        }
        Ok(self)
    }

    /// The format of the base's blocks, where it is kept in blocks.
    pub fn base_format(&self) -> Option<BlockFormat> {
        match &self.embed_tokens {
            Matrix::Blocks(m) => Some(m.format()),
            Matrix::Dense(_) => None,
        }
    }

    /// Bytes of every weight: matrices in their storage, norms and biases (not the RoPE tables).
    pub fn weight_bytes(&self) -> usize {
        let tensor = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let linear = |l: &Linear| l.weight.bytes() + l.bias.as_ref().map_or(0, tensor);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let norms = [
                    &l.q_norm,
                    &l.k_norm,
                    &l.attention_output_norm,
                    &l.mlp_output_norm,
                ];
                tensor(&l.input_norm)
                    + tensor(&l.post_attention_norm)
                    + norms.into_iter().flatten().map(tensor).sum::<usize>()
                    + Target::ALL
                        .map(|t| linear(l.linear(t)))
                        .iter()
                        .sum::<usize>()
            })
            .sum();
        let head = match self.config.tie_word_embeddings {
            true => 0,
            false => linear(&self.lm_head),
        };
        self.embed_tokens.bytes() + layers + tensor(&self.norm) + head
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
                    attention_output_norm: norm(&l.attention_output_norm)?,
                    mlp_output_norm: norm(&l.mlp_output_norm)?,
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
            local_rope: self
                .local_rope
                .as_ref()
                .map(|(cos, sin)| {
                    Ok::<_, candle_core::Error>((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?))
                })
                .transpose()?,
        })
    }

    /// Every weight with its Hugging Face name (the unembedding only when it is not tied); a
    /// base kept in blocks gives its matrices dequantized.
    pub fn named_weights(&self) -> candle_core::Result<Vec<(String, Tensor)>> {
        let mut named = vec![(
            "model.embed_tokens.weight".to_string(),
            self.embed_tokens.dense()?,
        )];
        let (mlp_norm, output_norms) = self.config.features.layer_norm_names();
        for (i, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mut push = |name: String, t: &Tensor| named.push((name, t.clone()));
            push(format!("{p}.input_layernorm.weight"), &layer.input_norm);
            push(format!("{p}.{mlp_norm}.weight"), &layer.post_attention_norm);
            let outputs = [&layer.attention_output_norm, &layer.mlp_output_norm];
            for (name, norm) in output_norms.into_iter().flatten().zip(outputs) {
                if let Some(norm) = norm {
                    push(format!("{p}.{name}.weight"), norm);
                }
            }
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
                push(format!("{p}.{module}.weight"), &linear.weight.dense()?);
                if let Some(bias) = &linear.bias {
                    push(format!("{p}.{module}.bias"), bias);
                }
            }
        }
        named.push(("model.norm.weight".to_string(), self.norm.clone()));
        if !self.config.tie_word_embeddings {
            named.push(("lm_head.weight".to_string(), self.lm_head.weight.dense()?));
        }
        Ok(named)
    }

    /// Every weight as a Hugging Face file stores it ([`Transformer::named_weights`] with
    /// Gemma's norms back to `w`).
    pub fn hf_weights(&self) -> candle_core::Result<Vec<(String, Tensor)>> {
        self.named_weights()?
            .into_iter()
            .map(|(name, tensor)| {
                let offset = self.config.features.norm_offset(&name);
                let tensor = match offset == 0.0 {
                    true => tensor,
                    false => (tensor - offset)?,
                };
                Ok((name, tensor))
            })
            .collect()
    }

    /// The same model with every weight a variable, for full-parameter training (a model that
    /// is not shared). Returns the variables by Hugging Face name; tied embeddings stay one
    /// variable. Each weight is copied once and its original dropped as it goes.
    pub fn into_trainable(self) -> Result<(Self, Vec<(String, Var)>), WeightsError> {
        if let Some(format) = self.base_format() {
            return Err(WeightsError::BaseInBlocks(format));
        }
        let config = self.config.clone();
        let named = self.named_weights()?;
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
            .named_weights()?
            .into_iter()
            .map(|(name, t)| Ok((name, t.detach().copy()?)))
            .collect::<candle_core::Result<HashMap<_, _>>>()?;
        Self::from_tensors(self.config.clone(), &tensors)
    }

    /// Load the weights of a model directory (or GGUF file), the base held as `format`. A
    /// directory's tensors are read one at a time, each matrix converted as it is read.
    pub fn load(config: ModelConfig, dir: &Path, format: BaseFormat) -> Result<Self, WeightsError> {
        if super::gguf::is_gguf(dir) {
            let mut tensors = super::gguf::GgufFile::open(dir)
                .and_then(|file| file.tensors())
                .map_err(|e| WeightsError::Read {
                    path: dir.display().to_string(),
                    message: e.to_string(),
                })?;
            return Self::from_source(config, format, |name, _| Ok(tensors.remove(name)));
        }
        let reader = SafetensorsReader::open(dir)?;
        let offsets = config.features;
        Self::from_source(config, format, |name, _| {
            let offset = offsets.norm_offset(name);
            match reader.read(name)? {
                Some(tensor) if offset != 0.0 => Ok(Some((tensor + offset)?)),
                read => Ok(read),
            }
        })
    }
}

/// The inverse frequencies of RoPE of base `theta`, with the configured scaling.
fn inverse_frequencies(config: &ModelConfig, theta: f64) -> Vec<f64> {
    let dim = config.head_dim;
    let base: Vec<f64> = (0..dim / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / dim as f64))
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

/// cos and sin tables `(max_positions, head_dim)` of RoPE's base `theta`, halves repeated as
/// Hugging Face lays them out.
pub(crate) fn rope_tables(
    config: &ModelConfig,
    theta: f64,
) -> candle_core::Result<(Tensor, Tensor)> {
    let inv = inverse_frequencies(config, theta);
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
/// u32 → `(batch, time)` f32.
pub fn target_logprobs(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    let (batch, time, vocab) = logits.dims3()?;
    let targets = targets.flatten_all()?.to_vec1::<u32>()?;
    if targets.len() != batch * time || targets.iter().any(|&t| t as usize >= vocab) {
        return Err(candle_core::Error::Msg(format!(
            "targets do not fit logits of {batch} × {time} × {vocab}"
        )));
    }
    let logits = logits
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let mut logprobs = vec![0.0f32; targets.len()];
    opentinker_kernels::unembed::target_logprobs(&logits, vocab, &targets, &mut logprobs);
    Tensor::from_vec(logprobs, (batch, time), &Device::Cpu)
}
