//! Objectives written as plugins, run by the engine inside its pass: [`PluginObjective`] makes a
//! loaded objective component an [`ExternalObjective`]. The engine calls it on the trainer's
//! thread, which is not an async worker, so the plugin's call is driven to its end there on the
//! service's runtime; the call is bounded by the plugin's limits like any other, and its answer
//! checked before the engine uses it.
//!
//! [`ObjectivePlugins`] keeps one owner's objective plugins under the names its
//! `forward` / `forward_backward` calls give as `loss_fn`: `sha256:HEX`, the plugin's digest.

use std::collections::HashMap;

use tokio::runtime::Handle;

use crate::api::{ApiError, ForwardBackwardInput, LossInput};
use crate::plugin::{Limits, ObjectiveDatum, ObjectiveTensor, Plugin, PluginKind};
use crate::train::{
    ExternalObjective, Loss, Objective, ObjectiveError, ObjectiveInput, ObjectiveLoss,
};

/// Whether a call's `loss_fn` names an objective plugin (by digest) rather than a built-in loss.
pub fn names_a_plugin(loss_fn: &str) -> bool {
    loss_fn.starts_with("sha256:")
}

/// The objective plugins one owner (a tenant, a client) has taken as losses, by the name its
/// calls give them.
#[derive(Default)]
pub struct ObjectivePlugins {
    by_name: HashMap<String, (Plugin, Limits)>,
}

impl ObjectivePlugins {
    /// Keep `plugin`, run under `limits`, and answer the name calls give it (`sha256:HEX`).
    /// A plugin that does not export the objective interface is refused.
    pub fn keep(&mut self, plugin: &Plugin, limits: &Limits) -> Result<String, ApiError> {
        let name = format!("sha256:{}", plugin.digest());
        if !plugin.description().kinds.contains(&PluginKind::Objective) {
            return Err(ApiError::invalid(format!(
                "plugin {name} is not an objective (it exports no objective interface)"
            )));
        }
        self.by_name
            .insert(name.clone(), (plugin.clone(), limits.clone()));
        Ok(name)
    }

    /// The plugin kept under `name`.
    pub fn get(&self, name: &str) -> Option<&Plugin> {
        self.by_name.get(name).map(|(plugin, _)| plugin)
    }

    /// The loss of a call whose `loss_fn` names a kept plugin: the plugin under the call's
    /// `loss_fn_config` (as a JSON object), driven on the calling runtime; `None` for any other
    /// name.
    pub fn loss(&self, input: &ForwardBackwardInput) -> Option<Result<Loss, ApiError>> {
        let (plugin, limits) = self.by_name.get(&input.loss_fn)?;
        let runtime = match Handle::try_current() {
            Ok(runtime) => runtime,
            Err(e) => {
                let message = format!("no runtime to run objective {} on: {e}", input.loss_fn);
                return Some(Err(ApiError::internal(message)));
            }
        };
        Some(Ok(Loss::Objective(Objective::new(PluginObjective::new(
            plugin.clone(),
            input.loss_fn.clone(),
            objective_config(input),
            limits.clone(),
            runtime,
        )))))
    }
}

/// A call's `loss_fn_config` as the JSON object an objective plugin's config is.
pub fn objective_config(input: &ForwardBackwardInput) -> String {
    serde_json::Value::from(
        input
            .loss_fn_config
            .iter()
            .map(|(key, value)| (key.clone(), serde_json::Value::from(*value)))
            .collect::<serde_json::Map<_, _>>(),
    )
    .to_string()
}

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
    let mut inputs = vec![vector(LossInput::Mask.name(), datum.mask)];
    let named = [
        (LossInput::Weights, datum.weights),
        (LossInput::Advantages, datum.advantages),
        (LossInput::Logprobs, datum.sampler_logprobs),
    ];
    for (input, values) in named {
        if let Some(values) = values {
            inputs.push(vector(input.name(), values));
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
