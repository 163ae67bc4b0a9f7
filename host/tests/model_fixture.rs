//! Our model against the reference implementation: logits and chat-template renders of the
//! committed `transformers` fixture (see `scripts/make_model_fixture.py`).

mod common;

use candle_core::{Device, Tensor};
use common::{fixture, max_abs_diff};
use opentinker::model::layers::{
    NoAdapters, TrainOutput, TrainSequence, WeightGrads, train_backward, train_forward,
};
use opentinker::model::{CpuWeights, Model};
use opentinker::text::{ChatMessage, ChatTemplate, Tokenizer};
use opentinker_kernels::{CpuTrain, TrainBatch};

fn check_logits(family: &str) {
    let dir = fixture(family);
    let model = Model::load(&dir).unwrap_or_else(|e| panic!("{family}: {e}"));
    let reference =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap();
    for i in 0.. {
        let Some(tokens) = reference.get(&format!("tokens.{i}")) else {
            assert!(i >= 3, "{family}: only {i} reference sequences");
            break;
        };
        let tokens = tokens
            .to_dtype(candle_core::DType::U32)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let expected = &reference[&format!("logits.{i}")];
        let ours = model
            .transformer
            .forward(&tokens)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let difference = max_abs_diff(&ours, expected);
        assert!(
            difference <= 1e-4,
            "{family} sequence {i}: logits differ by {difference}"
        );
    }
}

#[test]
fn llama_logits_match_transformers() {
    check_logits("llama");
}

#[test]
fn qwen2_logits_match_transformers() {
    check_logits("qwen2");
}

#[test]
fn qwen3_logits_match_transformers() {
    check_logits("qwen3");
}

#[derive(serde::Deserialize)]
struct Render {
    style: String,
    template: String,
    bos_token: String,
    eos_token: String,
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    text: String,
    tokens: Vec<u32>,
}

#[test]
fn chat_template_renders_match_transformers_token_for_token() {
    let text = std::fs::read_to_string(fixture("chat_renders.json")).unwrap();
    let renders: Vec<Render> = serde_json::from_str(&text).unwrap();
    let tokenizer = Tokenizer::from_file(&fixture("tokenizer.json")).unwrap();
    let mut styles = std::collections::BTreeSet::new();
    for render in &renders {
        let template =
            ChatTemplate::new(&render.template, &render.bos_token, &render.eos_token).unwrap();
        let ours = template
            .render(&render.messages, render.add_generation_prompt)
            .unwrap();
        assert_eq!(ours, render.text, "{} render", render.style);
        assert_eq!(
            tokenizer.encode(&ours).unwrap(),
            render.tokens,
            "{} tokens",
            render.style
        );
        styles.insert(render.style.clone());
    }
    assert_eq!(styles.len(), 3, "{styles:?}");
}

#[test]
fn token_logprobs_agree_with_the_logits() {
    let model = Model::load(&fixture("qwen2")).unwrap();
    let tokens = model.tokenizer.encode("What is 12 + 30?").unwrap();
    let logprobs = opentinker::lora::token_logprobs(&model, &tokens, None).unwrap();
    assert_eq!(logprobs[0], None);
    assert!(
        logprobs[1..]
            .iter()
            .all(|l| l.is_some_and(|l| l < 0.0 && l.is_finite()))
    );
    let input = Tensor::new(&tokens[..], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = model
        .transformer
        .forward(&input)
        .unwrap()
        .squeeze(0)
        .unwrap();
    let row = candle_nn::ops::log_softmax(&logits.get(0).unwrap(), 0).unwrap();
    let expected = row
        .get(tokens[1] as usize)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!((logprobs[1].unwrap() - expected).abs() < 1e-6);
    let err = opentinker::lora::token_logprobs(&model, &[1, 99_999], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("99999") && err.contains("vocabulary"), "{err}");
}

/// Gradients reach every layer: in full-parameter training each layer's projections and norms
/// get a finite, non-zero gradient from the last token's logprob.
#[test]
fn gradients_reach_every_layer() {
    let model = Model::load(&fixture("qwen3")).unwrap();
    let (tokens, targets) = ([5u32, 17, 42, 9], [17u32, 42, 9, 3]);
    let weights = CpuWeights::<f32>::of(&model.transformer).unwrap();
    let weights = weights.decoder::<CpuTrain<f32>>();
    let sequences = [TrainSequence {
        tokens: &tokens,
        targets: &targets,
        adapter: None,
    }];
    let ops = CpuTrain::<f32>::new();
    let mut batch = TrainBatch::new(vec![tokens.len()]);
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
        &vec![0.0, 0.0, 0.0, 1.0],
        Some(&mut grads),
    )
    .unwrap();
    let norm = |g: &[f32]| g.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    for (i, layer) in grads.layers.iter().enumerate() {
        for (name, g) in [
            ("q_proj", &layer.attention.q.weight),
            ("k_proj", &layer.attention.k.weight),
            ("o_proj", &layer.attention.o.weight),
            ("down_proj", &layer.mlp.down.weight),
            ("input_layernorm", &layer.input_norm),
        ] {
            let n = norm(g);
            assert!(
                n > 0.0 && n.is_finite(),
                "layer {i} {name}: gradient norm {n}"
            );
        }
    }
}
