//! A projection `x · Wᵀ + b` and the hook through which adapters add their deltas.

use opentinker_kernels::{Backend, Backward};

use crate::model::Site;

/// A projection's weights in the backend's storage: `weight (out × inp)` and an optional bias.
pub struct Linear<'a, B: Backend + ?Sized> {
    pub weight: B::Matrix<'a>,
    pub bias: Option<&'a B::Vector>,
    pub inp: usize,
}

/// A run of a call's consecutive rows that share one adapter: `adapter` indexes the hook's
/// adapters (`None`: the base model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub rows: usize,
    pub adapter: Option<usize>,
}

/// The runs of rows of a call, adjacent runs of one adapter merged.
pub(super) fn runs(per_sequence: impl Iterator<Item = Run>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for run in per_sequence {
        match runs.last_mut() {
            Some(last) if last.adapter == run.adapter => last.rows += run.rows,
            _ => runs.push(run),
        }
    }
    runs
}

/// How each projection of a forward call is computed: the base projection plus, for each run
/// of rows, its adapter's delta at the projection's site. LoRA implements it; the model only
/// names the site.
pub trait Adapters<B: Backend> {
    /// Whether any of `runs` has an adapter at `site`.
    fn adapts(&self, site: Site, runs: &[Run]) -> bool;

    /// `y = x · Wᵀ + b + ` each run's delta at `site` (`y +=` all that when `accumulate`).
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        ops: &B,
        site: Site,
        runs: &[Run],
        x: &B::Buffer,
        linear: &Linear<'_, B>,
        y: &mut B::Buffer,
        accumulate: bool,
    ) -> Result<(), B::Error>;
}

/// The base model: no adapter anywhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoAdapters;

impl<B: Backend> Adapters<B> for NoAdapters {
    fn adapts(&self, _site: Site, _runs: &[Run]) -> bool {
        false
    }

    fn project(
        &self,
        ops: &B,
        _site: Site,
        _runs: &[Run],
        x: &B::Buffer,
        linear: &Linear<'_, B>,
        y: &mut B::Buffer,
        accumulate: bool,
    ) -> Result<(), B::Error> {
        ops.project(
            x,
            linear.weight,
            linear.inp,
            linear.bias,
            None,
            y,
            accumulate,
        )
    }
}

/// The backward of each projection: the input's gradient through the base weight and the
/// adapters, and each trained adapter's own gradients, which the hook accumulates.
pub trait AdapterGrads<B: Backward>: Adapters<B> {
    /// `dx += ` the gradient of `x` from `dy`, the gradient of the projection's output at
    /// `site`; each trained run's pair gradients `+=` theirs.
    #[allow(clippy::too_many_arguments)]
    fn project_backward(
        &self,
        ops: &B,
        site: Site,
        runs: &[Run],
        x: &B::Buffer,
        linear: &Linear<'_, B>,
        dy: &B::Buffer,
        dx: &mut B::Buffer,
    ) -> Result<(), B::Error>;
}

impl<B: Backward> AdapterGrads<B> for NoAdapters {
    fn project_backward(
        &self,
        ops: &B,
        _site: Site,
        _runs: &[Run],
        x: &B::Buffer,
        linear: &Linear<'_, B>,
        dy: &B::Buffer,
        dx: &mut B::Buffer,
    ) -> Result<(), B::Error> {
        ops.project_backward(x, linear.weight, linear.inp, None, dy, dx)
    }
}

/// The gradients of one projection's weights (full-parameter training).
pub struct LinearGrads<B: Backend> {
    pub weight: B::Buffer,
    pub bias: Option<B::Buffer>,
}

impl<B: Backend> LinearGrads<B> {
    /// Zero gradients for a `out × inp` weight (and an `out` bias when `bias`).
    pub fn zeros(ops: &B, out: usize, inp: usize, bias: bool) -> Result<Self, B::Error> {
        Ok(LinearGrads {
            weight: ops.zeros(out * inp)?,
            bias: if bias { Some(ops.zeros(out)?) } else { None },
        })
    }
}

impl<B: Backward> LinearGrads<B> {
    /// `+=` the weight gradient of a projection of `x` whose output's gradient is `dy`.
    pub(super) fn accumulate(
        &mut self,
        ops: &B,
        x: &B::Buffer,
        dy: &B::Buffer,
        inp: usize,
    ) -> Result<(), B::Error> {
        ops.weight_gradient(x, dy, inp, &mut self.weight, self.bias.as_mut())
    }
}
