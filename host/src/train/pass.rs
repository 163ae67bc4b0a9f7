//! Where a training pass runs. The engine plans a pass (its sequences, the adapters their rows
//! go through) and owns its losses; a [`Placement`] runs the model's one layer definition
//! forward over the sequences, hands the targets' logprobs to the losses, and runs the layers'
//! backward from the gradient the losses give back, on the CPU ([`CpuPlacement`], in f32 or
//! f64) or on a CUDA device (`CudaPlacement`, feature `cuda`: the weights uploaded once, the
//! pass's adapters uploaded with it, the gradients downloaded after it).

use std::convert::Infallible;
#[cfg(feature = "cuda")]
use std::sync::Arc;

use candle_core::{Tensor, WithDType};
use opentinker_kernels::{Backward, CpuTrain, Float, LoraGrads, Segment, TrainBatch};

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
    pub sequences: &'a [TrainSequence<'a>],
    /// Whether to run the backward (when the losses give a gradient).
    pub backward: bool,
    /// Whether every weight of the model trains (the head through the logits, and the weights'
    /// gradients).
    pub full_parameters: bool,
}

/// The gradients of one pass, on the host.
pub struct PassGradients<T> {
    /// Per adapter of [`PassInput::adapters`], by site: only the sites the backward reached.
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
            Matrix = [T],
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
        let hook = match input.backward {
            true => CpuAdapters::<T>::training(input.adapters),
            false => CpuAdapters::<T>::of(input.adapters),
        }
        .map_err(PassError::from)?;
        let weights = CpuWeights::<T>::of(input.model).map_err(PassError::from)?;
        let ops = CpuTrain::<T>::new();
        let batch = TrainBatch::new(lengths(input));
        let (made, backward) =
            through_layers(&ops, &weights.decoder(), &hook, batch, input, losses)?;
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
                .into_named()
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
mod cuda {
    use std::sync::OnceLock;

    use opentinker_kernels::cuda::{
        AdamStep, Gpu, GpuError, GpuTrain, GpuTrainBatch, WeightFormat,
    };

    use super::*;
    use crate::lora::{GpuAdapterWeights, GpuTrainAdapters};
    use crate::model::GpuWeights;

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
            let up = |t: &Tensor| -> Result<_, PassError> {
                let values = t
                    .to_dtype(candle_core::DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                gpu.upload(&values).map_err(failed)
            };
            let (mut weights, grad, mut first, mut second) = (up(w)?, up(g)?, up(m)?, up(v)?);
            let params = step.params;
            let adam = AdamStep {
                learning_rate: params.learning_rate,
                beta1: params.beta1,
                beta2: params.beta2,
                eps: params.eps,
                weight_decay: params.weight_decay,
                step: step.step,
                clip: step.clip,
            };
            gpu.adamw(&mut weights, &grad, &mut first, &mut second, adam)
                .map_err(failed)?;
            let down = |x: &opentinker_kernels::cuda::CudaSlice<f32>| -> Result<Tensor, PassError> {
                let values = gpu.download(x).map_err(failed)?;
                Ok(Tensor::from_vec(values, w.shape(), w.device())?.to_dtype(w.dtype())?)
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
            let adapters = input
                .adapters
                .iter()
                .map(|adapter| GpuAdapterWeights::upload(gpu, adapter))
                .collect::<Result<Vec<_>, _>>()
                .map_err(PassError::from)?;
            let hook = match input.backward {
                true => GpuTrainAdapters::training(adapters.iter().collect()),
                false => GpuTrainAdapters::of(adapters.iter().collect()),
            };
            let ops = GpuTrain::new(gpu);
            let failed = |error: GpuError| PassError::from(ForwardError::Backend(error));
            let batch = GpuTrainBatch::new(gpu, lengths(input)).map_err(failed)?;
            let (made, backward) =
                through_layers(&ops, &weights.decoder(), &hook, batch, input, losses)?;
            let Some(weights) = backward else {
                return Ok((made, None));
            };
            let adapters = hook.into_gradients(&ops).map_err(failed)?;
            Ok((made, Some(PassGradients { adapters, weights })))
        }
    }
}
