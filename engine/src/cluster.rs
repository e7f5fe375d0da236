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
/// What a process says first on a connection: this, then its index, its
/// workers and its program's fingerprint (the one it connects to answers
/// the same): processes that would build different dataflows never start.
const HELLO: &[u8; 8] = b"ccattler";
/// How long a greeting may take to arrive once connected.
const GREETING_WITHIN: Duration = Duration::from_secs(10);

/// A process's greeting: who it is and what it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Greeting {
    index: usize,
    workers: usize,
    /// [`fingerprint`] of the program it loaded.
    program: u64,
}

impl Greeting {
    fn bytes(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..8].copy_from_slice(HELLO);
        out[8..16].copy_from_slice(&(self.index as u64).to_be_bytes());
        out[16..24].copy_from_slice(&(self.workers as u64).to_be_bytes());
        out[24..].copy_from_slice(&self.program.to_be_bytes());
        out
    }

    /// Reads one; `None` for anything that does not greet as a process of a
    /// cluster (a port scan, a stray client, a closed connection).
    fn read(stream: &mut TcpStream) -> Option<Greeting> {
        let mut b = [0u8; 32];
        stream.read_exact(&mut b).ok()?;
        let word = |r: std::ops::Range<usize>| u64::from_be_bytes(b[r].try_into().expect("8 bytes"));
        (&b[..8] == HELLO).then(|| Greeting { index: word(8..16) as usize, workers: word(16..24) as usize, program: word(24..32) })
    }

    /// Why a peer's greeting cannot join this process's cluster, if it cannot.
    fn mismatch(self, peer: Greeting, address: &str) -> Option<String> {
        if peer.workers != self.workers {
            return Some(format!(
                "process {} at {address} runs {} worker(s), this one {}: every process of a cluster runs the same --workers",
                peer.index, peer.workers, self.workers
            ));
        }
        if peer.program != self.program {
            return Some(format!(
                "process {} at {address} loaded other rules or runs another ccattler version (program {:016x}, here {:016x}): every process of a cluster loads the same rule files with the same binary",
                peer.index, peer.program, self.program
            ));
        }
        None
    }
}

/// A program's fingerprint, as processes compare it when they connect: the
/// binary's version and every rule file's text, in order (FNV-1a; not a
/// defence against a hostile peer — the connections are not authenticated —
/// but against a careless deploy).
pub fn fingerprint(program: &ccattler_parser::program::Program) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(env!("CARGO_PKG_VERSION").as_bytes());
    for id in program.sources.ids() {
        eat(program.sources.text(id).as_bytes());
    }
    h
}

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

    /// Connects to every other process (refusing one whose program or
    /// workers differ: `program` is this one's [`fingerprint`]) and runs
    /// `work` on this process's workers over timely's communication.
    pub(crate) fn execute<T, F>(&self, program: u64, work: F) -> Result<WorkerGuards<T>, EngineError>
    where
        T: Send + 'static,
        F: Fn(&mut timely::worker::Worker) -> T + Send + Sync + 'static,
    {
        self.check()?;
        let sockets = self.connect(program, CONNECT_WITHIN)?;
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
    fn connect(&self, program: u64, within: Duration) -> Result<Vec<Option<TcpStream>>, EngineError> {
        let deadline = Instant::now() + within;
        let me = self.process;
        let mine = Greeting { index: me, workers: self.workers, program };
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
                stream.write_all(&mine.bytes()).map_err(|e| failed(format!("greeting process {i} at {address}"), e))?;
                let _ = stream.set_read_timeout(Some(GREETING_WITHIN));
                let answer = Greeting::read(&mut stream).filter(|g| g.index == i).ok_or_else(|| {
                    EngineError::Cluster(format!(
                        "process {i} at {address} did not answer this one's greeting as process {i} (is {address} process {i} of the same hosts file, and this process {me} in it?)"
                    ))
                })?;
                if let Some(why) = mine.mismatch(answer, address) {
                    return Err(EngineError::Cluster(why));
                }
                let _ = stream.set_read_timeout(None);
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
                    let _ = stream.set_read_timeout(Some(GREETING_WITHIN));
                    let greeting = Greeting::read(&mut stream);
                    match greeting.filter(|g| (me + 1..n).contains(&g.index) && after[g.index - me - 1].is_none()) {
                        Some(peer) => {
                            // Answered even when they differ, so that both name it.
                            stream.write_all(&mine.bytes()).map_err(|e| failed(format!("answering process {} at {from}", peer.index), e))?;
                            if let Some(why) = mine.mismatch(peer, &self.addresses[peer.index]) {
                                return Err(EngineError::Cluster(why));
                            }
                            let _ = stream.set_read_timeout(None);
                            after[peer.index - me - 1] = Some(stream);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes of one hosts file connecting at once: (workers,
    /// fingerprint) each; what each one's connect returned.
    fn connect_pair(first: (usize, u64), second: (usize, u64)) -> (Result<(), String>, Result<(), String>) {
        let addresses = Cluster::loopback(2).unwrap();
        let p0 = Cluster { workers: first.0, process: 0, addresses: addresses.clone() };
        let p1 = Cluster { workers: second.0, process: 1, addresses };
        let other = std::thread::spawn(move || p1.connect(second.1, Duration::from_secs(20)).map(|_| ()).map_err(|e| e.to_string()));
        let here = p0.connect(first.1, Duration::from_secs(20)).map(|_| ()).map_err(|e| e.to_string());
        (here, other.join().unwrap())
    }

    #[test]
    fn processes_of_one_program_and_workers_connect() {
        let (a, b) = connect_pair((2, 7), (2, 7));
        assert_eq!((a, b), (Ok(()), Ok(())));
    }

    /// Both processes fail, each naming the other and saying why.
    fn refused_both_ways(first: (usize, u64), second: (usize, u64), first_says: &str, second_says: &str) {
        let (a, b) = connect_pair(first, second);
        let (a, b) = (a.unwrap_err(), b.unwrap_err());
        assert!(a.contains("process 1 at") && a.contains(first_says), "{a}");
        assert!(b.contains("process 0 at") && b.contains(second_says), "{b}");
    }

    #[test]
    fn processes_that_loaded_other_rules_refuse_each_other_by_name() {
        refused_both_ways((1, 7), (1, 8), "loaded other rules", "loaded other rules");
    }

    #[test]
    fn processes_with_other_workers_refuse_each_other_by_name() {
        refused_both_ways((2, 7), (1, 7), "runs 1 worker(s), this one 2", "runs 2 worker(s), this one 1");
    }

    #[test]
    fn a_stranger_on_the_cluster_port_is_dropped_and_the_real_process_still_joins() {
        let addresses = Cluster::loopback(2).unwrap();
        let p0 = Cluster { workers: 1, process: 0, addresses: addresses.clone() };
        let p1 = Cluster { workers: 1, process: 1, addresses: addresses.clone() };
        let target = addresses[0].clone();
        let other = std::thread::spawn(move || {
            // A port scan, then a client that speaks first with junk, then the peer.
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut stranger = loop {
                match TcpStream::connect(&target) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(RETRY),
                    Err(e) => panic!("{e}"),
                }
            };
            stranger.write_all(b"GET / HTTP/1.0\r\n\r\n------------------").unwrap();
            drop(stranger);
            p1.connect(7, Duration::from_secs(20)).map(|_| ()).map_err(|e| e.to_string())
        });
        let here = p0.connect(7, Duration::from_secs(20)).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!((here, other.join().unwrap()), (Ok(()), Ok(())));
    }

    #[test]
    fn a_process_that_never_comes_is_named_at_the_deadline() {
        let addresses = Cluster::loopback(3).unwrap();
        let p0 = Cluster { workers: 1, process: 0, addresses: addresses.clone() };
        let e = p0.connect(7, Duration::from_millis(300)).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(&format!("process 1 at {}", addresses[1])) && e.contains(&format!("process 2 at {}", addresses[2])), "{e}");
    }

    #[test]
    fn the_fingerprint_follows_the_rules_text() {
        let load = |text: &str| ccattler_parser::check_str("a.rules", text).program.unwrap();
        let head = "input e(a: int, b: int) from \"e/{a}/{b}\"\noutput r(a: int, b: int) to \"r/{a}/{b}\"\n";
        let a = load(&format!("{head}r(a, b) :- e(a, b).\n"));
        let b = load(&format!("{head}r(a, b) :- e(a, b), a != 1.\n"));
        assert_eq!(fingerprint(&a), fingerprint(&load(&format!("{head}r(a, b) :- e(a, b).\n"))));
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }
}
