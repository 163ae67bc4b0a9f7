//! From a token sequence to the training datum of the design's data path: `input = tokens[..n-1]`,
//! `targets = tokens[1..]`, and per target token a weight (SFT) or an advantage and the sampler's
//! logprob (RL). Context tokens (prompt, observations, template glue) never count. The datum is
//! the op API's, as a Tinker SDK user builds it, so the loop's datums reach the engine through
//! the same one conversion as a tenant's.

use super::transcript::{SpanKind, TokenSequence};
use crate::api::{Datum, LossInput};

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
    let datum = Datum::new(tokens[..tokens.len() - 1].to_vec(), &tokens[1..])
        .with(LossInput::Mask, mask(targets))
        .with(
            LossInput::Advantages,
            targets
                .iter()
                .map(|(_, turn, _)| turn.map_or(0.0, &turn_advantage))
                .collect(),
        )
        .with(
            LossInput::Logprobs,
            targets.iter().map(|(_, _, lp)| *lp).collect(),
        );
    Some(datum)
}

/// 1 for each target that counts, else 0.
fn mask(targets: &[(bool, Option<usize>, f32)]) -> Vec<f32> {
    targets
        .iter()
        .map(|(counts, _, _)| f32::from(u8::from(*counts)))
        .collect()
}

/// The SFT datum of `sequence`: weight 1 on action (assistant) tokens, 0 elsewhere.
pub fn sft_datum(sequence: &TokenSequence) -> Option<Datum> {
    let tokens = sequence.tokens();
    if tokens.len() < 2 {
        return None;
    }
    let mask = mask(&per_token(sequence)[1..]);
    let datum = Datum::new(tokens[..tokens.len() - 1].to_vec(), &tokens[1..])
        .with(LossInput::Weights, mask.clone())
        .with(LossInput::Mask, mask);
    Some(datum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::transcript::Transcript;
    use LossInput::{Advantages, Logprobs, Mask, Weights};

    fn floats(datum: &Datum, input: LossInput) -> Vec<f32> {
        datum.floats(input).unwrap().to_vec()
    }

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
        assert_eq!(datum.model_input.tokens(), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(datum.target_tokens().unwrap(), [2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(floats(&datum, Mask), [0., 0., 1., 1., 0., 0., 1., 1.]);
        assert_eq!(
            floats(&datum, Advantages),
            [0., 0., 1.5, 1.5, 0., 0., -2.0, -2.0]
        );
        assert_eq!(
            floats(&datum, Logprobs),
            [0., 0., -0.4, -0.5, 0., 0., -0.8, -0.9]
        );
        let sft = sft_datum(&sequences[0]).unwrap();
        assert_eq!(floats(&sft, Weights), [0., 0., 1., 1., 0., 0., 1., 1.]);
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
        assert_eq!(first.target_tokens().unwrap(), [2, 3, 4]);
        assert_eq!(floats(&first, Mask), [0., 1., 1.]);
        assert_eq!(floats(&first, Advantages), [0., 0.5, 0.5]);
        let second = rl_datum(&sequences[1], |turn| [0.5, 0.7][turn]).unwrap();
        assert_eq!(second.model_input.tokens(), vec![10, 11, 12]);
        assert_eq!(second.target_tokens().unwrap(), [11, 12, 13]);
        assert_eq!(floats(&second, Mask), [0., 0., 1.]);
        assert_eq!(floats(&second, Advantages), [0., 0., 0.7]);
        assert_eq!(floats(&second, Logprobs), [0., 0., -1.3]);
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
