//! The Tinker losses, per token and summed, with an explicit mask so that context and
//! observation tokens never contribute. `l` is the learner's logprob of each target token, `q`
//! the sampler's, `r = exp(l - q)`, `A` the advantage, `w` the SFT weight:
//!
//! | loss | per token |
//! |---|---|
//! | `cross_entropy` | `-w·l` |
//! | `importance_sampling` | `-r·A` |
//! | `ppo` | `-min(r·A, clip(r, lo, hi)·A)` (lo, hi = 0.8, 1.2) |
//! | `cispo` | `-stopgrad(clip(r, lo, hi))·l·A` (lo, hi = 0.0, 4.0) |
//! | `dro` | `-(l·A - β/2·(l - q)²)` (β required) |
//! | `stable_reinforce` | `-(stopgrad(min(r, c))·l·A - κ·(r - 1 - log r))` (c = 2.0, κ = 0.0) |
//!
//! `stable_reinforce` is REINFORCE with a truncated importance weight (the weight never passes
//! `clip_high_threshold`, so a stale or numerically drifted sample cannot dominate a step) and
//! an optional penalty `kl_coeff` times the k3 estimate of KL(sampler ‖ learner). Its `q` is not
//! the client's copy: the server takes it from the sequences it recorded when sampling
//! (`record_stability_info`, resolved in `sched`), which is what keeps it stable off-policy.

use std::collections::BTreeMap;

use candle_core::Tensor;

/// A loss function and its settings.
#[derive(Clone, Debug, PartialEq)]
pub enum Loss {
    CrossEntropy,
    ImportanceSampling,
    Ppo { clip_low: f64, clip_high: f64 },
    Cispo { clip_low: f64, clip_high: f64 },
    Dro { beta: f64 },
    StableReinforce { clip_high: f64, kl_coeff: f64 },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LossError {
    #[error(
        "unknown loss function {0:?} (known: cross_entropy, importance_sampling, ppo, cispo, dro, stable_reinforce)"
    )]
    Unknown(String),
    #[error("loss {loss}: unknown config key {key:?} (known: {known})")]
    UnknownKey {
        loss: String,
        key: String,
        known: String,
    },
    #[error("loss {loss}: config key {key:?} is required")]
    MissingKey { loss: String, key: &'static str },
    #[error("loss {loss}: config key {key:?} = {value} is not a finite number")]
    NotFinite {
        loss: String,
        key: String,
        value: f64,
    },
    #[error("loss {loss}: config key {key:?} = {value} must be {rule}")]
    OutOfRange {
        loss: String,
        key: &'static str,
        value: f64,
        rule: &'static str,
    },
}

impl Loss {
    /// The loss named `name` with the Tinker `loss_fn_config` map; unknown names and keys are
    /// refused by name.
    pub fn from_config(name: &str, config: &BTreeMap<String, f64>) -> Result<Self, LossError> {
        let known: &[&str] = match name {
            "cross_entropy" | "importance_sampling" => &[],
            "ppo" | "cispo" => &["clip_low_threshold", "clip_high_threshold"],
            "dro" => &["beta"],
            "stable_reinforce" => &["clip_high_threshold", "kl_coeff"],
            other => return Err(LossError::Unknown(other.to_string())),
        };
        for (key, value) in config {
            if !known.contains(&key.as_str()) {
                return Err(LossError::UnknownKey {
                    loss: name.into(),
                    key: key.clone(),
                    known: if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    },
                });
            }
            if !value.is_finite() {
                return Err(LossError::NotFinite {
                    loss: name.into(),
                    key: key.clone(),
                    value: *value,
                });
            }
        }
        let get = |key: &str, default: f64| config.get(key).copied().unwrap_or(default);
        Ok(match name {
            "cross_entropy" => Loss::CrossEntropy,
            "importance_sampling" => Loss::ImportanceSampling,
            "ppo" => Loss::Ppo {
                clip_low: get("clip_low_threshold", 0.8),
                clip_high: get("clip_high_threshold", 1.2),
            },
            "cispo" => Loss::Cispo {
                clip_low: get("clip_low_threshold", 0.0),
                clip_high: get("clip_high_threshold", 4.0),
            },
            "stable_reinforce" => {
                let (clip_high, kl_coeff) = (get("clip_high_threshold", 2.0), get("kl_coeff", 0.0));
                let out_of_range = |key, value, rule| LossError::OutOfRange {
                    loss: name.into(),
                    key,
                    value,
                    rule,
                };
                if clip_high <= 0.0 {
                    return Err(out_of_range("clip_high_threshold", clip_high, "above 0"));
                }
                if kl_coeff < 0.0 {
                    return Err(out_of_range("kl_coeff", kl_coeff, "0 or more"));
                }
                Loss::StableReinforce {
                    clip_high,
                    kl_coeff,
                }
            }
            _ => Loss::Dro {
                beta: *config.get("beta").ok_or(LossError::MissingKey {
                    loss: name.into(),
                    key: "beta",
                })?,
            },
        })
    }
}

/// The per-token inputs of a loss, all of the same shape as the learner logprobs.
pub struct LossInputs<'a> {
    /// The learner's logprob of each target token (the tensor gradients flow through).
    pub logprobs: &'a Tensor,
    /// 1 where a token counts, 0 for context and observations.
    pub mask: &'a Tensor,
    /// SFT weights (cross_entropy).
    pub weights: Option<&'a Tensor>,
    /// The sampler's logprobs (RL losses).
    pub sampler_logprobs: Option<&'a Tensor>,
    /// Advantages (RL losses).
    pub advantages: Option<&'a Tensor>,
}

/// The summed, masked loss: a scalar tensor.
pub fn loss(kind: &Loss, inputs: &LossInputs<'_>) -> candle_core::Result<Tensor> {
    let l = inputs.logprobs;
    // The sampler logprobs and advantages that the RL losses need.
    let rl = || -> candle_core::Result<(&Tensor, &Tensor)> {
        let missing = |what: &str| candle_core::Error::Msg(format!("this loss needs {what}"));
        Ok((
            inputs
                .sampler_logprobs
                .ok_or_else(|| missing("sampler logprobs"))?,
            inputs.advantages.ok_or_else(|| missing("advantages"))?,
        ))
    };
    let per_token = match kind {
        Loss::CrossEntropy => match inputs.weights {
            Some(w) => (w * l)?,
            None => l.clone(),
        },
        Loss::ImportanceSampling => {
            let (q, a) = rl()?;
            ((l - q)?.exp()? * a)?
        }
        Loss::Ppo {
            clip_low,
            clip_high,
        } => {
            let (q, a) = rl()?;
            let ratio = (l - q)?.exp()?;
            let unclipped = (&ratio * a)?;
            let clipped = (ratio.clamp(*clip_low, *clip_high)? * a)?;
            unclipped.minimum(&clipped)?
        }
        Loss::Cispo {
            clip_low,
            clip_high,
        } => {
            let (q, a) = rl()?;
            let ratio = (l - q)?.exp()?.clamp(*clip_low, *clip_high)?.detach();
            ((ratio * l)? * a)?
        }
        Loss::Dro { beta } => {
            let (q, a) = rl()?;
            let penalty = ((l - q)?.sqr()? * (beta / 2.0))?;
            ((l * a)? - penalty)?
        }
        Loss::StableReinforce {
            clip_high,
            kl_coeff,
        } => {
            let (q, a) = rl()?;
            let log_ratio = (l - q)?;
            let ratio = log_ratio.exp()?;
            let weight = ratio.clamp(0.0, *clip_high)?.detach();
            let reinforce = ((weight * l)? * a)?;
            let k3 = ((&ratio - 1.0)? - &log_ratio)?;
            (reinforce - (k3 * *kl_coeff)?)?
        }
    };
    (per_token * inputs.mask)?.sum_all()?.neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn config(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn all_losses() -> Vec<Loss> {
        vec![
            Loss::from_config("cross_entropy", &config(&[])).unwrap(),
            Loss::from_config("importance_sampling", &config(&[])).unwrap(),
            Loss::from_config("ppo", &config(&[])).unwrap(),
            Loss::from_config("cispo", &config(&[("clip_high_threshold", 1.5)])).unwrap(),
            Loss::from_config("dro", &config(&[("beta", 0.3)])).unwrap(),
            Loss::from_config(
                "stable_reinforce",
                &config(&[("clip_high_threshold", 1.5), ("kl_coeff", 0.2)]),
            )
            .unwrap(),
        ]
    }

    fn tensor(values: &[f64]) -> Tensor {
        Tensor::new(values, &Device::Cpu).unwrap()
    }

    /// Inputs where some ratios fall inside and some outside the clip ranges, and one token is
    /// masked out.
    fn fixture() -> (Vec<f64>, Tensor, Tensor, Tensor, Tensor) {
        let l = vec![-0.2, -1.5, -0.7, -2.2, -0.05, -3.0];
        let q = tensor(&[-0.25, -1.0, -1.2, -2.2, -0.6, -2.0]);
        let a = tensor(&[1.0, -0.5, 2.0, 0.7, -1.3, 0.4]);
        let w = tensor(&[1.0, 0.5, 1.0, 2.0, 1.0, 1.0]);
        let mask = tensor(&[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        (l, q, a, w, mask)
    }

    fn value_of(
        kind: &Loss,
        l: &Tensor,
        q: &Tensor,
        a: &Tensor,
        w: &Tensor,
        mask: &Tensor,
    ) -> Tensor {
        loss(
            kind,
            &LossInputs {
                logprobs: l,
                mask,
                weights: Some(w),
                sampler_logprobs: Some(q),
                advantages: Some(a),
            },
        )
        .unwrap()
    }

    /// The gradient of every loss against central finite differences, in f64.
    #[test]
    fn gradients_match_finite_differences() {
        let (l0, q, a, w, mask) = fixture();
        for kind in all_losses() {
            let var = Var::new(l0.as_slice(), &Device::Cpu).unwrap();
            let total = value_of(&kind, var.as_tensor(), &q, &a, &w, &mask);
            let grads = total.backward().unwrap();
            let analytic = grads
                .get(var.as_tensor())
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            for i in 0..l0.len() {
                let at = |delta: f64| {
                    let mut l = l0.clone();
                    l[i] += delta;
                    value_of(&kind, &tensor(&l), &q, &a, &w, &mask)
                        .to_scalar::<f64>()
                        .unwrap()
                };
                let eps = 1e-6;
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                let expected = match kind {
                    Loss::Cispo { .. } => cispo_surrogate_gradient(&l0, &q, &a, &mask, i),
                    Loss::StableReinforce {
                        clip_high,
                        kl_coeff,
                    } => stable_reinforce_gradient(&l0, &q, &a, &mask, i, clip_high, kl_coeff),
                    _ => numeric,
                };
                assert!(
                    (analytic[i] - expected).abs() <= 1e-6 * (1.0 + expected.abs()),
                    "{kind:?} token {i}: analytic {} vs expected {expected}",
                    analytic[i]
                );
            }
            assert_eq!(
                analytic[5], 0.0,
                "{kind:?}: the masked token has a gradient"
            );
        }
    }

    /// StableReinforce's weight is a constant (stop-gradient) and its penalty's derivative is
    /// `κ·(r - 1)`: its gradient is `-min(r, c)·A + κ·(r - 1)` on a counted token.
    fn stable_reinforce_gradient(
        l: &[f64],
        q: &Tensor,
        a: &Tensor,
        mask: &Tensor,
        i: usize,
        clip_high: f64,
        kl_coeff: f64,
    ) -> f64 {
        let (q, a, m) = (
            q.to_vec1::<f64>().unwrap(),
            a.to_vec1::<f64>().unwrap(),
            mask.to_vec1::<f64>().unwrap(),
        );
        let ratio = (l[i] - q[i]).exp();
        (-ratio.min(clip_high) * a[i] + kl_coeff * (ratio - 1.0)) * m[i]
    }

    /// CISPO's ratio is a constant (stop-gradient), so its gradient is -clip(r)·A, not the
    /// derivative of its value.
    fn cispo_surrogate_gradient(l: &[f64], q: &Tensor, a: &Tensor, mask: &Tensor, i: usize) -> f64 {
        let (q, a, m) = (
            q.to_vec1::<f64>().unwrap(),
            a.to_vec1::<f64>().unwrap(),
            mask.to_vec1::<f64>().unwrap(),
        );
        let ratio = (l[i] - q[i]).exp().clamp(0.0, 1.5);
        -ratio * a[i] * m[i]
    }

    #[test]
    fn values_follow_the_spec() {
        let (l0, q, a, w, mask) = fixture();
        let l = tensor(&l0);
        let ce = value_of(&Loss::CrossEntropy, &l, &q, &a, &w, &mask)
            .to_scalar::<f64>()
            .unwrap();
        let expected: f64 = -(1.0 * -0.2 + 0.5 * -1.5 + 1.0 * -0.7 + 2.0 * -2.2 + 1.0 * -0.05);
        assert!((ce - expected).abs() < 1e-12);
        let ppo = Loss::from_config("ppo", &config(&[])).unwrap();
        let one = value_of(
            &ppo,
            &tensor(&[-1.0]),
            &tensor(&[-1.5]),
            &tensor(&[2.0]),
            &tensor(&[1.0]),
            &tensor(&[1.0]),
        );
        // r = e^0.5 = 1.65 is clipped to 1.2 for a positive advantage: -min(3.30, 2.4) = -2.4.
        assert!((one.to_scalar::<f64>().unwrap() + 2.4).abs() < 1e-12);
    }

    #[test]
    fn configs_are_checked_by_name() {
        let err = Loss::from_config("ppo", &config(&[("clip_low", 0.1)])).unwrap_err();
        assert!(err.to_string().contains("\"clip_low\""), "{err}");
        let err = Loss::from_config("dro", &config(&[])).unwrap_err();
        assert!(err.to_string().contains("beta"), "{err}");
        let err = Loss::from_config("reinforce", &config(&[])).unwrap_err();
        assert!(err.to_string().contains("reinforce"), "{err}");
        let err = Loss::from_config("stable_reinforce", &config(&[("kl_coef", 0.1)])).unwrap_err();
        assert!(err.to_string().contains("\"kl_coef\"") && err.to_string().contains("kl_coeff"));
        let err = Loss::from_config("stable_reinforce", &config(&[("kl_coeff", -1.0)]));
        assert!(
            matches!(
                err,
                Err(LossError::OutOfRange {
                    key: "kl_coeff",
                    ..
                })
            ),
            "{err:?}"
        );
        assert_eq!(
            Loss::from_config("stable_reinforce", &config(&[])).unwrap(),
            Loss::StableReinforce {
                clip_high: 2.0,
                kl_coeff: 0.0
            }
        );
        let nan = Loss::from_config("dro", &config(&[("beta", f64::NAN)])).unwrap_err();
        assert!(matches!(nan, LossError::NotFinite { .. }));
        assert_eq!(
            Loss::from_config("cispo", &config(&[])).unwrap(),
            Loss::Cispo {
                clip_low: 0.0,
                clip_high: 4.0
            }
        );
    }
}
