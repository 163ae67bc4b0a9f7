//! What a plugin call costs, beside serving the same environment over HTTP.
//!
//! With the tic-tac-toe plugin (epochs and fuel on): one `step` on a live episode, and a fresh
//! episode (store + instantiate + construct + observe). Beside them, the same game step served
//! the way the original OpenTinker serves environments: a Python FastAPI + uvicorn server on
//! loopback, one POST per step over a keep-alive connection (skipped, with a note, when FastAPI
//! is not installed: `pip install -r bench/python/requirements.txt`), and a Rust hyper server
//! for reference.
//!
//! Run: `cargo bench -p opentinker --bench plugin_calls`

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentinker::plugin::build_plugin;
use opentinker::plugin::{HostConfig, Limits, Plugin, PluginHost};
use opentinker_sdk::Environment;
use serde_json::{Value, json};
use tictactoe::TicTacToe;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn load_plugin(rt: &tokio::runtime::Runtime) -> (PluginHost, Plugin) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/tictactoe");
    let wasm = build_plugin(&dir).expect("building the tic-tac-toe plugin");
    let host = PluginHost::new(HostConfig::default()).expect("a plugin host");
    let plugin = rt
        .block_on(host.load_file(&wasm))
        .expect("loading the plugin");
    (host, plugin)
}

/// A keep-alive HTTP/1.1 connection speaking the reset/step protocol of the Python server.
struct HttpEnv {
    sender: SendRequest<Full<Bytes>>,
    addr: SocketAddr,
}

impl HttpEnv {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connecting");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("an HTTP handshake");
        tokio::spawn(connection);
        HttpEnv { sender, addr }
    }

    async fn post(&mut self, path: &str, body: Value) -> Value {
        let request = Request::post(path)
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request");
        self.sender.ready().await.expect("the connection is ready");
        let response = self.sender.send_request(request).await.expect("a response");
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        serde_json::from_slice(&bytes).expect("JSON")
    }

    /// Play whole games (resets not timed) until `steps` steps are timed; their total time.
    async fn time_steps(&mut self, steps: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut timed = 0;
        let mut seed = 0;
        while timed < steps {
            seed += 1;
            let reset = self.post("/reset", json!({ "seed": seed })).await;
            let id = reset["episode_id"].as_u64().expect("an episode id");
            let mut board = reset["observation"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            while timed < steps {
                let action = policy_move(&board);
                let started = Instant::now();
                let step = self
                    .post("/step", json!({ "episode_id": id, "action": action }))
                    .await;
                total += started.elapsed();
                timed += 1;
                if step["done"].as_bool().unwrap_or(true) {
                    break;
                }
                board = step["observation"].as_str().unwrap_or_default().to_string();
            }
        }
        total
    }
}

/// The benchmark's policy, the same for every server: the first free cell of the board shown
/// (free cells are drawn as their numbers) in a fixed order of preference.
fn policy_move(board: &str) -> String {
    let free: Vec<char> = board
        .lines()
        .take(3)
        .flat_map(str::chars)
        .filter(char::is_ascii_digit)
        .collect();
    ['5', '1', '9', '3', '7', '2', '4', '6', '8']
        .into_iter()
        .find(|c| free.contains(c))
        .unwrap_or('5')
        .to_string()
}

/// Play whole games of the Wasm plugin on live episodes (episode start and first observation not
/// timed) until `steps` steps are timed; their total time.
async fn time_plugin_steps(plugin: &Plugin, limits: &Limits, steps: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut timed = 0;
    let mut seed = 0;
    while timed < steps {
        seed += 1;
        let mut episode = plugin
            .start_episode("{}", "{}", seed, limits)
            .await
            .expect("an episode");
        let mut board = episode
            .observe(0)
            .await
            .expect("an observation")
            .pop()
            .expect("a board")
            .content;
        while timed < steps {
            let action = policy_move(&board);
            let started = Instant::now();
            let result = episode.step(&action).await.expect("a step");
            total += started.elapsed();
            timed += 1;
            if result.next_player.is_none() {
                break;
            }
            board = result
                .messages
                .into_iter()
                .next()
                .expect("a board")
                .messages
                .remove(0)
                .content;
        }
    }
    total
}

/// The reference server: the same protocol in Rust (hyper), on the plugin's own game logic.
async fn serve_with_hyper() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding");
    let addr = listener.local_addr().expect("an address");
    let episodes: Arc<Mutex<HashMap<u64, TicTacToe>>> = Arc::default();
    let next_id = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (episodes, next_id) = (episodes.clone(), next_id.clone());
            let service = hyper::service::service_fn(
                move |request: Request<hyper::body::Incoming>| {
                    let (episodes, next_id) = (episodes.clone(), next_id.clone());
                    async move {
                        let path = request.uri().path().to_string();
                        let body = request.into_body().collect().await?.to_bytes();
                        let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                        let mut episodes = episodes.lock().unwrap_or_else(|p| p.into_inner());
                        let reply = if path == "/reset" {
                            let seed = body["seed"].as_u64().unwrap_or(0);
                            let id = next_id.fetch_add(1, Ordering::Relaxed);
                            let mut game = TicTacToe::new("{}", "{}", seed).expect("a game");
                            let observation = game.observe(0).expect("an observation");
                            episodes.insert(id, game);
                            json!({ "episode_id": id, "observation": observation[1].content })
                        } else {
                            let id = body["episode_id"].as_u64().unwrap_or(0);
                            let action = body["action"].as_str().unwrap_or("");
                            match episodes.get_mut(&id).map(|game| game.step(action)) {
                                Some(Ok(result)) => {
                                    let done = result.next_player.is_none();
                                    if done {
                                        episodes.remove(&id);
                                    }
                                    let text =
                                        result.messages.first().map(|(_, m)| m[0].content.clone());
                                    json!({ "observation": text, "reward": result.rewards[0], "done": done })
                                }
                                _ => json!({ "error": "no such episode" }),
                            }
                        };
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(
                            reply.to_string(),
                        ))))
                    }
                },
            );
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// The FastAPI server process, killed when dropped (also when a benchmark panics).
struct PythonServer(Child);

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the FastAPI server on a free port if Python has FastAPI and uvicorn; `None` (with a
/// note) otherwise.
fn start_fastapi() -> Option<(PythonServer, SocketAddr)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/python/tictactoe_server.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let available = Command::new(&python)
        .args(["-c", "import fastapi, uvicorn"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !available {
        eprintln!("python_fastapi/step skipped: pip install -r bench/python/requirements.txt");
        return None;
    }
    let server = PythonServer(
        Command::new(&python)
            .arg(script)
            .args(["--port", &port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .ok()?,
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Some((server, addr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("python_fastapi/step skipped: the server did not start");
    None
}

fn plugin_calls(c: &mut Criterion) {
    let rt = runtime();
    let (_host, plugin) = load_plugin(&rt);
    let limits = Limits::default();
    let mut group = c.benchmark_group("tictactoe");
    group.measurement_time(Duration::from_secs(4));
    if support::quick() {
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(50))
            .measurement_time(Duration::from_millis(200));
    }

    group.bench_function("wasm_plugin/step", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (plugin, limits) = (plugin.clone(), limits.clone());
            async move { time_plugin_steps(&plugin, &limits, iters).await }
        })
    });

    group.bench_function("wasm_plugin/fresh_episode", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (plugin, limits) = (plugin.clone(), limits.clone());
            async move {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    let started = Instant::now();
                    let mut episode = plugin
                        .start_episode("{}", "{}", i, &limits)
                        .await
                        .expect("an episode");
                    episode.observe(0).await.expect("an observation");
                    total += started.elapsed();
                    drop(episode);
                }
                total
            }
        })
    });

    let hyper_addr = rt.block_on(serve_with_hyper());
    let mut hyper_env = rt.block_on(HttpEnv::connect(hyper_addr));
    group.bench_function("rust_hyper/step", |b| {
        b.iter_custom(|iters| rt.block_on(hyper_env.time_steps(iters)))
    });

    // The quick run (the test script's) has no peers.
    let fastapi = match support::quick() {
        true => None,
        false => start_fastapi(),
    };
    if let Some((server, addr)) = fastapi {
        let mut fastapi = rt.block_on(HttpEnv::connect(addr));
        group.bench_function("python_fastapi/step", |b| {
            b.iter_custom(|iters| rt.block_on(fastapi.time_steps(iters)))
        });
        drop(server);
    }
    group.finish();
}

criterion_group!(benches, plugin_calls);
criterion_main!(benches);
