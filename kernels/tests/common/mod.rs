//! What the kernels' tests and benchmarks share: deterministic inputs.

/// `n` values in [-0.5, 0.5) from a linear congruential generator seeded with `seed`: the same
/// inputs on every machine, without a random-number crate.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}
