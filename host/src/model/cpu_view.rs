//! The candle model's weights as the CPU backend reads them: each tensor's f32 data borrowed in
//! place under its storage lock, never copied, and a base's blocks by reference.

use candle_core::{Device, Storage, Tensor, WithDType};
use opentinker_kernels::{Backend, Cpu, CpuBatch, KvCache, QuantMatrix, Weight};

use super::layers::{
    Adapters, AttentionWeights, DecoderWeights, LayerWeights, Linear, MlpWeights, NoAdapters, Rope,
    Sequence, forward,
};
use super::transformer::{self, Transformer};

/// A contiguous CPU tensor's data, read in place under its storage lock.
pub struct TensorView<'a, T = f32> {
    guard: candle_core::StorageRef<'a>,
    range: std::ops::Range<usize>,
    element: std::marker::PhantomData<T>,
}

impl<'a, T: WithDType> TensorView<'a, T> {
    /// Refuses a tensor that is not contiguous, on the CPU, in `T`.
    pub fn of(tensor: &'a Tensor) -> candle_core::Result<Self> {
        let (guard, layout) = tensor.storage_and_layout();
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("the CPU backend needs contiguous weights".into())
        })?;
        match &*guard {
            Storage::Cpu(cpu) => {
                T::cpu_storage_as_slice(cpu)?;
            }
            _ => {
                return Err(candle_core::Error::Msg(
                    "the CPU backend reads tensors on the CPU".into(),
                ));
            }
        }
        Ok(TensorView {
            guard,
            range: start..end,
            element: std::marker::PhantomData,
        })
    }

    pub fn slice(&self) -> &[T] {
        match &*self.guard {
            Storage::Cpu(cpu) => T::cpu_storage_as_slice(cpu)
                .map(|data| &data[self.range.clone()])
                .unwrap_or(&[]),
            _ => &[],
        }
    }
}

/// A [`transformer::Matrix`] as the kernels read it.
enum MatrixView<'a, T> {
    Dense(TensorView<'a, T>),
    Blocks(&'a QuantMatrix),
}

impl<'a, T: WithDType> MatrixView<'a, T> {
    fn of(matrix: &'a transformer::Matrix) -> candle_core::Result<Self> {
        Ok(match matrix {
            transformer::Matrix::Dense(t) => MatrixView::Dense(TensorView::of(t)?),
            transformer::Matrix::Blocks(m) => MatrixView::Blocks(m),
        })
    }

    fn weight(&self) -> Weight<'_, T> {
        match self {
            MatrixView::Dense(t) => Weight::Dense(t.slice()),
            MatrixView::Blocks(m) => Weight::Blocks(m),
        }
    }
}

struct LinearView<'a, T> {
    weight: MatrixView<'a, T>,
    bias: Option<TensorView<'a, T>>,
    inp: usize,
}

impl<'a, T: WithDType> LinearView<'a, T> {
    fn of(linear: &'a transformer::Linear) -> candle_core::Result<Self> {
        Ok(LinearView {
            weight: MatrixView::of(&linear.weight)?,
            bias: linear.bias.as_ref().map(TensorView::of).transpose()?,
            inp: linear.weight.dims2()?.1,
        })
    }

    fn linear<B: for<'m> Backend<Matrix<'m> = Weight<'m, T>, Vector = [T]>>(
        &self,
    ) -> Linear<'_, B> {
        Linear {
            weight: self.weight.weight(),
            bias: self.bias.as_ref().map(TensorView::slice),
            inp: self.inp,
        }
    }
}

struct LayerView<'a, T> {
    input_norm: TensorView<'a, T>,
    q: LinearView<'a, T>,
    k: LinearView<'a, T>,
    v: LinearView<'a, T>,
    o: LinearView<'a, T>,
    q_norm: Option<TensorView<'a, T>>,
    k_norm: Option<TensorView<'a, T>>,
    post_attention_norm: TensorView<'a, T>,
    attention_output_norm: Option<TensorView<'a, T>>,
    mlp_output_norm: Option<TensorView<'a, T>>,
    gate: LinearView<'a, T>,
    up: LinearView<'a, T>,
    down: LinearView<'a, T>,
}

/// Every weight of a [`Transformer`] (computing in `T`), borrowed for the CPU backends.
pub struct CpuWeights<'a, T = f32> {
    embed: MatrixView<'a, T>,
    layers: Vec<LayerView<'a, T>>,
    norm: TensorView<'a, T>,
    lm_head: LinearView<'a, T>,
    cos: TensorView<'a, T>,
    sin: TensorView<'a, T>,
    local_rope: Option<(TensorView<'a, T>, TensorView<'a, T>)>,
    context: usize,
}

impl<'a, T: WithDType> CpuWeights<'a, T> {
    pub fn of(model: &'a Transformer) -> candle_core::Result<Self> {
        let view = TensorView::of;
        let norm = |t: &'a Option<Tensor>| t.as_ref().map(TensorView::of).transpose();
        let layers = model
            .layers
            .iter()
            .map(|l| {
                Ok(LayerView {
                    input_norm: view(&l.input_norm)?,
                    q: LinearView::of(&l.q_proj)?,
                    k: LinearView::of(&l.k_proj)?,
                    v: LinearView::of(&l.v_proj)?,
                    o: LinearView::of(&l.o_proj)?,
                    q_norm: norm(&l.q_norm)?,
                    k_norm: norm(&l.k_norm)?,
                    post_attention_norm: view(&l.post_attention_norm)?,
                    attention_output_norm: norm(&l.attention_output_norm)?,
                    mlp_output_norm: norm(&l.mlp_output_norm)?,
                    gate: LinearView::of(&l.gate_proj)?,
                    up: LinearView::of(&l.up_proj)?,
                    down: LinearView::of(&l.down_proj)?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(CpuWeights {
            embed: MatrixView::of(&model.embed_tokens)?,
            layers,
            norm: view(&model.norm)?,
            lm_head: LinearView::of(&model.lm_head)?,
            cos: view(&model.cos)?,
            sin: view(&model.sin)?,
            local_rope: model
                .local_rope
                .as_ref()
                .map(|(cos, sin)| Ok::<_, candle_core::Error>((view(cos)?, view(sin)?)))
                .transpose()?,
            context: model.context_length(),
        })
    }

    /// The weights as the layers take them.
    pub fn decoder<B: for<'m> Backend<Matrix<'m> = Weight<'m, T>, Vector = [T]>>(
        &self,
    ) -> DecoderWeights<'_, B> {
        DecoderWeights {
            embed: self.embed.weight(),
            layers: self
                .layers
                .iter()
                .map(|l| LayerWeights {
                    input_norm: l.input_norm.slice(),
                    attention: AttentionWeights {
                        q: l.q.linear(),
                        k: l.k.linear(),
                        v: l.v.linear(),
                        o: l.o.linear(),
                        q_norm: l.q_norm.as_ref().map(TensorView::slice),
                        k_norm: l.k_norm.as_ref().map(TensorView::slice),
                    },
                    post_attention_norm: l.post_attention_norm.slice(),
                    attention_output_norm: l.attention_output_norm.as_ref().map(TensorView::slice),
                    mlp_output_norm: l.mlp_output_norm.as_ref().map(TensorView::slice),
                    mlp: MlpWeights {
                        gate: l.gate.linear(),
                        up: l.up.linear(),
                        down: l.down.linear(),
                    },
                })
                .collect(),
            norm: self.norm.slice(),
            lm_head: self.lm_head.linear(),
            rope: Rope {
                cos: self.cos.slice(),
                sin: self.sin.slice(),
            },
            local_rope: self.local_rope.as_ref().map(|(cos, sin)| Rope {
                cos: cos.slice(),
                sin: sin.slice(),
            }),
            context: self.context,
        }
    }
}

/// The logits `(batch, time, vocab)` of whole sequences of token ids `(batch, time)` on the CPU
/// backend, row `r` through `adapters[r]` of `hook` (`None`: the base model).
pub fn sequence_logits<H: Adapters<Cpu>>(
    model: &Transformer,
    tokens: &Tensor,
    hook: &H,
    adapters: &[Option<usize>],
) -> candle_core::Result<Tensor> {
    let (batch, time) = tokens.dims2()?;
    if adapters.len() != batch {
        return Err(candle_core::Error::Msg(format!(
            "{} adapters for a batch of {batch}",
            adapters.len()
        )));
    }
    let rows = tokens.to_vec2::<u32>()?;
    let c = &model.config;
    let weights = CpuWeights::<f32>::of(model)?;
    let sequences: Vec<Sequence<'_>> = rows
        .iter()
        .zip(adapters)
        .map(|(tokens, &adapter)| Sequence {
            tokens,
            start: 0,
            adapter,
            all_logits: true,
        })
        .collect();
    let mut caches: Vec<KvCache> = (0..batch)
        .map(|_| KvCache::new(c.num_layers, c.num_kv_heads))
        .collect();
    let mut cpu_batch = CpuBatch::new(caches.iter_mut().map(|cache| (cache, time)).collect());
    let logits = forward(
        &Cpu,
        c,
        &weights.decoder(),
        hook,
        &sequences,
        &mut cpu_batch,
    )
    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    Tensor::from_vec(logits, (batch, time, c.vocab_size), &Device::Cpu)
}

impl Transformer {
    /// Logits `(batch, time, vocab)` of the base model for token ids `(batch, time)`, each row a
    /// sequence of its own (the layers on the CPU backend; f32 weights).
    pub fn forward(&self, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, _) = tokens.dims2()?;
        sequence_logits(self, tokens, &NoAdapters, &vec![None; batch])
    }
}
