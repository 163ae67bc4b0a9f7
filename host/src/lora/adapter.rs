//! LoRA adapters: low-rank deltas `scale · B A` on the attention and MLP projections (and
//! optionally the unembedding) of a frozen base model. Many adapters of different ranks and
//! targets share one base model; each owns only its own `A` and `B`.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::model::{ModelConfig, Site, Target};

/// How an adapter is shaped, as the Tinker `lora_config` says it (and a job file's `[lora]`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    /// rsLoRA: scale by `alpha / sqrt(rank)` instead of `alpha / rank`.
    pub rslora: bool,
    pub train_attention: bool,
    pub train_mlp: bool,
    pub train_unembed: bool,
    pub seed: u64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 16,
            alpha: 32.0,
            rslora: false,
            train_attention: true,
            train_mlp: true,
            train_unembed: false,
            seed: 0,
        }
    }
}

impl LoraConfig {
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        if self.train_attention {
            targets.extend(Target::ATTENTION);
        }
        if self.train_mlp {
            targets.extend(Target::MLP);
        }
        targets
    }
}

/// Names in the PEFT adapter format.
impl Site {
    /// The PEFT name prefix of this site's `lora_A` / `lora_B`.
    pub fn peft_prefix(self) -> String {
        match self {
            Site::Layer(i, target) => {
                format!("base_model.model.model.layers.{i}.{}", target.module())
            }
            Site::Unembed => "base_model.model.lm_head".to_string(),
        }
    }
}

/// `A (rank, in)` and `B (out, rank)` of one site.
#[derive(Clone, Debug)]
pub struct LowRank {
    pub a: Var,
    pub b: Var,
}

/// One adapter: its config and its trainable tensors.
#[derive(Clone, Debug)]
pub struct Adapter {
    pub config: LoraConfig,
    pub sites: BTreeMap<Site, LowRank>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LoraError {
    #[error("LoRA rank must be at least 1")]
    ZeroRank,
    #[error("LoRA alpha must be a positive number, not {0}")]
    BadAlpha(f64),
    #[error("the adapter trains nothing: enable attention, MLP or unembedding")]
    NoTargets,
}

impl Adapter {
    /// A fresh adapter: `A` uniform in ±1/√in (PEFT's Kaiming-uniform bound), `B` zero, so it
    /// starts as the base model exactly.
    pub fn new(
        model: &ModelConfig,
        config: LoraConfig,
        dtype: DType,
    ) -> Result<Self, AdapterError> {
        if config.rank == 0 {
            return Err(LoraError::ZeroRank.into());
        }
        if !(config.alpha.is_finite() && config.alpha > 0.0) {
            return Err(LoraError::BadAlpha(config.alpha).into());
        }
        let mut sites: Vec<(Site, (usize, usize))> = (0..model.num_layers)
            .flat_map(|i| {
                config
                    .targets()
                    .into_iter()
                    .map(move |t| (Site::Layer(i, t), t))
            })
            .map(|(site, t)| (site, t.shape(model)))
            .collect();
        if config.train_unembed {
            sites.push((Site::Unembed, (model.vocab_size, model.hidden_size)));
        }
        if sites.is_empty() {
            return Err(LoraError::NoTargets.into());
        }
        let mut rng = StdRng::seed_from_u64(config.seed);
        let mut pairs = BTreeMap::new();
        for (site, (out, inp)) in sites {
            let bound = 1.0 / (inp as f64).sqrt();
            let a: Vec<f64> = (0..config.rank * inp)
                .map(|_| rng.random_range(-bound..bound))
                .collect();
            let a = Tensor::from_vec(a, (config.rank, inp), &Device::Cpu)?.to_dtype(dtype)?;
            let b = Tensor::zeros((out, config.rank), dtype, &Device::Cpu)?;
            pairs.insert(
                site,
                LowRank {
                    a: Var::from_tensor(&a)?,
                    b: Var::from_tensor(&b)?,
                },
            );
        }
        Ok(Adapter {
            config,
            sites: pairs,
        })
    }

    /// `scale · (x Aᵀ) Bᵀ` at `site`, or `None` when the adapter does not target it.
    pub fn delta(&self, site: Site, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let Some(pair) = self.sites.get(&site) else {
            return Ok(None);
        };
        let down = x.broadcast_matmul(&pair.a.as_tensor().t()?)?;
        let up = down.broadcast_matmul(&pair.b.as_tensor().t()?)?;
        Ok(Some((up * self.config.scale())?))
    }

    /// A copy that shares no storage with `self`: training `self` further leaves it unchanged.
    pub fn frozen_copy(&self) -> candle_core::Result<Adapter> {
        let copy = |v: &Var| Var::from_tensor(&v.as_tensor().detach());
        let sites = self
            .sites
            .iter()
            .map(|(site, pair)| {
                Ok((
                    *site,
                    LowRank {
                        a: copy(&pair.a)?,
                        b: copy(&pair.b)?,
                    },
                ))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Adapter {
            config: self.config.clone(),
            sites,
        })
    }

    /// Whether every site exists in `model` and has its shapes.
    pub fn check_fits(&self, model: &ModelConfig) -> Result<(), AdapterMismatch> {
        for (site, pair) in &self.sites {
            if let Site::Layer(layer, _) = site
                && *layer >= model.num_layers
            {
                return Err(AdapterMismatch::NoSuchLayer {
                    layer: *layer,
                    layers: model.num_layers,
                });
            }
            let (out, inp) = site.shape(model);
            let rank = self.config.rank;
            let (a, b) = (pair.a.as_tensor().dims(), pair.b.as_tensor().dims());
            if a != [rank, inp] || b != [out, rank] {
                return Err(AdapterMismatch::Shapes {
                    site: site.peft_prefix(),
                    a: a.to_vec(),
                    b: b.to_vec(),
                    needed: ([rank, inp], [out, rank]),
                });
            }
        }
        Ok(())
    }

    /// Every trainable tensor with its PEFT name.
    pub fn named_tensors(&self) -> Vec<(String, &Var)> {
        self.sites
            .iter()
            .flat_map(|(site, pair)| {
                let prefix = site.peft_prefix();
                [
                    (format!("{prefix}.lora_A.weight"), &pair.a),
                    (format!("{prefix}.lora_B.weight"), &pair.b),
                ]
            })
            .collect()
    }
}

/// Why an adapter cannot serve a base model.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum AdapterMismatch {
    #[error("it has layer {layer}; the base model has {layers} layers")]
    NoSuchLayer { layer: usize, layers: usize },
    #[error("{site} has A {a:?} and B {b:?}, the base model needs {:?} and {:?}", needed.0, needed.1)]
    Shapes {
        site: String,
        a: Vec<usize>,
        b: Vec<usize>,
        needed: ([usize; 2], [usize; 2]),
    },
    /// Its tensors could not be copied (candle's message).
    #[error("copying it: {0}")]
    Copy(String),
}

#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error(transparent)]
    Config(#[from] LoraError),
    #[error(transparent)]
    Mismatch(#[from] AdapterMismatch),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
