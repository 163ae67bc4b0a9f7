//! Where a training pass runs. The engine plans a pass (its sequences, the adapters their rows
//! go through) and owns its losses; a [`Placement`] runs the model's one layer definition
//! forward over the sequences, hands the targets' logprobs to the losses, and runs the layers'
//! backward from the gradient the losses give back, on the CPU ([`CpuPlacement`], in f32 or
//! f64) or on a CUDA device (`CudaPlacement`, feature `cuda`: the weights uploaded once).
//!
//! On CUDA an adapter's training state stays on the device between calls ([`Resident`], which
//! [`Placement::keep`] makes): its weights, which each pass reads in place, the gradients the
//! passes add up there, and AdamW's moments, which its step updates there; only the stepped
//! weights come back to the host (what the engine publishes and saves), and the gradients and
//! moments when someone asks for them.

use std::convert::Infallible;
#[cfg(feature = "cuda")]
use std::sync::Arc;

use candle_core::{Tensor, WithDType};
use opentinker_kernels::{Backward, CpuTrain, Float, LoraGrads, Segment, TrainBatch, Weight};

use super::shared_prefix::SharedPrefixes;
use crate::lora::{Adapter, CpuAdapters, PairGradients};
use crate::model::layers::{
    AdapterGrads, DecoderWeights, ForwardError, TrainSequence, WeightGrads, train_backward,
    train_forward,
};
use crate::model::{CpuWeights, Device, DeviceError, Transformer};

/// The float types a pass computes in: f32, and f64 for gradient checks (on the CPU only).
pub trait TrainFloat: Float + WithDType {}
impl TrainFloat for f32 {}
impl TrainFloat for f64 {}

/// What one pass runs.
pub struct PassInput<'a> {
    pub model: &'a Transformer,
    /// The adapters the sequences name by index.
    pub adapters: &'a [&'a Adapter],
    /// Per adapter, its state on the placement's device, if it has one: the pass reads its
    /// weights there and adds its gradients there (they are not returned).
    pub resident: &'a [Option<&'a Resident>],
    pub sequences: &'a [TrainSequence<'a>],
    /// Whether to run the backward (when the losses give a gradient).
    pub backward: bool,
    /// Whether every weight of the model trains (the head through the logits, and the weights'
    /// gradients).
    pub full_parameters: bool,
}

/// The gradients of one pass, on the host.
pub struct PassGradients<T> {
    /// Per adapter of [`PassInput::adapters`], by site: only the sites the backward reached
    /// (none for a resident adapter: its gradients were added on the device).
    pub adapters: Vec<PairGradients<T>>,
    /// Every weight's gradient by Hugging Face name, in a full-parameter pass.
    pub weights: Option<Vec<(String, Vec<T>)>>,
}

/// Why a pass failed on its device.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("the model refused the batch: {0}")]
    Model(#[from] ForwardError<Infallible>),
    #[error("reading the weights: {0}")]
    Weights(#[from] candle_core::Error),
    #[error(
        "training computes in f32 or f64 on the CPU and in f32 on CUDA, not {dtype:?} on {device}"
    )]
    DType {
        dtype: candle_core::DType,
        device: Device,
    },
    #[cfg(feature = "cuda")]
    #[error("the model on the CUDA device: {0}")]
    Cuda(#[from] ForwardError<opentinker_kernels::cuda::GpuError>),
    #[cfg(feature = "cuda")]
    #[error("putting the adapters on the device: {0}")]
    Adapters(#[from] crate::lora::GpuAdapterError),
    #[cfg(feature = "cuda")]
    #[error("putting the model on the device: {0}")]
    DeviceWeights(#[from] crate::model::GpuWeightsError),
    #[cfg(feature = "cuda")]
    #[error("the adapter's state on the device: {0}")]
    Device(#[from] opentinker_kernels::cuda::GpuError),
}

/// A device that runs passes in floats of type `T`.
pub trait Runs<T> {
    /// Runs `input` forward; `losses` gets the targets' logprobs (the sequences' one after
    /// another) and returns what it made of them and, for a backward, their gradient. The
    /// gradients are `None` without a backward.
    fn pass<R, E: From<PassError>>(
        &self,
        input: &PassInput<'_>,
        losses: impl FnOnce(&[T]) -> Result<(R, Option<Vec<T>>), E>,
    ) -> Result<(R, Option<PassGradients<T>>), E>;
}

/// The device an engine's passes run on.
pub enum Placement {
    Cpu(CpuPlacement),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaPlacement>),
}

impl Placement {
    /// Opens `device` for training (on CUDA: the driver, the device, the kernels).
    pub fn open(device: Device) -> Result<Placement, DeviceError> {
        match device {
            Device::Cpu => Ok(Placement::Cpu(CpuPlacement)),
            #[cfg(feature = "cuda")]
            Device::Cuda { .. } => Ok(Placement::Cuda(Box::new(cuda::CudaPlacement::new(
                device,
                Arc::new(device.open_gpu()?),
            )))),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda { .. } => Err(DeviceError::NotBuilt { device }),
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Placement::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Placement::Cuda(cuda) => cuda.device(),
        }
    }

    /// Passes on a CUDA device already open, over the model's `weights` already there (in f32):
    /// a sampler's on the same device, so that the base is loaded once per device.
    #[cfg(feature = "cuda")]
    pub fn cuda_with_weights(
        device: Device,
        gpu: Arc<opentinker_kernels::cuda::Gpu>,
        weights: Arc<crate::model::GpuWeights>,
    ) -> Placement {
        Placement::Cuda(Box::new(cuda::CudaPlacement::with_weights(
            device, gpu, weights,
        )))
    }

    /// One tensor's AdamW step on the placement's device: the updated weights and moments,
    /// host tensors of `w`'s shape and type. The gradient is scaled by the clip, the moments
    /// updated, the weights decayed, then the bias-corrected update applied (in this order on
    /// every device).
    pub fn adamw(
        &self,
        w: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        step: AdamUpdate,
    ) -> Result<(Tensor, Tensor, Tensor), PassError> {
        match self {
            Placement::Cpu(_) => Ok(step.apply(w, g, m, v)?),
            #[cfg(feature = "cuda")]
            Placement::Cuda(cuda) => cuda.adamw(w, g, m, v, step),
        }
    }

    /// The training state of `adapter` (its weights, AdamW's `moments` per tensor in
    /// [`Adapter::named_tensors`]'s order, its accumulated `gradients` likewise, after `step`
    /// steps) kept on the placement's device; `None` on the CPU, where the engine keeps it.
    pub fn keep(
        &self,
        adapter: &Adapter,
        moments: Option<(&[Tensor], &[Tensor])>,
        gradients: Option<&[Tensor]>,
        step: u64,
    ) -> Result<Option<Resident>, PassError> {
        match self {
            Placement::Cpu(_) => {
                let _ = (adapter, moments, gradients, step);
                Ok(None)
            }
            #[cfg(feature = "cuda")]
            Placement::Cuda(cuda) => Ok(Some(Resident::upload(
                cuda.gpu(),
                adapter,
                moments,
                gradients,
                step,
            )?)),
        }
    }

    /// The model's weights changed (a full-parameter step): a device holding a copy drops it.
    pub fn weights_changed(&mut self) {
        match self {
            Placement::Cpu(_) => {}
            #[cfg(feature = "cuda")]
            Placement::Cuda(cuda) => cuda.weights_changed(),
        }
    }
}

/// One AdamW step of a tensor: the optimizer's settings, the step's number (from 1) and the
/// factor the global clip scales the gradient by.
#[derive(Clone, Copy, Debug)]
pub struct AdamUpdate {
    pub params: crate::api::AdamParams,
    pub step: i32,
    pub clip: f64,
}

impl AdamUpdate {
    /// The step in candle, on the tensors' device.
    fn apply(
        &self,
        w: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let p = &self.params;
        let (bias1, bias2) = (1.0 - p.beta1.powi(self.step), 1.0 - p.beta2.powi(self.step));
        let g = (g * self.clip)?;
        let m = ((m * p.beta1)? + (&g * (1.0 - p.beta1))?)?;
        let v = ((v * p.beta2)? + (g.sqr()? * (1.0 - p.beta2))?)?;
        let update = ((&m / bias1)? / ((&v / bias2)?.sqrt()? + p.eps)?)?;
        let decayed = (w * (1.0 - p.learning_rate * p.weight_decay))?;
        Ok(((decayed - (update * p.learning_rate)?)?, m, v))
    }
}

/// Passes on the CPU, reading the candle weights in place.
pub struct CpuPlacement;

impl<T> Runs<T> for CpuPlacement
where
    T: TrainFloat,
    CpuTrain<T>: for<'a> Backward<
            Error = Infallible,
            Elem = T,
            Buffer = Vec<T>,
            Matrix<'a> = Weight<'a, T>,
            Vector = [T],
            Lora<'a> = &'a [Segment<'a, T>],
            LoraGrads<'a> = LoraGrads<'a, T>,
            Batch<'a> = TrainBatch<T>,
        >,
{
    fn pass<R, E: From<PassError>>(
        &self,
        input: &PassInput<'_>,
        losses: impl FnOnce(&[T]) -> Result<(R, Option<Vec<T>>), E>,
    ) -> Result<(R, Option<PassGradients<T>>), E> {
        debug_assert!(
            input.resident.iter().all(Option::is_none),
            "the CPU keeps no adapter on a device"
        );
        let hook = match input.backward {
            true => CpuAdapters::<T>::training(input.adapters),
            false => CpuAdapters::<T>::of(input.adapters),
        }
        .map_err(PassError::from)?;
        let weights = CpuWeights::<T>::of(input.model).map_err(PassError::from)?;
        let ops = CpuTrain::<T>::new();
        let decoder = weights.decoder();
        // The sequences' shared beginnings run once; the losses still see every sequence whole.
        let plan = SharedPrefixes::plan(input.sequences, decoder.context);
        let (made, backward) = if plan.shares() {
            let batch = TrainBatch::of_spans(plan.spans.clone());
            let computed = PassInput {
                sequences: &plan.sequences,
                ..*input
            };
            let losses = |logprobs: &[T]| -> Result<(R, Option<Vec<T>>), E> {
                let (made, gradient) = losses(&plan.expand(logprobs))?;
                Ok((made, gradient.map(|given| plan.fold(&given))))
            };
            through_layers(&ops, &decoder, &hook, batch, &computed, losses)?
        } else {
            let batch = TrainBatch::new(lengths(input));
            through_layers(&ops, &decoder, &hook, batch, input, losses)?
        };
        let gradients = backward.map(|weights| PassGradients {
            adapters: hook.into_gradients(),
            weights,
        });
        Ok((made, gradients))
    }
}

/// The weights' gradients of a pass whose backward ran: by Hugging Face name in a
/// full-parameter pass, else `None`.
type WeightGradients<T> = Option<Vec<(String, Vec<T>)>>;

/// The layers forward over `input`'s sequences on `ops`, the losses on the host, and the layers
/// backward from their gradient (into `hook`'s adapters, and every weight's gradient in a
/// full-parameter pass). The backward's result is `None` when it did not run.
#[allow(clippy::type_complexity)]
fn through_layers<B, H, R, E>(
    ops: &B,
    weights: &DecoderWeights<'_, B>,
    hook: &H,
    mut batch: B::Batch<'_>,
    input: &PassInput<'_>,
    losses: impl FnOnce(&[B::Elem]) -> Result<(R, Option<Vec<B::Elem>>), E>,
) -> Result<(R, Option<WeightGradients<B::Elem>>), E>
where
    B: Backward,
    H: AdapterGrads<B>,
    E: From<PassError>,
    PassError: From<ForwardError<B::Error>>,
{
    let config = &input.model.config;
    let failed = |error: B::Error| PassError::from(ForwardError::Backend(error));
    let forward = train_forward(
        ops,
        config,
        weights,
        hook,
        input.sequences,
        &mut batch,
        input.backward,
        input.full_parameters,
    )
    .map_err(PassError::from)?;
    let logprobs = ops.download(forward.logprobs).map_err(failed)?;
    let (made, d_logprobs) = losses(&logprobs)?;
    let (Some(tape), Some(d_logprobs)) = (forward.tape, d_logprobs) else {
        return Ok((made, None));
    };
    let d_logprobs = ops.upload(&d_logprobs).map_err(failed)?;
    let mut weight_grads = match input.full_parameters {
        true => Some(WeightGrads::zeros(ops, config).map_err(failed)?),
        false => None,
    };
    train_backward(
        ops,
        config,
        weights,
        hook,
        input.sequences,
        &mut batch,
        &tape,
        &d_logprobs,
        weight_grads.as_mut(),
    )
    .map_err(failed)?;
    let weights = weight_grads
        .map(|grads| {
            grads
                .into_named(&config.features)
                .into_iter()
                .map(|(name, grad)| Ok((name, ops.download(grad)?)))
                .collect::<Result<Vec<_>, B::Error>>()
        })
        .transpose()
        .map_err(failed)?;
    Ok((made, Some(weights)))
}

/// Each sequence's length.
fn lengths(input: &PassInput<'_>) -> Vec<usize> {
    input.sequences.iter().map(|s| s.tokens.len()).collect()
}

#[cfg(feature = "cuda")]
pub use cuda::Resident;

/// Without CUDA no adapter's state lives on a device: [`Placement::keep`] never makes one.
#[cfg(not(feature = "cuda"))]
pub enum Resident {}

/// The gradients of a [`Resident`] at one moment (never made without CUDA).
#[cfg(not(feature = "cuda"))]
pub enum GradientsSnapshot {}

#[cfg(not(feature = "cuda"))]
impl Resident {
    pub fn gradients(&self, _like: &Adapter) -> Result<Option<Vec<Tensor>>, PassError> {
        match *self {}
    }

    pub fn moments(&self, _like: &Adapter) -> Result<Option<TensorMoments>, PassError> {
        match *self {}
    }

    pub fn take_non_finite(&self) -> bool {
        match *self {}
    }

    pub fn clear_gradients(&mut self) {
        match *self {}
    }

    pub fn snapshot(&self) -> Result<GradientsSnapshot, PassError> {
        match *self {}
    }

    pub fn restore(&mut self, snapshot: GradientsSnapshot) {
        match snapshot {}
    }

    pub fn step(
        &mut self,
        _adapter: &Adapter,
        _params: &crate::api::AdamParams,
    ) -> Result<StepNorms, PassError> {
        match *self {}
    }
}

/// AdamW's first and second moments, per trainable tensor.
pub type TensorMoments = (Vec<Tensor>, Vec<Tensor>);

/// What one AdamW step of an adapter measured: the gradient's global norm before the clip, the
/// update's and the weights' (before the step) norms.
#[derive(Clone, Copy, Debug)]
pub struct StepNorms {
    pub gradient: f64,
    pub update: f64,
    pub weights: f64,
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, OnceLock};

    use opentinker_kernels::cuda::{
        AdamStep, Gpu, GpuError, GpuTrain, GpuTrainBatch, WeightFormat,
    };

    use super::*;
    use crate::lora::{
        GpuAdapterWeights, GpuPairGradients, GpuTrainAdapters, GpuTrainedAdapter, add_gradients,
        copy_gradients, download_gradients, gradients_finite,
    };
    use crate::model::GpuWeights;

    /// An adapter's training state on a CUDA device: its weights and AdamW's moments and step
    /// ([`GpuTrainedAdapter`]), and the gradients the passes added since its last step.
    pub struct Resident {
        gpu: Arc<Gpu>,
        trained: GpuTrainedAdapter,
        /// Added to by passes, which read the adapter through a shared reference.
        gradients: Mutex<Option<GpuPairGradients>>,
        /// A pass added a gradient with a value that is not finite.
        non_finite: AtomicBool,
        /// Whether the moments hold anything yet (a step ran, or they were given).
        moments_allocated: bool,
    }

    /// The gradients of a [`Resident`] at one moment, on the device.
    pub struct GradientsSnapshot(Option<GpuPairGradients>);

    /// The `adamw` kernel's settings from the optimizer's, at `step` with the clip's factor.
    fn adam_step(params: &crate::api::AdamParams, step: i32, clip: f64) -> AdamStep {
        AdamStep {
            learning_rate: params.learning_rate,
            beta1: params.beta1,
            beta2: params.beta2,
            eps: params.eps,
            weight_decay: params.weight_decay,
            step,
            clip,
        }
    }

    /// A tensor's values in f32 (the device's type).
    fn values_of(tensor: &Tensor) -> candle_core::Result<Vec<f32>> {
        tensor
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()
    }

    /// `values` as a host tensor like `like` (its shape and type); zeros when empty.
    fn tensor_like(values: Vec<f32>, like: &Tensor) -> candle_core::Result<Tensor> {
        if values.is_empty() {
            return like.zeros_like();
        }
        Tensor::from_vec(values, like.shape(), like.device())?.to_dtype(like.dtype())
    }

    impl Resident {
        pub(super) fn upload(
            gpu: &Arc<Gpu>,
            adapter: &Adapter,
            moments: Option<(&[Tensor], &[Tensor])>,
            gradients: Option<&[Tensor]>,
            step: u64,
        ) -> Result<Self, PassError> {
            let trained = GpuTrainedAdapter::upload(gpu, adapter, moments, step)?;
            let gradients = match gradients {
                None => None,
                Some(tensors) if tensors.len() != 2 * adapter.sites.len() => {
                    return Err(candle_core::Error::Msg(format!(
                        "{} gradients for {} tensors",
                        tensors.len(),
                        2 * adapter.sites.len()
                    ))
                    .into());
                }
                Some(tensors) => {
                    let mut sites = GpuPairGradients::new();
                    let pairs = adapter.sites.keys().zip(tensors.chunks(2));
                    for (site, pair) in pairs {
                        let [a, b] = pair else {
                            return Err(candle_core::Error::Msg(
                                "gradients of only some tensors".into(),
                            )
                            .into());
                        };
                        let device = crate::lora::GpuPair {
                            a: gpu.upload(&values_of(a)?)?,
                            b: gpu.upload(&values_of(b)?)?,
                        };
                        sites.insert(*site, device);
                    }
                    Some(sites)
                }
            };
            Ok(Resident {
                gpu: Arc::clone(gpu),
                trained,
                gradients: Mutex::new(gradients),
                non_finite: AtomicBool::new(false),
                moments_allocated: moments.is_some(),
            })
        }

        fn weights(&self) -> &GpuAdapterWeights {
            &self.trained.weights
        }

        fn locked(&self) -> std::sync::MutexGuard<'_, Option<GpuPairGradients>> {
            // A pass that panicked left at worst a partial sum, which the engine's rollback
            // replaces.
            self.gradients
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Adds a pass's gradients, noting any value that is not finite.
        fn add(&self, fresh: GpuPairGradients) -> Result<(), GpuError> {
            if !gradients_finite(&self.gpu, &fresh)? {
                self.non_finite.store(true, Ordering::Relaxed);
            }
            let mut gradients = self.locked();
            match gradients.as_mut() {
                Some(sum) => add_gradients(&self.gpu, sum, fresh),
                None => {
                    *gradients = Some(fresh);
                    Ok(())
                }
            }
        }

        /// The gradients added since the last step on the host, per tensor of `like` (the
        /// adapter's host copy) in [`Adapter::named_tensors`]'s order; `None` when no pass
        /// added any.
        pub fn gradients(&self, like: &Adapter) -> Result<Option<Vec<Tensor>>, PassError> {
            let gradients = self.locked();
            let Some(sum) = gradients.as_ref() else {
                return Ok(None);
            };
            let values = download_gradients(&self.gpu, sum, self.weights())?;
            let tensors = like
                .named_tensors()
                .into_iter()
                .zip(values)
                .map(|((_, var), values)| tensor_like(values, var.as_tensor()))
                .collect::<candle_core::Result<_>>()?;
            Ok(Some(tensors))
        }

        /// AdamW's moments on the host, like [`Resident::gradients`]; `None` before anything
        /// allocated them (zeros).
        pub fn moments(&self, like: &Adapter) -> Result<Option<TensorMoments>, PassError> {
            if !self.moments_allocated {
                return Ok(None);
            }
            let (first, second) = self.trained.download_moments(&self.gpu)?;
            let named = like.named_tensors();
            let host = |values: Vec<Vec<f32>>| -> candle_core::Result<Vec<Tensor>> {
                named
                    .iter()
                    .zip(values)
                    .map(|((_, var), values)| tensor_like(values, var.as_tensor()))
                    .collect()
            };
            Ok(Some((host(first)?, host(second)?)))
        }

        /// Whether a pass since the last call added a value that is not finite.
        pub fn take_non_finite(&self) -> bool {
            self.non_finite.swap(false, Ordering::Relaxed)
        }

        pub fn clear_gradients(&mut self) {
            *self.locked() = None;
            self.non_finite.store(false, Ordering::Relaxed);
        }

        /// A copy of the gradients now (to put back with [`Resident::restore`]).
        pub fn snapshot(&self) -> Result<GradientsSnapshot, PassError> {
            let gradients = self.locked();
            let copy = gradients
                .as_ref()
                .map(|sum| copy_gradients(&self.gpu, sum))
                .transpose()?;
            Ok(GradientsSnapshot(copy))
        }

        pub fn restore(&mut self, snapshot: GradientsSnapshot) {
            *self.locked() = snapshot.0;
        }

        /// One AdamW step from the gradients added since the last (zeros if none), on the
        /// device; the stepped weights are written into `adapter` (the host copy), and the
        /// gradients cleared.
        pub fn step(
            &mut self,
            adapter: &Adapter,
            params: &crate::api::AdamParams,
        ) -> Result<StepNorms, PassError> {
            let gradients = self.locked().take().unwrap_or_default();
            self.non_finite.store(false, Ordering::Relaxed);
            // The adapter counts its steps and finds its clip itself.
            let adam = adam_step(params, 0, 1.0);
            let gradient =
                self.trained
                    .adamw(&self.gpu, &gradients, adam, params.grad_clip_norm)?;
            self.moments_allocated = true;
            let stepped = self.trained.weights.download(&self.gpu)?;
            let (mut update, mut weights) = (0.0f64, 0.0f64);
            for (pair, (a, b)) in adapter.sites.values().zip(stepped.into_values()) {
                for (var, new) in [(&pair.a, a), (&pair.b, b)] {
                    let old = values_of(var.as_tensor())?;
                    for (o, n) in old.iter().zip(&new) {
                        update += f64::from(n - o).powi(2);
                        weights += f64::from(*o).powi(2);
                    }
                    var.set(&tensor_like(new, var.as_tensor())?)?;
                }
            }
            Ok(StepNorms {
                gradient,
                update: update.sqrt(),
                weights: weights.sqrt(),
            })
        }
    }

    /// Passes on one CUDA device in f32: the model's weights uploaded at the first pass and
    /// kept (until [`CudaPlacement::weights_changed`]), or shared with a sampler on the device;
    /// each pass's adapters uploaded with it.
    pub struct CudaPlacement {
        device: Device,
        gpu: Arc<Gpu>,
        weights: OnceLock<Arc<GpuWeights>>,
    }

    impl CudaPlacement {
        pub fn new(device: Device, gpu: Arc<Gpu>) -> Self {
            CudaPlacement {
                device,
                gpu,
                weights: OnceLock::new(),
            }
        }

        /// Over `weights` already on the device (the model's, in f32).
        pub fn with_weights(device: Device, gpu: Arc<Gpu>, weights: Arc<GpuWeights>) -> Self {
            CudaPlacement {
                device,
                gpu,
                weights: OnceLock::from(weights),
            }
        }

        pub fn device(&self) -> Device {
            self.device
        }

        pub fn gpu(&self) -> &Arc<Gpu> {
            &self.gpu
        }

        pub fn weights_changed(&mut self) {
            self.weights = OnceLock::new();
        }

        fn weights(&self, model: &Transformer) -> Result<&GpuWeights, PassError> {
            if let Some(weights) = self.weights.get() {
                return Ok(weights);
            }
            let uploaded = Arc::new(GpuWeights::upload(&self.gpu, model, WeightFormat::F32)?);
            Ok(self.weights.get_or_init(|| uploaded))
        }

        /// AdamW of one tensor on the device (`Gpu::adamw`, the engine's order): up, step, down.
        pub fn adamw(
            &self,
            w: &Tensor,
            g: &Tensor,
            m: &Tensor,
            v: &Tensor,
            step: AdamUpdate,
        ) -> Result<(Tensor, Tensor, Tensor), PassError> {
            let gpu = &*self.gpu;
            let failed = |error: GpuError| PassError::from(ForwardError::Backend(error));
            let up =
                |t: &Tensor| -> Result<_, PassError> { gpu.upload(&values_of(t)?).map_err(failed) };
            let (mut weights, grad, mut first, mut second) = (up(w)?, up(g)?, up(m)?, up(v)?);
            let adam = adam_step(&step.params, step.step, step.clip);
            gpu.adamw(&mut weights, &grad, &mut first, &mut second, adam)
                .map_err(failed)?;
            let down = |x: &opentinker_kernels::cuda::CudaSlice<f32>| -> Result<Tensor, PassError> {
                Ok(tensor_like(gpu.download(x).map_err(failed)?, w)?)
            };
            Ok((down(&weights)?, down(&first)?, down(&second)?))
        }
    }

    impl Runs<f32> for CudaPlacement {
        fn pass<R, E: From<PassError>>(
            &self,
            input: &PassInput<'_>,
            losses: impl FnOnce(&[f32]) -> Result<(R, Option<Vec<f32>>), E>,
        ) -> Result<(R, Option<PassGradients<f32>>), E> {
            let gpu = &*self.gpu;
            let weights = self.weights(input.model)?;
            // A resident adapter's weights are read where they are; another's go up for the pass.
            let uploaded = input
                .adapters
                .iter()
                .zip(input.resident.iter().chain(std::iter::repeat(&None)))
                .map(|(adapter, resident)| match resident {
                    Some(_) => Ok(None),
                    None => GpuAdapterWeights::upload(gpu, adapter).map(Some),
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(PassError::from)?;
            let adapters: Vec<&GpuAdapterWeights> = uploaded
                .iter()
                .zip(input.resident.iter().chain(std::iter::repeat(&None)))
                .map(|(own, resident)| {
                    own.as_ref()
                        .or(resident.map(|r| r.weights()))
                        .expect("each adapter uploaded or resident")
                })
                .collect();
            let hook = match input.backward {
                true => GpuTrainAdapters::training(adapters),
                false => GpuTrainAdapters::of(adapters),
            };
            let ops = GpuTrain::new(gpu);
            let failed = |error: GpuError| PassError::from(ForwardError::Backend(error));
            let batch = GpuTrainBatch::new(gpu, lengths(input)).map_err(failed)?;
            let (made, backward) =
                through_layers(&ops, &weights.decoder(), &hook, batch, input, losses)?;
            let Some(weights) = backward else {
                return Ok((made, None));
            };
            // A resident adapter's gradients are added where they are; another's come down.
            let mut adapters = Vec::with_capacity(input.adapters.len());
            let resident = input.resident.iter().chain(std::iter::repeat(&None));
            for (sites, resident) in hook.into_device_gradients().into_iter().zip(resident) {
                adapters.push(match resident {
                    Some(resident) => {
                        resident.add(sites).map_err(failed)?;
                        PairGradients::new()
                    }
                    None => sites
                        .into_iter()
                        .map(|(site, pair)| {
                            Ok((site, (gpu.download(&pair.a)?, gpu.download(&pair.b)?)))
                        })
                        .collect::<Result<_, GpuError>>()
                        .map_err(failed)?,
                });
            }
            Ok((made, Some(PassGradients { adapters, weights })))
        }
    }
}
