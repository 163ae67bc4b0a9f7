//! Training through the clients: a step of several policies at once (each policy's
//! `forward_backward` sent together, so the service fuses them into one pass, then each
//! policy's `optim_step`), and a policy's logprobs of datums without gradients.

use std::collections::BTreeMap;

use crate::api::{
    AdamParams, Datum, ForwardBackwardInput, ForwardBackwardOutput, LossInput, TensorValues,
    UNIT_TEMPERATURE,
};
use crate::client::TrainingClient;

/// The datums of one policy in a training step.
pub(super) type PolicyBatch = (String, Vec<Datum>);

/// A loss by its Tinker name and config, over the logprobs at a temperature.
#[derive(Clone, Debug)]
pub(super) struct LossFn {
    pub(super) name: String,
    pub(super) config: BTreeMap<String, f64>,
    /// The RL sampling temperature (the learner's policy is the tempered one sampled from); 1
    /// for demonstrations and the reference.
    pub(super) temperature: f64,
}

impl LossFn {
    pub(super) fn cross_entropy() -> Self {
        LossFn {
            name: "cross_entropy".into(),
            config: BTreeMap::new(),
            temperature: UNIT_TEMPERATURE,
        }
    }

    fn input(&self, datums: &[Datum]) -> ForwardBackwardInput {
        ForwardBackwardInput {
            data: datums.to_vec(),
            loss_fn: self.name.clone(),
            loss_fn_config: self.config.clone(),
            custom_loss: None,
            temperature: self.temperature,
        }
    }
}

/// What one training step did.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepOutcome {
    /// The loss per counted token.
    pub(super) loss: f64,
    /// The counted tokens.
    pub(super) tokens: usize,
    /// The largest update norm relative to the adapter's weights among the policies trained
    /// (`None` when nothing trained or the service did not say).
    pub(super) update_ratio: Option<f64>,
    /// How far the trainer's logprobs of the sampled tokens are from the sampler's (`None`
    /// without sampler logprobs, as in a warm-up).
    pub(super) sampler_gap: Option<LogprobGap>,
}

/// The absolute difference between the trainer's logprob of each counted token and the
/// sampler's, before the update: the numerical mismatch of the two paths when the batch is on
/// policy (verl's `rollout_probs_diff`, the cookbook's `kl_sample_train`), the policy's drift
/// since sampling when it is not.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct LogprobGap {
    pub(super) max: f64,
    pub(super) mean: f64,
}

impl LogprobGap {
    /// The gap over the counted tokens of `datums` with sampler logprobs, the trainer's
    /// logprobs being `output`'s per datum.
    fn of<'a>(
        batches: impl IntoIterator<Item = (&'a [Datum], &'a ForwardBackwardOutput)>,
    ) -> Option<Self> {
        let (mut max, mut sum, mut count) = (0.0f64, 0.0f64, 0usize);
        for (datums, output) in batches {
            for (datum, outputs) in datums.iter().zip(&output.loss_fn_outputs) {
                let (Some(sampled), Some(mask), Some(TensorValues::Float32(trained))) = (
                    datum.floats(LossInput::Logprobs),
                    datum.floats(LossInput::Mask),
                    outputs.get("logprobs").map(|t| &t.values),
                ) else {
                    continue;
                };
                let tokens = mask.iter().zip(sampled.iter().zip(trained));
                for (_, (&sampled, &trained)) in tokens.filter(|&(&mask, _)| mask > 0.0) {
                    let gap = f64::from((trained - sampled).abs());
                    max = max.max(gap);
                    sum += gap;
                    count += 1;
                }
            }
        }
        (count > 0).then(|| LogprobGap {
            max,
            mean: sum / count as f64,
        })
    }
}

/// RL's Adam: the Tinker SDK's defaults (β2 0.95), the gradient clipped to norm 1.
pub(super) fn rl_adam(learning_rate: f64) -> AdamParams {
    AdamParams {
        learning_rate,
        grad_clip_norm: 1.0,
        ..AdamParams::default()
    }
}

/// One training step: a `forward_backward` of each policy's datums, all sent at once, then an
/// `optim_step` of each policy that had some with `params`.
pub(super) async fn train_step(
    batches: Vec<(&dyn TrainingClient, Vec<Datum>)>,
    loss: &LossFn,
    params: AdamParams,
) -> anyhow::Result<StepOutcome> {
    let batches: Vec<_> = batches
        .into_iter()
        .filter(|(_, datums)| !datums.is_empty())
        .collect();
    if batches.is_empty() {
        return Ok(StepOutcome::default());
    }
    let outputs = futures::future::try_join_all(
        batches
            .iter()
            .map(|(client, datums)| client.forward_backward(loss.input(datums))),
    )
    .await?;
    let mut update_ratio: Option<f64> = None;
    for (client, _) in &batches {
        let output = client.optim_step(params).await?;
        let metric = |name: &str| output.metrics.get(name).copied();
        if let (Some(update), Some(weights)) =
            (metric("update_norm:mean"), metric("weight_norm:mean"))
            && weights > 0.0
        {
            update_ratio = Some(update_ratio.unwrap_or(0.0).max(update / weights));
        }
    }
    let (loss, tokens) = loss_per_token(&outputs);
    let sampler_gap = LogprobGap::of(
        batches
            .iter()
            .map(|(_, datums)| datums.as_slice())
            .zip(&outputs),
    );
    Ok(StepOutcome {
        loss,
        tokens,
        update_ratio,
        sampler_gap,
    })
}

/// `client`'s logprob of each datum's targets and its cross-entropy, without gradients.
pub(super) async fn forward_cross_entropy(
    client: &dyn TrainingClient,
    datums: &[Datum],
) -> anyhow::Result<(Vec<Vec<f32>>, ForwardBackwardOutput)> {
    let output = client
        .forward(LossFn::cross_entropy().input(datums))
        .await?;
    let logprobs = output
        .loss_fn_outputs
        .iter()
        .map(|named| match named.get("logprobs").map(|t| &t.values) {
            Some(TensorValues::Float32(values)) => Ok(values.clone()),
            _ => Err(anyhow::anyhow!("a forward output has no float32 logprobs")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((logprobs, output))
}

/// The summed losses of `outputs` per token that counts, and those tokens.
pub(super) fn loss_per_token(outputs: &[ForwardBackwardOutput]) -> (f64, usize) {
    let sum = |key: &str| -> f64 {
        outputs
            .iter()
            .map(|o| o.metrics.get(key).copied().unwrap_or(0.0))
            .sum()
    };
    let tokens = sum("tokens:sum");
    (sum("loss:sum") / tokens.max(1.0), tokens as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TensorData;

    fn datum(mask: Vec<f32>, sampled: Option<Vec<f32>>) -> Datum {
        let datum =
            Datum::new(vec![1; mask.len()], &vec![2; mask.len()]).with(LossInput::Mask, mask);
        match sampled {
            Some(sampled) => datum.with(LossInput::Logprobs, sampled),
            None => datum,
        }
    }

    fn output(trained: &[&[f32]]) -> ForwardBackwardOutput {
        ForwardBackwardOutput {
            loss_fn_outputs: trained
                .iter()
                .map(|l| BTreeMap::from([("logprobs".to_string(), TensorData::f32(l.to_vec()))]))
                .collect(),
            loss_fn_output_type: String::new(),
            metrics: BTreeMap::new(),
        }
    }

    #[test]
    fn the_sampler_gap_counts_only_sampled_tokens_that_train() {
        let datums = [
            // The context token's gap (5) does not count.
            datum(vec![0.0, 1.0, 1.0], Some(vec![0.0, -1.0, -2.0])),
            datum(vec![1.0], Some(vec![-0.5])),
            // Without sampler logprobs (a warm-up's datum): not counted.
            datum(vec![1.0], None),
        ];
        let trained = output(&[&[-5.0, -1.25, -2.0], &[-0.25], &[-9.0]]);
        let gap = LogprobGap::of([(&datums[..], &trained)]).unwrap();
        assert_eq!(gap.max, 0.25);
        assert!((gap.mean - 0.5 / 3.0).abs() < 1e-12, "{gap:?}");
        assert_eq!(LogprobGap::of([(&datums[2..], &output(&[&[-9.0]]))]), None);
    }
}
