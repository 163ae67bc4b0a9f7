//! `opentinker model init-tiny`: deterministic from its seed, complete, and loadable.

use opentinker::model::{Architecture, BaseFormat, Model};
use opentinker::model::{TOKENIZER_VOCAB, TinyShape, init_tiny};
use opentinker::text::ChatMessage;

fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_same_seed_gives_the_same_directory_and_another_seed_other_weights() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    init_tiny(a.path(), TinyShape::Tiny, Architecture::Qwen2, 5).unwrap();
    init_tiny(b.path(), TinyShape::Tiny, Architecture::Qwen2, 5).unwrap();
    init_tiny(c.path(), TinyShape::Tiny, Architecture::Qwen2, 6).unwrap();
    let names: Vec<String> = files(a.path()).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert_eq!(files(a.path()), files(b.path()));
    let weights =
        |d: &tempfile::TempDir| std::fs::read(d.path().join("model.safetensors")).unwrap();
    assert_ne!(weights(&a), weights(&c));
    assert_eq!(
        std::fs::read(a.path().join("tokenizer.json")).unwrap(),
        std::fs::read(c.path().join("tokenizer.json")).unwrap()
    );
}

#[test]
fn every_architecture_loads_tokenizes_and_chats() {
    for arch in Architecture::ALL {
        let dir = tempfile::tempdir().unwrap();
        init_tiny(dir.path(), TinyShape::Tiny, arch, 1).unwrap();
        let model = Model::load(dir.path()).unwrap();
        let c = &model.config;
        assert_eq!(
            (c.architecture, c.num_layers, c.hidden_size),
            (arch, 4, 128)
        );
        assert_eq!(
            (c.num_heads, c.num_kv_heads, c.intermediate_size),
            (4, 2, 512)
        );
        assert_eq!(c.vocab_size, TOKENIZER_VOCAB);
        assert_eq!(model.tokenizer.vocab_size(), TOKENIZER_VOCAB);
        let im_end = model.tokenizer.token_id("<|im_end|>").unwrap();
        // generation_config.json names the ids that end a generation, as Qwen2.5's does.
        let end_of_text = model.tokenizer.token_id("<|endoftext|>").unwrap();
        assert_eq!(c.eos_token_ids, vec![im_end, end_of_text]);
        let chat = model.chat_template.as_ref().unwrap();
        let text = chat
            .render(
                &[ChatMessage {
                    role: "user".into(),
                    content: "What is 12 + 30?".into(),
                }],
                true,
            )
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"
        );
        let tokens = model.tokenizer.encode(&text).unwrap();
        assert_eq!(tokens[0], model.tokenizer.token_id("<|im_start|>").unwrap());
        assert!(
            tokens.len() < text.len() / 2,
            "merges shorten the text: {} tokens",
            tokens.len()
        );
        let logprobs = opentinker::lora::token_logprobs(&model, &tokens, None).unwrap();
        assert!(logprobs[1..].iter().all(|l| l.is_some_and(f32::is_finite)));
    }
}

/// Gemma's norms multiply by `1 + w` where its files store `w`: a tiny Gemma 3 (norms of factor
/// one) is held with factors of one, and written back as the file had them, so that a directory
/// read and written again is the same weights.
#[test]
fn gemma_norms_are_held_as_their_factor_and_written_as_the_file_stores_them() {
    let (dir, again) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Gemma3, 3).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let held: Vec<f32> = model.transformer.layers[0]
        .mlp_output_norm
        .as_ref()
        .expect("Gemma's MLP output norm")
        .to_vec1()
        .unwrap();
    assert!(held.iter().all(|&v| v == 1.0), "{held:?}");
    opentinker::model::save_model_dir(&model.transformer, dir.path(), &again.path().join("m"))
        .unwrap();
    let read = |path: &std::path::Path| {
        candle_core::safetensors::load(path.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap()
    };
    let (original, written) = (read(dir.path()), read(&again.path().join("m")));
    assert_eq!(original.len(), written.len());
    for (name, tensor) in &original {
        let (a, b) = (
            tensor.flatten_all().unwrap(),
            written[name].flatten_all().unwrap(),
        );
        assert_eq!(
            a.to_vec1::<f32>().unwrap(),
            b.to_vec1::<f32>().unwrap(),
            "{name}"
        );
    }
    let stored: Vec<f32> = original["model.norm.weight"].to_vec1().unwrap();
    assert!(
        stored.iter().all(|&v| v == 0.0),
        "the file stores w: {stored:?}"
    );
}

/// The tiny model's base with its matrices in `format`'s blocks, and the same model with those
/// blocks' values in f32 tensors.
fn in_blocks_and_dense(
    arch: Architecture,
    format: BaseFormat,
) -> (
    opentinker::model::Transformer,
    opentinker::model::Transformer,
) {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, arch, 3).unwrap();
    let blocks = Model::load_as(dir.path(), format).unwrap().transformer;
    let values = blocks.named_weights().unwrap().into_iter().collect();
    let dense =
        opentinker::model::Transformer::from_tensors(blocks.config.clone(), &values).unwrap();
    (blocks, dense)
}

/// A base loaded into blocks computes, bit for bit, what the f32 model of the blocks' values
/// computes (the sampler's kernels dequantize a panel at a time and keep every row's sum in
/// the same order), in a quarter of the bytes for Q8_0.
#[test]
fn a_base_kept_in_blocks_computes_the_bits_of_its_values_in_f32() {
    for (format, most) in [(BaseFormat::Q8_0, 0.30), (BaseFormat::Q4_0, 0.18)] {
        for arch in [Architecture::Qwen2, Architecture::Gemma3] {
            let (blocks, dense) = in_blocks_and_dense(arch, format);
            assert_eq!(blocks.base_format(), format.blocks());
            assert_eq!(dense.base_format(), None);
            let ratio = blocks.weight_bytes() as f64 / dense.weight_bytes() as f64;
            assert!(
                ratio <= most,
                "{arch:?} {format:?}: {ratio:.3} of the f32 bytes"
            );
            let tokens: Vec<u32> = (0..2 * 13).map(|i| (i * 37 + 5) % 500).collect();
            let tokens =
                candle_core::Tensor::from_vec(tokens, (2, 13), &candle_core::Device::Cpu).unwrap();
            let bits = |t: candle_core::Tensor| -> Vec<u32> {
                let values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                values.into_iter().map(f32::to_bits).collect()
            };
            let (from_blocks, from_dense) = (
                bits(blocks.forward(&tokens).unwrap()),
                bits(dense.forward(&tokens).unwrap()),
            );
            assert!(
                from_blocks == from_dense,
                "{arch:?} {format:?}: the logits differ"
            );
        }
    }
}

/// A directory whose weights file is cut short is refused naming the folder, in f32 and in
/// blocks (the tensors are read one at a time from the mapped files).
#[test]
fn a_truncated_weights_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen2, 3).unwrap();
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    for format in [BaseFormat::F32, BaseFormat::Q8_0] {
        let error = Model::load_as(dir.path(), format).unwrap_err().to_string();
        assert!(
            error.contains("reading weights") && error.contains(&dir.path().display().to_string()),
            "{error}"
        );
    }
}
