//! The attention block: RMSNorm'd input projected to queries, keys and values (Qwen3 norms each
//! head's queries and keys), rotary positions, causal grouped-query attention over each
//! sequence's KV cache, and the output projection added into the residual stream.

use opentinker_kernels::{Backend, Heads};

use super::projection::{Adapters, Linear, Run};
use crate::model::{ModelConfig, Site, Target};

/// One layer's attention weights.
pub struct AttentionWeights<'a, B: Backend + ?Sized> {
    pub q: Linear<'a, B>,
    pub k: Linear<'a, B>,
    pub v: Linear<'a, B>,
    pub o: Linear<'a, B>,
    /// Qwen3's per-head RMSNorm of queries and keys.
    pub q_norm: Option<&'a B::Vector>,
    pub k_norm: Option<&'a B::Vector>,
}

/// What every layer's attention shares in one call.
pub(super) struct Context<'c, 'b, B: Backend, H> {
    pub ops: &'c B,
    pub config: &'c ModelConfig,
    pub adapters: &'c H,
    pub runs: &'c [Run],
    pub rows: usize,
    pub cos: &'c B::Vector,
    pub sin: &'c B::Vector,
    pub batch: &'c mut B::Batch<'b>,
}

/// `x += attention(h)` at layer `layer`, where `h` is the normed residual stream.
pub(super) fn attention<B: Backend, H: Adapters<B>>(
    cx: &mut Context<'_, '_, B, H>,
    layer: usize,
    w: &AttentionWeights<'_, B>,
    h: &B::Buffer,
    x: &mut B::Buffer,
) -> Result<(), B::Error> {
    let c = cx.config;
    let (ops, runs) = (cx.ops, cx.runs);
    let eps = c.rms_norm_eps as f32;
    let head_dim = c.head_dim;
    let (q_width, kv_width) = (c.num_heads * head_dim, c.num_kv_heads * head_dim);
    let site = |target| Site::Layer(layer, target);
    let project = |target, linear: &Linear<'_, B>, width: usize| -> Result<B::Buffer, B::Error> {
        let mut y = ops.zeros(cx.rows * width)?;
        cx.adapters
            .project(ops, site(target), runs, h, linear, &mut y, false)?;
        Ok(y)
    };
    let mut q = project(Target::Q, &w.q, q_width)?;
    let mut k = project(Target::K, &w.k, kv_width)?;
    let v = project(Target::V, &w.v, kv_width)?;
    if let (Some(qn), Some(kn)) = (w.q_norm, w.k_norm) {
        ops.rms_norm(&mut q, qn, eps)?;
        ops.rms_norm(&mut k, kn, eps)?;
    }
    ops.rope(cx.batch, &mut q, head_dim, cx.cos, cx.sin)?;
    ops.rope(cx.batch, &mut k, head_dim, cx.cos, cx.sin)?;
    let shape = Heads {
        heads: c.num_heads,
        kv_heads: c.num_kv_heads,
        head_dim,
    };
    let mut attended = ops.zeros(cx.rows * q_width)?;
    ops.attend(cx.batch, layer, shape, &q, &k, &v, &mut attended)?;
    cx.adapters
        .project(ops, site(Target::O), runs, &attended, &w.o, x, true)
}
