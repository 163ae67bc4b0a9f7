//! Sampling parameters, as the Tinker API names them, and their validation.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// When a sample stops before `max_tokens`.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// Stop once the decoded text of the sample contains one of these.
    Strings(Vec<String>),
    /// Stop at one of these token ids. Empty: never stop early.
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub max_tokens: usize,
    /// 0 samples greedily.
    pub temperature: f64,
    /// Keep the `k` most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p`; 1 keeps all.
    pub top_p: f64,
    /// The seed of sample `i` is derived from `(seed, i)` only; `None` draws one.
    pub seed: Option<u64>,
    /// `None`: stop at the model's end-of-sequence ids (`generation_config.json`).
    pub stop: Option<Stop>,
    pub num_samples: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: 64,
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            seed: None,
            stop: None,
            num_samples: 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("temperature must be a finite number >= 0, not {0}")]
    Temperature(f64),
    #[error("top_p must be in (0, 1], not {0}")]
    TopP(f64),
    #[error("top_k must be at least 1 (leave it out to keep every token)")]
    TopK,
    #[error("num_samples must be at least 1")]
    NumSamples,
    #[error("max_tokens must be at least 1")]
    MaxTokens,
    #[error("stop token id {token} is outside the vocabulary of {vocab}")]
    StopToken { token: u32, vocab: usize },
    #[error("a stop string is empty")]
    EmptyStopString,
}

impl SamplingParams {
    pub fn validate(&self, vocab: usize) -> Result<(), ParamsError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ParamsError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ParamsError::TopP(self.top_p));
        }
        if self.top_k == Some(0) {
            return Err(ParamsError::TopK);
        }
        if self.num_samples == 0 {
            return Err(ParamsError::NumSamples);
        }
        if self.max_tokens == 0 {
            return Err(ParamsError::MaxTokens);
        }
        match &self.stop {
            Some(Stop::Tokens(tokens)) => {
                if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ParamsError::StopToken { token, vocab });
                }
            }
            Some(Stop::Strings(strings)) if strings.iter().any(String::is_empty) => {
                return Err(ParamsError::EmptyStopString);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The random stream of sample `index` of a request seeded `seed`: a function of the two only.
pub fn sample_rng(seed: u64, index: usize) -> StdRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(index as u64).to_le_bytes());
    bytes[16..].copy_from_slice(b"opentinker-smpl\0");
    StdRng::from_seed(bytes)
}

/// The most likely `(token, logprob)` pairs at one position, most likely first.
pub type TopLogprobs = Vec<(u32, f32)>;

/// A token drawn from one row of logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub token: u32,
    /// Its logprob under the distribution it was drawn from (see [`choose`]).
    pub logprob: f32,
    /// The most likely tokens of that distribution, as many as asked for (none: empty).
    pub top: TopLogprobs,
}

/// Pick the next token from `logits` (one row): returns it with its logprob under
/// `log_softmax(logits / temperature)`, taken before top-k / top-p (at temperature 0, under
/// `log_softmax(logits)`), and the `top` most likely tokens of that same distribution (what
/// the sampled token's logprob is compared with). `uniform` is one draw in `[0, 1)`.
pub fn choose(logits: &[f32], params: &SamplingParams, uniform: f64, top: usize) -> Choice {
    let (chosen, logprobs) = if params.temperature == 0.0 {
        (argmax(logits), opentinker_kernels::ops::log_softmax(logits))
    } else {
        let inv = (1.0 / params.temperature) as f32;
        let scaled: Vec<f32> = logits.iter().map(|&l| l * inv).collect();
        let logprobs = opentinker_kernels::ops::log_softmax(&scaled);
        (draw_from(&logprobs, params, uniform), logprobs)
    };
    Choice {
        token: chosen as u32,
        logprob: logprobs[chosen],
        top: most_likely(&logprobs, top),
    }
}

/// The `k` most likely tokens of `logprobs`, most likely first, ties by id: one fixed order.
pub fn most_likely(logprobs: &[f32], k: usize) -> TopLogprobs {
    most_likely_order(logprobs, k)
        .into_iter()
        .map(|i| (i as u32, logprobs[i]))
        .collect()
}

/// The ids of the `k` most likely tokens of `logprobs` in [`most_likely`]'s order.
fn most_likely_order(logprobs: &[f32], k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..logprobs.len()).collect();
    let by_logprob = |a: &usize, b: &usize| logprobs[*b].total_cmp(&logprobs[*a]).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logprob);
        order.truncate(k);
    }
    order.sort_unstable_by(by_logprob);
    order
}

/// A token drawn from `logprobs` (at a temperature above 0) under `params`' top-k and top-p.
pub(super) fn draw_from(logprobs: &[f32], params: &SamplingParams, uniform: f64) -> usize {
    let truncated = params.top_k.is_some_and(|k| k < logprobs.len()) || params.top_p < 1.0;
    if truncated {
        let order = most_likely_order(logprobs, params.top_k.unwrap_or(logprobs.len()));
        let mut kept = Vec::with_capacity(order.len());
        let mut mass = 0.0f64;
        for &i in &order {
            kept.push(i);
            mass += f64::from(logprobs[i].exp());
            if mass >= params.top_p {
                break;
            }
        }
        draw(
            kept.iter().map(|&i| (i, f64::from(logprobs[i]).exp())),
            mass,
            uniform,
        )
    } else {
        let probs = logprobs
            .iter()
            .enumerate()
            .map(|(i, &l)| (i, f64::from(l).exp()));
        let mass: f64 = logprobs.iter().map(|&l| f64::from(l).exp()).sum();
        draw(probs, mass, uniform)
    }
}

/// The first candidate at which the running mass passes `uniform · mass`.
fn draw(candidates: impl Iterator<Item = (usize, f64)>, mass: f64, uniform: f64) -> usize {
    let target = uniform * mass;
    let mut running = 0.0;
    let mut last = 0;
    for (i, p) in candidates {
        running += p;
        last = i;
        if running > target {
            return i;
        }
    }
    last
}

pub(super) fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_parameters_are_named() {
        let vocab = 10;
        let bad = |p: SamplingParams| p.validate(vocab).unwrap_err().to_string();
        let base = SamplingParams::default();
        assert!(
            bad(SamplingParams {
                temperature: f64::NAN,
                ..base.clone()
            })
            .contains("temperature")
        );
        assert!(
            bad(SamplingParams {
                temperature: -1.0,
                ..base.clone()
            })
            .contains("temperature")
        );
        assert!(
            bad(SamplingParams {
                top_p: 0.0,
                ..base.clone()
            })
            .contains("top_p")
        );
        assert!(
            bad(SamplingParams {
                top_p: 1.5,
                ..base.clone()
            })
            .contains("top_p")
        );
        let stop = Some(Stop::Tokens(vec![10]));
        assert!(
            bad(SamplingParams {
                stop,
                ..base.clone()
            })
            .contains("stop token id 10")
        );
        assert!(base.validate(vocab).is_ok());
    }

    #[test]
    fn truncation_keeps_the_most_likely_and_logprobs_come_before_it() {
        let logits = [0.0, 3.0, 1.0, 2.0];
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        assert_eq!(choose(&logits, &greedy, 0.99, 0).token, 1);
        let top1 = SamplingParams {
            top_k: Some(1),
            ..SamplingParams::default()
        };
        for u in [0.0, 0.5, 0.999] {
            let choice = choose(&logits, &top1, u, 2);
            assert_eq!(choice.token, 1);
            let full = opentinker_kernels::ops::log_softmax(&logits);
            assert_eq!(choice.logprob, full[1]);
            // The alternatives come from the same distribution, before truncation.
            assert_eq!(choice.top, vec![(1, full[1]), (3, full[3])]);
        }
        let nucleus = SamplingParams {
            top_p: 0.7,
            ..SamplingParams::default()
        };
        for u in [0.0, 0.3, 0.6, 0.999] {
            let token = choose(&logits, &nucleus, u, 0).token;
            assert!(token == 1 || token == 3, "{token}");
        }
    }

    #[test]
    fn the_stream_of_a_sample_depends_on_seed_and_index_only() {
        use rand::RngExt;
        let draws = |seed, i| {
            let mut rng = sample_rng(seed, i);
            (0..4).map(|_| rng.random::<u64>()).collect::<Vec<_>>()
        };
        assert_eq!(draws(7, 3), draws(7, 3));
        assert_ne!(draws(7, 3), draws(7, 4));
        assert_ne!(draws(7, 3), draws(8, 3));
    }
}
