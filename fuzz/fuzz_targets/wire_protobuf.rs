//! A `forward_backward` body (protobuf) is read into its op or refused by name: never a
//! panic, and never more built than its decode budget allows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentinker::server::{FutureRoute, accept};

fuzz_target!(|body: &[u8]| {
    if let Err(error) = accept(FutureRoute::ForwardBackward, body, None) {
        assert!(!error.message.is_empty());
    }
});
