//! In-process side of the service overhead benchmark (`scripts/bench-service.sh`): the time of
//! one `forward_backward` + `optim_step` of the tiny model through `sched::Service`, the ops the
//! server runs for the SDK, without HTTP, futures or the journal. Prints the median milliseconds
//! per step.
//!
//!     cargo run --release --example service_overhead -- DATA_DIR STEPS

use std::collections::BTreeMap;
use std::time::Instant;

use opentinker::api::{
    AdamParams, Datum, ForwardBackwardInput, LoraConfig, ModelId, ModelInput, Op, OpOutput,
    TenantId, TensorData,
};

use opentinker::service::{
    DeviceOptions, FairShare, ServedBase, Service, ServiceConfig, TINY_MODEL_NAME, tiny_model_dir,
};

/// `op` as the server runs it: checked when accepted, then run with what the check built.
async fn run_op(
    service: &Service,
    tenant: &TenantId,
    op: Op,
    seq: Option<u64>,
) -> anyhow::Result<OpOutput> {
    let checked = service.validate(tenant, &op)?;
    Ok(service.execute(tenant, op, seq, checked).await.outcome?)
}

/// The benchmark's batch: 8 datums of 128 tokens (the Python side builds the same).
fn batch() -> Vec<Datum> {
    (0..8u32)
        .map(|i| {
            let tokens: Vec<u32> = (0..129).map(|j| (7 * i + 3 * j) % 500 + 3).collect();
            Datum {
                model_input: ModelInput::from_tokens(tokens[..128].to_vec()),
                loss_fn_inputs: BTreeMap::from([
                    (
                        "target_tokens".to_string(),
                        TensorData::i64(tokens[1..].iter().map(|&t| t as i64).collect()),
                    ),
                    ("weights".to_string(), TensorData::f32(vec![1.0; 128])),
                ]),
                loss_fn_input_spans: None,
            }
        })
        .collect()
}

/// The server binary's allocator, so that the two sides differ only by what the service adds.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // SAFETY: the first thing `main` does; no other thread exists yet (the runtime's start after).
    unsafe { opentinker::compute_threads::fix_compute_threads() };
    opentinker::allocator::configure_memory();
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let data =
        std::path::PathBuf::from(args.next().unwrap_or_else(|| "target/bench-service".into()));
    let steps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let share = FairShare {
        pass_tokens: 16_384,
        quantum: 128,
        cycle: None,
        solo_pass_tokens: None,
        anticipate: None,
    };
    let base = ServedBase::load(
        TINY_MODEL_NAME,
        &tiny_model_dir(&data)?,
        65_536,
        share,
        DeviceOptions::cpu(),
    )?;
    let service = Service::new(vec![base], ServiceConfig::new(data));
    let tenant = TenantId::new("bench")?;
    let run = |op, seq| run_op(&service, &tenant, op, seq);
    let OpOutput::Session(session) = run(Op::CreateSession, None).await? else {
        anyhow::bail!("no session");
    };
    let lora = LoraConfig {
        rank: 8,
        seed: None,
        train_unembed: true,
        train_mlp: true,
        train_attn: true,
        alpha: None,
        rslora: false,
    };
    let create = Op::CreateModel {
        session,
        model_seq: 0,
        base_model: TINY_MODEL_NAME.into(),
        lora,
        user_metadata: Default::default(),
    };
    let OpOutput::Model(model) = run(create, None).await? else {
        anyhow::bail!("no model");
    };
    let step = |model: ModelId, seq: u64| {
        let forward_backward = Op::ForwardBackward {
            model: model.clone(),
            input: ForwardBackwardInput {
                data: batch(),
                loss_fn: "cross_entropy".into(),
                loss_fn_config: BTreeMap::new(),
                custom_loss: None,
                temperature: 1.0,
            },
            forward_only: false,
        };
        let optim = Op::OptimStep {
            model,
            params: AdamParams::default(),
        };
        async move {
            run(forward_backward, Some(seq)).await?;
            run(optim, Some(seq + 1)).await?;
            anyhow::Ok(())
        }
    };
    let mut seq = 1;
    for _ in 0..3 {
        step(model.clone(), seq).await?;
        seq += 2;
    }
    // The median step: one noisy moment of a shared machine does not move it.
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let started = Instant::now();
        step(model.clone(), seq).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        seq += 2;
    }
    times.sort_by(f64::total_cmp);
    let ms = times.get(times.len() / 2).copied().unwrap_or(0.0);
    println!("{{\"in_process_ms_per_step\": {ms:.2}}}");
    Ok(())
}
