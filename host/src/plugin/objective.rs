//! Calls of objective and advantage plugins: each call in a fresh instance, each answer checked
//! (its shape against the question, every number finite) before the engine or the RL loop sees
//! it, so a wrong answer is that call's typed error and never a poisoned adapter.

use super::error::{CallError, ErrorKind};
use super::inspect::PluginKind;
use super::limits::Limits;
use super::loader::Plugin;
use super::sandbox::guarded_call;
use super::types::{DatumLoss, ObjectiveDatum, OutputSize};

impl Plugin {
    /// The loss of each of `datums` and its gradient with respect to the datum's logprobs, under
    /// the objective's `config`.
    pub async fn objective_loss(
        &self,
        config: &str,
        datums: &[ObjectiveDatum],
        limits: &Limits,
    ) -> Result<Vec<DatumLoss>, CallError> {
        let indices = self
            .0
            .objective
            .as_ref()
            .ok_or_else(|| not_a(PluginKind::Objective))?;
        let mut sandbox = self.0.sandbox(limits, 0).await?;
        let instance = sandbox.instance;
        let input = config.len() + datums.iter().map(datum_bytes).sum::<usize>();
        let losses = guarded_call!(&mut sandbox, input, |store| indices
            .loss(store, &instance, config, datums))?
        .map_err(|e| sandbox.fail(CallError::new(ErrorKind::PluginError, e.message)))?;
        sandbox.check_output(losses_size(&losses))?;
        check_losses(&losses, datums)
            .map_err(|problem| sandbox.fail(CallError::new(ErrorKind::InvalidOutput, problem)))?;
        Ok(losses)
    }

    /// Per episode of a group (given as each episode's turn rewards), the advantage of each of
    /// its turns, under the estimator's `config`.
    pub async fn advantages(
        &self,
        config: &str,
        group: &[Vec<f64>],
        limits: &Limits,
    ) -> Result<Vec<Vec<f64>>, CallError> {
        let indices = self
            .0
            .advantage
            .as_ref()
            .ok_or_else(|| not_a(PluginKind::Advantage))?;
        let mut sandbox = self.0.sandbox(limits, 0).await?;
        let instance = sandbox.instance;
        let input = config.len() + group.iter().map(|e| 8 * e.len()).sum::<usize>();
        let advantages = guarded_call!(&mut sandbox, input, |store| indices
            .advantages(store, &instance, config, group))?
        .map_err(|e| sandbox.fail(CallError::new(ErrorKind::PluginError, e.message)))?;
        sandbox.check_output(OutputSize {
            bytes: advantages.iter().map(|a| 8 * a.len()).sum(),
            items: advantages.len(),
        })?;
        check_advantages(&advantages, group)
            .map_err(|problem| sandbox.fail(CallError::new(ErrorKind::InvalidOutput, problem)))?;
        Ok(advantages)
    }
}

fn not_a(kind: PluginKind) -> CallError {
    CallError::new(
        ErrorKind::InvalidRequest,
        format!("the plugin is not {}", kind.with_article()),
    )
}

/// What a datum passes in, counted as the input limit counts strings: 4 bytes a number.
fn datum_bytes(datum: &ObjectiveDatum) -> usize {
    4 * datum.logprobs.len()
        + datum
            .inputs
            .iter()
            .map(|t| t.name.len() + 4 * (t.shape.len() + t.values.len()))
            .sum::<usize>()
}

/// What the losses return: their numbers as bytes, each datum's loss and metric an item.
fn losses_size(losses: &[DatumLoss]) -> OutputSize {
    OutputSize {
        bytes: losses
            .iter()
            .map(|l| {
                8 + 4 * l.gradient.len() + l.metrics.iter().map(|m| m.name.len() + 8).sum::<usize>()
            })
            .sum(),
        items: losses.iter().map(|l| 1 + l.metrics.len()).sum(),
    }
}

fn check_losses(losses: &[DatumLoss], datums: &[ObjectiveDatum]) -> Result<(), String> {
    if losses.len() != datums.len() {
        return Err(format!(
            "loss returned {} losses for {} datums",
            losses.len(),
            datums.len()
        ));
    }
    for (i, (loss, datum)) in losses.iter().zip(datums).enumerate() {
        if !loss.value.is_finite() {
            return Err(format!("datum {i}: a loss of {}", loss.value));
        }
        if loss.gradient.len() != datum.logprobs.len() {
            return Err(format!(
                "datum {i}: a gradient of {} values for {} logprobs",
                loss.gradient.len(),
                datum.logprobs.len()
            ));
        }
        if let Some((t, bad)) = loss
            .gradient
            .iter()
            .enumerate()
            .find(|(_, g)| !g.is_finite())
        {
            return Err(format!("datum {i}: a gradient of {bad} at token {t}"));
        }
        if let Some(bad) = loss.metrics.iter().find(|m| !m.value.is_finite()) {
            return Err(format!("datum {i}: metric {:?} is {}", bad.name, bad.value));
        }
    }
    Ok(())
}

fn check_advantages(advantages: &[Vec<f64>], group: &[Vec<f64>]) -> Result<(), String> {
    if advantages.len() != group.len() {
        return Err(format!(
            "advantages returned {} lists for {} episodes",
            advantages.len(),
            group.len()
        ));
    }
    for (i, (episode, turns)) in advantages.iter().zip(group).enumerate() {
        if episode.len() != turns.len() {
            return Err(format!(
                "episode {i}: {} advantages for {} turns",
                episode.len(),
                turns.len()
            ));
        }
        if let Some(bad) = episode.iter().find(|a| !a.is_finite()) {
            return Err(format!("episode {i}: an advantage of {bad}"));
        }
    }
    Ok(())
}
