//! LoRA through the model's projection hook on a CUDA device (feature `cuda`): every projection
//! site keeps a pool of adapter slots on the device ([`GpuAdapterPools`]), and a forward call's
//! runs of rows become one [`LoraBatch`] of tiles, made at the call's first adapted projection
//! and used at every site after it ([`GpuAdapters`]).

use std::cell::RefCell;
use std::collections::BTreeMap;

use candle_core::Tensor;
use opentinker_kernels::Backend;
use opentinker_kernels::cuda::{
    AdapterRef, CudaSlice, DeviceSegment, Gpu, GpuError, LoraBatch, LoraPool, LoraSite,
};

use super::Adapter;
use crate::model::layers::{Adapters, Linear, Run};
use crate::model::{ModelConfig, Site, Target};

/// Why an adapter could not be put on the device.
#[derive(Debug, thiserror::Error)]
pub enum GpuAdapterError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("reading the adapter's weights: {0}")]
    Weights(#[from] candle_core::Error),
    #[error("the GPU adapter pools do not apply adapters of the unembedding yet")]
    Unembedding,
    #[error("no adapter pool at {0:?} (the pools were made with no slots?)")]
    NoPool(Site),
}

/// A tensor's values in f32 on the host, in row-major order.
pub(super) fn host_values(tensor: &Tensor) -> candle_core::Result<Vec<f32>> {
    tensor
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()
}

/// Every projection site's adapter slots on one device: slot `s` of each site holds one adapter
/// (zeros where that adapter does not reach the site).
pub struct GpuAdapterPools {
    pools: BTreeMap<Site, LoraPool>,
}

impl GpuAdapterPools {
    /// `slots` empty slots of rank up to `max_rank` at every projection of `config`'s layers
    /// (none when `slots` is 0).
    pub fn new(
        gpu: &Gpu,
        config: &ModelConfig,
        slots: usize,
        max_rank: usize,
    ) -> Result<GpuAdapterPools, GpuError> {
        let mut pools = BTreeMap::new();
        if slots > 0 {
            for layer in 0..config.num_layers {
                for target in Target::ATTENTION.into_iter().chain(Target::MLP) {
                    let (out, inp) = target.shape(config);
                    let pool = LoraPool::new(gpu, slots, inp, out, max_rank)?;
                    pools.insert(Site::Layer(layer, target), pool);
                }
            }
        }
        Ok(GpuAdapterPools { pools })
    }

    /// Copies `adapter` into `slot` of every site (zeros at the sites it does not adapt).
    pub fn load(
        &mut self,
        gpu: &Gpu,
        slot: usize,
        adapter: &Adapter,
    ) -> Result<AdapterRef, GpuAdapterError> {
        if adapter.sites.contains_key(&Site::Unembed) {
            return Err(GpuAdapterError::Unembedding);
        }
        let rank = adapter.config.rank;
        if let Some(site) = adapter.sites.keys().find(|s| !self.pools.contains_key(s)) {
            return Err(GpuAdapterError::NoPool(*site));
        }
        // Every site's slot is written: zeros where the adapter does not reach, so a slot that
        // held another adapter keeps none of its pairs.
        for (site, pool) in &mut self.pools {
            let (a, b) = match adapter.sites.get(site) {
                Some(pair) => (
                    host_values(pair.a.as_tensor())?,
                    host_values(pair.b.as_tensor())?,
                ),
                None => {
                    let (inp, out) = pool.shape();
                    (vec![0.0; rank * inp], vec![0.0; out * rank])
                }
            };
            pool.write(gpu, slot, &a, &b, rank)?;
        }
        Ok(AdapterRef {
            slot,
            rank,
            scale: adapter.config.scale() as f32,
        })
    }

    /// A random adapter of `rank` on every projection in `slot` (`B` non-zero, so it changes
    /// the model), for benchmarks.
    pub fn random(
        &mut self,
        gpu: &Gpu,
        config: &ModelConfig,
        slot: usize,
        rank: usize,
        seed: u64,
    ) -> Result<AdapterRef, GpuError> {
        for (index, (site, pool)) in self.pools.iter_mut().enumerate() {
            let (out, inp) = site.shape(config);
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64;
            let mut next = |bound: f32| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
            };
            let a: Vec<f32> = (0..rank * inp)
                .map(|_| next(1.0 / (inp as f32).sqrt()))
                .collect();
            let b: Vec<f32> = (0..out * rank).map(|_| next(0.01)).collect();
            pool.write(gpu, slot, &a, &b, rank)?;
        }
        Ok(AdapterRef {
            slot,
            rank,
            scale: 2.0,
        })
    }

    /// The hook of one forward call whose runs name `adapters` by index.
    pub fn hook(&self, adapters: Vec<AdapterRef>) -> GpuAdapters<'_> {
        GpuAdapters {
            pools: &self.pools,
            adapters,
            batch: RefCell::new(None),
        }
    }
}

/// The adapters of one forward call on the device, by the index a [`Run`] names. The call's
/// tiles are made once, at its first adapted projection, for its runs; the unembedding's runs
/// (only the rows whose logits are wanted) never need them, as no pool adapts it.
pub struct GpuAdapters<'a> {
    pools: &'a BTreeMap<Site, LoraPool>,
    adapters: Vec<AdapterRef>,
    /// The runs the tiles were made for, and the tiles with their scratch.
    batch: RefCell<Option<(Vec<Run>, LoraBatch)>>,
}

impl GpuAdapters<'_> {
    fn segments(&self, runs: &[Run]) -> Result<Vec<DeviceSegment>, GpuError> {
        runs.iter()
            .map(|run| {
                let adapter = run
                    .adapter
                    .map(|index| {
                        self.adapters.get(index).copied().ok_or_else(|| {
                            GpuError::InvalidArgument(format!(
                                "a run names adapter {index} of {}",
                                self.adapters.len()
                            ))
                        })
                    })
                    .transpose()?;
                Ok(DeviceSegment {
                    rows: run.rows,
                    adapter,
                })
            })
            .collect()
    }
}

impl Adapters<Gpu> for GpuAdapters<'_> {
    fn adapts(&self, site: Site, runs: &[Run]) -> bool {
        self.pools.contains_key(&site) && runs.iter().any(|run| run.adapter.is_some())
    }

    fn project(
        &self,
        ops: &Gpu,
        site: Site,
        runs: &[Run],
        x: &CudaSlice<f32>,
        linear: &Linear<'_, Gpu>,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let project = |lora: Option<LoraSite<'_>>, y: &mut CudaSlice<f32>| {
            ops.project(
                x,
                linear.weight,
                linear.inp,
                linear.bias,
                lora,
                y,
                accumulate,
            )
        };
        let pool = match self.pools.get(&site) {
            Some(pool) if self.adapts(site, runs) => pool,
            _ => return project(None, y),
        };
        let mut kept = self.batch.borrow_mut();
        let batch = match &mut *kept {
            Some((made_for, batch)) if made_for == runs => batch,
            slot => {
                let batch = ops.lora_batch(&self.segments(runs)?)?;
                &mut slot.insert((runs.to_vec(), batch)).1
            }
        };
        project(Some(LoraSite { pool, batch }), y)
    }
}
