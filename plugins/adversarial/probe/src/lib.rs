//! Looks for the host from inside the sandbox, at construction and in `step`: files and
//! directories, environment variables, arguments, the working directory, sockets (TCP connect,
//! UDP bind, name lookup), the wall clock, and whether a sleep takes real time. It reports what it
//! found as metrics (each 0 when the sandbox hides the host) and ends with reward 1 only if it
//! found nothing.

use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use adversarial_common::{Adversary, Misbehaviour};
use opentinker_sdk::{PluginError, StepResult};

pub struct Probe;

/// Everything the probe could learn of the host: each entry is (metric, count found).
fn look_around() -> Vec<(&'static str, f64)> {
    let readable_paths = [
        "/",
        ".",
        "/etc/passwd",
        "/proc/self/environ",
        "/tmp",
        "/home",
    ]
    .iter()
    .filter(|p| std::fs::read_dir(p).is_ok() || std::fs::read(p).is_ok())
    .count();
    let cwd = std::env::current_dir()
        .ok()
        .filter(|d| !d.as_os_str().is_empty() && d.as_os_str() != "/")
        .map_or(0, |_| 1);
    let tcp = ["127.0.0.1:22", "127.0.0.1:80", "10.0.0.1:443", "[::1]:22"]
        .iter()
        .filter(|a| TcpStream::connect(a).is_ok())
        .count();
    let udp = usize::from(UdpSocket::bind("0.0.0.0:0").is_ok());
    let lookup = usize::from(("localhost", 80).to_socket_addrs().is_ok());
    let wall_clock_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let started = Instant::now();
    let wall_before = std::time::SystemTime::now();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let real_sleep = wall_before.elapsed().map_or(0, |d| d.as_millis());
    let virtual_sleep_ms = started.elapsed().as_millis();
    vec![
        ("readable_paths", readable_paths as f64),
        ("working_directory", cwd as f64),
        ("env_vars", std::env::vars_os().count() as f64),
        ("args", std::env::args_os().count() as f64),
        ("tcp_connections", tcp as f64),
        ("udp_sockets", udp as f64),
        ("name_lookups", lookup as f64),
        ("wall_clock_secs", wall_clock_secs as f64),
        // The wall clock stands still, so a sleep shows no wall time passing.
        ("wall_ms_during_sleep", real_sleep as f64),
        // Reported, not counted as found: the virtual monotonic clock advances by the sleep.
        ("virtual_sleep_ms", virtual_sleep_ms as f64),
    ]
}

impl Misbehaviour for Probe {
    const NAME: &'static str = "probe";

    fn new(_config: &str, _seed: u64) -> Self {
        // Look once at construction too: the host must hide itself there as well.
        std::hint::black_box(look_around());
        Probe
    }

    fn step(&mut self, _: &str) -> Result<StepResult, PluginError> {
        let findings = look_around();
        let found: f64 = findings
            .iter()
            .filter(|(name, _)| *name != "virtual_sleep_ms")
            .map(|(_, count)| count)
            .sum();
        let mut result = StepResult::end(vec![if found == 0.0 { 1.0 } else { 0.0 }]);
        for (name, value) in findings {
            result = result.metric(name, value);
        }
        Ok(result.metric("found", found))
    }
}

opentinker_sdk::export_environment!(Adversary<Probe>);
