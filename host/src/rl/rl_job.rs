//! RL for one job on its shared base (sync mode): sample a batch of groups with the current
//! policy versions, score them, turn them into datums with group advantages, train one step,
//! publish the next versions; evaluate and checkpoint as the job says.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::DType;

use super::advantage::{Estimator, GroupReturns, advantages};
use super::context::{
    JobContext, Progress, Reporter, evaluate, rollout, sampling_params, train_step,
};
use super::datum::rl_datum;
use super::driver::{JobStart, SharedBase};
use super::job::Job;
use super::metrics::{StepMetrics, Summary, errors_of, mean, metrics_of, std};
use super::rollout::{Actor, EpisodeOutcome, RolloutRecord};
use super::run_folder::Cursor;
use super::sft::run_sft;
use super::transcript::TokenSequence;
use crate::lora::PolicyVersion;
use crate::plugin::{Plugin, PluginHost};
use crate::sample::PolicyRef;
use crate::train::{Datum, Loss, TrainingEngine};

/// The adapter a single-policy job trains.
const POLICY: &str = "policy";

/// RL for one job on its shared base: sample a batch of groups with the current policy
/// version, score, build datums, train one step, publish the next version; evaluate and
/// checkpoint as the job says.
pub(super) async fn train_job(
    host: &PluginHost,
    base: &SharedBase,
    start: JobStart,
    progress: Progress,
) -> anyhow::Result<Summary> {
    let JobStart {
        run,
        folder,
        log,
        checkpoint,
        mut sft_evals,
        ..
    } = start;
    let job = &run.job;
    let cx = JobContext::load(
        host,
        job,
        Arc::clone(&base.info),
        Some(base.sampler.clone()),
    )
    .await?;
    let mut reporter = Reporter {
        name: run.name.clone(),
        logs: vec![log],
        progress,
    };
    let mut trainer = TrainingEngine::new(Arc::clone(base.registry.base()), DType::F32);
    match &checkpoint {
        Some((dir, _)) => trainer.load_adapter(POLICY, &dir.join(POLICY), true)?,
        None => {
            trainer.add_adapter(POLICY, job.lora.clone())?;
            if let Some(sft) = job.sft.as_ref().filter(|w| !w.full_parameters) {
                sft_evals = run_sft(&cx, job, sft, &mut trainer, POLICY, &mut reporter).await?;
            }
        }
    }
    if job.rl.steps == 0 {
        // An SFT job: its result is the adapter (or, after a full-parameter SFT, the base).
        let checkpoint = match job.sft.as_ref().is_some_and(|s| s.full_parameters) {
            true => PathBuf::from(&base.name),
            false => {
                let dir = folder.checkpoint_dir("final");
                trainer.save_adapter(POLICY, &dir, &base.name, true)?;
                dir
            }
        };
        let (initial_eval, final_eval) = sft_evals.unwrap_or_default();
        return Ok(Summary {
            steps: job.sft.as_ref().map_or(0, |s| s.steps),
            initial_eval,
            final_eval,
            checkpoint,
            out: folder.root().to_path_buf(),
        });
    }
    let loss = Loss::from_config(&job.rl.loss, &job.rl.loss_config)?;
    let estimator = job.rl.estimator().map_err(anyhow::Error::msg)?;
    // Each job publishes its policy under its own name in the shared registry.
    let publish = |trainer: &TrainingEngine| -> anyhow::Result<Arc<PolicyVersion>> {
        let adapter = trainer.adapter(POLICY).context("the policy adapter")?;
        Ok(base.registry.publish(&run.name, adapter)?)
    };
    let mut version = publish(&trainer)?;

    let (first_step, initial_eval, mut last_eval) = match checkpoint {
        Some((_, cursor)) => (cursor.steps, cursor.initial_eval, cursor.last_eval),
        None => {
            let eval = evaluate(&cx, job, &version).await?;
            (0, eval.clone(), eval)
        }
    };
    for step in first_step..job.rl.steps {
        let started = Instant::now();
        let played = play_step(&cx, job, step, &version).await?;
        let (datums, records, groups_trained) = datums_of(&played, job, estimator);
        let (loss_value, tokens) = train_step(
            &mut trainer,
            POLICY,
            datums,
            loss.clone(),
            job.rl.learning_rate,
        )?;
        version = publish(&trainer)?;
        folder.write_rollouts(step, &records)?;
        let last = step + 1 == job.rl.steps;
        let eval = if last || (job.eval.every > 0 && (step + 1) % job.eval.every == 0) {
            last_eval = evaluate(&cx, job, &version).await?;
            Some(last_eval.clone())
        } else {
            None
        };
        let all: Vec<&EpisodeOutcome> = played.iter().map(|(_, _, o)| o).collect();
        let rewards: Vec<f64> = all
            .iter()
            .map(|o| o.returns().first().copied().unwrap_or(0.0))
            .collect();
        reporter.line(&StepMetrics {
            step,
            phase: "rl",
            reward_mean: mean(rewards.iter().copied()),
            reward_std: std(&rewards),
            episode_steps: mean(all.iter().map(|o| o.steps as f64)),
            tokens,
            loss: loss_value,
            groups_trained,
            errors: errors_of(&all),
            env_metrics: metrics_of(&all),
            eval,
            seconds: started.elapsed().as_secs_f64(),
        })?;
        let every = job.checkpoint.every;
        if last || (every > 0 && (step + 1) % every == 0) {
            let cursor = Cursor {
                steps: step + 1,
                metric_lines: reporter.lines(),
                initial_eval: initial_eval.clone(),
                last_eval: last_eval.clone(),
            };
            folder.save_checkpoint(&cursor, |temp| {
                Ok(trainer.save_adapter(POLICY, &temp.join(POLICY), &base.name, true)?)
            })?;
        }
    }
    let checkpoint = folder.checkpoint_dir("final");
    trainer.save_adapter(POLICY, &checkpoint, &base.name, true)?;
    Ok(Summary {
        steps: job.rl.steps,
        initial_eval,
        final_eval: last_eval,
        checkpoint,
        out: folder.root().to_path_buf(),
    })
}

/// Play RL step `step`'s groups with `version`: group g plays one task (seeded by the job's seed,
/// the step and g) `group_size` times. Returns (group, index in group, outcome) in that order.
async fn play_step(
    cx: &JobContext,
    job: &Job,
    step: usize,
    version: &PolicyVersion,
) -> anyhow::Result<Vec<(usize, usize, EpisodeOutcome)>> {
    let policy = Actor::Policy(Some(PolicyRef {
        name: version.name.clone(),
        version: Some(version.version),
    }));
    let (groups, size) = (job.rl.groups_per_batch, job.rl.group_size);
    let task_seeds: Vec<u64> = (0..groups as u64)
        .map(|g| job.rl.seed.wrapping_mul(1_000_003) + (step * groups) as u64 + g)
        .collect();
    let mut tasks = Vec::with_capacity(groups);
    for &seed in &task_seeds {
        tasks.push(
            cx.environment()?
                .generate_task(&cx.config, seed, &cx.limits)
                .await?,
        );
    }
    let rollout = rollout(cx, job, sampling_params(job))?;
    let actors = [policy];
    let episodes = tasks.iter().enumerate().flat_map(|(g, task)| {
        let seed = task_seeds[g];
        (0..size).map(move |i| (g, i, task, seed * 1000 + i as u64))
    });
    let mut played: Vec<(usize, usize, EpisodeOutcome)> =
        futures::future::join_all(episodes.map(|(g, i, task, seed)| {
            let (rollout, actors) = (&rollout, &actors);
            async move { (g, i, rollout.play(task, seed, actors).await) }
        }))
        .await;
    if let (Some(reward), Some(section)) = (&cx.reward, &job.reward)
        && section.group
    {
        for (g, task) in tasks.iter().enumerate() {
            score_group(
                cx,
                reward,
                section.weight,
                job.rl.failure_reward,
                task,
                g,
                &mut played,
            )
            .await;
        }
    }
    Ok(played)
}

/// Let the reward plugin's group scorer replace the scores of group `g`'s whole episodes; when
/// it fails, those episodes fail with its error kind.
async fn score_group(
    cx: &JobContext,
    reward: &Plugin,
    weight: f64,
    failure_reward: f64,
    task: &str,
    g: usize,
    played: &mut [(usize, usize, EpisodeOutcome)],
) {
    let mut members: Vec<&mut EpisodeOutcome> = played
        .iter_mut()
        .filter(|(group, _, o)| *group == g && o.error.is_none())
        .map(|(_, _, o)| o)
        .collect();
    let transcripts: Vec<_> = members.iter().map(|o| o.plugin_transcripts()).collect();
    match reward.score_group(task, &transcripts, &cx.limits).await {
        Ok(Some(scores)) => {
            for (outcome, scores) in members.iter_mut().zip(scores) {
                outcome.replace_scores(scores.iter().map(|s| s * weight).collect());
            }
        }
        Ok(None) => {}
        Err(error) => {
            for outcome in members {
                outcome.fail(error.kind.as_str().to_string(), failure_reward);
            }
        }
    }
}

/// Group advantages and the datums of the played episodes (in group and index order), with the
/// records of the rollout file, and the number of groups that were not skipped.
fn datums_of(
    played: &[(usize, usize, EpisodeOutcome)],
    job: &Job,
    estimator: Estimator,
) -> (Vec<Datum>, Vec<RolloutRecord>, usize) {
    let mut datums = Vec::new();
    let mut records = Vec::new();
    let mut groups_trained = 0;
    for g in 0..job.rl.groups_per_batch {
        let group: Vec<&(usize, usize, EpisodeOutcome)> =
            played.iter().filter(|(i, _, _)| *i == g).collect();
        let returns = GroupReturns {
            turn_rewards: group
                .iter()
                .map(|(_, _, o)| o.turn_rewards.first().cloned().unwrap_or_default())
                .collect(),
        };
        let advantage = advantages(&returns, estimator, job.rl.skip_equal_groups);
        groups_trained += usize::from(advantage.is_some());
        for (n, (group, index, outcome)) in group.iter().enumerate() {
            let per_turn: &[f64] = advantage.as_ref().map_or(&[], |a| &a[n]);
            let turn_advantage = |turn: usize| per_turn.get(turn).copied().unwrap_or(0.0) as f32;
            let sequences: Vec<TokenSequence> = match outcome.transcripts.first() {
                Some(Some(transcript)) => transcript.clone().into_sequences(),
                _ => Vec::new(),
            };
            if advantage.is_some() {
                for sequence in &sequences {
                    datums.extend(rl_datum(sequence, turn_advantage));
                }
            }
            records.push(RolloutRecord::new(
                *group,
                *index,
                outcome,
                &[(0, sequences)],
                turn_advantage,
            ));
        }
    }
    (datums, records, groups_trained)
}
