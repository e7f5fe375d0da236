//! The live cluster against a real etcd holding the synthetic cluster
//! (agents simulated by writing their facts).
//!
//! `cargo bench -p ccattler-bridge --bench live -- --explain [--nodes N --services N --instances N]`
//!   explain any key of the converged cluster, and a why-not for an instance
//!   no node can take, two ways: from one snapshot (read + load + explain),
//!   and asked of a running controller (`GET /explain`, its warm engine).
//!
//! `cargo bench -p ccattler-bridge --bench live -- --placement [...]`
//!   nodes and services registered, then every service's instances requested
//!   at once: the time until every placement is committed (placements/s),
//!   beside raw etcd write throughput measured in the same run.
//!
//! Defaults: 5,000 nodes, 1,000 services, 150,000 instances. Medians of
//! `--repeat N` (default 5) where a measurement repeats.

use ccattler_bridge::controller::{self, ControllerConfig};
use ccattler_bridge::explain::snapshot_session;
use ccattler_engine::explain;
use ccattler_engine::synth::{self, Params};
use etcd_client::{EventType, GetOptions, WatchOptions};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;
use common::*;

fn rules() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../rules"))
}

fn median(mut xs: Vec<Duration>) -> f64 {
    xs.sort();
    xs[xs.len() / 2].as_secs_f64() * 1e3
}

/// A controller in this process, once it has settled on what etcd holds.
struct Running {
    port: u16,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), controller::ControllerError>>,
}

async fn start_controller(etcd: &Etcd) -> Running {
    let port = free_port();
    let cfg = ControllerConfig {
        etcd: etcd.config(),
        rules: vec![rules()],
        workers: ccattler_engine::default_workers(),
        cluster: None,
        max_txn_ops: 128,
        max_txn_bytes: 1 << 20,
        leader_ttl: 10,
        id: "bench".into(),
        listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        ui: None,
        secret_key: None,
        stall_bound: std::time::Duration::from_secs(600),
    };
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(controller::run_until(cfg, stop_rx));
    let rev = etcd.client().await.get("x", None).await.unwrap().header().unwrap().revision() as f64;
    wait("the controller to settle", || metric(port, "settled_revision").is_some_and(|s| s >= rev)).await;
    Running { port, stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The allocator the `ccattler` binary uses, so the numbers are its numbers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    ccattler_engine::disable_huge_pages();
    log_if_asked();
    let p = Params::from_args();
    let repeat: usize = synth::arg("--repeat").unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if std::env::args().any(|a| a == "--placement") {
        rt.block_on(placement(&p));
    } else {
        rt.block_on(explain_bench(&p, repeat));
    }
}

/// Nodes and services first; then every intent at once; then wait for every placement.
async fn placement(p: &Params) {
    let etcd = Etcd::start();
    let client = etcd.client().await;
    let facts = synth::unplaced(p);
    let (intents, rest): (Vec<_>, Vec<_>) = facts.into_iter().partition(|(k, _)| k.starts_with("intent/"));
    println!("placement: {p:?}: {} node and service facts, then {} intents", rest.len(), intents.len());
    raw_write(&client, &rest).await;
    let mut c = client.clone();
    let ctl = start_controller(&etcd).await;
    // What earlier writes left dirty in the page cache is flushed now, not
    // during the measurement (etcd's fsyncs would wait behind it).
    settle_disk();
    let before = c.get("x", None).await.unwrap().header().unwrap().revision();
    // Placements are counted as etcd streams them (as an agent would see
    // them), not by polling a range count, which would load etcd itself.
    let (_watcher, mut stream) = c.watch("placement/instance/", Some(WatchOptions::new().with_prefix().with_start_revision(before + 1))).await.unwrap();
    let t = Instant::now();
    raw_write(&client, &intents).await;
    let (mut placed, mut last) = (std::collections::HashSet::new(), before);
    while placed.len() < p.instances {
        let resp = stream.message().await.unwrap().expect("the watch stays open");
        for ev in resp.events() {
            if let (EventType::Put, Some(kv)) = (ev.event_type(), ev.kv()) {
                placed.insert(kv.key().to_vec());
                last = last.max(kv.mod_revision());
            }
        }
    }
    let took = t.elapsed().as_secs_f64();
    let placed = placed.len();
    // Every key the controller had written when the last placement was
    // committed (placements, the per-node view, instances, ...).
    let mut written = 0;
    for prefix in ["effective/", "placement/", "endpoint/", "status/"] {
        let opts = GetOptions::new().with_prefix().with_count_only().with_min_mod_revision(before + 1).with_max_mod_revision(last);
        written += c.get(prefix, Some(opts)).await.unwrap().count() as usize;
    }
    ctl.stop().await;
    // The raw baseline, in the same etcd: as many keys as the controller
    // wrote, shaped like placements, outside every prefix it reads.
    settle_disk();
    let sample: Vec<(String, String)> = (0..written).map(|i| (format!("bench/raw/instance/{i:08}"), synth::node_name(i % p.nodes))).collect();
    let raw = raw_write(&client, &sample).await;
    println!("raw etcd write ({} keys, 128-op txns, 8 in flight): {raw:.0} keys/s", sample.len());
    println!(
        "{placed} placements committed {took:.2} s after the intents: {:.0} placements/s; the controller wrote {written} keys by then: {:.0} keys/s = {:.0}% of raw",
        placed as f64 / took,
        written as f64 / took,
        100.0 * written as f64 / took / raw
    );
}

async fn explain_bench(p: &Params, repeat: usize) {
    let etcd = Etcd::start();
    let client = etcd.client().await;
    let mut facts = synth::cluster(p);
    // Two services no node can take: one asks for more cpu than any node
    // has (every node a candidate, none with room), one selects a label no
    // node has (no node a candidate, each ruled out by the rules).
    let (big, picky) = ("huge", "picky");
    facts.extend([
        (format!("desired/service/{big}/image"), "builtin:http".to_string()),
        (format!("desired/service/{big}/cpu"), (synth::NODE_CPU + 1).to_string()),
        (format!("intent/user/service/{big}/instances"), "1".to_string()),
        (format!("desired/service/{picky}/image"), "builtin:http".to_string()),
        (format!("desired/service/{picky}/selector/zone"), "nowhere".to_string()),
        (format!("intent/user/service/{picky}/instances"), "1".to_string()),
    ]);
    println!("explain: {p:?}, {} facts", facts.len());
    raw_write(&client, &facts).await;
    drop(facts);
    let program = controller::load_rules(&[rules()]).expect("rules");
    let questions = [
        (format!("placement/instance/{}-0", synth::service_name(p.services / 2)), false),
        (format!("effective/service/{}/instances", synth::service_name(7)), false),
        (format!("endpoint/service/{0}/{0}-1", synth::service_name(3)), false),
        (format!("placement/instance/{big}-0"), true),
        (format!("placement/instance/{picky}-0"), true),
    ];

    // One snapshot: read, load, explain.
    let t = Instant::now();
    let (session, rev, _) = snapshot_session(&etcd.config(), program.clone(), None).await.unwrap();
    let loaded = t.elapsed();
    println!("snapshot at revision {rev} read and loaded: {:.2} s", loaded.as_secs_f64());
    for (key, why_not) in &questions {
        let db = explain::Db::of_session(&session);
        let t = Instant::now();
        let e = explain::explain(&db, key, None, *why_not, explain::Options::default()).unwrap();
        let took = t.elapsed();
        assert_eq!(e.holds, !why_not, "{key}");
        println!(
            "  from the snapshot: {key}{}: {:.1} ms (+ {:.2} s snapshot)",
            if *why_not { " --why-not" } else { "" },
            took.as_secs_f64() * 1e3,
            loaded.as_secs_f64()
        );
    }
    drop(session);

    // A running controller's warm engine.
    let ctl = start_controller(&etcd).await;
    let port = ctl.port;
    for (key, why_not) in &questions {
        let path = format!("/explain?key={}&why_not={why_not}", ccattler_bridge::http::encode_query(key));
        let mut times = Vec::new();
        for _ in 0..repeat {
            let t = Instant::now();
            let (status, body) = ccattler_bridge::http::get("127.0.0.1", port, &path).await.expect("an answer");
            times.push(t.elapsed());
            assert!(status.is_success(), "{key}: {status} {}", String::from_utf8_lossy(&body));
        }
        println!("  asked of the controller: {key}{}: median {:.1} ms (n={repeat})", if *why_not { " --why-not" } else { "" }, median(times));
    }
    ctl.stop().await;
}
