//! Adapter checkpoints in the PEFT format (`adapter_model.safetensors` with PEFT's tensor names and
//! `adapter_config.json`), so they load in PEFT and vLLM, plus our optimizer state
//! (`optimizer.safetensors`, `trainer_state.json`). A checkpoint is written into a temporary
//! folder, fsynced, and renamed into place: a crash leaves the old checkpoint or the new one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use serde_json::{Value, json};

use crate::lora::{Adapter, LoraConfig, LowRank};
use crate::model::ModelConfig;
use crate::model::{Site, Target};

/// AdamW's first and second moments of each trainable tensor, by PEFT tensor name (what a
/// checkpoint's `optimizer.safetensors` holds, and the engine's optimizer keeps).
pub type Moments = BTreeMap<String, (Tensor, Tensor)>;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("checkpoint {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

const ADAPTER_FILE: &str = "adapter_model.safetensors";
const CONFIG_FILE: &str = "adapter_config.json";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const STATE_FILE: &str = "trainer_state.json";

fn target_from_module(module: &str) -> Option<Target> {
    Target::ATTENTION
        .into_iter()
        .chain(Target::MLP)
        .find(|t| t.module().ends_with(module))
}

/// Save `adapter` (and, if given, its optimizer step and moments) to the folder `dir`, replacing
/// what is there atomically.
pub fn save(
    dir: &Path,
    adapter: &Adapter,
    base_model: &str,
    optimizer: Option<(u64, &Moments)>,
) -> Result<(), CheckpointError> {
    let unembed = Site::Unembed.peft_prefix();
    write(dir, adapter, base_model, optimizer, &unembed, |_| Ok(()))
}
/// The unembedding's name in Tinker's external format, which the cookbook's weights tools map to
/// `lm_head` or, where the model ties it, to the embedding.
const EXTERNAL_UNEMBED: &str = "base_model.model.model.unembed_tokens";

/// Save `adapter` in the external format that the Tinker cookbook's weights tools read
/// (`weights.build_hf_model`, `build_lora_adapter`): our checkpoint's files with the
/// unembedding under Tinker's name. `seal` runs over the written folder before it replaces
/// `dir` (an export's encryption), so no file is ever in place unsealed.
pub fn save_external(
    dir: &Path,
    adapter: &Adapter,
    base_model: &str,
    seal: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    write(dir, adapter, base_model, None, EXTERNAL_UNEMBED, seal)
}

fn write(
    dir: &Path,
    adapter: &Adapter,
    base_model: &str,
    optimizer: Option<(u64, &Moments)>,
    unembed: &str,
    seal: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut modules: Vec<&str> = adapter
        .config
        .targets()
        .iter()
        .map(|t| t.module().rsplit('.').next().unwrap_or_default())
        .collect();
    if adapter.config.train_unembed {
        modules.push("lm_head");
    }
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": adapter.config.rank,
        "lora_alpha": adapter.config.alpha,
        "use_rslora": adapter.config.rslora,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "modules_to_save": null,
        "init_lora_weights": true,
    });
    let peft_unembed = Site::Unembed.peft_prefix();
    let tensors: HashMap<String, Tensor> = adapter
        .named_tensors()
        .into_iter()
        .map(|(name, var)| {
            let name = match name.strip_prefix(peft_unembed.as_str()) {
                Some(rest) => format!("{unembed}{rest}"),
                None => name,
            };
            Ok((name, var.as_tensor().to_dtype(DType::F32)?))
        })
        .collect::<candle_core::Result<_>>()?;
    crate::store::write_atomic_dir(dir, |temp| {
        candle_core::safetensors::save(&tensors, temp.join(ADAPTER_FILE))
            .map_err(std::io::Error::other)?;
        std::fs::write(temp.join(CONFIG_FILE), serde_json::to_vec_pretty(&config)?)?;
        if let Some((step, moments)) = optimizer {
            let mut state = HashMap::new();
            for (name, (m, v)) in moments {
                let f32 = |t: &Tensor| t.to_dtype(DType::F32).map_err(std::io::Error::other);
                state.insert(format!("{name}.exp_avg"), f32(m)?);
                state.insert(format!("{name}.exp_avg_sq"), f32(v)?);
            }
            candle_core::safetensors::save(&state, temp.join(OPTIMIZER_FILE))
                .map_err(std::io::Error::other)?;
            std::fs::write(
                temp.join(STATE_FILE),
                serde_json::to_vec_pretty(&json!({ "step": step }))?,
            )?;
        }
        seal(temp)
    })
    .map_err(io)
}

/// The adapter folder's `adapter_config.json`.
fn read_config(dir: &Path) -> Result<Value, CheckpointError> {
    let invalid = |message: String| CheckpointError::Invalid {
        path: dir.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE))
        .map_err(|e| invalid(format!("{CONFIG_FILE}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| invalid(format!("{CONFIG_FILE}: {e}")))
}

/// The base model an adapter folder was saved for, as its config names it.
pub fn base_model_of(dir: &Path) -> Result<String, CheckpointError> {
    let invalid = |message: String| CheckpointError::Invalid {
        path: dir.display().to_string(),
        message,
    };
    let config = read_config(dir)?;
    config["base_model_name_or_path"]
        .as_str()
        .map(String::from)
        .ok_or_else(|| invalid(format!("{CONFIG_FILE} names no base_model_name_or_path")))
}

/// The LoRA rank an adapter folder was saved with, as its config names it.
pub fn rank_of(dir: &Path) -> Result<usize, CheckpointError> {
    let config = read_config(dir)?;
    config["r"]
        .as_u64()
        .map(|rank| rank as usize)
        .ok_or_else(|| CheckpointError::Invalid {
            path: dir.display().to_string(),
            message: format!("{CONFIG_FILE} names no rank `r`"),
        })
}

/// A loaded checkpoint: the adapter, and its optimizer state when the checkpoint has one.
pub struct Loaded {
    pub adapter: Adapter,
    pub optimizer: Option<(u64, Moments)>,
}

/// Load the checkpoint in `dir` for a base model of `model`'s shapes; a checkpoint that is
/// damaged or made for another base model is refused, naming what is wrong.
pub fn load(dir: &Path, model: &ModelConfig, dtype: DType) -> Result<Loaded, CheckpointError> {
    let invalid = |message: String| CheckpointError::Invalid {
        path: dir.display().to_string(),
        message,
    };
    let config = read_config(dir)?;
    if config["peft_type"] != "LORA" {
        return Err(invalid(format!(
            "peft_type {} is not LORA",
            config["peft_type"]
        )));
    }
    for unsupported in ["use_dora", "use_qalora"] {
        if config[unsupported] == true {
            return Err(invalid(format!(
                "`{unsupported}` adapters are not supported"
            )));
        }
    }
    let rank = config["r"]
        .as_u64()
        .filter(|r| *r > 0)
        .ok_or_else(|| invalid("`r` is missing".into()))? as usize;
    let alpha = config["lora_alpha"]
        .as_f64()
        .ok_or_else(|| invalid("`lora_alpha` is missing".into()))?;
    let modules: Vec<String> = match &config["target_modules"] {
        Value::Array(items) => items
            .iter()
            .filter_map(|m| m.as_str().map(String::from))
            .collect(),
        other => {
            return Err(invalid(format!(
                "`target_modules` {other} is not a list of module names"
            )));
        }
    };
    let mut targets = Vec::new();
    let mut train_unembed = false;
    for module in &modules {
        match (module.as_str(), target_from_module(module)) {
            ("lm_head", _) => train_unembed = true,
            (_, Some(target)) => targets.push(target),
            (other, None) => {
                return Err(invalid(format!("target module {other:?} is not supported")));
            }
        }
    }
    let lora = LoraConfig {
        rank,
        alpha,
        rslora: config["use_rslora"] == true,
        train_attention: Target::ATTENTION.iter().all(|t| targets.contains(t)),
        train_mlp: Target::MLP.iter().all(|t| targets.contains(t)),
        train_unembed,
        seed: 0,
    };
    let partial = targets.iter().any(|t| {
        let group_trained = if Target::ATTENTION.contains(t) {
            lora.train_attention
        } else {
            lora.train_mlp
        };
        !group_trained
    });
    if partial {
        return Err(invalid(format!(
            "target modules {modules:?}: only all attention and/or all MLP projections are supported"
        )));
    }
    let tensors = candle_core::safetensors::load(dir.join(ADAPTER_FILE), &Device::Cpu)
        .map_err(|e| invalid(format!("{ADAPTER_FILE}: {e}")))?;
    let mut expected: Vec<(Site, (usize, usize))> = (0..model.num_layers)
        .flat_map(|i| {
            lora.targets()
                .into_iter()
                .map(move |t| (Site::Layer(i, t), t))
        })
        .map(|(site, t)| (site, t.shape(model)))
        .collect();
    if train_unembed {
        expected.push((Site::Unembed, (model.vocab_size, model.hidden_size)));
    }
    let mut sites = BTreeMap::new();
    let mut used = 0;
    for (site, (out, inp)) in expected {
        let prefix = site.peft_prefix();
        let fetch = |suffix: &str, shape: [usize; 2]| -> Result<Var, CheckpointError> {
            let name = format!("{prefix}.{suffix}");
            let tensor = tensors
                .get(&name)
                .ok_or_else(|| invalid(format!("no tensor `{name}`")))?;
            if tensor.dims() != shape {
                return Err(invalid(format!(
                    "tensor `{name}` has shape {:?}, the base model needs {shape:?} (a checkpoint of another base model?)",
                    tensor.dims()
                )));
            }
            Ok(Var::from_tensor(&tensor.to_dtype(dtype)?)?)
        };
        let pair = LowRank {
            a: fetch("lora_A.weight", [rank, inp])?,
            b: fetch("lora_B.weight", [out, rank])?,
        };
        used += 2;
        sites.insert(site, pair);
    }
    if used != tensors.len() {
        let extra: Vec<&String> = tensors
            .keys()
            .filter(|name| {
                !sites
                    .keys()
                    .any(|s| name.starts_with(&format!("{}.", s.peft_prefix())))
            })
            .take(3)
            .collect();
        return Err(invalid(format!("unexpected tensors, such as {extra:?}")));
    }
    let adapter = Adapter {
        config: lora,
        sites,
    };
    let optimizer = load_optimizer(dir, &adapter, dtype).map_err(invalid)?;
    Ok(Loaded { adapter, optimizer })
}

fn load_optimizer(
    dir: &Path,
    adapter: &Adapter,
    dtype: DType,
) -> Result<Option<(u64, Moments)>, String> {
    let state_path = dir.join(STATE_FILE);
    if !state_path.is_file() {
        return Ok(None);
    }
    let state: Value = std::fs::read_to_string(&state_path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        .map_err(|e| format!("{STATE_FILE}: {e}"))?;
    let step = state["step"]
        .as_u64()
        .ok_or_else(|| format!("{STATE_FILE}: no `step`"))?;
    let tensors = candle_core::safetensors::load(dir.join(OPTIMIZER_FILE), &Device::Cpu)
        .map_err(|e| format!("{OPTIMIZER_FILE}: {e}"))?;
    let mut moments = BTreeMap::new();
    for (name, var) in adapter.named_tensors() {
        let get = |suffix: &str| -> Result<Tensor, String> {
            let key = format!("{name}.{suffix}");
            let t = tensors
                .get(&key)
                .ok_or_else(|| format!("{OPTIMIZER_FILE}: no tensor `{key}`"))?;
            if t.dims() != var.as_tensor().dims() {
                return Err(format!(
                    "{OPTIMIZER_FILE}: `{key}` has shape {:?}, not {:?}",
                    t.dims(),
                    var.as_tensor().dims()
                ));
            }
            t.to_dtype(dtype).map_err(|e| e.to_string())
        };
        moments.insert(name.clone(), (get("exp_avg")?, get("exp_avg_sq")?));
    }
    Ok(Some((step, moments)))
}
