//! From a token sequence to the training datum of the design's data path: `input = tokens[..n-1]`,
//! `targets = tokens[1..]`, and per target token a weight (SFT) or an advantage and the sampler's
//! logprob (RL). Context tokens (prompt, observations, template glue) never count.

use std::collections::BTreeMap;

use super::transcript::{SpanKind, TokenSequence};
use crate::api::{self, ModelInput, TensorData};

/// A training example as RL and SFT build it, pre-shifted: target `i` follows `input[..=i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Datum {
    pub input_tokens: Vec<u32>,
    pub target_tokens: Vec<u32>,
    /// 1 where a target token counts (action tokens), 0 for context and observations.
    pub mask: Vec<f32>,
    /// SFT weights (cross-entropy).
    pub weights: Option<Vec<f32>>,
    pub advantages: Option<Vec<f32>>,
    pub sampler_logprobs: Option<Vec<f32>>,
}

impl Datum {
    /// The op API's datum: Tinker's loss inputs by name, and the mask as `mask`.
    pub fn to_api(&self) -> api::Datum {
        let mut inputs = BTreeMap::from([
            (
                "target_tokens".to_string(),
                TensorData::i64(self.target_tokens.iter().map(|&t| i64::from(t)).collect()),
            ),
            ("mask".to_string(), TensorData::f32(self.mask.clone())),
        ]);
        for (key, values) in [
            ("weights", &self.weights),
            ("advantages", &self.advantages),
            ("logprobs", &self.sampler_logprobs),
        ] {
            if let Some(values) = values {
                inputs.insert(key.to_string(), TensorData::f32(values.clone()));
            }
        }
        api::Datum {
            model_input: ModelInput::from_tokens(self.input_tokens.clone()),
            loss_fn_inputs: inputs,
            loss_fn_input_spans: None,
        }
    }
}

/// Per token of `sequence`: (counts, turn, sampler logprob).
fn per_token(sequence: &TokenSequence) -> Vec<(bool, Option<usize>, f32)> {
    sequence
        .spans
        .iter()
        .flat_map(|span| {
            let turn = match span.kind {
                SpanKind::Action { turn } => Some(turn),
                SpanKind::Context => None,
            };
            span.tokens.iter().enumerate().map(move |(i, _)| {
                (
                    turn.is_some(),
                    turn,
                    span.logprobs.get(i).copied().unwrap_or(0.0),
                )
            })
        })
        .collect()
}

/// The RL datum of `sequence`: action tokens carry the advantage of their turn
/// (`turn_advantage(turn)`) and their sampler logprob; context tokens have mask 0. `None` when
/// the sequence has fewer than two tokens.
pub fn rl_datum(sequence: &TokenSequence, turn_advantage: impl Fn(usize) -> f32) -> Option<Datum> {
    let tokens = sequence.tokens();
    if tokens.len() < 2 {
        return None;
    }
    let info = per_token(sequence);
    // Target i is token i + 1.
    let targets = &info[1..];
    Some(Datum {
        input_tokens: tokens[..tokens.len() - 1].to_vec(),
        target_tokens: tokens[1..].to_vec(),
        mask: targets
            .iter()
            .map(|(counts, _, _)| f32::from(u8::from(*counts)))
            .collect(),
        weights: None,
        advantages: Some(
            targets
                .iter()
                .map(|(_, turn, _)| turn.map_or(0.0, &turn_advantage))
                .collect(),
        ),
        sampler_logprobs: Some(targets.iter().map(|(_, _, lp)| *lp).collect()),
    })
}

/// The SFT datum of `sequence`: weight 1 on action (assistant) tokens, 0 elsewhere.
pub fn sft_datum(sequence: &TokenSequence) -> Option<Datum> {
    let tokens = sequence.tokens();
    if tokens.len() < 2 {
        return None;
    }
    let info = per_token(sequence);
    let mask: Vec<f32> = info[1..]
        .iter()
        .map(|(counts, _, _)| f32::from(u8::from(*counts)))
        .collect();
    Some(Datum {
        input_tokens: tokens[..tokens.len() - 1].to_vec(),
        target_tokens: tokens[1..].to_vec(),
        weights: Some(mask.clone()),
        mask,
        advantages: None,
        sampler_logprobs: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::transcript::Transcript;

    /// Two turns with the built-in agent: prompt [1 2 3], action [4 5] (5 the stop token),
    /// observation [6 7], action [8 9]; one datum, mask on action targets only.
    #[test]
    fn a_two_turn_episode_is_one_datum_with_exact_masks_and_advantages() {
        let mut transcript = Transcript::new(vec![1, 2, 3]);
        transcript
            .push_action(vec![4, 5], vec![-0.4, -0.5])
            .unwrap();
        transcript.push_observation(vec![6, 7]).unwrap();
        assert_eq!(transcript.prompt(), vec![1, 2, 3, 4, 5, 6, 7]);
        transcript
            .push_action(vec![8, 9], vec![-0.8, -0.9])
            .unwrap();
        let sequences = transcript.into_sequences();
        assert_eq!(sequences.len(), 1);
        let datum = rl_datum(&sequences[0], |turn| [1.5, -2.0][turn]).unwrap();
        assert_eq!(datum.input_tokens, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(datum.target_tokens, vec![2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(datum.mask, vec![0., 0., 1., 1., 0., 0., 1., 1.]);
        assert_eq!(
            datum.advantages.unwrap(),
            vec![0., 0., 1.5, 1.5, 0., 0., -2.0, -2.0]
        );
        assert_eq!(
            datum.sampler_logprobs.unwrap(),
            vec![0., 0., -0.4, -0.5, 0., 0., -0.8, -0.9]
        );
        let sft = sft_datum(&sequences[0]).unwrap();
        assert_eq!(sft.weights.unwrap(), vec![0., 0., 1., 1., 0., 0., 1., 1.]);
    }

    /// An agent that rewrites the history between turns: two datums, each with its own turn.
    #[test]
    fn a_rewritten_history_starts_a_new_datum() {
        let mut transcript = Transcript::new(vec![1, 2]);
        transcript
            .push_action(vec![3, 4], vec![-0.3, -0.4])
            .unwrap();
        transcript.rewrite(vec![10, 11, 12]);
        transcript.push_action(vec![13], vec![-1.3]).unwrap();
        let sequences = transcript.into_sequences();
        assert_eq!(sequences.len(), 2);
        let first = rl_datum(&sequences[0], |turn| [0.5, 0.7][turn]).unwrap();
        assert_eq!(first.target_tokens, vec![2, 3, 4]);
        assert_eq!(first.mask, vec![0., 1., 1.]);
        assert_eq!(first.advantages.unwrap(), vec![0., 0.5, 0.5]);
        let second = rl_datum(&sequences[1], |turn| [0.5, 0.7][turn]).unwrap();
        assert_eq!(second.input_tokens, vec![10, 11, 12]);
        assert_eq!(second.target_tokens, vec![11, 12, 13]);
        assert_eq!(second.mask, vec![0., 0., 1.]);
        assert_eq!(second.advantages.unwrap(), vec![0., 0., 0.7]);
        assert_eq!(second.sampler_logprobs.unwrap(), vec![0., 0., -1.3]);
    }

    #[test]
    fn bad_actions_are_refused() {
        let mut transcript = Transcript::new(vec![1]);
        assert!(transcript.push_action(vec![], vec![]).is_err());
        let err = transcript.push_action(vec![2, 3], vec![-1.0]).unwrap_err();
        assert!(err.to_string().contains("2 tokens but 1 logprobs"));
        assert!(Transcript::new(vec![1]).into_sequences().is_empty());
    }
}
