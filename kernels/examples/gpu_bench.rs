//! GPU kernel figures (feature `cuda`), printed as docs/gpu.md's tables: the projection at decode
//! and prefill row counts on the Qwen2.5-0.5B and 7B shapes (time and weight bandwidth), and the
//! mixed-adapter LoRA apply of a decode batch spread over 1, 4, 16 and 64 adapters against the
//! base projection alone and a per-adapter loop. Run by `scripts/gpu-check.sh`:
//!
//!     cargo run --release -p opentinker-kernels --features cuda --example gpu_bench [RESULTS.jsonl]
//!
//! With a path, each figure is also written there as a JSON line, which
//! `bench/python/gpu_peer.py` reads to time PyTorch on the same shapes and print the ratios.

use std::io::Write;

#[path = "../tests/common/mod.rs"]
mod common;
use common::values;

use cudarc::driver::sys::CUevent_flags;
use opentinker_kernels::cuda::{AdapterRef, DeviceSegment, Gpu, GpuError, LoraPool, LoraSite};

/// Launches per timed run; the mean of the fastest of `RUNS` runs is reported.
const LAUNCHES: usize = 50;
const RUNS: usize = 5;

/// Microseconds per call of `f`, timed with events on the GPU's stream.
fn time_us(gpu: &Gpu, mut f: impl FnMut() -> Result<(), GpuError>) -> Result<f64, GpuError> {
    for _ in 0..3 {
        f()?;
    }
    let stream = gpu.stream();
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|source| GpuError::Driver {
                doing: "recording an event",
                source,
            })
    };
    let mut best = f64::INFINITY;
    for _ in 0..RUNS {
        let start = event()?;
        for _ in 0..LAUNCHES {
            f()?;
        }
        let end = event()?;
        gpu.synchronize()?;
        let ms = start.elapsed_ms(&end).map_err(|source| GpuError::Driver {
            doing: "reading an event",
            source,
        })?;
        best = best.min(f64::from(ms) * 1000.0 / LAUNCHES as f64);
    }
    Ok(best)
}

/// The JSON lines of the figures, when a path was given.
struct Results(Option<std::fs::File>);

impl Results {
    fn record(&mut self, line: String) {
        if let Some(file) = &mut self.0
            && let Err(error) = writeln!(file, "{line}")
        {
            eprintln!("cannot write the results: {error}");
            self.0 = None;
        }
    }
}

fn main() {
    if let Err(error) = run() {
        eprintln!("gpu_bench: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut results = Results(match std::env::args_os().nth(1) {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    });
    let gpu = Gpu::new(0)?;
    println!(
        "device: {} (compute {:?})",
        gpu.name(),
        gpu.compute_capability()
    );

    println!("\nprojection y = x W^T (f32): microseconds per call, weight bytes / time");
    println!("| shape | in -> out | rows | us | GB/s |");
    println!("|---|---|---:|---:|---:|");
    for (shape, inp, out) in [
        ("0.5B", 896, 4864),
        ("0.5B", 4864, 896),
        ("7B", 3584, 18944),
        ("7B", 18944, 3584),
    ] {
        let w = gpu.upload(&values(inp * out, 1))?;
        for rows in [1, 16, 64, 512] {
            let x = gpu.upload(&values(rows * inp, 2))?;
            let mut y = gpu.zeros(rows * out)?;
            let us = time_us(&gpu, || gpu.linear(&x, &w, None, None, inp, &mut y, false))?;
            let gbps = (inp * out * 4) as f64 / us / 1e3;
            println!("| {shape} | {inp} -> {out} | {rows} | {us:.1} | {gbps:.0} |");
            results.record(format!(
                r#"{{"kind":"linear","shape":"{shape}","inp":{inp},"out":{out},"rows":{rows},"us":{us:.3}}}"#
            ));
        }
    }

    println!(
        "
projection with bf16 weights (computed in f32): microseconds per call, weight bytes / time"
    );
    println!("| shape | in -> out | rows | us | GB/s |");
    println!("|---|---|---:|---:|---:|");
    for (shape, inp, out) in [("7B", 3584, 18944), ("7B", 18944, 3584)] {
        let w = gpu.to_bf16(&gpu.upload(&values(inp * out, 1))?)?;
        for rows in [1, 16, 64] {
            let x = gpu.upload(&values(rows * inp, 2))?;
            let mut y = gpu.zeros(rows * out)?;
            let us = time_us(&gpu, || {
                gpu.linear_bf16(&x, &w, None, None, inp, &mut y, false)
            })?;
            let gbps = (inp * out * 2) as f64 / us / 1e3;
            println!("| {shape} | {inp} -> {out} | {rows} | {us:.1} | {gbps:.0} |");
        }
    }

    println!(
        "\nmixed-adapter LoRA (rank 16) on a decode batch: projection + LoRA (one shrink launch, the projection expanding as it stores) vs the projection alone"
    );
    println!(
        "| shape | in -> out | rows | adapters | base us | fused us | fused / base | per-adapter loop us | loop / base |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let rank = 16;
    for (shape, inp, out) in [("0.5B", 896, 896), ("0.5B", 896, 4864), ("7B", 3584, 3584)] {
        let w = gpu.upload(&values(inp * out, 3))?;
        let mut pool = LoraPool::new(&gpu, 64, inp, out, rank)?;
        for slot in 0..64 {
            let (a, b) = (
                values(rank * inp, 10 + slot as u64),
                values(out * rank, 100 + slot as u64),
            );
            pool.write(&gpu, slot, &a, &b, rank)?;
        }
        for rows in [16, 64] {
            let x = gpu.upload(&values(rows * inp, 4))?;
            let mut y = gpu.zeros(rows * out)?;
            let base = time_us(&gpu, || gpu.linear(&x, &w, None, None, inp, &mut y, false))?;
            for adapters in [1usize, 4, 16, 64].into_iter().filter(|&a| a <= rows) {
                // The sampler sorts rows by adapter: `adapters` runs of equal length.
                let per = rows / adapters;
                let adapter = |slot: usize| AdapterRef {
                    slot,
                    rank,
                    scale: 2.0,
                };
                let segments: Vec<DeviceSegment> = (0..adapters)
                    .map(|slot| DeviceSegment {
                        rows: per,
                        adapter: Some(adapter(slot)),
                    })
                    .collect();
                let mut batch = gpu.lora_batch(&segments)?;
                let fused = time_us(&gpu, || {
                    let site = LoraSite {
                        pool: &pool,
                        batch: &mut batch,
                    };
                    gpu.linear(&x, &w, None, Some(site), inp, &mut y, false)
                })?;
                // A per-adapter loop: one apply per adapter, each over the whole batch with only
                // that adapter's rows adapted (how a one-adapter-at-a-time engine serves it).
                let mut loops: Vec<_> = (0..adapters)
                    .map(|slot| {
                        let segments: Vec<DeviceSegment> = (0..adapters)
                            .map(|s| DeviceSegment {
                                rows: per,
                                adapter: (s == slot).then(|| adapter(slot)),
                            })
                            .collect();
                        gpu.lora_batch(&segments)
                    })
                    .collect::<Result<_, _>>()?;
                let looped = time_us(&gpu, || {
                    gpu.linear(&x, &w, None, None, inp, &mut y, false)?;
                    for batch in &mut loops {
                        gpu.lora_apply(&x, &mut y, &pool, batch)?;
                    }
                    Ok(())
                })?;
                println!(
                    "| {shape} | {inp} -> {out} | {rows} | {adapters} | {base:.1} | {fused:.1} | {:.2} | {looped:.1} | {:.2} |",
                    fused / base,
                    looped / base
                );
                results.record(format!(
                    r#"{{"kind":"lora","shape":"{shape}","inp":{inp},"out":{out},"rows":{rows},"rank":{rank},"adapters":{adapters},"base_us":{base:.3},"fused_us":{fused:.3},"loop_us":{looped:.3}}}"#
                ));
            }
        }
    }
    Ok(())
}
