//! The sampler's CUDA model (the one layer definition on the `Gpu` backend) against the same
//! layers on the CPU, on the tiny model: logits of prefills and decode steps through adapters of
//! different ranks within 2e-4 (with bf16 matrices, against the CPU forward of the same rounded
//! matrices), a sequence's logits bit for bit alone or in a batch, and greedy generation token for
//! token; and training through the same layers on the `GpuTrain` backend against `CpuTrain`
//! (logprobs, and every weight's gradient of a full-parameter step). Runs where a GPU, its driver
//! and NVRTC are present (`scripts/gpu-check.sh`); elsewhere each test says it skipped and why.
#![cfg(feature = "cuda")]

#[path = "common/sampling.rs"]
mod sampling;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use opentinker::lora::{Adapter, LoraConfig};
use opentinker::model::layers::{
    DecoderWeights, NoAdapters, TrainOutput, TrainSequence, WeightGrads, train_backward,
    train_forward,
};
use opentinker::model::{Architecture, Model};
use opentinker::model::{CpuWeights, GpuWeights, ModelConfig};
use opentinker::model::{Matrix, Transformer};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::sample::{CudaModel, CudaModelOptions, CudaSequence, WeightFormat};
use opentinker::sample::{SequenceInput, forward};
use opentinker_kernels::cuda::{Gpu, GpuTrain, GpuTrainBatch};
use opentinker_kernels::{Backward, CpuTrain, KvCache, TrainBatch};

fn gpu(test: &str) -> Option<Arc<Gpu>> {
    match Gpu::new(0) {
        Ok(gpu) => Some(Arc::new(gpu)),
        Err(error) if error.is_unavailable() => {
            opentinker_test_tools::skip_for_machine(&error);
            None
        }
        Err(error) => panic!("{test}: {error}"),
    }
}

/// An adapter whose `B` is random too, so that it changes every projection's output.
fn adapter(model: &Model, rank: usize, seed: u64) -> Adapter {
    let config = LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        seed,
        ..LoraConfig::default()
    };
    let adapter = Adapter::new(&model.config, config, DType::F32).unwrap();
    for pair in adapter.sites.values() {
        let shape = pair.b.as_tensor().shape().clone();
        let b = (Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap() * 0.05).unwrap();
        pair.b.set(&b).unwrap();
    }
    adapter
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 2e-4 * (1.0 + w.abs()),
            "{what}: logit {i}: GPU {g} vs CPU {w}"
        );
    }
}

/// `model` with its matrices (projections, embedding, unembedding) rounded to bf16 and back, as
/// the CUDA forward keeps them in `WeightFormat::Bf16`.
fn rounded_matrices(model: &Transformer) -> Transformer {
    let round = |m: &Matrix| {
        let t = m.dense().unwrap();
        Matrix::Dense(
            t.to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap(),
        )
    };
    let mut rounded = model.clone();
    for layer in &mut rounded.layers {
        for linear in [
            &mut layer.q_proj,
            &mut layer.k_proj,
            &mut layer.v_proj,
            &mut layer.o_proj,
            &mut layer.gate_proj,
            &mut layer.up_proj,
            &mut layer.down_proj,
        ] {
            linear.weight = round(&linear.weight);
        }
    }
    rounded.embed_tokens = round(&rounded.embed_tokens);
    rounded.lm_head.weight = round(&rounded.lm_head.weight);
    rounded
}

const OPTIONS: CudaModelOptions = CudaModelOptions {
    weights: WeightFormat::F32,
    kv_blocks: 64,
    block_size: 16,
    adapter_slots: 4,
    max_rank: 16,
};

#[test]
fn the_cuda_forward_matches_the_cpu_forward_and_is_batch_invariant() {
    let Some(gpu) = gpu("cuda forward") else {
        return;
    };
    // Qwen2 has projection biases, Qwen3 normalises queries and keys: both paths run, and the
    // bf16 matrices.
    for (arch, weights) in [
        (Architecture::Qwen2, WeightFormat::F32),
        (Architecture::Qwen3, WeightFormat::F32),
        (Architecture::Qwen2, WeightFormat::Bf16),
    ] {
        let dir = tempfile::tempdir().unwrap();
        init_tiny(dir.path(), TinyShape::Tiny, arch, 3).unwrap();
        let mut model = Model::load(dir.path()).unwrap();
        let vocab = model.config.vocab_size;
        let (a, b) = (adapter(&model, 4, 1), adapter(&model, 16, 2));
        let options = CudaModelOptions { weights, ..OPTIONS };
        let mut cuda =
            CudaModel::from_transformer(Arc::clone(&gpu), &model.transformer, options).unwrap();
        if weights == WeightFormat::Bf16 {
            model.transformer = rounded_matrices(&model.transformer);
        }
        let (slot_a, slot_b) = (
            cuda.load_adapter(0, &a).unwrap(),
            cuda.load_adapter(2, &b).unwrap(),
        );
        let prompts: [Vec<u32>; 3] = [
            (0..7).map(|i| (i * 37 + 5) % 500).collect(),
            (0..19).map(|i| (i * 11 + 3) % 500).collect(),
            (0..3).map(|i| (i * 101 + 9) % 500).collect(),
        ];
        let cpu_adapters = [Some(&a), None, Some(&b)];
        let gpu_adapters = [Some(slot_a), None, Some(slot_b)];
        let tables: Vec<Vec<usize>> = vec![vec![5, 1], vec![9, 3], vec![0]];

        // Prefill, then two decode steps, on both sides.
        let mut caches: Vec<KvCache> = (0..3)
            .map(|_| KvCache::new(model.config.num_layers, model.config.num_kv_heads))
            .collect();
        let mut fed: Vec<Vec<u32>> = prompts.to_vec();
        let mut starts = [0usize; 3];
        for step in 0..3 {
            let mut inputs: Vec<SequenceInput<'_>> = fed
                .iter()
                .zip(caches.iter_mut())
                .zip(cpu_adapters)
                .map(|((tokens, cache), adapter)| SequenceInput {
                    tokens,
                    adapter,
                    cache,
                    all_logits: false,
                })
                .collect();
            let want: Vec<f32> = forward(&model.transformer, &mut inputs).unwrap().concat();
            let sequences: Vec<CudaSequence<'_>> = (0..3)
                .map(|i| CudaSequence {
                    tokens: &fed[i],
                    start: starts[i],
                    blocks: &tables[i],
                    adapter: gpu_adapters[i],
                    all_logits: false,
                })
                .collect();
            let logits = cuda.forward(&sequences).unwrap();
            let got = gpu.download(&logits).unwrap();
            assert_close(&format!("{arch:?} {weights:?} step {step}"), &got, &want);
            for i in 0..3 {
                starts[i] += fed[i].len();
                fed[i] = vec![((step * 31 + i * 7) % 400) as u32];
            }
        }

        // Sequence 1's prompt again, alone, in fresh blocks: the same bits as in the batch.
        let all = [0, 1, 2].map(|i| CudaSequence {
            tokens: &prompts[i],
            start: 0,
            blocks: &tables[i],
            adapter: gpu_adapters[i],
            all_logits: false,
        });
        let batched = gpu.download(&cuda.forward(&all).unwrap()).unwrap();
        let fresh = [20, 21];
        let alone = CudaSequence {
            tokens: &prompts[1],
            start: 0,
            blocks: &fresh,
            adapter: None,
            all_logits: false,
        };
        let alone = gpu.download(&cuda.forward(&[alone]).unwrap()).unwrap();
        assert_eq!(
            alone,
            batched[vocab..2 * vocab],
            "{arch:?}: alone vs batched"
        );

        // Greedy generation: the CPU forward's argmax token by token.
        let generated = cuda.generate_greedy(&prompts, &gpu_adapters, 6).unwrap();
        for (i, prompt) in prompts.iter().enumerate() {
            let mut cache = KvCache::new(model.config.num_layers, model.config.num_kv_heads);
            let mut tokens = prompt.clone();
            let mut want = Vec::new();
            for _ in 0..6 {
                let mut input = [SequenceInput {
                    tokens: &tokens,
                    adapter: cpu_adapters[i],
                    cache: &mut cache,
                    all_logits: false,
                }];
                let logits = forward(&model.transformer, &mut input).unwrap().remove(0);
                let best = logits
                    .iter()
                    .enumerate()
                    .fold((0, f32::NEG_INFINITY), |best, (t, &l)| {
                        if l > best.1 { (t, l) } else { best }
                    })
                    .0 as u32;
                want.push(best);
                tokens = vec![best];
            }
            assert_eq!(generated[i], want, "{arch:?}: sequence {i}");
        }
    }
}

#[test]
fn bad_input_is_refused_before_any_launch() {
    let Some(gpu) = gpu("cuda forward bad input") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen2, 3).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let mut cuda = CudaModel::from_transformer(gpu, &model.transformer, OPTIONS).unwrap();
    let blocks = [0];
    let bad_token = [CudaSequence {
        tokens: &[3, 100_000],
        start: 0,
        blocks: &blocks,
        adapter: None,
        all_logits: false,
    }];
    let error = cuda.forward(&bad_token).err().unwrap().to_string();
    assert!(error.contains("token id 100000"), "{error}");
    let past_blocks = [CudaSequence {
        tokens: &[1; 17],
        start: 0,
        blocks: &blocks,
        adapter: None,
        all_logits: false,
    }];
    let error = cuda.forward(&past_blocks).err().unwrap().to_string();
    assert!(error.contains("past its 1 blocks"), "{error}");
}

/// A full-parameter training step's forward and backward through the layers on `GpuTrain`
/// against `CpuTrain<f32>`: the targets' logprobs (with the fused head and through the logits)
/// and every weight's gradient, on Qwen2 (biases, tied unembedding), Qwen3 (query and key
/// norms) and Gemma 3 (output norms, the GELU gate, scaled embeddings, sliding windows).
#[test]
fn training_through_the_layers_on_cuda_matches_the_cpu() {
    let Some(gpu) = gpu("cuda training") else {
        return;
    };
    for arch in [
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
    ] {
        let dir = tempfile::tempdir().unwrap();
        init_tiny(dir.path(), TinyShape::Tiny, arch, 5).unwrap();
        let model = Model::load(dir.path()).unwrap();
        let (config, transformer) = (&model.config, &model.transformer);
        let data: Vec<(Vec<u32>, Vec<u32>)> = [(6u32, 3u32), (9, 11)]
            .iter()
            .map(|&(n, seed)| {
                let tokens = (0..n).map(|i| (i * 37 + seed * 13) % 500).collect();
                let targets = (0..n).map(|i| (i * 53 + seed * 7 + 1) % 500).collect();
                (tokens, targets)
            })
            .collect();
        let sequences: Vec<TrainSequence<'_>> = data
            .iter()
            .map(|(tokens, targets)| TrainSequence {
                tokens,
                targets,
                adapter: None,
                temperature: 1.0,
            })
            .collect();
        let lengths = vec![6, 9];
        let g: Vec<f32> = (0..15).map(|i| ((i * 7) % 5) as f32 * 0.25 - 0.5).collect();

        let cpu = CpuWeights::<f32>::of(transformer).unwrap();
        let (want_fused, want_logprobs, want_grads) = training_step(
            &CpuTrain::<f32>::new(),
            config,
            &cpu.decoder(),
            &sequences,
            || TrainBatch::new(lengths.clone()),
            &g,
        );
        let weights = GpuWeights::upload(&gpu, transformer, WeightFormat::F32).unwrap();
        let (fused, logprobs, grads) = training_step(
            &GpuTrain::new(&gpu),
            config,
            &weights.decoder(),
            &sequences,
            || GpuTrainBatch::new(&gpu, lengths.clone()).unwrap(),
            &gpu.upload(&g).unwrap(),
        );
        assert_close(
            &format!("{arch:?} fused-head logprobs"),
            &fused,
            &want_fused,
        );
        assert_close(&format!("{arch:?} logprobs"), &logprobs, &want_logprobs);
        assert_eq!(
            grads.len(),
            want_grads.len(),
            "{arch:?}: a gradient per weight"
        );
        for ((name, got), (want_name, want)) in grads.iter().zip(&want_grads) {
            assert_eq!(name, want_name);
            // Relative to the gradient's largest value: sums of many terms in another order.
            let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-3 * scale,
                    "{arch:?} {name}[{i}]: GPU {a} vs CPU {b} (largest {scale})"
                );
            }
        }
    }
}

/// One full-parameter step through the layers on `ops`: the targets' logprobs with the fused
/// head, then through the logits with every weight's gradient from `g`, all on the host.
#[allow(clippy::type_complexity)]
fn training_step<'b, B: Backward<Elem = f32>>(
    ops: &B,
    config: &ModelConfig,
    weights: &DecoderWeights<'_, B>,
    sequences: &[TrainSequence<'_>],
    mut batch: impl FnMut() -> B::Batch<'b>,
    g: &B::Buffer,
) -> (Vec<f32>, Vec<f32>, Vec<(String, Vec<f32>)>) {
    let fused = train_forward(
        ops,
        config,
        weights,
        &NoAdapters,
        sequences,
        &mut batch(),
        false,
        false,
    )
    .unwrap()
    .logprobs;
    let mut kept = batch();
    let TrainOutput { logprobs, tape } = train_forward(
        ops,
        config,
        weights,
        &NoAdapters,
        sequences,
        &mut kept,
        true,
        true,
    )
    .unwrap();
    let mut grads = WeightGrads::zeros(ops, config).unwrap();
    train_backward(
        ops,
        config,
        weights,
        &NoAdapters,
        sequences,
        &mut kept,
        &tape.unwrap(),
        g,
        Some(&mut grads),
    )
    .unwrap();
    let named = grads
        .into_named(&config.features)
        .into_iter()
        .map(|(name, grad)| (name, ops.download(grad).unwrap()))
        .collect();
    (
        ops.download(fused).unwrap(),
        ops.download(logprobs).unwrap(),
        named,
    )
}

/// The training engine with its passes on CUDA against the same engine on the CPU: two LoRA
/// adapters of different ranks (one adapting the unembedding too) under two losses in one fused
/// call, two steps each (B moves off zero at the first, so the second has every gradient):
/// outputs, every gradient and the weights after each step (the adapters' state kept on the
/// device: the state exported from there, imported again and stepped, is the CPU's); and a
/// full-parameter engine's step (the weights sent to the device again after it).
#[test]
fn the_training_engine_on_cuda_matches_the_engine_on_the_cpu() {
    use opentinker::model::Device as ModelDevice;
    use opentinker::train::{AdamParams, Datum, Loss, TrainingEngine, WorkItem};

    if gpu("the training engine on cuda").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen2, 5).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let datum = |seed: u32, n: usize| {
        let tokens: Vec<u32> = (0..=n as u32)
            .map(|i| (i * 37 + seed * 101) % 500 + 3)
            .collect();
        Datum {
            input_tokens: tokens[..n].to_vec(),
            target_tokens: tokens[1..].to_vec(),
            mask: (0..n).map(|i| f32::from(u8::from(i >= n / 2))).collect(),
            advantages: Some(
                (0..n)
                    .map(|i| ((i as f32 + seed as f32) * 0.7).sin())
                    .collect(),
            ),
            sampler_logprobs: Some(vec![-6.3; n]),
            ..Datum::default()
        }
    };
    let items = || {
        vec![
            WorkItem::new(
                "b",
                vec![datum(1, 9), datum(2, 5)],
                Loss::ImportanceSampling,
            ),
            WorkItem::new("a", vec![datum(3, 7)], Loss::CrossEntropy),
        ]
    };
    let lora = |rank: usize, seed: u64, unembed: bool| LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        train_unembed: unembed,
        seed,
        ..LoraConfig::default()
    };
    let params = AdamParams {
        learning_rate: 0.05,
        ..AdamParams::default()
    };
    let cuda = ModelDevice::Cuda { ordinal: 0 };
    let shared = Arc::new(model.transformer.clone());
    let mut cpu = TrainingEngine::new(Arc::clone(&shared), DType::F32);
    let mut gpu = TrainingEngine::new(shared, DType::F32)
        .on_device(cuda)
        .unwrap();
    assert_eq!(gpu.device(), cuda);
    for engine in [&mut cpu, &mut gpu] {
        engine.add_adapter("a", lora(4, 1, false)).unwrap();
        engine.add_adapter("b", lora(8, 2, true)).unwrap();
    }
    for step in 0..2 {
        let want = cpu.forward_backward(&items()).unwrap();
        let got = gpu.forward_backward(&items()).unwrap();
        for (g, w) in got.iter().zip(&want) {
            let (g_rows, w_rows) = (g.logprobs.concat(), w.logprobs.concat());
            assert_close(&format!("step {step}: logprobs"), &g_rows, &w_rows);
            assert!(
                (g.loss - w.loss).abs() <= 1e-4 * (1.0 + w.loss.abs()),
                "step {step}: loss {} vs {}",
                g.loss,
                w.loss
            );
        }
        for id in ["a", "b"] {
            let (want, got) = (
                cpu.gradients(id).unwrap().unwrap(),
                gpu.gradients(id).unwrap().unwrap(),
            );
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>()
            );
            for (name, w) in &want {
                assert_tensor_close(
                    &format!("step {step}: {id} {name}'s gradient"),
                    &got[name],
                    w,
                );
            }
            cpu.optim_step(id, &params).unwrap();
            gpu.optim_step(id, &params).unwrap();
            let (want, got) = (cpu.parameters(id).unwrap(), gpu.parameters(id).unwrap());
            for ((name, w), (_, g)) in want.iter().zip(&got) {
                assert_tensor_close(
                    &format!("step {step}: {id} {name} after the step"),
                    g.as_tensor(),
                    w.as_tensor(),
                );
            }
        }
    }

    // The state kept on the device comes down whole (weights, moments, gradients) and goes up
    // again: a step after the round trip is the CPU's step.
    cpu.forward_backward(&items()).unwrap();
    gpu.forward_backward(&items()).unwrap();
    for id in ["a", "b"] {
        let (want, got) = (cpu.export_state(id).unwrap(), gpu.export_state(id).unwrap());
        assert_eq!(got.step, want.step);
        for (g, w) in got.tensors.iter().zip(&want.tensors) {
            assert_eq!(g.name, w.name);
            let what = |part: &str| format!("{id} {}'s {part} after the round trip", g.name);
            let (gm, wm) = (g.moments.as_ref().unwrap(), w.moments.as_ref().unwrap());
            assert_tensor_close(&what("first moment"), &gm.0, &wm.0);
            assert_tensor_close(&what("second moment"), &gm.1, &wm.1);
            let (gg, wg) = (g.gradient.as_ref().unwrap(), w.gradient.as_ref().unwrap());
            assert_tensor_close(&what("gradient"), gg, wg);
        }
        gpu.import_state(id, got).unwrap();
        cpu.optim_step(id, &params).unwrap();
        gpu.optim_step(id, &params).unwrap();
        let (want, got) = (cpu.parameters(id).unwrap(), gpu.parameters(id).unwrap());
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_tensor_close(
                &format!("{id} {name} after the round trip's step"),
                g.as_tensor(),
                w.as_tensor(),
            );
        }
    }

    // A budget for the adapters kept on the device refuses the one that would pass it, by name,
    // and the others train on.
    let bytes: u64 = gpu
        .parameters("a")
        .unwrap()
        .iter()
        .map(|(_, var)| 16 * var.as_tensor().elem_count() as u64)
        .sum();
    let mut tight = TrainingEngine::new(Arc::new(model.transformer.clone()), DType::F32)
        .on_device(cuda)
        .unwrap()
        .with_device_budget(bytes);
    tight.add_adapter("a", lora(4, 1, false)).unwrap();
    let error = tight.add_adapter("b", lora(8, 2, true)).unwrap_err();
    assert!(
        matches!(error, opentinker::train::TrainError::DeviceBudget { .. })
            && error.to_string().contains("\"b\""),
        "{error}"
    );
    let a_only = WorkItem::new("a", vec![datum(3, 7)], Loss::CrossEntropy);
    tight.forward_backward(&[a_only]).unwrap();
    tight.optim_step("a", &params).unwrap();

    let full = || TrainingEngine::full_parameters(model.transformer.clone(), DType::F32).unwrap();
    let (mut cpu, mut gpu) = (full(), full().on_device(cuda).unwrap());
    let item = || {
        vec![WorkItem::new(
            opentinker::train::FULL_PARAMETERS,
            vec![datum(4, 8), datum(5, 6)],
            Loss::CrossEntropy,
        )]
    };
    for step in 0..2 {
        let (want, got) = (
            cpu.forward_backward(&item()).unwrap(),
            gpu.forward_backward(&item()).unwrap(),
        );
        assert_close(
            &format!("full step {step}: logprobs"),
            &got[0].logprobs.concat(),
            &want[0].logprobs.concat(),
        );
        let id = opentinker::train::FULL_PARAMETERS;
        let (want, got) = (
            cpu.gradients(id).unwrap().unwrap(),
            gpu.gradients(id).unwrap().unwrap(),
        );
        for (name, w) in &want {
            assert_tensor_close(
                &format!("full step {step}: {name}'s gradient"),
                &got[name],
                w,
            );
        }
        cpu.optim_step(id, &params).unwrap();
        gpu.optim_step(id, &params).unwrap();
    }
}

/// `got` within 1e-3 of `want`'s largest value (sums of many terms in another order).
fn assert_tensor_close(what: &str, got: &Tensor, want: &Tensor) {
    let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let (got, want) = (values(got), values(want));
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-3 * scale,
            "{what}[{i}]: GPU {a} vs CPU {b} (largest {scale})"
        );
    }
}

/// The sampling engine on `CudaSampler` against the same engine on the CPU: base and adapter
/// requests of several samples (forked caches), greedy and seeded draws with top-p, prompt
/// logprobs, a prompt whose start is in the prefix cache, and three adapter versions through two
/// slots (one waits, then takes the slot least recently used): the same tokens, logprobs
/// within 1e-3, the same cached prompt positions; and a request's bits on the device the same
/// alone as in that batch.
#[test]
fn the_sampling_engine_on_cuda_matches_the_engine_on_the_cpu() {
    use opentinker::lora::AdapterRegistry;
    use opentinker::sample::{
        CudaSampler, EngineConfig, PolicyRef, SampleRequest, SamplingEngine, SamplingParams, Stop,
    };

    let Some(gpu) = gpu("the sampling engine on cuda") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen3, 5).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let registry = AdapterRegistry::new(Arc::new(model.transformer.clone()));
    let policies: Vec<_> = (0..3)
        .map(|i| {
            let adapter = adapter(&model, 4 + 4 * i, i as u64 + 1);
            registry.publish(&format!("p{i}"), &adapter).unwrap()
        })
        .collect();
    let prompt = |seed: u32, len: u32| -> Vec<u32> {
        (0..len).map(|i| (i * 31 + seed * 17) % 500 + 3).collect()
    };
    let request = |prompt: Vec<u32>, policy: Option<usize>, temperature: f64, samples: usize| {
        let mut request = SampleRequest::new(
            prompt,
            SamplingParams {
                max_tokens: 12,
                temperature,
                top_p: 0.9,
                seed: Some(7 + samples as u64),
                stop: Some(Stop::Tokens(Vec::new())),
                num_samples: samples,
                ..SamplingParams::default()
            },
        );
        request.policy = policy.map(|i| PolicyRef {
            name: policies[i].name.clone(),
            version: Some(policies[i].version),
        });
        request
    };
    let requests = || {
        let mut asks_logprobs = request(prompt(1, 20), None, 0.0, 1);
        asks_logprobs.prompt_asks.logprobs = true;
        asks_logprobs.prompt_asks.top_k = 3;
        let mut longer = prompt(1, 20);
        longer.extend(prompt(4, 9));
        vec![
            asks_logprobs,
            request(prompt(2, 37), Some(0), 1.0, 3),
            request(prompt(3, 16), Some(1), 0.7, 2),
            request(prompt(2, 37), Some(2), 1.0, 1),
            request(longer, None, 1.0, 2),
        ]
    };
    let config = EngineConfig {
        kv_budget_positions: 4096,
        prefix_cache_positions: 1024,
    };
    let options = CudaModelOptions {
        weights: WeightFormat::F32,
        kv_blocks: CudaSampler::blocks_for(&config, 16),
        block_size: 16,
        adapter_slots: 2,
        max_rank: 16,
    };
    let cuda_engine = || {
        let backend = CudaSampler::new(Arc::clone(&gpu), registry.base(), options).unwrap();
        SamplingEngine::with_backend(
            backend,
            Arc::clone(&registry),
            None,
            Vec::new(),
            config.clone(),
        )
    };
    let mut cpu = SamplingEngine::new(Arc::clone(&registry), None, Vec::new(), config.clone());
    let mut on_gpu = cuda_engine();
    // The first four (the third adapter waits for a slot on the device), then the one that
    // finds its prompt's start in the prefix cache.
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for part in [0..4, 4..5] {
        let part_of = |all: Vec<SampleRequest>| all[part.clone()].to_vec();
        want.extend(sampling::run(&mut cpu, part_of(requests())));
        got.extend(sampling::run(&mut on_gpu, part_of(requests())));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.samples.len(), w.samples.len(), "request {i}");
        assert_eq!(
            g.cached_prompt_tokens, w.cached_prompt_tokens,
            "request {i}"
        );
        for (s, (gs, ws)) in g.samples.iter().zip(&w.samples).enumerate() {
            assert_eq!(gs.tokens, ws.tokens, "request {i} sample {s}");
            for (a, b) in gs.logprobs.iter().zip(&ws.logprobs) {
                assert!((a - b).abs() <= 1e-3, "request {i} sample {s}: {a} vs {b}");
            }
        }
        let (gp, wp) = (&g.prompt.logprobs, &w.prompt.logprobs);
        assert_eq!(gp.is_some(), wp.is_some(), "request {i}");
        for (a, b) in gp.iter().flatten().zip(wp.iter().flatten()) {
            match (a, b) {
                (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-3, "request {i}: {a} vs {b}"),
                _ => assert_eq!(a.is_some(), b.is_some(), "request {i}"),
            }
        }
    }
    assert!(
        got[4].cached_prompt_tokens > 0,
        "the prefix cache served the longer prompt"
    );

    // An adapter the device's slots cannot hold is refused when it arrives, naming why.
    let big = registry.publish("big", &adapter(&model, 32, 9)).unwrap();
    let mut refused = request(prompt(5, 8), None, 0.0, 1);
    refused.policy = Some(PolicyRef {
        name: big.name.clone(),
        version: Some(big.version),
    });
    let error = on_gpu.add_request(refused).unwrap_err();
    assert!(
        matches!(error, opentinker::sample::SampleError::AdapterRefused(_))
            && error.to_string().contains("rank 32"),
        "{error}"
    );

    let alone = sampling::run(&mut cuda_engine(), vec![requests()[1].clone()]);
    let bits = |s: &opentinker::sample::Sample| -> (Vec<u32>, Vec<u32>) {
        (
            s.tokens.clone(),
            s.logprobs.iter().map(|l| l.to_bits()).collect(),
        )
    };
    for (a, b) in alone[0].samples.iter().zip(&got[1].samples) {
        assert_eq!(
            bits(a),
            bits(b),
            "a request's bits alone and in a batch on the device"
        );
    }
}

/// Tokens drawn on the device (`Gpu::draw_tokens`) are the host's `choose` on the same rows:
/// greedy, temperature alone, top-k, top-p and both, each with the most likely alternatives, on
/// rows with ties and on a vocabulary of Qwen's size: the same tokens and alternatives, logprobs
/// within 1e-5 (the sums in f64 meet in another order); and a draw's bits the same alone as among
/// others.
#[test]
fn tokens_drawn_on_the_device_are_the_hosts_choice() {
    use opentinker::sample::SamplingParams;
    use opentinker::sample::choose;
    use opentinker_kernels::cuda::Draw;
    use rand::{RngExt, SeedableRng};

    let Some(gpu) = gpu("drawing on the device") else {
        return;
    };
    let settings = [
        (0.0, None, 1.0, 3),
        (1.0, None, 1.0, 0),
        (0.7, None, 1.0, 5),
        (1.0, Some(1), 1.0, 2),
        (1.0, Some(5), 1.0, 0),
        (1.3, None, 0.9, 4),
        (0.8, Some(40), 0.5, 1),
        (1.0, None, 0.999, 0),
    ];
    for vocab in [7usize, 1000, 151_936] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(vocab as u64);
        // Spread rows, a row of ties (values in halves) and a peaked row.
        let mut logits = Vec::new();
        for row in 0..3 {
            for i in 0..vocab {
                let normal: f32 = (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 3.0 - 6.0;
                logits.push(match row {
                    0 => normal,
                    1 => (normal * 2.0).round() / 2.0,
                    _ => normal * 0.3 + if i % 97 == 3 { 9.0 } else { 0.0 },
                });
            }
        }
        let on_device = gpu.upload(&logits).unwrap();
        let mut draws = Vec::new();
        let mut wants = Vec::new();
        for row in 0..3 {
            for &(temperature, top_k, top_p, top) in &settings {
                for _ in 0..6 {
                    let uniform = rng.random::<f64>();
                    let params = SamplingParams {
                        temperature,
                        top_k,
                        top_p,
                        ..SamplingParams::default()
                    };
                    let host_row = &logits[row * vocab..(row + 1) * vocab];
                    wants.push(choose(host_row, &params, uniform, top));
                    draws.push(Draw {
                        row,
                        temperature,
                        top_k,
                        top_p,
                        uniform,
                        top,
                    });
                }
            }
        }
        let got = gpu.draw_tokens(&on_device, vocab, &draws).unwrap();
        for ((g, w), draw) in got.iter().zip(&wants).zip(&draws) {
            let what = format!("vocab {vocab}, {draw:?}");
            assert_eq!(g.token, w.token, "{what}");
            assert!(
                (g.logprob - w.logprob).abs() <= 1e-5,
                "{what}: {g:?} vs {w:?}"
            );
            let ids = |top: &[(u32, f32)]| top.iter().map(|t| t.0).collect::<Vec<_>>();
            assert_eq!(ids(&g.top), ids(&w.top), "{what}");
            for (a, b) in g.top.iter().zip(&w.top) {
                assert!((a.1 - b.1).abs() <= 1e-5, "{what}: {a:?} vs {b:?}");
            }
        }
        let last = draws.len() - 1;
        let alone = gpu.draw_tokens(&on_device, vocab, &draws[last..]).unwrap();
        assert_eq!(alone[0].token, got[last].token);
        assert_eq!(alone[0].logprob.to_bits(), got[last].logprob.to_bits());
    }
    // A draw that reads past the rows is refused before any launch.
    let one_row = gpu.upload(&[0.0f32; 4]).unwrap();
    let past = Draw {
        row: 1,
        temperature: 1.0,
        top_k: None,
        top_p: 1.0,
        uniform: 0.5,
        top: 0,
    };
    let error = gpu.draw_tokens(&one_row, 4, &[past]).unwrap_err();
    assert!(error.to_string().contains("row 1 of 1"), "{error}");
}

/// A base served on CUDA (`serve --device cuda`'s path) against the same base served on the
/// CPU, through the service's loops: an adapter added, trained two steps and published, then
/// sampled: the same losses (within 1e-4) and the same tokens.
#[test]
fn a_base_served_on_cuda_trains_and_samples_as_on_the_cpu() {
    use opentinker::model::Device as ModelDevice;
    use opentinker::sample::{PolicyRef, SampleRequest, SamplingParams, Stop};
    use opentinker::service::{DeviceOptions, FairShare, ServedBase, tiny_model_dir};
    use opentinker::train::{AdamParams, Datum, Loss, WorkItem};

    if gpu("a base served on cuda").is_none() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = tiny_model_dir(data.path()).unwrap();
    let run = |device: ModelDevice| {
        let options = DeviceOptions {
            device,
            ..DeviceOptions::cpu()
        };
        let base = ServedBase::load("tiny", &dir, 4096, FairShare::unlimited(), options).unwrap();
        let tokens: Vec<u32> = (0..25).map(|i| (i * 13 + 5) % 500 + 3).collect();
        let item = WorkItem::new(
            "a",
            vec![Datum {
                input_tokens: tokens[..24].to_vec(),
                target_tokens: tokens[1..].to_vec(),
                mask: vec![1.0; 24],
                ..Datum::default()
            }],
            Loss::CrossEntropy,
        );
        futures::executor::block_on(async {
            let lora = LoraConfig {
                rank: 8,
                alpha: 16.0,
                seed: 3,
                ..LoraConfig::default()
            };
            base.trainer
                .with(move |engine| {
                    assert_eq!(engine.device(), device);
                    engine.add_adapter("a", lora)
                })
                .await
                .unwrap()
                .unwrap();
            let mut losses = Vec::new();
            for _ in 0..2 {
                let out = base
                    .trainer
                    .forward_backward(vec![item.clone()])
                    .await
                    .unwrap();
                losses.push(out[0].loss);
                let params = AdamParams {
                    learning_rate: 0.02,
                    ..AdamParams::default()
                };
                base.trainer
                    .with(move |engine| engine.optim_step("a", &params))
                    .await
                    .unwrap()
                    .unwrap();
            }
            let registry = std::sync::Arc::clone(&base.registry);
            let version = base
                .trainer
                .with(move |engine| registry.publish("a", engine.adapter("a").unwrap()))
                .await
                .unwrap()
                .unwrap();
            let mut request = SampleRequest::new(
                tokens[..10].to_vec(),
                SamplingParams {
                    max_tokens: 8,
                    temperature: 0.0,
                    stop: Some(Stop::Tokens(Vec::new())),
                    num_samples: 2,
                    ..SamplingParams::default()
                },
            );
            request.policy = Some(PolicyRef {
                name: version.name.clone(),
                version: Some(version.version),
            });
            let sampled = base.sampler.sample(request).await.unwrap();
            (losses, sampled.samples[0].tokens.clone())
        })
    };
    let (want_losses, want_tokens) = run(ModelDevice::Cpu);
    let (losses, tokens) = run(ModelDevice::Cuda { ordinal: 0 });
    for (g, w) in losses.iter().zip(&want_losses) {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "loss {g} vs {w}");
    }
    assert_eq!(tokens, want_tokens);
}

/// AdamW on the device (`GpuTrainedAdapter`) from the CPU engine's gradients against the CPU
/// engine's `optim_step`, two steps with the global clip in play: every weight within 1e-5 of
/// the tensor's largest.
#[test]
fn an_adapter_steps_on_the_device_as_the_cpu_engine_steps_it() {
    use opentinker::lora::{GpuAdapterWeights, GpuPair, GpuPairGradients, GpuTrainedAdapter};
    use opentinker::model::Site;
    use opentinker::train::{AdamParams, Datum, Loss, TrainingEngine, WorkItem};
    use opentinker_kernels::cuda::AdamStep;
    use std::collections::BTreeMap;

    let Some(gpu) = gpu("adamw on the device") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen2, 5).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let mut cpu = TrainingEngine::new(Arc::new(model.transformer.clone()), DType::F32);
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        seed: 2,
        ..LoraConfig::default()
    };
    cpu.add_adapter("a", lora).unwrap();
    let sites: Vec<Site> = cpu.adapter("a").unwrap().sites.keys().copied().collect();
    let weights = GpuAdapterWeights::upload(&gpu, cpu.adapter("a").unwrap()).unwrap();
    let mut trained = GpuTrainedAdapter::new(&gpu, weights).unwrap();
    let params = AdamParams {
        learning_rate: 0.03,
        weight_decay: 0.1,
        grad_clip_norm: 0.05,
        ..AdamParams::default()
    };
    let tokens: Vec<u32> = (0..17).map(|i| (i * 29 + 3) % 500 + 3).collect();
    let item = WorkItem::new(
        "a",
        vec![Datum {
            input_tokens: tokens[..16].to_vec(),
            target_tokens: tokens[1..].to_vec(),
            mask: vec![1.0; 16],
            ..Datum::default()
        }],
        Loss::CrossEntropy,
    );
    for step in 0..2 {
        cpu.forward_backward(std::slice::from_ref(&item)).unwrap();
        // The engine's gradients are in its tensors' order: each site's A, then its B.
        let named = cpu.gradients("a").unwrap().unwrap();
        let names: Vec<String> = cpu
            .parameters("a")
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let values = |name: &str| named[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let gradients: GpuPairGradients = sites
            .iter()
            .zip(names.chunks_exact(2))
            .map(|(site, pair)| {
                let upload = |name: &str| gpu.upload(&values(name)).unwrap();
                (
                    *site,
                    GpuPair {
                        a: upload(&pair[0]),
                        b: upload(&pair[1]),
                    },
                )
            })
            .collect();
        let adam = AdamStep {
            learning_rate: params.learning_rate,
            beta1: params.beta1,
            beta2: params.beta2,
            eps: params.eps,
            weight_decay: params.weight_decay,
            step: 0,
            clip: 1.0,
        };
        trained
            .adamw(&gpu, &gradients, adam, params.grad_clip_norm)
            .unwrap();
        cpu.optim_step("a", &params).unwrap();
        let on_device: BTreeMap<Site, (Vec<f32>, Vec<f32>)> =
            trained.weights.download(&gpu).unwrap();
        let want = cpu.parameters("a").unwrap();
        for ((site, (a, b)), pair) in on_device.iter().zip(want.chunks_exact(2)) {
            for (got, (name, var)) in [(a, &pair[0]), (b, &pair[1])] {
                let want = var
                    .as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 * scale,
                        "step {step}: {site:?} {name}[{i}]: device {g} vs CPU {w}"
                    );
                }
            }
        }
        assert_eq!(trained.step(), step + 1);
    }
}

/// On the device, the sampler's logprobs of what it sampled and of the prompt agree with the
/// training engine's forward of the same tokens through the same adapter (within 1e-4), as they
/// do on the CPU: the sampler and the trainer of a base served on CUDA see one model.
#[test]
fn the_sampler_and_the_trainer_agree_on_the_device() {
    use opentinker::lora::AdapterRegistry;
    use opentinker::model::Device as ModelDevice;
    use opentinker::sample::{
        CudaSampler, EngineConfig, PolicyRef, SampleRequest, SamplingEngine, SamplingParams, Stop,
    };
    use opentinker::train::{Datum, Loss, TrainingEngine, WorkItem};

    let Some(gpu) = gpu("sampler and trainer on the device") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen3, 5).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let registry = AdapterRegistry::new(Arc::new(model.transformer.clone()));
    let lora = LoraConfig {
        rank: 8,
        alpha: 16.0,
        seed: 4,
        ..LoraConfig::default()
    };
    let mut trainer = TrainingEngine::new(Arc::clone(registry.base()), DType::F32)
        .on_device(ModelDevice::Cuda { ordinal: 0 })
        .unwrap();
    trainer.add_adapter("b", lora).unwrap();
    // B off zero, so the adapter changes what it samples.
    for pair in trainer.adapter("b").unwrap().sites.values() {
        let shape = pair.b.as_tensor().shape().clone();
        pair.b
            .set(&(Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap() * 0.05).unwrap())
            .unwrap();
    }
    let version = registry
        .publish("b", trainer.adapter("b").unwrap())
        .unwrap();
    let config = EngineConfig {
        kv_budget_positions: 512,
        prefix_cache_positions: 0,
    };
    assert!(CudaSampler::blocks_for(&config, OPTIONS.block_size) <= OPTIONS.kv_blocks);
    let backend = CudaSampler::new(Arc::clone(&gpu), registry.base(), OPTIONS).unwrap();
    let mut sampler =
        SamplingEngine::with_backend(backend, Arc::clone(&registry), None, Vec::new(), config);
    let prompt: Vec<u32> = (0..11).map(|i| (i * 31 + 4 * 17) % 500 + 3).collect();
    let mut request = SampleRequest::new(
        prompt.clone(),
        SamplingParams {
            max_tokens: 20,
            seed: Some(3),
            stop: Some(Stop::Tokens(Vec::new())),
            ..SamplingParams::default()
        },
    );
    request.policy = Some(PolicyRef {
        name: version.name.clone(),
        version: Some(version.version),
    });
    request.prompt_asks.logprobs = true;
    let output = sampling::run(&mut sampler, vec![request]).remove(0);
    let sample = &output.samples[0];
    let mut tokens = prompt.clone();
    tokens.extend(&sample.tokens);
    let n = tokens.len() - 1;
    let datum = Datum {
        input_tokens: tokens[..n].to_vec(),
        target_tokens: tokens[1..].to_vec(),
        mask: vec![1.0; n],
        ..Datum::default()
    };
    let trained = trainer
        .forward(&[WorkItem::new("b", vec![datum], Loss::CrossEntropy)])
        .unwrap()
        .remove(0)
        .logprobs
        .remove(0);
    for (i, &sampled) in sample.logprobs.iter().enumerate() {
        let want = trained[prompt.len() - 1 + i];
        assert!(
            (sampled - want).abs() < 1e-4,
            "token {i}: sampler {sampled} vs trainer {want}"
        );
    }
    let prompt_logprobs = output.prompt.logprobs.unwrap();
    assert_eq!(prompt_logprobs[0], None);
    for (i, logprob) in prompt_logprobs.iter().enumerate().skip(1) {
        let (got, want) = (logprob.unwrap(), trained[i - 1]);
        assert!(
            (got - want).abs() < 1e-4,
            "prompt token {i}: {got} vs {want}"
        );
    }
}
