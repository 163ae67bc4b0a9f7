//! The model directories opentinker writes, each a Hugging Face model that `transformers` (the
//! cookbook's venv, which has PyTorch) loads and scores as opentinker does. `opentinker model
//! merge`: an adapter trained on every projection and the unembedding, merged into its base,
//! gives the logprobs of the base with the adapter (within 1e-5). `opentinker model export`: a
//! GGUF file written as a directory gives the GGUF's logits, ids and chat renderings. An
//! existing output folder is refused, and nothing is written.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use candle_core::DType;
use common::reference::{GgufTexts, compare_logits, gguf_fixture};
use opentinker::lora::{LoraConfig, token_logprobs};
use opentinker::model::{Architecture, Model};
use opentinker::model::{TinyShape, init_tiny};
use opentinker::train::{AdamParams, Datum, Loss, TrainingEngine, WorkItem};
use opentinker_test_tools::cookbook_python;

const BIN: &str = env!("CARGO_BIN_EXE_opentinker");

/// Train adapter `a` of `base` (every projection and the unembedding) a few steps and save it.
fn trained_adapter(base: &Model, dir: &Path) {
    let mut engine = TrainingEngine::new(Arc::new(base.transformer.clone()), DType::F32);
    let config = LoraConfig {
        rank: 4,
        alpha: 8.0,
        train_unembed: true,
        seed: 7,
        ..LoraConfig::default()
    };
    engine.add_adapter("a", config).unwrap();
    let tokens: Vec<u32> = (0..25).map(|i| (i * 37 + 11) % 500 + 3).collect();
    let work = [WorkItem::new(
        "a",
        vec![Datum {
            input_tokens: tokens[..24].to_vec(),
            target_tokens: tokens[1..].to_vec(),
            mask: vec![1.0; 24],
            weights: None,
            advantages: None,
            sampler_logprobs: None,
            ratio_mask: None,
            inputs: Default::default(),
        }],
        Loss::CrossEntropy,
    )];
    let params = AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    };
    for _ in 0..4 {
        engine.forward_backward(&work).unwrap();
        engine.optim_step("a", &params).unwrap();
    }
    engine.save_adapter("a", dir, "tiny", false).unwrap();
}

/// `transformers`' logprob of each token after the first, for the model in `dir`.
fn transformers_logprobs(python: &Path, dir: &Path, tokens: &[u32]) -> Vec<f32> {
    let script = r#"
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = json.loads(sys.argv[2])
with torch.no_grad():
    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
print(json.dumps([logprobs[i, ids[i + 1]].item() for i in range(len(ids) - 1)]))
"#;
    let output = Command::new(python)
        .args(["-c", script])
        .arg(dir)
        .arg(serde_json::to_string(tokens).unwrap())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn a_merged_adapter_gives_the_adapters_logprobs_here_and_in_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let (base_dir, adapter_dir, out) = (
        dir.path().join("base"),
        dir.path().join("adapter"),
        dir.path().join("merged"),
    );
    init_tiny(&base_dir, TinyShape::Tiny, Architecture::Qwen2, 3).unwrap();
    let base = Model::load(&base_dir).unwrap();
    assert!(
        base.config.tie_word_embeddings,
        "the case of an untying merge"
    );
    trained_adapter(&base, &adapter_dir);

    let merge = || {
        Command::new(BIN)
            .args(["model", "merge", "--model"])
            .arg(&base_dir)
            .arg("--adapter")
            .arg(&adapter_dir)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    let merged = merge();
    assert!(
        merged.status.success(),
        "{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    let loaded = opentinker::train::checkpoint::load(&adapter_dir, &base.config, DType::F32)
        .unwrap()
        .adapter;
    let model = Model::load(&out).unwrap();
    assert!(!model.config.tie_word_embeddings);
    let tokens = model
        .tokenizer
        .encode("What is 12 + 30? The answer is 42.")
        .unwrap();
    let with_adapter = token_logprobs(&base, &tokens, Some(&loaded)).unwrap();
    let without = token_logprobs(&base, &tokens, None).unwrap();
    let merged_logprobs = token_logprobs(&model, &tokens, None).unwrap();
    let mut moved = 0.0f32;
    for ((a, m), b) in with_adapter
        .iter()
        .zip(&merged_logprobs)
        .zip(&without)
        .skip(1)
    {
        let (a, m, b) = (a.unwrap(), m.unwrap(), b.unwrap());
        assert!((a - m).abs() <= 1e-5, "base + adapter {a}, merged {m}");
        moved = moved.max((a - b).abs());
    }
    assert!(
        moved > 1e-3,
        "the adapter changes nothing ({moved}): the test proves nothing"
    );

    // Written again over itself: refused, and the merged model is untouched.
    let before = std::fs::read(out.join("model.safetensors")).unwrap();
    let again = merge();
    assert!(!again.status.success());
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("exists"), "{said}");
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        before
    );

    let Some(python) = cookbook_python() else {
        return;
    };
    let theirs = transformers_logprobs(&python, &out, &tokens);
    for (t, m) in theirs.iter().zip(merged_logprobs.iter().skip(1)) {
        let m = m.unwrap();
        assert!((t - m).abs() <= 1e-4, "transformers {t}, ours {m}");
    }
}

/// `transformers`' view of the model directory `dir`, against the GGUF fixture of the same
/// model: the largest difference of its logits from the reference's, the ids of each text and
/// the rendering of each conversation.
const TRANSFORMERS_VIEW: &str = r#"
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, reference, texts = sys.argv[1], load_file(sys.argv[2]), json.load(open(sys.argv[3]))
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
difference, i = 0.0, 0
with torch.no_grad():
    while f"tokens.{i}" in reference:
        logits = model(reference[f"tokens.{i}"].long()[None]).logits[0][:, reference["ids"].long()]
        difference = max(difference, (logits - reference[f"logits.{i}"]).abs().max().item())
        i += 1
print(json.dumps({
    "sequences": i,
    "logit_difference": difference,
    "ids": [tokenizer(t["text"]).input_ids for t in texts["texts"]],
    "renders": [tokenizer.apply_chat_template(r["messages"], tokenize=False,
                add_generation_prompt=r["add_generation_prompt"]) for r in texts["renders"]],
}))
"#;

#[derive(serde::Deserialize)]
struct TransformersView {
    sequences: usize,
    logit_difference: f32,
    ids: Vec<Vec<u32>>,
    renders: Vec<String>,
}

/// `opentinker model export` writes SmolLM2's GGUF as a Hugging Face directory that loads here
/// and in `transformers` (which never sees the GGUF) as the GGUF does: the same logits within
/// 1e-4, the same ids of every text, the same rendering of every conversation. A second export
/// over it is refused and leaves it whole.
#[test]
fn smollm2_exported_from_its_gguf_loads_here_and_in_transformers_as_the_gguf_does() {
    let Some(file) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    let export = || {
        Command::new(env!("CARGO_BIN_EXE_opentinker"))
            .args(["model", "export"])
            .arg(&file)
            .arg(&out)
            .output()
            .unwrap()
    };
    let exported = export();
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        assert!(out.join(name).is_file(), "the export has no {name}");
    }
    let fixture = gguf_fixture("smollm2");
    let texts: GgufTexts =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("texts.json")).unwrap())
            .unwrap();
    let model = Model::load(&out).unwrap();
    compare_logits(
        "exported SmolLM2",
        &model,
        &fixture.join("reference.safetensors"),
    );
    let template = model.chat_template.as_ref().expect("the export's template");
    for text in &texts.texts {
        assert_eq!(model.tokenizer.encode(&text.text).unwrap(), text.ids);
    }
    for render in &texts.renders {
        let ours = template
            .render(&render.messages, render.add_generation_prompt)
            .unwrap();
        assert_eq!(ours, render.text);
    }

    let weights = std::fs::read(out.join("model.safetensors")).unwrap();
    let again = export();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        weights
    );

    let Some(python) = cookbook_python() else {
        return;
    };
    let view = Command::new(python)
        .args(["-c", TRANSFORMERS_VIEW])
        .arg(&out)
        .arg(fixture.join("reference.safetensors"))
        .arg(fixture.join("texts.json"))
        .output()
        .unwrap();
    assert!(
        view.status.success(),
        "{}",
        String::from_utf8_lossy(&view.stderr)
    );
    let view: TransformersView = serde_json::from_slice(&view.stdout).unwrap();
    assert!(
        view.sequences >= 3,
        "{} reference sequences",
        view.sequences
    );
    assert!(
        view.logit_difference <= 1e-4,
        "transformers' logits of the export differ by {}",
        view.logit_difference
    );
    let ids: Vec<&Vec<u32>> = texts.texts.iter().map(|t| &t.ids).collect();
    assert_eq!(view.ids.iter().collect::<Vec<_>>(), ids);
    let renders: Vec<&String> = texts.renders.iter().map(|r| &r.text).collect();
    assert_eq!(view.renders.iter().collect::<Vec<_>>(), renders);
}
