//! The training path's kernels: each backward against central differences of its forward in
//! f64, and each f32 forward against the f64 reference, with proptest over shapes. A scalar
//! `L = Σ dy · f(x)` with a fixed random `dy` gives every input's gradient through one backward.

use opentinker_kernels::gemm::{matmul_nn, matmul_nt, matmul_tn};
use opentinker_kernels::ops::{
    gate_mul, gate_mul_backward, rms_norm, rms_norm_backward, rms_norm_saving, rope, rope_backward,
};
use opentinker_kernels::{
    Activation, Heads, LoraGrad, LoraPair, Segment, Span, attention_backward, attention_forward,
    lora_backward, lora_forward, reference,
};
use proptest::prelude::*;

mod common;

fn values(n: usize, seed: u64) -> Vec<f64> {
    common::values(n, seed).into_iter().map(f64::from).collect()
}

/// Per segment, its adapter's `A` and `B` (`None`: the base model).
type Pairs = Vec<Option<(Vec<f64>, Vec<f64>)>>;

fn slices(caches: &[Vec<f32>]) -> Vec<&[f32]> {
    caches.iter().map(Vec::as_slice).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Every entry of `analytic` against the central difference of `loss` at `x` in that entry.
fn check_gradient(name: &str, x: &[f64], analytic: &[f64], loss: impl Fn(&[f64]) -> f64) {
    check_gradient_at(name, x, analytic, 0..x.len(), loss);
}

/// The entries `at` of `analytic` against the central differences of `loss` at `x`.
fn check_gradient_at(
    name: &str,
    x: &[f64],
    analytic: &[f64],
    at: impl Iterator<Item = usize>,
    loss: impl Fn(&[f64]) -> f64,
) {
    assert_eq!(
        x.len(),
        analytic.len(),
        "{name}: one gradient entry per input"
    );
    let eps = 1e-6;
    for i in at {
        let at = |delta: f64| {
            let mut moved = x.to_vec();
            moved[i] += delta;
            loss(&moved)
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
        assert!(
            (numeric - analytic[i]).abs() <= 1e-6 * (1.0 + numeric.abs()),
            "{name}[{i}]: analytic {} vs numeric {numeric}",
            analytic[i]
        );
    }
}

/// `got` (f32 from a kernel, or f64) against `want`, entry by entry.
fn assert_close<G: Copy + Into<f64> + std::fmt::Display>(
    name: &str,
    got: &[G],
    want: &[f64],
    tolerance: f64,
) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            ((*g).into() - w).abs() <= tolerance * (1.0 + w.abs()),
            "{name}[{i}]: {g} vs {w}"
        );
    }
}

/// cos and sin tables of `positions × head_dim` in the Hugging Face layout.
fn rope_tables(positions: usize, head_dim: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in 0..positions {
        for _ in 0..2 {
            for i in 0..head_dim / 2 {
                let angle = p as f64 / 10_000f64.powf(2.0 * i as f64 / head_dim as f64);
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
    }
    (cos, sin)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn rms_norm_backward_matches_finite_differences(
        rows in 1usize..4, n in 1usize..9, seed in 0u64..1000,
    ) {
        let (x, weight, dy) = (values(rows * n, seed), values(n, seed + 1), values(rows * n, seed + 2));
        let eps = 1e-6;
        let mut y = vec![0.0; x.len()];
        let mut inverse = vec![0.0; rows];
        rms_norm_saving(&x, &weight, eps, &mut y, &mut inverse);
        let mut in_place = x.clone();
        rms_norm(&mut in_place, &weight, eps);
        prop_assert_eq!(&in_place, &y);
        let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; n]);
        rms_norm_backward(&x, &weight, &inverse, &dy, &mut dx, Some(&mut dw));
        let loss = |x: &[f64], w: &[f64]| {
            let mut y = x.to_vec();
            rms_norm(&mut y, w, eps);
            dot(&dy, &y)
        };
        check_gradient("dx", &x, &dx, |x| loss(x, &weight));
        check_gradient("dweight", &weight, &dw, |w| loss(&x, w));
    }

    #[test]
    fn rope_backward_matches_finite_differences(
        rows in 1usize..4, heads in 1usize..3, half in 1usize..4, seed in 0u64..1000,
    ) {
        let head_dim = 2 * half;
        let (cos, sin) = rope_tables(16, head_dim);
        let positions: Vec<usize> = (0..rows).map(|r| (r * 5 + seed as usize) % 16).collect();
        let (x, dy) = (values(rows * heads * head_dim, seed), values(rows * heads * head_dim, seed + 1));
        let mut dx = dy.clone();
        rope_backward(&mut dx, head_dim, &positions, &cos, &sin);
        check_gradient("dx", &x, &dx, |x| {
            let mut y = x.to_vec();
            rope(&mut y, head_dim, &positions, &cos, &sin);
            dot(&dy, &y)
        });
    }

    #[test]
    fn gate_mul_matches_its_definition_and_its_backward_finite_differences(
        n in 1usize..20, seed in 0u64..1000,
    ) {
        let (gate, up, dy) = (values(n, seed), values(n, seed + 1), values(n, seed + 2));
        for (activation, definition) in [
            (Activation::Silu, (|g: f64| g / (1.0 + (-g).exp())) as fn(f64) -> f64),
            (Activation::GeluTanh, |g: f64| {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                0.5 * g * (1.0 + u.tanh())
            }),
        ] {
            let mut y = gate.clone();
            gate_mul(activation, &mut y, &up);
            for ((y, &g), &u) in y.iter().zip(&gate).zip(&up) {
                prop_assert!((y - definition(g) * u).abs() < 1e-12, "{activation:?}");
            }
            let (mut d_gate, mut d_up) = (vec![0.0; n], vec![0.0; n]);
            gate_mul_backward(activation, &gate, &up, &dy, &mut d_gate, &mut d_up);
            let loss = |g: &[f64], u: &[f64]| {
                let mut y = g.to_vec();
                gate_mul(activation, &mut y, u);
                dot(&dy, &y)
            };
            check_gradient("d_gate", &gate, &d_gate, |g| loss(g, &up));
            check_gradient("d_up", &up, &d_up, |u| loss(&gate, u));
        }
    }

    #[test]
    fn matrix_products_match_plain_loops(
        m in 1usize..9, k in 1usize..9, n in 1usize..9, seed in 0u64..1000,
    ) {
        let (a, w) = (values(m * k, seed), values(n * k, seed + 1));
        let mut nt = vec![0.0; m * n];
        matmul_nt(&a, &w, k, &mut nt, false);
        let dy = values(m * n, seed + 2);
        let (mut nn, mut tn) = (vec![1.0; m * k], vec![1.0; n * k]);
        matmul_nn(&dy, &w, k, &mut nn, true);
        matmul_tn(&dy, &a, k, &mut tn, true);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|t| a[i * k + t] * w[j * k + t]).sum();
                prop_assert!((nt[i * n + j] - want).abs() < 1e-12);
            }
            for t in 0..k {
                let want: f64 = 1.0 + (0..n).map(|j| dy[i * n + j] * w[j * k + t]).sum::<f64>();
                prop_assert!((nn[i * k + t] - want).abs() < 1e-12);
            }
        }
        for j in 0..n {
            for t in 0..k {
                let want: f64 = 1.0 + (0..m).map(|i| dy[i * n + j] * a[i * k + t]).sum::<f64>();
                prop_assert!((tn[j * k + t] - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn whole_sequence_attention_matches_the_reference_and_its_backward_finite_differences(
        lengths in proptest::collection::vec(1usize..5, 1..3),
        kv_heads in 1usize..3, groups in 1usize..3, half in 1usize..3,
        window in proptest::option::of(1usize..4), seed in 0u64..1000,
    ) {
        let shape = Heads { heads: kv_heads * groups, kv_heads, head_dim: 2 * half, window };
        check_attention(&lengths, shape, seed, 1);
    }

    #[test]
    fn lora_matches_the_reference_and_its_backward_finite_differences(
        rows in proptest::collection::vec(1usize..4, 1..4),
        inp in 1usize..7, out in 1usize..7, rank in 1usize..4, seed in 0u64..1000,
    ) {
        let total: usize = rows.iter().sum();
        let x = values(total * inp, seed);
        // Every other segment has an adapter of its own.
        let pairs: Pairs = (0..rows.len())
            .map(|i| (i % 2 == 0).then(|| (values(rank * inp, seed + 10 + i as u64), values(out * rank, seed + 20 + i as u64))))
            .collect();
        let apply = |x: &[f64], pairs: &Pairs| {
            let segments: Vec<Segment<'_, f64>> = rows
                .iter()
                .zip(pairs)
                .map(|(n, p)| Segment {
                    rows: *n,
                    pair: p.as_ref().map(|(a, b)| LoraPair { a, b, rank, scale: 1.5 }),
                })
                .collect();
            let mut y = vec![0.0; total * out];
            lora_forward(x, inp, &mut y, out, &segments);
            y
        };
        // The f32 path against the sampler's f64 reference.
        let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let pairs32: Vec<Option<(Vec<f32>, Vec<f32>)>> =
            pairs.iter().map(|p| p.as_ref().map(|(a, b)| (f32s(a), f32s(b)))).collect();
        let segments32: Vec<Segment<'_>> = rows
            .iter()
            .zip(&pairs32)
            .map(|(n, p)| Segment {
                rows: *n,
                pair: p.as_ref().map(|(a, b)| LoraPair { a, b, rank, scale: 1.5 }),
            })
            .collect();
        let x32 = f32s(&x);
        let mut y32 = vec![0.0f32; total * out];
        lora_forward(&x32, inp, &mut y32, out, &segments32);
        assert_close("y", &y32, &reference::lora_delta(&x32, inp, out, &segments32), 1e-5);

        let dy = values(total * out, seed + 3);
        let segments: Vec<Segment<'_, f64>> = rows
            .iter()
            .zip(&pairs)
            .map(|(n, p)| Segment {
                rows: *n,
                pair: p.as_ref().map(|(a, b)| LoraPair { a, b, rank, scale: 1.5 }),
            })
            .collect();
        let mut grads_owned: Vec<Option<(Vec<f64>, Vec<f64>)>> = pairs
            .iter()
            .map(|p| p.as_ref().map(|_| (vec![0.0; rank * inp], vec![0.0; out * rank])))
            .collect();
        let mut grads: Vec<Option<LoraGrad<'_, f64>>> = grads_owned
            .iter_mut()
            .map(|g| g.as_mut().map(|(a, b)| LoraGrad { a, b }))
            .collect();
        let mut dx = vec![0.0; x.len()];
        lora_backward(&x, inp, &dy, out, &segments, &mut grads, &mut dx);
        drop(grads);
        check_gradient("dx", &x, &dx, |x| dot(&dy, &apply(x, &pairs)));
        for (i, grad) in grads_owned.iter().enumerate() {
            let Some((da, db)) = grad else { continue };
            let (a, b) = pairs[i].clone().unwrap();
            check_gradient("dA", &a, da, |a| {
                let mut moved = pairs.clone();
                moved[i] = Some((a.to_vec(), b.clone()));
                dot(&dy, &apply(&x, &moved))
            });
            check_gradient("dB", &b, db, |b| {
                let mut moved = pairs.clone();
                moved[i] = Some((a.clone(), b.to_vec()));
                dot(&dy, &apply(&x, &moved))
            });
        }
    }
}

/// Sequences longer than the attention's block of query rows (64): the blocks' products and
/// causal masks against the reference and finite differences (at every 17th entry: all of them
/// would take minutes), with all keys and with a sliding window across the blocks.
#[test]
fn whole_sequence_attention_over_several_blocks() {
    for window in [None, Some(40)] {
        let shape = Heads {
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            window,
        };
        check_attention(&[130, 70, 1], shape, 1, 17);
    }
}

/// The whole-sequence attention of sequences of `lengths`: its f32 forward against the
/// sampler's f64 reference, sequence by sequence, and its backward against central differences
/// in f64 at every `every`-th entry of `dq`, `dk` and `dv`.
fn check_attention(lengths: &[usize], shape: Heads, seed: u64, every: usize) {
    let rows: usize = lengths.iter().sum();
    let spans: Vec<Span> = lengths.iter().copied().map(Span::whole).collect();
    let (q_len, kv_len) = (
        rows * shape.heads * shape.head_dim,
        rows * shape.kv_heads * shape.head_dim,
    );
    let (q, k, v) = (
        values(q_len, seed),
        values(kv_len, seed + 1),
        values(kv_len, seed + 2),
    );
    let forward = |q: &[f64], k: &[f64], v: &[f64]| {
        let mut out = vec![0.0; q.len()];
        let mut lse = vec![0.0; rows * shape.heads];
        attention_forward(q, k, v, shape, &spans, &mut out, &mut lse);
        (out, lse)
    };
    let (out, lse) = forward(&q, &k, &v);
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (q32, k32, v32) = (f32s(&q), f32s(&k), f32s(&v));
    let mut out32 = vec![0.0f32; q_len];
    let mut lse32 = vec![0.0f32; rows * shape.heads];
    attention_forward(&q32, &k32, &v32, shape, &spans, &mut out32, &mut lse32);
    let (mut start, hd) = (0, shape.head_dim);
    let mut want = Vec::new();
    for &n in lengths {
        let cache = |x: &[f32], h: usize| -> Vec<f32> {
            (start..start + n)
                .flat_map(|r| x[(r * shape.kv_heads + h) * hd..][..hd].to_vec())
                .collect()
        };
        let keys: Vec<Vec<f32>> = (0..shape.kv_heads).map(|h| cache(&k32, h)).collect();
        let values: Vec<Vec<f32>> = (0..shape.kv_heads).map(|h| cache(&v32, h)).collect();
        let q_seq = &q32[start * shape.heads * hd..(start + n) * shape.heads * hd];
        want.extend(reference::causal_attention(
            q_seq,
            &slices(&keys),
            &slices(&values),
            shape,
            0,
        ));
        start += n;
    }
    assert_close("out", &out32, &want, 1e-5);

    let d_out = values(q_len, seed + 3);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q_len], vec![0.0; kv_len], vec![0.0; kv_len]);
    attention_backward(
        &q, &k, &v, &out, &lse, &d_out, shape, &spans, &mut dq, &mut dk, &mut dv,
    );
    let at = |n: usize| (0..n).step_by(every);
    check_gradient_at("dq", &q, &dq, at(q_len), |q| {
        dot(&d_out, &forward(q, &k, &v).0)
    });
    check_gradient_at("dk", &k, &dk, at(kv_len), |k| {
        dot(&d_out, &forward(&q, k, &v).0)
    });
    check_gradient_at("dv", &v, &dv, at(kv_len), |v| {
        dot(&d_out, &forward(&q, &k, v).0)
    });
}

/// Branches of a shared prefix (their rows after the prefix's, each seeing the prefix's keys
/// first) attend as the same sequences written out whole: the same outputs and log-sum-exps
/// row for row, and, from the same output gradients, the same `dq` and the branches' `dk` and
/// `dv`, while the prefix's keys and values get the sum of what each written-out copy of them
/// gets. Across the 64-row blocks, with all keys and with a sliding window.
#[test]
fn branches_of_a_shared_prefix_attend_as_their_sequences_written_out() {
    let (prefix, branches) = (70usize, [1usize, 65, 3]);
    for window in [None, Some(40)] {
        let shape = Heads {
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            window,
        };
        let (row, kv_row) = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        // The shared layout: the prefix's rows, then each branch's, then a whole sequence of 5.
        let rows = prefix + branches.iter().sum::<usize>() + 5;
        let (q, k, v, d_out) = (
            values(rows * row, 31),
            values(rows * kv_row, 32),
            values(rows * kv_row, 33),
            values(rows * row, 34),
        );
        let mut spans = vec![Span::whole(prefix)];
        spans.extend(branches.iter().map(|&n| Span::branch(n, 0..prefix)));
        spans.push(Span::whole(5));
        // Written out: each branch after its own copy of the prefix (only the first copy's rows
        // carry the prefix's output gradient, so the sums compare), then the whole sequence.
        let mut written = Vec::new(); // (shared row, is a copy past the first)
        let mut start = prefix;
        for (b, &n) in branches.iter().enumerate() {
            written.extend((0..prefix).map(|r| (r, b > 0)));
            written.extend((start..start + n).map(|r| (r, false)));
            start += n;
        }
        written.extend((start..start + 5).map(|r| (r, false)));
        let pick = |x: &[f64], width: usize, zero_copies: bool| -> Vec<f64> {
            written
                .iter()
                .flat_map(|&(r, copy)| {
                    let values = &x[r * width..(r + 1) * width];
                    match zero_copies && copy {
                        true => vec![0.0; width],
                        false => values.to_vec(),
                    }
                })
                .collect()
        };
        let mut written_lengths: Vec<usize> = branches.iter().map(|n| prefix + n).collect();
        written_lengths.push(5);
        let written_spans: Vec<Span> = written_lengths.into_iter().map(Span::whole).collect();

        let run = |spans: &[Span], q: &[f64], k: &[f64], v: &[f64], d_out: &[f64]| {
            let n = q.len() / row;
            let (mut out, mut lse) = (vec![0.0; n * row], vec![0.0; n * shape.heads]);
            attention_forward(q, k, v, shape, spans, &mut out, &mut lse);
            let (mut dq, mut dk, mut dv) =
                (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
            attention_backward(
                q, k, v, &out, &lse, d_out, shape, spans, &mut dq, &mut dk, &mut dv,
            );
            (out, lse, dq, dk, dv)
        };
        let shared = run(&spans, &q, &k, &v, &d_out);
        let whole = run(
            &written_spans,
            &pick(&q, row, false),
            &pick(&k, kv_row, false),
            &pick(&v, kv_row, false),
            &pick(&d_out, row, true),
        );
        // Each written-out row against its shared row; the prefix's dk and dv summed.
        let mut dk_sum = vec![0.0; rows * kv_row];
        let mut dv_sum = vec![0.0; rows * kv_row];
        for (i, &(r, copy)) in written.iter().enumerate() {
            let (at, kv_at) = (i * row..(i + 1) * row, i * kv_row..(i + 1) * kv_row);
            let (shared_at, shared_kv) = (r * row..(r + 1) * row, r * kv_row..(r + 1) * kv_row);
            assert_close(
                "out",
                &whole.0[at.clone()],
                &shared.0[shared_at.clone()],
                1e-12,
            );
            let heads = shape.heads;
            assert_close(
                "lse",
                &whole.1[i * heads..(i + 1) * heads],
                &shared.1[r * heads..(r + 1) * heads],
                1e-12,
            );
            if !copy {
                assert_close("dq", &whole.2[at], &shared.2[shared_at], 1e-12);
            }
            for (sum, x) in dk_sum[shared_kv.clone()]
                .iter_mut()
                .zip(&whole.3[kv_at.clone()])
            {
                *sum += x;
            }
            for (sum, x) in dv_sum[shared_kv].iter_mut().zip(&whole.4[kv_at]) {
                *sum += x;
            }
        }
        assert_close("dk", &shared.3, &dk_sum, 1e-12);
        assert_close("dv", &shared.4, &dv_sum, 1e-12);
    }
}
