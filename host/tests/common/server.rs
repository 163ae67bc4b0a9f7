//! `opentinker serve` on loopback for the tests that talk to it: a fresh data folder with
//! tenants `alice` and `bob`, the process stopped when dropped.

// Each test crate that includes this uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The `opentinker` binary the tests start: the one cargo built with them, or
/// `OPENTINKER_TEST_BINARY` where a test binary runs without cargo (`scripts/gpu-check.sh`
/// carries both to a GPU machine).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("OPENTINKER_TEST_BINARY")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_opentinker").to_string())
    })
}

/// The `host` folder of the sources (the tests' scripts and plugins): where cargo built the
/// tests, or `OPENTINKER_TEST_SOURCES` where a test binary runs elsewhere.
pub fn host_dir() -> PathBuf {
    std::env::var_os("OPENTINKER_TEST_SOURCES")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// A server on loopback with tenants `alice` and `bob`; stopped when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub data: tempfile::TempDir,
    pub alice: String,
    pub bob: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn create_tenant(data: &Path, name: &str) -> String {
    let key = tenant_command(data, &["create", name]);
    assert!(key.starts_with("tml-"), "{key}");
    key
}

/// `opentinker tenant ARGS --data DATA`, which must succeed; what it printed on stdout.
pub fn tenant_command(data: &Path, args: &[&str]) -> String {
    let output = Command::new(bin())
        .arg("tenant")
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .expect("running opentinker tenant");
    assert!(
        output.status.success(),
        "tenant {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// Start `opentinker serve` on `data` at `addr`; returns the process, the URL it serves and the
/// line it printed (which says what it restored).
pub fn spawn_server(data: &Path, addr: &str) -> (Child, String, String) {
    spawn_server_with(data, addr, &[])
}

/// [`spawn_server`] with more options of `serve`.
pub fn spawn_server_with(data: &Path, addr: &str, options: &[&str]) -> (Child, String, String) {
    let mut command = Command::new(bin());
    command.stderr(Stdio::inherit());
    spawn(command, data, addr, options)
}

/// [`spawn_server_with`] with `OPENTINKER_LOG` set to `filter` and the server's log (its
/// stderr) written to `log`.
pub fn spawn_server_logging(
    data: &Path,
    addr: &str,
    filter: &str,
    log: std::fs::File,
    options: &[&str],
) -> (Child, String, String) {
    let mut command = Command::new(bin());
    command.env("OPENTINKER_LOG", filter).stderr(log);
    spawn(command, data, addr, options)
}

fn spawn(
    mut command: Command,
    data: &Path,
    addr: &str,
    options: &[&str],
) -> (Child, String, String) {
    let mut child = command
        .args(["serve", "--addr", addr, "--poll-wait", "5", "--data"])
        .arg(data)
        .args(options)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting opentinker serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("the server did not say where it listens: {line:?}"))
        .to_string();
    (child, url, line)
}

pub fn start_server() -> Server {
    start_server_with(&[])
}

/// [`start_server`] with more options of `serve`.
pub fn start_server_with(options: &[&str]) -> Server {
    let data = tempfile::tempdir().unwrap();
    let alice = create_tenant(data.path(), "alice");
    let bob = create_tenant(data.path(), "bob");
    let (child, url, _) = spawn_server_with(data.path(), "127.0.0.1:0", options);
    Server {
        child,
        url,
        data,
        alice,
        bob,
    }
}

/// One HTTP/1.1 exchange with the server at `url` (plain, over a socket, so that nothing between
/// the test and the server is forgiving): the status, the head and the body.
pub fn request(
    url: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let address = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(key) = key {
        head.push_str(&format!("X-API-Key: {key}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading all of a large body.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, answer[split + 4..].to_vec())
}

/// A TCP proxy on loopback in front of a server that keeps every byte the server sends, so a
/// test can look at all of its answers whatever the client (the Python SDK's included).
pub struct RecordingProxy {
    /// What the client is given instead of the server's URL.
    pub url: String,
    sent: Arc<Mutex<Vec<u8>>>,
}

impl RecordingProxy {
    /// Forward each connection to `upstream` (`http://HOST:PORT`), recording the answers.
    pub fn start(upstream: &str) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&sent);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(&upstream)) else {
                    continue;
                };
                let (mut from_client, mut to_server) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_server);
                    let _ = to_server.shutdown(Shutdown::Write);
                });
                let recorded = Arc::clone(&recorded);
                std::thread::spawn(move || {
                    let (mut from_server, mut to_client) = (server, client);
                    let mut buffer = [0u8; 1 << 14];
                    while let Ok(n @ 1..) = from_server.read(&mut buffer) {
                        recorded.lock().unwrap().extend_from_slice(&buffer[..n]);
                        if to_client.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to_client.shutdown(Shutdown::Both);
                });
            }
        });
        RecordingProxy { url, sent }
    }

    /// Everything the server has sent so far, as text (lossy).
    pub fn sent(&self) -> String {
        String::from_utf8_lossy(&self.sent.lock().unwrap()).into_owned()
    }
}
