//! The generation engine: step-level calls over one base model and its adapter versions, with
//! no loop of its own (`add_request`, `decode_step`, `abort`; one caller, later the scheduler,
//! drives it).
//!
//! Each step admits waiting requests while their KV fits the budget, prefills them (once per
//! prompt, whatever `num_samples`; from the prefix cache where it can), and decodes one token of
//! every running sample, all in one forward pass whatever their adapters, on the engine's
//! [`SamplerBackend`] (the CPU's unless [`SamplingEngine::with_backend`] names another).
//!
//! With a prefix cache, a request whose prompt and policy are those of one admitted in the same
//! step waits one step and then takes the prompt's KV from the cache: the eight episodes of an
//! RL group that open on one prompt prefill it once, not eight times. The samples are the same
//! bits either way (the kernels are batch-invariant), only sooner.

use std::collections::VecDeque;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;

use opentinker_kernels::KvCache;

use super::backend::{BackendError, BackendInput, BackendOutput, CpuSampler, Pick, SamplerBackend};
use super::params::{ParamsError, SamplingParams, Stop, TopLogprobs, sample_rng};
use super::prefix::{PolicyKey, PrefixCache};
use super::prompt::{self, PromptAnswers, PromptAsks};
use crate::lora::{AdapterRegistry, PolicyVersion, RegistryError};
use crate::model::{ModelConfig, Transformer};
use crate::text::Tokenizer;

pub type RequestId = u64;

/// The most top tokens a request may ask for per position: enough for distillation's top-k
/// targets, and a bound on the answer (a `k` of the vocabulary's size at every position of a
/// long sample would be gigabytes).
pub const MAX_TOP_LOGPROBS: usize = 1024;

/// An adapter by name, at a version (`None`: its latest live version).
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRef {
    pub name: String,
    pub version: Option<u64>,
}

/// Told each token as it is sampled (for answers streamed as they are made): which of the
/// request's samples, the token and its logprob. Called from the sampler's worker threads.
#[derive(Clone)]
pub struct TokenSink(Arc<dyn Fn(usize, u32, f32) + Send + Sync>);

impl TokenSink {
    pub fn new(sink: impl Fn(usize, u32, f32) + Send + Sync + 'static) -> Self {
        TokenSink(Arc::new(sink))
    }

    fn send(&self, sample: usize, token: u32, logprob: f32) {
        (self.0)(sample, token, logprob)
    }
}

impl std::fmt::Debug for TokenSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSink")
    }
}

#[derive(Clone, Debug)]
pub struct SampleRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// `None`: the base model.
    pub policy: Option<PolicyRef>,
    /// What to tell of the prompt: its tokens' logprobs, the most likely tokens, named
    /// tokens' logprobs, alternative draws.
    pub prompt_asks: PromptAsks,
    /// The `k` most likely tokens at every sampled position, from the distribution each token
    /// was drawn from; 0: none.
    pub topk_sample_logprobs: usize,
    /// Told each token as it is sampled; `None`: the tokens come with the finished output only.
    pub tokens: Option<TokenSink>,
}

impl SampleRequest {
    /// Refuse what no engine of a model of `config` with `context` positions can run (the
    /// engine checks it again, with its own budget and policies, when the request arrives).
    pub fn check(&self, config: &ModelConfig, context: usize) -> Result<(), SampleError> {
        self.params.validate(config.vocab_size)?;
        for (what, asked) in [
            ("topk_prompt_logprobs", self.prompt_asks.top_k),
            ("topk_sample_logprobs", self.topk_sample_logprobs),
            ("prompt_alt_tokens_k", self.prompt_asks.alt_k),
        ] {
            if asked > MAX_TOP_LOGPROBS {
                return Err(SampleError::TooManyTopLogprobs {
                    what,
                    asked,
                    max: MAX_TOP_LOGPROBS,
                });
            }
        }
        if self.prompt.is_empty() {
            return Err(SampleError::EmptyPrompt);
        }
        config
            .check_tokens(&self.prompt)
            .map_err(|e| SampleError::TokenOutOfVocabulary {
                token: e.token,
                vocab: e.vocab,
            })?;
        self.check_prompt_asks(config.vocab_size)?;
        if self.prompt.len() > context {
            return Err(SampleError::PromptTooLong {
                len: self.prompt.len(),
                context,
            });
        }
        Ok(())
    }

    /// Refuse prompt asks that do not fit the prompt: a `last_n` outside `1..len`, a targets
    /// tensor of another shape, a target id outside the vocabulary.
    fn check_prompt_asks(&self, vocab: usize) -> Result<(), SampleError> {
        let asks = &self.prompt_asks;
        let positions = self.prompt.len() - 1;
        if let Some(n) = asks.last_n {
            if !(asks.logprobs || asks.top_k > 0) {
                return Err(SampleError::LastNWithoutLogprobs);
            }
            if n == 0 || n > positions {
                return Err(SampleError::BadLastN { n, positions });
            }
        }
        if let Some(targets) = &asks.targets {
            if targets.k == 0 || targets.cells.len() != positions * targets.k {
                return Err(SampleError::BadTargetsShape {
                    cells: targets.cells.len(),
                    positions,
                    k: targets.k,
                });
            }
            if targets.k > MAX_TOP_LOGPROBS {
                return Err(SampleError::TooManyTopLogprobs {
                    what: "target_prompt_logprobs",
                    asked: targets.k,
                    max: MAX_TOP_LOGPROBS,
                });
            }
            if let Some(token) = targets
                .cells
                .iter()
                .flatten()
                .find(|&&t| t as usize >= vocab)
            {
                return Err(SampleError::TargetOutOfVocabulary {
                    token: *token,
                    vocab,
                });
            }
        }
        Ok(())
    }

    pub fn new(prompt: Vec<u32>, params: SamplingParams) -> Self {
        SampleRequest {
            prompt,
            params,
            policy: None,
            prompt_asks: PromptAsks::default(),
            topk_sample_logprobs: 0,
            tokens: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StopReason {
    /// A stop token or string (or an end-of-sequence id) was sampled; it ends `tokens`.
    Stop,
    /// `max_tokens`, or the end of the context.
    Length,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Per token, the most likely tokens at its position, when asked for
    /// ([`SampleRequest::topk_sample_logprobs`]).
    pub top_logprobs: Option<Vec<TopLogprobs>>,
    pub stop_reason: StopReason,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    pub id: RequestId,
    pub samples: Vec<Sample>,
    /// What the request asked of its prompt ([`SampleRequest::prompt_asks`]).
    pub prompt: PromptAnswers,
    /// Prompt positions whose KV came from the prefix cache.
    pub cached_prompt_tokens: usize,
    /// The adapter version that sampled (`None`: the base model).
    pub policy_version: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocabulary { token: u32, vocab: usize },
    #[error("the prompt has {len} tokens; the model's context holds {context}")]
    PromptTooLong { len: usize, context: usize },
    #[error("the request needs {needed} KV positions; the sampler's budget is {budget}")]
    OverBudget { needed: usize, budget: usize },
    #[error(
        "`{what}` asks for the {asked} most likely tokens per position; at most {max} are served"
    )]
    TooManyTopLogprobs {
        what: &'static str,
        asked: usize,
        max: usize,
    },
    #[error(
        "`prompt_logprobs_last_n` applies to prompt logprobs, which the request does not ask for"
    )]
    LastNWithoutLogprobs,
    #[error(
        "`prompt_logprobs_last_n` is {n}; it must be between 1 and {positions} (the prompt's length less one)"
    )]
    BadLastN { n: usize, positions: usize },
    #[error(
        "`target_prompt_logprobs` has {cells} cells; it must have the shape [{positions}, K] (the prompt's length less one, and K of at least 1), K = {k}"
    )]
    BadTargetsShape {
        cells: usize,
        positions: usize,
        k: usize,
    },
    #[error("`target_prompt_logprobs` names token id {token}, outside the vocabulary of {vocab}")]
    TargetOutOfVocabulary { token: u32, vocab: usize },
    #[error("stop strings need the model's tokenizer, which this sampler was not given")]
    NoTokenizer,
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error(transparent)]
    Policy(#[from] RegistryError),
    /// The adapter is one this sampler's device cannot hold (checked when the request arrives,
    /// so that it never fails a step other requests share).
    #[error("this sampler cannot run the adapter: {0}")]
    AdapterRefused(BackendError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// How much the engine may hold.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// KV positions of running samples; requests beyond it wait.
    pub kv_budget_positions: usize,
    /// KV positions kept in the prefix cache (0: no prefix cache).
    pub prefix_cache_positions: usize,
}

impl EngineConfig {
    /// Budgets in bytes of KV memory, for `config`'s model.
    pub fn from_bytes(config: &ModelConfig, kv_budget: usize, prefix_cache: usize) -> Self {
        let per =
            KvCache::bytes_per_position(config.num_layers, config.num_kv_heads, config.head_dim)
                .max(1);
        EngineConfig {
            kv_budget_positions: kv_budget / per,
            prefix_cache_positions: prefix_cache / per,
        }
    }
}

/// A validated request with its policy version pinned.
struct Admitted {
    request: SampleRequest,
    seed: u64,
    policy: Option<Arc<PolicyVersion>>,
    reserved: usize,
    /// It waited a step for a request with its prompt to fill the prefix cache: it waits no
    /// more (the next repeats of that prompt are admitted beside it, all from the cache).
    waited_for_prefix: bool,
}

impl Admitted {
    fn key(&self) -> PolicyKey {
        self.policy.as_ref().map(|p| (p.name.clone(), p.version))
    }

    /// Whether `other`'s prefill is this one's: the same prompt under the same policy version,
    /// and this one computes it (it did not wait for the cache to hold it).
    fn prefills_as(&self, other: &Admitted) -> bool {
        !self.waited_for_prefix
            && self.request.prompt == other.request.prompt
            && self.key() == other.key()
    }
}

struct SampleState<C> {
    cache: C,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    top_logprobs: Option<Vec<TopLogprobs>>,
    rng: StdRng,
    stop: Option<StopReason>,
}

struct Running<C> {
    id: RequestId,
    admitted: Admitted,
    samples: Vec<SampleState<C>>,
    prompt: PromptAnswers,
    cached_prompt_tokens: usize,
}

/// A prompt admitted in this step: the cache it starts from (its longest cached prefix, holding
/// `cached` positions) and its samples' random streams.
struct Prefill<C> {
    id: RequestId,
    admitted: Admitted,
    cache: C,
    cached: usize,
    streams: Vec<StdRng>,
}

pub struct SamplingEngine<B: SamplerBackend = CpuSampler> {
    backend: B,
    registry: Arc<AdapterRegistry>,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
    config: EngineConfig,
    waiting: VecDeque<(RequestId, Admitted)>,
    running: Vec<Running<B::Cache>>,
    prefix: PrefixCache<B::Cache>,
    reserved: usize,
    next_id: RequestId,
    seeds: StdRng,
}

impl SamplingEngine {
    /// An engine over `registry`'s base model on the CPU. `eos` are the ids that end a sample
    /// when a request names no stop; `tokenizer` is needed for stop strings.
    pub fn new(
        registry: Arc<AdapterRegistry>,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
        config: EngineConfig,
    ) -> Self {
        let backend = CpuSampler::new(&registry.base().config);
        SamplingEngine::with_backend(backend, registry, tokenizer, eos, config)
    }
}

impl<B: SamplerBackend> SamplingEngine<B> {
    /// As [`SamplingEngine::new`], its forward passes on `backend`.
    pub fn with_backend(
        backend: B,
        registry: Arc<AdapterRegistry>,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
        config: EngineConfig,
    ) -> Self {
        let prefix = PrefixCache::new(config.prefix_cache_positions, backend.block_size());
        SamplingEngine {
            backend,
            registry,
            tokenizer,
            eos,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix,
            reserved: 0,
            next_id: 1,
            seeds: StdRng::from_rng(&mut rand::rng()),
        }
    }

    /// The backend the engine runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Queue a request; it runs from the next `decode_step` that has room for it. Bad input is
    /// refused here and changes nothing.
    pub fn add_request(&mut self, request: SampleRequest) -> Result<RequestId, SampleError> {
        let model = self.registry.base();
        let context = model.context_length();
        request.check(&model.config, context)?;
        if matches!(request.params.stop, Some(Stop::Strings(_))) && self.tokenizer.is_none() {
            return Err(SampleError::NoTokenizer);
        }
        let policy = match &request.policy {
            Some(p) => Some(self.registry.get(&p.name, p.version)?),
            None => None,
        };
        if let Some(policy) = &policy {
            self.backend
                .check_policy(policy)
                .map_err(SampleError::AdapterRefused)?;
        }
        // A sample ends at the context's end whatever its `max_tokens`; the sums cannot wrap.
        let longest = (request.prompt.len())
            .saturating_add(request.params.max_tokens)
            .min(context);
        let reserved = longest
            .next_multiple_of(self.backend.block_size())
            .saturating_mul(request.params.num_samples);
        if reserved > self.config.kv_budget_positions {
            return Err(SampleError::OverBudget {
                needed: reserved,
                budget: self.config.kv_budget_positions,
            });
        }
        let seed = request.params.seed.unwrap_or_else(|| self.seeds.random());
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((
            id,
            Admitted {
                request,
                seed,
                policy,
                reserved,
                waited_for_prefix: false,
            },
        ));
        Ok(id)
    }

    /// Drop a waiting or running request; false when there is none of that id.
    pub fn abort(&mut self, id: RequestId) -> bool {
        if let Some(at) = self.waiting.iter().position(|(i, _)| *i == id) {
            self.waiting.remove(at);
            return true;
        }
        if let Some(at) = self.running.iter().position(|r| r.id == id) {
            let running = self.running.remove(at);
            self.reserved -= running.admitted.reserved;
            for sample in running.samples {
                self.backend.release(sample.cache);
            }
            return true;
        }
        false
    }

    /// Whether any request waits or runs.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Requests waiting for room, and requests running.
    pub fn load(&self) -> (usize, usize) {
        (self.waiting.len(), self.running.len())
    }

    /// One step: admit, prefill the admitted, decode one token of every running sample. Returns
    /// the requests that finished.
    pub fn decode_step(&mut self) -> Result<Vec<SampleOutput>, SampleError> {
        let admitted = self.admit();
        let mut prefills = self.start_prefills(admitted)?;
        let model = Arc::clone(self.registry.base());

        // Each sample draws from its own stream: one number per token, taken here, before the
        // forward, so that the backend draws where the logits are.
        let mut inputs = Vec::new();
        for running in &mut self.running {
            let Running {
                admitted, samples, ..
            } = running;
            let policy = admitted.policy.as_deref();
            let request = &admitted.request;
            for sample in samples.iter_mut().filter(|s| s.stop.is_none()) {
                let SampleState {
                    cache, tokens, rng, ..
                } = sample;
                inputs.push(BackendInput {
                    tokens: std::slice::from_ref(
                        tokens.last().expect("a running sample has a token"),
                    ),
                    policy,
                    cache,
                    all_logits: false,
                    picks: vec![Pick {
                        params: &request.params,
                        uniform: rng.random::<f64>(),
                        top: request.topk_sample_logprobs,
                    }],
                });
            }
        }
        let decoding = inputs.len();
        for prefill in &mut prefills {
            let Prefill {
                admitted,
                cache,
                cached,
                streams,
                ..
            } = prefill;
            let request = &admitted.request;
            let picks = streams
                .iter_mut()
                .map(|rng| Pick {
                    params: &request.params,
                    uniform: rng.random::<f64>(),
                    top: request.topk_sample_logprobs,
                })
                .collect();
            inputs.push(BackendInput {
                tokens: &request.prompt[*cached..],
                policy: admitted.policy.as_deref(),
                cache,
                all_logits: request.prompt_asks.any(),
                picks,
            });
        }
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let mut outputs = self.backend.forward(&model, &mut inputs)?.into_iter();
        drop(inputs);

        self.record_decoded(&mut outputs, decoding, model.context_length());
        for prefill in prefills {
            let output = outputs
                .next()
                .expect("an output for every prefilled prompt");
            self.start_running(prefill, output, &model)?;
        }
        Ok(self.retire_finished())
    }

    /// Takes waiting requests while the KV budget and the backend's adapter slots allow. A
    /// request whose prompt prefills as one admitted in this step waits a step, to start from
    /// the cache that one leaves.
    fn admit(&mut self) -> Vec<(RequestId, Admitted)> {
        let mut admitted: Vec<(RequestId, Admitted)> = Vec::new();
        // The adapter versions running (the base model takes no adapter slot).
        let mut policies: Vec<PolicyKey> = self
            .running
            .iter()
            .map(|r| r.admitted.key())
            .filter(Option::is_some)
            .collect();
        policies.sort();
        policies.dedup();
        // Requests that prefill a prompt admitted in this step: the next step's, from the cache.
        let mut repeats: Vec<(RequestId, Admitted)> = Vec::new();
        while let Some((_, next)) = self.waiting.front() {
            if self.config.prefix_cache_positions > 0
                && !next.waited_for_prefix
                && next.request.prompt.len() > 1
                && admitted.iter().any(|(_, a)| a.prefills_as(next))
            {
                if let Some((id, mut repeat)) = self.waiting.pop_front() {
                    repeat.waited_for_prefix = true;
                    repeats.push((id, repeat));
                }
                continue;
            }
            if self.reserved + next.reserved > self.config.kv_budget_positions {
                break;
            }
            // A backend that holds only so many adapters at once runs no more in a step.
            let key = next.key();
            if key.is_some() && !policies.contains(&key) {
                if self
                    .backend
                    .max_policies()
                    .is_some_and(|most| policies.len() >= most)
                {
                    break;
                }
                policies.push(key);
            }
            let Some((id, next)) = self.waiting.pop_front() else {
                break;
            };
            self.reserved += next.reserved;
            admitted.push((id, next));
        }
        for repeat in repeats.into_iter().rev() {
            self.waiting.push_front(repeat);
        }
        admitted
    }

    /// New prompts' caches, each started from the longest cached prefix of its prompt.
    fn start_prefills(
        &mut self,
        admitted: Vec<(RequestId, Admitted)>,
    ) -> Result<Vec<Prefill<B::Cache>>, SampleError> {
        let mut prefills = Vec::with_capacity(admitted.len());
        for (id, admitted) in admitted {
            // The positions whose rows no answer needs may come from the prefix cache.
            let request = &admitted.request;
            let limit = match request.prompt_asks.any() {
                true => request.prompt_asks.first_row(request.prompt.len()),
                false => request.prompt.len() - 1,
            };
            let found = match limit {
                0 => None,
                limit => self.prefix.lookup(&admitted.key(), &request.prompt, limit),
            };
            let cache = match found {
                Some((cache, len)) => self.backend.fork(cache, len)?,
                None => self.backend.empty_cache(),
            };
            // A prompt's samples' streams, each of which draws its first token from the prefill.
            let streams = (0..request.params.num_samples)
                .map(|i| sample_rng(admitted.seed, i))
                .collect();
            prefills.push(Prefill {
                id,
                cached: B::cache_len(&cache),
                admitted,
                cache,
                streams,
            });
        }
        Ok(prefills)
    }

    /// Appends each running sample's new token (the forward's first `decoding` outputs) and
    /// sees whether it stops.
    fn record_decoded(
        &mut self,
        outputs: &mut impl Iterator<Item = BackendOutput>,
        decoding: usize,
        context: usize,
    ) {
        let mut picks = Vec::with_capacity(decoding);
        for running in &mut self.running {
            let request = &running.admitted.request;
            let decoding = running.samples.iter_mut().enumerate();
            for (index, sample) in decoding.filter(|(_, s)| s.stop.is_none()) {
                let output = outputs.next().expect("an output per decoding sample");
                let choice = output.choices.into_iter().next().expect("one choice");
                picks.push((sample, request, choice, index));
            }
        }
        debug_assert_eq!(picks.len(), decoding);
        let (eos, tokenizer) = (&self.eos, self.tokenizer.as_deref());
        picks
            .into_par_iter()
            .for_each(|(sample, request, choice, index)| {
                let (params, prompt_len) = (&request.params, request.prompt.len());
                if let Some(sink) = &request.tokens {
                    sink.send(index, choice.token, choice.logprob);
                }
                sample.tokens.push(choice.token);
                sample.logprobs.push(choice.logprob);
                if let Some(top) = &mut sample.top_logprobs {
                    top.push(choice.top);
                }
                sample.stop =
                    stop_reason(&sample.tokens, params, eos, tokenizer, prompt_len, context);
            });
    }

    /// A prefilled prompt's answers and first tokens: it runs from the next step, each sample
    /// with a cache of its own. Its prompt's KV goes to the prefix cache.
    fn start_running(
        &mut self,
        prefill: Prefill<B::Cache>,
        output: BackendOutput,
        model: &Transformer,
    ) -> Result<(), SampleError> {
        let Prefill {
            id,
            admitted: a,
            cache,
            cached,
            streams,
        } = prefill;
        let prompt = &a.request.prompt;
        let answers = match a.request.prompt_asks.any() {
            true => prompt::answer(
                &a.request.prompt_asks,
                prompt,
                &output.logits,
                cached,
                model.config.vocab_size,
                &a.request.params,
                a.seed,
            ),
            false => PromptAnswers::default(),
        };
        if self.config.prefix_cache_positions > 0 {
            let copy = self.backend.fork(&cache, prompt.len())?;
            for dropped in self.prefix.insert(a.key(), prompt, copy) {
                self.backend.release(dropped);
            }
        }
        // Each sample a cache of its own; the last takes the prompt's.
        let n = a.request.params.num_samples;
        let mut caches = Vec::with_capacity(n);
        for _ in 1..n {
            caches.push(self.backend.fork(&cache, prompt.len())?);
        }
        caches.push(cache);
        let mut samples = Vec::with_capacity(n);
        let (k, context) = (a.request.topk_sample_logprobs, model.context_length());
        for (i, ((cache, rng), choice)) in caches
            .into_iter()
            .zip(streams)
            .zip(output.choices)
            .enumerate()
        {
            if let Some(sink) = &a.request.tokens {
                sink.send(i, choice.token, choice.logprob);
            }
            let tokens = vec![choice.token];
            let stop = stop_reason(
                &tokens,
                &a.request.params,
                &self.eos,
                self.tokenizer.as_deref(),
                prompt.len(),
                context,
            );
            samples.push(SampleState {
                cache,
                tokens,
                logprobs: vec![choice.logprob],
                top_logprobs: (k > 0).then(|| vec![choice.top]),
                rng,
                stop,
            });
        }
        self.running.push(Running {
            id,
            admitted: a,
            samples,
            prompt: answers,
            cached_prompt_tokens: cached,
        });
        Ok(())
    }

    /// The requests whose every sample has stopped, finished; their KV reservation freed.
    fn retire_finished(&mut self) -> Vec<SampleOutput> {
        let mut finished = Vec::new();
        let mut still = Vec::with_capacity(self.running.len());
        for running in std::mem::take(&mut self.running) {
            if running.samples.iter().any(|s| s.stop.is_none()) {
                still.push(running);
                continue;
            }
            self.reserved -= running.admitted.reserved;
            finished.push(self.finish(running));
        }
        self.running = still;
        finished
    }

    /// The output of a finished request; its samples' KV goes to the prefix cache.
    fn finish(&mut self, running: Running<B::Cache>) -> SampleOutput {
        let key = running.admitted.key();
        let prompt = &running.admitted.request.prompt;
        let mut samples = Vec::with_capacity(running.samples.len());
        for state in running.samples {
            // The cache holds every token but the last sampled, which was never fed back.
            let held = B::cache_len(&state.cache);
            if self.config.prefix_cache_positions > 0 {
                let mut tokens = prompt.clone();
                tokens.extend_from_slice(&state.tokens);
                tokens.truncate(held);
                for dropped in self.prefix.insert(key.clone(), &tokens, state.cache) {
                    self.backend.release(dropped);
                }
            } else {
                self.backend.release(state.cache);
            }
            samples.push(Sample {
                tokens: state.tokens,
                logprobs: state.logprobs,
                top_logprobs: state.top_logprobs,
                stop_reason: state.stop.unwrap_or(StopReason::Length),
            });
        }
        SampleOutput {
            id: running.id,
            samples,
            prompt: running.prompt,
            cached_prompt_tokens: running.cached_prompt_tokens,
            policy_version: running.admitted.policy.as_ref().map(|p| p.version),
        }
    }
}

/// Why a sample whose tokens so far are `tokens` stops now, if it does.
fn stop_reason(
    tokens: &[u32],
    params: &SamplingParams,
    eos: &[u32],
    tokenizer: Option<&Tokenizer>,
    prompt_len: usize,
    context: usize,
) -> Option<StopReason> {
    let last = *tokens.last()?;
    let stopped = match &params.stop {
        None => eos.contains(&last),
        Some(Stop::Tokens(ids)) => ids.contains(&last),
        Some(Stop::Strings(strings)) => tokenizer
            .and_then(|t| t.decode(tokens).ok())
            .is_some_and(|text| strings.iter().any(|s| text.contains(s.as_str()))),
    };
    if stopped {
        Some(StopReason::Stop)
    } else if tokens.len() >= params.max_tokens || prompt_len + tokens.len() >= context {
        Some(StopReason::Length)
    } else {
        None
    }
}
