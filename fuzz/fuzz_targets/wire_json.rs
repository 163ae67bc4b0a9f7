//! Any body sent to any other route that runs as a future (JSON) is read into its op or refused
//! by name. The first byte picks the route.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentinker::server::{FutureRoute, accept};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = FutureRoute::ALL[usize::from(pick) % FutureRoute::ALL.len()];
    if let Err(error) = accept(route, body, None) {
        assert!(!error.message.is_empty());
    }
});
