//! Train a LoRA adapter on one text with cross-entropy and save it as a PEFT checkpoint: the
//! training engine's step-level API end to end, and a way to make an adapter for checks such as
//! `scripts/check_adapter_in_peft.py`.
//!
//!     cargo run --example lora_sft -- MODEL_DIR OUT_DIR "some text" [STEPS] [LEARNING_RATE]

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::DType;
use opentinker::lora::LoraConfig;
use opentinker::model::Model;
use opentinker::train::{AdamParams, Datum, Loss, StepReport, TrainingEngine, WorkItem};

fn main() -> anyhow::Result<()> {
    // SAFETY: the first thing `main` does; no other thread exists yet.
    unsafe { opentinker::compute_threads::fix_compute_threads() };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model_dir, out, text, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: lora_sft MODEL_DIR OUT_DIR TEXT [STEPS] [LEARNING_RATE]");
    };
    let steps: usize = rest.first().map(|s| s.parse()).transpose()?.unwrap_or(20);
    let learning_rate: f64 = rest.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1e-3);
    let model = Model::load(&PathBuf::from(model_dir))?;
    let tokens = model.tokenizer.encode(text)?;
    anyhow::ensure!(tokens.len() >= 2, "the text needs at least two tokens");
    let n = tokens.len() - 1;
    let item = WorkItem::new(
        "sft",
        vec![Datum {
            input_tokens: tokens[..n].to_vec(),
            target_tokens: tokens[1..].to_vec(),
            mask: vec![1.0; n],
            ..Datum::default()
        }],
        Loss::CrossEntropy,
    );
    let mut engine = TrainingEngine::new(Arc::new(model.transformer), DType::F32);
    engine.add_adapter(
        "sft",
        LoraConfig {
            rank: 8,
            alpha: 16.0,
            ..LoraConfig::default()
        },
    )?;
    let params = AdamParams {
        learning_rate,
        ..AdamParams::default()
    };
    for step in 1..=steps {
        let loss = engine.forward_backward(std::slice::from_ref(&item))?[0].loss;
        if let StepReport::Updated { grad_norm, .. } = engine.optim_step("sft", &params)? {
            println!("step {step:>3}  loss {loss:>9.4}  grad norm {grad_norm:.4}");
        }
    }
    engine.save_adapter("sft", &PathBuf::from(out), model_dir, true)?;
    println!("{out}");
    Ok(())
}
