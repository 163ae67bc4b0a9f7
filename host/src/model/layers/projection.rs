//! A projection `x · Wᵀ + b` and the hook through which adapters add their deltas.

use opentinker_kernels::Backend;

use crate::model::Site;

/// A projection's weights in the backend's storage: `weight (out × inp)` and an optional bias.
pub struct Linear<'a, B: Backend + ?Sized> {
    pub weight: &'a B::Matrix,
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
