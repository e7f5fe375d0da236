//! The stream a real cluster makes (issue #25): simulated agents at the
//! rates `benches/writes.rs` measured for real ones, plus user changes,
//! against a `ccattler controller` — one process, or a group of two
//! (`--hosts`) — for a while. Does it keep up?
//!
//!     cargo bench -p ccattler --bench sustained -- [--nodes 5000 --services 1000 --instances 150000]
//!         [--minutes 5] [--changes 200] [--flips 25] [--processes 1,2]
//!
//! Its own etcd (no auth), loaded with the synthetic converged cluster
//! (`ccattler_engine::synth`); the controller as a child process with the
//! default leader TTL, settled before the load starts. Then, for `--minutes`:
//!
//! * every node beats every 10 s (a 30 s TTL / 3) with the cluster clock it
//!   last read (`observed/node/N/heartbeat`), one put each, as its agent does;
//! * every node's per-service usage (`observed/node/N/usage/S/{cpu,memory}`)
//!   passes its dead band once per 30 s on average (0.033 writes/s per node,
//!   the `writes` bench under ±20 % load);
//! * `--flips` instances a second, cluster-wide, turn unready or ready again
//!   (`…/instance/I/health` and `…/probe_state/I/readiness` in one txn);
//! * users make `--changes` changes a second: a service's
//!   `intent/user/service/S/instances` one up or back down (round robin over
//!   the services), each a placement or a removal.
//!
//! Reported per run: put → `effective/service/S/instances` committed p50 /
//! p99 / max, the controller's watch lag (etcd's head revision − the revision
//! it applied, sampled every second) p50 / p99 / max, its CPU (cores, over the
//! load window) and peak RSS, per process. `CCATTLER_BENCH_LOG=FILE` keeps the
//! leading controller's log (`CCATTLER_LOG` sets its level).

#[allow(dead_code)]
#[path = "../bridge/benches/common/mod.rs"]
mod common;

use ccattler_engine::synth::{self, Params};
use common::*;
use etcd_client::{Client, Txn, TxnOp, WatchOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rules() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/rules"))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `/proc/PID/stat`'s user + system time in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat: 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Each process's resident MiB now, joined by " + ".
fn rss_now(pids: &[u32]) -> String {
    pids.iter().map(|&p| format!("{:.0}", status_mib(p, "VmRSS"))).collect::<Vec<_>>().join(" + ")
}

/// A `/proc/PID/status` figure in MiB (`VmHWM`: peak RSS, `VmRSS`: now).
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The controller: one process, or a group of `processes` (one worker each).
struct Controllers {
    children: Vec<Child>,
    port: u16,
    _hosts: Option<PathBuf>,
}

/// The leading controller's log: to `CCATTLER_BENCH_LOG` if set (with
/// `CCATTLER_LOG=ccattler_bridge=debug`, each evaluation's time), else dropped.
fn log_to() -> Stdio {
    match std::env::var_os("CCATTLER_BENCH_LOG") {
        Some(path) => std::fs::File::create(&path).map(Stdio::from).unwrap_or_else(|e| panic!("CCATTLER_BENCH_LOG={}: {e}", PathBuf::from(path).display())),
        None => Stdio::null(),
    }
}

impl Controllers {
    fn start(url: &str, processes: usize) -> Controllers {
        let port = free_port();
        let exe = env!("CARGO_BIN_EXE_ccattler");
        let lead = |extra: &[String]| {
            Command::new(exe)
                .args(["controller", "--rules", rules().to_str().unwrap(), "--etcd", url, "--id", "bench"])
                .args(["--listen", &format!("127.0.0.1:{port}"), "--stall-bound", "3600"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(log_to())
                .spawn()
                .expect("start the controller")
        };
        if processes <= 1 {
            return Controllers { children: vec![lead(&[])], port, _hosts: None };
        }
        let hosts = std::env::temp_dir().join(format!("ccattler-sustained-{}.hosts", std::process::id()));
        std::fs::write(&hosts, (0..processes).map(|_| format!("127.0.0.1:{}\n", free_port())).collect::<String>()).unwrap();
        let group = |i: usize| vec!["--hosts".into(), hosts.display().to_string(), "--process".into(), i.to_string(), "--workers".into(), "1".into()];
        let mut children = vec![lead(&group(0))];
        for i in 1..processes {
            children.push(
                Command::new(exe)
                    .args(["controller", "--rules", rules().to_str().unwrap()])
                    .args(group(i))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start a group process"),
            );
        }
        Controllers { children, port, _hosts: Some(hosts) }
    }

    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn head(client: &mut Client) -> i64 {
    client.get("x", None).await.map(|r| r.header().map_or(0, |h| h.revision())).unwrap_or(0)
}

/// Keeps up to `at_once` puts in flight; returns how many failed.
async fn put_all(client: &Client, ops: Vec<Vec<TxnOp>>, at_once: usize) -> usize {
    let mut set = tokio::task::JoinSet::new();
    let mut failed = 0;
    for op in ops {
        while set.len() >= at_once {
            if !matches!(set.join_next().await, Some(Ok(true))) {
                failed += 1;
            }
        }
        let mut c = client.clone();
        set.spawn(async move { c.txn(Txn::new().and_then(op)).await.is_ok() });
    }
    while let Some(r) = set.join_next().await {
        if !matches!(r, Ok(true)) {
            failed += 1;
        }
    }
    failed
}

struct Outcome {
    latencies_ms: Vec<f64>,
    lags: Vec<f64>,
    cpu_cores: Vec<f64>,
    peak_rss_mib: Vec<f64>,
    writes: BTreeMap<&'static str, u64>,
    unanswered: usize,
    failed: usize,
}

async fn run(p: &Params, etcd: &Etcd, lay: &synth::Layout, processes: usize, window: Duration, changes: f64, flips: f64) -> Outcome {
    let mut client = etcd.client().await;
    let t = Instant::now();
    let c = Controllers::start(&etcd.url, processes);
    let at = head(&mut client).await as f64;
    wait("the controller to lead and settle", || metric(c.port, "leader") == Some(1.0) && metric(c.port, "settled_revision").is_some_and(|s| s >= at)).await;
    println!("  settled on {} facts in {:.1} s", metric(c.port, "facts_held").unwrap_or(0.0), t.elapsed().as_secs_f64());
    println!("  RSS once settled: {} MiB", rss_now(&c.pids()));

    let stop = Arc::new(AtomicBool::new(false));
    let clock = Arc::new(AtomicI64::new(synth::SYNTH_CLOCK));
    let writes: Arc<Mutex<BTreeMap<&'static str, u64>>> = Arc::default();
    let failed = Arc::new(AtomicI64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    // The clock the agents read (they read it with every beat).
    {
        let (stop, clock, mut cl) = (stop.clone(), clock.clone(), client.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = cl.get("status/clock", None).await {
                    if let Some(v) = r.kvs().first().and_then(|kv| kv.value_str().ok()?.parse().ok()) {
                        clock.store(v, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    // The agents' writes, paced in 100 ms slices: `per_second` of the kind
    // `synth::Agents` makes, as single puts (or small txns) with a few in flight.
    let kinds: Vec<(&'static str, f64)> = vec![("heartbeat", p.nodes as f64 / 10.0), ("usage", p.nodes as f64 / 30.0), ("readiness flip", flips)];
    for (what, per_second) in kinds {
        let (stop, clock, writes, failed, cl) = (stop.clone(), clock.clone(), writes.clone(), failed.clone(), client.clone());
        let lay = lay.clone();
        tasks.spawn(async move {
            let mut agents = synth::Agents::new(lay, 0x9e37_79b9_7f4a_7c15 ^ what.len() as u64);
            let mut owed = 0.0f64;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                owed += per_second / 10.0;
                let mut ops = Vec::new();
                while owed >= 1.0 {
                    owed -= 1.0;
                    let put = |(k, v): (String, String)| TxnOp::put(k, v, None);
                    let op = match what {
                        "heartbeat" => vec![put(agents.beat(clock.load(Ordering::Relaxed)))],
                        "usage" => {
                            let Some(usage) = agents.usage() else { continue };
                            vec![put(usage)]
                        }
                        _ => agents.flip().into_iter().map(put).collect(),
                    };
                    ops.push(op);
                }
                let n = ops.len() as u64;
                failed.fetch_add(put_all(&cl, ops, 16).await as i64, Ordering::Relaxed);
                *writes.lock().unwrap().entry(what).or_default() += n;
            }
        });
    }
    // Users: a service's instances one up, later back down, and when each
    // change's derived key was committed (seen by a watch).
    let pending: Arc<Mutex<BTreeMap<String, (String, Instant)>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let from = head(&mut client).await + 1;
    let (_watcher, mut stream) =
        client.watch("effective/service/", Some(WatchOptions::new().with_prefix().with_start_revision(from))).await.expect("watch effective/service/");
    {
        let (pending, latencies) = (pending.clone(), latencies.clone());
        tasks.spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let Some(service) = key.strip_prefix("effective/service/").and_then(|r| r.strip_suffix("/instances")) else { continue };
                    let mut p = pending.lock().unwrap();
                    if p.get(service).is_some_and(|(want, _)| want.as_bytes() == kv.value()) {
                        let (_, at) = p.remove(service).expect("just seen");
                        latencies.lock().unwrap().push(at.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
        });
    }
    {
        let (stop, pending, writes, failed, cl) = (stop.clone(), pending.clone(), writes.clone(), failed.clone(), client.clone());
        let counts: Vec<usize> = (0..p.services).map(|s| synth::instances_of(p, s)).collect();
        tasks.spawn(async move {
            let mut up = vec![false; counts.len()];
            let (mut s, mut owed) = (0usize, 0.0f64);
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                owed += changes / 10.0;
                let mut set = tokio::task::JoinSet::new();
                while owed >= 1.0 {
                    owed -= 1.0;
                    s = (s + 1) % counts.len();
                    let service = synth::service_name(s);
                    // A service still waiting for its last change is skipped this round.
                    if pending.lock().unwrap().contains_key(&service) {
                        continue;
                    }
                    up[s] = !up[s];
                    let want = (counts[s] + usize::from(up[s])).to_string();
                    pending.lock().unwrap().insert(service.clone(), (want.clone(), Instant::now()));
                    let mut c = cl.clone();
                    set.spawn(async move { c.put(format!("intent/user/service/{service}/instances"), want, None).await.is_ok() });
                }
                let mut n = 0;
                while let Some(ok) = set.join_next().await {
                    n += 1;
                    if !matches!(ok, Ok(true)) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                *writes.lock().unwrap().entry("user: instances ±1").or_default() += n;
            }
        });
    }
    // The controller's lag and CPU over the window.
    let pids = c.pids();
    let cpu_before: Vec<f64> = pids.iter().map(|&p| cpu_seconds(p)).collect();
    let started = Instant::now();
    let mut lags = Vec::new();
    while started.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let h = head(&mut client).await as f64;
        if let Some(applied) = metric(c.port, "revision") {
            lags.push((h - applied).max(0.0));
        }
    }
    let cpu_cores: Vec<f64> = pids.iter().zip(&cpu_before).map(|(&p, before)| (cpu_seconds(p) - before) / started.elapsed().as_secs_f64()).collect();
    let peak_rss_mib: Vec<f64> = pids.iter().map(|&p| status_mib(p, "VmHWM")).collect();
    println!("  RSS at the end of the load: {} MiB", rss_now(&pids));
    stop.store(true, Ordering::Relaxed);
    // The last changes get a while to land, then whatever is still pending is counted.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pending.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tasks.abort_all();
    let unanswered = pending.lock().unwrap().len();
    let mut latencies_ms = latencies.lock().unwrap().clone();
    latencies_ms.sort_by(f64::total_cmp);
    lags.sort_by(f64::total_cmp);
    let writes = writes.lock().unwrap().clone();
    drop(c);
    Outcome { latencies_ms, lags, cpu_cores, peak_rss_mib, writes, unanswered, failed: failed.load(Ordering::Relaxed) as usize }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let p = Params::from_args();
    let window = Duration::from_secs_f64(synth::arg::<f64>("--minutes").unwrap_or(5.0) * 60.0);
    let changes: f64 = synth::arg("--changes").unwrap_or(200.0);
    let flips: f64 = synth::arg("--flips").unwrap_or(25.0);
    let runs: Vec<usize> = synth::arg::<String>("--processes").unwrap_or_else(|| "1,2".into()).split(',').filter_map(|n| n.parse().ok()).collect();
    println!("cluster: {p:?}; load for {:.0} s: {changes} user changes/s, {flips} readiness flips/s, agents' beats and usage", window.as_secs_f64());
    let etcd = Etcd::start();
    let client = etcd.client().await;
    let facts = synth::cluster(&p);
    let lay = synth::layout(p.nodes, &facts);
    let raw = raw_write(&client, &facts).await;
    println!("{} facts loaded ({raw:.0} keys/s)", facts.len());
    drop(facts);
    let mut rows = Vec::new();
    for processes in runs {
        println!("run: {processes} process(es)");
        let o = run(&p, &etcd, &lay, processes, window, changes, flips).await;
        let per_s = |n: u64| n as f64 / window.as_secs_f64();
        for (what, n) in &o.writes {
            println!("  {what}: {:.0} writes/s", per_s(*n));
        }
        rows.push((processes, o));
    }
    println!("\n| controller | put → derived p50 / p99 / max | changes unanswered | watch lag (revisions) p50 / p99 / max | CPU (cores) | peak RSS | writes failed |");
    println!("|---|---|---|---|---|---|---|");
    for (processes, o) in &rows {
        let l = &o.latencies_ms;
        let per = |xs: &[f64], f: &dyn Fn(f64) -> String| xs.iter().map(|x| f(*x)).collect::<Vec<_>>().join(" + ");
        println!(
            "| {} | {:.0} / {:.0} / {:.0} ms ({} changes) | {} | {:.0} / {:.0} / {:.0} | {} | {} MiB | {} |",
            if *processes == 1 { "one process, 2 workers".to_string() } else { format!("group of {processes}, 1 worker each") },
            pct(l, 0.5),
            pct(l, 0.99),
            l.last().copied().unwrap_or(f64::NAN),
            l.len(),
            o.unanswered,
            pct(&o.lags, 0.5),
            pct(&o.lags, 0.99),
            o.lags.last().copied().unwrap_or(f64::NAN),
            per(&o.cpu_cores, &|c| format!("{c:.2}")),
            per(&o.peak_rss_mib, &|m| format!("{m:.0}")),
            o.failed,
        );
    }
}
