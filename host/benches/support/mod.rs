//! What the benchmarks share: the quick mode `scripts/bench.sh --quick` runs in the test script
//! (tiny shapes, one iteration, no peers: it checks a benchmark still builds and runs; its
//! figures mean nothing), and the refusal to report a ratio measured on a busy machine.
#![allow(dead_code)] // each benchmark uses what it needs of this module

/// Whether the run is the quick one.
pub fn quick() -> bool {
    std::env::var_os("OPENTINKER_BENCH_QUICK").is_some()
}

/// Why ratios are not reported: the machine was busy when the run started
/// (`scripts/bench.sh` measures the load and says so here).
pub fn busy() -> Option<String> {
    std::env::var("OPENTINKER_BENCH_BUSY")
        .ok()
        .filter(|why| !why.is_empty())
}

/// The peak resident set of this process so far, in bytes (`VmHWM`).
pub fn peak_rss() -> anyhow::Result<u64> {
    process_status_bytes("VmHWM")
}

/// The resident set of this process now, in bytes (`VmRSS`).
pub fn rss() -> anyhow::Result<u64> {
    process_status_bytes("VmRSS")
}

/// A size line of `/proc/self/status`, in bytes.
fn process_status_bytes(field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/self/status"))?;
    Ok(kib * 1024)
}

/// Run this benchmark binary again as a child with `args` (its own process, so that one
/// measurement's memory does not hide another's) and read the numbers it prints.
pub fn child_numbers(args: &[std::ffi::OsString]) -> anyhow::Result<Vec<f64>> {
    let output = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "the child run {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)?;
    text.split_whitespace()
        .map(|n| {
            n.parse()
                .map_err(|e| anyhow::anyhow!("child output {text:?}: {e}"))
        })
        .collect()
}

/// `ours / theirs` to print (`2.31x`), or why it is withheld.
pub fn ratio(ours: f64, theirs: f64) -> String {
    match busy() {
        Some(why) => format!("ratio not reported: {why}"),
        None => format!("{:.2}x", ours / theirs),
    }
}

/// `batch` training sequences of `length` tokens of a model of `vocab` tokens, every target
/// counted: the same tokens in every benchmark, so that their figures compare.
pub fn datums(batch: usize, length: usize, vocab: u32) -> Vec<opentinker::train::Datum> {
    group_datums(batch, 1, 0, length, vocab)
}

/// `groups` RL groups of `group` datums of `length` tokens: a prompt of `prompt` tokens that the
/// group's datums share (not trained on: mask 0), then a reply of each datum's own.
pub fn group_datums(
    groups: usize,
    group: usize,
    prompt: usize,
    length: usize,
    vocab: u32,
) -> Vec<opentinker::train::Datum> {
    (0..groups * group)
        .map(|row| {
            let first_of_group = row - row % group;
            let tokens: Vec<u32> = (0..=length as u32)
                .map(|i| {
                    let seed = if (i as usize) < prompt {
                        first_of_group
                    } else {
                        row
                    };
                    (i * 7919 + seed as u32 * 104_729) % vocab
                })
                .collect();
            opentinker::train::Datum {
                input_tokens: tokens[..length].to_vec(),
                target_tokens: tokens[1..].to_vec(),
                mask: (0..length)
                    .map(|i| if i + 1 < prompt { 0.0 } else { 1.0 })
                    .collect(),
                ..Default::default()
            }
        })
        .collect()
}

/// The benchmarks' adapter: rank 16, alpha 32, on every attention and MLP projection.
pub fn bench_lora() -> opentinker::lora::LoraConfig {
    opentinker::lora::LoraConfig {
        rank: 16,
        alpha: 32.0,
        ..Default::default()
    }
}

/// Tokens per second of `steps` steps (`forward_backward` of `item`, then `optim_step` of its
/// adapter), after one untimed step.
pub fn steps_tokens_per_s(
    engine: &mut opentinker::train::TrainingEngine,
    item: &opentinker::train::WorkItem,
    steps: usize,
) -> anyhow::Result<f64> {
    let tokens: usize = item.datums.iter().map(|d| d.input_tokens.len()).sum();
    let mut step = || -> anyhow::Result<()> {
        engine.forward_backward(std::slice::from_ref(item))?;
        engine.optim_step(&item.adapter, &opentinker::train::AdamParams::default())?;
        Ok(())
    };
    step()?;
    let started = std::time::Instant::now();
    for _ in 0..steps {
        step()?;
    }
    Ok(tokens as f64 * steps as f64 / started.elapsed().as_secs_f64())
}
