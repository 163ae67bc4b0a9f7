//! The training engine on the tiny shape: gradients against finite differences in f64 through
//! the production path, adapter isolation in mixed batches, per-adapter steps and NaN handling,
//! and objectives computed outside the engine (plugins) in the same fused pass.

#[path = "common/plugin_build.rs"]
mod plugin_build;

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Tensor};
use opentinker::lora::LoraConfig;
use opentinker::model::{Architecture, Model, Transformer};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::plugin::{CallError, ErrorKind, HostConfig, Limits, Plugin, PluginHost};
use opentinker::service::{FairShare, PluginObjective, TrainerService};
use opentinker::train::{
    AdamParams, Datum, ExternalObjective, Loss, Objective, ObjectiveError, ObjectiveInput,
    ObjectiveLoss, StepReport, TrainError, TrainingEngine, WorkItem,
};

fn tiny_transformer(arch: Architecture) -> Transformer {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, arch, 11).unwrap();
    Model::load(dir.path()).unwrap().transformer
}

fn lora(rank: usize, seed: u64) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        seed,
        ..LoraConfig::default()
    }
}

/// A datum of `n` tokens: the first half context (mask 0), the rest actions.
fn datum(seed: u32, n: usize, rl: bool) -> Datum {
    let tokens: Vec<u32> = (0..=n as u32)
        .map(|i| (i * 37 + seed * 101) % 500 + 3)
        .collect();
    let mask: Vec<f32> = (0..n).map(|i| if i < n / 2 { 0.0 } else { 1.0 }).collect();
    Datum {
        input_tokens: tokens[..n].to_vec(),
        target_tokens: tokens[1..].to_vec(),
        mask,
        weights: None,
        advantages: rl.then(|| {
            (0..n)
                .map(|i| ((i as f32 + seed as f32) * 0.7).sin())
                .collect()
        }),
        sampler_logprobs: rl.then(|| {
            (0..n)
                .map(|i| -6.3 + 0.05 * ((i + seed as usize) % 5) as f32)
                .collect()
        }),
        ratio_mask: None,
        inputs: Default::default(),
    }
}

fn item(adapter: &str, loss: Loss, seeds: &[u32], n: usize) -> WorkItem {
    let rl = loss != Loss::CrossEntropy;
    WorkItem::new(
        adapter,
        seeds.iter().map(|&s| datum(s, n, rl)).collect(),
        loss,
    )
}

fn config(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn all_losses() -> Vec<Loss> {
    vec![
        Loss::from_config("cross_entropy", &config(&[])).unwrap(),
        Loss::from_config("importance_sampling", &config(&[])).unwrap(),
        Loss::from_config("ppo", &config(&[])).unwrap(),
        Loss::from_config("cispo", &config(&[])).unwrap(),
        Loss::from_config("dro", &config(&[("beta", 0.5)])).unwrap(),
    ]
}

/// Move every adapter off its zero-`B` start, so that every tensor has a gradient.
fn warm_up(engine: &mut TrainingEngine, ids: &[&str]) {
    for id in ids {
        engine
            .forward_backward(&[item(id, Loss::CrossEntropy, &[9], 12)])
            .unwrap();
        let params = AdamParams {
            learning_rate: 0.05,
            ..AdamParams::default()
        };
        // The report says how far the step moved the adapter, and its size before the step
        // (here B starts at zero and a first Adam step at this rate moves it further than that).
        match engine.optim_step(id, &params).unwrap() {
            StepReport::Updated {
                update_norm,
                weight_norm,
                ..
            } => assert!(
                update_norm > 0.0 && update_norm.is_finite() && weight_norm > 0.0,
                "{update_norm} of {weight_norm}"
            ),
            other => panic!("{other:?}"),
        }
    }
}

/// Every gradient of `id` in `got` is non-zero and within `tolerance` (relative, L2) of `want`'s.
fn assert_same_gradients(
    got: &TrainingEngine,
    want: &TrainingEngine,
    id: &str,
    tolerance: f64,
    what: &str,
) {
    let (got, want) = (
        got.gradients(id).unwrap().unwrap(),
        want.gradients(id).unwrap().unwrap(),
    );
    for (name, g) in &got {
        let (difference, norm) = (l2(&(g - &want[name]).unwrap()), l2(g));
        assert!(norm > 0.0, "{what}: {name} has a zero gradient");
        assert!(
            difference <= tolerance * norm,
            "{what} {name}: {difference} of {norm}"
        );
    }
}

fn l2(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
        .sqrt()
}

/// For every loss, the gradient of a few entries of A and B of two layers against central
/// differences of the loss that `forward` computes, in f64.
#[test]
fn gradients_match_finite_differences_in_f64_for_every_loss() {
    let model = Arc::new(
        tiny_transformer(Architecture::Qwen3)
            .to_dtype(DType::F64)
            .unwrap(),
    );
    let mut engine = TrainingEngine::new(model, DType::F64);
    engine.add_adapter("a", lora(4, 1)).unwrap();
    warm_up(&mut engine, &["a"]);
    for loss in all_losses() {
        let work = [item("a", loss.clone(), &[1, 2], 10)];
        engine.discard_gradients("a").unwrap();
        engine.forward_backward(&work).unwrap();
        let gradients = engine.gradients("a").unwrap().unwrap();
        let adapter = engine.adapter("a").unwrap().clone();
        let named = adapter.named_tensors();
        for (name, var) in named.iter().filter(|(n, _)| {
            n.contains("layers.0.self_attn.q_proj") || n.contains("layers.3.mlp.down_proj")
        }) {
            let original = var
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let analytic = gradients[name]
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            for index in [0, original.len() / 3, original.len() - 1] {
                let at = |delta: f64| {
                    let mut values = original.clone();
                    values[index] += delta;
                    var.set(
                        &Tensor::from_vec(
                            values,
                            var.as_tensor().shape(),
                            &candle_core::Device::Cpu,
                        )
                        .unwrap(),
                    )
                    .unwrap();
                    let value = engine.forward(&work).unwrap()[0].loss;
                    var.set(
                        &Tensor::from_vec(
                            original.clone(),
                            var.as_tensor().shape(),
                            &candle_core::Device::Cpu,
                        )
                        .unwrap(),
                    )
                    .unwrap();
                    value
                };
                let eps = 1e-5;
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                let expected = if matches!(loss, Loss::Cispo { .. }) {
                    None
                } else {
                    Some(numeric)
                };
                if let Some(expected) = expected {
                    assert!(
                        (analytic[index] - expected).abs() <= 1e-6 * (1.0 + expected.abs()),
                        "{loss:?} {name}[{index}]: analytic {} vs numeric {expected}",
                        analytic[index]
                    );
                }
            }
        }
    }
}

#[test]
fn mixed_batches_give_each_adapter_the_gradient_of_its_own_items() {
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let mut engine = TrainingEngine::new(model, DType::F32);
    engine.add_adapter("rank4", lora(4, 1)).unwrap();
    engine.add_adapter("rank16", lora(16, 2)).unwrap();
    warm_up(&mut engine, &["rank4", "rank16"]);
    let ppo = Loss::from_config("ppo", &config(&[])).unwrap();
    let item4 = item("rank4", Loss::CrossEntropy, &[1, 2, 3], 14);
    let item16 = item("rank16", ppo, &[4, 5], 9);

    engine
        .forward_backward(std::slice::from_ref(&item4))
        .unwrap();
    let alone4 = engine.gradients("rank4").unwrap().unwrap();
    engine.discard_gradients("rank4").unwrap();
    engine
        .forward_backward(std::slice::from_ref(&item16))
        .unwrap();
    let alone16 = engine.gradients("rank16").unwrap().unwrap();
    engine.discard_gradients("rank16").unwrap();

    let outputs = engine
        .forward_backward(&[item16.clone(), item4.clone()])
        .unwrap();
    assert_eq!(outputs[0].logprobs.len(), 2);
    assert_eq!(outputs[1].logprobs.len(), 3);
    assert_eq!(outputs[1].logprobs[0].len(), 14);
    // Half of each datum is context: 7 of 14 tokens count, in 3 datums.
    assert_eq!(outputs[1].metrics["tokens:sum"], 21.0);
    assert_eq!(outputs[1].metrics["loss:sum"], outputs[1].loss);
    for (alone, id) in [(alone4, "rank4"), (alone16, "rank16")] {
        let mixed = engine.gradients(id).unwrap().unwrap();
        assert_eq!(alone.len(), mixed.len());
        for (name, g) in &alone {
            let difference = l2(&(g - &mixed[name]).unwrap());
            let norm = l2(g);
            assert!(norm > 0.0, "{id} {name} has a zero gradient");
            assert!(
                difference <= 1e-5 * norm,
                "{id} {name}: |mixed - alone| = {difference}, |alone| = {norm}"
            );
        }
    }
}

fn snapshot(engine: &TrainingEngine, id: &str) -> Vec<Vec<f32>> {
    let mut values: Vec<Vec<f32>> = engine
        .adapter(id)
        .unwrap()
        .named_tensors()
        .iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect();
    if let Some(gradients) = engine.gradients(id).unwrap() {
        values.extend(
            gradients
                .values()
                .map(|g| g.flatten_all().unwrap().to_vec1::<f32>().unwrap()),
        );
    }
    let (step, moments) = engine.optimizer_state(id).unwrap().unwrap();
    values.push(vec![step as f32]);
    for (m, v) in moments.values() {
        values.push(m.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        values.push(v.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    values
}

#[test]
fn a_step_touches_only_its_adapter_and_a_nan_skips_only_that_adapter() {
    let model = Arc::new(tiny_transformer(Architecture::Llama));
    let mut engine = TrainingEngine::new(model, DType::F32);
    engine.add_adapter("a", lora(4, 1)).unwrap();
    engine.add_adapter("b", lora(8, 2)).unwrap();
    warm_up(&mut engine, &["a", "b"]);
    let is = Loss::from_config("importance_sampling", &config(&[])).unwrap();
    engine
        .forward_backward(&[
            item("a", is.clone(), &[1], 8),
            item("b", is.clone(), &[2], 8),
        ])
        .unwrap();
    let b_before = snapshot(&engine, "b");
    let a_before = snapshot(&engine, "a");
    assert!(matches!(
        engine.optim_step("a", &AdamParams::default()).unwrap(),
        StepReport::Updated { step: 2, .. }
    ));
    assert_eq!(snapshot(&engine, "b"), b_before, "stepping a changed b");
    assert_ne!(snapshot(&engine, "a"), a_before);

    // A NaN advantage in a's item: a's update is skipped, b trains on.
    let mut poisoned = item("a", is.clone(), &[3], 8);
    poisoned.datums[0].advantages.as_mut().unwrap()[6] = f32::NAN;
    let outputs = engine
        .forward_backward(&[poisoned, item("b", is, &[4], 8)])
        .unwrap();
    assert!(outputs[0].loss.is_nan() && outputs[1].loss.is_finite());
    let a_weights = snapshot(&engine, "a");
    assert_eq!(
        engine.optim_step("a", &AdamParams::default()).unwrap(),
        StepReport::SkippedNonFinite
    );
    let after: Vec<Vec<f32>> = snapshot(&engine, "a");
    // Weights, step and moments unchanged; only the dropped gradients differ.
    let tensors = engine.adapter("a").unwrap().named_tensors().len();
    assert_eq!(&after[..tensors], &a_weights[..tensors]);
    assert_eq!(&after[tensors..], &a_weights[2 * tensors..]);
    let report = engine.optim_step("b", &AdamParams::default()).unwrap();
    assert!(
        matches!(report, StepReport::Updated { step: 2, .. }),
        "{report:?}"
    );
}

#[test]
fn bad_datums_and_unknown_adapters_are_named() {
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let mut engine = TrainingEngine::new(model, DType::F32);
    engine.add_adapter("a", lora(4, 1)).unwrap();
    let mut bad = item("a", Loss::CrossEntropy, &[1], 6);
    bad.datums[0].target_tokens[2] = 10_000;
    let err = engine.forward_backward(&[bad]).unwrap_err().to_string();
    assert!(err.contains("10000") && err.contains("vocabulary"), "{err}");
    let mut short = item("a", Loss::CrossEntropy, &[1], 6);
    short.datums[0].mask.pop();
    let err = engine.forward(&[short]).unwrap_err().to_string();
    assert!(err.contains("mask has 5 entries for 6"), "{err}");
    let err = engine
        .forward(&[item("nobody", Loss::CrossEntropy, &[1], 6)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("nobody"), "{err}");
    assert!(
        engine
            .add_adapter("a", lora(4, 1))
            .unwrap_err()
            .to_string()
            .contains("exists")
    );
}

/// A call over more tokens than one pass of the engine holds (here about two datums: the
/// bound is set low) runs in passes of whole datums: each item's logprobs, loss and metrics
/// and each adapter's gradients are those of one pass, for LoRA adapters of two losses in one
/// call and for full-parameter training. A bad datum in a later pass refuses the call before
/// any pass has added gradients.
#[test]
fn a_call_larger_than_a_pass_runs_in_passes_with_the_outputs_and_gradients_of_one() {
    use opentinker::model::layers::train_values_per_token;
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let per_token = train_values_per_token(&model.config, true) * 4;
    let engines = || {
        let mut whole = TrainingEngine::new(Arc::clone(&model), DType::F32);
        let mut split =
            TrainingEngine::new(Arc::clone(&model), DType::F32).with_pass_bytes(per_token * 30);
        for engine in [&mut whole, &mut split] {
            engine.add_adapter("a", lora(4, 1)).unwrap();
            engine.add_adapter("b", lora(8, 2)).unwrap();
            warm_up(engine, &["a", "b"]);
        }
        (whole, split)
    };
    let ppo = Loss::from_config("ppo", &config(&[])).unwrap();
    let work = [
        item("a", Loss::CrossEntropy, &[1, 2, 3], 14),
        item("b", ppo, &[4, 5, 6, 7], 9),
        item("a", Loss::ImportanceSampling, &[8], 12),
    ];
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-5 * (1.0 + x.abs());
    let (mut whole, mut split) = engines();
    let tokens: usize = work
        .iter()
        .flat_map(|i| &i.datums)
        .map(|d| d.input_tokens.len())
        .sum();
    assert!(
        whole.pass_tokens(&work) >= tokens,
        "the default pass holds the call"
    );
    assert!(
        (14..tokens / 2).contains(&split.pass_tokens(&work)),
        "{}",
        split.pass_tokens(&work)
    );
    let one = whole.forward_backward(&work).unwrap();
    let passes = split.forward_backward(&work).unwrap();
    assert_eq!(split.forward(&work).unwrap().len(), work.len());
    for (one, passes) in one.iter().zip(&passes) {
        assert!(
            close(one.loss, passes.loss),
            "{} vs {}",
            one.loss,
            passes.loss
        );
        assert_eq!(one.logprobs.len(), passes.logprobs.len());
        for (x, y) in one
            .logprobs
            .iter()
            .flatten()
            .zip(passes.logprobs.iter().flatten())
        {
            assert!(close(f64::from(*x), f64::from(*y)), "{x} vs {y}");
        }
        assert_eq!(
            one.metrics.keys().collect::<Vec<_>>(),
            passes.metrics.keys().collect::<Vec<_>>()
        );
        for (name, value) in &one.metrics {
            assert!(
                close(*value, passes.metrics[name]),
                "{name}: {value} vs {}",
                passes.metrics[name]
            );
        }
    }
    for id in ["a", "b"] {
        assert_same_gradients(&whole, &split, id, 1e-5, id);
    }

    let mut bad = work.clone();
    bad[2].datums[0].target_tokens[1] = 10_000;
    let before = split.gradients("a").unwrap().unwrap();
    let err = split.forward_backward(&bad).unwrap_err().to_string();
    assert!(
        err.contains("work item 2") && err.contains("10000"),
        "{err}"
    );
    for (name, g) in split.gradients("a").unwrap().unwrap() {
        assert_eq!(l2(&(&g - &before[&name]).unwrap()), 0.0, "{name} moved");
    }

    let full = opentinker::train::FULL_PARAMETERS;
    let work = [item(full, Loss::CrossEntropy, &[1, 2, 3, 4, 5], 12)];
    let mut whole =
        TrainingEngine::full_parameters(tiny_transformer(Architecture::Qwen2), DType::F32).unwrap();
    let mut split =
        TrainingEngine::full_parameters(tiny_transformer(Architecture::Qwen2), DType::F32)
            .unwrap()
            .with_pass_bytes(per_token * 30);
    let (one, passes) = (
        whole.forward_backward(&work).unwrap(),
        split.forward_backward(&work).unwrap(),
    );
    assert!(
        close(one[0].loss, passes[0].loss),
        "{} vs {}",
        one[0].loss,
        passes[0].loss
    );
    let (one, passes) = (
        whole.gradients(full).unwrap().unwrap(),
        split.gradients(full).unwrap().unwrap(),
    );
    for (name, g) in &one {
        let (difference, norm) = (l2(&(g - &passes[name]).unwrap()), l2(g));
        assert!(
            difference <= 1e-5 * norm.max(1e-12),
            "{name}: {difference} of {norm}"
        );
    }
}

/// An RL group: `replies` datums that repeat one prompt (mask 0 but in the second) and differ
/// after it.
fn group(prompt: usize, replies: &[usize]) -> Vec<Datum> {
    replies
        .iter()
        .enumerate()
        .map(|(r, &len)| {
            let mut d = datum(7, prompt + len, true);
            for (i, token) in d.input_tokens.iter_mut().enumerate().skip(prompt) {
                *token = (i as u32 * 13 + r as u32 * 29) % 500 + 3;
            }
            let next = d.input_tokens[1..].to_vec();
            d.target_tokens[..next.len()].copy_from_slice(&next);
            *d.target_tokens.last_mut().unwrap() = 5 + r as u32;
            // The second reply trains on its prompt too: the shared rows get its gradient.
            for (i, m) in d.mask.iter_mut().enumerate() {
                *m = if i + 1 < prompt && r != 1 { 0.0 } else { 1.0 };
            }
            d
        })
        .collect()
}

/// The datums of an RL group share their prompt: a pass computes its rows once. The outputs
/// and the gradients are those of each datum trained on its own (where nothing is shared), for
/// the built-in losses, on the model kinds with and without per-head norms and sliding windows,
/// and in full-parameter training.
#[test]
fn a_groups_shared_prompt_trains_once_with_the_results_of_its_datums_one_by_one() {
    let close = |x: f64, y: f64| (x - y).abs() <= 2e-5 * (1.0 + x.abs());
    let datums = group(21, &[1, 6, 9, 3]);
    let losses = [
        Loss::CrossEntropy,
        Loss::ImportanceSampling,
        Loss::from_config("ppo", &config(&[])).unwrap(),
    ];
    for arch in [
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
    ] {
        let model = Arc::new(tiny_transformer(arch));
        for loss in &losses {
            let engine = || {
                let mut engine = TrainingEngine::new(Arc::clone(&model), DType::F32);
                engine.add_adapter("a", lora(4, 1)).unwrap();
                warm_up(&mut engine, &["a"]);
                engine
            };
            let (mut together, mut alone) = (engine(), engine());
            let grouped = together
                .forward_backward(&[WorkItem::new("a", datums.clone(), loss.clone())])
                .unwrap();
            let mut loss_alone = 0.0;
            for (datum, logprobs) in datums.iter().zip(&grouped[0].logprobs) {
                let one = alone
                    .forward_backward(&[WorkItem::new("a", vec![datum.clone()], loss.clone())])
                    .unwrap();
                loss_alone += one[0].loss;
                for (x, y) in logprobs.iter().zip(&one[0].logprobs[0]) {
                    assert!(close(f64::from(*x), f64::from(*y)), "{arch:?}: {x} vs {y}");
                }
            }
            assert!(
                close(grouped[0].loss, loss_alone),
                "{arch:?} {loss:?}: {} vs {loss_alone}",
                grouped[0].loss
            );
            assert_same_gradients(&together, &alone, "a", 2e-5, &format!("{arch:?} {loss:?}"));
        }
    }

    let full = opentinker::train::FULL_PARAMETERS;
    let engine = || {
        TrainingEngine::full_parameters(tiny_transformer(Architecture::Qwen3), DType::F32).unwrap()
    };
    let (mut together, mut alone) = (engine(), engine());
    together
        .forward_backward(&[WorkItem::new(
            full,
            datums.clone(),
            Loss::ImportanceSampling,
        )])
        .unwrap();
    for datum in &datums {
        alone
            .forward_backward(&[WorkItem::new(
                full,
                vec![datum.clone()],
                Loss::ImportanceSampling,
            )])
            .unwrap();
    }
    let (one, each) = (
        together.gradients(full).unwrap().unwrap(),
        alone.gradients(full).unwrap().unwrap(),
    );
    for (name, g) in &one {
        let (difference, norm) = (l2(&(g - &each[name]).unwrap()), l2(g));
        assert!(
            difference <= 2e-5 * norm.max(1e-12),
            "{name}: {difference} of {norm}"
        );
    }
}

/// Full-parameter training: every weight (embeddings, norms, projections) gets a gradient that
/// matches central differences in f64, the loss falls over a few steps, a snapshot of the model
/// does not move when training goes on, and the engine holds no adapters.
#[test]
fn full_parameter_training_trains_every_weight_with_the_right_gradient() {
    let model = tiny_transformer(Architecture::Qwen3)
        .to_dtype(DType::F64)
        .unwrap();
    let weights = model.named_weights().unwrap().len();
    let mut engine = TrainingEngine::full_parameters(model, DType::F64).unwrap();
    let full = opentinker::train::FULL_PARAMETERS;
    let work = [item(full, Loss::CrossEntropy, &[1, 2], 10)];
    engine.forward_backward(&work).unwrap();
    let gradients = engine.gradients(full).unwrap().unwrap();
    assert_eq!(gradients.len(), weights);
    for (name, var) in engine.parameters(full).unwrap().iter().filter(|(n, _)| {
        [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_norm.weight",
            "model.layers.1.self_attn.k_proj.weight",
            "model.layers.3.post_attention_layernorm.weight",
            "model.layers.2.mlp.down_proj.weight",
            "model.norm.weight",
        ]
        .contains(&n.as_str())
    }) {
        let original = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let analytic = gradients[name]
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        assert!(l2(&gradients[name]) > 0.0, "{name} has no gradient");
        // The embedding rows of tokens the datums use (3 + ...), and the first and last entries.
        for index in [0, original.len() / 2 + 1, original.len() - 1] {
            let at = |delta: f64| {
                let mut values = original.clone();
                values[index] += delta;
                let shape = var.as_tensor().shape().clone();
                let set = |v: Vec<f64>| {
                    var.set(&Tensor::from_vec(v, &shape, &candle_core::Device::Cpu).unwrap())
                        .unwrap()
                };
                set(values);
                let value = engine.forward(&work).unwrap()[0].loss;
                set(original.clone());
                value
            };
            let eps = 1e-5;
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (analytic[index] - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "{name}[{index}]: analytic {} vs numeric {numeric}",
                analytic[index]
            );
        }
    }

    let params = AdamParams {
        learning_rate: 1e-3,
        ..AdamParams::default()
    };
    let first = engine.forward(&work).unwrap()[0].loss;
    engine.discard_gradients(full).unwrap();
    for _ in 0..5 {
        engine.forward_backward(&work).unwrap();
        engine.optim_step(full, &params).unwrap();
    }
    let trained = engine.forward(&work).unwrap()[0].loss;
    assert!(trained < first * 0.9, "loss {first} -> {trained}");

    let snapshot = engine.model_snapshot().unwrap();
    let before = snapshot
        .embed_tokens
        .dense()
        .unwrap()
        .to_vec2::<f64>()
        .unwrap();
    engine.forward_backward(&work).unwrap();
    engine.optim_step(full, &params).unwrap();
    assert_eq!(
        snapshot
            .embed_tokens
            .dense()
            .unwrap()
            .to_vec2::<f64>()
            .unwrap(),
        before
    );
    assert_ne!(
        engine
            .model_snapshot()
            .unwrap()
            .embed_tokens
            .dense()
            .unwrap()
            .to_vec2::<f64>()
            .unwrap(),
        before
    );
    let err = engine.add_adapter("a", lora(4, 1)).unwrap_err().to_string();
    assert!(err.contains("holds no adapters"), "{err}");
}

/// Start a trainer service over an engine with adapters `a` (rank 4) and `b` (rank 8), and a
/// gate: the service runs nothing more until the gate's sender is used, so calls made meanwhile
/// all land in the next clock cycle.
async fn gated_service() -> (TrainerService, std::sync::mpsc::Sender<()>) {
    gated_service_sharing(FairShare::unlimited()).await
}

async fn gated_service_sharing(share: FairShare) -> (TrainerService, std::sync::mpsc::Sender<()>) {
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let mut engine = TrainingEngine::new(model, DType::F32);
    engine.add_adapter("a", lora(4, 1)).unwrap();
    engine.add_adapter("b", lora(8, 2)).unwrap();
    warm_up(&mut engine, &["a", "b"]);
    let (service, _thread) = TrainerService::start_sharing(engine, share);
    let (open, gate) = std::sync::mpsc::channel::<()>();
    // Polled once, the call is sent; the service runs it whether or not its answer is awaited.
    let mut closed = Box::pin(service.with(move |_| gate.recv()));
    assert!(futures::poll!(&mut closed).is_pending());
    drop(closed);
    (service, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trainer_service_fuses_calls_of_one_cycle_and_answers_each_with_its_own_outputs() {
    let (service, open) = gated_service().await;
    let ppo = Loss::from_config("ppo", &config(&[])).unwrap();
    let item_a = item("a", Loss::CrossEntropy, &[1, 2, 3], 14);
    let item_b = item("b", ppo, &[4, 5], 9);
    let fused_a = service.forward_backward(vec![item_a.clone()]);
    let fused_b = service.forward_backward(vec![item_b.clone()]);
    tokio::pin!(fused_a, fused_b);
    // A first poll sends each call; both then wait behind the gate for the same cycle.
    assert!(futures::poll!(&mut fused_a).is_pending());
    assert!(futures::poll!(&mut fused_b).is_pending());
    open.send(()).unwrap();
    let (outputs_a, outputs_b) = (fused_a.await.unwrap(), fused_b.await.unwrap());
    assert_eq!(outputs_a.len(), 1);
    assert_eq!(outputs_a[0].logprobs.len(), 3);
    assert_eq!(outputs_a[0].logprobs[0].len(), 14);
    assert_eq!(outputs_b[0].logprobs.len(), 2);
    assert_eq!(outputs_b[0].logprobs[0].len(), 9);

    // Each adapter's gradient is the one its call alone gives.
    let fused = service
        .with(|e| {
            (
                e.gradients("a").unwrap().unwrap(),
                e.gradients("b").unwrap().unwrap(),
            )
        })
        .await
        .unwrap();
    for (id, item, fused) in [("a", item_a, fused.0), ("b", item_b, fused.1)] {
        let alone = service
            .with(move |e| {
                e.discard_gradients(id).unwrap();
                e.forward_backward(&[item]).unwrap();
                e.gradients(id).unwrap().unwrap()
            })
            .await
            .unwrap();
        for (name, g) in &alone {
            let difference = l2(&(g - &fused[name]).unwrap());
            assert!(l2(g) > 0.0, "{id} {name} has a zero gradient");
            assert!(
                difference <= 1e-5 * l2(g),
                "{id} {name}: |fused - alone| = {difference}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_datum_in_a_cycle_fails_only_the_call_that_sent_it() {
    let (service, open) = gated_service().await;
    let good = service.forward_backward(vec![item("a", Loss::CrossEntropy, &[1, 2], 10)]);
    let mut bad_item = item("b", Loss::CrossEntropy, &[3], 10);
    bad_item.datums[0].target_tokens[4] = 1_000_000;
    let bad = service.forward_backward(vec![bad_item]);
    tokio::pin!(good, bad);
    assert!(futures::poll!(&mut good).is_pending());
    assert!(futures::poll!(&mut bad).is_pending());
    open.send(()).unwrap();
    let outputs = good.await.unwrap();
    assert_eq!(outputs[0].logprobs.len(), 2);
    let error = bad.await.unwrap_err().to_string();
    // Numbered within its own call: the fused pass's failure was not passed on as it was.
    assert!(error.contains("work item 0, datum 0"), "{error}");
    let untouched = service.with(|e| e.gradients("b").unwrap()).await.unwrap();
    assert!(untouched.is_none(), "the bad call left gradients behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_larger_than_a_pass_is_sliced_lets_a_small_call_through_and_sums_the_same() {
    let share = FairShare {
        pass_tokens: 40,
        quantum: 20,
        cycle: None,
        solo_pass_tokens: None,
        anticipate: None,
    };
    let (service, open) = gated_service_sharing(share).await;
    // 48 datums of 14 tokens: at least 16 passes of 40 tokens, plenty of time to see the small
    // call answered first.
    let seeds: Vec<u32> = (1..=48).collect();
    let big_item = item("a", Loss::CrossEntropy, &seeds, 14);
    let big = service.forward_backward_for("heavy", vec![big_item.clone()]);
    let small =
        service.forward_backward_for("light", vec![item("b", Loss::CrossEntropy, &[9], 10)]);
    tokio::pin!(big, small);
    assert!(futures::poll!(&mut big).is_pending());
    assert!(futures::poll!(&mut small).is_pending());
    open.send(()).unwrap();
    // The small call, sent after the big one, is answered while the big one still runs.
    small.await.unwrap();
    assert!(
        futures::poll!(&mut big).is_pending(),
        "the small call waited for all of the big one"
    );
    let sliced = big.await.unwrap();
    assert_eq!(sliced[0].logprobs.len(), 48);
    let sliced_gradients = service
        .with(|e| e.gradients("a").unwrap().unwrap())
        .await
        .unwrap();
    let (alone, alone_gradients) = service
        .with(move |e| {
            e.discard_gradients("a").unwrap();
            let outputs = e.forward_backward(&[big_item]).unwrap();
            (outputs, e.gradients("a").unwrap().unwrap())
        })
        .await
        .unwrap();
    assert!((sliced[0].loss - alone[0].loss).abs() <= 1e-4 * alone[0].loss.abs());
    assert_eq!(
        sliced[0].metrics["tokens:sum"],
        alone[0].metrics["tokens:sum"]
    );
    for (name, g) in &alone_gradients {
        let difference = l2(&(g - &sliced_gradients[name]).unwrap());
        assert!(
            difference <= 1e-5 * l2(g),
            "{name}: |sliced - alone| = {difference}"
        );
    }
}

/// A lone tenant's call on a service whose passes are timed to `cycle`: its loss and gradients.
async fn lone_call_on(cycle: std::time::Duration) -> (f64, Vec<(String, Vec<f32>)>) {
    let share = FairShare {
        pass_tokens: 16_384,
        quantum: 128,
        cycle: Some(cycle),
        solo_pass_tokens: Some(60),
        anticipate: None,
    };
    let (service, open) = gated_service_sharing(share).await;
    // Datums of two lengths: how they are grouped into passes changes their padding.
    let short_seeds: Vec<u32> = (1..=6).collect();
    let long_seeds: Vec<u32> = (7..=12).collect();
    let items = vec![
        item("a", Loss::CrossEntropy, &long_seeds, 14),
        item("a", Loss::CrossEntropy, &short_seeds, 9),
    ];
    let call = service.forward_backward_for("alone", items);
    tokio::pin!(call);
    assert!(futures::poll!(&mut call).is_pending());
    open.send(()).unwrap();
    let outputs = call.await.unwrap();
    let gradients = service
        .with(|e| e.gradients("a").unwrap().unwrap())
        .await
        .unwrap();
    let mut flat: Vec<(String, Vec<f32>)> = gradients
        .iter()
        .map(|(name, g)| (name.clone(), g.flatten_all().unwrap().to_vec1().unwrap()))
        .collect();
    flat.sort_by(|a, b| a.0.cmp(&b.0));
    (outputs.iter().map(|o| o.loss).sum(), flat)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_tenants_passes_are_sized_in_tokens_so_its_results_do_not_depend_on_timing() {
    // Timed passes would hold one datum at a microsecond and the whole call at a minute.
    let fast = lone_call_on(std::time::Duration::from_micros(1)).await;
    let slow = lone_call_on(std::time::Duration::from_secs(60)).await;
    assert!(fast.0 > 0.0);
    assert_eq!(fast.0.to_bits(), slow.0.to_bits(), "losses differ");
    assert_eq!(fast.1, slow.1, "gradients differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_weight_three_gets_more_of_the_passes_than_an_equal_share() {
    let share = FairShare {
        pass_tokens: 42,
        quantum: 14,
        cycle: None,
        solo_pass_tokens: None,
        anticipate: None,
    };
    let (service, open) = gated_service_sharing(share).await;
    service.set_weight("gold", 3);
    let seeds: Vec<u32> = (1..=12).collect();
    let gold =
        service.forward_backward_for("gold", vec![item("a", Loss::CrossEntropy, &seeds, 14)]);
    let basic =
        service.forward_backward_for("basic", vec![item("b", Loss::CrossEntropy, &seeds, 14)]);
    tokio::pin!(gold, basic);
    assert!(futures::poll!(&mut gold).is_pending());
    assert!(futures::poll!(&mut basic).is_pending());
    open.send(()).unwrap();
    // Sliced over passes, gold is served three datums to basic's one.
    let first = tokio::select! {
        biased;
        _ = &mut basic => "basic",
        _ = &mut gold => "gold",
    };
    assert_eq!(first, "gold");
}

/// A model of a job's own (a full-parameter warm-up's copy of the base) trains as a guest of
/// the base's loop: its work is sliced by the same fair queue (another tenant's small call goes
/// through while it runs), counted in its tenant's usage, and sums to what it gives alone; the
/// guest lives as long as a handle to it, and the loop's own engine serves on after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_engine_trains_in_the_loops_fair_queue_and_its_tenants_usage() {
    let share = FairShare {
        pass_tokens: 40,
        quantum: 20,
        cycle: None,
        solo_pass_tokens: None,
        anticipate: None,
    };
    let (service, open) = gated_service_sharing(share).await;
    let full = opentinker::train::FULL_PARAMETERS;
    let copy = tiny_transformer(Architecture::Qwen2);
    let guest = service.attach(TrainingEngine::full_parameters(copy, DType::F32).unwrap());
    let seeds: Vec<u32> = (1..=24).collect();
    let big_item = item(full, Loss::CrossEntropy, &seeds, 14);
    let sliced = {
        let big = guest.forward_backward_for("heavy", vec![big_item.clone()]);
        let small =
            service.forward_backward_for("light", vec![item("b", Loss::CrossEntropy, &[9], 10)]);
        tokio::pin!(big, small);
        assert!(futures::poll!(&mut big).is_pending());
        assert!(futures::poll!(&mut small).is_pending());
        open.send(()).unwrap();
        small.await.unwrap();
        assert!(
            futures::poll!(&mut big).is_pending(),
            "the light tenant waited for all of the guest's call"
        );
        big.await.unwrap()
    };
    let usage = service.usage().snapshot();
    assert_eq!(usage["heavy"].served, 24 * 14, "{usage:?}");
    assert_eq!(usage["light"].served, 10, "{usage:?}");

    // The guest's gradients, sliced over passes, are what its call gives alone.
    let (alone, weight) = guest
        .with(move |e| {
            let sliced = e.gradients(full).unwrap().unwrap();
            e.discard_gradients(full).unwrap();
            let alone = e.forward_backward(&[big_item]).unwrap();
            let name = "model.layers.1.mlp.down_proj.weight";
            let weight = (
                sliced[name].clone(),
                e.gradients(full).unwrap().unwrap()[name].clone(),
            );
            (alone, weight)
        })
        .await
        .unwrap();
    assert!((sliced[0].loss - alone[0].loss).abs() <= 1e-4 * alone[0].loss.abs());
    let difference = l2(&(&weight.0 - &weight.1).unwrap());
    assert!(l2(&weight.1) > 0.0 && difference <= 1e-5 * l2(&weight.1));
    // The adapters' engine never saw the guest's work.
    assert!(
        service
            .with(|e| e.gradients(full).unwrap())
            .await
            .unwrap()
            .is_none()
    );

    let clone = guest.clone();
    drop(guest);
    assert!(clone.with(|e| e.model_snapshot().is_ok()).await.unwrap());
    drop(clone);
    let outputs = service
        .forward_backward_for("light", vec![item("a", Loss::CrossEntropy, &[3], 10)])
        .await
        .unwrap();
    assert_eq!(outputs[0].logprobs.len(), 1);
}

#[test]
fn an_exported_state_continues_bit_for_bit_in_another_engine() {
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let mut engine = TrainingEngine::new(Arc::clone(&model), DType::F32);
    engine.add_adapter("a", lora(4, 3)).unwrap();
    let params = AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    };
    let work = |seed| [item("a", Loss::CrossEntropy, &[seed], 12)];
    engine.forward_backward(&work(1)).unwrap();
    engine.optim_step("a", &params).unwrap();
    // Saved between a forward_backward and its step: the gradients travel too.
    engine.forward_backward(&work(2)).unwrap();
    let bytes = engine.export_state("a").unwrap().encode().unwrap();
    let state = opentinker::train::SlotState::decode(&bytes, DType::F32).unwrap();
    let mut restored = TrainingEngine::new(model, DType::F32);
    restored.import_state("a", state).unwrap();
    for engine in [&mut engine, &mut restored] {
        engine.optim_step("a", &params).unwrap();
        engine.forward_backward(&work(3)).unwrap();
        engine.optim_step("a", &params).unwrap();
    }
    assert_eq!(snapshot(&engine, "a"), snapshot(&restored, "a"));
    let damaged = opentinker::train::SlotState::decode(&bytes[..bytes.len() / 2], DType::F32);
    assert!(damaged.is_err());
}

/// The plugin `plugins/NAME`, built and loaded into a fresh host (kept beside it: its clock
/// is what ends a call that runs past its time).
async fn objective_plugin(name: &str) -> (PluginHost, Plugin) {
    let host = PluginHost::new(HostConfig::default()).unwrap();
    let plugin = host
        .load_file(&plugin_build::built_plugin(name))
        .await
        .unwrap();
    (host, plugin)
}

/// `plugin` under `config` as a loss.
fn plugin_loss(plugin: &Plugin, config: &str, limits: Limits) -> Loss {
    Loss::Objective(Objective::new(PluginObjective::new(
        plugin.clone(),
        "test objective",
        config,
        limits,
        tokio::runtime::Handle::current(),
    )))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ppo_objective_plugin_gives_the_built_in_ppos_gradients_in_one_fused_pass() {
    let (_host, ppo_plugin) = objective_plugin("ppo-loss").await;
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let mut engine = TrainingEngine::new(model, DType::F32);
    // Two adapters of one seed: the same weights, so the same loss must give the same gradient.
    engine.add_adapter("built-in", lora(4, 7)).unwrap();
    engine.add_adapter("plugin", lora(4, 7)).unwrap();
    warm_up(&mut engine, &["built-in", "plugin"]);
    let builtin = Loss::from_config("ppo", &config(&[("clip_high_threshold", 1.05)])).unwrap();
    let plugin = plugin_loss(
        &ppo_plugin,
        r#"{"clip_high_threshold": 1.05}"#,
        Limits::default(),
    );
    let seeds = [1, 2, 3, 4];
    let outputs = engine
        .forward_backward(&[
            item("built-in", builtin, &seeds, 16),
            item("plugin", plugin, &seeds, 16),
        ])
        .unwrap();
    let (ours, theirs) = (&outputs[0], &outputs[1]);
    assert!(
        (ours.loss - theirs.loss).abs() <= 1e-5 * ours.loss.abs().max(1.0),
        "{} vs {}",
        ours.loss,
        theirs.loss
    );
    assert_eq!(ours.logprobs, theirs.logprobs);
    // The plugin's metric came through, summed over the datums: some tokens were clipped.
    assert!(
        theirs.metrics["clipped_tokens:sum"] > 0.0,
        "{:?}",
        theirs.metrics
    );
    let (a, b) = (
        engine.gradients("built-in").unwrap().unwrap(),
        engine.gradients("plugin").unwrap().unwrap(),
    );
    for (name, g) in &a {
        let difference = max_abs_diff(g, &b[name]);
        assert!(l2(g) > 0.0, "{name} has a zero gradient");
        assert!(
            difference <= 1e-6,
            "{name}: max |built-in - plugin| = {difference}"
        );
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .and_then(|d| d.abs()?.max_all()?.to_dtype(DType::F64)?.to_scalar::<f64>())
        .expect("tensors of the same shape")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_objective_plugin_fails_its_call_alone_and_leaves_its_adapter_unchanged() {
    let (_host, plugin) = objective_plugin("adversarial/objective").await;
    // Small bounds, so that each attack ends within a second.
    let limits = Limits {
        fuel: 50_000_000,
        memory_bytes: 16 << 20,
        call_timeout_ms: 5_000,
        ..Limits::default()
    };
    let (service, open) = gated_service().await;
    let mut before = None;
    for (config, kind) in [
        ("nan", ErrorKind::InvalidOutput),
        ("short", ErrorKind::InvalidOutput),
        ("loop", ErrorKind::OutOfFuel),
        ("memory", ErrorKind::MemoryLimit),
    ] {
        let good = service.forward_backward(vec![item("a", Loss::CrossEntropy, &[1, 2], 10)]);
        let bad = service.forward_backward(vec![item(
            "b",
            plugin_loss(&plugin, config, limits.clone()),
            &[3, 4],
            10,
        )]);
        tokio::pin!(good, bad);
        assert!(futures::poll!(&mut good).is_pending());
        assert!(futures::poll!(&mut bad).is_pending());
        if config == "nan" {
            open.send(()).unwrap();
        }
        assert_eq!(good.await.unwrap()[0].logprobs.len(), 2, "{config}");
        let error = match bad.await {
            Err(opentinker::service::TrainerServiceError::Train(error)) => error,
            other => panic!("{config}: {other:?}"),
        };
        let TrainError::Objective { source, .. } = &error else {
            panic!("{config}: {error}");
        };
        let call = source.source.downcast_ref::<CallError>().unwrap();
        assert_eq!(call.kind, kind, "{config}: {error}");
        assert!(error.is_refusal());
        let untouched = service.with(|e| e.gradients("b").unwrap()).await.unwrap();
        assert!(untouched.is_none(), "{config} left gradients behind");
        let weights = service.with(|e| snapshot(e, "b")).await.unwrap();
        assert_eq!(before.get_or_insert_with(|| weights.clone()), &weights);
    }
}

/// An objective that answers `-Σ logp` unless a datum has `refuse` logprobs.
struct RefusesLength {
    refuse: usize,
}

impl ExternalObjective for RefusesLength {
    fn name(&self) -> &str {
        "refuses-length"
    }

    fn losses(&self, datums: &[ObjectiveInput<'_>]) -> Result<Vec<ObjectiveLoss>, ObjectiveError> {
        datums
            .iter()
            .map(|d| {
                if d.logprobs.len() == self.refuse {
                    return Err(ObjectiveError {
                        objective: "refuses-length".into(),
                        source: "a datum of the refused length".into(),
                    });
                }
                Ok(ObjectiveLoss {
                    value: -d.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>(),
                    gradient: vec![-1.0; d.logprobs.len()],
                    metrics: BTreeMap::new(),
                })
            })
            .collect()
    }
}

#[test]
fn an_objective_failing_in_a_later_pass_takes_back_the_earlier_passes_gradients() {
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let mut engine = TrainingEngine::new(model, DType::F32).with_pass_bytes(1);
    engine.add_adapter("a", lora(4, 1)).unwrap();
    warm_up(&mut engine, &["a"]);
    let objective = Loss::Objective(Objective::new(RefusesLength { refuse: 7 }));
    // One datum a pass (the pass holds one token): the first two passes add gradients, the
    // third is refused.
    let mut call = item("a", objective.clone(), &[1, 2], 12);
    call.datums.push(datum(3, 7, false));
    assert_eq!(engine.pass_tokens(std::slice::from_ref(&call)), 1);
    let error = engine.forward_backward(&[call]).unwrap_err();
    assert!(matches!(error, TrainError::Objective { .. }), "{error}");
    assert!(
        engine.gradients("a").unwrap().is_none(),
        "the call left gradients behind"
    );
    // The same objective on datums it takes adds its gradients.
    engine
        .forward_backward(&[item("a", objective, &[1, 2], 12)])
        .unwrap();
    assert!(engine.gradients("a").unwrap().is_some());
}

/// An engine asked to run on a device it cannot use says which and why: f64 on CUDA (whatever
/// the machine), and a CUDA ordinal no machine has (a build without CUDA says so instead).
#[test]
fn an_engine_on_a_device_it_cannot_use_says_which() {
    use opentinker::model::{Device, DeviceErrorKind};
    let model = Arc::new(tiny_transformer(Architecture::Qwen2));
    let refusal =
        |dtype: DType, device: Device| match TrainingEngine::new(Arc::clone(&model), dtype)
            .on_device(device)
        {
            Ok(_) => panic!("{dtype:?} on {device} was accepted"),
            Err(error) => error,
        };
    let error = refusal(DType::F64, Device::Cuda { ordinal: 0 });
    assert!(
        error.to_string().contains("f32 on CUDA") && error.to_string().contains("cuda:0"),
        "{error}"
    );
    let error = refusal(DType::F32, Device::Cuda { ordinal: 99 });
    let TrainError::Device(device_error) = &error else {
        panic!("not a device error: {error}");
    };
    assert_eq!(device_error.kind(), DeviceErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("cuda:99"), "{error}");
    let engine = TrainingEngine::new(model, DType::F32)
        .on_device(Device::Cpu)
        .unwrap();
    assert_eq!(engine.device(), Device::Cpu);
}

/// LoRA on a base kept in blocks trains as on the f32 base of the blocks' values: the same
/// logprobs, loss and adapter gradients up to the products' summation order, for both
/// formats and a model with and without Gemma's features. Full-parameter training, which
/// would update the blocks, is refused by name.
#[test]
fn lora_on_a_base_kept_in_blocks_trains_as_on_its_values_in_f32() {
    use opentinker::model::BlockFormat;
    let close = |x: f64, y: f64| (x - y).abs() <= 2e-5 * (1.0 + x.abs());
    let loss = Loss::from_config("ppo", &config(&[])).unwrap();
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
        for arch in [Architecture::Qwen2, Architecture::Gemma3] {
            let blocks = tiny_transformer(arch).keep_base_in(format).unwrap();
            let values = blocks.named_weights().unwrap().into_iter().collect();
            let dense = Transformer::from_tensors(blocks.config.clone(), &values).unwrap();
            let engine = |model: Transformer| {
                let mut engine = TrainingEngine::new(Arc::new(model), DType::F32);
                engine.add_adapter("a", lora(4, 1)).unwrap();
                warm_up(&mut engine, &["a"]);
                engine
            };
            let (mut on_blocks, mut on_dense) = (engine(blocks), engine(dense));
            let work = [item("a", loss.clone(), &[1, 2, 3], 14)];
            let (got, want) = (
                on_blocks.forward_backward(&work).unwrap(),
                on_dense.forward_backward(&work).unwrap(),
            );
            assert!(close(got[0].loss, want[0].loss), "{arch:?} {format:?}");
            for (x, y) in got[0]
                .logprobs
                .iter()
                .flatten()
                .zip(want[0].logprobs.iter().flatten())
            {
                assert!(
                    close(f64::from(*x), f64::from(*y)),
                    "{arch:?} {format:?}: {x} vs {y}"
                );
            }
            assert_same_gradients(
                &on_blocks,
                &on_dense,
                "a",
                2e-5,
                &format!("{arch:?} {format:?}"),
            );
        }
    }
    let blocks = tiny_transformer(Architecture::Qwen2)
        .keep_base_in(BlockFormat::Q8_0)
        .unwrap();
    let refused = TrainingEngine::full_parameters(blocks, DType::F32)
        .err()
        .expect("full-parameter training of blocks is refused");
    assert!(refused.to_string().contains("kept in blocks"), "{refused}");
}
