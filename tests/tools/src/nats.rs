//! A real NATS server with JetStream on loopback, for the rollout queue's tests: the test venv's
//! `nats-server`, storing its streams in a folder the test gives, stopped when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    binary: PathBuf,
    store: PathBuf,
    /// The configuration file it reads, if any (the flags still set where it listens).
    config: Option<PathBuf>,
    child: Option<Child>,
    /// The port it listens on, on 127.0.0.1 (the same after a restart).
    pub port: u16,
}

impl NatsServer {
    /// Start one, its JetStream files in `store`; `None` (the test skipped, and counted) where
    /// `nats-server` is missing, except in a strict run, where the test fails naming it.
    pub fn start(store: &Path) -> Option<NatsServer> {
        NatsServer::start_with(store, None)
    }

    /// [`NatsServer::start`] reading the configuration file `config` (its `include`s relative
    /// to it), which names `store` as its JetStream `store_dir` (NATS refuses a second one on
    /// the command line); the flags still put it on loopback, on a free port, its monitoring on
    /// another.
    pub fn start_configured(store: &Path, config: &Path) -> Option<NatsServer> {
        NatsServer::start_with(store, Some(config))
    }

    fn start_with(store: &Path, config: Option<&Path>) -> Option<NatsServer> {
        let binary = crate::nats_server()?;
        let port = free_port();
        let mut server = NatsServer {
            binary,
            store: store.to_path_buf(),
            config: config.map(Path::to_path_buf),
            child: None,
            port,
        };
        server.run();
        Some(server)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kill it (as a crash would: no clean shutdown), then start it again on the same port and
    /// files.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
    }

    fn run(&mut self) {
        let mut command = Command::new(&self.binary);
        match &self.config {
            Some(config) => {
                command.arg("--config").arg(config);
                command.args(["--http_port", &free_port().to_string()]);
            }
            None => {
                command.arg("--store_dir").arg(&self.store);
            }
        }
        let child = command
            .args(["--jetstream", "--addr", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting nats-server");
        self.child = Some(child);
        let address = format!("127.0.0.1:{}", self.port);
        let started = Instant::now();
        while TcpStream::connect(&address).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "nats-server did not listen on {address}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port free on 127.0.0.1 now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
