//! LoRA through the model's projection hook in training on a CUDA device (feature `cuda`): each
//! adapter's pairs in buffers of their own on the device ([`GpuAdapterWeights`]), and the hook of
//! one training pass ([`GpuTrainAdapters`]) that gives each run of rows its adapter's delta and,
//! in the backward, gathers each adapter's `A` and `B` gradients by site on the device, as
//! `CpuAdapters` does on the host (a run's gradients into buffers of their own, then added to
//! its adapter's in run order). [`GpuTrainedAdapter`] keeps an adapter's AdamW moments on the
//! device too, and steps it there; the functions on [`GpuPairGradients`] add, copy, check and
//! download gradients kept there between passes.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use candle_core::Tensor;
use opentinker_kernels::cuda::{
    AdamStep, CudaSlice, Gpu, GpuError, GpuLoraGrad, GpuLoraGrads, GpuLoraPair, GpuLoraSegment,
    GpuTrain,
};
use opentinker_kernels::{Backend, Backward};

use super::apply::PairGradients;
use super::gpu::host_values;
use super::{Adapter, GpuAdapterError};
use crate::model::Site;
use crate::model::layers::{AdapterGrads, Adapters, Linear, Run};

/// `A (rank × in)` and `B (out × rank)` on the device (or their gradients).
pub struct GpuPair {
    pub a: CudaSlice<f32>,
    pub b: CudaSlice<f32>,
}

/// One adapter's gradients on the device, by site.
pub type GpuPairGradients = BTreeMap<Site, GpuPair>;

/// One adapter's pairs on the device, by site, in f32.
pub struct GpuAdapterWeights {
    sites: BTreeMap<Site, GpuPair>,
    rank: usize,
    scale: f32,
}

impl GpuAdapterWeights {
    /// Copies every pair of `adapter` to the device.
    pub fn upload(gpu: &Gpu, adapter: &Adapter) -> Result<Self, GpuAdapterError> {
        let sites = adapter
            .sites
            .iter()
            .map(|(site, pair)| {
                let pair = GpuPair {
                    a: gpu.upload(&host_values(pair.a.as_tensor())?)?,
                    b: gpu.upload(&host_values(pair.b.as_tensor())?)?,
                };
                Ok((*site, pair))
            })
            .collect::<Result<_, GpuAdapterError>>()?;
        Ok(GpuAdapterWeights {
            sites,
            rank: adapter.config.rank,
            scale: adapter.config.scale() as f32,
        })
    }

    /// Every pair's values on the host, by site (to publish or save what trained here).
    pub fn download(&self, gpu: &Gpu) -> Result<PairGradients<f32>, GpuError> {
        self.sites
            .iter()
            .map(|(site, pair)| Ok((*site, (gpu.download(&pair.a)?, gpu.download(&pair.b)?))))
            .collect()
    }
}

/// The adapters of one training pass on the device, by the index a [`Run`] names; made with
/// [`GpuTrainAdapters::training`], they also gather their gradients.
pub struct GpuTrainAdapters<'a> {
    adapters: Vec<&'a GpuAdapterWeights>,
    gradients: Option<RefCell<Vec<GpuPairGradients>>>,
}

impl<'a> GpuTrainAdapters<'a> {
    /// The hook of a pass without a backward.
    pub fn of(adapters: Vec<&'a GpuAdapterWeights>) -> Self {
        GpuTrainAdapters {
            adapters,
            gradients: None,
        }
    }

    /// As [`GpuTrainAdapters::of`], gathering each adapter's gradients (read them with
    /// [`GpuTrainAdapters::into_gradients`]).
    pub fn training(adapters: Vec<&'a GpuAdapterWeights>) -> Self {
        let gradients = adapters.iter().map(|_| BTreeMap::new()).collect();
        GpuTrainAdapters {
            adapters,
            gradients: Some(RefCell::new(gradients)),
        }
    }

    /// Per adapter (in the order given), the gradients the backward passes gathered, on the
    /// host: only the sites a backward reached.
    pub fn into_gradients(self, ops: &GpuTrain<'_>) -> Result<Vec<PairGradients<f32>>, GpuError> {
        self.into_device_gradients()
            .into_iter()
            .map(|sites| {
                sites
                    .into_iter()
                    .map(|(site, pair)| Ok((site, (ops.download(pair.a)?, ops.download(pair.b)?))))
                    .collect()
            })
            .collect()
    }

    /// As [`GpuTrainAdapters::into_gradients`], left on the device.
    pub fn into_device_gradients(self) -> Vec<GpuPairGradients> {
        self.gradients.map(RefCell::into_inner).unwrap_or_default()
    }

    /// Each run's pair at `site`.
    fn segments(&self, site: Site, runs: &[Run]) -> Vec<GpuLoraSegment<'_>> {
        runs.iter()
            .map(|run| GpuLoraSegment {
                rows: run.rows,
                pair: run.adapter.and_then(|i| {
                    let adapter = self.adapters.get(i)?;
                    adapter.sites.get(&site).map(|pair| GpuLoraPair {
                        a: &pair.a,
                        b: &pair.b,
                        rank: adapter.rank,
                        scale: adapter.scale,
                    })
                }),
            })
            .collect()
    }
}

impl<'g> Adapters<GpuTrain<'g>> for GpuTrainAdapters<'_> {
    fn adapts(&self, site: Site, runs: &[Run]) -> bool {
        runs.iter()
            .filter_map(|run| run.adapter)
            .filter_map(|i| self.adapters.get(i))
            .any(|adapter| adapter.sites.contains_key(&site))
    }

    fn project(
        &self,
        ops: &GpuTrain<'g>,
        site: Site,
        runs: &[Run],
        x: &CudaSlice<f32>,
        linear: &Linear<'_, GpuTrain<'g>>,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
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

impl<'g> AdapterGrads<GpuTrain<'g>> for GpuTrainAdapters<'_> {
    fn project_backward(
        &self,
        ops: &GpuTrain<'g>,
        site: Site,
        runs: &[Run],
        x: &CudaSlice<f32>,
        linear: &Linear<'_, GpuTrain<'g>>,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let segments = self.segments(site, runs);
        let inp = linear.inp;
        let out = dy.len() / (x.len() / inp.max(1)).max(1);
        // Each run's gradients into buffers of their own (one adapter may serve two runs),
        // then into its adapter's.
        let trains = self.gradients.is_some();
        let mut parts: Vec<Option<GpuPair>> = segments
            .iter()
            .map(|segment| {
                segment
                    .pair
                    .as_ref()
                    .filter(|_| trains)
                    .map(|pair| {
                        Ok(GpuPair {
                            a: ops.zeros(pair.rank * inp)?,
                            b: ops.zeros(out * pair.rank)?,
                        })
                    })
                    .transpose()
            })
            .collect::<Result<_, GpuError>>()?;
        let grads = parts
            .iter_mut()
            .map(|part| {
                part.as_mut().map(|pair| GpuLoraGrad {
                    a: &mut pair.a,
                    b: &mut pair.b,
                })
            })
            .collect();
        let lora = GpuLoraGrads {
            segments: &segments,
            grads,
        };
        ops.project_backward(x, linear.weight, inp, Some(lora), dy, dx)?;
        if let Some(gradients) = &self.gradients {
            let mut gradients = gradients.borrow_mut();
            for (run, part) in runs.iter().zip(parts) {
                let (Some(index), Some(part)) = (run.adapter, part) else {
                    continue;
                };
                let Some(sites) = gradients.get_mut(index) else {
                    continue;
                };
                match sites.entry(site) {
                    Entry::Vacant(entry) => {
                        entry.insert(part);
                    }
                    Entry::Occupied(mut entry) => {
                        let sum = entry.get_mut();
                        ops.add(&mut sum.a, &part.a)?;
                        ops.add(&mut sum.b, &part.b)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// AdamW's first and second moments of an adapter's tensors, on the host.
pub type HostMoments = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// An adapter trained on the device: its pairs, AdamW's moments of each, and its step count.
pub struct GpuTrainedAdapter {
    pub weights: GpuAdapterWeights,
    /// Per site, the first and second moments of `A` and of `B`.
    moments: BTreeMap<Site, (GpuPair, GpuPair)>,
    step: u64,
}

impl GpuTrainedAdapter {
    /// `adapter`'s pairs on the device with AdamW's `moments` (first and second, per tensor in
    /// [`Adapter::named_tensors`]'s order; `None`: zeros) after `step` steps.
    pub fn upload(
        gpu: &Gpu,
        adapter: &Adapter,
        moments: Option<(&[Tensor], &[Tensor])>,
        step: u64,
    ) -> Result<Self, GpuAdapterError> {
        let weights = GpuAdapterWeights::upload(gpu, adapter)?;
        let mut trained = GpuTrainedAdapter::new(gpu, weights)?;
        trained.step = step;
        let Some((first, second)) = moments else {
            return Ok(trained);
        };
        let tensors = 2 * trained.moments.len();
        if first.len() != tensors || second.len() != tensors {
            return Err(GpuAdapterError::Weights(candle_core::Error::Msg(format!(
                "{} and {} moments for {tensors} tensors",
                first.len(),
                second.len()
            ))));
        }
        let up = |t: &Tensor| -> Result<CudaSlice<f32>, GpuAdapterError> {
            Ok(gpu.upload(&host_values(t)?)?)
        };
        for (i, (m, v)) in trained.moments.values_mut().enumerate() {
            *m = GpuPair {
                a: up(&first[2 * i])?,
                b: up(&first[2 * i + 1])?,
            };
            *v = GpuPair {
                a: up(&second[2 * i])?,
                b: up(&second[2 * i + 1])?,
            };
        }
        Ok(trained)
    }

    /// The moments on the host, first and second, per tensor in [`Adapter::named_tensors`]'s
    /// order.
    pub fn download_moments(&self, gpu: &Gpu) -> Result<HostMoments, GpuError> {
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for (m, v) in self.moments.values() {
            first.extend([gpu.download(&m.a)?, gpu.download(&m.b)?]);
            second.extend([gpu.download(&v.a)?, gpu.download(&v.b)?]);
        }
        Ok((first, second))
    }

    /// `weights` with zero moments, at step 0.
    pub fn new(gpu: &Gpu, weights: GpuAdapterWeights) -> Result<Self, GpuError> {
        let zeros = |pair: &GpuPair| -> Result<GpuPair, GpuError> {
            Ok(GpuPair {
                a: gpu.zeros(pair.a.len())?,
                b: gpu.zeros(pair.b.len())?,
            })
        };
        let moments = weights
            .sites
            .iter()
            .map(|(site, pair)| Ok((*site, (zeros(pair)?, zeros(pair)?))))
            .collect::<Result<_, GpuError>>()?;
        Ok(GpuTrainedAdapter {
            weights,
            moments,
            step: 0,
        })
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    /// One AdamW step from `gradients` (what a pass gathered for this adapter; a site missing
    /// counts as zeros), in the CPU engine's order: the global norm, the clip to `clip_norm`
    /// (0: none), then each tensor's update with `adam`'s rate, betas, eps and decay (its `step`
    /// and `clip` are this adapter's). Returns the gradient's norm before the clip.
    pub fn adamw(
        &mut self,
        gpu: &Gpu,
        gradients: &GpuPairGradients,
        adam: AdamStep,
        clip_norm: f64,
    ) -> Result<f64, GpuError> {
        let mut square_sum = 0.0;
        for pair in gradients.values() {
            square_sum += gpu.square_sum(&pair.a)? + gpu.square_sum(&pair.b)?;
        }
        let norm = square_sum.sqrt();
        let clip = match clip_norm > 0.0 && norm > clip_norm {
            true => clip_norm / norm,
            false => 1.0,
        };
        self.step += 1;
        let adam = AdamStep {
            step: i32::try_from(self.step).unwrap_or(i32::MAX),
            clip,
            ..adam
        };
        for (site, pair) in &mut self.weights.sites {
            let (m, v) = self
                .moments
                .get_mut(site)
                .ok_or_else(|| GpuError::InvalidArgument(format!("no moments at {site:?}")))?;
            let zero;
            let grad = match gradients.get(site) {
                Some(grad) => grad,
                None => {
                    zero = GpuPair {
                        a: gpu.zeros(pair.a.len())?,
                        b: gpu.zeros(pair.b.len())?,
                    };
                    &zero
                }
            };
            gpu.adamw(&mut pair.a, &grad.a, &mut m.a, &mut v.a, adam)?;
            gpu.adamw(&mut pair.b, &grad.b, &mut m.b, &mut v.b, adam)?;
        }
        Ok(norm)
    }
}

/// Adds `fresh` into `sum`, site by site (a site `sum` lacks is taken as it is).
pub fn add_gradients(
    gpu: &Gpu,
    sum: &mut GpuPairGradients,
    fresh: GpuPairGradients,
) -> Result<(), GpuError> {
    for (site, pair) in fresh {
        match sum.entry(site) {
            Entry::Vacant(entry) => {
                entry.insert(pair);
            }
            Entry::Occupied(mut entry) => {
                let total = entry.get_mut();
                gpu.add(&mut total.a, &pair.a)?;
                gpu.add(&mut total.b, &pair.b)?;
            }
        }
    }
    Ok(())
}

/// A copy of `gradients`, on the device.
pub fn copy_gradients(
    gpu: &Gpu,
    gradients: &GpuPairGradients,
) -> Result<GpuPairGradients, GpuError> {
    gradients
        .iter()
        .map(|(site, pair)| {
            let copy = GpuPair {
                a: gpu.copy(&pair.a)?,
                b: gpu.copy(&pair.b)?,
            };
            Ok((*site, copy))
        })
        .collect()
}

/// Whether every value of `gradients` is finite (one square sum per tensor).
pub fn gradients_finite(gpu: &Gpu, gradients: &GpuPairGradients) -> Result<bool, GpuError> {
    for pair in gradients.values() {
        if !(gpu.square_sum(&pair.a)?.is_finite() && gpu.square_sum(&pair.b)?.is_finite()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `gradients` on the host per tensor of `weights`' adapter in [`Adapter::named_tensors`]'s
/// order; a site the gradients lack is empty (zeros).
pub fn download_gradients(
    gpu: &Gpu,
    gradients: &GpuPairGradients,
    weights: &GpuAdapterWeights,
) -> Result<Vec<Vec<f32>>, GpuError> {
    let mut tensors = Vec::with_capacity(2 * weights.sites.len());
    for site in weights.sites.keys() {
        match gradients.get(site) {
            Some(pair) => tensors.extend([gpu.download(&pair.a)?, gpu.download(&pair.b)?]),
            None => tensors.extend([Vec::new(), Vec::new()]),
        }
    }
    Ok(tensors)
}
