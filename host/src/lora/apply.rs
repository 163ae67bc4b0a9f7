//! LoRA through the model's projection hook ([`Adapters`], [`AdapterGrads`]) on the CPU
//! backends: each run of rows gets its adapter's delta `scale · (x Aᵀ) Bᵀ` at the projection's
//! site, all runs in one mixed-adapter apply of the kernels; in training, each adapter's `A` and
//! `B` gradients accumulate here, by site.

use std::cell::RefCell;
use std::collections::BTreeMap;

use candle_core::WithDType;
use opentinker_kernels::{
    Backend, Backward, Float, LoraGrad, LoraGrads, LoraPair, Segment, Weight,
};

use super::Adapter;
use crate::model::layers::{AdapterGrads, Adapters, Linear, Run};
use crate::model::{Site, TensorView};

/// One site's pair, borrowed in place.
struct PairView<'a, T> {
    a: TensorView<'a, T>,
    b: TensorView<'a, T>,
}

struct AdapterView<'a, T> {
    sites: BTreeMap<Site, PairView<'a, T>>,
    rank: usize,
    scale: f64,
}

/// The `A` and `B` gradients of one adapter, by site.
pub type PairGradients<T> = BTreeMap<Site, (Vec<T>, Vec<T>)>;

/// The adapters of one forward call, by the index a [`Run`] names, read by a CPU backend in
/// `T`; made with [`CpuAdapters::training`], they also gather their gradients.
pub struct CpuAdapters<'a, T = f32> {
    adapters: Vec<AdapterView<'a, T>>,
    gradients: Option<RefCell<Vec<PairGradients<T>>>>,
}

impl<'a, T: WithDType + Float> CpuAdapters<'a, T> {
    /// Borrows every pair of `adapters` (refusing one not in `T` on the CPU).
    pub fn of(adapters: &[&'a Adapter]) -> candle_core::Result<Self> {
        let adapters = adapters
            .iter()
            .map(|adapter| {
                let sites = adapter
                    .sites
                    .iter()
                    .map(|(site, pair)| {
                        Ok((
                            *site,
                            PairView {
                                a: TensorView::of(pair.a.as_tensor())?,
                                b: TensorView::of(pair.b.as_tensor())?,
                            },
                        ))
                    })
                    .collect::<candle_core::Result<_>>()?;
                Ok(AdapterView {
                    sites,
                    rank: adapter.config.rank,
                    scale: adapter.config.scale(),
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(CpuAdapters {
            adapters,
            gradients: None,
        })
    }

    /// As [`CpuAdapters::of`], gathering each adapter's gradients (read them with
    /// [`CpuAdapters::into_gradients`]).
    pub fn training(adapters: &[&'a Adapter]) -> candle_core::Result<Self> {
        let mut hook = Self::of(adapters)?;
        hook.gradients = Some(RefCell::new(vec![BTreeMap::new(); adapters.len()]));
        Ok(hook)
    }

    /// Per adapter (in the order given), the gradients gathered by the backward passes: only
    /// the sites a backward reached.
    pub fn into_gradients(self) -> Vec<PairGradients<T>> {
        self.gradients.map(RefCell::into_inner).unwrap_or_default()
    }

    /// Each run's pair at `site`.
    fn segments(&self, site: Site, runs: &[Run]) -> Vec<Segment<'_, T>> {
        runs.iter()
            .map(|run| Segment {
                rows: run.rows,
                pair: run.adapter.and_then(|i| {
                    let adapter = &self.adapters[i];
                    adapter.sites.get(&site).map(|pair| LoraPair {
                        a: pair.a.slice(),
                        b: pair.b.slice(),
                        rank: adapter.rank,
                        scale: T::of(adapter.scale),
                    })
                }),
            })
            .collect()
    }

    fn adapts_at(&self, site: Site, runs: &[Run]) -> bool {
        runs.iter()
            .filter_map(|run| run.adapter)
            .any(|i| self.adapters[i].sites.contains_key(&site))
    }
}

/// Both CPU backends take the adapters as the kernels' segments of host slices.
impl<T, B> Adapters<B> for CpuAdapters<'_, T>
where
    T: WithDType + Float,
    B: for<'a> Backend<
            Buffer = Vec<T>,
            Matrix<'a> = Weight<'a, T>,
            Vector = [T],
            Lora<'a> = &'a [Segment<'a, T>],
        >,
{
    fn adapts(&self, site: Site, runs: &[Run]) -> bool {
        self.adapts_at(site, runs)
    }

    fn project(
        &self,
        ops: &B,
        site: Site,
        runs: &[Run],
        x: &Vec<T>,
        linear: &Linear<'_, B>,
        y: &mut Vec<T>,
        accumulate: bool,
    ) -> Result<(), B::Error> {
        let segments = self.segments(site, runs);
        ops.project(
            x,
            linear.weight,
            linear.inp,
            linear.bias,
            Some(&segments),
            y,
            accumulate,
        )
    }
}

/// The training backend's LoRA gradients, per segment, gathered by adapter and site.
impl<T, B> AdapterGrads<B> for CpuAdapters<'_, T>
where
    T: WithDType + Float,
    B: for<'a> Backward<
            Buffer = Vec<T>,
            Matrix<'a> = Weight<'a, T>,
            Vector = [T],
            Lora<'a> = &'a [Segment<'a, T>],
            LoraGrads<'a> = LoraGrads<'a, T>,
        >,
{
    fn project_backward(
        &self,
        ops: &B,
        site: Site,
        runs: &[Run],
        x: &Vec<T>,
        linear: &Linear<'_, B>,
        dy: &Vec<T>,
        dx: &mut Vec<T>,
    ) -> Result<(), B::Error> {
        let segments = self.segments(site, runs);
        // Each run's gradients into a buffer of its own (one adapter may serve two runs), then
        // into its adapter's.
        let inp = linear.inp;
        let out = linear.weight.len() / inp;
        let mut parts: Vec<Option<(Vec<T>, Vec<T>)>> = segments
            .iter()
            .map(|s| {
                let trains = self.gradients.is_some();
                s.pair
                    .filter(|_| trains)
                    .map(|p| (vec![T::zero(); p.rank * inp], vec![T::zero(); out * p.rank]))
            })
            .collect();
        let grads = parts
            .iter_mut()
            .map(|p| p.as_mut().map(|(a, b)| LoraGrad { a, b }))
            .collect();
        let lora = LoraGrads {
            segments: &segments,
            grads,
        };
        ops.project_backward(x, linear.weight, inp, Some(lora), dy, dx)?;
        if let Some(gradients) = &self.gradients {
            let mut gradients = gradients.borrow_mut();
            for (run, part) in runs.iter().zip(parts) {
                let (Some(index), Some((da, db))) = (run.adapter, part) else {
                    continue;
                };
                let (ga, gb) = gradients[index]
                    .entry(site)
                    .or_insert_with(|| (vec![T::zero(); da.len()], vec![T::zero(); db.len()]));
                ga.iter_mut().zip(&da).for_each(|(g, d)| *g += *d);
                gb.iter_mut().zip(&db).for_each(|(g, d)| *g += *d);
            }
        }
        Ok(())
    }
}
