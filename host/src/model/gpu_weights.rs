//! The model's weights on a CUDA device (feature `cuda`), as the CUDA backends read them:
//! uploaded once from the candle model (or made on the device at random, for benchmarks of shapes
//! too large to make on the host), lent to the layers as [`DecoderWeights`].

use candle_core::Tensor;
use opentinker_kernels::Backend;
use opentinker_kernels::cuda::{CudaSlice, Gpu, GpuError, GpuMatrix, WeightFormat};

use super::config::ModelConfig;
use super::layers::{AttentionWeights, DecoderWeights, LayerWeights, Linear, MlpWeights, Rope};
use super::site::Target;
use super::transformer::{self, Matrix, Transformer};

/// Why the weights could not be put on the device.
#[derive(Debug, thiserror::Error)]
pub enum GpuWeightsError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("reading the model's weights: {0}")]
    Weights(#[from] candle_core::Error),
}

struct GpuLinear {
    weight: GpuMatrix,
    bias: Option<CudaSlice<f32>>,
    inp: usize,
}

impl GpuLinear {
    fn linear<B: for<'m> Backend<Matrix<'m> = &'m GpuMatrix, Vector = CudaSlice<f32>>>(
        &self,
    ) -> Linear<'_, B> {
        Linear {
            weight: &self.weight,
            bias: self.bias.as_ref(),
            inp: self.inp,
        }
    }
}

struct GpuLayer {
    input_norm: CudaSlice<f32>,
    q: GpuLinear,
    k: GpuLinear,
    v: GpuLinear,
    o: GpuLinear,
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
    post_attention_norm: CudaSlice<f32>,
    attention_output_norm: Option<CudaSlice<f32>>,
    mlp_output_norm: Option<CudaSlice<f32>>,
    gate: GpuLinear,
    up: GpuLinear,
    down: GpuLinear,
}

/// Every weight of a model on one device: matrices in the [`WeightFormat`] asked for, norms,
/// biases and the RoPE tables in f32.
pub struct GpuWeights {
    embed: GpuMatrix,
    layers: Vec<GpuLayer>,
    norm: CudaSlice<f32>,
    /// `None`: tied to the embedding.
    lm_head: Option<GpuLinear>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    local_rope: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    context: usize,
    hidden: usize,
}

fn upload(gpu: &Gpu, tensor: &Tensor) -> Result<CudaSlice<f32>, GpuWeightsError> {
    let values = tensor
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(gpu.upload(&values)?)
}

impl GpuWeights {
    /// Uploads `model`'s weights, its matrices as `format`.
    pub fn upload(
        gpu: &Gpu,
        model: &Transformer,
        format: WeightFormat,
    ) -> Result<GpuWeights, GpuWeightsError> {
        // A base kept in blocks on the host goes up dequantized, as `format`.
        let matrix = |m: &Matrix| -> Result<GpuMatrix, GpuWeightsError> {
            Ok(GpuMatrix::new(gpu, upload(gpu, &m.dense()?)?, format)?)
        };
        let linear = |l: &transformer::Linear| -> Result<GpuLinear, GpuWeightsError> {
            Ok(GpuLinear {
                weight: matrix(&l.weight)?,
                bias: l.bias.as_ref().map(|b| upload(gpu, b)).transpose()?,
                inp: l.weight.dims2()?.1,
            })
        };
        let norm = |n: &Option<Tensor>| n.as_ref().map(|n| upload(gpu, n)).transpose();
        let layers = model
            .layers
            .iter()
            .map(|layer| {
                Ok(GpuLayer {
                    input_norm: upload(gpu, &layer.input_norm)?,
                    q: linear(&layer.q_proj)?,
                    k: linear(&layer.k_proj)?,
                    v: linear(&layer.v_proj)?,
                    o: linear(&layer.o_proj)?,
                    q_norm: norm(&layer.q_norm)?,
                    k_norm: norm(&layer.k_norm)?,
                    post_attention_norm: upload(gpu, &layer.post_attention_norm)?,
                    attention_output_norm: norm(&layer.attention_output_norm)?,
                    mlp_output_norm: norm(&layer.mlp_output_norm)?,
                    gate: linear(&layer.gate_proj)?,
                    up: linear(&layer.up_proj)?,
                    down: linear(&layer.down_proj)?,
                })
            })
            .collect::<Result<_, GpuWeightsError>>()?;
        let lm_head = match model.config.tie_word_embeddings {
            true => None,
            false => Some(linear(&model.lm_head)?),
        };
        Ok(GpuWeights {
            embed: matrix(&model.embed_tokens)?,
            layers,
            norm: upload(gpu, &model.norm)?,
            lm_head,
            cos: upload(gpu, &model.cos)?,
            sin: upload(gpu, &model.sin)?,
            local_rope: model
                .local_rope
                .as_ref()
                .map(|(cos, sin)| Ok::<_, GpuWeightsError>((upload(gpu, cos)?, upload(gpu, sin)?)))
                .transpose()?,
            context: model.context_length(),
            hidden: model.config.hidden_size,
        })
    }

    /// Weights of `config`'s shape made on the device from `seed`: matrices uniform and scaled
    /// by fan-in as the tiny preset's, norms one.
    pub fn random(
        gpu: &Gpu,
        config: &ModelConfig,
        format: WeightFormat,
        seed: u64,
    ) -> Result<GpuWeights, GpuWeightsError> {
        let mut next_seed = seed;
        let mut random = |len: usize, bound: f32| -> Result<CudaSlice<f32>, GpuError> {
            let mut values = gpu.zeros(len)?;
            next_seed = next_seed.wrapping_add(0x9E37_79B9);
            gpu.fill_uniform(&mut values, next_seed, -bound, bound)?;
            Ok(values)
        };
        let ones = |len: usize| gpu.upload(&vec![1.0f32; len]);
        let (h, hd) = (config.hidden_size, config.head_dim);
        let qk_norm = config.features.qk_norm;
        let output_norms = config.features.block_output_norms;
        let mut layers = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            let mut linear = |target: Target| -> Result<GpuLinear, GpuError> {
                let (out, inp) = target.shape(config);
                let bias =
                    matches!(target, Target::Q | Target::K | Target::V) && config.features.qkv_bias;
                let values = random(out * inp, 1.0 / (inp as f32).sqrt())?;
                Ok(GpuLinear {
                    weight: GpuMatrix::new(gpu, values, format)?,
                    bias: if bias { Some(random(out, 0.02)?) } else { None },
                    inp,
                })
            };
            layers.push(GpuLayer {
                q: linear(Target::Q)?,
                k: linear(Target::K)?,
                v: linear(Target::V)?,
                o: linear(Target::O)?,
                gate: linear(Target::Gate)?,
                up: linear(Target::Up)?,
                down: linear(Target::Down)?,
                input_norm: ones(h)?,
                q_norm: if qk_norm { Some(ones(hd)?) } else { None },
                k_norm: if qk_norm { Some(ones(hd)?) } else { None },
                post_attention_norm: ones(h)?,
                attention_output_norm: if output_norms { Some(ones(h)?) } else { None },
                mlp_output_norm: if output_norms { Some(ones(h)?) } else { None },
            });
        }
        let embed = GpuMatrix::new(gpu, random(config.vocab_size * h, 1.0)?, format)?;
        let lm_head = match config.tie_word_embeddings {
            true => None,
            false => {
                let values = random(config.vocab_size * h, 1.0 / (h as f32).sqrt())?;
                Some(GpuLinear {
                    weight: GpuMatrix::new(gpu, values, format)?,
                    bias: None,
                    inp: h,
                })
            }
        };
        let (cos, sin) = transformer::rope_tables(config, config.rope_theta)?;
        let context = cos.dims().first().copied().unwrap_or(0);
        let local_rope = match &config.local_attention {
            Some(local) => {
                let (cos, sin) = transformer::rope_tables(config, local.rope_theta)?;
                Some((upload(gpu, &cos)?, upload(gpu, &sin)?))
            }
            None => None,
        };
        Ok(GpuWeights {
            embed,
            layers,
            norm: ones(h)?,
            lm_head,
            cos: upload(gpu, &cos)?,
            sin: upload(gpu, &sin)?,
            local_rope,
            context,
            hidden: h,
        })
    }

    /// The weights as the layers take them, on the sampling backend (`Gpu`) or the training
    /// one (`GpuTrain`).
    pub fn decoder<B: for<'m> Backend<Matrix<'m> = &'m GpuMatrix, Vector = CudaSlice<f32>>>(
        &self,
    ) -> DecoderWeights<'_, B> {
        let lm_head = match &self.lm_head {
            Some(head) => head.linear(),
            None => Linear {
                weight: &self.embed,
                bias: None,
                inp: self.hidden,
            },
        };
        DecoderWeights {
            embed: &self.embed,
            layers: self
                .layers
                .iter()
                .map(|l| LayerWeights {
                    input_norm: &l.input_norm,
                    attention: AttentionWeights {
                        q: l.q.linear(),
                        k: l.k.linear(),
                        v: l.v.linear(),
                        o: l.o.linear(),
                        q_norm: l.q_norm.as_ref(),
                        k_norm: l.k_norm.as_ref(),
                    },
                    post_attention_norm: &l.post_attention_norm,
                    attention_output_norm: l.attention_output_norm.as_ref(),
                    mlp_output_norm: l.mlp_output_norm.as_ref(),
                    mlp: MlpWeights {
                        gate: l.gate.linear(),
                        up: l.up.linear(),
                        down: l.down.linear(),
                    },
                })
                .collect(),
            norm: &self.norm,
            lm_head,
            rope: Rope {
                cos: &self.cos,
                sin: &self.sin,
            },
            local_rope: self.local_rope.as_ref().map(|(cos, sin)| Rope { cos, sin }),
            context: self.context,
        }
    }
}
