//! A GGUF file's bytes load as a model (config, tokenizer, chat template, weights) or are refused
//! by name, never a panic: the file is what a user hands the server (`serve --model`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentinker::model::Model;

fuzz_target!(|bytes: &[u8]| {
    // The reader takes a path: one file per process, written again for each input.
    let path = std::env::temp_dir().join(format!("opentinker-fuzz-{}.gguf", std::process::id()));
    if std::fs::write(&path, bytes).is_ok() {
        let _ = Model::load(&path);
    }
});
