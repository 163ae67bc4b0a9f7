//! A training state's bytes (safetensors, as the journal and checkpoints keep it) decode or are
//! refused as damaged, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentinker::train::SlotState;

fuzz_target!(|bytes: &[u8]| {
    let _ = SlotState::decode(bytes, candle_core::DType::F32);
});
