//! `opentinker submit JOB.toml --server URL`: run a job on a server. The job file is checked
//! here as `train` checks it, its plugins built (source folders) and uploaded by digest (those
//! the server holds already are not sent again), and the job submitted with its plugins named
//! by digest, or, for a published plugin that neither the lock file nor a `--registry` resolves,
//! by its range, which the server resolves on its own registry (the lock file then pins what it
//! chose); then its progress is shown as `train` shows it until it ends (Ctrl-C detaches; the
//! job goes on). `opentinker jobs list|status|logs|cancel|download` reach the jobs afterwards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use super::progress::TrainProgress;
use crate::api::ApiErrorKind;
use crate::client::JobsClient;
use crate::jobs::{JobRecord, JobState, RunFile};
use crate::market::{LockFile, Locked, lock_path};
use crate::market::{MarketError, PackageRef};
use crate::rl::StepMetrics;
use crate::rl::{Job, is_digest, is_package};

/// How a command reaches the server.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// The server (`opentinker serve`), `http://host:port`.
    #[arg(long, env = "TINKER_BASE_URL", value_name = "URL")]
    server: String,
    /// The tenant's API key (`opentinker tenant create` prints one).
    #[arg(long, env = "TINKER_API_KEY", hide_env_values = true)]
    api_key: String,
}

impl ServerArgs {
    fn client(&self) -> anyhow::Result<JobsClient> {
        Ok(JobsClient::connect(&self.server, &self.api_key)?)
    }
}

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The job file (TOML; see examples/README.md). Its plugins may be crate folders, `.wasm`
    /// files, published plugins (`namespace/name@RANGE`) or `sha256:` digests of plugins the
    /// server holds.
    job: PathBuf,
    #[command(flatten)]
    packages: super::market::PackageArgs,
    /// The job's name on the server (default: the file's stem).
    #[arg(long)]
    name: Option<String>,
    /// Submit and return at once, printing the job's id.
    #[arg(long)]
    detach: bool,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum JobsCommand {
    /// The tenant's jobs, newest first.
    List {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// A job's record, latest metrics and evaluations, as JSON.
    Status {
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// A job's metrics lines so far (JSON lines); with --follow, then each new one until it ends.
    Logs {
        id: String,
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Stop a job.
    Cancel {
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Copy a job's run folder (metrics, rollouts, checkpoints) into OUT.
    Download {
        id: String,
        #[arg(long)]
        out: PathBuf,
        /// Only the files under this path of the run folder (e.g. `checkpoints/step-30`).
        #[arg(long)]
        only: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
}

pub fn run_submit(args: SubmitArgs) -> anyhow::Result<()> {
    let mut job = Job::load(&args.job)?;
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .job
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "job".into()),
    };
    let text = std::fs::read_to_string(&args.job)
        .with_context(|| format!("reading {}", args.job.display()))?;
    super::job_files::build_plugins(
        &args.job,
        &mut job,
        &args.packages,
        super::market::Unpinned::LeaveToServer,
    )?;
    let client = args.server.client()?;
    super::runtime(2)?.block_on(async {
        let text = with_digests(&client, &args.job, &text, &mut job).await?;
        let answer = client.submit(&name, &text).await?;
        let record: JobRecord =
            serde_json::from_value(answer.clone()).context("reading the server's answer")?;
        if let Err(error) = pin_resolved(&args.job, &answer["resolved"]) {
            // The job must not run on what the lock file did not pin.
            let _ = client.cancel(record.id.as_str()).await;
            return Err(error.context(format!("job {} cancelled", record.id)));
        }
        eprintln!("submitted job {} ({name})", record.id);
        if args.detach {
            println!("{}", record.id);
            return Ok(());
        }
        tokio::select! {
            ended = watch(&client, record.id.as_str(), &name, &job) => ended,
            _ = tokio::signal::ctrl_c() => {
                eprintln!(
                    "detached; job {} goes on (`opentinker jobs status {}`)",
                    record.id, record.id
                );
                Ok(())
            }
        }
    })
}

/// Write the packages the server resolved (`resolved` of its answer) into the job's lock
/// file, so that the next run, here or there, uses the same digests.
fn pin_resolved(job_file: &Path, resolved: &Value) -> anyhow::Result<()> {
    let resolved: Vec<Locked> = match resolved {
        Value::Null => Vec::new(),
        value => serde_json::from_value(value.clone())
            .context("reading the packages the server resolved")?,
    };
    if resolved.is_empty() {
        return Ok(());
    }
    let path = lock_path(job_file);
    let mut lock = LockFile::load(&path)?;
    let name_of = |wanted: &str| wanted.parse::<PackageRef>().map(|r| r.name).ok();
    let mut pinned = Vec::new();
    for resolved in resolved {
        let wanted: PackageRef = resolved
            .wanted
            .parse()
            .context("reading a package the server resolved")?;
        let id = resolved.id(&wanted);
        // A version the lock file pins, which the server was asked for exactly.
        if let Some(locked) = lock.packages.iter().find(|l| {
            name_of(&l.wanted).as_ref() == Some(&wanted.name) && l.version == resolved.version
        }) {
            if locked.digest != resolved.digest {
                return Err(MarketError::DigestMismatch {
                    what: format!("{id} on the server (pinned by {})", path.display()),
                    expected: locked.digest.clone(),
                    found: resolved.digest,
                }
                .into());
            }
            continue;
        }
        pinned.push(format!("{id} ({})", resolved.digest));
        lock.set(resolved);
    }
    if !pinned.is_empty() {
        lock.save(&path)?;
        eprintln!("pinned {} in {}", pinned.join(", "), path.display());
    }
    Ok(())
}

/// The job file's text with each plugin named by the digest of its component, uploaded to the
/// server unless it holds it already; a package the server resolves stays named by its range.
async fn with_digests(
    client: &JobsClient,
    path: &Path,
    text: &str,
    job: &mut Job,
) -> anyhow::Result<String> {
    let mut table: toml::Table =
        toml::from_str(text).with_context(|| format!("reading {}", path.display()))?;
    for (section, plugin) in job.plugin_paths_mut() {
        if is_package(plugin) {
            continue;
        }
        let digest = match is_digest(plugin) {
            true => plugin.to_string_lossy().into_owned(),
            false => {
                let bytes = std::fs::read(&*plugin)
                    .with_context(|| format!("[{section}] plugin {}", plugin.display()))?;
                let (digest, uploaded) = client
                    .upload_plugin(bytes)
                    .await
                    .with_context(|| format!("[{section}] plugin {}", plugin.display()))?;
                let how = if uploaded {
                    "uploaded"
                } else {
                    "already stored"
                };
                eprintln!("[{section}] plugin {}: {digest} ({how})", plugin.display());
                digest
            }
        };
        if let Some(toml::Value::Table(entry)) = table.get_mut(section) {
            entry.insert("plugin".into(), toml::Value::String(digest));
        }
    }
    toml::to_string(&table).context("writing the job file with digests")
}

/// Show the job's progress until it ends; the stream is opened again if it breaks (a server
/// restarting), and no line is shown twice.
async fn watch(client: &JobsClient, id: &str, name: &str, job: &Job) -> anyhow::Result<()> {
    let display = TrainProgress::new(&[(name.to_string(), job)]);
    let mut told: Option<(u8, usize)> = None;
    let mut ended: Option<(JobState, Option<String>)> = None;
    let mut broken_since: Option<std::time::Instant> = None;
    while ended.is_none() {
        let followed = client
            .follow(id, |event, data| {
                match event {
                    "step" => {
                        if let Ok(line) = serde_json::from_str::<StepMetrics>(data) {
                            let position = (line.phase as u8, line.step);
                            if told.is_none_or(|t| position > t) {
                                told = Some(position);
                                display.show(name, &line);
                            }
                        }
                    }
                    "end" => {
                        let value: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                        let state = serde_json::from_value(value["state"].clone())
                            .unwrap_or(JobState::Failed);
                        let error = value["error"].as_str().map(String::from);
                        ended = Some((state, error));
                        return false;
                    }
                    _ => {}
                }
                true
            })
            .await;
        if ended.is_some() {
            break;
        }
        if let Err(error) = &followed
            && error.kind != ApiErrorKind::Unavailable
        {
            anyhow::bail!("following job {id}: {error}");
        }
        // The stream ended without the job's end: the server went away; try again for a while.
        let since = *broken_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("lost the server for 5 minutes: {followed:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if followed.is_ok() {
            broken_since = None;
        }
    }
    display.finish();
    let (state, error) = ended.unwrap_or((JobState::Failed, None));
    let status = client.status(id).await.unwrap_or(Value::Null);
    match state {
        JobState::Succeeded => {
            let summary = &status["summary"];
            eprintln!(
                "{name}: eval reward {:.3} -> {:.3}; job {id} succeeded (`opentinker jobs \
                 download {id} --out DIR` copies its run folder)",
                summary["initial_eval"]["reward_mean"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                summary["final_eval"]["reward_mean"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            );
            if let Some(diagnosis) = summary["diagnosis"].as_str() {
                eprintln!("{name}: {diagnosis}");
            }
            Ok(())
        }
        state => anyhow::bail!(
            "job {id} {state}{}",
            error.map(|e| format!(": {e}")).unwrap_or_default()
        ),
    }
}

pub fn run_jobs(command: JobsCommand) -> anyhow::Result<()> {
    let runtime = super::runtime(2)?;
    match command {
        JobsCommand::List { server } => {
            let jobs = runtime.block_on(server.client()?.list())?;
            let listed = jobs["jobs"].as_array().cloned().unwrap_or_default();
            for value in listed {
                let job: JobRecord =
                    serde_json::from_value(value.clone()).context("reading the server's answer")?;
                // A job waiting for memory shows its place in the queue.
                let state = match value["queue"]["position"].as_u64() {
                    Some(position) => format!("{} #{position}", job.state),
                    None => job.state.to_string(),
                };
                println!("{}  {state:<10} {}", job.id, job.name);
            }
            Ok(())
        }
        JobsCommand::Status { id, server } => {
            let status = runtime.block_on(server.client()?.status(&id))?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(())
        }
        JobsCommand::Logs { id, follow, server } => {
            let client = server.client()?;
            runtime.block_on(async {
                if !follow {
                    let bytes = client.file(&id, crate::rl::METRICS).await?;
                    print!("{}", String::from_utf8_lossy(&bytes));
                    return Ok(());
                }
                client
                    .follow(&id, |event, data| {
                        if event == "step" {
                            println!("{data}");
                        }
                        event != "end"
                    })
                    .await?;
                Ok(())
            })
        }
        JobsCommand::Cancel { id, server } => {
            let record = runtime.block_on(server.client()?.cancel(&id))?;
            let record: JobRecord =
                serde_json::from_value(record).context("reading the server's answer")?;
            eprintln!("job {} {}", record.id, record.state);
            Ok(())
        }
        JobsCommand::Download {
            id,
            out,
            only,
            server,
        } => runtime.block_on(download(&server.client()?, &id, &out, only.as_deref())),
    }
}

/// Copy the files of job `id`'s run folder (those under `only`, when given) into `out`.
async fn download(
    client: &JobsClient,
    id: &str,
    out: &Path,
    only: Option<&str>,
) -> anyhow::Result<()> {
    let files: Vec<RunFile> = serde_json::from_value(client.files(id).await?["files"].clone())
        .context("reading the server's answer")?;
    let prefix = only.map(|p| p.trim_end_matches('/'));
    let chosen: Vec<&RunFile> = files
        .iter()
        .filter(|f| prefix.is_none_or(|p| f.path == p || f.path.starts_with(&format!("{p}/"))))
        .collect();
    anyhow::ensure!(
        !chosen.is_empty(),
        "job {id} has no files{}",
        prefix.map(|p| format!(" under {p}")).unwrap_or_default()
    );
    let total: u64 = chosen.iter().map(|f| f.bytes).sum();
    for file in &chosen {
        let bytes = client.file(id, &file.path).await?;
        let path = out.join(&file.path);
        crate::store::write_atomic(&path, &bytes)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "{} files ({total} bytes) of job {id} in {}",
        chosen.len(),
        out.display()
    );
    Ok(())
}
