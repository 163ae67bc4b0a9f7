//! A small deterministic random number generator for plugins.
//!
//! WASI randomness is seeded per episode by the host, so `rand` works inside a plugin too; this is
//! for plugins that want no dependency and an explicit seed.

/// SplitMix64: fast, statistically sound for games and task generation, not for cryptography.
#[derive(Clone, Debug)]
pub struct SeededRng(u64);

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        SeededRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high` (`low` when the range is empty).
    pub fn range(&mut self, low: i64, high: i64) -> i64 {
        if high <= low {
            return low;
        }
        let span = (high - low) as u64 + 1;
        low + (self.next_u64() % span) as i64
    }

    /// True with probability `p` (never for 0): for choices such as how often a demonstration
    /// is right.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() as f64 / u64::MAX as f64) < p
    }

    /// An index into a slice of `len` items; `len` must be positive.
    pub fn index(&mut self, len: usize) -> usize {
        (self.next_u64() % len.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_range_is_inclusive() {
        let (mut a, mut b) = (SeededRng::new(7), SeededRng::new(7));
        let xs: Vec<i64> = (0..1000).map(|_| a.range(1, 6)).collect();
        let ys: Vec<i64> = (0..1000).map(|_| b.range(1, 6)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (1..=6).contains(x)));
        assert!(xs.contains(&1) && xs.contains(&6));
    }

    #[test]
    fn a_chance_comes_true_about_as_often_as_asked() {
        let mut rng = SeededRng::new(3);
        let hits = (0..10_000).filter(|_| rng.chance(0.3)).count();
        assert!((2_800..3_200).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| rng.chance(0.0)));
    }
}
