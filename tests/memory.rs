//! Resident memory after many memory-limit hits: the pooling allocator must hand every page
//! back. Alone in its test binary, so no other test moves the measurement.
//!
//! Each hit fills a fresh 64 MiB memory, so a slot that kept its pages would show at once; the
//! suite runs 250 hits (`OPENTINKER_SOAK_EPISODES` sets the count), `scripts/bench.sh soak` a
//! thousand and prints the figures.

use opentinker::plugin::{ErrorKind, Limits};
use opentinker_tests::{assert_all_failed_with, load, play, resident_bytes, test_host};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_comes_back_after_many_memory_limit_hits() {
    let episodes: u32 = std::env::var("OPENTINKER_SOAK_EPISODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(250);
    let host = test_host();
    let hog = load(&host, "adversarial/memory-hog").await;
    let limits = Limits::default();
    assert_eq!(limits.memory_bytes, 64 << 20);
    let (warm_up, _) = play(&hog, 10, limits.clone()).await;
    assert_all_failed_with(&warm_up, ErrorKind::MemoryLimit);
    let after_warm_up = resident_bytes();
    let (summary, _) = play(&hog, episodes, limits).await;
    assert_all_failed_with(&summary, ErrorKind::MemoryLimit);
    let after = resident_bytes();
    let growth = after.saturating_sub(after_warm_up);
    println!("resident after warm-up {after_warm_up} B, after {episodes} episodes {after} B");
    assert!(growth <= 16 << 20, "resident memory grew by {growth} bytes");
}
