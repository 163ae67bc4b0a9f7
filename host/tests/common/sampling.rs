//! A sampling engine's requests run to the end, for the tests that sample.

use opentinker::sample::{SampleOutput, SampleRequest, SamplerBackend, SamplingEngine};

/// Every request of `requests` run to the end on `engine`, outputs in the requests' order.
pub fn run<B: SamplerBackend>(
    engine: &mut SamplingEngine<B>,
    requests: Vec<SampleRequest>,
) -> Vec<SampleOutput> {
    let ids: Vec<u64> = requests
        .into_iter()
        .map(|r| engine.add_request(r).unwrap())
        .collect();
    let mut outputs = Vec::new();
    while engine.has_work() {
        outputs.extend(engine.decode_step().unwrap());
    }
    ids.iter()
        .map(|id| outputs.iter().find(|o| o.id == *id).unwrap().clone())
        .collect()
}
