//! The attention block: RMSNorm'd input projected to queries, keys and values (Qwen3 and Gemma
//! norm each head's queries and keys), rotary positions (the layer's tables: Gemma's local
//! layers have their own base), causal grouped-query attention (over each sequence's KV cache
//! when sampling, over whole sequences when training; a local layer sees a sliding window), and
//! the output projection. The forward, then its backward.

use opentinker_kernels::{Backend, Backward, Heads};

use super::projection::{AdapterGrads, Adapters, Linear, LinearGrads, Run};
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

/// RoPE's `(context × head_dim)` cos and sin tables.
pub struct Rope<'a, B: Backend + ?Sized> {
    pub cos: &'a B::Vector,
    pub sin: &'a B::Vector,
}

impl<B: Backend + ?Sized> Clone for Rope<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend + ?Sized> Copy for Rope<'_, B> {}

/// The gradients of one layer's attention weights (full-parameter training).
pub struct AttentionGrads<B: Backend> {
    pub q: LinearGrads<B>,
    pub k: LinearGrads<B>,
    pub v: LinearGrads<B>,
    pub o: LinearGrads<B>,
    pub q_norm: Option<B::Buffer>,
    pub k_norm: Option<B::Buffer>,
}

/// What the attention's backward needs of its forward (the normed input is recomputed).
pub(super) struct AttentionTape<B: Backend> {
    /// Queries and keys before the per-head norms, when the model has them.
    q_raw: Option<B::Buffer>,
    k_raw: Option<B::Buffer>,
    /// Queries, keys and values as attended (rotated).
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    attended: B::Buffer,
}

/// What every layer shares in one call.
pub(super) struct Context<'c, 'b, B: Backend, H> {
    pub ops: &'c B,
    pub config: &'c ModelConfig,
    pub adapters: &'c H,
    pub runs: &'c [Run],
    pub rows: usize,
    pub batch: &'c mut B::Batch<'b>,
}

impl<B: Backend, H> Context<'_, '_, B, H> {
    /// The attention's shape at `layer` (its window, where the layer is a local one).
    fn heads(&self, layer: usize) -> Heads {
        Heads {
            heads: self.config.num_heads,
            kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
            window: self.config.attention_window(layer),
        }
    }
}

/// `out = attention(h)` (`out +=` with `accumulate`) at layer `layer` with its RoPE tables,
/// where `h` is the normed residual stream; with `keep`, returns what the backward needs.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention<B: Backend, H: Adapters<B>>(
    cx: &mut Context<'_, '_, B, H>,
    layer: usize,
    w: &AttentionWeights<'_, B>,
    rope: Rope<'_, B>,
    h: &B::Buffer,
    out: &mut B::Buffer,
    accumulate: bool,
    keep: bool,
) -> Result<Option<AttentionTape<B>>, B::Error> {
    let c = cx.config;
    let (ops, runs) = (cx.ops, cx.runs);
    let shape = cx.heads(layer);
    let head_dim = shape.head_dim;
    let (q_width, kv_width) = (shape.heads * head_dim, shape.kv_heads * head_dim);
    let site = |target| Site::Layer(layer, target);
    let project = |target, linear: &Linear<'_, B>, width: usize| -> Result<B::Buffer, B::Error> {
        let mut y = ops.scratch(cx.rows * width)?;
        cx.adapters
            .project(ops, site(target), runs, h, linear, &mut y, false)?;
        Ok(y)
    };
    let mut q = project(Target::Q, &w.q, q_width)?;
    let mut k = project(Target::K, &w.k, kv_width)?;
    let v = project(Target::V, &w.v, kv_width)?;
    let (mut q_raw, mut k_raw) = (None, None);
    if let (Some(qn), Some(kn)) = (w.q_norm, w.k_norm) {
        if keep {
            (q_raw, k_raw) = (Some(ops.copy(&q)?), Some(ops.copy(&k)?));
        }
        ops.rms_norm(&mut q, qn, c.rms_norm_eps)?;
        ops.rms_norm(&mut k, kn, c.rms_norm_eps)?;
    }
    ops.rope(cx.batch, &mut q, head_dim, rope.cos, rope.sin)?;
    ops.rope(cx.batch, &mut k, head_dim, rope.cos, rope.sin)?;
    let mut attended = ops.scratch(cx.rows * q_width)?;
    ops.attend(cx.batch, layer, shape, &q, &k, &v, &mut attended)?;
    cx.adapters
        .project(ops, site(Target::O), runs, &attended, &w.o, out, accumulate)?;
    Ok(keep.then_some(AttentionTape {
        q_raw,
        k_raw,
        q,
        k,
        v,
        attended,
    }))
}

/// The backward of [`attention`] from `dy`, the gradient of its output: returns the gradient
/// of `h`; the adapters and (when given) `grads` accumulate theirs.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_backward<B: Backward, H: AdapterGrads<B>>(
    cx: &mut Context<'_, '_, B, H>,
    layer: usize,
    w: &AttentionWeights<'_, B>,
    rope: Rope<'_, B>,
    h: &B::Buffer,
    tape: &AttentionTape<B>,
    dy: &B::Buffer,
    mut grads: Option<&mut AttentionGrads<B>>,
) -> Result<B::Buffer, B::Error> {
    let c = cx.config;
    let (ops, runs) = (cx.ops, cx.runs);
    let shape = cx.heads(layer);
    let head_dim = shape.head_dim;
    let (q_width, kv_width) = (shape.heads * head_dim, shape.kv_heads * head_dim);
    let site = |target| Site::Layer(layer, target);
    // Through the output projection.
    let mut d_attended = ops.zeros(cx.rows * q_width)?;
    cx.adapters.project_backward(
        ops,
        site(Target::O),
        runs,
        &tape.attended,
        &w.o,
        dy,
        &mut d_attended,
    )?;
    if let Some(g) = grads.as_deref_mut() {
        g.o.accumulate(ops, &tape.attended, dy, w.o.inp)?;
    }
    // Through the attention, the rotation and the per-head norms.
    let mut dq = ops.zeros(cx.rows * q_width)?;
    let (mut dk, mut dv) = (
        ops.zeros(cx.rows * kv_width)?,
        ops.zeros(cx.rows * kv_width)?,
    );
    ops.attend_backward(
        cx.batch,
        layer,
        shape,
        &tape.q,
        &tape.k,
        &tape.v,
        &tape.attended,
        &d_attended,
        &mut dq,
        &mut dk,
        &mut dv,
    )?;
    ops.rope_backward(cx.batch, &mut dq, head_dim, rope.cos, rope.sin)?;
    ops.rope_backward(cx.batch, &mut dk, head_dim, rope.cos, rope.sin)?;
    if let (Some(qn), Some(kn), Some(q_raw), Some(k_raw)) =
        (w.q_norm, w.k_norm, &tape.q_raw, &tape.k_raw)
    {
        let (mut dq_raw, mut dk_raw) = (
            ops.zeros(cx.rows * q_width)?,
            ops.zeros(cx.rows * kv_width)?,
        );
        let (dqn, dkn) = match grads.as_deref_mut() {
            Some(g) => (g.q_norm.as_mut(), g.k_norm.as_mut()),
            None => (None, None),
        };
        ops.rms_norm_backward(q_raw, qn, c.rms_norm_eps, &dq, &mut dq_raw, dqn)?;
        ops.rms_norm_backward(k_raw, kn, c.rms_norm_eps, &dk, &mut dk_raw, dkn)?;
        (dq, dk) = (dq_raw, dk_raw);
    }
    // Through the input projections.
    let mut dh = ops.zeros(cx.rows * c.hidden_size)?;
    for (target, linear, d) in [
        (Target::Q, &w.q, &dq),
        (Target::K, &w.k, &dk),
        (Target::V, &w.v, &dv),
    ] {
        cx.adapters
            .project_backward(ops, site(target), runs, h, linear, d, &mut dh)?;
    }
    if let Some(g) = grads {
        g.q.accumulate(ops, h, &dq, w.q.inp)?;
        g.k.accumulate(ops, h, &dk, w.k.inp)?;
        g.v.accumulate(ops, h, &dv, w.v.inp)?;
    }
    Ok(dh)
}
