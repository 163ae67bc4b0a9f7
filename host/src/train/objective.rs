//! Objectives the engine does not compute itself (a loss written as a plugin): per datum, the
//! objective gets the policy's logprobs as numbers and answers the loss and its gradient by
//! them; the engine then back-propagates through the model as if the loss had been
//! `Σ_t g_t · logp_t` with `g` held fixed, whose value it replaces by the objective's. So the
//! objective runs inside the same fused pass as the built-in losses, with no extra forward pass.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::loss_graph::InputTensor;

/// What an objective sees of one datum: its logprobs (cut to its target tokens) and the inputs
/// the engine holds for it.
#[derive(Clone, Copy, Debug)]
pub struct ObjectiveInput<'a> {
    /// The policy's logprob of each target token.
    pub logprobs: &'a [f32],
    /// 1 where a target token counts.
    pub mask: &'a [f32],
    pub weights: Option<&'a [f32]>,
    pub advantages: Option<&'a [f32]>,
    /// The sampler's logprobs.
    pub sampler_logprobs: Option<&'a [f32]>,
    /// The datum's other `loss_fn_inputs`, by name.
    pub inputs: &'a BTreeMap<String, InputTensor>,
}

/// An objective's answer for one datum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectiveLoss {
    pub value: f64,
    /// The loss's derivative by each of the datum's logprobs.
    pub gradient: Vec<f32>,
    /// Added over datums into the call's metrics (`:mean` ones averaged by the answer).
    pub metrics: BTreeMap<String, f64>,
}

/// Why an objective gave no answer: its own error, kept as the source (the service reads the
/// plugin's error kind from it).
#[derive(Debug, thiserror::Error)]
#[error("objective {objective}: {source}")]
pub struct ObjectiveError {
    pub objective: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// A loss computed outside the engine's graph. Called on the trainer's thread during a pass,
/// once per work item (with that item's datums of the pass), so it may block.
pub trait ExternalObjective: Send + Sync {
    /// Its name, for errors and logs.
    fn name(&self) -> &str;

    /// Per datum, in order, its loss and gradient.
    fn losses(&self, datums: &[ObjectiveInput<'_>]) -> Result<Vec<ObjectiveLoss>, ObjectiveError>;
}

/// A shared handle to an [`ExternalObjective`], as a [`Loss`](super::Loss) holds it: equal when
/// it is the same objective.
#[derive(Clone)]
pub struct Objective(pub Arc<dyn ExternalObjective>);

impl Objective {
    pub fn new(objective: impl ExternalObjective + 'static) -> Self {
        Objective(Arc::new(objective))
    }

    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The losses of `datums`, checked: one per datum, each gradient as long as its logprobs,
    /// every number finite. A plugin's host checks this too; the engine does not trust it.
    pub fn losses(
        &self,
        datums: &[ObjectiveInput<'_>],
    ) -> Result<Vec<ObjectiveLoss>, ObjectiveError> {
        let losses = self.0.losses(datums)?;
        check(&losses, datums).map_err(|problem| ObjectiveError {
            objective: self.name().to_string(),
            source: Box::new(problem),
        })?;
        Ok(losses)
    }
}

impl fmt::Debug for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Objective").field(&self.name()).finish()
    }
}

impl PartialEq for Objective {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// An answer the engine will not use: the objective's error, as its source.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum AnswerError {
    #[error("{answered} losses for {datums} datums")]
    Count { answered: usize, datums: usize },
    #[error("datum {datum}: a gradient of {answered} values for {logprobs} logprobs")]
    GradientLength {
        datum: usize,
        answered: usize,
        logprobs: usize,
    },
    #[error("datum {datum}: a number that is not finite")]
    NotFinite { datum: usize },
}

fn check(losses: &[ObjectiveLoss], datums: &[ObjectiveInput<'_>]) -> Result<(), AnswerError> {
    if losses.len() != datums.len() {
        return Err(AnswerError::Count {
            answered: losses.len(),
            datums: datums.len(),
        });
    }
    for (datum, (loss, input)) in losses.iter().zip(datums).enumerate() {
        if loss.gradient.len() != input.logprobs.len() {
            return Err(AnswerError::GradientLength {
                datum,
                answered: loss.gradient.len(),
                logprobs: input.logprobs.len(),
            });
        }
        let finite = loss.value.is_finite()
            && loss.gradient.iter().all(|g| g.is_finite())
            && loss.metrics.values().all(|m| m.is_finite());
        if !finite {
            return Err(AnswerError::NotFinite { datum });
        }
    }
    Ok(())
}
