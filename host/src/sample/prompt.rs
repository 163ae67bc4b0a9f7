//! What a sample request may ask of its prompt besides the sample, all read from the logits rows
//! of the prefill that serves it: each prompt token's logprob (of the last `n` only, if asked),
//! the `k` most likely tokens at each position, the logprobs of token ids the client names
//! (`target_prompt_logprobs`, how the cookbook scores choices), and `k` draws from the model's
//! next-token distribution at each position (`prompt_alt_tokens_k`).
//!
//! Row `i` of the prefill predicts prompt token `i + 1`, so position 0 gets nothing. A row's
//! values depend on nothing but the row (the kernels are batch-invariant) and the draws on the
//! request's seed, so the answers are the same alone or in any batch.

use rand::RngExt;

use super::params::{SamplingParams, TopLogprobs, argmax, draw_from, most_likely, sample_rng};

/// Token ids whose logprobs a client asks for at each prompt position after the first: `k`
/// cells a position, row-major (`[len(prompt) - 1, k]`); `None` asks nothing there.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptTargets {
    pub k: usize,
    pub cells: Vec<Option<u32>>,
}

/// The logprobs of [`PromptTargets`], in their layout: 0 where a cell asks nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetLogprobs {
    pub k: usize,
    pub logprobs: Vec<f32>,
}

/// `k` draws at each prompt position after the first, row-major (`[len(prompt) - 1, k]`), with
/// the model's logprob of each.
#[derive(Clone, Debug, PartialEq)]
pub struct AltTokens {
    pub k: usize,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// What one request asks of its prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptAsks {
    /// Each prompt token's logprob given the ones before it.
    pub logprobs: bool,
    /// The `k` most likely tokens at each position; 0: none.
    pub top_k: usize,
    /// Score only the last `n` prompt tokens (logprobs and top-k); `None`: all of them.
    pub last_n: Option<usize>,
    pub targets: Option<PromptTargets>,
    /// Draws at each position (at the request's temperature); 0: none.
    pub alt_k: usize,
}

impl PromptAsks {
    /// Whether the prefill must keep the logits of its prompt rows.
    pub fn any(&self) -> bool {
        self.logprobs || self.top_k > 0 || self.targets.is_some() || self.alt_k > 0
    }

    /// The first prompt position whose row an answer needs: the positions before it may come
    /// from the prefix cache.
    pub fn first_row(&self, prompt_len: usize) -> usize {
        match (self.targets.is_some() || self.alt_k > 0, self.last_n) {
            (false, Some(n)) => prompt_len.saturating_sub(n + 1),
            _ => 0,
        }
    }
}

/// The answers of [`PromptAsks`]: per prompt token (`None` for the first and for tokens not
/// scored), the targets' logprobs and the draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptAnswers {
    pub logprobs: Option<Vec<Option<f32>>>,
    pub top: Option<Vec<Option<TopLogprobs>>>,
    pub targets: Option<TargetLogprobs>,
    pub alt: Option<AltTokens>,
}

/// Answer `asks` of `prompt` from `rows`, the logits of prompt positions `start..` (one row of
/// `vocab` each). `params` and `seed` are the request's: the draws are at its temperature
/// (ignoring its top-k and top-p: they are the model's distribution), from a stream of their
/// own.
pub fn answer(
    asks: &PromptAsks,
    prompt: &[u32],
    rows: &[f32],
    start: usize,
    vocab: usize,
    params: &SamplingParams,
    seed: u64,
) -> PromptAnswers {
    let len = prompt.len();
    let scored_from = asks.last_n.map_or(1, |n| len.saturating_sub(n).max(1));
    let mut logprobs = asks.logprobs.then(|| vec![None; len]);
    let mut top = (asks.top_k > 0).then(|| vec![None; len]);
    let mut targets = asks.targets.as_ref().map(|t| TargetLogprobs {
        k: t.k,
        logprobs: vec![0.0; t.cells.len()],
    });
    let mut alt = (asks.alt_k > 0).then(|| AltTokens {
        k: asks.alt_k,
        tokens: Vec::with_capacity(len.saturating_sub(1) * asks.alt_k),
        logprobs: Vec::with_capacity(len.saturating_sub(1) * asks.alt_k),
    });
    let draw_params = SamplingParams {
        top_k: None,
        top_p: 1.0,
        ..params.clone()
    };
    let mut rng = sample_rng(seed, ALT_TOKENS_STREAM);
    for token in (start + 1).max(1)..len {
        let row = &rows[(token - 1 - start) * vocab..(token - start) * vocab];
        let lp = opentinker_kernels::ops::log_softmax(row);
        if token >= scored_from {
            if let Some(logprobs) = &mut logprobs {
                logprobs[token] = Some(lp[prompt[token] as usize]);
            }
            if let Some(top) = &mut top {
                top[token] = Some(most_likely(&lp, asks.top_k));
            }
        }
        if let (Some(asked), Some(targets)) = (&asks.targets, &mut targets) {
            let cells = (token - 1) * asked.k..token * asked.k;
            let answered = &mut targets.logprobs[cells.clone()];
            for (cell, id) in answered.iter_mut().zip(&asked.cells[cells]) {
                if let Some(id) = id {
                    *cell = lp[*id as usize];
                }
            }
        }
        if let Some(alt) = &mut alt {
            let tempered = (params.temperature > 0.0).then(|| {
                let inv = (1.0 / params.temperature) as f32;
                let scaled: Vec<f32> = row.iter().map(|&l| l * inv).collect();
                opentinker_kernels::ops::log_softmax(&scaled)
            });
            for _ in 0..alt.k {
                let drawn = match &tempered {
                    Some(tempered) => draw_from(tempered, &draw_params, rng.random::<f64>()),
                    None => argmax(row),
                };
                alt.tokens.push(drawn as u32);
                alt.logprobs.push(lp[drawn]);
            }
        }
    }
    PromptAnswers {
        logprobs,
        top,
        targets,
        alt,
    }
}

/// The index of the alternative tokens' random stream in [`sample_rng`]: apart from every
/// sample's (which are `0..num_samples`).
const ALT_TOKENS_STREAM: usize = usize::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of a 4-token vocabulary that make token `(i + 1) % 4` the likely one at row `i`.
    fn rows(n: usize) -> Vec<f32> {
        (0..n)
            .flat_map(|i| (0..4).map(move |t| if t == (i + 1) % 4 { 4.0 } else { 0.0 }))
            .collect()
    }

    #[test]
    fn the_last_n_are_scored_and_the_rest_are_none() {
        let prompt = [0, 1, 2, 3, 0];
        let asks = PromptAsks {
            logprobs: true,
            last_n: Some(2),
            ..PromptAsks::default()
        };
        let all = answer(
            &PromptAsks {
                last_n: None,
                ..asks.clone()
            },
            &prompt,
            &rows(5),
            0,
            4,
            &SamplingParams::default(),
            1,
        );
        let last = answer(
            &asks,
            &prompt,
            &rows(5),
            0,
            4,
            &SamplingParams::default(),
            1,
        );
        let (all, last) = (all.logprobs.unwrap(), last.logprobs.unwrap());
        assert_eq!(&last[..3], &[None, None, None]);
        assert_eq!(&last[3..], &all[3..]);
        assert!(all[1..].iter().all(Option::is_some));
        // The rows before the scored tokens may come from the prefix cache.
        assert_eq!(asks.first_row(prompt.len()), 2);
        let from_cache = answer(
            &asks,
            &prompt,
            &rows(5)[2 * 4..],
            2,
            4,
            &SamplingParams::default(),
            1,
        );
        assert_eq!(from_cache.logprobs.unwrap(), last);
    }

    #[test]
    fn targets_get_their_logprobs_and_empty_cells_zero() {
        let prompt = [0, 1, 2];
        let asks = PromptAsks {
            targets: Some(PromptTargets {
                k: 2,
                cells: vec![Some(1), None, Some(3), Some(2)],
            }),
            logprobs: true,
            ..PromptAsks::default()
        };
        let answers = answer(
            &asks,
            &prompt,
            &rows(3),
            0,
            4,
            &SamplingParams::default(),
            1,
        );
        let (targets, logprobs) = (answers.targets.unwrap().logprobs, answers.logprobs.unwrap());
        assert_eq!(
            targets[0],
            logprobs[1].unwrap(),
            "position 1's target is its token"
        );
        assert_eq!(targets[1], 0.0);
        assert_eq!(targets[3], logprobs[2].unwrap());
        assert!(targets[2] < targets[3], "an unlikely token scores lower");
    }

    #[test]
    fn alternative_tokens_follow_the_seed_and_the_temperature() {
        let prompt = [0, 1, 2, 3];
        let asks = PromptAsks {
            alt_k: 3,
            ..PromptAsks::default()
        };
        let hot = SamplingParams::default();
        let draw = |seed, params: &SamplingParams| {
            answer(&asks, &prompt, &rows(4), 0, 4, params, seed)
                .alt
                .unwrap()
        };
        assert_eq!(draw(7, &hot), draw(7, &hot));
        let alt = draw(7, &hot);
        assert_eq!(alt.tokens.len(), 9);
        let greedy = SamplingParams {
            temperature: 0.0,
            ..hot.clone()
        };
        let cold = draw(7, &greedy);
        assert_eq!(
            cold.tokens,
            vec![1, 1, 1, 2, 2, 2, 3, 3, 3],
            "greedy draws the likely one"
        );
        let lp = opentinker_kernels::ops::log_softmax(&rows(4)[..4]);
        assert_eq!(cold.logprobs[0], lp[1]);
    }
}
