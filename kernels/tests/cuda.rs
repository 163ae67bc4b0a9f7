//! The CUDA backend against the CPU kernels: each op within 1e-4 (relative) of the CPU's result,
//! and the contract bit for bit on the device (a row alone equals that row in a batch; one
//! segment of many rows equals a row per segment; a prefill's rows equal decode steps).
//!
//! These run where a driver, a GPU and NVRTC are present (`scripts/gpu-check.sh`) and report
//! themselves skipped, with the reason, where not; the source's NVRTC compile runs in every
//! test run (NVRTC needs no GPU; the test venv's nvidia-cuda-nvrtc wheel provides it, and a strict
//! run without it fails).
#![cfg(feature = "cuda")]

mod common;
use common::values;

use opentinker_test_tools::skip_for_machine;

use opentinker_kernels::cuda::{
    AdamStep, AdapterRef, CudaSlice, DeviceSegment, Gpu, GpuErrorKind, GpuLoraGrad, GpuLoraPair,
    GpuLoraSegment, GpuMatrix, LoraPool, LoraSite, PagedKvCache, SequenceRow, bf16_bits,
    bf16_value, compile_kernels,
};
use opentinker_kernels::gemm::{matmul_nn, matmul_tn};
use opentinker_kernels::{
    Activation, Heads, LoraGrad, LoraPair, Segment, Span, attention_backward, attention_forward,
    causal_attention, linear, lora_apply, lora_backward, ops, unembed,
};

fn gpu(test: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(gpu) => Some(gpu),
        Err(error) if error.is_unavailable() => {
            skip_for_machine(&error);
            None
        }
        Err(error) => panic!("{test}: {error}"),
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * (1.0 + w.abs()),
            "{what}: element {i}: GPU {g} vs CPU {w}"
        );
    }
}

fn up(gpu: &Gpu, host: &[f32]) -> CudaSlice<f32> {
    gpu.upload(host).expect("upload")
}

fn down(gpu: &Gpu, device: &CudaSlice<f32>) -> Vec<f32> {
    gpu.download(device).expect("download")
}

#[test]
fn the_kernel_source_compiles_with_nvrtc() {
    match compile_kernels(Some("compute_90")) {
        Ok(ptx) => {
            let ptx = ptx.to_src();
            for kernel in [
                "paged_attention",
                "linear_f32",
                "linear_bf16",
                "linear_wide_f32",
                "linear_wide_bf16",
                "linear_row_f32",
                "linear_row_bf16",
                "lora_shrink",
                "lora_expand",
                "rms_norm_into",
                "rms_norm_backward",
                "rms_norm_weight_grad",
                "rope_backward",
                "gate_mul_backward",
                "gate_mul",
                "scale_in_place",
                "square_sum_partials",
                "adamw",
                "linear_backward_input_f32",
                "linear_backward_input_bf16",
                "weight_gradient",
                "bias_gradient",
                "embed_backward",
                "target_logprobs",
                "target_logprobs_backward",
                "small_gemm",
                "attention_train_forward",
                "attention_train_backward_q",
                "attention_train_backward_kv",
                "add_scaled_rows",
            ] {
                assert!(ptx.contains(&format!(".entry {kernel}")), "{kernel}");
            }
        }
        // NVRTC needs no GPU: the test venv provides it, so a strict run without it fails.
        Err(error) if error.kind() == GpuErrorKind::NoCompiler => {
            opentinker_test_tools::require(&opentinker_test_tools::NVRTC, None::<()>);
        }
        Err(error) => panic!("{error}"),
    }
}

#[test]
fn a_missing_device_is_named_not_a_crash() {
    let error = Gpu::new(4096).err().expect("no machine has 4,097 GPUs");
    assert!(error.is_unavailable(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("driver") || text.contains("device 4096") || text.contains("NVRTC"),
        "{text}"
    );
}

#[test]
fn linear_matches_the_cpu_and_rows_do_not_depend_on_the_batch() {
    let Some(gpu) = gpu("linear") else { return };
    // Widths that take the float4 path (multiples of 4) and the scalar one; row counts of the
    // narrow tiling (up to 8 rows a tile) and, with outputs wide enough to fill a device, of the
    // wide one (partial row tiles and column groups too); a row alone (narrow) must equal that
    // row in a batch bit for bit.
    for (rows, inp, out) in [
        (1, 64, 40),
        (7, 37, 33),
        (19, 128, 96),
        (64, 896, 200),
        (3, 5, 1),
        (40, 256, 4101),
        (17, 37, 8200),
        (33, 1030, 4099),
    ] {
        let x = values(rows * inp, 1);
        let w = values(out * inp, 2);
        let mut want = vec![0.0; rows * out];
        linear(&x, &w, inp, &mut want, false);
        let (dx, dw) = (up(&gpu, &x), up(&gpu, &w));
        let mut y = gpu.zeros(rows * out).expect("zeros");
        gpu.linear(&dx, &dw, None, None, inp, &mut y, false)
            .expect("linear");
        let got = down(&gpu, &y);
        assert_close(&format!("linear {rows}x{inp}x{out}"), &got, &want, 1e-4);
        for row in [0, rows / 2, rows - 1] {
            let alone_x = up(&gpu, &x[row * inp..(row + 1) * inp]);
            let mut alone = gpu.zeros(out).expect("zeros");
            gpu.linear(&alone_x, &dw, None, None, inp, &mut alone, false)
                .expect("linear");
            assert_eq!(
                down(&gpu, &alone),
                got[row * out..(row + 1) * out],
                "row {row}"
            );
        }
        // Accumulating adds exactly the same sums.
        gpu.linear(&dx, &dw, None, None, inp, &mut y, true)
            .expect("linear");
        let doubled: Vec<f32> = got.iter().map(|v| v + v).collect();
        assert_eq!(down(&gpu, &y), doubled);
        // A fused bias is added after the sum, as a separate add_bias would add it.
        let bias = up(&gpu, &values(out, 3));
        let mut fused = gpu.zeros(rows * out).expect("zeros");
        gpu.linear(&dx, &dw, Some(&bias), None, inp, &mut fused, false)
            .expect("linear");
        let mut separate = up(&gpu, &got);
        gpu.add_bias(&mut separate, &bias).expect("bias");
        assert_eq!(down(&gpu, &fused), down(&gpu, &separate), "bias");
    }
    let (x, w) = (up(&gpu, &[0.0; 10]), up(&gpu, &[0.0; 12]));
    let mut y = gpu.zeros(3).expect("zeros");
    let error = gpu
        .linear(&x, &w, None, None, 4, &mut y, false)
        .expect_err("10 is not rows × 4");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);
}

#[test]
fn bf16_weights_compute_as_their_rounded_f32_values() {
    let Some(gpu) = gpu("bf16") else { return };
    for (rows, inp, out) in [(1, 896, 100), (13, 37, 21), (40, 256, 64)] {
        let x = values(rows * inp, 70);
        let w = values(out * inp, 71);
        let bits: Vec<u16> = w.iter().map(|&v| bf16_bits(v)).collect();
        let rounded: Vec<f32> = bits.iter().map(|&b| bf16_value(b)).collect();
        let mut want = vec![0.0; rows * out];
        linear(&x, &rounded, inp, &mut want, false);
        let (dx, dw) = (up(&gpu, &x), gpu.upload(&bits).expect("upload"));
        // Rounding on the device gives the host's bits.
        let on_device = gpu.to_bf16(&up(&gpu, &w)).expect("to_bf16");
        assert_eq!(gpu.stream().clone_dtoh(&on_device).expect("download"), bits);
        let mut y = gpu.zeros(rows * out).expect("zeros");
        gpu.linear_bf16(&dx, &dw, None, None, inp, &mut y, false)
            .expect("linear_bf16");
        let got = down(&gpu, &y);
        assert_close(
            &format!("bf16 linear {rows}x{inp}x{out}"),
            &got,
            &want,
            1e-4,
        );
        let row = rows - 1;
        let mut alone = gpu.zeros(out).expect("zeros");
        gpu.linear_bf16(
            &up(&gpu, &x[row * inp..]),
            &dw,
            None,
            None,
            inp,
            &mut alone,
            false,
        )
        .expect("linear_bf16");
        assert_eq!(down(&gpu, &alone), got[row * out..]);
        // The embedding gather widens the same bits.
        let indices = gpu.indices(&[out - 1, 0]).expect("indices");
        let mut rows_out = gpu.zeros(2 * inp).expect("zeros");
        gpu.gather_rows_bf16(&dw, inp, &indices, &mut rows_out)
            .expect("gather");
        let mut expected = rounded[(out - 1) * inp..].to_vec();
        expected.extend_from_slice(&rounded[..inp]);
        assert_eq!(down(&gpu, &rows_out), expected);
    }
    assert!(bf16_value(bf16_bits(f32::NAN)).is_nan());
    assert_eq!(
        bf16_value(bf16_bits(1.0 + 1.0 / 256.0)),
        1.0,
        "ties go to even"
    );
}

#[test]
fn lora_apply_matches_the_cpu_and_rows_do_not_depend_on_their_segments() {
    let Some(gpu) = gpu("lora_apply") else { return };
    // Widths of one and of many 512-wide shrink segments, on the float4 path and the scalar
    // one; outputs of one and of several 256-column expand blocks; ranks whose B columns are
    // staged at once (up to 32) and in several stages (40 and 100).
    for (inp, out, ranks, pool_rank) in [
        (896, 128, [4, 8, 12], 16),
        (37, 29, [4, 8, 12], 16),
        (4864, 300, [4, 40, 100], 128),
        (1283, 529, [16, 2, 33], 40),
    ] {
        let a: Vec<Vec<f32>> = (0..3)
            .map(|i| values(ranks[i] * inp, 10 + i as u64))
            .collect();
        let b: Vec<Vec<f32>> = (0..3)
            .map(|i| values(out * ranks[i], 20 + i as u64))
            .collect();
        let scales = [0.5, 2.0, 1.25];
        let mut pool = LoraPool::new(&gpu, 5, inp, out, pool_rank).expect("pool");
        // Slots 1, 2 and 4 hold adapters 0, 1 and 2.
        let slots = [1, 2, 4];
        for i in 0..3 {
            pool.write(&gpu, slots[i], &a[i], &b[i], ranks[i])
                .expect("write");
        }
        // Segments of 11 (longer than a tile), 1, 3 rows and none; adapters 0, 2, none, 1, 0.
        let plan: [(usize, Option<usize>); 5] = [
            (11, Some(0)),
            (1, Some(2)),
            (3, None),
            (9, Some(1)),
            (2, Some(0)),
        ];
        let rows: usize = plan.iter().map(|(n, _)| n).sum();
        let cpu_segments: Vec<Segment> = plan
            .iter()
            .map(|&(rows, adapter)| Segment {
                rows,
                pair: adapter.map(|i| LoraPair {
                    a: &a[i],
                    b: &b[i],
                    rank: ranks[i],
                    scale: scales[i],
                }),
            })
            .collect();
        let device_ref = |i: usize| AdapterRef {
            slot: slots[i],
            rank: ranks[i],
            scale: scales[i],
        };
        let segments: Vec<DeviceSegment> = plan
            .iter()
            .map(|&(rows, adapter)| DeviceSegment {
                rows,
                adapter: adapter.map(device_ref),
            })
            .collect();
        let x = values(rows * inp, 30);
        let base = values(rows * out, 31);
        let mut want = base.clone();
        lora_apply(&x, inp, &mut want, out, &cpu_segments);
        let dx = up(&gpu, &x);
        let mut y = up(&gpu, &base);
        let mut batch = gpu.lora_batch(&segments).expect("batch");
        gpu.lora_apply(&dx, &mut y, &pool, &mut batch)
            .expect("apply");
        let got = down(&gpu, &y);
        assert_close(&format!("lora {inp}->{out}"), &got, &want, 1e-4);
        // The same rows as one-row segments (a decode batch): bit-identical.
        let one_by_one: Vec<DeviceSegment> = segments
            .iter()
            .flat_map(|s| {
                std::iter::repeat_n(
                    DeviceSegment {
                        rows: 1,
                        adapter: s.adapter,
                    },
                    s.rows,
                )
            })
            .collect();
        let mut y = up(&gpu, &base);
        let mut batch = gpu.lora_batch(&one_by_one).expect("batch");
        gpu.lora_apply(&dx, &mut y, &pool, &mut batch)
            .expect("apply");
        assert_eq!(down(&gpu, &y), got);
        // A projection that expands as it stores gives the projection-then-apply bits, in both
        // tilings (the second batch fills a device: the wide one).
        for copies in [1, 40] {
            let rows_n = rows * copies;
            let xs: Vec<f32> = x.iter().copied().cycle().take(rows_n * inp).collect();
            let w = values(out * inp, 32);
            let segments: Vec<DeviceSegment> = segments
                .iter()
                .copied()
                .cycle()
                .take(segments.len() * copies)
                .collect();
            let (dx, dw) = (up(&gpu, &xs), up(&gpu, &w));
            let mut batch = gpu.lora_batch(&segments).expect("batch");
            let mut separate = gpu.zeros(rows_n * out).expect("zeros");
            gpu.linear(&dx, &dw, None, None, inp, &mut separate, false)
                .expect("linear");
            gpu.lora_apply(&dx, &mut separate, &pool, &mut batch)
                .expect("apply");
            let mut fused = gpu.zeros(rows_n * out).expect("zeros");
            let site = LoraSite {
                pool: &pool,
                batch: &mut batch,
            };
            gpu.linear(&dx, &dw, None, Some(site), inp, &mut fused, false)
                .expect("fused");
            let fused = down(&gpu, &fused);
            assert_eq!(
                fused,
                down(&gpu, &separate),
                "fused {inp}->{out} × {copies}"
            );
            // Row 0 alone (the single-row kernel) with its adapter: the same bits.
            let mut alone_batch = gpu
                .lora_batch(&[DeviceSegment {
                    rows: 1,
                    adapter: segments[0].adapter,
                }])
                .expect("batch");
            let mut alone = gpu.zeros(out).expect("zeros");
            let site = LoraSite {
                pool: &pool,
                batch: &mut alone_batch,
            };
            gpu.linear(
                &up(&gpu, &xs[..inp]),
                &dw,
                None,
                Some(site),
                inp,
                &mut alone,
                false,
            )
            .expect("fused row");
            assert_eq!(down(&gpu, &alone), fused[..out], "fused row {inp}->{out}");
        }
    }
    // A batch naming a slot the pool does not have is refused before any launch.
    let pool = LoraPool::new(&gpu, 2, 8, 8, 4).expect("pool");
    let mut batch = gpu
        .lora_batch(&[DeviceSegment {
            rows: 1,
            adapter: Some(AdapterRef {
                slot: 2,
                rank: 4,
                scale: 1.0,
            }),
        }])
        .expect("batch");
    let (x, mut y) = (up(&gpu, &[0.0; 8]), gpu.zeros(8).expect("zeros"));
    let error = gpu
        .lora_apply(&x, &mut y, &pool, &mut batch)
        .expect_err("slot 2 of 2");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);
}

#[test]
fn row_ops_match_the_cpu() {
    let Some(gpu) = gpu("row ops") else { return };
    let (rows, width) = (5, 896);
    let x = values(rows * width, 40);
    let weight = values(width, 41);
    let mut want = x.clone();
    ops::rms_norm(&mut want, &weight, 1e-6);
    let mut dx = up(&gpu, &x);
    gpu.rms_norm(&mut dx, &up(&gpu, &weight), 1e-6)
        .expect("rms_norm");
    assert_close("rms_norm", &down(&gpu, &dx), &want, 1e-4);
    let source = up(&gpu, &x);
    let mut normed = gpu.zeros(x.len()).expect("zeros");
    gpu.rms_norm_into(&source, &mut normed, &up(&gpu, &weight), 1e-6)
        .expect("rms_norm_into");
    assert_eq!(down(&gpu, &normed), down(&gpu, &dx), "rms_norm_into");
    assert_eq!(down(&gpu, &source), x, "rms_norm_into leaves its input");

    let (heads, head_dim, max_positions) = (3, 64, 40);
    let positions = [0usize, 7, 39, 12, 3];
    let angles: Vec<f32> = (0..max_positions * head_dim)
        .map(|i| (i / head_dim) as f32 * 0.1 * ((i % (head_dim / 2)) as f32 + 1.0).recip())
        .collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let q = values(rows * heads * head_dim, 42);
    let mut want = q.clone();
    ops::rope(&mut want, head_dim, &positions, &cos, &sin);
    let mut dq = up(&gpu, &q);
    let device_positions = gpu.indices(&positions).expect("positions");
    gpu.rope(
        &mut dq,
        head_dim,
        &device_positions,
        &up(&gpu, &cos),
        &up(&gpu, &sin),
    )
    .expect("rope");
    assert_close("rope", &down(&gpu, &dq), &want, 1e-4);
    let short = up(&gpu, &cos[..30 * head_dim]);
    let error = gpu
        .rope(&mut dq, head_dim, &device_positions, &short, &short)
        .expect_err("position 39 of a 30-row table");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);

    let (gate, upv) = (values(1000, 43), values(1000, 44));
    for activation in [Activation::Silu, Activation::GeluTanh] {
        let mut want = gate.clone();
        ops::gate_mul(activation, &mut want, &upv);
        let mut dg = up(&gpu, &gate);
        gpu.gate_mul(activation, &mut dg, &up(&gpu, &upv))
            .expect("gate_mul");
        assert_close("gate_mul", &down(&gpu, &dg), &want, 1e-4);
    }
    let mut want = gate.clone();
    ops::scale(&mut want, 25.3);
    let mut scaled = up(&gpu, &gate);
    gpu.scale(&mut scaled, 25.3).expect("scale");
    assert_close("scale", &down(&gpu, &scaled), &want, 1e-4);

    let vocabulary = 5000;
    let logits: Vec<f32> = values(3 * vocabulary, 45)
        .iter()
        .map(|v| v * 20.0)
        .collect();
    let want: Vec<f32> = logits
        .chunks(vocabulary)
        .flat_map(ops::log_softmax)
        .collect();
    let mut out = gpu.zeros(logits.len()).expect("zeros");
    gpu.log_softmax(&up(&gpu, &logits), vocabulary, &mut out)
        .expect("log_softmax");
    assert_close("log_softmax", &down(&gpu, &out), &want, 1e-4);
}

/// The backward of the row-wise ops and AdamW against the CPU trainer's (`ops::*_backward`, the
/// engine's AdamW written out in f64), and their sums independent of the batch: a row's
/// gradient alone equals its gradient among others.
#[test]
fn training_row_ops_and_adamw_match_the_cpu() {
    let Some(gpu) = gpu("training row ops") else {
        return;
    };
    let (rows, width, eps) = (6, 896, 1e-6f32);
    let (x, weight, dy) = (
        values(rows * width, 50),
        values(width, 51),
        values(rows * width, 52),
    );
    let start = values(rows * width, 53);
    let mut inverse = vec![0.0; rows];
    ops::inverse_rms_rows(&x, width, eps, &mut inverse);
    let (mut want_dx, mut want_dw) = (start.clone(), values(width, 54));
    let dw_start = want_dw.clone();
    ops::rms_norm_backward(&x, &weight, &inverse, &dy, &mut want_dx, Some(&mut want_dw));
    let (mut dx, mut dw) = (up(&gpu, &start), up(&gpu, &dw_start));
    gpu.rms_norm_backward(
        &up(&gpu, &x),
        &up(&gpu, &weight),
        eps,
        &up(&gpu, &dy),
        &mut dx,
        Some(&mut dw),
    )
    .expect("rms_norm_backward");
    assert_close("rms_norm_backward dx", &down(&gpu, &dx), &want_dx, 1e-4);
    assert_close(
        "rms_norm_backward dweight",
        &down(&gpu, &dw),
        &want_dw,
        1e-4,
    );
    // Row 2 alone: the same bits as in the batch.
    let row = |v: &[f32]| v[2 * width..3 * width].to_vec();
    let mut alone = up(&gpu, &row(&start));
    gpu.rms_norm_backward(
        &up(&gpu, &row(&x)),
        &up(&gpu, &weight),
        eps,
        &up(&gpu, &row(&dy)),
        &mut alone,
        None,
    )
    .expect("rms_norm_backward of one row");
    assert_eq!(down(&gpu, &alone), row(&down(&gpu, &dx)), "a row alone");

    let (heads, head_dim, max_positions) = (3, 64, 40);
    let positions = [0usize, 7, 39, 12, 3, 5];
    let angles: Vec<f32> = (0..max_positions * head_dim)
        .map(|i| (i / head_dim) as f32 * 0.1 * ((i % (head_dim / 2)) as f32 + 1.0).recip())
        .collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let grad = values(rows * heads * head_dim, 55);
    let mut want = grad.clone();
    ops::rope_backward(&mut want, head_dim, &positions, &cos, &sin);
    let mut device = up(&gpu, &grad);
    let device_positions = gpu.indices(&positions).expect("positions");
    gpu.rope_backward(
        &mut device,
        head_dim,
        &device_positions,
        &up(&gpu, &cos),
        &up(&gpu, &sin),
    )
    .expect("rope_backward");
    assert_close("rope_backward", &down(&gpu, &device), &want, 1e-4);
    // The backward undoes the forward's rotation.
    gpu.rope(
        &mut device,
        head_dim,
        &device_positions,
        &up(&gpu, &cos),
        &up(&gpu, &sin),
    )
    .expect("rope");
    assert_close("rope after its backward", &down(&gpu, &device), &grad, 1e-4);

    let (gate, upv, d_out) = (values(1000, 56), values(1000, 57), values(1000, 58));
    for activation in [Activation::Silu, Activation::GeluTanh] {
        let (mut want_gate, mut want_up) = (vec![0.0; 1000], vec![0.0; 1000]);
        ops::gate_mul_backward(
            activation,
            &gate,
            &upv,
            &d_out,
            &mut want_gate,
            &mut want_up,
        );
        let (mut d_gate, mut d_up) = (
            gpu.zeros(1000).expect("zeros"),
            gpu.zeros(1000).expect("zeros"),
        );
        gpu.gate_mul_backward(
            activation,
            &up(&gpu, &gate),
            &up(&gpu, &upv),
            &up(&gpu, &d_out),
            &mut d_gate,
            &mut d_up,
        )
        .expect("gate_mul_backward");
        assert_close(
            "gate_mul_backward d_gate",
            &down(&gpu, &d_gate),
            &want_gate,
            1e-4,
        );
        assert_close("gate_mul_backward d_up", &down(&gpu, &d_up), &want_up, 1e-4);
    }

    // The norm over several chunks, and AdamW's step 3 from given moments.
    let n = 10_000;
    let (w, g, m, v) = (values(n, 60), values(n, 61), values(n, 62), values(n, 63));
    let v: Vec<f32> = v.iter().map(|x| x.abs()).collect();
    let want_square: f64 = g.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let got_square = gpu.square_sum(&up(&gpu, &g)).expect("square_sum");
    assert!(
        (got_square - want_square).abs() <= 1e-9 * want_square,
        "square_sum: {got_square} vs {want_square}"
    );
    let step = AdamStep {
        learning_rate: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-12,
        weight_decay: 0.1,
        step: 3,
        clip: 0.5,
    };
    let (bias1, bias2) = (1.0 - 0.9f64.powi(3), 1.0 - 0.95f64.powi(3));
    let mut want = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let grad = f64::from(g[i]) * step.clip;
        let first = f64::from(m[i]) * step.beta1 + grad * (1.0 - step.beta1);
        let second = f64::from(v[i]) * step.beta2 + grad * grad * (1.0 - step.beta2);
        let update = (first / bias1) / ((second / bias2).sqrt() + step.eps);
        let weight = f64::from(w[i]) * (1.0 - step.learning_rate * step.weight_decay)
            - update * step.learning_rate;
        want.0.push(weight as f32);
        want.1.push(first as f32);
        want.2.push(second as f32);
    }
    let (mut dw, mut dm, mut dv) = (up(&gpu, &w), up(&gpu, &m), up(&gpu, &v));
    gpu.adamw(&mut dw, &up(&gpu, &g), &mut dm, &mut dv, step)
        .expect("adamw");
    assert_close("adamw weights", &down(&gpu, &dw), &want.0, 1e-4);
    assert_close("adamw first moments", &down(&gpu, &dm), &want.1, 1e-4);
    assert_close("adamw second moments", &down(&gpu, &dv), &want.2, 1e-4);
    let error = gpu
        .adamw(&mut dw, &up(&gpu, &g[..10]), &mut dm, &mut dv, step)
        .expect_err("a gradient of another length");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);
}

/// The backward of a frozen projection (f32 and bf16 weights), the weight and bias gradients
/// of full-parameter training, the embedding's backward (a token twice adds twice) and the
/// logprob head over logits, against the CPU trainer's; a row's input gradient alone equals
/// its gradient in the batch.
#[test]
fn projection_embedding_and_head_backward_match_the_cpu() {
    let Some(gpu) = gpu("training products") else {
        return;
    };
    // Two tiles of rows and of columns (the second of each partial), and a last chunk of
    // outputs shorter than the others.
    let (rows, inp, out) = (70, 96, 200);
    let (dy, w, x) = (
        values(rows * out, 80),
        values(out * inp, 81),
        values(rows * inp, 82),
    );
    let start = values(rows * inp, 83);
    let bits: Vec<u16> = w.iter().map(|&v| bf16_bits(v)).collect();
    let rounded: Vec<f32> = bits.iter().map(|&b| bf16_value(b)).collect();
    for (name, matrix, host) in [
        ("f32", GpuMatrix::F32(up(&gpu, &w)), &w),
        (
            "bf16",
            GpuMatrix::Bf16(gpu.upload(&bits).expect("upload")),
            &rounded,
        ),
    ] {
        let mut want = start.clone();
        matmul_nn(&dy, host, inp, &mut want, true);
        let mut dx = up(&gpu, &start);
        gpu.project_backward_input(&up(&gpu, &dy), &matrix, inp, &mut dx)
            .expect("project_backward_input");
        let got = down(&gpu, &dx);
        assert_close(&format!("{name} input gradient"), &got, &want, 1e-4);
        for row in [3, 65] {
            let mut alone = up(&gpu, &start[row * inp..(row + 1) * inp]);
            let dy_row = up(&gpu, &dy[row * out..(row + 1) * out]);
            gpu.project_backward_input(&dy_row, &matrix, inp, &mut alone)
                .expect("project_backward_input of one row");
            assert_eq!(
                down(&gpu, &alone),
                got[row * inp..(row + 1) * inp],
                "{name}: row {row} alone"
            );
        }
    }

    let (dw_start, db_start) = (values(out * inp, 84), values(out, 85));
    let mut want_dw = dw_start.clone();
    matmul_tn(&dy, &x, inp, &mut want_dw, true);
    let mut want_db = db_start.clone();
    for row in dy.chunks_exact(out) {
        for (d, &g) in want_db.iter_mut().zip(row) {
            *d += g;
        }
    }
    let (mut dw, mut db) = (up(&gpu, &dw_start), up(&gpu, &db_start));
    gpu.weight_gradient(&up(&gpu, &x), &up(&gpu, &dy), inp, &mut dw, Some(&mut db))
        .expect("weight_gradient");
    assert_close("weight gradient", &down(&gpu, &dw), &want_dw, 1e-4);
    assert_close("bias gradient", &down(&gpu, &db), &want_db, 1e-4);

    let (vocab, width) = (50, 32);
    let tokens = [3usize, 49, 3, 0, 17];
    let d_x = values(tokens.len() * width, 86);
    let table_start = values(vocab * width, 87);
    let mut want = table_start.clone();
    for (&t, row) in tokens.iter().zip(d_x.chunks_exact(width)) {
        for (d, &g) in want[t * width..][..width].iter_mut().zip(row) {
            *d += g;
        }
    }
    let mut table = up(&gpu, &table_start);
    let indices = gpu.indices(&tokens).expect("indices");
    gpu.embed_backward(&indices, width, &up(&gpu, &d_x), &mut table)
        .expect("embed_backward");
    assert_close("embed_backward", &down(&gpu, &table), &want, 1e-5);
    let mut small = up(&gpu, &table_start[..40 * width]);
    let error = gpu
        .embed_backward(&indices, width, &up(&gpu, &d_x), &mut small)
        .expect_err("token 49 of a 40-row table");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);

    let vocabulary = 5000;
    let targets = [4u32, 4999, 0];
    let logits: Vec<f32> = values(targets.len() * vocabulary, 88)
        .iter()
        .map(|v| v * 20.0)
        .collect();
    let mut want = vec![0.0; targets.len()];
    unembed::target_logprobs(&logits, vocabulary, &targets, &mut want);
    let device_logits = up(&gpu, &logits);
    let got = gpu
        .target_logprobs(&device_logits, vocabulary, &targets)
        .expect("target_logprobs");
    assert_close("target_logprobs", &down(&gpu, &got), &want, 1e-4);
    let g = values(targets.len(), 89);
    let mut want = vec![0.0; logits.len()];
    unembed::target_logprobs_backward(&logits, vocabulary, &targets, &g, &mut want);
    let got = gpu
        .target_logprobs_backward(&device_logits, vocabulary, &targets, &up(&gpu, &g))
        .expect("target_logprobs_backward");
    assert_close("target_logprobs_backward", &down(&gpu, &got), &want, 1e-4);
    let error = gpu
        .target_logprobs(&device_logits, vocabulary, &[4, 5000, 0])
        .expect_err("target 5000 of 5000");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);
}

/// LoRA's backward over mixed segments (two adapters of different ranks, a base-model run, a
/// frozen adapter whose pair gives only the input's gradient) against `lora_backward`; a
/// segment's gradients alone equal its part of the batch's.
#[test]
fn lora_backward_matches_the_cpu_per_segment() {
    let Some(gpu) = gpu("lora backward") else {
        return;
    };
    let (inp, out) = (96, 80);
    // The segments' rows: through adapter 0 (rank 8), the base model, adapter 1 (rank 4), and
    // adapter 1 again but frozen (no gradients gathered).
    let shapes = [4usize, 6, 9, 7];
    let rows: usize = shapes.iter().sum();
    let (x, dy) = (values(rows * inp, 90), values(rows * out, 91));
    let pairs: Vec<(Vec<f32>, Vec<f32>, usize)> = [(8, 92), (4, 94)]
        .iter()
        .map(|&(rank, seed)| (values(rank * inp, seed), values(out * rank, seed + 1), rank))
        .collect();
    let pair_of = |i: usize| match i {
        0 => Some(0),
        2 | 3 => Some(1),
        _ => None,
    };
    let trained = |i: usize| i != 3;
    let cpu_segments: Vec<Segment<'_>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &n)| Segment {
            rows: n,
            pair: pair_of(i).map(|p| LoraPair {
                a: &pairs[p].0,
                b: &pairs[p].1,
                rank: pairs[p].2,
                scale: 0.75,
            }),
        })
        .collect();
    let mut want_grads: Vec<(Vec<f32>, Vec<f32>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let rank = pair_of(i).map_or(0, |p| pairs[p].2);
            (
                values(rank * inp, 100 + i as u64),
                values(out * rank, 110 + i as u64),
            )
        })
        .collect();
    let start_grads = want_grads.clone();
    let dx_start = values(rows * inp, 96);
    let mut want_dx = dx_start.clone();
    {
        let mut grads: Vec<Option<LoraGrad<'_, f32>>> = want_grads
            .iter_mut()
            .enumerate()
            .map(|(i, (a, b))| (pair_of(i).is_some() && trained(i)).then_some(LoraGrad { a, b }))
            .collect();
        lora_backward(&x, inp, &dy, out, &cpu_segments, &mut grads, &mut want_dx);
    }

    let device_pairs: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = pairs
        .iter()
        .map(|(a, b, _)| (up(&gpu, a), up(&gpu, b)))
        .collect();
    let segments: Vec<GpuLoraSegment<'_>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &n)| GpuLoraSegment {
            rows: n,
            pair: pair_of(i).map(|p| GpuLoraPair {
                a: &device_pairs[p].0,
                b: &device_pairs[p].1,
                rank: pairs[p].2,
                scale: 0.75,
            }),
        })
        .collect();
    let mut device_grads: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = start_grads
        .iter()
        .map(|(a, b)| (up(&gpu, a), up(&gpu, b)))
        .collect();
    let mut dx = up(&gpu, &dx_start);
    {
        let mut grads: Vec<Option<GpuLoraGrad<'_>>> = device_grads
            .iter_mut()
            .enumerate()
            .map(|(i, (a, b))| (pair_of(i).is_some() && trained(i)).then_some(GpuLoraGrad { a, b }))
            .collect();
        gpu.lora_backward(
            &up(&gpu, &x),
            inp,
            &up(&gpu, &dy),
            out,
            &segments,
            &mut grads,
            &mut dx,
        )
        .expect("lora_backward");
    }
    let got_dx = down(&gpu, &dx);
    assert_close("lora dx", &got_dx, &want_dx, 1e-4);
    for (i, ((a, b), (want_a, want_b))) in device_grads.iter().zip(&want_grads).enumerate() {
        if pair_of(i).is_some() {
            assert_close(&format!("segment {i} dA"), &down(&gpu, a), want_a, 1e-4);
            assert_close(&format!("segment {i} dB"), &down(&gpu, b), want_b, 1e-4);
        }
    }
    // Segment 2 alone: its rows' input gradient as in the batch.
    let (first, n) = (shapes[0] + shapes[1], shapes[2]);
    let mut alone = up(&gpu, &dx_start[first * inp..(first + n) * inp]);
    gpu.lora_backward(
        &up(&gpu, &x[first * inp..(first + n) * inp]),
        inp,
        &up(&gpu, &dy[first * out..(first + n) * out]),
        out,
        &segments[2..3],
        &mut [None],
        &mut alone,
    )
    .expect("lora_backward of one segment");
    assert_eq!(
        down(&gpu, &alone),
        got_dx[first * inp..(first + n) * inp],
        "a segment alone"
    );
}

/// Training attention over whole sequences (three lengths, grouped queries) against the CPU's
/// forward and backward; a sequence alone gives the same bits as in the batch.
#[test]
fn training_attention_matches_the_cpu_forward_and_backward() {
    let Some(gpu) = gpu("training attention") else {
        return;
    };
    for window in [None, Some(7)] {
        check_training_attention(&gpu, window);
    }
}

fn check_training_attention(gpu: &Gpu, window: Option<usize>) {
    let shape = Heads {
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        window,
    };
    let lengths = [5usize, 1, 12];
    let spans: Vec<Span> = lengths.iter().copied().map(Span::whole).collect();
    let rows: usize = lengths.iter().sum();
    let (q_len, kv_len) = (rows * 4 * 32, rows * 2 * 32);
    let (q, k, v) = (values(q_len, 120), values(kv_len, 121), values(kv_len, 122));
    let d_out = values(q_len, 123);
    let (mut want_out, mut want_lse) = (vec![0.0; q_len], vec![0.0; rows * 4]);
    attention_forward(&q, &k, &v, shape, &spans, &mut want_out, &mut want_lse);
    let (mut want_dq, mut want_dk, mut want_dv) =
        (vec![0.0; q_len], vec![0.0; kv_len], vec![0.0; kv_len]);
    attention_backward(
        &q,
        &k,
        &v,
        &want_out,
        &want_lse,
        &d_out,
        shape,
        &spans,
        &mut want_dq,
        &mut want_dk,
        &mut want_dv,
    );

    let run = |lengths: &[usize], at: std::ops::Range<usize>| {
        let (q_at, kv_at) = (at.start * 128..at.end * 128, at.start * 64..at.end * 64);
        let (dq_in, dk_in, dv_in) = (
            up(gpu, &q[q_at.clone()]),
            up(gpu, &k[kv_at.clone()]),
            up(gpu, &v[kv_at.clone()]),
        );
        let n = at.len();
        let mut out = gpu.zeros(n * 128).expect("zeros");
        let mut lse = gpu.zeros(n * 4).expect("zeros");
        gpu.attention_forward(&dq_in, &dk_in, &dv_in, shape, lengths, &mut out, &mut lse)
            .expect("attention_forward");
        let (mut dq, mut dk, mut dv) = (
            gpu.zeros(n * 128).expect("zeros"),
            gpu.zeros(n * 64).expect("zeros"),
            gpu.zeros(n * 64).expect("zeros"),
        );
        gpu.attention_backward(
            &dq_in,
            &dk_in,
            &dv_in,
            &out,
            &lse,
            &up(gpu, &d_out[q_at]),
            shape,
            lengths,
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .expect("attention_backward");
        [&out, &lse, &dq, &dk, &dv].map(|buffer| down(gpu, buffer))
    };
    let [out, lse, dq, dk, dv] = run(&lengths, 0..rows);
    assert_close("attention out", &out, &want_out, 1e-4);
    assert_close("attention lse", &lse, &want_lse, 1e-4);
    assert_close("attention dq", &dq, &want_dq, 1e-4);
    assert_close("attention dk", &dk, &want_dk, 1e-4);
    assert_close("attention dv", &dv, &want_dv, 1e-4);
    // The third sequence alone.
    let [alone_out, _, alone_dq, alone_dk, _] = run(&lengths[2..], 6..rows);
    assert_eq!(alone_out, out[6 * 128..], "a sequence alone: out");
    assert_eq!(alone_dq, dq[6 * 128..], "a sequence alone: dq");
    assert_eq!(alone_dk, dk[6 * 64..], "a sequence alone: dk");

    let mut out = gpu.zeros(q_len).expect("zeros");
    let mut lse = gpu.zeros(rows * 4).expect("zeros");
    let error = gpu
        .attention_forward(
            &up(gpu, &q),
            &up(gpu, &k),
            &up(gpu, &v),
            shape,
            &[5, 1, 11],
            &mut out,
            &mut lse,
        )
        .expect_err("lengths that do not cover the rows");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);
}

/// The unembedding's logprob with its Jacobian, and its backward, against the CPU's fused
/// version (f32 and bf16 tables).
#[test]
fn unembed_logprobs_and_their_backward_match_the_cpu() {
    let Some(gpu) = gpu("unembed logprobs") else {
        return;
    };
    let (vocab, hidden) = (3000, 64);
    let targets = [7u32, 2999, 0, 1500];
    let rows = targets.len();
    let x = values(rows * hidden, 130);
    let table: Vec<f32> = values(vocab * hidden, 131)
        .iter()
        .map(|v| v * 4.0)
        .collect();
    let bits: Vec<u16> = table.iter().map(|&v| bf16_bits(v)).collect();
    let rounded: Vec<f32> = bits.iter().map(|&b| bf16_value(b)).collect();
    let g = values(rows, 132);
    let dx_start = values(rows * hidden, 133);
    for (name, matrix, host) in [
        ("f32", GpuMatrix::F32(up(&gpu, &table)), &table),
        (
            "bf16",
            GpuMatrix::Bf16(gpu.upload(&bits).expect("upload")),
            &rounded,
        ),
    ] {
        let (mut want, mut want_jacobian) = (vec![0.0; rows], vec![0.0; rows * hidden]);
        unembed::unembed_logprobs(
            &x,
            host.into(),
            hidden,
            &targets,
            &mut want,
            Some(&mut want_jacobian),
        );
        let mut want_dx = dx_start.clone();
        unembed::unembed_logprobs_backward(&want_jacobian, &g, &mut want_dx);
        let mut jacobian = gpu.zeros(rows * hidden).expect("zeros");
        let got = gpu
            .unembed_logprobs(
                &up(&gpu, &x),
                &matrix,
                hidden,
                &targets,
                Some(&mut jacobian),
            )
            .expect("unembed_logprobs");
        assert_close(
            &format!("{name} unembed logprobs"),
            &down(&gpu, &got),
            &want,
            1e-4,
        );
        assert_close(
            &format!("{name} unembed Jacobian"),
            &down(&gpu, &jacobian),
            &want_jacobian,
            1e-4,
        );
        let mut dx = up(&gpu, &dx_start);
        gpu.unembed_logprobs_backward(&jacobian, &up(&gpu, &g), &mut dx)
            .expect("unembed_logprobs_backward");
        assert_close(
            &format!("{name} unembed dx"),
            &down(&gpu, &dx),
            &want_dx,
            1e-4,
        );
    }
}

#[test]
fn gather_bias_add_argmax_and_fill_do_what_they_say() {
    let Some(gpu) = gpu("gather/bias/add/argmax/fill") else {
        return;
    };
    let (rows, width) = (7, 33);
    let table = values(rows * width, 60);
    let picks = [6usize, 0, 6, 3];
    let indices = gpu.indices(&picks).expect("indices");
    let mut out = gpu.zeros(picks.len() * width).expect("zeros");
    gpu.gather_rows(&up(&gpu, &table), width, &indices, &mut out)
        .expect("gather");
    let want: Vec<f32> = picks
        .iter()
        .flat_map(|&r| table[r * width..(r + 1) * width].to_vec())
        .collect();
    assert_eq!(down(&gpu, &out), want);
    let short = up(&gpu, &table[..6 * width]);
    let error = gpu
        .gather_rows(&short, width, &indices, &mut out)
        .expect_err("row 6 of a table of 6");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);

    let bias = values(width, 61);
    let mut y = up(&gpu, &want);
    gpu.add_bias(&mut y, &up(&gpu, &bias)).expect("bias");
    gpu.add(&mut y, &up(&gpu, &want)).expect("add");
    let expected: Vec<f32> = want
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % width] + v)
        .collect();
    assert_eq!(down(&gpu, &y), expected);

    // Ties go to the first index, as the CPU sampler's greedy pick.
    let mut logits = values(3 * 5000, 62);
    logits[1234] = 9.0;
    logits[5000 + 17] = 9.0;
    logits[5000 + 4000] = 9.0;
    logits[10_000 + 4999] = 9.0;
    let picked = gpu.argmax_rows(&up(&gpu, &logits), 5000).expect("argmax");
    assert_eq!(picked, vec![1234, 17, 4999]);

    let mut first = gpu.zeros(100_000).expect("zeros");
    let mut second = gpu.zeros(100_000).expect("zeros");
    gpu.fill_uniform(&mut first, 7, -0.5, 0.5).expect("fill");
    gpu.fill_uniform(&mut second, 7, -0.5, 0.5).expect("fill");
    let (first, second) = (down(&gpu, &first), down(&gpu, &second));
    assert_eq!(first, second, "the same seed gives the same values");
    assert!(first.iter().all(|v| (-0.5..0.5).contains(v)));
    let mean = first.iter().map(|&v| f64::from(v)).sum::<f64>() / first.len() as f64;
    assert!(mean.abs() < 0.01, "mean {mean}");
}

#[test]
fn paged_attention_matches_the_cpu_and_a_prefill_equals_decode_steps() {
    let Some(gpu) = gpu("paged_attention") else {
        return;
    };
    for window in [None, Some(7)] {
        check_paged_attention(&gpu, window);
    }
}

fn check_paged_attention(gpu: &Gpu, window: Option<usize>) {
    let shape = Heads {
        heads: 6,
        kv_heads: 2,
        head_dim: 64,
        window,
    };
    let block_size = 16;
    let lengths = [37usize, 5, 16];
    // Blocks handed out out of order, as a pool that has served other sequences would.
    let tables: Vec<Vec<usize>> = vec![vec![7, 2, 9], vec![4], vec![0]];
    let mut cache =
        PagedKvCache::new(gpu, 10, shape.kv_heads, shape.head_dim, block_size).expect("cache");
    let (q_row, kv_row) = (
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    let rows: Vec<SequenceRow> = lengths
        .iter()
        .enumerate()
        .flat_map(|(sequence, &n)| (0..n).map(move |position| SequenceRow { sequence, position }))
        .collect();
    let total = rows.len();
    let (q, k, v) = (
        values(total * q_row, 50),
        values(total * kv_row, 51),
        values(total * kv_row, 52),
    );
    let batch = gpu.attention_batch(&cache, &rows, &tables).expect("batch");
    gpu.kv_write(&mut cache, &batch, &up(gpu, &k), &up(gpu, &v))
        .expect("kv_write");
    let mut out = gpu.zeros(total * q_row).expect("zeros");
    gpu.paged_attention(&cache, &batch, &up(gpu, &q), shape, &mut out)
        .expect("attention");
    let got = down(gpu, &out);
    // The CPU kernel per sequence, over per-head caches.
    let mut want = Vec::with_capacity(got.len());
    let mut first = 0;
    for &n in &lengths {
        let per_head = |all: &[f32], h: usize| -> Vec<f32> {
            (first..first + n)
                .flat_map(|r| all[r * kv_row + h * shape.head_dim..][..shape.head_dim].to_vec())
                .collect()
        };
        let keys: Vec<Vec<f32>> = (0..shape.kv_heads).map(|h| per_head(&k, h)).collect();
        let values_: Vec<Vec<f32>> = (0..shape.kv_heads).map(|h| per_head(&v, h)).collect();
        let key_slices: Vec<&[f32]> = keys.iter().map(Vec::as_slice).collect();
        let value_slices: Vec<&[f32]> = values_.iter().map(Vec::as_slice).collect();
        let mut sequence_out = vec![0.0; n * q_row];
        causal_attention(
            &q[first * q_row..(first + n) * q_row],
            &key_slices,
            &value_slices,
            shape,
            0,
            &mut sequence_out,
        );
        want.extend(sequence_out);
        first += n;
    }
    assert_close("paged attention", &got, &want, 1e-4);
    // Each sequence's last row again, alone, as a decode step: bit-identical.
    let mut first = 0;
    for (sequence, &n) in lengths.iter().enumerate() {
        let last = first + n - 1;
        let row = [SequenceRow {
            sequence,
            position: n - 1,
        }];
        let one = gpu.attention_batch(&cache, &row, &tables).expect("batch");
        let mut alone = gpu.zeros(q_row).expect("zeros");
        let q_last = up(gpu, &q[last * q_row..(last + 1) * q_row]);
        gpu.paged_attention(&cache, &one, &q_last, shape, &mut alone)
            .expect("attention");
        assert_eq!(down(gpu, &alone), got[last * q_row..(last + 1) * q_row]);
        first += n;
    }
    // A position past the sequence's blocks is refused when the batch is made.
    let past = [SequenceRow {
        sequence: 1,
        position: 16,
    }];
    let error = gpu
        .attention_batch(&cache, &past, &tables)
        .err()
        .expect("position 16 of one block of 16");
    assert_eq!(error.kind(), GpuErrorKind::InvalidArgument);
}
