//! PEFT-format adapter checkpoints: a PEFT-written adapter gives PEFT's logits here, our own
//! round-trip exactly (with optimizer state), and damaged or mismatched ones are refused by name.

mod common;

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use common::{fixture, max_abs_diff};
use opentinker::lora::{LoraConfig, RowAdapters};
use opentinker::model::Model;
use opentinker::train::{AdamParams, Datum, Loss, TrainingEngine, WorkItem};

fn qwen2_engine() -> TrainingEngine {
    let model = Model::load(&fixture("qwen2")).unwrap();
    TrainingEngine::new(Arc::new(model.transformer), DType::F32)
}

#[test]
fn an_adapter_written_by_peft_gives_peft_logits() {
    let model = Model::load(&fixture("qwen2")).unwrap();
    let mut engine = TrainingEngine::new(Arc::new(model.transformer.clone()), DType::F32);
    engine
        .load_adapter("peft", &fixture("qwen2-peft-lora"), false)
        .unwrap();
    let adapter = engine.adapter("peft").unwrap();
    assert_eq!((adapter.config.rank, adapter.config.alpha), (4, 8.0));
    let reference = candle_core::safetensors::load(
        fixture("qwen2-peft-lora").join("reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let tokens = reference["tokens.0"]
        .to_dtype(DType::U32)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let runs = RowAdapters {
        runs: vec![(1, Some(adapter))],
    };
    let ours = runs
        .logits(&model.transformer, &tokens)
        .unwrap()
        .squeeze(0)
        .unwrap();
    let difference = max_abs_diff(&ours, &reference["logits.0"]);
    assert!(
        difference <= 1e-4,
        "logits differ from PEFT's by {difference}"
    );
    let base = model
        .transformer
        .forward(&tokens)
        .unwrap()
        .squeeze(0)
        .unwrap();
    let moved = max_abs_diff(&base, &reference["logits.0"]);
    assert!(moved > 1e-3, "the adapter should change the logits");
}

fn datum() -> Datum {
    let tokens: Vec<u32> = (0..13).map(|i| (i * 29 + 7) % 380).collect();
    Datum {
        input_tokens: tokens[..12].to_vec(),
        target_tokens: tokens[1..].to_vec(),
        mask: vec![1.0; 12],
        ..Datum::default()
    }
}

fn train_item(id: &str) -> WorkItem {
    WorkItem::new(id, vec![datum()], Loss::CrossEntropy)
}

#[test]
fn our_checkpoints_round_trip_with_their_optimizer_state() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("step-2");
    let mut engine = qwen2_engine();
    let config = LoraConfig {
        rank: 8,
        alpha: 16.0,
        rslora: true,
        seed: 3,
        ..LoraConfig::default()
    };
    engine.add_adapter("a", config).unwrap();
    for _ in 0..2 {
        engine.forward_backward(&[train_item("a")]).unwrap();
        engine
            .optim_step(
                "a",
                &AdamParams {
                    learning_rate: 1e-2,
                    ..AdamParams::default()
                },
            )
            .unwrap();
    }
    engine
        .save_adapter("a", &checkpoint, "qwen2", true)
        .unwrap();
    for file in [
        "adapter_model.safetensors",
        "adapter_config.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(checkpoint.join(file).is_file(), "{file}");
    }

    let mut restored = qwen2_engine();
    restored.load_adapter("b", &checkpoint, true).unwrap();
    let (a, b) = (engine.adapter("a").unwrap(), restored.adapter("b").unwrap());
    assert_eq!(a.config.rank, b.config.rank);
    assert!(b.config.rslora);
    for ((name, x), (_, y)) in a.named_tensors().iter().zip(b.named_tensors().iter()) {
        let same = x
            .as_tensor()
            .eq(y.as_tensor())
            .unwrap()
            .min_all()
            .unwrap()
            .to_scalar::<u8>()
            .unwrap();
        assert_eq!(same, 1, "{name} changed in the round trip");
    }
    let (step_a, moments_a) = engine.optimizer_state("a").unwrap().unwrap();
    let (step_b, moments_b) = restored.optimizer_state("b").unwrap().unwrap();
    assert_eq!(step_a, step_b);
    for (name, (m, v)) in &moments_a {
        let (m2, v2) = &moments_b[name];
        assert_eq!(
            m.to_vec2::<f32>().unwrap(),
            m2.to_vec2::<f32>().unwrap(),
            "{name}"
        );
        assert_eq!(
            v.to_vec2::<f32>().unwrap(),
            v2.to_vec2::<f32>().unwrap(),
            "{name}"
        );
    }
    // The same next step from both.
    for (e, id) in [(&mut engine, "a"), (&mut restored, "b")] {
        e.forward_backward(&[train_item(id)]).unwrap();
        e.optim_step(id, &AdamParams::default()).unwrap();
    }
    let after =
        |e: &TrainingEngine, id: &str| e.forward(&[train_item(id)]).unwrap()[0].logprobs.clone();
    assert_eq!(after(&engine, "a"), after(&restored, "b"));

    // Saving again replaces the checkpoint whole and leaves nothing else behind.
    engine
        .save_adapter("a", &checkpoint, "qwen2", false)
        .unwrap();
    assert!(!checkpoint.join("optimizer.safetensors").exists());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("step-2")]);
}

#[test]
fn damaged_or_mismatched_checkpoints_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let mut engine = qwen2_engine();
    engine
        .add_adapter(
            "a",
            LoraConfig {
                rank: 4,
                ..LoraConfig::default()
            },
        )
        .unwrap();
    engine.save_adapter("a", &good, "qwen2", true).unwrap();

    // Truncated weights.
    let truncated = dir.path().join("truncated");
    copy_dir(&good, &truncated);
    let weights = truncated.join("adapter_model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let err = engine
        .load_adapter("t", &truncated, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("adapter_model.safetensors"), "{err}");

    // Another base model: the qwen3 fixture has other projection shapes.
    let qwen3 = Model::load(&fixture("qwen3")).unwrap();
    let mut other = TrainingEngine::new(Arc::new(qwen3.transformer), DType::F32);
    let err = other
        .load_adapter("x", &good, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has shape") && err.contains("another base model"),
        "{err}"
    );

    // A config that is not LoRA.
    let not_lora = dir.path().join("not-lora");
    copy_dir(&good, &not_lora);
    std::fs::write(
        not_lora.join("adapter_config.json"),
        r#"{"peft_type": "PREFIX_TUNING"}"#,
    )
    .unwrap();
    let err = engine
        .load_adapter("n", &not_lora, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("PREFIX_TUNING"), "{err}");

    // Nothing was registered by the failed loads.
    assert!(engine.adapter("t").is_none() && engine.adapter("n").is_none());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
