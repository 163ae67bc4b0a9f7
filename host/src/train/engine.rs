//! The training engine: step-level calls with Tinker semantics over many LoRA adapters of one
//! frozen base model. It runs no loop of its own; one caller (the scheduler's `TrainerService`)
//! drives it.
//!
//! `forward_backward` fuses work items of different adapters, ranks and losses into one batch
//! (rows grouped by adapter); each adapter's gradients accumulate in its own slot until its
//! `optim_step` (AdamW with its own step count, moments and clipping). A non-finite loss or
//! gradient marks only that adapter, whose next update is skipped.
//!
//! A pass runs the model's one layer definition (`model::layers`) on the engine's device (the
//! CPU unless [`TrainingEngine::on_device`] says otherwise), each datum a whole sequence (no
//! padding in the model); the losses are small candle graphs on the host over the padded
//! logprobs, whose gradient with respect to the logprobs starts the layers' explicit backward.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};

use super::checkpoint::Moments;
use super::loss::{Loss, LossInputs, loss, ratio_tokens};
use super::loss_graph::{CompiledLoss, GraphError, InputTensor};
use super::objective::{Objective, ObjectiveError, ObjectiveInput};
use super::pass::{
    AdamUpdate, CpuPlacement, PassError, PassGradients, PassInput, Placement, Resident, Runs,
    TensorMoments, TrainFloat,
};
use super::slot_state::{NamedState, SlotState};
use crate::lora::{Adapter, AdapterError, LoraConfig};
use crate::model::WeightsError;
use crate::model::layers::{TrainSequence, train_values_per_token};
use crate::model::{DeviceError, Site, Transformer};

/// The name of an adapter in the engine.
pub type AdapterId = String;

/// The one trainable of a full-parameter engine: the model itself. Work items name it as their
/// adapter.
pub const FULL_PARAMETERS: &str = "full-parameters";

/// One training example, already shifted: `target_tokens[i]` follows `input_tokens[..=i]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Datum {
    pub input_tokens: Vec<u32>,
    pub target_tokens: Vec<u32>,
    /// 1 where a target token counts (action tokens), 0 for context and observations.
    pub mask: Vec<f32>,
    pub weights: Option<Vec<f32>>,
    pub advantages: Option<Vec<f32>>,
    pub sampler_logprobs: Option<Vec<f32>>,
    /// The tokens whose ratios make the sequence's ratio (`gspo`); `None`: its counted tokens
    /// with an advantage.
    pub ratio_mask: Option<Vec<f32>>,
    /// The `loss_fn_inputs` a custom loss reads, by name; empty for the built-in losses.
    pub inputs: BTreeMap<String, InputTensor>,
}

/// The datums of one adapter under one loss.
#[derive(Clone, Debug)]
pub struct WorkItem {
    pub adapter: AdapterId,
    pub datums: Vec<Datum>,
    pub loss: Loss,
    /// The learner's logprobs are of `logits / temperature` (1 unless
    /// [`WorkItem::at_temperature`]): RL datums drawn at a temperature are trained on the
    /// distribution they were drawn from, as TRL and verl do, so on-policy ratios are 1.
    pub temperature: f64,
    /// The datums were checked against this engine's model where the request arrived (the
    /// service's conversion checks every datum of the op API, with the API's words): the engine
    /// does not check them again. An item made with [`WorkItem::new`] is checked here.
    checked: bool,
}

impl WorkItem {
    /// `datums` of `adapter` under `loss`; the engine checks each datum (lengths, vocabulary,
    /// the custom loss's inputs) before any pass, refusing the call with [`TrainError::BadDatum`].
    pub fn new(adapter: impl Into<AdapterId>, datums: Vec<Datum>, loss: Loss) -> Self {
        WorkItem {
            adapter: adapter.into(),
            datums,
            loss,
            temperature: 1.0,
            checked: false,
        }
    }

    /// The item with its logprobs taken at `temperature` (a finite number above 0, else the
    /// pass refuses it).
    pub fn at_temperature(self, temperature: f64) -> Self {
        WorkItem {
            temperature,
            ..self
        }
    }

    /// An item whose every datum the caller has checked as [`TrainingEngine`] would, against
    /// the same model: the service's conversion of an op, so that a datum is validated once.
    pub(crate) fn checked(adapter: impl Into<AdapterId>, datums: Vec<Datum>, loss: Loss) -> Self {
        WorkItem {
            checked: true,
            ..WorkItem::new(adapter, datums, loss)
        }
    }

    /// An item of the same adapter and loss, checked as this one was, over `datums` (a part of
    /// this item's: a pass of a split call, a slice of a fair share).
    pub fn part(&self, datums: Vec<Datum>) -> Self {
        WorkItem {
            adapter: self.adapter.clone(),
            datums,
            loss: self.loss.clone(),
            temperature: self.temperature,
            checked: self.checked,
        }
    }
}

/// What `forward` / `forward_backward` return for one work item.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ItemOutput {
    /// Per datum, the learner's logprob of each target token.
    pub logprobs: Vec<Vec<f32>>,
    /// The item's summed loss.
    pub loss: f64,
    /// Named numbers with Tinker's `name:reduction` keys: `loss:sum`, `tokens:sum` (tokens that
    /// count), `logprob:sum` (of the tokens that count).
    pub metrics: BTreeMap<String, f64>,
}

/// AdamW settings of one `optim_step` (Tinker's, with its defaults).
pub use crate::api::AdamParams;

/// What an `optim_step` did.
#[derive(Clone, Debug, PartialEq)]
pub enum StepReport {
    /// The adapter was updated; its step count, gradient norm before clipping, and the norms of
    /// the update and of the weights before it (their ratio says how far a step moved it).
    Updated {
        step: u64,
        grad_norm: f64,
        update_norm: f64,
        weight_norm: f64,
    },
    /// A non-finite loss or gradient was seen since the last step: nothing changed but the
    /// accumulated gradients, which are dropped.
    SkippedNonFinite,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("no adapter named {0:?}")]
    UnknownAdapter(String),
    #[error("an adapter named {0:?} exists already")]
    DuplicateAdapter(String),
    #[error("work item {item}, datum {datum}: {problem}")]
    BadDatum {
        item: usize,
        datum: usize,
        problem: String,
    },
    #[error(
        "this engine trains every weight of its model (`{FULL_PARAMETERS}`); it holds no adapters"
    )]
    FullParameterEngine,
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    #[error(transparent)]
    Checkpoint(#[from] super::checkpoint::CheckpointError),
    #[error("work item {item}, datum {datum}: the custom loss: {source}")]
    CustomLoss {
        item: usize,
        datum: usize,
        source: Box<GraphError>,
    },
    /// An objective (a plugin) gave no usable answer; found before the pass's backward, so
    /// nothing was accumulated.
    #[error("work item {item}: {source}")]
    Objective {
        item: usize,
        #[source]
        source: ObjectiveError,
    },
    /// Keeping one more adapter on the device would pass the trainer's budget there.
    #[error(
        "adapter {adapter:?} needs {needed} bytes of device memory (its weights, AdamW moments \
         and gradients); the trainer's adapters hold {held} of its {budget} there"
    )]
    DeviceBudget {
        adapter: String,
        needed: u64,
        held: u64,
        budget: u64,
    },
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl TrainError {
    /// Whether the engine refused the pass before accumulating any gradient (a bad datum, a
    /// custom loss that does not fit, an objective with no answer, an unknown adapter): the
    /// caller's fault, and safe to run the pass's other work again without it.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            TrainError::BadDatum { .. }
                | TrainError::CustomLoss { .. }
                | TrainError::Objective { .. }
                | TrainError::UnknownAdapter(_)
        )
    }
}

/// What one fused pass gives: each item's output and, after a backward, each trainable's fresh
/// gradients (in the order of its `named_tensors`).
struct Pass {
    outputs: Vec<ItemOutput>,
    gradients: Vec<(AdapterId, Vec<Tensor>)>,
}

/// A gradient's values as a tensor of `like`'s shape (zeros when the backward never reached
/// it).
fn gradient_tensor<T: TrainFloat>(values: Vec<T>, like: &Tensor) -> candle_core::Result<Tensor> {
    if values.is_empty() {
        return like.zeros_like();
    }
    Tensor::from_vec(values, like.shape(), &Device::Cpu)
}

/// What a slot trains.
enum Trainable {
    Lora(Adapter),
    /// Every weight of an unshared model, by Hugging Face name.
    Full(Vec<(String, Var)>),
}

impl Trainable {
    fn named_tensors(&self) -> Vec<(String, &Var)> {
        match self {
            Trainable::Lora(adapter) => adapter.named_tensors(),
            Trainable::Full(vars) => vars.iter().map(|(n, v)| (n.clone(), v)).collect(),
        }
    }

    /// The adapter its rows run through; `None` for the model's own (trainable) weights.
    fn adapter(&self) -> Option<&Adapter> {
        match self {
            Trainable::Lora(adapter) => Some(adapter),
            Trainable::Full(_) => None,
        }
    }
}

/// A trainable with its accumulated gradients and optimizer state.
struct Slot {
    trainable: Trainable,
    /// Per trainable tensor (same order as `Trainable::named_tensors`).
    gradients: Option<Vec<Tensor>>,
    /// AdamW's moments, allocated at the first step (empty before: zero).
    first_moments: Vec<Tensor>,
    second_moments: Vec<Tensor>,
    step: u64,
    saw_non_finite: bool,
    /// On a device that keeps it (CUDA), the adapter's weights, moments and gradients there:
    /// then `gradients` and the moments here stay empty, and the adapter's host weights are a
    /// copy the device's step refreshes.
    resident: Option<Resident>,
}

impl Slot {
    /// A slot with no gradients, zero moments, step 0.
    fn fresh(trainable: Trainable) -> Self {
        Slot {
            trainable,
            gradients: None,
            first_moments: Vec::new(),
            second_moments: Vec::new(),
            step: 0,
            saw_non_finite: false,
            resident: None,
        }
    }

    /// Device memory the slot's state takes where a placement keeps it: four f32 values per
    /// trainable value (the weight, two moments, the gradient).
    fn device_bytes(&self) -> u64 {
        let values: usize = self
            .trainable
            .named_tensors()
            .iter()
            .map(|(_, var)| var.as_tensor().elem_count())
            .sum();
        4 * 4 * values as u64
    }

    /// Hands the slot's training state to `placement` when it keeps adapters on its device,
    /// within `room` bytes there (`None`: no budget).
    fn keep_on(
        &mut self,
        placement: &Placement,
        id: &str,
        room: Option<(u64, u64)>,
    ) -> Result<(), TrainError> {
        let Trainable::Lora(adapter) = &self.trainable else {
            return Ok(());
        };
        if self.resident.is_some() || placement.device() == crate::model::Device::Cpu {
            return Ok(());
        }
        if let Some((held, budget)) = room {
            let needed = self.device_bytes();
            if held + needed > budget {
                return Err(TrainError::DeviceBudget {
                    adapter: id.to_string(),
                    needed,
                    held,
                    budget,
                });
            }
        }
        let moments = (!self.first_moments.is_empty())
            .then_some((&self.first_moments[..], &self.second_moments[..]));
        let gradients = self.gradients.as_deref();
        if let Some(resident) = placement.keep(adapter, moments, gradients, self.step)? {
            self.resident = Some(resident);
            self.gradients = None;
            self.first_moments.clear();
            self.second_moments.clear();
        }
        Ok(())
    }

    /// The accumulated gradients, on the host, per trainable tensor.
    fn host_gradients(&self) -> Result<Option<Vec<Tensor>>, TrainError> {
        match (&self.resident, self.trainable.adapter()) {
            (Some(resident), Some(adapter)) => Ok(resident.gradients(adapter)?),
            _ => Ok(self.gradients.clone()),
        }
    }

    /// The moments on the host, `None` when no step has allocated them yet.
    fn allocated_moments(&self) -> Result<Option<TensorMoments>, TrainError> {
        match (&self.resident, self.trainable.adapter()) {
            (Some(resident), Some(adapter)) => Ok(resident.moments(adapter)?),
            _ => Ok((!self.first_moments.is_empty())
                .then(|| (self.first_moments.clone(), self.second_moments.clone()))),
        }
    }

    /// The moments, zero when no step has allocated them yet.
    fn moments(&self) -> Result<(Vec<Tensor>, Vec<Tensor>), TrainError> {
        if let Some(moments) = self.allocated_moments()? {
            return Ok(moments);
        }
        let zeros = || -> candle_core::Result<Vec<Tensor>> {
            self.trainable
                .named_tensors()
                .iter()
                .map(|(_, v)| v.as_tensor().zeros_like())
                .collect()
        };
        Ok((zeros()?, zeros()?))
    }
}

/// The most memory one pass of the engine holds for its activations by default (what the
/// layers keep for the backward, [`train_values_per_token`]): a call over more tokens runs in
/// passes of whole datums, each pass's gradients adding to the slot's as another call's would
/// (every loss is a sum over datums), so that a large batch costs time, not memory. A datum
/// longer than a pass runs alone.
pub const PASS_BYTES: usize = 1 << 30;

/// Many adapters over one frozen base model, or (for a model that is not shared) every weight
/// of the model itself.
pub struct TrainingEngine {
    model: Arc<Transformer>,
    slots: HashMap<AdapterId, Slot>,
    dtype: DType,
    full_parameters: bool,
    pass_bytes: usize,
    placement: Placement,
    /// The most device memory the adapters kept there may take (`None`: the device's).
    device_budget: Option<u64>,
}

impl TrainingEngine {
    /// An engine over `model` whose adapters compute in `dtype` (f32; f64 for gradient checks).
    pub fn new(model: Arc<Transformer>, dtype: DType) -> Self {
        TrainingEngine {
            model,
            slots: HashMap::new(),
            dtype,
            full_parameters: false,
            pass_bytes: PASS_BYTES,
            placement: Placement::Cpu(CpuPlacement),
            device_budget: None,
        }
    }

    /// An engine that trains every weight of `model` (already in `dtype`), which it owns: work
    /// items name [`FULL_PARAMETERS`] as their adapter. Used for warm-up before LoRA training.
    pub fn full_parameters(model: Transformer, dtype: DType) -> Result<Self, TrainError> {
        let (model, vars) = model.into_trainable()?;
        let slot = Slot::fresh(Trainable::Full(vars));
        Ok(TrainingEngine {
            model: Arc::new(model),
            slots: HashMap::from([(FULL_PARAMETERS.to_string(), slot)]),
            dtype,
            full_parameters: true,
            pass_bytes: PASS_BYTES,
            placement: Placement::Cpu(CpuPlacement),
            device_budget: None,
        })
    }

    /// The same engine, its passes on `device`: on CUDA the model's weights go to the device at
    /// the first pass and stay (a full-parameter step sends them again), and each adapter's
    /// weights, gradients and AdamW moments live there (its step runs there; the stepped weights
    /// come back to the host copy, which is what is published and saved); the losses stay on the
    /// host, and a full-parameter model's optimizer too. CUDA computes in f32 only.
    pub fn on_device(mut self, device: crate::model::Device) -> Result<Self, TrainError> {
        let cuda = device != crate::model::Device::Cpu;
        if cuda && self.dtype != DType::F32 {
            return Err(PassError::DType {
                dtype: self.dtype,
                device,
            }
            .into());
        }
        self.placement = Placement::open(device)?;
        self.keep_slots()?;
        Ok(self)
    }

    /// Hands every slot's state to the placement, where it keeps adapters on its device.
    fn keep_slots(&mut self) -> Result<(), TrainError> {
        let mut ids: Vec<AdapterId> = self.slots.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let room = self.device_room(&id);
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.keep_on(&self.placement, &id, room)?;
            }
        }
        Ok(())
    }

    /// The adapters kept on the device take at most `bytes` there: one more that would pass it
    /// is refused ([`TrainError::DeviceBudget`]) and the others keep training.
    pub fn with_device_budget(mut self, bytes: u64) -> Self {
        self.device_budget = Some(bytes);
        self
    }

    /// What the adapters other than `id` hold on the device, and the budget, if there is one.
    fn device_room(&self, id: &str) -> Option<(u64, u64)> {
        let budget = self.device_budget?;
        let held = self
            .slots
            .iter()
            .filter(|(other, slot)| other.as_str() != id && slot.resident.is_some())
            .map(|(_, slot)| slot.device_bytes())
            .sum();
        Some((held, budget))
    }

    /// The same engine, its passes on a CUDA device already open (`device` names it) over the
    /// model's `weights` already there in f32 (a sampler's on the same device: the base loaded
    /// once per device). A full-parameter engine changes its weights, so it keeps its own.
    #[cfg(feature = "cuda")]
    pub fn on_gpu(
        mut self,
        device: crate::model::Device,
        gpu: Arc<opentinker_kernels::cuda::Gpu>,
        weights: Arc<crate::model::GpuWeights>,
    ) -> Result<Self, TrainError> {
        if self.full_parameters {
            return Err(TrainError::FullParameterEngine);
        }
        if self.dtype != DType::F32 {
            return Err(PassError::DType {
                dtype: self.dtype,
                device,
            }
            .into());
        }
        self.placement = Placement::cuda_with_weights(device, gpu, weights);
        self.keep_slots()?;
        Ok(self)
    }

    /// Where the engine's passes run.
    pub fn device(&self) -> crate::model::Device {
        self.placement.device()
    }

    /// The model as trained so far, its weights plain tensors again (a copy: training the
    /// engine further does not change it).
    pub fn model_snapshot(&self) -> Result<Transformer, TrainError> {
        Ok(self.model.detached()?)
    }

    /// Add a fresh adapter; the base weights and every other adapter are untouched.
    pub fn add_adapter(&mut self, id: &str, config: LoraConfig) -> Result<(), TrainError> {
        if self.full_parameters {
            return Err(TrainError::FullParameterEngine);
        }
        if self.slots.contains_key(id) {
            return Err(TrainError::DuplicateAdapter(id.to_string()));
        }
        let adapter = Adapter::new(&self.model.config, config, self.dtype)?;
        let mut slot = Slot::fresh(Trainable::Lora(adapter));
        slot.keep_on(&self.placement, id, self.device_room(id))?;
        self.slots.insert(id.to_string(), slot);
        Ok(())
    }

    pub fn remove_adapter(&mut self, id: &str) -> Result<(), TrainError> {
        if self.full_parameters {
            return Err(TrainError::FullParameterEngine);
        }
        self.slots
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| TrainError::UnknownAdapter(id.to_string()))
    }

    pub fn adapter(&self, id: &str) -> Option<&Adapter> {
        self.slots.get(id).and_then(|s| s.trainable.adapter())
    }

    /// The trainable tensors of `id` (an adapter, or [`FULL_PARAMETERS`]) by name: PEFT names
    /// for an adapter, Hugging Face names for the model's own weights. On a device that keeps
    /// adapters (CUDA) these are the host copy, which each step refreshes; writing into them
    /// does not reach the device (import a state for that).
    pub fn parameters(&self, id: &str) -> Option<Vec<(String, Var)>> {
        let slot = self.slots.get(id)?;
        Some(
            slot.trainable
                .named_tensors()
                .into_iter()
                .map(|(name, var)| (name, var.clone()))
                .collect(),
        )
    }

    /// The gradients accumulated for `id` since its last step, by PEFT tensor name (`None`:
    /// none, or no such adapter).
    pub fn gradients(&self, id: &str) -> Result<Option<BTreeMap<String, Tensor>>, TrainError> {
        let Some(slot) = self.slots.get(id) else {
            return Ok(None);
        };
        let Some(gradients) = slot.host_gradients()? else {
            return Ok(None);
        };
        let names = slot.trainable.named_tensors().into_iter().map(|(n, _)| n);
        Ok(Some(names.zip(gradients).collect()))
    }

    /// Drop the gradients accumulated for `id` (and its non-finite mark) without stepping.
    pub fn discard_gradients(&mut self, id: &str) -> Result<(), TrainError> {
        let slot = self
            .slots
            .get_mut(id)
            .ok_or_else(|| TrainError::UnknownAdapter(id.to_string()))?;
        slot.gradients = None;
        slot.saw_non_finite = false;
        if let Some(resident) = &mut slot.resident {
            resident.clear_gradients();
        }
        Ok(())
    }

    /// AdamW moments and step count of `id`, by PEFT tensor name (`None`: no such adapter).
    pub fn optimizer_state(&self, id: &str) -> Result<Option<(u64, Moments)>, TrainError> {
        let Some(slot) = self.slots.get(id) else {
            return Ok(None);
        };
        let names = slot.trainable.named_tensors().into_iter().map(|(n, _)| n);
        let (first, second) = slot.moments()?;
        let moments = names.zip(first.into_iter().zip(second)).collect();
        Ok(Some((slot.step, moments)))
    }

    /// Everything adapter `id`'s training depends on (a copy: training further leaves it).
    pub fn export_state(&self, id: &str) -> Result<SlotState, TrainError> {
        let slot = self
            .slots
            .get(id)
            .ok_or_else(|| TrainError::UnknownAdapter(id.to_string()))?;
        let adapter = slot
            .trainable
            .adapter()
            .ok_or(TrainError::FullParameterEngine)?;
        // Values are copied (a step writes into the variables' storage); moments and gradients
        // are replaced, never written into, so sharing them is a snapshot already (and those
        // on a device come down as copies).
        let moments = slot.allocated_moments()?;
        let gradients = slot.host_gradients()?;
        let tensors = slot
            .trainable
            .named_tensors()
            .into_iter()
            .enumerate()
            .map(|(i, (name, var))| {
                Ok(NamedState {
                    name,
                    value: var.as_tensor().copy()?,
                    moments: moments
                        .as_ref()
                        .map(|(first, second)| (first[i].clone(), second[i].clone())),
                    gradient: gradients.as_ref().map(|g| g[i].clone()),
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(SlotState {
            config: adapter.config.clone(),
            tensors,
            step: slot.step,
            saw_non_finite: slot.saw_non_finite,
        })
    }

    /// Make adapter `id` (new, or replacing one of that name) exactly as `state` describes it.
    pub fn import_state(&mut self, id: &str, state: SlotState) -> Result<(), TrainError> {
        if self.full_parameters {
            return Err(TrainError::FullParameterEngine);
        }
        let adapter = state
            .adapter(&self.model.config, self.dtype)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let mut slot = Slot::fresh(Trainable::Lora(adapter));
        let mut gradients = Vec::new();
        for (name, _) in slot.trainable.named_tensors() {
            let saved = state.tensors.iter().find(|t| t.name == name);
            if let Some(saved) = saved {
                if let Some((m, v)) = &saved.moments {
                    slot.first_moments.push(m.to_dtype(self.dtype)?);
                    slot.second_moments.push(v.to_dtype(self.dtype)?);
                }
                if let Some(g) = &saved.gradient {
                    gradients.push(g.to_dtype(self.dtype)?);
                }
            }
        }
        let count = state.tensors.len();
        if !(slot.first_moments.is_empty() || slot.first_moments.len() == count)
            || !(gradients.is_empty() || gradients.len() == count)
        {
            return Err(candle_core::Error::Msg(
                "the saved state has moments or gradients of only some tensors".into(),
            )
            .into());
        }
        slot.gradients = (!gradients.is_empty()).then_some(gradients);
        slot.step = state.step;
        slot.saw_non_finite = state.saw_non_finite;
        slot.keep_on(&self.placement, id, self.device_room(id))?;
        self.slots.insert(id.to_string(), slot);
        Ok(())
    }

    /// Save adapter `id` (with its optimizer state when `with_optimizer`) as a PEFT checkpoint.
    pub fn save_adapter(
        &self,
        id: &str,
        dir: &std::path::Path,
        base_model: &str,
        with_optimizer: bool,
    ) -> Result<(), TrainError> {
        let slot = self
            .slots
            .get(id)
            .ok_or_else(|| TrainError::UnknownAdapter(id.to_string()))?;
        let state = match with_optimizer {
            true => self.optimizer_state(id)?,
            false => None,
        };
        let optimizer = state
            .as_ref()
            .filter(|_| with_optimizer)
            .map(|(step, moments)| (*step, moments));
        let adapter = slot
            .trainable
            .adapter()
            .ok_or(TrainError::FullParameterEngine)?;
        super::checkpoint::save(dir, adapter, base_model, optimizer)?;
        Ok(())
    }

    /// Load a checkpoint as adapter `id` (new, or replacing one of that name); its optimizer
    /// state too when the checkpoint has one and `with_optimizer`, else a fresh optimizer.
    pub fn load_adapter(
        &mut self,
        id: &str,
        dir: &std::path::Path,
        with_optimizer: bool,
    ) -> Result<(), TrainError> {
        if self.full_parameters {
            return Err(TrainError::FullParameterEngine);
        }
        let loaded = super::checkpoint::load(dir, &self.model.config, self.dtype)?;
        let mut slot = Slot::fresh(Trainable::Lora(loaded.adapter));
        if let Some((step, mut moments)) = loaded.optimizer.filter(|_| with_optimizer) {
            // Slots keep moments in the adapter's tensor order, not by name.
            for (name, _) in slot.trainable.named_tensors() {
                let (m, v) = moments.remove(&name).ok_or_else(|| {
                    candle_core::Error::Msg(format!("the optimizer state has no moments of {name}"))
                })?;
                slot.first_moments.push(m);
                slot.second_moments.push(v);
            }
            slot.step = step;
        }
        slot.keep_on(&self.placement, id, self.device_room(id))?;
        self.slots.insert(id.to_string(), slot);
        Ok(())
    }

    /// Logprobs and losses of the items, without gradients. A call over more tokens than one
    /// pass holds runs in passes (see [`PASS_BYTES`]).
    pub fn forward(&self, items: &[WorkItem]) -> Result<Vec<ItemOutput>, TrainError> {
        self.check(items)?;
        match self.passes(items) {
            None => Ok(self.run(items, false)?.outputs),
            Some(passes) => in_passes(items.len(), passes, |part| {
                Ok(self.run(part, false)?.outputs)
            }),
        }
    }

    /// Logprobs and losses of the items; their gradients accumulate in each adapter's slot.
    /// A call over more tokens than one pass holds runs in passes (see [`PASS_BYTES`]), each
    /// adding its gradients as another call would. Every datum is checked first, so a bad one
    /// refuses the call before any pass has added gradients; a pass that fails later (an
    /// objective with no answer) takes back what the call's earlier passes added, so a call
    /// adds all its gradients or none.
    pub fn forward_backward(&mut self, items: &[WorkItem]) -> Result<Vec<ItemOutput>, TrainError> {
        self.check(items)?;
        let Some(passes) = self.passes(items) else {
            return self.forward_backward_pass(items);
        };
        let mut before = Vec::new();
        for (id, slot) in &self.slots {
            if items.iter().any(|item| &item.adapter == id) {
                let on_device = slot.resident.as_ref().map(Resident::snapshot).transpose()?;
                let host = slot.gradients.clone();
                before.push((id.clone(), host, on_device, slot.saw_non_finite));
            }
        }
        let outputs = in_passes(items.len(), passes, |part| self.forward_backward_pass(part));
        if outputs.is_err() {
            for (id, gradients, on_device, saw_non_finite) in before {
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.gradients = gradients;
                    slot.saw_non_finite = saw_non_finite;
                    if let (Some(resident), Some(snapshot)) = (&mut slot.resident, on_device) {
                        resident.take_non_finite();
                        resident.restore(snapshot);
                    }
                }
            }
        }
        outputs
    }

    /// The most memory one pass's activations may hold; [`PASS_BYTES`] unless set.
    pub fn with_pass_bytes(mut self, bytes: usize) -> Self {
        self.pass_bytes = bytes;
        self
    }

    /// The tokens one pass over `items` may hold: as many as [`PASS_BYTES`] (or the engine's
    /// own bound) has room for; a datum longer than that runs alone.
    pub fn pass_tokens(&self, items: &[WorkItem]) -> usize {
        let trains_unembed = |item: &WorkItem| match self.slots.get(&item.adapter) {
            Some(slot) => match slot.trainable.adapter() {
                Some(adapter) => adapter.sites.contains_key(&Site::Unembed),
                None => true,
            },
            None => false,
        };
        let logits = self.full_parameters || items.iter().any(trains_unembed);
        let per_token =
            train_values_per_token(&self.model.config, logits) * self.dtype.size_in_bytes();
        (self.pass_bytes / per_token.max(1)).max(1)
    }

    /// `items` in passes of whole datums that each fit [`Self::pass_tokens`] (a datum longer
    /// than that alone); `None` when one pass holds them all.
    fn passes(&self, items: &[WorkItem]) -> Option<Vec<PassItems>> {
        let limit = self.pass_tokens(items);
        let total: usize = items
            .iter()
            .flat_map(|item| &item.datums)
            .map(|d| d.input_tokens.len())
            .sum();
        if total <= limit {
            return None;
        }
        let (mut passes, mut pass, mut tokens) = (Vec::new(), PassItems::default(), 0);
        for (i, item) in items.iter().enumerate() {
            for datum in &item.datums {
                let length = datum.input_tokens.len();
                if tokens > 0 && tokens + length > limit {
                    passes.push(std::mem::take(&mut pass));
                    tokens = 0;
                }
                match (pass.from.last(), pass.items.last_mut()) {
                    (Some(&from), Some(part)) if from == i => part.datums.push(datum.clone()),
                    _ => {
                        pass.from.push(i);
                        pass.items.push(item.part(vec![datum.clone()]));
                    }
                }
                tokens += length;
            }
        }
        if !pass.items.is_empty() {
            passes.push(pass);
        }
        Some(passes)
    }

    /// Every item's adapter known and every datum well formed; errors name the item and datum
    /// as the caller numbered them.
    fn check(&self, items: &[WorkItem]) -> Result<(), TrainError> {
        let vocab = self.model.config.vocab_size;
        for (i, item) in items.iter().enumerate() {
            if !self.slots.contains_key(&item.adapter) {
                return Err(TrainError::UnknownAdapter(item.adapter.clone()));
            }
            if item.checked {
                continue;
            }
            for (d, datum) in item.datums.iter().enumerate() {
                check_datum(datum, vocab).map_err(|problem| TrainError::BadDatum {
                    item: i,
                    datum: d,
                    problem,
                })?;
                // Before any pass computes (in a fused pass, before another caller's work is
                // touched).
                if let Loss::Custom(custom) = &item.loss {
                    custom
                        .check_datum(datum.target_tokens.len(), &datum.inputs)
                        .map_err(|source| TrainError::CustomLoss {
                            item: i,
                            datum: d,
                            source: Box::new(source),
                        })?;
                }
            }
        }
        Ok(())
    }

    /// [`Self::forward_backward`] in one pass.
    fn forward_backward_pass(&mut self, items: &[WorkItem]) -> Result<Vec<ItemOutput>, TrainError> {
        let Pass {
            outputs,
            mut gradients,
        } = self.run(items, true)?;
        let mut adapters: Vec<&AdapterId> = items.iter().map(|i| &i.adapter).collect();
        adapters.sort();
        adapters.dedup();
        for id in adapters {
            let slot = self
                .slots
                .get_mut(id)
                .ok_or_else(|| TrainError::UnknownAdapter(id.clone()))?;
            // A resident adapter's pass added its gradients on the device.
            if let Some(resident) = &slot.resident {
                slot.saw_non_finite |= resident.take_non_finite();
                continue;
            }
            let fresh = match gradients.iter().position(|(g, _)| g == id) {
                Some(at) => gradients.swap_remove(at).1,
                None => slot
                    .trainable
                    .named_tensors()
                    .iter()
                    .map(|(_, var)| var.as_tensor().zeros_like())
                    .collect::<candle_core::Result<_>>()?,
            };
            let non_finite = fresh
                .iter()
                .map(|g| g.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>())
                .collect::<candle_core::Result<Vec<f64>>>()?
                .iter()
                .any(|n| !n.is_finite());
            slot.saw_non_finite |= non_finite;
            slot.gradients = Some(match slot.gradients.take() {
                Some(old) => old
                    .iter()
                    .zip(&fresh)
                    .map(|(a, b)| a + b)
                    .collect::<candle_core::Result<_>>()?,
                None => fresh,
            });
        }
        for (item, output) in items.iter().zip(&outputs) {
            if !output.loss.is_finite()
                && let Some(slot) = self.slots.get_mut(&item.adapter)
            {
                slot.saw_non_finite = true;
            }
        }
        Ok(outputs)
    }

    /// Apply AdamW to `id` with its accumulated gradients, then clear them. Every other adapter's
    /// weights, gradients and moments are left as they are.
    pub fn optim_step(&mut self, id: &str, params: &AdamParams) -> Result<StepReport, TrainError> {
        let slot = self
            .slots
            .get_mut(id)
            .ok_or_else(|| TrainError::UnknownAdapter(id.to_string()))?;
        let gradients = slot.gradients.take();
        if std::mem::take(&mut slot.saw_non_finite) {
            if let Some(resident) = &mut slot.resident {
                resident.clear_gradients();
            }
            return Ok(StepReport::SkippedNonFinite);
        }
        if let (Some(resident), Trainable::Lora(adapter)) = (&mut slot.resident, &slot.trainable) {
            let norms = resident.step(adapter, params)?;
            slot.step += 1;
            return Ok(StepReport::Updated {
                step: slot.step,
                grad_norm: norms.gradient,
                update_norm: norms.update,
                weight_norm: norms.weights,
            });
        }
        let vars: Vec<_> = slot
            .trainable
            .named_tensors()
            .into_iter()
            .map(|(_, v)| v.clone())
            .collect();
        let gradients = match gradients {
            Some(g) => g,
            None => vars
                .iter()
                .map(|v| v.as_tensor().zeros_like())
                .collect::<candle_core::Result<_>>()?,
        };
        let mut square_sum = 0.0;
        for g in &gradients {
            square_sum += g
                .sqr()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
        }
        let grad_norm = square_sum.sqrt();
        let clip = if params.grad_clip_norm > 0.0 && grad_norm > params.grad_clip_norm {
            params.grad_clip_norm / grad_norm
        } else {
            1.0
        };
        if slot.first_moments.is_empty() {
            (slot.first_moments, slot.second_moments) = slot.moments()?;
        }
        slot.step += 1;
        let t = slot.step as i32;
        let square_norm = |t: &Tensor| -> candle_core::Result<f64> {
            t.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()
        };
        let (mut update_square, mut weight_square) = (0.0, 0.0);
        let step = AdamUpdate {
            params: *params,
            step: t,
            clip,
        };
        for (i, (var, g)) in vars.iter().zip(&gradients).enumerate() {
            let w = var.as_tensor();
            let (m, v) = (&slot.first_moments[i], &slot.second_moments[i]);
            let (updated, m, v) = self.placement.adamw(w, g, m, v, step)?;
            update_square += square_norm(&(&updated - w)?)?;
            weight_square += square_norm(w)?;
            var.set(&updated)?;
            slot.first_moments[i] = m;
            slot.second_moments[i] = v;
        }
        if matches!(slot.trainable, Trainable::Full(_)) {
            self.placement.weights_changed();
        }
        Ok(StepReport::Updated {
            step: slot.step,
            grad_norm,
            update_norm: update_square.sqrt(),
            weight_norm: weight_square.sqrt(),
        })
    }

    /// One fused pass over every item (checked by the caller) on the engine's device: rows
    /// grouped by adapter, each datum a whole sequence through the model's layers; with
    /// `backward`, each trainable's fresh gradients.
    fn run(&self, items: &[WorkItem], backward: bool) -> Result<Pass, TrainError> {
        match (&self.placement, self.dtype) {
            (Placement::Cpu(cpu), DType::F32) => self.run_on::<f32>(cpu, items, backward),
            (Placement::Cpu(cpu), DType::F64) => self.run_on::<f64>(cpu, items, backward),
            #[cfg(feature = "cuda")]
            (Placement::Cuda(cuda), DType::F32) => self.run_on::<f32>(&**cuda, items, backward),
            (placement, dtype) => Err(PassError::DType {
                dtype,
                device: placement.device(),
            }
            .into()),
        }
    }

    fn run_on<T: TrainFloat>(
        &self,
        placement: &impl Runs<T>,
        items: &[WorkItem],
        backward: bool,
    ) -> Result<Pass, TrainError> {
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by(|&a, &b| items[a].adapter.cmp(&items[b].adapter));
        let width = items
            .iter()
            .flat_map(|item| &item.datums)
            .map(|d| d.input_tokens.len())
            .fold(1, usize::max);
        let rows: Vec<(usize, &Datum)> = order
            .iter()
            .flat_map(|&i| items[i].datums.iter().map(move |d| (i, d)))
            .collect();
        if rows.is_empty() {
            let outputs = items.iter().map(|_| ItemOutput::default()).collect();
            return Ok(Pass {
                outputs,
                gradients: Vec::new(),
            });
        }

        // The adapters of the pass, each named by one index.
        let mut ids: Vec<&AdapterId> = order.iter().map(|&i| &items[i].adapter).collect();
        ids.dedup();
        let mut adapters: Vec<&Adapter> = Vec::new();
        let mut resident: Vec<Option<&Resident>> = Vec::new();
        let mut index: HashMap<&AdapterId, usize> = HashMap::new();
        for id in &ids {
            let Some(slot) = self.slots.get(*id) else {
                continue;
            };
            if let Some(adapter) = slot.trainable.adapter() {
                index.insert(*id, adapters.len());
                adapters.push(adapter);
                resident.push(slot.resident.as_ref());
            }
        }
        let sequences: Vec<TrainSequence<'_>> = rows
            .iter()
            .map(|(i, datum)| TrainSequence {
                tokens: &datum.input_tokens,
                targets: &datum.target_tokens,
                adapter: index.get(&items[*i].adapter).copied(),
                temperature: items[*i].temperature,
            })
            .collect();
        let input = PassInput {
            model: &self.model,
            adapters: &adapters,
            resident: &resident,
            sequences: &sequences,
            backward,
            full_parameters: self.full_parameters,
        };
        let (outputs, gradients) = placement.pass(&input, |logprobs: &[T]| {
            self.losses_of(items, &order, &rows, logprobs, width, backward)
        })?;
        let Some(PassGradients {
            adapters: mut per_adapter,
            weights: mut weight_grads,
        }) = gradients
        else {
            return Ok(Pass {
                outputs,
                gradients: Vec::new(),
            });
        };

        let mut gradients = Vec::new();
        for id in ids {
            let Some(slot) = self.slots.get(id).filter(|slot| slot.resident.is_none()) else {
                continue;
            };
            let tensors = match (&slot.trainable, index.get(id), weight_grads.take()) {
                (Trainable::Lora(adapter), Some(&k), _) => {
                    let mut sites = per_adapter
                        .get_mut(k)
                        .map(std::mem::take)
                        .unwrap_or_default();
                    let mut tensors = Vec::with_capacity(2 * adapter.sites.len());
                    for (site, pair) in &adapter.sites {
                        let (da, db) = sites.remove(site).unwrap_or_default();
                        tensors.push(gradient_tensor(da, pair.a.as_tensor())?);
                        tensors.push(gradient_tensor(db, pair.b.as_tensor())?);
                    }
                    tensors
                }
                (Trainable::Full(vars), _, Some(grads)) => {
                    let mut named: HashMap<String, Vec<T>> = grads.into_iter().collect();
                    vars.iter()
                        .map(|(name, var)| {
                            gradient_tensor(named.remove(name).unwrap_or_default(), var.as_tensor())
                        })
                        .collect::<candle_core::Result<_>>()?
                }
                _ => continue,
            };
            gradients.push((id.clone(), tensors));
        }
        Ok(Pass { outputs, gradients })
    }

    /// The items' outputs from the pass's logprobs (its rows' one after another, in `order`)
    /// and, for a backward, the gradient of their summed loss with respect to those logprobs.
    /// The losses are small graphs over the logprobs padded to the longest datum.
    #[allow(clippy::type_complexity)]
    fn losses_of<T: TrainFloat>(
        &self,
        items: &[WorkItem],
        order: &[usize],
        rows: &[(usize, &Datum)],
        logprobs: &[T],
        width: usize,
        backward: bool,
    ) -> Result<(Vec<ItemOutput>, Option<Vec<T>>), TrainError> {
        let mut padded = vec![T::zero(); rows.len() * width];
        let mut rest = logprobs;
        for ((_, datum), row) in rows.iter().zip(padded.chunks_exact_mut(width)) {
            let (mine, next) = rest.split_at(datum.input_tokens.len().min(rest.len()));
            row[..mine.len()].copy_from_slice(mine);
            rest = next;
        }
        let logprobs = Var::from_tensor(&Tensor::from_vec(
            padded,
            (rows.len(), width),
            &Device::Cpu,
        )?)?;
        let (outputs, total) = self.losses(items, order, rows, logprobs.as_tensor(), width)?;
        if !backward {
            return Ok((outputs, None));
        }
        let d_padded = match total.backward()?.get(logprobs.as_tensor()) {
            Some(g) => g.flatten_all()?.to_vec1::<T>()?,
            None => vec![T::zero(); rows.len() * width],
        };
        let d_logprobs = rows
            .iter()
            .zip(d_padded.chunks_exact(width))
            .flat_map(|((_, datum), row)| row[..datum.input_tokens.len()].iter().copied())
            .collect();
        Ok((outputs, Some(d_logprobs)))
    }

    /// Each item's loss and metrics from the padded logprobs (`rows × width`, in `order`), and
    /// their sum (the root of the loss's backward).
    fn losses(
        &self,
        items: &[WorkItem],
        order: &[usize],
        rows: &[(usize, &Datum)],
        logprobs: &Tensor,
        width: usize,
    ) -> Result<(Vec<ItemOutput>, Tensor), TrainError> {
        let padded = |values: &dyn Fn(&Datum) -> Vec<f64>| -> candle_core::Result<Tensor> {
            let mut flat = Vec::with_capacity(rows.len() * width);
            for (_, datum) in rows {
                let mut row = values(datum);
                row.resize(width, 0.0);
                flat.extend(row);
            }
            Tensor::from_vec(flat, (rows.len(), width), &Device::Cpu)?.to_dtype(self.dtype)
        };
        let as_f64 = |v: &Option<Vec<f32>>| {
            v.as_ref()
                .map(|v| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>())
        };
        let mask = padded(&|d| d.mask.iter().map(|&x| f64::from(x)).collect())?;
        let weights = padded(&|d| as_f64(&d.weights).unwrap_or_else(|| vec![1.0; d.mask.len()]))?;
        let advantages =
            padded(&|d| as_f64(&d.advantages).unwrap_or_else(|| vec![0.0; d.mask.len()]))?;
        let sampler =
            padded(&|d| as_f64(&d.sampler_logprobs).unwrap_or_else(|| vec![0.0; d.mask.len()]))?;
        // Only `gspo` reads each sequence's ratio tokens.
        let ratio = match items
            .iter()
            .any(|item| matches!(item.loss, Loss::Gspo { .. }))
        {
            true => Some(padded(&|d| {
                let tokens =
                    ratio_tokens(d.ratio_mask.as_deref(), &d.mask, d.advantages.as_deref());
                tokens.into_iter().map(f64::from).collect()
            })?),
            false => None,
        };

        let mut outputs: Vec<Option<ItemOutput>> = vec![None; items.len()];
        let mut total: Option<Tensor> = None;
        let mut start = 0;
        for &i in order {
            let count = items[i].datums.len();
            let rows_of = |t: &Tensor| t.narrow(0, start, count);
            let item_logprobs = rows_of(logprobs)?;
            let (item_mask, item_weights, item_advantages, item_sampler, item_ratio) = (
                rows_of(&mask)?,
                rows_of(&weights)?,
                rows_of(&advantages)?,
                rows_of(&sampler)?,
                ratio.as_ref().map(rows_of).transpose()?,
            );
            let mut custom_metrics = BTreeMap::new();
            let value = match &items[i].loss {
                Loss::Custom(custom) => custom_loss(
                    custom,
                    &item_logprobs,
                    &items[i].datums,
                    i,
                    &mut custom_metrics,
                )?,
                Loss::Objective(objective) => objective_loss(
                    objective,
                    &item_logprobs,
                    &items[i].datums,
                    i,
                    &mut custom_metrics,
                )?,
                builtin => loss(
                    builtin,
                    &LossInputs {
                        logprobs: &item_logprobs,
                        mask: &item_mask,
                        weights: Some(&item_weights),
                        sampler_logprobs: Some(&item_sampler),
                        advantages: Some(&item_advantages),
                        ratio_mask: item_ratio.as_ref(),
                    },
                )?,
            };
            let per_row = item_logprobs.to_dtype(DType::F32)?.to_vec2::<f32>()?;
            let logprobs = per_row
                .into_iter()
                .zip(&items[i].datums)
                .map(|(mut row, datum)| {
                    row.truncate(datum.target_tokens.len());
                    row
                })
                .collect();
            let loss_value = value.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let counted = item_mask
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
            let counted_logprob = (item_logprobs.detach() * &item_mask)?
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
            let mut metrics = BTreeMap::from([
                ("loss:sum".to_string(), loss_value),
                ("tokens:sum".to_string(), counted),
                ("logprob:sum".to_string(), counted_logprob),
            ]);
            metrics.extend(custom_metrics);
            outputs[i] = Some(ItemOutput {
                logprobs,
                loss: loss_value,
                metrics,
            });
            total = Some(match total {
                Some(sum) => (sum + value)?,
                None => value,
            });
            start += count;
        }
        let outputs = outputs.into_iter().map(Option::unwrap_or_default).collect();
        let total = match total {
            Some(total) => total,
            None => Tensor::zeros((), self.dtype, &Device::Cpu)?,
        };
        Ok((outputs, total))
    }
}

/// A custom loss over an item's datums: the sum of its value on each datum's row of `logprobs`
/// (`datums × width`, cut to the datum's length). Its metrics are added to `metrics` as sums
/// over the datums, `:mean` ones too (the answer divides those by the call's datum count).
fn custom_loss(
    custom: &CompiledLoss,
    logprobs: &Tensor,
    datums: &[Datum],
    item: usize,
    metrics: &mut BTreeMap<String, f64>,
) -> Result<Tensor, TrainError> {
    let mut total: Option<Tensor> = None;
    for (d, datum) in datums.iter().enumerate() {
        let row = logprobs.get(d)?.narrow(0, 0, datum.target_tokens.len())?;
        let (value, named) = custom
            .evaluate_datum(&row, &datum.inputs)
            .map_err(|source| TrainError::CustomLoss {
                item,
                datum: d,
                source: Box::new(source),
            })?;
        for (name, metric) in named {
            let metric = metric.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            *metrics.entry(name).or_default() += metric;
        }
        total = Some(match total {
            Some(sum) => (sum + value)?,
            None => value,
        });
    }
    match total {
        Some(total) => Ok(total),
        None => Ok(Tensor::zeros((), logprobs.dtype(), logprobs.device())?),
    }
}

/// An objective's loss over an item's datums (`logprobs`: `datums × width`): it answers each
/// datum's value and gradient from the logprobs' numbers; the tensor returned is
/// `Σ g·logprobs` with `g` held fixed, shifted to the objective's summed value, so that its
/// backward is the objective's gradient. Its metrics are added to `metrics` as sums.
fn objective_loss(
    objective: &Objective,
    logprobs: &Tensor,
    datums: &[Datum],
    item: usize,
    metrics: &mut BTreeMap<String, f64>,
) -> Result<Tensor, TrainError> {
    let rows = logprobs.detach().to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let inputs: Vec<ObjectiveInput<'_>> = rows
        .iter()
        .zip(datums)
        .map(|(row, datum)| ObjectiveInput {
            logprobs: &row[..datum.target_tokens.len().min(row.len())],
            mask: &datum.mask,
            weights: datum.weights.as_deref(),
            advantages: datum.advantages.as_deref(),
            sampler_logprobs: datum.sampler_logprobs.as_deref(),
            inputs: &datum.inputs,
        })
        .collect();
    let losses = objective
        .losses(&inputs)
        .map_err(|source| TrainError::Objective { item, source })?;
    let width = rows.first().map_or(0, Vec::len);
    let mut gradient = vec![0.0f32; rows.len() * width];
    let mut value = 0.0;
    for (d, loss) in losses.iter().enumerate() {
        gradient[d * width..d * width + loss.gradient.len()].copy_from_slice(&loss.gradient);
        value += loss.value;
        for (name, metric) in &loss.metrics {
            *metrics.entry(name.clone()).or_default() += metric;
        }
    }
    let gradient = Tensor::from_vec(gradient, (rows.len(), width), logprobs.device())?
        .to_dtype(logprobs.dtype())?;
    let surrogate = (logprobs * gradient)?.sum_all()?;
    Ok(((&surrogate - surrogate.detach())? + value)?)
}

/// One pass of a call split in passes: parts of the call's items (each of whole datums, in
/// order), and the index of the item each part comes from.
#[derive(Default)]
struct PassItems {
    from: Vec<usize>,
    items: Vec<WorkItem>,
}

/// The outputs of a call of `count` items run as `passes`, each by `run`: each item's logprobs
/// in datum order, its sums added.
fn in_passes(
    count: usize,
    passes: Vec<PassItems>,
    mut run: impl FnMut(&[WorkItem]) -> Result<Vec<ItemOutput>, TrainError>,
) -> Result<Vec<ItemOutput>, TrainError> {
    let mut outputs = vec![ItemOutput::default(); count];
    for pass in passes {
        for (&from, part) in pass.from.iter().zip(run(&pass.items)?) {
            let output = &mut outputs[from];
            output.logprobs.extend(part.logprobs);
            output.loss += part.loss;
            for (name, value) in part.metrics {
                *output.metrics.entry(name).or_default() += value;
            }
        }
    }
    Ok(outputs)
}

/// Whether a datum is well formed: equal lengths, tokens in the vocabulary.
fn check_datum(datum: &Datum, vocab: usize) -> Result<(), String> {
    let n = datum.input_tokens.len();
    if n == 0 {
        return Err("no tokens".into());
    }
    let lengths = [
        ("target_tokens", Some(datum.target_tokens.len())),
        ("mask", Some(datum.mask.len())),
        ("weights", datum.weights.as_ref().map(Vec::len)),
        ("advantages", datum.advantages.as_ref().map(Vec::len)),
        (
            "sampler_logprobs",
            datum.sampler_logprobs.as_ref().map(Vec::len),
        ),
        ("ratio_mask", datum.ratio_mask.as_ref().map(Vec::len)),
    ];
    for (name, len) in lengths {
        if let Some(len) = len
            && len != n
        {
            return Err(format!("{name} has {len} entries for {n} input tokens"));
        }
    }
    for (name, input) in &datum.inputs {
        let cells: usize = input.shape.iter().product();
        if cells != input.values.len() {
            return Err(format!(
                "loss input {name:?} has {} values for its shape {:?}",
                input.values.len(),
                input.shape
            ));
        }
    }
    if let Some(bad) = datum
        .input_tokens
        .iter()
        .chain(&datum.target_tokens)
        .find(|&&t| t as usize >= vocab)
    {
        return Err(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        ));
    }
    Ok(())
}
