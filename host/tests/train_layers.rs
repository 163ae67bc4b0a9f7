//! The training forward and backward of the model's one layer definition (`model::layers` on
//! the CPU training backend): every adapter gradient of a mixed batch (two adapters, one of them
//! on the unembedding or not, and base rows) and the weight gradients of full-parameter
//! training against central differences in f64, on every architecture (Gemma 3 with a window
//! its sequences pass), each sequence at its own sampling temperature, and the trainer's f32
//! logprobs against the sampler's at that temperature.

use candle_core::{DType, Device, Tensor, Var};
use opentinker::lora::{Adapter, CpuAdapters, LoraConfig};
use opentinker::model::layers::{
    NoAdapters, Sequence, TrainOutput, TrainSequence, WeightGrads, forward, train_backward,
    train_forward,
};
use opentinker::model::{Architecture, CpuWeights, Model, Site, Target, Transformer};
use opentinker::model::{TinyShape, init_tiny};
use opentinker_kernels::{Cpu, CpuBatch, CpuTrain, KvCache, TrainBatch};

/// A sequence's tokens and targets.
type Data = (Vec<u32>, Vec<u32>);

fn tiny(arch: Architecture, dtype: DType) -> Transformer {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, arch, 11).unwrap();
    Model::load(dir.path())
        .unwrap()
        .transformer
        .to_dtype(dtype)
        .unwrap()
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(6364136223846793005) ^ 0x9E37_79B9;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f64 / (1u64 << 24) as f64) - 0.5
        })
        .collect()
}

/// An adapter whose `B` is not zero, so every gradient is.
fn adapter(model: &Transformer, rank: usize, unembed: bool, seed: u64, dtype: DType) -> Adapter {
    let config = LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        seed,
        train_unembed: unembed,
        ..LoraConfig::default()
    };
    let adapter = Adapter::new(&model.config, config, dtype).unwrap();
    for (i, pair) in adapter.sites.values().enumerate() {
        let shape = pair.b.as_tensor().shape().clone();
        let b: Vec<f64> = values(shape.elem_count(), seed * 100 + i as u64)
            .iter()
            .map(|v| v * 0.2)
            .collect();
        let b = Tensor::from_vec(b, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        pair.b.set(&b).unwrap();
    }
    adapter
}

/// `(tokens, targets)` of a sequence of `n` tokens.
fn sequence(n: usize, seed: u32) -> Data {
    let tokens: Vec<u32> = (0..=n as u32)
        .map(|i| (i * 37 + seed * 101) % 500 + 3)
        .collect();
    (tokens[..n].to_vec(), tokens[1..].to_vec())
}

fn to_vec(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// `Σ g · logprob` of `sequences` through `hook` (no backward).
fn weighted_loss(
    model: &Transformer,
    hook: &CpuAdapters<'_, f64>,
    sequences: &[TrainSequence<'_>],
    g: &[f64],
    trained_head: bool,
) -> f64 {
    let weights = CpuWeights::<f64>::of(model).unwrap();
    let weights = weights.decoder::<CpuTrain<f64>>();
    let mut batch = TrainBatch::new(sequences.iter().map(|s| s.tokens.len()).collect());
    let TrainOutput { logprobs, .. } = train_forward(
        &CpuTrain::<f64>::new(),
        &model.config,
        &weights,
        hook,
        sequences,
        &mut batch,
        false,
        trained_head,
    )
    .unwrap();
    logprobs.iter().zip(g).map(|(l, g)| l * g).sum()
}

/// A few entries of `analytic` (the gradient of `var`) against central differences of `loss`.
fn check_entries(name: &str, var: &Var, analytic: &[f64], loss: &dyn Fn() -> f64) {
    let original = to_vec(var.as_tensor());
    assert_eq!(analytic.len(), original.len(), "{name}: gradient shape");
    assert!(
        analytic.iter().any(|g| *g != 0.0),
        "{name}: the gradient is zero"
    );
    for index in [0, original.len() / 3, original.len() - 1] {
        let at = |delta: f64| {
            let mut moved = original.clone();
            moved[index] += delta;
            set(var, moved);
            let value = loss();
            set(var, original.clone());
            value
        };
        let eps = 1e-5;
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
        assert!(
            (numeric - analytic[index]).abs() <= 1e-7 * (1.0 + numeric.abs()),
            "{name}[{index}]: analytic {} vs numeric {numeric}",
            analytic[index]
        );
    }
}

#[test]
fn adapter_gradients_of_a_mixed_batch_match_central_differences_in_f64() {
    for arch in Architecture::ALL {
        let model = tiny(arch, DType::F64);
        let a = adapter(&model, 4, false, 1, DType::F64);
        // Llama's batch has no adapter on the unembedding: its head is the fused one.
        let b = adapter(&model, 8, arch != Architecture::Llama, 2, DType::F64);
        // a, a, b, the base model; three of them at a sampling temperature, each its own.
        let data: Vec<Data> = [(7, 1), (5, 2), (9, 3), (6, 4)]
            .iter()
            .map(|&(n, s)| sequence(n, s))
            .collect();
        let sequences: Vec<TrainSequence<'_>> = data
            .iter()
            .zip([(Some(0), 1.0), (Some(0), 0.7), (Some(1), 1.3), (None, 0.5)])
            .map(
                |((tokens, targets), (adapter, temperature))| TrainSequence {
                    tokens,
                    targets,
                    adapter,
                    temperature,
                },
            )
            .collect();
        let g = values(27, 50);

        let weights = CpuWeights::<f64>::of(&model).unwrap();
        let weights = weights.decoder::<CpuTrain<f64>>();
        let ops = CpuTrain::<f64>::new();
        let hook = CpuAdapters::<f64>::training(&[&a, &b]).unwrap();
        let mut batch = TrainBatch::new(vec![7, 5, 9, 6]);
        let TrainOutput { tape, .. } = train_forward(
            &ops,
            &model.config,
            &weights,
            &hook,
            &sequences,
            &mut batch,
            true,
            false,
        )
        .unwrap();
        train_backward(
            &ops,
            &model.config,
            &weights,
            &hook,
            &sequences,
            &mut batch,
            &tape.unwrap(),
            &g,
            None,
        )
        .unwrap();
        let gradients = hook.into_gradients();
        let loss = || {
            let hook = CpuAdapters::<f64>::of(&[&a, &b]).unwrap();
            weighted_loss(&model, &hook, &sequences, &g, false)
        };
        for (adapter, ours) in [&a, &b].iter().zip(&gradients) {
            assert_eq!(
                ours.len(),
                adapter.sites.len(),
                "{arch:?}: a gradient per site"
            );
            let sites = [
                Site::Layer(0, Target::Q),
                Site::Layer(1, Target::V),
                Site::Layer(3, Target::Down),
                Site::Unembed,
            ];
            for site in sites.iter().filter(|s| adapter.sites.contains_key(s)) {
                let pair = &adapter.sites[site];
                let (da, db) = &ours[site];
                check_entries(&format!("{arch:?} {site:?} dA"), &pair.a, da, &loss);
                check_entries(&format!("{arch:?} {site:?} dB"), &pair.b, db, &loss);
            }
        }
    }
}

#[test]
fn full_parameter_gradients_match_central_differences_in_f64() {
    for arch in [
        Architecture::Qwen3,
        Architecture::Qwen2,
        Architecture::Gemma3,
    ] {
        let (model, vars) = tiny(arch, DType::F64).into_trainable().unwrap();
        let data: Vec<Data> = vec![sequence(6, 1), sequence(9, 2)];
        let sequences: Vec<TrainSequence<'_>> = data
            .iter()
            .zip([0.8, 1.0])
            .map(|((tokens, targets), temperature)| TrainSequence {
                tokens,
                targets,
                adapter: None,
                temperature,
            })
            .collect();
        let g = values(15, 70);
        // The weights are read under their storage locks: the views go before any is moved.
        let grads = {
            let weights = CpuWeights::<f64>::of(&model).unwrap();
            let weights = weights.decoder::<CpuTrain<f64>>();
            let ops = CpuTrain::<f64>::new();
            let mut batch = TrainBatch::new(vec![6, 9]);
            let TrainOutput { tape, .. } = train_forward(
                &ops,
                &model.config,
                &weights,
                &NoAdapters,
                &sequences,
                &mut batch,
                true,
                true,
            )
            .unwrap();
            let mut grads = WeightGrads::zeros(&ops, &model.config).unwrap();
            train_backward(
                &ops,
                &model.config,
                &weights,
                &NoAdapters,
                &sequences,
                &mut batch,
                &tape.unwrap(),
                &g,
                Some(&mut grads),
            )
            .unwrap();
            grads
        };
        let named = grads.into_named(&model.config.features);
        assert_eq!(named.len(), vars.len(), "{arch:?}: a gradient per weight");
        let no_adapters = CpuAdapters::<f64>::of(&[]).unwrap();
        let loss = || weighted_loss(&model, &no_adapters, &sequences, &g, true);
        for (name, gradient) in &named {
            let checked = [
                "model.embed_tokens.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.self_attn.q_norm.weight",
                "model.layers.1.self_attn.k_proj.weight",
                "model.layers.1.self_attn.q_proj.bias",
                "model.layers.2.mlp.down_proj.weight",
                "model.layers.3.post_attention_layernorm.weight",
                "model.norm.weight",
            ];
            if checked.contains(&name.as_str()) {
                let var = &vars.iter().find(|(n, _)| n == name).unwrap().1;
                check_entries(&format!("{arch:?} {name}"), var, gradient, &loss);
            }
        }
    }
}

fn set(var: &Var, values: Vec<f64>) {
    let shape = var.as_tensor().shape().clone();
    var.set(&Tensor::from_vec(values, shape, &Device::Cpu).unwrap())
        .unwrap();
}

#[test]
fn trainer_logprobs_agree_with_the_sampler_in_f32_at_each_temperature() {
    let model = tiny(Architecture::Qwen3, DType::F32);
    let a = adapter(&model, 8, false, 5, DType::F32);
    let (tokens, targets) = sequence(12, 4);
    let weights = CpuWeights::<f32>::of(&model).unwrap();
    let hook = CpuAdapters::<f32>::of(&[&a]).unwrap();
    let mut cache = KvCache::new(model.config.num_layers, model.config.num_kv_heads);
    let mut batch = CpuBatch::new(vec![(&mut cache, tokens.len())]);
    let logits = forward(
        &Cpu,
        &model.config,
        &weights.decoder::<Cpu>(),
        &hook,
        &[Sequence {
            tokens: &tokens,
            start: 0,
            adapter: Some(0),
            all_logits: true,
        }],
        &mut batch,
    )
    .unwrap();
    let vocab = model.config.vocab_size;
    for temperature in [1.0, 0.7] {
        let sequences = [TrainSequence {
            tokens: &tokens,
            targets: &targets,
            adapter: Some(0),
            temperature,
        }];
        let mut batch = TrainBatch::new(vec![tokens.len()]);
        let TrainOutput {
            logprobs: trainer, ..
        } = train_forward(
            &CpuTrain::<f32>::new(),
            &model.config,
            &weights.decoder::<CpuTrain<f32>>(),
            &hook,
            &sequences,
            &mut batch,
            false,
            false,
        )
        .unwrap();
        for (i, (row, &t)) in logits.chunks_exact(vocab).zip(&targets).enumerate() {
            // The sampler's logprob of a draw at `temperature` (`sample::params`).
            let tempered: Vec<f32> = row.iter().map(|v| v / temperature as f32).collect();
            let sampler = opentinker_kernels::ops::log_softmax(&tempered)[t as usize];
            assert!(
                (sampler - trainer[i]).abs() <= 1e-5,
                "temperature {temperature}, position {i}: sampler {sampler} vs trainer {}",
                trainer[i]
            );
        }
    }
}
