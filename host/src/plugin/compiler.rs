//! Compiling an untrusted component in a worker process, so that what compilation costs is
//! bounded: a component of a few hundred kilobytes can make Cranelift's register allocator spend
//! minutes and gigabytes, and no thread can be stopped or capped in memory from inside a process.
//!
//! The worker is this program run again as `opentinker compile-worker`: it reads the component
//! on stdin, checks its [`Structure`](super::structure) against the limits, compiles it with the
//! host's engine settings (minus the instance pool, which it does not need), and writes the
//! serialized artifact on stdout. It runs under `RLIMIT_AS` (its whole address space) and
//! `RLIMIT_CPU`, without core dumps, with a clean environment, and is killed past a wall-time
//! limit. The host then deserializes the artifact: it trusts the worker's output as it would trust
//! its own compiler's, the worker being the same binary.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::cache_file::KEY_LEN;
use super::engine::{EngineSettings, wasm_config};
use super::error::{CompileResource, LoadError};
use super::function_cache::FunctionCache;
use super::limits::{CompileLimits, StructureLimits};
use super::structure::{self, StructureError};

/// The subcommand of `opentinker` that runs the worker.
pub const WORKER_SUBCOMMAND: &str = "compile-worker";

/// Names the worker program, overriding the search next to the running executable.
pub const WORKER_ENV: &str = "OPENTINKER_COMPILE_WORKER";

/// Where the worker program is: the running executable when it is `opentinker`, else an
/// `opentinker` beside it or one folder up (a test or benchmark binary in cargo's `deps/`), unless
/// [`WORKER_ENV`] names one.
pub fn find_worker() -> Result<PathBuf, LoadError> {
    if let Some(program) = std::env::var_os(WORKER_ENV) {
        return Ok(PathBuf::from(program));
    }
    let exe = std::env::current_exe()
        .map_err(|e| LoadError::CompilerUnavailable(format!("finding this executable: {e}")))?;
    if exe.file_stem().is_some_and(|stem| stem == "opentinker") {
        return Ok(exe);
    }
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("opentinker"),
        dir.parent().unwrap_or(dir).join("opentinker"),
    ];
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .ok_or_else(|| {
            LoadError::CompilerUnavailable(format!(
                "no `opentinker` program at {} or {} to compile in (build it with `cargo build`, or \
                 name it in {WORKER_ENV})",
                candidates[0].display(),
                candidates[1].display()
            ))
        })
}

/// What the host passes the worker on its command line.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerRequest {
    settings: EngineSettings,
    structure: StructureLimits,
    /// The per-function cache's folder, whose key then leads the worker's input (never on the
    /// command line, which other users can read).
    functions: Option<PathBuf>,
}

/// What the worker says when it refuses or fails a component (on stderr, one JSON line, exit
/// status [`REFUSED`]).
#[derive(Debug, Serialize, Deserialize)]
enum WorkerError {
    Structure(StructureError),
    Compile(String),
}

/// The worker's exit status when it refused the component (and said why).
const REFUSED: i32 = 3;

/// What of the worker's stderr is kept: its refusal, or the first words of a crash.
const STDERR_BYTES: u64 = 64 * 1024;

/// Compile `bytes` in a bounded worker, returning the component loaded into `engine`.
pub(crate) async fn compile_in_worker(
    engine: &Engine,
    program: &Path,
    settings: &EngineSettings,
    limits: &CompileLimits,
    functions: Option<&FunctionCache>,
    bytes: &[u8],
) -> Result<Component, LoadError> {
    let request = WorkerRequest {
        settings: settings.clone(),
        structure: limits.structure.clone(),
        functions: functions.map(|cache| cache.dir().to_path_buf()),
    };
    let key = functions.map(FunctionCache::key);
    let request = serde_json::to_string(&request)
        .map_err(|e| LoadError::CompilerUnavailable(format!("encoding the request: {e}")))?;
    let mut command = std::process::Command::new(program);
    command
        .arg(WORKER_SUBCOMMAND)
        .arg(request)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let budget = limits.budget(bytes.len());
    let memory = budget.memory_bytes;
    let cpu_seconds = budget.cpu_time_ms.div_ceil(1000).max(1);
    // SAFETY: only `setrlimit`, which is async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(move || {
            set_limit(libc::RLIMIT_AS, memory)?;
            set_limit(libc::RLIMIT_CPU, cpu_seconds)?;
            set_limit(libc::RLIMIT_CORE, 0)
        });
    }
    let mut child = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            LoadError::CompilerUnavailable(format!("starting {}: {e}", program.display()))
        })?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(LoadError::CompilerUnavailable(
            "the worker's pipes were not opened".into(),
        ));
    };
    let artifact_limit = limits.artifact_bytes;
    let exchange = async {
        // The worker reads all its input before it writes anything, so no pipe can fill both ways.
        let wrote = async {
            if let Some(key) = &key {
                stdin.write_all(key).await?;
            }
            stdin.write_all(bytes).await?;
            stdin.shutdown().await
        }
        .await;
        drop(stdin);
        let mut artifact = Vec::new();
        let mut errors = Vec::new();
        let mut stdout = stdout.take(artifact_limit + 1);
        let mut stderr = stderr.take(STDERR_BYTES);
        let (read_out, read_err) = tokio::join!(
            stdout.read_to_end(&mut artifact),
            stderr.read_to_end(&mut errors),
        );
        let status = child.wait().await;
        (wrote, read_out, read_err, status, artifact, errors)
    };
    let wall = Duration::from_millis(budget.wall_time_ms);
    let (wrote, read_out, _, status, artifact, errors) =
        match tokio::time::timeout(wall, exchange).await {
            Ok(outcome) => outcome,
            // Dropping the exchange drops the child, which kills it.
            Err(_) => {
                return Err(LoadError::CompileLimit {
                    resource: CompileResource::WallTime,
                    limit: budget.wall_time_ms,
                });
            }
        };
    let status = status.map_err(|e| LoadError::CompilerUnavailable(format!("the worker: {e}")))?;
    let errors = String::from_utf8_lossy(&errors);
    if status.code() == Some(REFUSED) {
        let refusal = errors.lines().last().unwrap_or_default();
        return Err(match serde_json::from_str::<WorkerError>(refusal) {
            Ok(WorkerError::Structure(StructureError::Malformed(message))) => {
                LoadError::NotAComponent(message)
            }
            Ok(WorkerError::Structure(error)) => LoadError::Structure(error),
            Ok(WorkerError::Compile(message)) if is_out_of_memory(&message) => {
                LoadError::CompileLimit {
                    resource: CompileResource::Memory,
                    limit: budget.memory_bytes,
                }
            }
            Ok(WorkerError::Compile(message)) => LoadError::NotAComponent(message),
            Err(_) => crashed("an unreadable refusal", &errors),
        });
    }
    if !status.success() {
        return Err(match status.signal() {
            Some(libc::SIGXCPU) | Some(libc::SIGKILL) => LoadError::CompileLimit {
                resource: CompileResource::CpuTime,
                limit: budget.cpu_time_ms,
            },
            _ if is_out_of_memory(&errors) => LoadError::CompileLimit {
                resource: CompileResource::Memory,
                limit: budget.memory_bytes,
            },
            _ => crashed(&status.to_string(), &errors),
        });
    }
    if let Err(e) = wrote.and(read_out.map(drop)) {
        return Err(LoadError::CompilerCrashed(format!(
            "talking to the worker: {e}"
        )));
    }
    if artifact.len() as u64 > artifact_limit {
        return Err(LoadError::CompileLimit {
            resource: CompileResource::ArtifactBytes,
            limit: artifact_limit,
        });
    }
    // SAFETY: the artifact is what wasmtime's compiler, in this same program, made of the
    // component; `deserialize` checks that it was made for this engine's settings and version.
    unsafe { Component::deserialize(engine, &artifact) }
        .map_err(|e| LoadError::NotAComponent(format!("{e:#}")))
}

/// A crashed worker's error: what it wrote goes to this host's log, not to whoever sent the
/// component (it may name this host's paths and memory).
fn crashed(how: &str, errors: &str) -> LoadError {
    tracing::warn!(how, output = errors.trim(), "a compile worker failed");
    LoadError::CompilerCrashed(format!("{how} (its output is in the host's log)"))
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: a plain system call on a valid struct.
    if unsafe { libc::setrlimit(resource, &limit) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a failure's text is an allocation refused by the address-space limit: Rust's
/// "memory allocation of N bytes failed" abort, or an `mmap` failing with `ENOMEM`.
fn is_out_of_memory(text: &str) -> bool {
    text.contains("memory allocation of") || text.contains("Cannot allocate memory")
}

/// The worker's side: read a component on stdin, check and compile it, write the artifact on
/// stdout. `request` is the host's JSON. Returns the process's exit status.
pub fn run_worker(request: &str) -> i32 {
    let refuse = |error: WorkerError| {
        let line = serde_json::to_string(&error).unwrap_or_default();
        eprintln!("{line}");
        REFUSED
    };
    let request: WorkerRequest = match serde_json::from_str(request) {
        Ok(request) => request,
        Err(e) => return refuse(WorkerError::Compile(format!("a bad request: {e}"))),
    };
    let mut stdin = std::io::stdin().lock();
    let functions = match &request.functions {
        Some(dir) => {
            let mut key = [0; KEY_LEN];
            if let Err(e) = stdin.read_exact(&mut key) {
                return refuse(WorkerError::Compile(format!("reading the cache key: {e}")));
            }
            Some(FunctionCache::new(dir.clone(), key))
        }
        None => None,
    };
    let mut bytes = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut bytes) {
        return refuse(WorkerError::Compile(format!("reading the component: {e}")));
    }
    let structure = match structure::measure(&bytes) {
        Ok(structure) => structure,
        Err(error) => return refuse(WorkerError::Structure(error)),
    };
    if let Err(error) = request.structure.check(&structure) {
        return refuse(WorkerError::Structure(error));
    }
    let mut config = wasm_config(&request.settings);
    if let Some(functions) = functions
        && let Err(e) = config.enable_incremental_compilation(Arc::new(functions))
    {
        return refuse(WorkerError::Compile(format!("{e:#}")));
    }
    let engine = match Engine::new(&config) {
        Ok(engine) => engine,
        Err(e) => return refuse(WorkerError::Compile(format!("{e:#}"))),
    };
    let artifact = Component::new(&engine, &bytes).and_then(|component| component.serialize());
    match artifact {
        Ok(artifact) => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(&artifact).and_then(|()| stdout.flush()) {
                Ok(()) => 0,
                Err(e) => refuse(WorkerError::Compile(format!("writing the artifact: {e}"))),
            }
        }
        Err(e) => refuse(WorkerError::Compile(format!("{e:#}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grows_with_the_component() {
        let limits = CompileLimits::default();
        let small = limits.budget(258 << 10);
        assert!(
            small.memory_bytes < 1 << 30 && small.cpu_time_ms < 10_000,
            "{small:?}"
        );
        assert_eq!(small.wall_time_ms, 30_000);
        let python = limits.budget(18 << 20);
        assert_eq!(python.cpu_time_ms, 8_000 + 18 * 6_000);
        assert_eq!(python.wall_time_ms, 2 * python.cpu_time_ms);
        assert_eq!(python.memory_bytes, (768 + 18 * 48) << 20);
    }
}
