//! A real OCI distribution registry on loopback for the marketplace tests: Debian's
//! `docker-registry` (the CNCF distribution), which `scripts/test.sh` installs, storing in a
//! fresh folder, stopped when dropped.

// Each test crate that includes this uses part of it.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct OciRegistry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// Where it keeps its blobs and manifests.
    pub storage: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl OciRegistry {
    /// `oci://127.0.0.1:PORT`, as the CLI names it.
    pub fn reference(&self) -> String {
        format!("oci://{}", self.host)
    }

    /// Start one; `None` (the test skipped, and counted) where `docker-registry` is not
    /// installed, except in a strict run, where the test fails naming it.
    pub fn start() -> Option<OciRegistry> {
        let binary = opentinker_test_tools::docker_registry()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("storage");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting docker-registry");
        let host = format!("127.0.0.1:{port}");
        let started = Instant::now();
        while TcpStream::connect(&host).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "docker-registry did not listen on {host}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(OciRegistry {
            child,
            host,
            storage,
            _dir: dir,
        })
    }

    /// The file in which the registry keeps the blob of `digest` (`sha256:HEX`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}
