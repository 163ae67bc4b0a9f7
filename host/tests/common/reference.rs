//! The references a loaded model is held to: the logits of the committed fixtures' sequences,
//! and the ids and chat renderings of the GGUF fixtures' texts (`scripts/make_gguf_fixture.py`).

use std::path::{Path, PathBuf};

use candle_core::Device;
use opentinker::model::Model;
use opentinker::text::ChatMessage;

use super::max_abs_diff;

/// The model's logits of each reference sequence (`tokens.N`) against the reference's
/// (`logits.N`), within 1e-4; at the vocabulary entries `ids` where the reference has them.
pub fn compare_logits(what: &str, model: &Model, reference: &Path) {
    let reference = candle_core::safetensors::load(reference, &Device::Cpu).unwrap();
    let ids = reference
        .get("ids")
        .map(|ids| ids.to_dtype(candle_core::DType::U32).unwrap());
    for i in 0.. {
        let Some(tokens) = reference.get(&format!("tokens.{i}")) else {
            assert!(i >= 3, "{what}: only {i} reference sequences");
            break;
        };
        let tokens = tokens
            .to_dtype(candle_core::DType::U32)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = model
            .transformer
            .forward(&tokens)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let ours = match &ids {
            Some(ids) => logits.index_select(ids, 1).unwrap(),
            None => logits,
        };
        let difference = max_abs_diff(&ours, &reference[&format!("logits.{i}")]);
        assert!(
            difference <= 1e-4,
            "{what} sequence {i}: logits differ by {difference}"
        );
    }
}

/// The GGUF fixture of model `name` (see `scripts/make_gguf_fixture.py`).
pub fn gguf_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

#[derive(serde::Deserialize)]
pub struct GgufTexts {
    pub texts: Vec<GgufText>,
    pub renders: Vec<GgufRender>,
}

#[derive(serde::Deserialize)]
pub struct GgufText {
    pub text: String,
    pub ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
pub struct GgufRender {
    pub messages: Vec<ChatMessage>,
    pub add_generation_prompt: bool,
    pub text: String,
    pub ids: Vec<u32>,
}
