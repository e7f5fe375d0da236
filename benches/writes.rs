//! What a cluster writes to etcd when nothing happens, and under wandering
//! load: revisions per node per second, by what made them (issue #25's write
//! budget, ≤ 0.15 per node all told; usage ≤ 0.05 under ±20 % load).
//!
//! Real parts: the shared etcd of `scripts/test`, a `ccattler controller`,
//! NODES `ccattler agent` processes with the production TTL (30 s), and real
//! instance processes. Two phases of WINDOW seconds each, after a warm-up:
//! idle (instances that only sleep) and load (each instance's memory
//! wandering ±20 % every 5 s). Each revision in the window is read back from
//! a watch of every key and put in one class by the keys it changed.
//! Counting, not timing: run it in the test profile through the script that
//! starts etcd:
//!
//!     scripts/test -p ccattler --bench writes
//!
//! (`CCATTLER_WRITES_NODES`, `CCATTLER_WRITES_WINDOW` override 10 nodes and 120 s.)

#[allow(dead_code)]
#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use etcd_client::{Client, WatchOptions};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const SERVICES: usize = 10;
/// The agents' lease TTL: production's.
const TTL: &str = "--ttl=30";

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What made a revision, by the keys it changed (the first that applies).
fn class(keys: &[String]) -> &'static str {
    let any = |f: &dyn Fn(&str) -> bool| keys.iter().any(|k| f(k));
    if any(&|k| k == "status/clock") {
        "controller: clock"
    } else if any(&|k| k == "status/leader") {
        "controller: leadership"
    } else if any(&|k| !k.starts_with("observed/") && !k.starts_with("desired/") && !k.starts_with("intent/")) {
        "controller: derived state"
    } else if any(&|k| k.contains("/usage/")) {
        "agent: usage"
    } else if any(&|k| k.ends_with("/heartbeat")) {
        "agent: heartbeat"
    } else if any(&|k| k.starts_with("observed/")) {
        "agent: instance state"
    } else {
        "user"
    }
}

/// Revisions (and keys) per class seen by a watch of every key for `window`.
async fn count(etcd: &Client, window: Duration) -> (BTreeMap<&'static str, (u64, u64)>, u64) {
    let mut c = etcd.clone();
    let from = revision(&mut c).await + 1;
    let (_w, mut stream) = c.watch("", Some(WatchOptions::new().with_prefix().with_start_revision(from))).await.expect("watch");
    let mut by_rev: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    let end = Instant::now() + window;
    while let Ok(Ok(Some(resp))) = tokio::time::timeout_at(end.into(), stream.message()).await {
        for ev in resp.events() {
            if let Some(kv) = ev.kv() {
                by_rev.entry(kv.mod_revision()).or_default().push(String::from_utf8_lossy(kv.key()).into_owned());
            }
        }
    }
    let last = revision(&mut c).await;
    let mut classes: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    for keys in by_rev.values() {
        let e = classes.entry(class(keys)).or_default();
        e.0 += 1;
        e.1 += keys.len() as u64;
    }
    (classes, (last - from + 1).max(0) as u64)
}

fn report(phase: &str, nodes: usize, window: Duration, classes: &BTreeMap<&'static str, (u64, u64)>, revisions: u64) {
    let per = |n: u64| n as f64 / nodes as f64 / window.as_secs_f64();
    println!("\n{phase}: {nodes} nodes, {} instances, {:.0} s window, {revisions} revisions", nodes * SERVICES, window.as_secs_f64());
    println!("| what | revisions/s per node | keys/s per node |\n|---|---|---|");
    let mut agents = 0;
    for (c, (revs, keys)) in classes {
        println!("| {c} | {:.4} | {:.4} |", per(*revs), per(*keys));
        if c.starts_with("agent") {
            agents += revs;
        }
    }
    let cluster_wide = |c: &str| classes.get(c).map_or(0, |c| c.0) as f64 / window.as_secs_f64();
    let (clock, leader) = (cluster_wide("controller: clock"), cluster_wide("controller: leadership"));
    let derived = classes.get("controller: derived state").map_or(0, |c| c.0);
    // The clock and the leader key are writes for the whole cluster: at
    // 5,000 nodes each is shared by 5,000. (Derived state is counted as if
    // it grew with the nodes.)
    let at_5000 = per(agents) + per(derived) + (clock + leader) / 5000.0;
    println!("| all told, this cluster | {:.4} | |", per(revisions));
    println!("| all told at 5,000 nodes (clock {clock:.2}/s and leader key {leader:.2}/s shared by 5,000) | {at_5000:.4} | |");
}

async fn place(etcd: &mut Client, image: &str) {
    for s in 0..SERVICES {
        let svc = format!("svc-{s}");
        let k = |f: &str| format!("desired/service/{svc}/{f}");
        put_facts(etcd, &[(&k("image"), image), (&k("cpu"), "10"), (&k("memory"), "128")]).await;
    }
}

async fn running(etcd: &Client, n: usize, image: &str) {
    wait_for(&format!("{n} instances running {image}"), Duration::from_secs(300), || {
        let mut e = etcd.clone();
        let image = image.to_string();
        async move {
            let ks = keys(&mut e, "observed/node/").await;
            let running: Vec<&String> = ks.iter().filter(|(k, v)| k.ends_with("/state") && v == "running").map(|(k, _)| k).collect();
            let on_image = running.iter().filter(|k| ks.iter().any(|(k2, v)| *k2 == k.replace("/state", "/image") && *v == image)).count();
            on_image == n
        }
    })
    .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_or("CCATTLER_WRITES_NODES", 10) as usize;
    let window = Duration::from_secs(env_or("CCATTLER_WRITES_WINDOW", 120));
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("writes");
    // The wandering workload: its memory moves to a random 80–120 % of 40 MiB every 5 s.
    let dir = std::env::temp_dir().join(format!("ccattler-writes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wander = dir.join("wander.py");
    std::fs::write(&wander, "import random, time\nwhile True:\n    held = b'x' * int((40 << 20) * random.uniform(0.8, 1.2))\n    time.sleep(5)\n").unwrap();
    // As deployed: the default leader TTL (10 s; the tests' 2 s would count five times the leader's writes).
    let port = free_port();
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("controller-writes.log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["controller", "--rules", shipped_rules().to_str().unwrap(), "--id", "writes", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd", &etcd_url(), "--credentials", credentials().to_str().unwrap(), "--as", "controller"])
        .args(["--secret-key", secret_key().to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start controller");
    let c = Controller { child, port, log };
    let _agents: Vec<Agent> = (1..=nodes).map(|n| Agent::start(&root, n, 64000, 65536, &[TTL])).collect();
    ready_nodes(&etcd, nodes).await;
    place(&mut etcd, "exec:sleep 100000").await;
    for s in 0..SERVICES {
        etcd.put(format!("intent/user/service/svc-{s}/instances"), nodes.to_string(), None).await.unwrap();
    }
    let n = nodes * SERVICES;
    running(&etcd, n, "exec:sleep 100000").await;
    // Warm-up: the first usage figures, and the agents' first beats on the clock.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let (idle, revs) = count(&etcd, window).await;
    report("idle", nodes, window, &idle, revs);

    let image = format!("exec:python3 {}", wander.display());
    place(&mut etcd, &image).await;
    running(&etcd, n, &image).await;
    tokio::time::sleep(Duration::from_secs(40)).await;
    let (load, revs) = count(&etcd, window).await;
    report("load (every instance's memory ±20 % every 5 s)", nodes, window, &load, revs);
    let _ = std::fs::remove_dir_all(&dir);
    drop(c);
}
