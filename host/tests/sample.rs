//! The sampling engine on the tiny shape: determinism whatever else is batched, immutable
//! policy versions, the prefix cache, agreement with the trainer's logprobs, stops, and bad
//! input.

#[path = "common/sampling.rs"]
mod sampling;

use std::sync::Arc;

use candle_core::{DType, Tensor};
use opentinker::lora::{AdapterRegistry, LoraConfig, PolicyVersion};
use opentinker::model::{Architecture, Model, ModelConfig};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::sample::{
    BackendError, BackendInput, BackendOutput, CpuSampler, EngineConfig, PolicyRef, PromptAsks,
    PromptTargets, Sample, SampleOutput, SampleRequest, SamplerBackend, SamplingEngine,
    SamplingParams, Stop, StopReason,
};
use opentinker::train::{AdamParams, Datum, Loss, TrainingEngine, WorkItem};
use sampling::run;

struct Setup {
    config: ModelConfig,
    registry: Arc<AdapterRegistry>,
    trainer: TrainingEngine,
}

/// A tiny Qwen3 model with two adapters, `a` (rank 4) and `b` (rank 16), trained a few steps so
/// that they differ from the base model.
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen3, 5).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let config = model.config.clone();
    let base = Arc::new(model.transformer);
    let registry = AdapterRegistry::new(Arc::clone(&base));
    let mut trainer = TrainingEngine::new(base, DType::F32);
    for (id, rank) in [("a", 4), ("b", 16)] {
        let lora = LoraConfig {
            rank,
            alpha: 2.0 * rank as f64,
            seed: rank as u64,
            ..LoraConfig::default()
        };
        trainer.add_adapter(id, lora).unwrap();
        train(&mut trainer, id, 3);
    }
    Setup {
        config,
        registry,
        trainer,
    }
}

fn train(trainer: &mut TrainingEngine, id: &str, steps: usize) {
    let tokens: Vec<u32> = (0..33).map(|i| (i * 11 + 7) % 500 + 3).collect();
    let item = WorkItem::new(
        id,
        vec![Datum {
            input_tokens: tokens[..32].to_vec(),
            target_tokens: tokens[1..].to_vec(),
            mask: vec![1.0; 32],
            ..Datum::default()
        }],
        Loss::CrossEntropy,
    );
    for _ in 0..steps {
        trainer
            .forward_backward(std::slice::from_ref(&item))
            .unwrap();
        let params = AdamParams {
            learning_rate: 0.02,
            ..AdamParams::default()
        };
        trainer.optim_step(id, &params).unwrap();
    }
}

fn publish(setup: &Setup, id: &str) -> Arc<PolicyVersion> {
    setup
        .registry
        .publish(id, setup.trainer.adapter(id).unwrap())
        .unwrap()
}

fn engine(setup: &Setup, prefix_cache: bool) -> SamplingEngine {
    SamplingEngine::new(
        Arc::clone(&setup.registry),
        None,
        setup.config.eos_token_ids.clone(),
        EngineConfig {
            kv_budget_positions: 64 * 128,
            prefix_cache_positions: if prefix_cache { 4096 } else { 0 },
        },
    )
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + seed * 17) % 500 + 3)
        .collect()
}

fn request(prompt: Vec<u32>, policy: Option<&Arc<PolicyVersion>>, seed: u64) -> SampleRequest {
    let mut request = SampleRequest::new(
        prompt,
        SamplingParams {
            max_tokens: 10,
            seed: Some(seed),
            stop: Some(Stop::Tokens(Vec::new())),
            ..SamplingParams::default()
        },
    );
    request.policy = policy.map(|p| PolicyRef {
        name: p.name.clone(),
        version: Some(p.version),
    });
    request
}

fn bits(samples: &[Sample]) -> Vec<(Vec<u32>, Vec<u32>)> {
    samples
        .iter()
        .map(|s| {
            (
                s.tokens.clone(),
                s.logprobs.iter().map(|l| l.to_bits()).collect(),
            )
        })
        .collect()
}

#[test]
fn a_request_samples_the_same_bits_whatever_else_is_batched() {
    let setup = setup();
    let (a, b) = (publish(&setup, "a"), publish(&setup, "b"));
    let mut probe = request(prompt(1, 9), Some(&a), 42);
    probe.params.num_samples = 2;
    let alone = run(&mut engine(&setup, false), vec![probe.clone()]);
    assert_eq!(alone[0].samples.len(), 2);
    assert_ne!(alone[0].samples[0].tokens, alone[0].samples[1].tokens);
    for batch in [1usize, 7, 64] {
        for prefix_cache in [false, true] {
            let mut engine = engine(&setup, prefix_cache);
            // A request that shares the probe's first tokens, run first, fills the prefix cache.
            let mut warm = prompt(1, 9);
            warm.truncate(6);
            warm.push(9);
            run(&mut engine, vec![request(warm, Some(&a), 1)]);
            let mut requests: Vec<SampleRequest> = (1..batch)
                .map(|i| {
                    let policy = [None, Some(&a), Some(&b)][i % 3];
                    request(prompt(i as u32 + 10, 3 + i % 17), policy, i as u64)
                })
                .collect();
            requests.insert(batch / 2, probe.clone());
            let outputs = run(&mut engine, requests);
            let mine = &outputs[batch / 2];
            assert_eq!(
                bits(&mine.samples),
                bits(&alone[0].samples),
                "batch {batch}, prefix cache {prefix_cache}"
            );
            assert_eq!(mine.cached_prompt_tokens, if prefix_cache { 6 } else { 0 });
        }
    }
}

/// Requests that open on one prompt under one policy in the same step (an RL group's first
/// turns) prefill it once: the first computes it, the others wait a step and take it from the
/// prefix cache, all together, and sample the bits they sample without the cache.
#[test]
fn repeats_of_a_prompt_in_one_step_prefill_it_once() {
    let setup = setup();
    let a = publish(&setup, "a");
    let shared = prompt(3, 20);
    let requests = vec![
        request(shared.clone(), Some(&a), 1),
        request(shared.clone(), Some(&a), 2),
        request(prompt(4, 20), Some(&a), 3),
        // The same tokens on the base model are another prefill.
        request(shared.clone(), None, 4),
        request(shared.clone(), Some(&a), 5),
        request(shared.clone(), Some(&a), 6),
    ];
    let plain = run(&mut engine(&setup, false), requests.clone());
    let cached = run(&mut engine(&setup, true), requests);
    for (i, (plain, cached)) in plain.iter().zip(&cached).enumerate() {
        assert_eq!(bits(&plain.samples), bits(&cached.samples), "request {i}");
    }
    let from_cache: Vec<usize> = cached.iter().map(|o| o.cached_prompt_tokens).collect();
    assert_eq!(from_cache, vec![0, 19, 0, 0, 19, 19]);
}

/// What a request asks of its prompt (the last n logprobs, named tokens' logprobs, alternative
/// draws) comes from the rows of its own prefill: the same bits alone, in a batch, and with
/// the prefix cache serving the rows no answer needs; and asking leaves the sample as it was.
#[test]
fn prompt_answers_are_the_same_whatever_else_is_batched_or_cached() {
    let setup = setup();
    let a = publish(&setup, "a");
    let text = prompt(1, 9);
    let mut scored = request(text.clone(), Some(&a), 42);
    scored.prompt_asks = PromptAsks {
        logprobs: true,
        top_k: 2,
        last_n: Some(3),
        ..PromptAsks::default()
    };
    let mut named = request(text.clone(), Some(&a), 42);
    named.prompt_asks = PromptAsks {
        targets: Some(PromptTargets {
            k: 2,
            cells: text[1..].iter().flat_map(|&t| [Some(t), None]).collect(),
        }),
        alt_k: 2,
        ..PromptAsks::default()
    };
    let mut everything = request(text.clone(), Some(&a), 42);
    everything.prompt_asks.logprobs = true;
    let alone: Vec<SampleOutput> = [everything, scored.clone(), named.clone()]
        .into_iter()
        .map(|r| run(&mut engine(&setup, false), vec![r]).remove(0))
        .collect();
    let full = alone[0].prompt.logprobs.as_ref().unwrap();
    let last = alone[1].prompt.logprobs.as_ref().unwrap();
    assert_eq!(&last[..6], &[None; 6]);
    assert_eq!(&last[6..], &full[6..]);
    let targets = &alone[2].prompt.targets.as_ref().unwrap().logprobs;
    for i in 0..8 {
        assert_eq!(targets[2 * i], full[i + 1].unwrap(), "position {}", i + 1);
        assert_eq!(targets[2 * i + 1], 0.0);
    }
    let alt = alone[2].prompt.alt.as_ref().unwrap();
    assert_eq!((alt.tokens.len(), alt.logprobs.len()), (16, 16));
    assert_eq!(bits(&alone[2].samples), bits(&alone[0].samples));
    for prefix_cache in [false, true] {
        let mut engine = engine(&setup, prefix_cache);
        // The same text run first fills the prefix cache.
        run(&mut engine, vec![request(text.clone(), Some(&a), 1)]);
        let mut requests: Vec<SampleRequest> = (1..9u32)
            .map(|i| request(prompt(i + 10, 3 + i as usize), None, u64::from(i)))
            .collect();
        requests.insert(3, scored.clone());
        requests.insert(6, named.clone());
        let outputs = run(&mut engine, requests);
        assert_eq!(
            outputs[3].prompt, alone[1].prompt,
            "prefix cache {prefix_cache}"
        );
        assert_eq!(
            outputs[6].prompt, alone[2].prompt,
            "prefix cache {prefix_cache}"
        );
        assert_eq!(bits(&outputs[6].samples), bits(&alone[2].samples));
        // Only the positions before the last n may come from the cache; named tokens need
        // every row.
        let cached = (
            outputs[3].cached_prompt_tokens,
            outputs[6].cached_prompt_tokens,
        );
        assert_eq!(cached, if prefix_cache { (5, 0) } else { (0, 0) });
    }
}

#[test]
fn a_version_samples_the_same_after_its_adapter_trains_on() {
    let mut setup = setup();
    let first = publish(&setup, "a");
    let probe = request(prompt(3, 7), Some(&first), 7);
    let before = run(&mut engine(&setup, false), vec![probe.clone()]);
    train(&mut setup.trainer, "a", 2);
    let second = publish(&setup, "a");
    let mut engine = engine(&setup, false);
    let again = run(&mut engine, vec![probe.clone()]);
    assert_eq!(bits(&again[0].samples), bits(&before[0].samples));
    assert_eq!(again[0].policy_version, Some(1));
    let newer = run(&mut engine, vec![request(prompt(3, 7), Some(&second), 7)]);
    assert_ne!(
        bits(&newer[0].samples),
        bits(&before[0].samples),
        "version 2 should sample from the trained weights"
    );
    drop(first);
    let err = engine.add_request(probe).unwrap_err().to_string();
    assert!(err.contains("no version 1"), "{err}");
}

/// The datum that scores every token of `prompt` then `sampled` after the first.
fn every_token_scored(prompt: &[u32], sampled: &[u32]) -> Datum {
    let tokens: Vec<u32> = prompt.iter().chain(sampled).copied().collect();
    let n = tokens.len() - 1;
    Datum {
        input_tokens: tokens[..n].to_vec(),
        target_tokens: tokens[1..].to_vec(),
        mask: vec![1.0; n],
        ..Datum::default()
    }
}

#[test]
fn sampler_logprobs_agree_with_the_trainer_forward() {
    let setup = setup();
    let b = publish(&setup, "b");
    for policy in [None, Some(&b)] {
        let mut ask = request(prompt(4, 11), policy, 3);
        ask.params.max_tokens = 20;
        ask.prompt_asks.logprobs = true;
        let output = run(&mut engine(&setup, false), vec![ask.clone()]).remove(0);
        let sample = &output.samples[0];
        let datum = every_token_scored(&ask.prompt, &sample.tokens);
        let trainer_logprobs = match policy {
            Some(_) => {
                let item = WorkItem::new("b", vec![datum], Loss::CrossEntropy);
                setup
                    .trainer
                    .forward(&[item])
                    .unwrap()
                    .remove(0)
                    .logprobs
                    .remove(0)
            }
            None => {
                let model = setup.registry.base();
                let input = Tensor::new(&datum.input_tokens[..], &candle_core::Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let targets = Tensor::new(&datum.target_tokens[..], &candle_core::Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let logits = model.forward(&input).unwrap();
                opentinker::model::target_logprobs(&logits, &targets)
                    .unwrap()
                    .squeeze(0)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            }
        };
        let prompt_len = ask.prompt.len();
        for (i, &sampled) in sample.logprobs.iter().enumerate() {
            let trained = trainer_logprobs[prompt_len - 1 + i];
            assert!(
                (sampled - trained).abs() < 1e-4,
                "token {i}: sampler {sampled} vs trainer {trained}"
            );
        }
        let prompt_logprobs = output.prompt.logprobs.unwrap();
        assert_eq!(prompt_logprobs[0], None);
        for (i, lp) in prompt_logprobs.iter().enumerate().skip(1) {
            assert!((lp.unwrap() - trainer_logprobs[i - 1]).abs() < 1e-4);
        }
    }
}

#[test]
fn tempered_sampler_logprobs_agree_with_the_trainer_at_the_same_temperature() {
    let setup = setup();
    let b = publish(&setup, "b");
    let mut ask = request(prompt(4, 11), Some(&b), 5);
    ask.params.max_tokens = 20;
    ask.params.temperature = 0.6;
    let output = run(&mut engine(&setup, false), vec![ask.clone()]).remove(0);
    let sample = &output.samples[0];
    let datum = every_token_scored(&ask.prompt, &sample.tokens);
    let trained_at = |temperature: f64| {
        let item =
            WorkItem::new("b", vec![datum.clone()], Loss::CrossEntropy).at_temperature(temperature);
        setup
            .trainer
            .forward(&[item])
            .unwrap()
            .remove(0)
            .logprobs
            .remove(0)
    };
    let (tempered, untempered) = (trained_at(0.6), trained_at(1.0));
    let sampled = &tempered[ask.prompt.len() - 1..];
    let mut moved = 0.0f32;
    for (i, (&drawn, (&trained, &plain))) in sample
        .logprobs
        .iter()
        .zip(sampled.iter().zip(&untempered[ask.prompt.len() - 1..]))
        .enumerate()
    {
        assert!(
            (drawn - trained).abs() < 1e-4,
            "token {i}: sampler {drawn} vs trainer at 0.6 {trained}"
        );
        moved = moved.max((trained - plain).abs());
    }
    assert!(moved > 1e-2, "the temperature changed no logprob ({moved})");
    let refused = setup
        .trainer
        .forward(&[WorkItem::new("b", vec![datum], Loss::CrossEntropy).at_temperature(0.0)]);
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("temperature"), "{message}");
}

#[test]
fn the_next_turn_reuses_the_kv_of_the_turn_before() {
    let setup = setup();
    let a = publish(&setup, "a");
    let mut cached_engine = engine(&setup, true);
    let first = run(
        &mut cached_engine,
        vec![request(prompt(5, 12), Some(&a), 1)],
    )
    .remove(0);
    let mut next_turn = prompt(5, 12);
    next_turn.extend(&first.samples[0].tokens);
    next_turn.extend(prompt(6, 5));
    let second = run(
        &mut cached_engine,
        vec![request(next_turn.clone(), Some(&a), 2)],
    )
    .remove(0);
    // The first turn's cache holds its prompt and every sampled token but the last.
    assert_eq!(
        second.cached_prompt_tokens,
        12 + first.samples[0].tokens.len() - 1
    );
    let uncached = run(
        &mut engine(&setup, false),
        vec![request(next_turn, Some(&a), 2)],
    )
    .remove(0);
    assert_eq!(bits(&second.samples), bits(&uncached.samples));
}

#[test]
fn stops_and_lengths_follow_the_request() {
    let setup = setup();
    let mut engine = engine(&setup, false);
    let greedy = |stop| {
        let mut r = request(prompt(8, 6), None, 0);
        r.params.temperature = 0.0;
        r.params.max_tokens = 8;
        r.params.stop = stop;
        r
    };
    let free = run(&mut engine, vec![greedy(Some(Stop::Tokens(Vec::new())))]).remove(0);
    let sample = &free.samples[0];
    assert_eq!(sample.tokens.len(), 8);
    assert_eq!(sample.stop_reason, StopReason::Length);
    // Stopping at the third greedy token: the stop token ends the sample.
    let third = sample.tokens[2];
    let stopped = run(&mut engine, vec![greedy(Some(Stop::Tokens(vec![third])))]).remove(0);
    let first_stop = sample.tokens.iter().position(|&t| t == third).unwrap();
    assert_eq!(
        stopped.samples[0].tokens,
        sample.tokens[..=first_stop].to_vec()
    );
    assert_eq!(stopped.samples[0].stop_reason, StopReason::Stop);
}

#[test]
fn bad_requests_are_refused_by_name_and_change_nothing() {
    let setup = setup();
    let a = publish(&setup, "a");
    let mut engine = engine(&setup, false);
    let refuse = |engine: &mut SamplingEngine, r: SampleRequest, words: &str| {
        let err = engine.add_request(r).unwrap_err().to_string();
        assert!(err.contains(words), "{err} lacks {words}");
    };
    refuse(&mut engine, request(vec![3, 9999], None, 0), "9999");
    refuse(
        &mut engine,
        request(vec![3; 40_000], None, 0),
        "context holds 32768",
    );
    refuse(&mut engine, request(vec![], None, 0), "empty");
    let mut unknown = request(prompt(1, 4), None, 0);
    unknown.policy = Some(PolicyRef {
        name: "nobody".into(),
        version: None,
    });
    refuse(&mut engine, unknown, "nobody");
    let mut version = request(prompt(1, 4), Some(&a), 0);
    version.policy.as_mut().unwrap().version = Some(9);
    refuse(&mut engine, version, "no version 9");
    let asking = |asks: PromptAsks| {
        let mut r = request(prompt(1, 4), None, 0);
        r.prompt_asks = asks;
        r
    };
    let last_n = |n| PromptAsks {
        logprobs: true,
        last_n: Some(n),
        ..PromptAsks::default()
    };
    refuse(&mut engine, asking(last_n(0)), "between 1 and 3");
    refuse(&mut engine, asking(last_n(4)), "between 1 and 3");
    let targets = |k, cells: Vec<Option<u32>>| PromptAsks {
        targets: Some(PromptTargets { k, cells }),
        ..PromptAsks::default()
    };
    refuse(&mut engine, asking(targets(2, vec![Some(3); 4])), "[3, K]");
    refuse(
        &mut engine,
        asking(targets(1, vec![Some(3), None, Some(99_999)])),
        "99999",
    );
    for (temperature, top_p) in [(f64::NAN, 1.0), (-0.5, 1.0), (1.0, 0.0), (1.0, 1.5)] {
        let mut r = request(prompt(1, 4), None, 0);
        r.params.temperature = temperature;
        r.params.top_p = top_p;
        refuse(
            &mut engine,
            r,
            if top_p == 1.0 { "temperature" } else { "top_p" },
        );
    }
    assert!(!engine.has_work());
    let fine = run(&mut engine, vec![request(prompt(1, 4), Some(&a), 0)]);
    assert_eq!(fine[0].samples[0].tokens.len(), 10);
}

#[test]
fn requests_beyond_the_kv_budget_wait_and_can_be_aborted() {
    let setup = setup();
    // Room for one request of 6 prompt + 10 new tokens at a time.
    let mut engine = SamplingEngine::new(
        Arc::clone(&setup.registry),
        None,
        setup.config.eos_token_ids.clone(),
        EngineConfig {
            kv_budget_positions: 20,
            prefix_cache_positions: 0,
        },
    );
    let first = engine.add_request(request(prompt(1, 6), None, 1)).unwrap();
    let second = engine.add_request(request(prompt(2, 6), None, 2)).unwrap();
    let third = engine.add_request(request(prompt(3, 6), None, 3)).unwrap();
    engine.decode_step().unwrap();
    assert_eq!(engine.load(), (2, 1), "one request runs, two wait");
    assert!(engine.abort(third));
    assert!(!engine.abort(third), "aborting twice finds nothing");
    let mut finished = Vec::new();
    while engine.has_work() {
        finished.extend(engine.decode_step().unwrap());
    }
    let ids: Vec<u64> = finished.iter().map(|o| o.id).collect();
    assert_eq!(ids, vec![first, second]);
    // Waiting changed nothing about what the second request samples.
    let alone = run(
        &mut self::engine(&setup, false),
        vec![request(prompt(2, 6), None, 2)],
    );
    assert_eq!(bits(&finished[1].samples), bits(&alone[0].samples));
    let too_big = request(prompt(4, 15), None, 4);
    let err = engine.add_request(too_big).unwrap_err().to_string();
    assert!(err.contains("budget is 20"), "{err}");
}

#[test]
fn stop_strings_end_a_sample_and_top_prompt_logprobs_are_ranked() {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen2, 9).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let tokenizer = Arc::new(model.tokenizer);
    let registry = AdapterRegistry::new(Arc::new(model.transformer));
    let mut engine = SamplingEngine::new(
        Arc::clone(&registry),
        Some(Arc::clone(&tokenizer)),
        Vec::new(),
        EngineConfig {
            kv_budget_positions: 4096,
            prefix_cache_positions: 0,
        },
    );
    let prompt_tokens = tokenizer.encode("The answer is").unwrap();
    let mut free = SampleRequest::new(
        prompt_tokens.clone(),
        SamplingParams {
            max_tokens: 12,
            temperature: 0.0,
            stop: Some(Stop::Tokens(Vec::new())),
            ..SamplingParams::default()
        },
    );
    free.prompt_asks.top_k = 3;
    free.prompt_asks.logprobs = true;
    let output = run(&mut engine, vec![free.clone()]).remove(0);
    // Stop at the text of the greedy sample's third token.
    let tokens = &output.samples[0].tokens;
    let third = tokenizer.decode(&tokens[2..3]).unwrap();
    assert!(!third.is_empty());
    let mut stopping = free.clone();
    stopping.params.stop = Some(Stop::Strings(vec![third.clone()]));
    let stopped = run(&mut engine, vec![stopping]).remove(0);
    let sample = &stopped.samples[0];
    assert_eq!(sample.stop_reason, StopReason::Stop);
    assert!(tokenizer.decode(&sample.tokens).unwrap().contains(&third));
    assert!(sample.tokens.len() <= 3 && tokens.starts_with(&sample.tokens));

    let top = output.prompt.top.unwrap();
    let prompt_logprobs = output.prompt.logprobs.unwrap();
    assert_eq!(top.len(), prompt_tokens.len());
    assert!(top[0].is_none());
    for (i, position) in top.iter().enumerate().skip(1) {
        let position = position.as_ref().unwrap();
        assert_eq!(position.len(), 3);
        assert!(
            position.windows(2).all(|w| w[0].1 >= w[1].1),
            "{position:?}"
        );
        let actual = prompt_logprobs[i].unwrap();
        assert!(actual <= position[0].1);
        if let Some((_, lp)) = position.iter().find(|(t, _)| *t == prompt_tokens[i]) {
            assert_eq!(*lp, actual);
        }
    }
}

/// The CPU backend holding one adapter version at a time (as a device's slots hold a few), and
/// counting the most versions one forward call ran.
struct OneSlot {
    cpu: CpuSampler,
    most: std::cell::Cell<usize>,
}

impl SamplerBackend for OneSlot {
    type Cache = <CpuSampler as SamplerBackend>::Cache;

    fn max_policies(&self) -> Option<usize> {
        Some(1)
    }

    fn empty_cache(&mut self) -> Self::Cache {
        self.cpu.empty_cache()
    }

    fn cache_len(cache: &Self::Cache) -> usize {
        CpuSampler::cache_len(cache)
    }

    fn fork(&mut self, cache: &Self::Cache, len: usize) -> Result<Self::Cache, BackendError> {
        self.cpu.fork(cache, len)
    }

    fn forward(
        &mut self,
        base: &opentinker::model::Transformer,
        inputs: &mut [BackendInput<'_, Self::Cache>],
    ) -> Result<Vec<BackendOutput>, BackendError> {
        let mut versions: Vec<(String, u64)> = inputs
            .iter()
            .filter_map(|input| input.policy.map(|p| (p.name.clone(), p.version)))
            .collect();
        versions.sort();
        versions.dedup();
        self.most.set(self.most.get().max(versions.len()));
        self.cpu.forward(base, inputs)
    }
}

/// A backend that holds only so many adapter versions at once gets no call with more: a
/// request of another version waits until one finishes (the base model takes no slot), and
/// every request samples what it samples on a backend without the limit.
#[test]
fn requests_wait_for_a_backend_adapter_slot_and_sample_the_same() {
    let setup = setup();
    let (a, b) = (publish(&setup, "a"), publish(&setup, "b"));
    let requests = || {
        vec![
            request(prompt(1, 12), Some(&a), 1),
            request(prompt(2, 9), None, 2),
            request(prompt(3, 14), Some(&b), 3),
            request(prompt(4, 7), Some(&a), 4),
        ]
    };
    let want = run(&mut engine(&setup, false), requests());
    let backend = OneSlot {
        cpu: CpuSampler::new(&setup.config),
        most: std::cell::Cell::new(0),
    };
    let mut limited = SamplingEngine::with_backend(
        backend,
        Arc::clone(&setup.registry),
        None,
        setup.config.eos_token_ids.clone(),
        EngineConfig {
            kv_budget_positions: 64 * 128,
            prefix_cache_positions: 0,
        },
    );
    let got = run(&mut limited, requests());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(bits(&g.samples), bits(&w.samples));
    }
    assert_eq!(
        limited.backend().most.get(),
        1,
        "one version per call at most"
    );
}

/// A request whose asker has gone (a streamed answer's client that hung up drops the future
/// waiting for it) is aborted by the sampling loop at its next step: no more of its tokens are
/// sampled, and its slots and KV are free for others.
#[test]
fn a_request_whose_asker_has_gone_is_aborted_by_the_sampling_loop() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    let setup = setup();
    let (service, _thread) = opentinker::service::SamplerService::start(engine(&setup, false));
    let sampled = Arc::new(AtomicUsize::new(0));
    let mut asked = request(prompt(1, 8), None, 1);
    asked.params.max_tokens = 4000;
    let counter = Arc::clone(&sampled);
    asked.tokens = Some(opentinker::sample::TokenSink::new(move |_, _, _| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let started = async {
            while sampled.load(Ordering::SeqCst) < 5 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            _ = service.sample(asked) => panic!("4000 tokens sampled before the asker left"),
            () = started => {}
        }
    });
    // The future waiting for the answer is dropped: the asker has gone.
    std::thread::sleep(Duration::from_millis(300));
    let after_leaving = sampled.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    let later = sampled.load(Ordering::SeqCst);
    assert_eq!(
        after_leaving, later,
        "tokens were still sampled for a request nobody waits for"
    );
    assert!(later < 4000, "{later}");
}
