//! LoRA through the model's projection hook ([`Adapters`]) on the CPU backend: each run of rows
//! gets its adapter's delta `scale · (x Aᵀ) Bᵀ` at the projection's site, all runs in one
//! mixed-adapter apply of the kernels.

use std::collections::BTreeMap;

use opentinker_kernels::{Backend, Cpu, LoraPair, Segment};

use super::Adapter;
use crate::model::layers::{Adapters, Linear, Run};
use crate::model::{Site, TensorView};

/// One site's pair, borrowed in place.
struct PairView<'a> {
    a: TensorView<'a>,
    b: TensorView<'a>,
}

struct AdapterView<'a> {
    sites: BTreeMap<Site, PairView<'a>>,
    rank: usize,
    scale: f32,
}

/// The adapters of one forward call, by the index a [`Run`] names, read by the CPU backend.
pub struct CpuAdapters<'a> {
    adapters: Vec<AdapterView<'a>>,
}

impl<'a> CpuAdapters<'a> {
    /// Borrows every pair of `adapters` (refusing one not in f32 on the CPU).
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
                    scale: adapter.config.scale() as f32,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(CpuAdapters { adapters })
    }
}

impl Adapters<Cpu> for CpuAdapters<'_> {
    fn project(
        &self,
        ops: &Cpu,
        site: Site,
        runs: &[Run],
        x: &Vec<f32>,
        linear: &Linear<'_, Cpu>,
        y: &mut Vec<f32>,
        accumulate: bool,
    ) -> Result<(), <Cpu as Backend>::Error> {
        let segments: Vec<Segment<'_>> = runs
            .iter()
            .map(|run| Segment {
                rows: run.rows,
                pair: run.adapter.and_then(|i| {
                    let adapter = &self.adapters[i];
                    adapter.sites.get(&site).map(|pair| LoraPair {
                        a: pair.a.slice(),
                        b: pair.b.slice(),
                        rank: adapter.rank,
                        scale: adapter.scale,
                    })
                }),
            })
            .collect();
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
