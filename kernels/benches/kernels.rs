//! Throughput of the kernels (f32; run with `RAYON_NUM_THREADS=2`):
//!
//!     RAYON_NUM_THREADS=2 cargo bench -p opentinker-kernels --bench kernels

use std::time::Instant;

use opentinker_kernels::{LoraPair, Segment, linear, lora_apply};

fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let started = Instant::now();
        f();
        best = best.min(started.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    // `scripts/bench.sh --quick` (the test script): one timing of each, to check the benchmark
    // runs; its figures mean nothing.
    let runs = match std::env::var_os("OPENTINKER_BENCH_QUICK") {
        Some(_) => 1,
        None => 20,
    };
    println!("linear: out (m x n) = x (m x k) W^T");
    for (m, k, n) in [
        (1, 896, 4864),
        (1, 4864, 896),
        (16, 128, 512),
        (64, 896, 896),
        (256, 896, 4864),
        (1, 896, 151_936),
        (16, 896, 151_936),
    ] {
        let x = vec![0.5f32; m * k];
        let w = vec![0.25f32; n * k];
        let mut out = vec![0.0f32; m * n];
        let seconds = best_of(runs, || linear(&x, &w, k, &mut out, false));
        let flops = 2.0 * (m * k * n) as f64;
        let bytes = (n * k * 4) as f64;
        println!(
            "  m {m:>4} k {k:>5} n {n:>5}: {:>9.1} us  {:>6.1} GFLOP/s  {:>6.1} GB/s of W",
            seconds * 1e6,
            flops / seconds / 1e9,
            bytes / seconds / 1e9
        );
    }
    println!("lora_apply: 64 rows, in 896, out 4864, rank 16");
    for distinct in [1usize, 4, 16, 64] {
        let (inp, out, rank) = (896, 4864, 16);
        let a: Vec<Vec<f32>> = (0..distinct).map(|_| vec![0.01; rank * inp]).collect();
        let b: Vec<Vec<f32>> = (0..distinct).map(|_| vec![0.01; out * rank]).collect();
        let segments: Vec<Segment> = (0..distinct)
            .map(|i| Segment {
                rows: 64 / distinct,
                pair: Some(LoraPair {
                    a: &a[i],
                    b: &b[i],
                    rank,
                    scale: 2.0,
                }),
            })
            .collect();
        let x = vec![0.5f32; 64 * inp];
        let mut y = vec![0.0f32; 64 * out];
        let seconds = best_of(runs, || lora_apply(&x, inp, &mut y, out, &segments));
        println!("  {distinct:>2} adapters: {:>9.1} us", seconds * 1e6);
    }
}
