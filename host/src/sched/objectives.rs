//! Objectives written as plugins, run by the engine inside its pass: [`PluginObjective`] makes a
//! loaded objective component an [`ExternalObjective`]. The engine calls it on the trainer's
//! thread, which is not an async worker, so the plugin's call is driven to its end there on the
//! service's runtime; the call is bounded by the plugin's limits like any other, and its answer
//! checked before the engine uses it.

use tokio::runtime::Handle;

use crate::plugin::{Limits, ObjectiveDatum, ObjectiveTensor, Plugin};
use crate::train::{ExternalObjective, ObjectiveError, ObjectiveInput, ObjectiveLoss};

/// A loaded objective plugin under one config and its limits.
pub struct PluginObjective {
    plugin: Plugin,
    name: String,
    config: String,
    limits: Limits,
    runtime: Handle,
}

impl PluginObjective {
    /// `plugin` (an objective) under `config`, its calls bounded by `limits` and driven on
    /// `runtime`; `name` names it in errors.
    pub fn new(
        plugin: Plugin,
        name: impl Into<String>,
        config: impl Into<String>,
        limits: Limits,
        runtime: Handle,
    ) -> Self {
        PluginObjective {
            plugin,
            name: name.into(),
            config: config.into(),
            limits,
            runtime,
        }
    }
}

impl ExternalObjective for PluginObjective {
    fn name(&self) -> &str {
        &self.name
    }

    fn losses(&self, datums: &[ObjectiveInput<'_>]) -> Result<Vec<ObjectiveLoss>, ObjectiveError> {
        let datums: Vec<ObjectiveDatum> = datums.iter().map(plugin_datum).collect();
        let call = self
            .plugin
            .objective_loss(&self.config, &datums, &self.limits);
        // On the trainer's thread there is no runtime to block; a caller on a runtime's worker
        // (a test driving the engine itself) lends the worker while the call runs.
        let answer = match Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(|| self.runtime.block_on(call)),
            Err(_) => self.runtime.block_on(call),
        };
        let losses = answer.map_err(|error| ObjectiveError {
            objective: self.name.clone(),
            source: Box::new(error),
        })?;
        Ok(losses
            .into_iter()
            .map(|loss| ObjectiveLoss {
                value: loss.value,
                gradient: loss.gradient,
                metrics: loss
                    .metrics
                    .into_iter()
                    .map(|m| (m.name, m.value))
                    .collect(),
            })
            .collect())
    }
}

/// A datum as the objective contract names its tensors: `mask`, `weights`, `advantages`, the
/// sampler's `logprobs`, then the datum's own inputs.
fn plugin_datum(datum: &ObjectiveInput<'_>) -> ObjectiveDatum {
    let vector = |name: &str, values: &[f32]| ObjectiveTensor {
        name: name.to_string(),
        shape: vec![u32::try_from(values.len()).unwrap_or(u32::MAX)],
        values: values.to_vec(),
    };
    let mut inputs = vec![vector("mask", datum.mask)];
    let named = [
        ("weights", datum.weights),
        ("advantages", datum.advantages),
        ("logprobs", datum.sampler_logprobs),
    ];
    for (name, values) in named {
        if let Some(values) = values {
            inputs.push(vector(name, values));
        }
    }
    for (name, tensor) in datum.inputs {
        inputs.push(ObjectiveTensor {
            name: name.clone(),
            shape: tensor
                .shape
                .iter()
                .map(|&d| u32::try_from(d).unwrap_or(u32::MAX))
                .collect(),
            values: tensor.values.clone(),
        });
    }
    ObjectiveDatum {
        logprobs: datum.logprobs.to_vec(),
        inputs,
    }
}
