//! WASI 0.2 in neutered form: what a plugin sees of the world is fixed, so an episode replays
//! exactly from its seed and learns nothing of the host.
//!
//! - no environment variables, arguments or preopened directories; sockets and name lookup denied;
//! - the wall clock stands at 1970-01-01T00:00:00Z;
//! - the monotonic clock is virtual: it advances a microsecond per read and by the requested
//!   duration when the guest sleeps, and a sleep returns at once;
//! - randomness (secure and insecure) comes from generators seeded by the episode seed;
//! - stdout and stderr go to the episode's bounded log.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::io::AsyncWrite;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::HostWallClock;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiView};

/// Build the WASI context of one episode.
pub(crate) fn episode_ctx(seed: u64, log: &LogSink) -> WasiCtx {
    let mut builder = WasiCtxBuilder::new();
    builder
        .stdout(log.clone())
        .stderr(log.clone())
        .wall_clock(EpochWallClock)
        .secure_random(StdRng::seed_from_u64(seed))
        .insecure_random(StdRng::seed_from_u64(seed ^ 0x5EED_5EED_5EED_5EED))
        .insecure_random_seed(u128::from(seed))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .max_random_size(64 * 1024);
    builder.build()
}

/// Add WASI 0.2 to `linker`, with the monotonic clock replaced by the virtual one.
pub(crate) fn add_to_linker<T>(
    linker: &mut Linker<T>,
    clock: fn(&mut T) -> VirtualClockView<'_>,
) -> wasmtime::Result<()>
where
    T: WasiView + 'static,
{
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    linker.allow_shadowing(true);
    monotonic_clock::add_to_linker::<T, VirtualClockData>(linker, clock)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The wall clock of every plugin: always the Unix epoch.
struct EpochWallClock;

impl HostWallClock for EpochWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// The virtual monotonic clock of one episode, in nanoseconds.
#[derive(Default)]
pub(crate) struct VirtualClock {
    now_ns: u64,
}

/// Each read advances the clock by this much, so a guest that waits for time to pass by polling
/// the clock still finishes, deterministically.
const TICK_PER_READ_NS: u64 = 1_000;

pub(crate) struct VirtualClockView<'a> {
    pub clock: &'a mut VirtualClock,
    pub table: &'a mut ResourceTable,
}

struct VirtualClockData;

impl HasData for VirtualClockData {
    type Data<'a> = VirtualClockView<'a>;
}

/// A pollable that is ready at once: what a guest's sleep waits on.
struct Elapsed;

#[async_trait::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

impl VirtualClockView<'_> {
    fn sleep(&mut self, ns: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.clock.now_ns = self.clock.now_ns.saturating_add(ns);
        let elapsed = self.table.push(Elapsed)?;
        wasmtime_wasi::p2::subscribe(self.table, elapsed)
    }
}

impl monotonic_clock::Host for VirtualClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<u64> {
        self.clock.now_ns = self.clock.now_ns.saturating_add(TICK_PER_READ_NS);
        Ok(self.clock.now_ns)
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(TICK_PER_READ_NS)
    }

    fn subscribe_instant(&mut self, when: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.sleep(when.saturating_sub(self.clock.now_ns))
    }

    fn subscribe_duration(&mut self, duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.sleep(duration)
    }
}

/// The bounded log of one episode: guest stdout, stderr and `host.log` lines. Bytes beyond the
/// budget are dropped and counted; the guest never sees an error.
#[derive(Clone)]
pub struct LogSink(Arc<Mutex<LogBuffer>>);

#[derive(Default)]
struct LogBuffer {
    kept: Vec<u8>,
    capacity: usize,
    dropped: u64,
}

impl LogSink {
    pub fn new(capacity: usize) -> Self {
        LogSink(Arc::new(Mutex::new(LogBuffer {
            capacity,
            ..LogBuffer::default()
        })))
    }

    pub fn append(&self, bytes: &[u8]) {
        let mut log = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let room = log.capacity.saturating_sub(log.kept.len());
        let keep = room.min(bytes.len());
        log.kept.extend_from_slice(&bytes[..keep]);
        log.dropped += (bytes.len() - keep) as u64;
    }

    /// The kept text (lossily decoded) and the number of bytes dropped.
    pub fn contents(&self) -> (String, u64) {
        let log = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (String::from_utf8_lossy(&log.kept).into_owned(), log.dropped)
    }
}

impl IsTerminal for LogSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// How much a guest may write at once; any amount is accepted (the excess is counted).
const WRITE_BUDGET: usize = 1024 * 1024;

impl OutputStream for LogSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_BUDGET)
    }
}

#[async_trait::async_trait]
impl Pollable for LogSink {
    async fn ready(&mut self) {}
}

impl AsyncWrite for LogSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keeps_its_budget_and_counts_the_rest() {
        let log = LogSink::new(10);
        log.append(b"hello ");
        log.append(b"world, again");
        let (kept, dropped) = log.contents();
        assert_eq!(kept, "hello worl");
        assert_eq!(dropped, 8);
    }
}
