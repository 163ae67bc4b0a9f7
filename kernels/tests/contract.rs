//! The kernels' contract: each matches the f64 reference, and a row's result is bit-identical
//! whatever else is batched with it, however rows are grouped into adapter segments, and
//! whether attention runs over a whole prompt or one position at a time.

use opentinker_kernels::{
    Heads, LoraPair, Segment, causal_attention, linear, lora_apply, reference,
};
use proptest::prelude::*;

mod common;
use common::values;

fn slices(caches: &[Vec<f32>]) -> Vec<&[f32]> {
    caches.iter().map(Vec::as_slice).collect()
}

fn assert_close(got: &[f32], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= tolerance * (1.0 + w.abs()),
            "element {i}: {g} vs {w}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn linear_matches_the_reference_and_rows_do_not_depend_on_the_batch(
        m in 1usize..40, k in 1usize..70, n in 1usize..50, seed in 0u64..1000, pick in 0usize..40,
    ) {
        let x = values(m * k, seed);
        let w = values(n * k, seed + 1);
        let mut out = vec![0.0; m * n];
        linear(&x, &w, k, &mut out, false);
        assert_close(&out, &reference::linear(&x, &w, k), 1e-5);
        let row = pick % m;
        let mut alone = vec![0.0; n];
        linear(&x[row * k..(row + 1) * k], &w, k, &mut alone, false);
        prop_assert_eq!(&alone[..], &out[row * n..(row + 1) * n]);
        // Accumulating adds exactly the same products.
        let mut twice = out.clone();
        linear(&x, &w, k, &mut twice, true);
        let doubled: Vec<f32> = out.iter().map(|v| v + v).collect();
        prop_assert_eq!(twice, doubled);
    }

    #[test]
    fn lora_apply_matches_the_reference_and_rows_do_not_depend_on_their_segments(
        lengths in proptest::collection::vec(1usize..5, 1..8),
        inp in 1usize..40, out in 1usize..40, seed in 0u64..1000,
    ) {
        // Adapter i has rank i + 1; segment s uses adapter s % 3, or none when s % 4 == 3.
        let a: Vec<Vec<f32>> = (0..3).map(|i| values((i + 1) * inp, seed + i as u64)).collect();
        let b: Vec<Vec<f32>> = (0..3).map(|i| values(out * (i + 1), seed + 10 + i as u64)).collect();
        let pair = |i: usize| LoraPair { a: &a[i], b: &b[i], rank: i + 1, scale: 0.5 + i as f32 };
        let segments: Vec<Segment> = lengths
            .iter()
            .enumerate()
            .map(|(s, &rows)| Segment { rows, pair: (s % 4 != 3).then(|| pair(s % 3)) })
            .collect();
        let rows: usize = lengths.iter().sum();
        let x = values(rows * inp, seed + 20);
        let base = values(rows * out, seed + 21);
        let mut y = base.clone();
        lora_apply(&x, inp, &mut y, out, &segments);
        let delta = reference::lora_delta(&x, inp, out, &segments);
        let want: Vec<f64> = base.iter().zip(&delta).map(|(b, d)| f64::from(*b) + d).collect();
        assert_close(&y, &want, 1e-5);
        // Each row again alone, in a segment of one: bit-identical.
        let mut start = 0;
        for segment in &segments {
            for r in start..start + segment.rows {
                let mut alone = base[r * out..(r + 1) * out].to_vec();
                let one = [Segment { rows: 1, pair: segment.pair }];
                lora_apply(&x[r * inp..(r + 1) * inp], inp, &mut alone, out, &one);
                prop_assert_eq!(&alone[..], &y[r * out..(r + 1) * out]);
            }
            start += segment.rows;
        }
    }

    #[test]
    fn attention_matches_the_reference_and_prefill_equals_decoding_one_by_one(
        positions in 1usize..24, kv_heads in 1usize..3, groups in 1usize..3,
        half_dim in 1usize..9, window in proptest::option::of(1usize..8), seed in 0u64..1000,
    ) {
        let shape = Heads { heads: kv_heads * groups, kv_heads, head_dim: 2 * half_dim, window };
        let row = shape.heads * shape.head_dim;
        let q = values(positions * row, seed);
        let per_head = |salt: u64| -> Vec<Vec<f32>> {
            (0..kv_heads).map(|h| values(positions * shape.head_dim, seed + salt + h as u64)).collect()
        };
        let (k, v) = (per_head(1), per_head(9));
        let cut = |caches: &[Vec<f32>], n: usize| -> Vec<Vec<f32>> {
            caches.iter().map(|c| c[..n * shape.head_dim].to_vec()).collect()
        };
        let mut prefill = vec![0.0; q.len()];
        causal_attention(&q, &slices(&k), &slices(&v), shape, 0, &mut prefill);
        let want = reference::causal_attention(&q, &slices(&k), &slices(&v), shape, 0);
        assert_close(&prefill, &want, 1e-5);
        for p in 0..positions {
            let mut one = vec![0.0; row];
            let (k_p, v_p) = (cut(&k, p + 1), cut(&v, p + 1));
            let q_p = &q[p * row..(p + 1) * row];
            causal_attention(q_p, &slices(&k_p), &slices(&v_p), shape, p, &mut one);
            prop_assert_eq!(&one[..], &prefill[p * row..(p + 1) * row]);
        }
    }
}
