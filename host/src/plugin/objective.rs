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
        check_losses(&losses, datums).map_err(|problem| {
            sandbox.fail(CallError::new(
                ErrorKind::InvalidOutput,
                problem.to_string(),
            ))
        })?;
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
        check_advantages(&advantages, group).map_err(|problem| {
            sandbox.fail(CallError::new(
                ErrorKind::InvalidOutput,
                problem.to_string(),
            ))
        })?;
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

/// What is wrong with an objective's or an estimator's answer: that call's `invalid_output`.
#[derive(Debug, PartialEq, thiserror::Error)]
enum BadAnswer {
    #[error("{call} returned {answered} {items} for {asked} {of}")]
    Count {
        call: &'static str,
        items: &'static str,
        of: &'static str,
        answered: usize,
        asked: usize,
    },
    #[error("datum {datum}: a loss of {value}")]
    Loss { datum: usize, value: f64 },
    #[error("datum {datum}: a gradient of {answered} values for {logprobs} logprobs")]
    GradientLength {
        datum: usize,
        answered: usize,
        logprobs: usize,
    },
    #[error("datum {datum}: a gradient of {value} at token {token}")]
    Gradient {
        datum: usize,
        token: usize,
        value: f32,
    },
    #[error("datum {datum}: metric {name:?} is {value}")]
    Metric {
        datum: usize,
        name: String,
        value: f64,
    },
    #[error("episode {episode}: {answered} advantages for {turns} turns")]
    Turns {
        episode: usize,
        answered: usize,
        turns: usize,
    },
    #[error("episode {episode}: an advantage of {value}")]
    Advantage { episode: usize, value: f64 },
}

fn check_losses(losses: &[DatumLoss], datums: &[ObjectiveDatum]) -> Result<(), BadAnswer> {
    if losses.len() != datums.len() {
        return Err(BadAnswer::Count {
            call: "loss",
            items: "losses",
            of: "datums",
            answered: losses.len(),
            asked: datums.len(),
        });
    }
    for (datum, (loss, input)) in losses.iter().zip(datums).enumerate() {
        if !loss.value.is_finite() {
            return Err(BadAnswer::Loss {
                datum,
                value: loss.value,
            });
        }
        if loss.gradient.len() != input.logprobs.len() {
            return Err(BadAnswer::GradientLength {
                datum,
                answered: loss.gradient.len(),
                logprobs: input.logprobs.len(),
            });
        }
        if let Some((token, &value)) = loss
            .gradient
            .iter()
            .enumerate()
            .find(|(_, g)| !g.is_finite())
        {
            return Err(BadAnswer::Gradient {
                datum,
                token,
                value,
            });
        }
        if let Some(bad) = loss.metrics.iter().find(|m| !m.value.is_finite()) {
            return Err(BadAnswer::Metric {
                datum,
                name: bad.name.clone(),
                value: bad.value,
            });
        }
    }
    Ok(())
}

fn check_advantages(advantages: &[Vec<f64>], group: &[Vec<f64>]) -> Result<(), BadAnswer> {
    if advantages.len() != group.len() {
        return Err(BadAnswer::Count {
            call: "advantages",
            items: "lists",
            of: "episodes",
            answered: advantages.len(),
            asked: group.len(),
        });
    }
    for (episode, (answer, turns)) in advantages.iter().zip(group).enumerate() {
        if answer.len() != turns.len() {
            return Err(BadAnswer::Turns {
                episode,
                answered: answer.len(),
                turns: turns.len(),
            });
        }
        if let Some(&value) = answer.iter().find(|a| !a.is_finite()) {
            return Err(BadAnswer::Advantage { episode, value });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{BadAnswer, check_advantages};

    #[test]
    fn an_estimators_answer_of_the_wrong_shape_or_not_finite_is_named() {
        let group = [vec![1.0, 0.0], vec![2.0]];
        assert_eq!(
            check_advantages(&[vec![0.5, 0.5], vec![-1.0]], &group),
            Ok(())
        );
        let short = check_advantages(&[vec![0.5]], &group).unwrap_err();
        assert_eq!(
            short.to_string(),
            "advantages returned 1 lists for 2 episodes"
        );
        let turns = check_advantages(&[vec![0.5], vec![-1.0]], &group).unwrap_err();
        assert!(matches!(
            turns,
            BadAnswer::Turns {
                episode: 0,
                answered: 1,
                turns: 2
            }
        ));
        let nan = check_advantages(&[vec![0.5, f64::NAN], vec![-1.0]], &group).unwrap_err();
        assert!(matches!(nan, BadAnswer::Advantage { episode: 0, .. }));
    }
}
