//! The candle model's weights as the CPU backend reads them: each tensor's f32 data borrowed in
//! place under its storage lock, never copied.

use candle_core::{CpuStorage, Storage, Tensor};
use opentinker_kernels::Cpu;

use super::layers::{AttentionWeights, DecoderWeights, LayerWeights, Linear, MlpWeights};
use super::transformer::{self, Transformer};

/// A contiguous f32 CPU tensor's data, read in place under its storage lock.
pub struct TensorView<'a> {
    guard: candle_core::StorageRef<'a>,
    range: std::ops::Range<usize>,
}

impl<'a> TensorView<'a> {
    /// Refuses a tensor that is not contiguous f32 on the CPU.
    pub fn of(tensor: &'a Tensor) -> candle_core::Result<Self> {
        let (guard, layout) = tensor.storage_and_layout();
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("the CPU backend needs contiguous weights".into())
        })?;
        if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
            return Err(candle_core::Error::Msg(
                "the CPU backend computes in f32 on the CPU".into(),
            ));
        }
        Ok(TensorView {
            guard,
            range: start..end,
        })
    }

    pub fn slice(&self) -> &[f32] {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(data)) => &data[self.range.clone()],
            _ => &[],
        }
    }
}

struct LinearView<'a> {
    weight: TensorView<'a>,
    bias: Option<TensorView<'a>>,
    inp: usize,
}

impl<'a> LinearView<'a> {
    fn of(linear: &'a transformer::Linear) -> candle_core::Result<Self> {
        Ok(LinearView {
            weight: TensorView::of(&linear.weight)?,
            bias: linear.bias.as_ref().map(TensorView::of).transpose()?,
            inp: linear.weight.dims2()?.1,
        })
    }

    fn linear(&self) -> Linear<'_, Cpu> {
        Linear {
            weight: self.weight.slice(),
            bias: self.bias.as_ref().map(TensorView::slice),
            inp: self.inp,
        }
    }
}

struct LayerView<'a> {
    input_norm: TensorView<'a>,
    q: LinearView<'a>,
    k: LinearView<'a>,
    v: LinearView<'a>,
    o: LinearView<'a>,
    q_norm: Option<TensorView<'a>>,
    k_norm: Option<TensorView<'a>>,
    post_attention_norm: TensorView<'a>,
    gate: LinearView<'a>,
    up: LinearView<'a>,
    down: LinearView<'a>,
}

/// Every weight of a [`Transformer`], borrowed for the CPU backend.
pub struct CpuWeights<'a> {
    embed: TensorView<'a>,
    layers: Vec<LayerView<'a>>,
    norm: TensorView<'a>,
    lm_head: LinearView<'a>,
    cos: TensorView<'a>,
    sin: TensorView<'a>,
    context: usize,
}

impl<'a> CpuWeights<'a> {
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
                    gate: LinearView::of(&l.gate_proj)?,
                    up: LinearView::of(&l.up_proj)?,
                    down: LinearView::of(&l.down_proj)?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(CpuWeights {
            embed: view(&model.embed_tokens)?,
            layers,
            norm: view(&model.norm)?,
            lm_head: LinearView::of(&model.lm_head)?,
            cos: view(&model.cos)?,
            sin: view(&model.sin)?,
            context: model.context_length(),
        })
    }

    /// The weights as the layers take them.
    pub fn decoder(&self) -> DecoderWeights<'_, Cpu> {
        DecoderWeights {
            embed: self.embed.slice(),
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
                    mlp: MlpWeights {
                        gate: l.gate.linear(),
                        up: l.up.linear(),
                        down: l.down.linear(),
                    },
                })
                .collect(),
            norm: self.norm.slice(),
            lm_head: self.lm_head.linear(),
            cos: self.cos.slice(),
            sin: self.sin.slice(),
            context: self.context,
        }
    }
}
