//! Resident memory after many memory-limit hits: the pooling allocator must hand every page
//! back. Alone in its test binary, so no other test moves the measurement.

use opentinker::plugin::{ErrorKind, Limits};
use opentinker_tests::{assert_all_failed_with, load, play, resident_bytes, test_host};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_comes_back_after_a_thousand_memory_limit_hits() {
    let host = test_host();
    let hog = load(&host, "adversarial/memory-hog").await;
    let limits = Limits::default();
    assert_eq!(limits.memory_bytes, 64 << 20);
    let (warm_up, _) = play(&hog, 10, limits.clone()).await;
    assert_all_failed_with(&warm_up, ErrorKind::MemoryLimit);
    let after_warm_up = resident_bytes();
    let (summary, _) = play(&hog, 1_000, limits).await;
    assert_all_failed_with(&summary, ErrorKind::MemoryLimit);
    let after = resident_bytes();
    let growth = after.saturating_sub(after_warm_up);
    println!("resident after warm-up {after_warm_up} B, after 1000 episodes {after} B");
    assert!(growth <= 16 << 20, "resident memory grew by {growth} bytes");
}
