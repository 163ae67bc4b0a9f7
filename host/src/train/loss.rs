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
//! | `gspo` | `-min(s·A, clip(s, lo, hi)·A) / n` (lo, hi = 1 - 3e-4, 1 + 4e-4) |
//!
//! `gspo` (Group Sequence Policy Optimization, Zheng et al. 2025) clips one ratio per sequence,
//! `s = exp(mean(l - q))` over the sequence's `n` ratio tokens (its `sequence_ratio_mask`, or
//! else its counted tokens with an advantage), rather than each token's. In its token form the
//! gradient of a token is `s·A/n·∇l` (the sequence ratio is a constant), so a sequence whose
//! tokens share one advantage gets exactly the paper's sequence gradient; the defaults are the
//! paper's clip ranges.
//!
//! `stable_reinforce` is REINFORCE with a truncated importance weight (the weight never passes
//! `clip_high_threshold`, so a stale or numerically drifted sample cannot dominate a step) and
//! an optional penalty `kl_coeff` times the k3 estimate of KL(sampler ‖ learner). Its `q` is not
//! the client's copy: the server takes it from the sequences it recorded when sampling
//! (`record_stability_info`, resolved in `service`), which is what keeps it stable off-policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{D, Tensor};

use super::loss_graph::CompiledLoss;
use super::objective::Objective;
use crate::api::LossName;

/// A loss function and its settings.
#[derive(Clone, Debug, PartialEq)]
pub enum Loss {
    CrossEntropy,
    ImportanceSampling,
    Ppo {
        clip_low: f64,
        clip_high: f64,
    },
    Cispo {
        clip_low: f64,
        clip_high: f64,
    },
    Dro {
        beta: f64,
    },
    StableReinforce {
        clip_high: f64,
        kl_coeff: f64,
    },
    Gspo {
        clip_low: f64,
        clip_high: f64,
    },
    /// A loss the client sent as a graph (`create_custom_loss`), run on each datum's whole
    /// logprobs and summed over datums.
    Custom(Arc<CompiledLoss>),
    /// A loss computed outside the engine (a plugin), which answers each datum's gradient.
    Objective(Objective),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LossError {
    #[error("unknown loss function {0:?} (known: {names})", names = LossName::names())]
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
        let loss = LossName::from_name(name).ok_or_else(|| LossError::Unknown(name.into()))?;
        let known = loss.config_keys();
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
        Ok(match loss {
            LossName::CrossEntropy => Loss::CrossEntropy,
            LossName::ImportanceSampling => Loss::ImportanceSampling,
            LossName::Ppo => Loss::Ppo {
                clip_low: get("clip_low_threshold", 0.8),
                clip_high: get("clip_high_threshold", 1.2),
            },
            LossName::Cispo => Loss::Cispo {
                clip_low: get("clip_low_threshold", 0.0),
                clip_high: get("clip_high_threshold", 4.0),
            },
            LossName::Gspo => Loss::Gspo {
                clip_low: get("clip_low_threshold", 1.0 - 3e-4),
                clip_high: get("clip_high_threshold", 1.0 + 4e-4),
            },
            LossName::StableReinforce => {
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
            LossName::Dro => Loss::Dro {
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
    /// The tokens of each sequence whose ratios make its sequence ratio (`gspo`; see
    /// `ratio_tokens`).
    pub ratio_mask: Option<&'a Tensor>,
}

/// A sequence's ratio tokens for `gspo`: the ones its datum names (`sequence_ratio_mask`), or
/// else its counted tokens with an advantage (the sampled ones, in an RL datum).
pub fn ratio_tokens(named: Option<&[f32]>, mask: &[f32], advantages: Option<&[f32]>) -> Vec<f32> {
    match (named, advantages) {
        (Some(named), _) => named.to_vec(),
        (None, Some(advantages)) => mask
            .iter()
            .zip(advantages)
            .map(|(&m, &a)| if a != 0.0 { m } else { 0.0 })
            .collect(),
        (None, None) => mask.to_vec(),
    }
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
        Loss::Gspo {
            clip_low,
            clip_high,
        } => {
            let (q, a) = rl()?;
            let ratio_mask = inputs.ratio_mask.ok_or_else(|| {
                candle_core::Error::Msg("this loss needs each sequence's ratio tokens".into())
            })?;
            // Per sequence (the last dimension): its ratio tokens' count and mean log ratio.
            let count = ratio_mask.sum_keepdim(D::Minus1)?.maximum(1.0)?;
            let mean_log_ratio = ((l - q)? * ratio_mask)?
                .sum_keepdim(D::Minus1)?
                .broadcast_div(&count)?;
            let sequence_ratio = mean_log_ratio.exp()?.detach();
            // Worth `s` at every token, with the gradient `s·∇l` (GSPO's token form).
            let ratio = sequence_ratio.broadcast_mul(&(l - l.detach())?.exp()?)?;
            let unclipped = (&ratio * a)?;
            let clipped = (ratio.clamp(*clip_low, *clip_high)? * a)?;
            unclipped.minimum(&clipped)?.broadcast_div(&count)?
        }
        Loss::Custom(_) | Loss::Objective(_) => {
            return Err(candle_core::Error::Msg(
                "a custom loss or an objective runs per datum, not here".into(),
            ));
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
            // Wide enough that the fixture's sequence ratio is not clipped.
            Loss::from_config(
                "gspo",
                &config(&[("clip_low_threshold", 0.5), ("clip_high_threshold", 2.0)]),
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
                ratio_mask: Some(&ratio_mask(mask, a)),
            },
        )
        .unwrap()
    }

    fn ratio_mask(mask: &Tensor, a: &Tensor) -> Tensor {
        let (mask, a) = (mask.to_vec1::<f64>().unwrap(), a.to_vec1::<f64>().unwrap());
        let (mask, a): (Vec<f32>, Vec<f32>) = (
            mask.iter().map(|&x| x as f32).collect(),
            a.iter().map(|&x| x as f32).collect(),
        );
        let tokens = ratio_tokens(None, &mask, Some(&a));
        tensor(&tokens.iter().map(|&x| f64::from(x)).collect::<Vec<_>>())
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
                    Loss::Gspo { .. } => gspo_token_gradient(&l0, &q, &a, &mask, i),
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

    /// GSPO's sequence ratio is a constant in its token form: a token's gradient is
    /// `-s·A/n` (unclipped), `s` the exponential of the mean log ratio over the `n` counted
    /// tokens with an advantage.
    fn gspo_token_gradient(l: &[f64], q: &Tensor, a: &Tensor, mask: &Tensor, i: usize) -> f64 {
        let (q, a, m) = (
            q.to_vec1::<f64>().unwrap(),
            a.to_vec1::<f64>().unwrap(),
            mask.to_vec1::<f64>().unwrap(),
        );
        let counted: Vec<usize> = (0..l.len())
            .filter(|&t| m[t] > 0.0 && a[t] != 0.0)
            .collect();
        let n = counted.len() as f64;
        let s = (counted.iter().map(|&t| l[t] - q[t]).sum::<f64>() / n).exp();
        -s * a[i] / n * m[i]
    }

    /// GSPO clips the sequence, not the token: with a ratio outside the range every token of
    /// an advantage of the clipping sign has no gradient, whatever its own ratio.
    #[test]
    fn gspo_clips_the_sequence_ratio_as_one() {
        let gspo = Loss::from_config("gspo", &config(&[])).unwrap();
        // Token ratios e^0.5 and e^-0.5: the sequence ratio is 1, inside the range.
        let (q, a, m) = (
            tensor(&[-1.5, -0.5]),
            tensor(&[1.0, 1.0]),
            tensor(&[1.0, 1.0]),
        );
        let gradient = |l: &[f64]| {
            let var = Var::new(l, &Device::Cpu).unwrap();
            let inputs = LossInputs {
                logprobs: var.as_tensor(),
                mask: &m,
                weights: None,
                sampler_logprobs: Some(&q),
                advantages: Some(&a),
                ratio_mask: Some(&m),
            };
            let grads = loss(&gspo, &inputs).unwrap().backward().unwrap();
            grads
                .get(var.as_tensor())
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        assert_eq!(
            gradient(&[-1.0, -1.0]),
            vec![-0.5, -0.5],
            "s = 1: -A/n each"
        );
        // Both tokens up by 0.01: s = e^0.01 > 1 + 4e-4, clipped for a positive advantage.
        assert_eq!(gradient(&[-0.99, -0.99]), vec![0.0, 0.0]);
        // A ratio mask that names the first token only: s = e^0.5, clipped.
        let only_first = tensor(&[1.0, 0.0]);
        let var = Var::new(&[-1.0, -1.0], &Device::Cpu).unwrap();
        let value = loss(
            &gspo,
            &LossInputs {
                logprobs: var.as_tensor(),
                mask: &m,
                weights: None,
                sampler_logprobs: Some(&q),
                advantages: Some(&a),
                ratio_mask: Some(&only_first),
            },
        )
        .unwrap();
        // Clipped to 1 + 4e-4 at both tokens, over n = 1.
        let expected = -2.0 * (1.0 + 4e-4);
        assert!((value.to_scalar::<f64>().unwrap() - expected).abs() < 1e-9);
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
