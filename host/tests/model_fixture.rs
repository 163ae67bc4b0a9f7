//! Our model against the reference implementation: logits and chat-template renders of the
//! committed `transformers` fixture (see `scripts/make_model_fixture.py`).

mod common;

use candle_core::{Device, Tensor};
use common::{fixture, max_abs_diff};
use opentinker::model::Model;
use opentinker::text::{ChatMessage, ChatTemplate, Tokenizer};

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
    let logprobs = model.token_logprobs(&tokens, None).unwrap();
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
    let err = model
        .token_logprobs(&[1, 99_999], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("99999") && err.contains("vocabulary"), "{err}");
}

/// Gradients reach the input embeddings through every layer, and no frozen weight gets one.
#[test]
fn gradients_flow_to_the_input_and_never_to_frozen_weights() {
    let model = Model::load(&fixture("qwen3")).unwrap();
    let t = &model.transformer;
    let tokens = [5u32, 17, 42, 9];
    let embedded = t
        .embed_tokens
        .embedding(&Tensor::new(&tokens[..], &Device::Cpu).unwrap())
        .unwrap();
    let input = candle_core::Var::from_tensor(&embedded.unsqueeze(0).unwrap()).unwrap();
    let logits = t.forward_embeddings(input.as_tensor()).unwrap();
    let loss = logits.sqr().unwrap().mean_all().unwrap();
    let grads = loss.backward().unwrap();
    let input_grad = grads
        .get(input.as_tensor())
        .expect("the input has a gradient");
    let norm = input_grad
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(norm > 0.0 && norm.is_finite());
    for layer in &t.layers {
        for weight in [
            &layer.q_proj.weight,
            &layer.k_proj.weight,
            &layer.o_proj.weight,
            &layer.down_proj.weight,
        ] {
            assert!(
                grads.get(weight).is_none(),
                "a frozen weight got a gradient"
            );
        }
    }
}
