//! The MLP block: `down(act(gate(h)) · up(h))`, the activation SiLU or GELU's tanh form as the
//! model's features say. The forward, then its backward.

use opentinker_kernels::{Backend, Backward};

use super::attention::Context;
use super::projection::{AdapterGrads, Adapters, Linear, LinearGrads};
use crate::model::{Site, Target};

/// One layer's MLP weights.
pub struct MlpWeights<'a, B: Backend + ?Sized> {
    pub gate: Linear<'a, B>,
    pub up: Linear<'a, B>,
    pub down: Linear<'a, B>,
}

/// The gradients of one layer's MLP weights (full-parameter training).
pub struct MlpGrads<B: Backend> {
    pub gate: LinearGrads<B>,
    pub up: LinearGrads<B>,
    pub down: LinearGrads<B>,
}

/// What the MLP's backward needs of its forward: the gate before its activation, and the up
/// projection (their product is recomputed).
pub(super) struct MlpTape<B: Backend> {
    gate: B::Buffer,
    up: B::Buffer,
}

/// `out = mlp(h)` (`out +=` with `accumulate`) at layer `layer`, where `h` is the normed
/// residual stream; with `keep`, returns what the backward needs.
#[allow(clippy::too_many_arguments)]
pub(super) fn mlp<B: Backend, H: Adapters<B>>(
    cx: &mut Context<'_, '_, B, H>,
    layer: usize,
    w: &MlpWeights<'_, B>,
    h: &B::Buffer,
    out: &mut B::Buffer,
    accumulate: bool,
    keep: bool,
) -> Result<Option<MlpTape<B>>, B::Error> {
    let activation = cx.config.features.activation;
    let (ops, runs) = (cx.ops, cx.runs);
    let inter = cx.config.intermediate_size;
    let site = |target| Site::Layer(layer, target);
    let mut gate = ops.scratch(cx.rows * inter)?;
    cx.adapters
        .project(ops, site(Target::Gate), runs, h, &w.gate, &mut gate, false)?;
    let mut up = ops.scratch(cx.rows * inter)?;
    cx.adapters
        .project(ops, site(Target::Up), runs, h, &w.up, &mut up, false)?;
    let gate_raw = if keep { Some(ops.copy(&gate)?) } else { None };
    ops.gate_mul(activation, &mut gate, &up)?;
    cx.adapters.project(
        ops,
        site(Target::Down),
        runs,
        &gate,
        &w.down,
        out,
        accumulate,
    )?;
    Ok(gate_raw.map(|gate| MlpTape { gate, up }))
}

/// The backward of [`mlp`] from `dy`, the gradient of its output: returns the gradient of `h`;
/// the adapters and (when given) `grads` accumulate theirs.
pub(super) fn mlp_backward<B: Backward, H: AdapterGrads<B>>(
    cx: &mut Context<'_, '_, B, H>,
    layer: usize,
    w: &MlpWeights<'_, B>,
    h: &B::Buffer,
    tape: &MlpTape<B>,
    dy: &B::Buffer,
    grads: Option<&mut MlpGrads<B>>,
) -> Result<B::Buffer, B::Error> {
    let (ops, runs) = (cx.ops, cx.runs);
    let (inter, hidden) = (cx.config.intermediate_size, cx.config.hidden_size);
    let site = |target| Site::Layer(layer, target);
    let activation = cx.config.features.activation;
    let mut activated = ops.copy(&tape.gate)?;
    ops.gate_mul(activation, &mut activated, &tape.up)?;
    let mut d_activated = ops.zeros(cx.rows * inter)?;
    cx.adapters.project_backward(
        ops,
        site(Target::Down),
        runs,
        &activated,
        &w.down,
        dy,
        &mut d_activated,
    )?;
    let (mut d_gate, mut d_up) = (ops.zeros(cx.rows * inter)?, ops.zeros(cx.rows * inter)?);
    ops.gate_mul_backward(
        activation,
        &tape.gate,
        &tape.up,
        &d_activated,
        &mut d_gate,
        &mut d_up,
    )?;
    let mut dh = ops.zeros(cx.rows * hidden)?;
    cx.adapters
        .project_backward(ops, site(Target::Gate), runs, h, &w.gate, &d_gate, &mut dh)?;
    cx.adapters
        .project_backward(ops, site(Target::Up), runs, h, &w.up, &d_up, &mut dh)?;
    if let Some(g) = grads {
        g.down.accumulate(ops, &activated, dy, w.down.inp)?;
        g.gate.accumulate(ops, h, &d_gate, w.gate.inp)?;
        g.up.accumulate(ops, h, &d_up, w.up.inp)?;
    }
    Ok(dh)
}
