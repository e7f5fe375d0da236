//! The engine as a timely cluster of processes: where each process is, and
//! the TCP connections between them, made here (quietly, with a deadline,
//! checking who connects) and handed to timely's own communication.

use crate::runtime::EngineError;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use timely::communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
use timely::communication::allocator::{AllocatorBuilder, ProcessBuilder};
use timely::communication::{Hooks, WorkerGuards};

/// How long the processes of a cluster wait for each other to connect.
const CONNECT_WITHIN: Duration = Duration::from_secs(60);
/// How often a process tries again to reach one that is not up yet.
const RETRY: Duration = Duration::from_millis(10);
/// What a process says first on a connection: this, then its index.
const HELLO: &[u8; 8] = b"ccattler";

/// This process's place in an engine that runs as a timely cluster of
/// processes (timely's own names: `--hosts FILE --process I --workers N`).
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Worker threads per process.
    pub workers: usize,
    /// This process's index into `addresses`.
    pub process: usize,
    /// Every process's `host:port`, the same list in every process.
    pub addresses: Vec<String>,
}

impl Cluster {
    /// Reads a hosts file: one `host:port` a line (blank lines and `#`
    /// comments skipped), as timely's own `-h` takes it.
    pub fn from_hosts_file(path: &std::path::Path, process: usize, workers: usize) -> Result<Cluster, EngineError> {
        let named = |why: String| EngineError::Cluster(format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
        let mut addresses = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let port = line.rsplit_once(':').filter(|(host, _)| !host.is_empty()).and_then(|(_, port)| port.parse::<u16>().ok());
            if port.is_none_or(|p| p == 0) || line.chars().any(char::is_whitespace) {
                return Err(named(format!("line {}: {line:?} is not host:port", n + 1)));
            }
            addresses.push(line.to_string());
        }
        let cluster = Cluster { workers, process, addresses };
        cluster.check().map_err(|e| named(e.to_string()))?;
        Ok(cluster)
    }

    /// `n` addresses on the loopback interface, each a port free when asked.
    pub fn loopback(n: usize) -> std::io::Result<Vec<String>> {
        let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
        listeners.iter().map(|l| l.local_addr().map(|a| a.to_string())).collect()
    }

    pub(crate) fn check(&self) -> Result<(), EngineError> {
        let bad = |why: String| Err(EngineError::Cluster(why));
        if self.addresses.is_empty() {
            return bad("no process addresses".into());
        }
        if self.process >= self.addresses.len() {
            return bad(format!("process {} is not below the {} processes listed", self.process, self.addresses.len()));
        }
        if self.workers == 0 {
            return bad("0 workers per process".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = self.addresses.iter().find(|a| !seen.insert(*a)) {
            return bad(format!("{twice} is listed twice"));
        }
        Ok(())
    }

    /// Connects to every other process and runs `work` on this process's
    /// workers over timely's communication.
    pub(crate) fn execute<T, F>(&self, work: F) -> Result<WorkerGuards<T>, EngineError>
    where
        T: Send + 'static,
        F: Fn(&mut timely::worker::Worker) -> T + Send + Sync + 'static,
    {
        self.check()?;
        let sockets = self.connect(CONNECT_WITHIN)?;
        let hooks = Hooks::default();
        let process_allocators = ProcessBuilder::new_typed_vector(self.workers, hooks.refill.clone(), hooks.spill.clone());
        let (builders, guard) = initialize_networking_from_sockets(process_allocators, sockets, self.process, self.workers, hooks)
            .map_err(|e| EngineError::Cluster(format!("starting the cluster's communication: {e}")))?;
        let builders = builders.into_iter().map(AllocatorBuilder::Tcp).collect();
        timely::execute::execute_from(builders, Box::new(guard), timely::WorkerConfig::default(), work).map_err(EngineError::Stopped)
    }

    /// A connection to every other process (`None` at this one's index):
    /// this one listens at its address for the processes after it and
    /// connects to those before it, until all are there or `within` passed.
    fn connect(&self, within: Duration) -> Result<Vec<Option<TcpStream>>, EngineError> {
        let deadline = Instant::now() + within;
        let me = self.process;
        let n = self.addresses.len();
        let failed = |what: String, e: std::io::Error| EngineError::Cluster(format!("{what}: {e}"));
        let listener = TcpListener::bind(&self.addresses[me]).map_err(|e| failed(format!("listening at {}", self.addresses[me]), e))?;
        let before: Vec<String> = self.addresses[..me].to_vec();
        // Connect and accept at once: process i waits for those after it
        // while it reaches those before it.
        let dialer = std::thread::spawn(move || -> Result<Vec<TcpStream>, EngineError> {
            let mut out = Vec::new();
            for (i, address) in before.iter().enumerate() {
                let mut stream = loop {
                    match TcpStream::connect(address) {
                        Ok(s) => break s,
                        Err(e) if Instant::now() >= deadline => {
                            return Err(failed(format!("process {i} at {address} could not be reached within {}s", within.as_secs()), e))
                        }
                        Err(_) => std::thread::sleep(RETRY),
                    }
                };
                let hello = [&HELLO[..], &(me as u64).to_be_bytes()].concat();
                stream.write_all(&hello).map_err(|e| failed(format!("greeting process {i} at {address}"), e))?;
                out.push(stream);
            }
            Ok(out)
        });
        let mut after: Vec<Option<TcpStream>> = (me + 1..n).map(|_| None).collect();
        listener.set_nonblocking(true).map_err(|e| failed("listening".into(), e))?;
        while after.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((mut stream, from)) => {
                    // Whoever else connects (a port scan, a process of another
                    // cluster) is dropped, not taken for a peer.
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut hello = [0u8; 16];
                    let index = stream
                        .read_exact(&mut hello)
                        .ok()
                        .filter(|()| &hello[..8] == HELLO)
                        .map(|()| u64::from_be_bytes(hello[8..].try_into().expect("8 bytes")) as usize);
                    match index.filter(|i| (me + 1..n).contains(i) && after[i - me - 1].is_none()) {
                        Some(i) => {
                            let _ = stream.set_read_timeout(None);
                            after[i - me - 1] = Some(stream);
                        }
                        None => tracing::warn!(%from, "a connection to the cluster's port that is not one of its processes: dropped"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = after
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(k, _)| format!("process {} at {}", me + 1 + k, self.addresses[me + 1 + k]))
                            .collect();
                        return Err(EngineError::Cluster(format!("{} did not connect within {}s", missing.join(", "), within.as_secs())));
                    }
                    std::thread::sleep(RETRY);
                }
                Err(e) => return Err(failed(format!("accepting at {}", self.addresses[me]), e)),
            }
        }
        let before = dialer.join().map_err(|_| EngineError::Cluster("connecting to the processes before this one panicked".into()))??;
        let mut sockets: Vec<Option<TcpStream>> = before.into_iter().map(Some).collect();
        sockets.push(None);
        sockets.extend(after);
        for s in sockets.iter().flatten() {
            s.set_nodelay(true).map_err(|e| failed("setting TCP_NODELAY".into(), e))?;
        }
        Ok(sockets)
    }
}
