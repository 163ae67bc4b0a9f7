//! The plugin loader's first look at an uploaded component (its structure, measured before
//! anything compiles it) answers a measure or a refusal, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentinker::plugin::measure_structure;

fuzz_target!(|bytes: &[u8]| {
    let _ = measure_structure(bytes);
});
