//! The MLP block: `down(silu(gate(h)) · up(h))`, added into the residual stream.

use opentinker_kernels::Backend;

use super::attention::Context;
use super::projection::{Adapters, Linear};
use crate::model::{Site, Target};

/// One layer's MLP weights.
pub struct MlpWeights<'a, B: Backend + ?Sized> {
    pub gate: Linear<'a, B>,
    pub up: Linear<'a, B>,
    pub down: Linear<'a, B>,
}

/// `x += mlp(h)` at layer `layer`, where `h` is the normed residual stream.
pub(super) fn mlp<B: Backend, H: Adapters<B>>(
    cx: &mut Context<'_, '_, B, H>,
    layer: usize,
    w: &MlpWeights<'_, B>,
    h: &B::Buffer,
    x: &mut B::Buffer,
) -> Result<(), B::Error> {
    let (ops, runs) = (cx.ops, cx.runs);
    let inter = cx.config.intermediate_size;
    let site = |target| Site::Layer(layer, target);
    let mut gate = ops.zeros(cx.rows * inter)?;
    cx.adapters
        .project(ops, site(Target::Gate), runs, h, &w.gate, &mut gate, false)?;
    let mut up = ops.zeros(cx.rows * inter)?;
    cx.adapters
        .project(ops, site(Target::Up), runs, h, &w.up, &mut up, false)?;
    ops.silu_mul(&mut gate, &up)?;
    cx.adapters
        .project(ops, site(Target::Down), runs, &gate, &w.down, x, true)
}
