//! The training forward and backward of the model's one layer definition (`model::layers` on
//! the CPU training backend) against the candle graph of `model::transformer`: logprobs and
//! every adapter gradient of a mixed batch (two adapters, one of them on the unembedding or
//! not, and base rows), every weight's gradient in full-parameter training, central differences in f64,
//! and the trainer's f32 logprobs against the sampler's.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use opentinker::lora::{Adapter, CpuAdapters, LoraConfig};
use opentinker::model::layers::{
    LinearGrads, NoAdapters, Sequence, TrainOutput, TrainSequence, WeightGrads, forward,
    train_backward, train_forward,
};
use opentinker::model::tiny::{TinyShape, init_tiny};
use opentinker::model::transformer::RowAdapters;
use opentinker::model::{Architecture, CpuWeights, Model, Site, Target, Transformer};
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

/// The candle graph's logprobs `(sequences, longest)` of sequences padded to the longest.
fn candle_logprobs(model: &Transformer, sequences: &[Data], runs: RowAdapters<'_>) -> Tensor {
    let width = sequences.iter().map(|(t, _)| t.len()).max().unwrap();
    let pad = |get: fn(&Data) -> &Vec<u32>| {
        let flat: Vec<u32> = sequences
            .iter()
            .flat_map(|s| {
                let t = get(s);
                t.iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, width - t.len()))
            })
            .collect();
        Tensor::from_vec(flat, (sequences.len(), width), &Device::Cpu).unwrap()
    };
    let (tokens, targets) = (pad(|s| &s.0), pad(|s| &s.1));
    model
        .target_logprobs_with_adapters(&tokens, &targets, &runs, true)
        .unwrap()
}

/// `Σ g · logprobs` over the real (unpadded) positions.
fn weighted(logprobs: &Tensor, g: &[Vec<f64>]) -> Tensor {
    let (rows, width) = logprobs.dims2().unwrap();
    let mut flat = vec![0.0; rows * width];
    for (r, g) in g.iter().enumerate() {
        flat[r * width..][..g.len()].copy_from_slice(g);
    }
    let g = Tensor::from_vec(flat, (rows, width), &Device::Cpu).unwrap();
    (logprobs * g).unwrap().sum_all().unwrap()
}

fn to_vec(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

fn assert_close(name: &str, got: &[f64], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max).max(1e-12);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * scale,
            "{name}[{i}]: {g} vs {w} (scale {scale})"
        );
    }
}

#[test]
fn adapter_gradients_of_a_mixed_batch_match_the_candle_graph() {
    for arch in [
        Architecture::Qwen3,
        Architecture::Qwen2,
        Architecture::Llama,
    ] {
        let model = tiny(arch, DType::F64);
        let a = adapter(&model, 4, false, 1, DType::F64);
        // Llama's batch has no adapter on the unembedding: its head is the fused one.
        let b = adapter(&model, 8, arch != Architecture::Llama, 2, DType::F64);
        // a, a, b, the base model: one run per adapter.
        let data: Vec<Data> = [(7, 1), (5, 2), (9, 3), (6, 4)]
            .iter()
            .map(|&(n, s)| sequence(n, s))
            .collect();
        let adapters = [Some(0), Some(0), Some(1), None];
        let g: Vec<Vec<f64>> = data
            .iter()
            .enumerate()
            .map(|(i, (t, _))| values(t.len(), 50 + i as u64))
            .collect();

        let runs = RowAdapters {
            runs: vec![(2, Some(&a)), (1, Some(&b)), (1, None)],
        };
        let logprobs = candle_logprobs(&model, &data, runs);
        let candle_grads = weighted(&logprobs, &g).backward().unwrap();

        let weights = CpuWeights::<f64>::of(&model).unwrap();
        let weights = weights.decoder::<CpuTrain<f64>>();
        let hook = CpuAdapters::<f64>::training(&[&a, &b]).unwrap();
        let sequences: Vec<TrainSequence<'_>> = data
            .iter()
            .zip(adapters)
            .map(|((tokens, targets), adapter)| TrainSequence {
                tokens,
                targets,
                adapter,
            })
            .collect();
        let ops = CpuTrain::<f64>::new();
        let mut batch = TrainBatch::new(data.iter().map(|(t, _)| t.len()).collect());
        let TrainOutput {
            logprobs: ours,
            tape,
        } = train_forward(
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
        let rows = logprobs.to_vec2::<f64>().unwrap();
        let want: Vec<f64> = rows
            .iter()
            .zip(&data)
            .flat_map(|(row, (t, _))| row[..t.len()].to_vec())
            .collect();
        assert_close(&format!("{arch:?} logprobs"), &ours, &want, 1e-10);

        let d_logprobs: Vec<f64> = g.concat();
        train_backward(
            &ops,
            &model.config,
            &weights,
            &hook,
            &sequences,
            &mut batch,
            &tape.unwrap(),
            &d_logprobs,
            None,
        )
        .unwrap();
        let gradients = hook.into_gradients();
        for (adapter, ours) in [&a, &b].iter().zip(&gradients) {
            assert_eq!(
                ours.len(),
                adapter.sites.len(),
                "{arch:?}: a gradient per site"
            );
            for (site, pair) in &adapter.sites {
                let (da, db) = &ours[site];
                let want_a = to_vec(candle_grads.get(pair.a.as_tensor()).unwrap());
                let want_b = to_vec(candle_grads.get(pair.b.as_tensor()).unwrap());
                assert_close(&format!("{arch:?} {site:?} dA"), da, &want_a, 1e-9);
                assert_close(&format!("{arch:?} {site:?} dB"), db, &want_b, 1e-9);
            }
        }
    }
}

/// Our gradient of one projection by its Hugging Face name.
fn linear_grads(
    grads: &WeightGrads<CpuTrain<f64>>,
    layer: usize,
    target: Target,
) -> &LinearGrads<CpuTrain<f64>> {
    let l = &grads.layers[layer];
    match target {
        Target::Q => &l.attention.q,
        Target::K => &l.attention.k,
        Target::V => &l.attention.v,
        Target::O => &l.attention.o,
        Target::Gate => &l.mlp.gate,
        Target::Up => &l.mlp.up,
        Target::Down => &l.mlp.down,
    }
}

fn named_gradients(
    grads: &WeightGrads<CpuTrain<f64>>,
    layers: usize,
) -> BTreeMap<String, Vec<f64>> {
    let mut named = BTreeMap::new();
    named.insert("model.embed_tokens.weight".to_string(), grads.embed.clone());
    named.insert("model.norm.weight".to_string(), grads.norm.clone());
    if let Some(lm_head) = &grads.lm_head {
        named.insert("lm_head.weight".to_string(), lm_head.clone());
    }
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let l = &grads.layers[i];
        named.insert(format!("{p}.input_layernorm.weight"), l.input_norm.clone());
        named.insert(
            format!("{p}.post_attention_layernorm.weight"),
            l.post_attention_norm.clone(),
        );
        if let Some(q) = &l.attention.q_norm {
            named.insert(format!("{p}.self_attn.q_norm.weight"), q.clone());
        }
        if let Some(k) = &l.attention.k_norm {
            named.insert(format!("{p}.self_attn.k_norm.weight"), k.clone());
        }
        for target in Target::ATTENTION.into_iter().chain(Target::MLP) {
            let g = linear_grads(grads, i, target);
            named.insert(format!("{p}.{}.weight", target.module()), g.weight.clone());
            if let Some(bias) = &g.bias {
                named.insert(format!("{p}.{}.bias", target.module()), bias.clone());
            }
        }
    }
    named
}

#[test]
fn full_parameter_gradients_of_every_weight_match_the_candle_graph() {
    for arch in [Architecture::Qwen3, Architecture::Qwen2] {
        let (model, vars) = tiny(arch, DType::F64).into_trainable().unwrap();
        let data: Vec<Data> = [(6, 1), (9, 2)]
            .iter()
            .map(|&(n, s)| sequence(n, s))
            .collect();
        let g: Vec<Vec<f64>> = data
            .iter()
            .enumerate()
            .map(|(i, (t, _))| values(t.len(), 70 + i as u64))
            .collect();
        let logprobs = candle_logprobs(
            &model,
            &data,
            RowAdapters {
                runs: vec![(2, None)],
            },
        );
        let candle_grads = weighted(&logprobs, &g).backward().unwrap();

        let weights = CpuWeights::<f64>::of(&model).unwrap();
        let weights = weights.decoder::<CpuTrain<f64>>();
        let sequences: Vec<TrainSequence<'_>> = data
            .iter()
            .map(|(tokens, targets)| TrainSequence {
                tokens,
                targets,
                adapter: None,
            })
            .collect();
        let ops = CpuTrain::<f64>::new();
        let mut batch = TrainBatch::new(data.iter().map(|(t, _)| t.len()).collect());
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
            &g.concat(),
            Some(&mut grads),
        )
        .unwrap();
        let ours = named_gradients(&grads, model.config.num_layers);
        assert_eq!(ours.len(), vars.len(), "{arch:?}: a gradient per weight");
        for (name, var) in &vars {
            let want = to_vec(candle_grads.get(var.as_tensor()).unwrap());
            assert_close(&format!("{arch:?} {name}"), &ours[name], &want, 1e-9);
        }
    }
}

#[test]
fn adapter_gradients_match_central_differences_in_f64() {
    let model = tiny(Architecture::Qwen3, DType::F64);
    let a = adapter(&model, 4, true, 3, DType::F64);
    let data: Vec<Data> = vec![sequence(6, 1), sequence(4, 2)];
    let g: Vec<f64> = values(10, 9);
    let weights = CpuWeights::<f64>::of(&model).unwrap();
    let weights = weights.decoder::<CpuTrain<f64>>();
    let sequences: Vec<TrainSequence<'_>> = data
        .iter()
        .map(|(tokens, targets)| TrainSequence {
            tokens,
            targets,
            adapter: Some(0),
        })
        .collect();
    let ops = CpuTrain::<f64>::new();
    let loss = |adapter: &Adapter| -> f64 {
        let hook = CpuAdapters::<f64>::of(&[adapter]).unwrap();
        let mut batch = TrainBatch::new(vec![6, 4]);
        let TrainOutput { logprobs: lp, .. } = train_forward(
            &ops,
            &model.config,
            &weights,
            &hook,
            &sequences,
            &mut batch,
            false,
            false,
        )
        .unwrap();
        lp.iter().zip(&g).map(|(l, g)| l * g).sum()
    };
    let hook = CpuAdapters::<f64>::training(&[&a]).unwrap();
    let mut batch = TrainBatch::new(vec![6, 4]);
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
    let gradients = hook.into_gradients().remove(0);
    for site in [
        Site::Layer(0, Target::Q),
        Site::Layer(3, Target::Down),
        Site::Unembed,
    ] {
        let pair = &a.sites[&site];
        for (var, analytic) in [
            (&pair.a, &gradients[&site].0),
            (&pair.b, &gradients[&site].1),
        ] {
            let original = to_vec(var.as_tensor());
            for index in [0, original.len() / 3, original.len() - 1] {
                let at = |delta: f64| {
                    let mut moved = original.clone();
                    moved[index] += delta;
                    set(var, moved);
                    let value = loss(&a);
                    set(var, original.clone());
                    value
                };
                let eps = 1e-5;
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                assert!(
                    (numeric - analytic[index]).abs() <= 1e-7 * (1.0 + numeric.abs()),
                    "{site:?}[{index}]: analytic {} vs numeric {numeric}",
                    analytic[index]
                );
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
fn trainer_logprobs_agree_with_the_sampler_in_f32() {
    let model = tiny(Architecture::Qwen3, DType::F32);
    let a = adapter(&model, 8, false, 5, DType::F32);
    let (tokens, targets) = sequence(12, 4);
    let weights = CpuWeights::<f32>::of(&model).unwrap();
    let hook = CpuAdapters::<f32>::of(&[&a]).unwrap();
    let sequences = [TrainSequence {
        tokens: &tokens,
        targets: &targets,
        adapter: Some(0),
    }];
    let ops = CpuTrain::<f32>::new();
    let mut batch = TrainBatch::new(vec![tokens.len()]);
    let TrainOutput {
        logprobs: trainer, ..
    } = train_forward(
        &ops,
        &model.config,
        &weights.decoder::<CpuTrain<f32>>(),
        &hook,
        &sequences,
        &mut batch,
        false,
        false,
    )
    .unwrap();
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
    for (i, (row, &t)) in logits.chunks_exact(vocab).zip(&targets).enumerate() {
        let sampler = opentinker_kernels::ops::log_softmax(row)[t as usize];
        assert!(
            (sampler - trainer[i]).abs() <= 1e-5,
            "position {i}: sampler {sampler} vs trainer {}",
            trainer[i]
        );
    }
}
