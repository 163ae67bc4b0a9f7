//! The whole training state of one adapter (weights, AdamW moments and step, the gradients
//! accumulated since the last step), as bytes: what a crash-safe service stores after every op
//! so that a restarted engine continues bit for bit. One safetensors buffer: tensors by PEFT name
//! with suffixes, the rest in its metadata.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::lora::{Adapter, LoraConfig};
use crate::model::ModelConfig;

/// One adapter's training state.
#[derive(Clone, Debug)]
pub struct SlotState {
    pub config: LoraConfig,
    /// Per trainable tensor, by PEFT name: its value, AdamW moments and accumulated gradient.
    pub tensors: Vec<NamedState>,
    pub step: u64,
    pub saw_non_finite: bool,
}

#[derive(Clone, Debug)]
pub struct NamedState {
    pub name: String,
    pub value: Tensor,
    /// `None` before the first step (zero).
    pub moments: Option<(Tensor, Tensor)>,
    pub gradient: Option<Tensor>,
}

#[derive(Debug, thiserror::Error)]
pub enum SlotStateError {
    #[error("the saved training state is damaged: {0}")]
    Damaged(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

const CONFIG: &str = "lora_config";
const STEP: &str = "step";
const NON_FINITE: &str = "saw_non_finite";

impl SlotState {
    /// The state as one safetensors buffer.
    pub fn encode(&self) -> Result<Vec<u8>, SlotStateError> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for t in &self.tensors {
            tensors.push((t.name.clone(), t.value.clone()));
            if let Some((m, v)) = &t.moments {
                tensors.push((format!("{}.exp_avg", t.name), m.clone()));
                tensors.push((format!("{}.exp_avg_sq", t.name), v.clone()));
            }
            if let Some(g) = &t.gradient {
                tensors.push((format!("{}.grad", t.name), g.clone()));
            }
        }
        let config = serde_json::to_string(&self.config)
            .map_err(|e| SlotStateError::Damaged(e.to_string()))?;
        let metadata = HashMap::from([
            (CONFIG.to_string(), config),
            (STEP.to_string(), self.step.to_string()),
            (NON_FINITE.to_string(), self.saw_non_finite.to_string()),
        ]);
        safetensors::serialize(tensors, Some(metadata))
            .map_err(|e| SlotStateError::Damaged(e.to_string()))
    }

    /// Read a buffer [`encode`](Self::encode) made, with tensors in `dtype`.
    pub fn decode(bytes: &[u8], dtype: DType) -> Result<Self, SlotStateError> {
        let damaged = |what: &str| SlotStateError::Damaged(what.to_string());
        let (_, metadata) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| SlotStateError::Damaged(e.to_string()))?;
        let info = metadata
            .metadata()
            .clone()
            .ok_or_else(|| damaged("no metadata"))?;
        let config: LoraConfig = info
            .get(CONFIG)
            .and_then(|c| serde_json::from_str(c).ok())
            .ok_or_else(|| damaged("no LoRA config"))?;
        let step = info
            .get(STEP)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| damaged("no step"))?;
        let saw_non_finite = info.get(NON_FINITE).is_some_and(|s| s == "true");
        let mut all = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?;
        let mut take = |name: &str| -> Result<Option<Tensor>, SlotStateError> {
            all.remove(name)
                .map(|t| t.to_dtype(dtype))
                .transpose()
                .map_err(Into::into)
        };
        let mut names: Vec<String> = Vec::new();
        for name in metadata.tensors().keys() {
            if !name.ends_with(".exp_avg")
                && !name.ends_with(".exp_avg_sq")
                && !name.ends_with(".grad")
            {
                names.push(name.clone());
            }
        }
        names.sort();
        let mut tensors = Vec::with_capacity(names.len());
        for name in names {
            let value = take(&name)?.ok_or_else(|| damaged(&name))?;
            let moments = match (
                take(&format!("{name}.exp_avg"))?,
                take(&format!("{name}.exp_avg_sq"))?,
            ) {
                (Some(m), Some(v)) => Some((m, v)),
                (None, None) => None,
                _ => return Err(damaged(&format!("{name}: one moment without the other"))),
            };
            let gradient = take(&format!("{name}.grad"))?;
            tensors.push(NamedState {
                name,
                value,
                moments,
                gradient,
            });
        }
        Ok(SlotState {
            config,
            tensors,
            step,
            saw_non_finite,
        })
    }
}

impl SlotState {
    /// The adapter these values make, for a base model of `model`'s shapes.
    pub fn adapter(&self, model: &ModelConfig, dtype: DType) -> Result<Adapter, SlotStateError> {
        let damaged = |what: String| SlotStateError::Damaged(what);
        let adapter =
            Adapter::new(model, self.config.clone(), dtype).map_err(|e| damaged(e.to_string()))?;
        let named = adapter.named_tensors();
        if named.len() != self.tensors.len() {
            return Err(damaged(format!(
                "{} tensors, the adapter has {}",
                self.tensors.len(),
                named.len()
            )));
        }
        for (name, var) in named {
            let saved = self
                .tensors
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| damaged(format!("no tensor {name}")))?;
            if saved.value.dims() != var.as_tensor().dims() {
                return Err(damaged(format!(
                    "tensor {name} has shape {:?}, not {:?}",
                    saved.value.dims(),
                    var.as_tensor().dims()
                )));
            }
            var.set(&saved.value.to_dtype(dtype)?)?;
        }
        Ok(adapter)
    }
}
