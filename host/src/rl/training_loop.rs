//! RL for one job on its shared base (sync mode): sample a batch of groups with the current
//! policy versions, score them, turn them into datums with group advantages, train one step (all
//! the job's adapters in one fused pass), publish the next versions; evaluate and checkpoint as
//! the job says. In a multi-agent job each player acts with its policy's adapter, and its tokens
//! train only that adapter, with that player's return.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::advantage::{Estimator, GroupReturns, StepAdvantages, advantages, fold_kl};
use super::context::{JobContext, JobRun, JobStart, Progress, Reporter, SharedBase, evaluate};
use super::datum::rl_datum;
use super::diagnosis::{RunSignals, greedy_agreement, signal_of};
use super::job::{Job, PolicySection, RlLoss};
use super::metrics::{
    Evaluation, Phase, PolicyEvaluations, StepMetrics, Summary, Warmup, error_messages_of,
    errors_of, mean, metrics_of, std,
};
use super::rollout::{Actor, EpisodeOutcome, RolloutRecord};
use super::rollouts::{
    GroupStream, InProcess, JobTasks, Launch, PlayedGroup, PolicyRef, QueueRollouts, Rollouts,
    Samplers, Seat,
};
use super::run_folder::{Cursor, RunFolder};
use super::sft::run_sft;
use super::train_step::{
    LossFn, PolicyBatch, StepOutcome, forward_cross_entropy, rl_adam, train_step,
};
use crate::api::LossInput::{Advantages, Logprobs, Mask};
use crate::api::{Datum, UNIT_TEMPERATURE};
use crate::client::{SamplingClient, ServiceClient, TrainingClient};

/// The training client of each trainable policy of a job, by policy name.
type Trainers = BTreeMap<String, Arc<dyn TrainingClient>>;

/// The RL steps over which a job's failure rate is measured.
const FAILURE_WINDOW: usize = 3;

/// Whether a job's episodes fail too often to go on: every episode of a step failed, or more
/// than `rl.max_failure_rate` of those of its last [`FAILURE_WINDOW`] steps (a plugin that fails
/// every time, or most times, must not spin through a whole run training on nothing).
struct FailureWatch {
    max_rate: f64,
    /// (failed, played) of the latest steps.
    recent: std::collections::VecDeque<(usize, usize)>,
}

impl FailureWatch {
    fn new(max_rate: f64) -> Self {
        FailureWatch {
            max_rate,
            recent: std::collections::VecDeque::new(),
        }
    }

    /// Count a step's episodes; why the job must stop, if it must.
    fn record(&mut self, outcomes: &[&EpisodeOutcome]) -> Option<String> {
        let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
        self.recent.push_back((failed, outcomes.len()));
        if self.recent.len() > FAILURE_WINDOW {
            self.recent.pop_front();
        }
        if self.max_rate >= 1.0 {
            return None;
        }
        if failed > 0 && failed == outcomes.len() {
            return Some(format!("every episode of the step failed ({failed})"));
        }
        let (failed, played) = self
            .recent
            .iter()
            .fold((0, 0), |(f, p), (failed, played)| (f + failed, p + played));
        (played > 0 && failed as f64 > self.max_rate * played as f64).then(|| {
            format!(
                "{failed} of the {played} episodes of the last {} steps failed, more than                  rl.max_failure_rate = {}",
                self.recent.len(),
                self.max_rate
            )
        })
    }
}

/// The current version of each trainable policy of a job.
pub(super) struct Versions {
    pub(super) policies: Vec<PolicySection>,
    /// What a frozen policy plays: the base model.
    pub(super) base: Arc<dyn SamplingClient>,
    pub(super) versions: BTreeMap<String, Arc<dyn SamplingClient>>,
    /// Where the job's rollouts find the versions its tasks name.
    pub(super) samplers: Samplers,
    /// Where another process samples each version (`None`: in this process only).
    pub(super) addresses: BTreeMap<PolicyRef, Option<String>>,
}

impl Versions {
    /// The base model's and no policy's versions yet, for `policies`.
    pub(super) fn new(policies: Vec<PolicySection>, base: Arc<dyn SamplingClient>) -> Self {
        let samplers = Samplers::default();
        samplers.publish(PolicyRef::Base, Arc::clone(&base));
        Versions {
            policies,
            base,
            versions: BTreeMap::new(),
            samplers,
            addresses: BTreeMap::new(),
        }
    }

    /// Take each trainable policy's adapter as it is now as its version after `trained`
    /// training steps.
    async fn publish(&mut self, trainers: &Trainers, trained: usize) -> anyhow::Result<()> {
        if !self.addresses.contains_key(&PolicyRef::Base) {
            let address = self.base.address().await?;
            self.addresses.insert(PolicyRef::Base, address);
        }
        for (name, trainer) in trainers {
            let version = trainer.save_weights_and_get_sampling_client().await?;
            let policy = PolicyRef::Adapter {
                policy: name.clone(),
                version: trained,
            };
            self.addresses
                .retain(|p, _| !matches!(p, PolicyRef::Adapter { policy, .. } if policy == name));
            self.addresses
                .insert(policy.clone(), version.address().await?);
            self.samplers.publish(policy, Arc::clone(&version));
            self.versions.insert(name.clone(), version);
        }
        Ok(())
    }

    /// What a group launched now plays with, after `trained` training steps (the versions
    /// published last).
    fn launch(&self, trained: usize) -> Launch {
        let seats = self.seat_policies().map(|policy| {
            let policy = match policy {
                Some(p) if self.versions.contains_key(&p.name) => PolicyRef::Adapter {
                    policy: p.name.clone(),
                    version: trained,
                },
                _ => PolicyRef::Base,
            };
            let sampler = self.addresses.get(&policy).cloned().flatten();
            Seat { policy, sampler }
        });
        Launch {
            seats: seats.collect(),
            version: trained,
        }
    }

    /// The actor of `policy`: its current version, or the base model when it is frozen.
    fn actor(&self, policy: &PolicySection) -> Actor {
        let version = self.versions.get(&policy.name).unwrap_or(&self.base);
        Actor::Policy(Arc::clone(version))
    }

    /// The policy of each seat, `None` for a seat no policy controls (the base model plays
    /// it).
    fn seat_policies(&self) -> impl Iterator<Item = Option<&PolicySection>> {
        let seats = self
            .policies
            .iter()
            .flat_map(|p| p.players.iter().map(|s| s + 1))
            .max()
            .unwrap_or(1);
        (0..seats).map(|seat| self.policies.iter().find(|p| p.controls(seat)))
    }

    /// The actor of each player (the last serves any player beyond).
    pub(super) fn actors(&self) -> Vec<Actor> {
        self.seat_policies()
            .map(|policy| {
                policy.map_or_else(|| Actor::Policy(Arc::clone(&self.base)), |p| self.actor(p))
            })
            .collect()
    }

    /// What `policy`'s evaluation plays: its own evaluation config with it as player 0, or the
    /// job's environment with every policy in its seat; (config, actors, the player scored).
    pub(super) fn evaluation_of(
        &self,
        cx: &JobContext,
        policy: &PolicySection,
    ) -> (String, Vec<Actor>, usize) {
        match policy.eval_config_json() {
            Some(config) => (config, vec![self.actor(policy)], 0),
            None => {
                let seat = policy.players.first().copied().unwrap_or(0);
                (cx.config.clone(), self.actors(), seat)
            }
        }
    }

    /// Evaluate each trainable policy, greedy, as [`Versions::evaluation_of`] says.
    async fn evaluate(
        &self,
        cx: &JobContext,
        job: &Job,
    ) -> anyhow::Result<BTreeMap<String, Evaluation>> {
        let mut evaluations = BTreeMap::new();
        for policy in self.policies.iter().filter(|p| p.trainable) {
            let (config, actors, player) = self.evaluation_of(cx, policy);
            let evaluation = evaluate(cx, job, &config, &actors, player).await?;
            evaluations.insert(policy.name.clone(), evaluation);
        }
        Ok(evaluations)
    }
}

/// The evaluation that stands for the job: its first trainable policy's.
fn headline(evaluations: &BTreeMap<String, Evaluation>, policies: &[PolicySection]) -> Evaluation {
    policies
        .iter()
        .find(|p| p.trainable)
        .and_then(|p| evaluations.get(&p.name))
        .cloned()
        .unwrap_or_default()
}

/// RL for one job on its shared base: sample a batch of groups with the current policy
/// versions, score, build datums, train one step, publish the next versions; evaluate and
/// checkpoint as the job says.
pub(super) async fn train_job(
    base: &SharedBase,
    start: JobStart,
    progress: Progress,
) -> anyhow::Result<Summary> {
    let JobStart {
        run,
        folder,
        log,
        checkpoint,
        mut warmup,
        plugins,
        ..
    } = start;
    let job = &run.job;
    let cx = Arc::new(JobContext::new(plugins, job, Arc::clone(&base.info)));
    let service = base.service.as_ref();
    let mut reporter = Reporter {
        name: run.name.clone(),
        logs: vec![log],
        progress,
    };
    let policies = job.policies();
    let trainable: Vec<&PolicySection> = policies.iter().filter(|p| p.trainable).collect();
    let resume_from = checkpoint.as_ref().map(|(dir, _)| dir.as_path());
    let trainers = open_trainers(service, &run.name, job, &trainable, resume_from).await?;
    let mut untrained_eval = None;
    if checkpoint.is_none()
        && let Some((untrained, done)) =
            warm_up_lora(&cx, job, service, &trainers, &trainable, &mut reporter).await?
    {
        (untrained_eval, warmup) = (untrained, Some(done));
    }
    if job.rl.steps == 0 {
        return sft_summary(job, service, &folder, &trainers, &trainable, warmup).await;
    }
    let loss = rl_loss(&cx, job, service).await?;
    let mut versions = Versions::new(policies.clone(), service.base_sampling_client());
    let first = checkpoint.as_ref().map_or(0, |(_, cursor)| cursor.steps);
    versions.publish(&trainers, first).await?;
    // Each policy as RL started (or the job's reference): the KL penalty's reference, and what
    // the evaluation steps measure the policy's drift from.
    let references = load_references(job, &folder, service, &trainers, &run.name).await?;

    let (first_step, initial_evals, last_evals) = match checkpoint {
        Some((_, cursor)) => {
            let mut last_evals = cursor.last_evals;
            for (name, actions) in cursor.last_actions {
                if let Some(evaluation) = last_evals.get_mut(&name) {
                    evaluation.actions = actions;
                }
            }
            (cursor.steps, cursor.initial_evals, last_evals)
        }
        None => {
            let evaluations = versions.evaluate(&cx, job).await?;
            (0, evaluations.clone(), evaluations)
        }
    };
    let multi_agent = policies.len() > 1;
    let rollouts = job_rollouts(base, &run, &cx, &versions).await?;
    let tasks = Arc::new(JobTasks::new(&run.name, &cx, job)?);
    let stream = job
        .rl
        .asynchronous()
        .then(|| GroupStream::new(Arc::clone(&rollouts), Arc::clone(&tasks), job, first_step));
    let mut steps = RlSteps {
        name: &run.name,
        job,
        cx: &cx,
        folder: &folder,
        trainers: &trainers,
        policies: &policies,
        loss,
        references,
        rollouts,
        tasks,
        stream,
        versions,
        reporter,
        failures: FailureWatch::new(job.rl.max_failure_rate),
        signals: RunSignals::default(),
        initial_evals,
        last_evals,
    };
    for step in first_step..job.rl.steps {
        steps.step(step).await?;
    }
    let checkpoint = save_final(&trainers, &folder, &trainable, multi_agent).await?;
    let (initial_eval, final_eval) = (
        headline(&steps.initial_evals, &policies),
        headline(&steps.last_evals, &policies),
    );
    Ok(Summary {
        steps: job.rl.steps,
        untrained_eval,
        diagnosis: steps.signals.report(job, &initial_eval, &final_eval),
        initial_eval,
        final_eval,
        checkpoint,
        out: folder.root().to_path_buf(),
        policies: match multi_agent {
            true => per_policy(&trainable, &steps.initial_evals, &steps.last_evals),
            false => BTreeMap::new(),
        },
    })
}

/// A job's RL steps: what each step reads, and what it carries to the next (the policies'
/// versions, the failure and signal watches, the latest evaluations).
struct RlSteps<'a> {
    name: &'a str,
    job: &'a Job,
    cx: &'a Arc<JobContext>,
    folder: &'a RunFolder,
    trainers: &'a Trainers,
    policies: &'a [PolicySection],
    loss: LossFn,
    /// Each policy's KL reference.
    references: Vec<(String, Arc<dyn TrainingClient>)>,
    rollouts: Arc<dyn Rollouts>,
    tasks: Arc<JobTasks>,
    /// Groups played ahead, in an asynchronous job.
    stream: Option<GroupStream>,
    versions: Versions,
    reporter: Reporter,
    failures: FailureWatch,
    signals: RunSignals,
    initial_evals: BTreeMap<String, Evaluation>,
    last_evals: BTreeMap<String, Evaluation>,
}

impl RlSteps<'_> {
    /// One RL step: play a batch of groups, turn them into datums with their advantages, train
    /// every policy once, publish the next versions; evaluate, report and checkpoint as the job
    /// says.
    async fn step(&mut self, step: usize) -> anyhow::Result<()> {
        let (job, policies) = (self.job, self.policies);
        let started = Instant::now();
        let launch = self.versions.launch(step);
        let (played, policy_lag, stale_groups) = self.play(step, &launch).await?;
        let sample_seconds = started.elapsed().as_secs_f64();
        let all: Vec<&EpisodeOutcome> = played.iter().map(|(_, _, o)| o).collect();
        let stop = self.failures.record(&all);
        let advantages = step_advantages(self.cx, &played, job, job.rl.estimator).await?;
        let (mut batches, records, groups_trained) = datums_of(&played, job, policies, &advantages);
        if let Some(why) = stop {
            return Err(self.stop(step, started, &records, &all, &why));
        }
        let entropy = sampled_entropy(&batches);
        let signal = signal_of(&played, job, policies, &advantages);
        let failed = all.iter().filter(|o| o.failure.is_some()).count();
        self.signals
            .step(signal, entropy, failed as f64 / all.len().max(1) as f64);
        // The KL to the reference: every step with a penalty, which folds it into the
        // advantages; on evaluation steps without one, measured only (a zero fold).
        let last = step + 1 == job.rl.steps;
        let evaluates = last || (job.eval.every > 0 && (step + 1).is_multiple_of(job.eval.every));
        let kl = match job.rl.kl_coef > 0.0 || evaluates {
            true => Some(fold_kl_penalty(&self.references, &mut batches, job.rl.kl_coef).await?),
            false => None,
        };
        let train_tokens = batches
            .iter()
            .flat_map(|(_, datums)| datums)
            .map(|datum| datum.model_input.len())
            .sum();
        let training_started = Instant::now();
        let trained = self.train(batches, &launch).await?;
        let train_seconds = training_started.elapsed().as_secs_f64();
        self.signals.update(trained.update_ratio);
        self.versions.publish(self.trainers, step + 1).await?;
        self.folder.write_rollouts(step, &records)?;
        let mut agreement = None;
        let evaluations = if evaluates {
            let previous = headline(&self.last_evals, policies);
            self.last_evals = self.versions.evaluate(self.cx, job).await?;
            agreement = greedy_agreement(&previous, &headline(&self.last_evals, policies));
            self.signals.evaluation(agreement);
            Some(self.last_evals.clone())
        } else {
            None
        };
        let rewards: Vec<f64> = all
            .iter()
            .map(|o| o.returns().first().copied().unwrap_or(0.0))
            .collect();
        let multi_agent = policies.len() > 1;
        self.reporter.line(&StepMetrics {
            step,
            phase: Phase::Rl,
            reward_mean: mean(rewards.iter().copied()),
            reward_std: std(&rewards),
            episode_steps: mean(all.iter().map(|o| o.steps as f64)),
            tokens: trained.tokens,
            loss: trained.loss,
            update_ratio: trained.update_ratio,
            sampler_logprob_diff_max: trained.sampler_gap.map(|gap| gap.max),
            sampler_logprob_diff_mean: trained.sampler_gap.map(|gap| gap.mean),
            groups_trained,
            policy_lag,
            stale_groups,
            entropy,
            tied_groups: signal.tied_groups,
            advantage_abs_mean: signal.advantage_abs_mean,
            greedy_agreement: agreement,
            kl,
            errors: errors_of(&all),
            error_messages: error_messages_of(&all),
            env_metrics: metrics_of(&all),
            eval: evaluations.as_ref().map(|e| headline(e, policies)),
            policy_rewards: match multi_agent {
                true => policy_rewards(policies, &all),
                false => BTreeMap::new(),
            },
            policy_evals: evaluations.filter(|_| multi_agent).unwrap_or_default(),
            initial_evals: first_only(step, &self.initial_evals),
            warmup_stop: None,
            sample_seconds,
            sampled_tokens: all.iter().map(|o| o.sampled_tokens()).sum(),
            train_seconds,
            train_tokens,
            seconds: started.elapsed().as_secs_f64(),
        })?;
        let every = job.checkpoint.every;
        if last || (every > 0 && (step + 1).is_multiple_of(every)) {
            self.checkpoint(step + 1).await?;
        }
        Ok(())
    }

    /// The step's episodes, in batch order, with the policy lag and the stale groups dropped
    /// (both 0 in a synchronous job).
    async fn play(
        &mut self,
        step: usize,
        launch: &Launch,
    ) -> anyhow::Result<(Vec<(usize, usize, EpisodeOutcome)>, usize, usize)> {
        Ok(match &mut self.stream {
            Some(stream) => {
                let (groups, lag, stale) = stream.next_batch(launch).await?;
                (in_batch_order(groups), lag, stale)
            }
            None => {
                let played =
                    play_step(self.rollouts.as_ref(), &self.tasks, self.job, step, launch).await?;
                (played, 0, 0)
            }
        })
    }

    /// One training step of every policy on its datums (all in one fused pass). In an
    /// asynchronous job, groups play on with the current versions meanwhile.
    async fn train(
        &mut self,
        batches: Vec<PolicyBatch>,
        launch: &Launch,
    ) -> anyhow::Result<StepOutcome> {
        let training = train_step(
            with_trainers(self.trainers, batches)?,
            &self.loss,
            rl_adam(self.job.rl.learning_rate),
        );
        match &mut self.stream {
            Some(stream) => stream.while_training(training, launch).await?,
            None => training.await,
        }
    }

    /// The job stops at `step` since its episodes fail too often: the step's rollouts and
    /// metrics line carry the failures' own words, and nothing trains.
    fn stop(
        &mut self,
        step: usize,
        started: Instant,
        records: &[RolloutRecord],
        all: &[&EpisodeOutcome],
        why: &str,
    ) -> anyhow::Error {
        let reported = self.folder.write_rollouts(step, records).and_then(|()| {
            self.reporter.line(&StepMetrics {
                step,
                phase: Phase::Rl,
                reward_mean: mean(
                    all.iter()
                        .map(|o| o.returns().first().copied().unwrap_or(0.0)),
                ),
                episode_steps: mean(all.iter().map(|o| o.steps as f64)),
                errors: errors_of(all),
                error_messages: error_messages_of(all),
                env_metrics: metrics_of(all),
                initial_evals: first_only(step, &self.initial_evals),
                seconds: started.elapsed().as_secs_f64(),
                ..StepMetrics::default()
            })
        });
        match reported {
            Ok(()) => stopped(self.name, step, why, all),
            Err(error) => error,
        }
    }

    /// A checkpoint after `steps` steps: the adapters, and the cursor a resumed run starts from.
    async fn checkpoint(&mut self, steps: usize) -> anyhow::Result<()> {
        let cursor = Cursor {
            steps,
            metric_lines: self.reporter.lines(),
            initial_evals: self.initial_evals.clone(),
            last_evals: self.last_evals.clone(),
            last_actions: self
                .last_evals
                .iter()
                .map(|(name, e)| (name.clone(), e.actions.clone()))
                .collect(),
        };
        save_checkpoint(self.trainers, self.folder, cursor).await?;
        self.folder.write_report()
    }
}

/// The warm-up of a job's single trainable policy's LoRA adapter (the job check sees that a
/// LoRA warm-up has one), if the job has one: what it did, and, when RL follows, the greedy
/// evaluation of the model as it came before it (RL's first evaluation comes after the
/// warm-up, so the summary tells what the warm-up and RL each added).
async fn warm_up_lora(
    cx: &JobContext,
    job: &Job,
    service: &dyn ServiceClient,
    trainers: &Trainers,
    trainable: &[&PolicySection],
    reporter: &mut Reporter,
) -> anyhow::Result<Option<(Option<Evaluation>, Warmup)>> {
    let (Some(sft), [policy]) = (job.sft.as_ref().filter(|w| !w.full_parameters), trainable) else {
        return Ok(None);
    };
    let mut untrained_eval = None;
    if job.rl.steps > 0 {
        let policies = job.policies();
        let mut untrained = Versions::new(policies.clone(), service.base_sampling_client());
        untrained.publish(trainers, 0).await?;
        untrained_eval = Some(headline(&untrained.evaluate(cx, job).await?, &policies));
    }
    let trainer = trainer_of(trainers, &policy.name)?;
    let done = run_sft(cx, job, sft, trainer.as_ref(), reporter).await?;
    Ok(Some((untrained_eval, done)))
}

/// RL's loss: a built-in one by name, or the job's objective plugin as the service keeps it,
/// over the policy sampled from (the tempered one).
async fn rl_loss(
    cx: &JobContext,
    job: &Job,
    service: &dyn ServiceClient,
) -> anyhow::Result<LossFn> {
    Ok(LossFn {
        name: match (&job.rl.loss, &cx.loss) {
            (RlLoss::Plugin(section), Some(plugin)) => {
                let limits = &job.limits;
                service
                    .objective_loss(plugin, &section.plugin, limits)
                    .await?
            }
            (RlLoss::Builtin(loss), _) => loss.name().to_string(),
            (RlLoss::Plugin(_), None) => anyhow::bail!("the job's loss plugin was not loaded"),
        },
        config: job.rl.loss_config.clone(),
        // Greedy sampling (temperature 0) has no distribution to match: the model's own.
        temperature: match job.rl.temperature {
            t if t > 0.0 => t,
            _ => UNIT_TEMPERATURE,
        },
    })
}

/// The evaluations before RL, for the first step's metrics line only.
fn first_only(
    step: usize,
    initial_evals: &BTreeMap<String, Evaluation>,
) -> BTreeMap<String, Evaluation> {
    match step {
        0 => initial_evals.clone(),
        _ => BTreeMap::new(),
    }
}

/// Each trainable policy's evaluations before and after RL, for a job of several policies.
fn per_policy(
    trainable: &[&PolicySection],
    initial_evals: &BTreeMap<String, Evaluation>,
    last_evals: &BTreeMap<String, Evaluation>,
) -> BTreeMap<String, PolicyEvaluations> {
    trainable
        .iter()
        .map(|p| {
            let evaluations = PolicyEvaluations {
                initial_eval: initial_evals.get(&p.name).cloned().unwrap_or_default(),
                final_eval: last_evals.get(&p.name).cloned().unwrap_or_default(),
            };
            (p.name.clone(), evaluations)
        })
        .collect()
}

/// Each trainable policy's training client: a new LoRA adapter, or the one saved in
/// `resume_from/<policy>` by the checkpoint the job resumes from. Each adapter lives as long as
/// its client: a job that ends, however it ends, frees its adapters and the service goes on
/// serving the other jobs.
async fn open_trainers(
    service: &dyn ServiceClient,
    job_name: &str,
    job: &Job,
    trainable: &[&PolicySection],
    resume_from: Option<&std::path::Path>,
) -> anyhow::Result<Trainers> {
    let mut trainers = Trainers::new();
    for policy in trainable {
        let label = format!("{job_name}/{}", policy.name);
        let trainer = match resume_from {
            Some(dir) => {
                service
                    .create_training_client_from_state(&label, &dir.join(&policy.name), true)
                    .await?
            }
            None => {
                service
                    .create_lora_training_client(&label, &job.lora.config())
                    .await?
            }
        };
        trainers.insert(policy.name.clone(), trainer);
    }
    Ok(trainers)
}

/// Save the final adapters: a single-policy job's in `final/`, each of a job of several
/// policies in `final/<name>/`. Returns `final/`.
async fn save_final(
    trainers: &Trainers,
    folder: &RunFolder,
    trainable: &[&PolicySection],
    multi_agent: bool,
) -> anyhow::Result<PathBuf> {
    let checkpoint = folder.checkpoint_dir("final");
    for policy in trainable {
        let dir = match multi_agent {
            true => checkpoint.join(&policy.name),
            false => checkpoint.clone(),
        };
        trainer_of(trainers, &policy.name)?
            .save_state(&dir, true)
            .await?;
    }
    Ok(checkpoint)
}

/// Why job `job_name` stopped at `step` (`why`), with the count of each kind of failure among
/// the step's episodes and the first failure's own words.
fn stopped(job_name: &str, step: usize, why: &str, all: &[&EpisodeOutcome]) -> anyhow::Error {
    let kinds: Vec<String> = errors_of(all)
        .iter()
        .map(|(kind, count)| format!("{kind}: {count}"))
        .collect();
    let first = all.iter().find_map(|o| Some((o.seed, o.failure.as_ref()?)));
    let example = first.map_or(String::new(), |(seed, failure)| {
        format!(
            "; the first, seed {seed}: {}: {}",
            failure.kind,
            failure.message.as_deref().unwrap_or("(no message)")
        )
    });
    anyhow::anyhow!(
        "job `{job_name}` stopped at RL step {step}: {why} ({}){example}",
        kinds.join(", ")
    )
}

/// Each policy's mean return over the seats it controls in the step's episodes.
fn policy_rewards(policies: &[PolicySection], all: &[&EpisodeOutcome]) -> BTreeMap<String, f64> {
    policies
        .iter()
        .map(|p| {
            let returns = all.iter().flat_map(|o| {
                let returns = o.returns();
                (0..returns.len())
                    .filter(|&seat| p.controls(seat))
                    .map(move |seat| returns[seat])
            });
            (p.name.clone(), mean(returns))
        })
        .collect()
}

/// Who plays the job's groups: the base's queue, whose workers fetch the job's plugins from
/// the server (stored there now) and sample its versions there; otherwise this process.
async fn job_rollouts(
    base: &SharedBase,
    run: &JobRun,
    cx: &Arc<JobContext>,
    versions: &Versions,
) -> anyhow::Result<Arc<dyn Rollouts>> {
    let Some(queue) = &base.queue else {
        let samplers = versions.samplers.clone();
        return Ok(Arc::new(InProcess::new(Arc::clone(cx), samplers)));
    };
    let job = &run.job;
    let components = [
        job.environment.as_ref().map(|e| &e.plugin),
        job.agent.as_ref().map(|a| &a.plugin),
        job.reward.as_ref().map(|r| &r.plugin),
    ];
    for component in components.into_iter().flatten() {
        base.service
            .share_plugin(component)
            .await
            .with_context(|| format!("storing {} for the rollout workers", component.display()))?;
    }
    Ok(Arc::new(
        QueueRollouts::new(queue.clone(), &run.name).await?,
    ))
}

/// Save checkpoint `cursor` with every trainable policy's adapter and optimizer state, whole
/// or not at all.
async fn save_checkpoint(
    trainers: &Trainers,
    folder: &RunFolder,
    cursor: Cursor,
) -> anyhow::Result<()> {
    let staged = folder.stage_checkpoint(&cursor)?;
    for (name, trainer) in trainers {
        trainer.save_state(&staged.path().join(name), true).await?;
    }
    folder.commit_checkpoint(staged, &cursor)?;
    Ok(())
}

/// The training client of `policy`.
fn trainer_of(trainers: &Trainers, policy: &str) -> anyhow::Result<Arc<dyn TrainingClient>> {
    trainers
        .get(policy)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("policy {policy} has no training client"))
}

/// Each policy's batch with the policy's training client.
fn with_trainers(
    trainers: &Trainers,
    batches: Vec<PolicyBatch>,
) -> anyhow::Result<Vec<(&dyn TrainingClient, Vec<Datum>)>> {
    batches
        .into_iter()
        .map(|(policy, datums)| {
            let trainer = trainers
                .get(&policy)
                .ok_or_else(|| anyhow::anyhow!("policy {policy} has no training client"))?;
            Ok((trainer.as_ref(), datums))
        })
        .collect()
}

/// The trainer's name for `policy`'s KL reference.
fn reference_name(policy: &str) -> String {
    format!("{policy}@reference")
}

/// The KL reference of each trainable policy, as a training client of its own (used for
/// `forward` only): the job's `kl_reference`, or the policy as it is now (RL's start), saved in
/// `reference/` so a resumed run compares with the same one. Returns (policy, reference).
async fn load_references(
    job: &Job,
    folder: &RunFolder,
    service: &dyn ServiceClient,
    trainers: &Trainers,
    job_name: &str,
) -> anyhow::Result<Vec<(String, Arc<dyn TrainingClient>)>> {
    let mut references = Vec::new();
    for (policy, trainer) in trainers {
        let dir = match (&job.rl.kl_reference, trainers.len()) {
            (Some(dir), 1) => dir.clone(),
            (Some(dir), _) => dir.join(policy),
            (None, _) => {
                let dir = folder.root().join("reference").join(policy);
                if !dir.is_dir() {
                    trainer.save_state(&dir, false).await?;
                }
                dir
            }
        };
        let reference = service
            .create_training_client_from_state(
                &format!("{job_name}/{}", reference_name(policy)),
                &dir,
                false,
            )
            .await
            .with_context(|| format!("the KL reference of policy {policy}"))?;
        references.push((policy.clone(), reference));
    }
    Ok(references)
}

/// Fold `coef` times each sampled token's log-ratio to its policy's reference into its
/// advantage; returns the mean log-ratio over the tokens trained on.
async fn fold_kl_penalty(
    references: &[(String, Arc<dyn TrainingClient>)],
    batches: &mut [(String, Vec<Datum>)],
    coef: f64,
) -> anyhow::Result<f64> {
    let (mut total, mut count) = (0.0f64, 0usize);
    for (policy, datums) in batches.iter_mut() {
        let Some((_, reference)) = references.iter().find(|(p, _)| p == policy) else {
            continue;
        };
        if datums.is_empty() {
            continue;
        }
        let (reference_logprobs, _) = forward_cross_entropy(reference.as_ref(), datums).await?;
        for (datum, reference) in datums.iter_mut().zip(reference_logprobs) {
            let sampled = datum.floats(Logprobs).unwrap_or_default().to_vec();
            let mask = datum.floats(Mask).unwrap_or_default().to_vec();
            for ((m, p), r) in mask.iter().zip(&sampled).zip(&reference) {
                if *m > 0.0 {
                    total += f64::from(p - r);
                    count += 1;
                }
            }
            if let Some(advantages) = datum.floats_mut(Advantages) {
                fold_kl(advantages, &mask, &sampled, &reference, coef);
            }
        }
    }
    Ok(total / count.max(1) as f64)
}

/// The mean negative sampler logprob of the tokens trained on.
fn sampled_entropy(batches: &[(String, Vec<Datum>)]) -> f64 {
    let (mut total, mut count) = (0.0f64, 0usize);
    for datum in batches.iter().flat_map(|(_, d)| d) {
        let sampled = datum.floats(Logprobs).unwrap_or_default();
        let mask = datum.floats(Mask).unwrap_or_default();
        for (m, p) in mask.iter().zip(sampled) {
            if *m > 0.0 {
                total -= f64::from(*p);
                count += 1;
            }
        }
    }
    total / count.max(1) as f64
}

/// The summary of an SFT job: its result is the adapter (or, after a full-parameter SFT, the
/// base model).
async fn sft_summary(
    job: &Job,
    service: &dyn ServiceClient,
    folder: &RunFolder,
    trainers: &Trainers,
    trainable: &[&PolicySection],
    warmup: Option<Warmup>,
) -> anyhow::Result<Summary> {
    let checkpoint = match job.sft.as_ref().is_some_and(|s| s.full_parameters) {
        true => PathBuf::from(service.base_model()),
        false => {
            let dir = folder.checkpoint_dir("final");
            if let Some(policy) = trainable.first() {
                trainer_of(trainers, &policy.name)?
                    .save_state(&dir, true)
                    .await?;
            }
            dir
        }
    };
    folder.write_report()?;
    // A resumed job whose warm-up ended before this run reports its steps as planned.
    let steps = warmup
        .as_ref()
        .map_or(job.sft.as_ref().map_or(0, |s| s.steps), |w| w.steps);
    let (initial_eval, final_eval) = warmup.and_then(|w| w.evals).unwrap_or_default();
    Ok(Summary {
        steps,
        untrained_eval: None,
        initial_eval,
        final_eval,
        checkpoint,
        out: folder.root().to_path_buf(),
        policies: BTreeMap::new(),
        diagnosis: None,
    })
}

/// Play RL step `step`'s groups (`groups_per_batch` of them, numbered on from the previous
/// steps'), player p acting as `actors[p]`. Returns (group in the step, index in group, outcome)
/// in that order.
async fn play_step(
    rollouts: &dyn Rollouts,
    tasks: &JobTasks,
    job: &Job,
    step: usize,
    launch: &Launch,
) -> anyhow::Result<Vec<(usize, usize, EpisodeOutcome)>> {
    let groups = job.rl.groups_per_batch as u64;
    let first = step as u64 * groups;
    // Each group a task of its own, so that the step's groups play on every thread of the
    // runtime (awaited together in one task, their plugin calls would share one thread); the
    // set stops them all if the job ends first.
    let mut playing = tokio::task::JoinSet::new();
    for g in 0..groups {
        let group = rollouts.start(tasks.task(first + g, launch));
        playing.spawn(async move { (g, group.await) });
    }
    let mut played = Vec::with_capacity(groups as usize);
    while let Some(joined) = playing.join_next().await {
        let (g, group) = joined.context("a group's task failed")?;
        played.push((g, group?));
    }
    played.sort_by_key(|(g, _)| *g);
    Ok(in_batch_order(
        played.into_iter().map(|(_, group)| group).collect(),
    ))
}

/// The episodes of a batch of groups as (group in the batch, index in group, outcome).
fn in_batch_order(groups: Vec<PlayedGroup>) -> Vec<(usize, usize, EpisodeOutcome)> {
    groups
        .into_iter()
        .enumerate()
        .flat_map(|(g, group)| group.episodes.into_iter().map(move |(i, o)| (g, i, o)))
        .collect()
}

/// The returns of seat `seat` in each episode of `group`.
fn seat_returns(group: &[&(usize, usize, EpisodeOutcome)], seat: usize) -> GroupReturns {
    GroupReturns {
        turn_rewards: group
            .iter()
            .map(|(_, _, o)| o.turn_rewards.get(seat).cloned().unwrap_or_default())
            .collect(),
    }
}

/// The episodes of group `g` of a step's `played` ones.
fn group_of(
    played: &[(usize, usize, EpisodeOutcome)],
    g: usize,
) -> Vec<&(usize, usize, EpisodeOutcome)> {
    played.iter().filter(|(i, _, _)| *i == g).collect()
}

/// The number of seats (players) of a step's episodes.
fn seats_of(played: &[(usize, usize, EpisodeOutcome)]) -> usize {
    played
        .iter()
        .map(|(_, _, o)| o.transcripts.len().max(o.turn_rewards.len()))
        .max()
        .unwrap_or(0)
}

/// Each group's advantages per seat: the job's estimator plugin's answers (a failure stops the
/// step, naming the plugin), or `estimator`'s.
async fn step_advantages(
    cx: &JobContext,
    played: &[(usize, usize, EpisodeOutcome)],
    job: &Job,
    estimator: Estimator,
) -> anyhow::Result<StepAdvantages> {
    let Some((plugin, config)) = &cx.advantage else {
        return Ok(estimated(played, job, estimator));
    };
    let seats = seats_of(played);
    let mut step = Vec::with_capacity(job.rl.groups_per_batch);
    for g in 0..job.rl.groups_per_batch {
        let group = group_of(played, g);
        let mut per_seat = Vec::with_capacity(seats);
        for seat in 0..seats {
            let returns = seat_returns(&group, seat);
            let answer = match returns.turn_rewards.iter().all(Vec::is_empty) {
                true => vec![Vec::new(); returns.turn_rewards.len()],
                false => plugin
                    .advantages(config, &returns.turn_rewards, &cx.limits)
                    .await
                    .with_context(|| {
                        format!("the advantage estimator [rl.advantage] {}", plugin.digest())
                    })?,
            };
            per_seat.push(answer);
        }
        step.push(per_seat);
    }
    Ok(step)
}

/// Each group's advantages per seat by the built-in `estimator`.
fn estimated(
    played: &[(usize, usize, EpisodeOutcome)],
    job: &Job,
    estimator: Estimator,
) -> StepAdvantages {
    let seats = seats_of(played);
    (0..job.rl.groups_per_batch)
        .map(|g| {
            let group = group_of(played, g);
            (0..seats)
                .map(|seat| {
                    advantages(&seat_returns(&group, seat), estimator, job.rl.gamma, false)
                        .unwrap_or_default()
                })
                .collect()
        })
        .collect()
}

/// The datums of the played episodes (in group and index order) for each trainable policy: each
/// of its players' sequences, with that player's `advantages` within the group (a group whose
/// returns tie is skipped under `rl.skip_equal_groups`). Also the records of the rollout file
/// and the number of groups that were not skipped (for any player).
fn datums_of(
    played: &[(usize, usize, EpisodeOutcome)],
    job: &Job,
    policies: &[PolicySection],
    advantages: &StepAdvantages,
) -> (Vec<PolicyBatch>, Vec<RolloutRecord>, usize) {
    let mut batches: Vec<PolicyBatch> = policies
        .iter()
        .filter(|p| p.trainable)
        .map(|p| (p.name.clone(), Vec::new()))
        .collect();
    let mut records = Vec::new();
    let mut groups_trained = 0;
    let seats = seats_of(played);
    for g in 0..job.rl.groups_per_batch {
        let group = group_of(played, g);
        // Per seat, the advantages of each episode of the group (None: skipped).
        let per_seat: Vec<Option<&Vec<Vec<f64>>>> = (0..seats)
            .map(|seat| {
                let skipped = job.rl.skip_equal_groups && seat_returns(&group, seat).ties();
                advantages
                    .get(g)
                    .and_then(|group| group.get(seat))
                    .filter(|_| !skipped)
            })
            .collect();
        groups_trained += usize::from(per_seat.iter().any(Option::is_some));
        for (n, (group, index, outcome)) in group.iter().enumerate() {
            let mut sequences = Vec::new();
            for (seat, transcript) in outcome.transcripts.iter().enumerate() {
                let Some(transcript) = transcript else {
                    continue;
                };
                let mut advantage: Vec<f64> = per_seat[seat]
                    .and_then(|a| a.get(n))
                    .cloned()
                    .unwrap_or_default();
                // A failed episode is never reinforced: where its failure reward would sit above
                // the group's baseline (a crash beating the average loss), its advantage is 0.
                if outcome.failure.is_some() {
                    advantage.iter_mut().for_each(|a| *a = a.min(0.0));
                }
                let player_sequences = transcript.clone().into_sequences();
                let trains = policies.iter().find(|p| p.trainable && p.controls(seat));
                if let (Some(policy), Some(_)) = (trains, &per_seat[seat])
                    && let Some((_, datums)) = batches.iter_mut().find(|(n, _)| *n == policy.name)
                {
                    let turn_advantage =
                        |turn: usize| advantage.get(turn).copied().unwrap_or(0.0) as f32;
                    for sequence in &player_sequences {
                        datums.extend(rl_datum(sequence, turn_advantage));
                    }
                }
                sequences.push((seat, player_sequences, advantage));
            }
            records.push(RolloutRecord::new(*group, *index, outcome, &sequences));
        }
    }
    (batches, records, groups_trained)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::plugin::ErrorKind;
    use crate::rl::failure::EpisodeFailure;
    use crate::rl::transcript::Transcript;

    fn policy(name: &str, players: Vec<usize>, trainable: bool) -> PolicySection {
        PolicySection {
            name: name.into(),
            players,
            trainable,
            eval_config: None,
        }
    }

    /// An episode where seat 0 played token 10 + i and seat 1 token 20 + i, with returns
    /// (r0, -r0).
    fn episode(i: u32, r0: f64) -> EpisodeOutcome {
        let seat = |token: u32| {
            let mut transcript = Transcript::new(vec![1, 2]);
            transcript
                .push_action(vec![token, 3], vec![-0.5, -0.1])
                .unwrap();
            Some(transcript)
        };
        EpisodeOutcome {
            seed: u64::from(i),
            task: "{}".into(),
            transcripts: vec![seat(10 + i), seat(20 + i)],
            turn_rewards: vec![vec![r0], vec![-r0]],
            failure: None,
            steps: 2,
            metrics: BTreeMap::new(),
            messages: vec![Vec::new(), Vec::new()],
            scores: Vec::new(),
        }
    }

    #[test]
    fn a_job_stops_when_a_step_fails_whole_or_most_of_its_recent_episodes_fail() {
        let outcomes = |failed: usize, played: usize| -> Vec<EpisodeOutcome> {
            (0..played)
                .map(|i| {
                    let mut o = episode(i as u32, 0.0);
                    if i < failed {
                        o.fail(EpisodeFailure::with(ErrorKind::Trap.into(), "boom"), 0.0);
                    }
                    o
                })
                .collect()
        };
        let record = |watch: &mut FailureWatch, failed: usize, played: usize| {
            let step = outcomes(failed, played);
            watch.record(&step.iter().collect::<Vec<_>>())
        };
        let mut watch = FailureWatch::new(0.5);
        assert_eq!(record(&mut watch, 4, 8), None, "half is not more than half");
        assert_eq!(record(&mut watch, 3, 8), None);
        let why = record(&mut watch, 6, 8).expect("13 of 24 failed");
        assert!(
            why.contains("13 of the 24 episodes of the last 3 steps"),
            "{why}"
        );
        // The window slides: the first step's failures leave it.
        let mut watch = FailureWatch::new(0.5);
        for _ in 0..3 {
            assert_eq!(record(&mut watch, 4, 8), None);
        }
        assert_eq!(record(&mut watch, 0, 8), None);
        let mut watch = FailureWatch::new(0.9);
        assert!(
            record(&mut watch, 8, 8)
                .unwrap()
                .contains("every episode of the step")
        );
        // A rate of 1 never stops a job.
        let mut watch = FailureWatch::new(1.0);
        assert_eq!(record(&mut watch, 8, 8), None);
    }

    fn group_mean(played: &[(usize, usize, EpisodeOutcome)], job: &Job) -> StepAdvantages {
        estimated(played, job, Estimator::GroupMean)
    }

    #[test]
    fn each_seat_trains_only_its_own_policy_with_its_own_return() {
        let job: Job = toml::from_str(
            "[model]\ninit_tiny = {}\n[rl]\nsteps = 1\ngroups_per_batch = 1\ngroup_size = 2\n",
        )
        .unwrap();
        let played = vec![(0, 0, episode(0, 1.0)), (0, 1, episode(1, -1.0))];
        let policies = [policy("x", vec![0], true), policy("o", vec![1], true)];
        let (batches, records, groups) =
            datums_of(&played, &job, &policies, &group_mean(&played, &job));
        assert_eq!(groups, 1);
        assert_eq!(records.len(), 2);
        let batch = |name: &str| &batches.iter().find(|(n, _)| n == name).unwrap().1;
        // Seat 0 won episode 0 and lost episode 1: advantages +1 and -1 on its sampled tokens.
        let x = batch("x");
        assert_eq!(x.len(), 2);
        assert_eq!(x[0].target_tokens().unwrap(), [2, 10, 3]);
        assert_eq!(x[0].floats(Advantages).unwrap(), [0.0, 1.0, 1.0]);
        assert_eq!(x[1].target_tokens().unwrap(), [2, 11, 3]);
        assert_eq!(x[1].floats(Advantages).unwrap(), [0.0, -1.0, -1.0]);
        // Seat 1 has the opposite returns, and only its own tokens.
        let o = batch("o");
        assert_eq!(o[0].target_tokens().unwrap(), [2, 20, 3]);
        assert_eq!(o[0].floats(Advantages).unwrap(), [0.0, -1.0, -1.0]);
        assert_eq!(o[1].floats(Advantages).unwrap(), [0.0, 1.0, 1.0]);

        // A failed episode (return 0, the default failure reward) in a group that mostly lost
        // would have a positive advantage; it gets none.
        let mut failed = episode(2, 0.0);
        failed.failure = Some(EpisodeFailure::of(ErrorKind::Trap.into()));
        let losing = vec![
            (0, 0, episode(0, -1.0)),
            (0, 1, episode(1, -1.0)),
            (0, 2, failed),
        ];
        let job3: Job = toml::from_str(
            "[model]\ninit_tiny = {}\n[rl]\nsteps = 1\ngroups_per_batch = 1\ngroup_size = 3\n",
        )
        .unwrap();
        let (batches, _, _) = datums_of(&losing, &job3, &policies, &group_mean(&losing, &job3));
        let x = &batches.iter().find(|(n, _)| n == "x").unwrap().1;
        assert!(x[0].floats(Advantages).unwrap()[1] < 0.0);
        assert_eq!(x[2].floats(Advantages).unwrap(), [0.0, 0.0, 0.0]);
        // Seat 1 won those games: the failed episode's return sits below the mean, and it
        // keeps its negative advantage.
        let o = &batches.iter().find(|(n, _)| n == "o").unwrap().1;
        assert!(o[2].floats(Advantages).unwrap()[1] < 0.0);

        // A frozen policy's seat trains nothing.
        let frozen = [policy("x", vec![0], true), policy("o", vec![1], false)];
        let (batches, _, _) = datums_of(&played, &job, &frozen, &group_mean(&played, &job));
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].0, "x");
    }
}
