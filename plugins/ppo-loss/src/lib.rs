//! PPO's clipped surrogate as an objective plugin: per counted token, with the ratio
//! `r = exp(logp - logp_sampler)`, the loss `-min(r·A, clip(r, low, high)·A)`, whose derivative
//! by `logp` is `-r·A` where the unclipped term is the smaller and 0 where the clip holds it. The
//! same loss as the engine's `ppo`, so that the two can be compared.

use opentinker_sdk::{DatumLoss, Metric, Objective, ObjectiveDatum, PluginError};
use serde::Deserialize;

/// The clip range, with the engine's names and defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_low")]
    clip_low_threshold: f64,
    #[serde(default = "default_high")]
    clip_high_threshold: f64,
}

fn default_low() -> f64 {
    0.8
}

fn default_high() -> f64 {
    1.2
}

pub struct Ppo;

impl Objective for Ppo {
    fn loss(config: &str, datum: &ObjectiveDatum) -> Result<DatumLoss, PluginError> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::new(format!("bad config: {e}")))?;
        let (low, high) = (
            config.clip_low_threshold as f32,
            config.clip_high_threshold as f32,
        );
        let mask = datum.require("mask")?;
        let advantages = datum.require("advantages")?;
        let sampler = datum.require("logprobs")?;
        let n = datum.logprobs.len();
        if [mask.len(), advantages.len(), sampler.len()] != [n; 3] {
            return Err(PluginError::new(format!(
                "mask, advantages and logprobs must have {n} values each"
            )));
        }
        let mut value = 0.0;
        let mut gradient = vec![0.0; n];
        let mut clipped_tokens = 0.0;
        for t in 0..n {
            let (m, a) = (mask[t], advantages[t]);
            let ratio = (datum.logprobs[t] - sampler[t]).exp();
            let unclipped = ratio * a;
            let clipped = ratio.clamp(low, high) * a;
            if unclipped <= clipped {
                value -= f64::from(m * unclipped);
                gradient[t] = -m * unclipped;
            } else {
                value -= f64::from(m * clipped);
                clipped_tokens += f64::from(m);
            }
        }
        Ok(DatumLoss {
            value,
            gradient,
            metrics: vec![Metric {
                name: "clipped_tokens:sum".into(),
                value: clipped_tokens,
            }],
        })
    }

    fn config_schema() -> Option<String> {
        Some(
            r#"{"type": "object", "additionalProperties": false,
                "properties": {"clip_low_threshold": {"type": "number", "minimum": 0},
                               "clip_high_threshold": {"type": "number", "minimum": 0}}}"#
                .into(),
        )
    }
}

opentinker_sdk::export_objective!(Ppo);

#[cfg(test)]
mod tests {
    use super::*;
    use opentinker_sdk::Tensor;

    fn datum(logprobs: Vec<f32>, sampler: Vec<f32>, advantages: Vec<f32>) -> ObjectiveDatum {
        let n = logprobs.len() as u32;
        let tensor = |name: &str, values: Vec<f32>| Tensor {
            name: name.into(),
            shape: vec![n],
            values,
        };
        ObjectiveDatum {
            inputs: vec![
                tensor("mask", vec![1.0; n as usize]),
                tensor("advantages", advantages),
                tensor("logprobs", sampler),
            ],
            logprobs,
        }
    }

    #[test]
    fn the_gradient_is_the_ratio_times_the_advantage_inside_the_clip_and_zero_outside() {
        // Ratios 1, e^0.5 (clipped for a positive advantage), e^-0.5 (clipped for a negative one).
        let d = datum(vec![-1.0, -0.5, -1.5], vec![-1.0; 3], vec![1.0, 1.0, -1.0]);
        let loss = Ppo::loss("{}", &d).unwrap();
        assert_eq!(loss.gradient, vec![-1.0, 0.0, 0.0]);
        let expected = -(1.0 + 1.2 - 0.8);
        assert!((loss.value - expected).abs() < 1e-6, "{}", loss.value);
        assert_eq!(loss.metrics[0].value, 2.0);
    }

    #[test]
    fn a_missing_input_or_a_bad_config_is_the_plugins_error() {
        let mut d = datum(vec![-1.0], vec![-1.0], vec![1.0]);
        assert!(Ppo::loss(r#"{"clip": 1}"#, &d).is_err());
        d.inputs.pop();
        let error = Ppo::loss("{}", &d).unwrap_err();
        assert!(error.message.contains("logprobs"), "{error}");
    }
}
