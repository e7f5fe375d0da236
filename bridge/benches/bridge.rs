//! The controller against a real etcd holding the synthetic cluster.
//!
//! `cargo bench -p ccattler-bridge --bench bridge [-- --nodes N --services N
//! --instances N --changes N --workers N]` (defaults 5,000 / 1,000 / 150,000 /
//! 100 / one engine worker per core, as `ccattler controller`).
//! Starts its own throwaway etcd (needs `etcd` on PATH) and reports, in one run:
//! raw etcd write throughput (128-op transactions, 8 in flight), the time to
//! merely read the snapshot, the controller's cold start beside it, its bulk
//! write-back throughput beside raw, put → derived key committed p50/p99 for
//! an image change and for an intent change (scale up by one), and
//! last raw etcd writing the same derived keys into a twin etcd that holds
//! the same input (etcd's throughput at the size the write-back met).
//! With `--console`, the controller also serves the web console and headless
//! Chromium (Debian's `chromium`, `chromium-driver`) measures, in the page,
//! the time to its first painted state and from a put to the page showing it.

use ccattler_bridge::controller::{self, ControllerConfig};
use ccattler_bridge::etcd as e;
use ccattler_engine::synth::{self, Params};
use etcd_client::{EventType, WatchOptions};
use std::path::PathBuf;
use std::time::Instant;

mod common;
use common::*;
#[path = "../../tests/common/webdriver.rs"]
mod webdriver;

/// The allocator the `ccattler` binary uses, so the numbers are its numbers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    ccattler_engine::disable_huge_pages();
    log_if_asked();
    let p = Params::from_args();
    let changes: usize = synth::arg("--changes").unwrap_or(100);
    let workers: usize = synth::arg("--workers").unwrap_or_else(ccattler_engine::default_workers);
    let console = std::env::args().any(|a| a == "--console");
    let rules = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../rules"));
    let etcd = Etcd::start();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = etcd.config();
        let mut client = etcd.client().await;
        let facts = synth::cluster(&p);
        println!("cluster: {p:?}, {} input facts", facts.len());
        let raw = raw_write(&client, &facts).await;
        println!("raw etcd write (128-op txns, 8 in flight): {raw:.0} keys/s");

        let program = controller::load_rules(std::slice::from_ref(&rules)).expect("rules");
        settle_disk();
        let t = Instant::now();
        let (_, snap) = e::snapshot(&mut client, &controller::prefixes(&program), 5000).await.unwrap();
        let read = t.elapsed();
        println!("snapshot read alone: {:.2} s ({} keys)", read.as_secs_f64(), snap.len());
        drop(snap);

        let port = free_port();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let ccfg = ControllerConfig {
            etcd: cfg.clone(),
            rules: vec![rules.clone()],
            workers,
            cluster: None,
            max_txn_ops: 128,
            max_txn_bytes: 1 << 20,
            leader_ttl: 10,
            id: "bench".into(),
            listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
            ui: console.then(Vec::new),
            secret_key: None,
            stall_bound: std::time::Duration::from_secs(600),
        };
        settle_disk();
        let t = Instant::now();
        let ctl = tokio::spawn(controller::run_until(ccfg, stop_rx));
        wait("the first write-back", || metric(port, "keys_written_total").is_some_and(|k| k > 0.0)).await;
        let cold = t.elapsed();
        let start_rev = client.get("x", None).await.unwrap().header().unwrap().revision() as f64;
        // Each rise of the written count, and when the controller settled:
        // it has seen its writes come back through its watch, applied them
        // (the rules read some of what they write: placements) and found
        // nothing more to write.
        let mut rises: Vec<(std::time::Duration, f64)> = Vec::new();
        wait("write-back to settle", || {
            let now = metric(port, "keys_written_total").unwrap_or(0.0);
            if rises.last().is_none_or(|(_, w)| now > *w) {
                rises.push((t.elapsed(), now));
            }
            metric(port, "settled_revision").is_some_and(|s| s >= start_rev)
        })
        .await;
        let settle = t.elapsed() - cold;
        println!(
            "controller cold start (snapshot + evaluate, to its first write): {:.2} s = {:.2}x the snapshot read",
            cold.as_secs_f64(),
            cold.as_secs_f64() / read.as_secs_f64()
        );
        // The bulk: the first pass, up to the first pause of a second or
        // more between commits (then the controller applies its writes'
        // echo before it plans again).
        let pause = rises.windows(2).position(|w| w[1].0 - w[0].0 >= std::time::Duration::from_secs(1)).unwrap_or(rises.len() - 1);
        let (bulk_end, bulk) = rises[pause];
        let commit = bulk_end - cold;
        let written = rises.last().map_or(0.0, |r| r.1);
        let write_back_rate = bulk / commit.as_secs_f64();
        println!(
            "bulk write-back (its first pass): {bulk:.0} keys committed in {:.2} s = {write_back_rate:.0} keys/s = {:.0}% of raw; settled after {:.2} s ({:.0} keys written in all: it applied its writes' echo and wrote what the rules derive from them)",
            commit.as_secs_f64(),
            100.0 * write_back_rate / raw,
            settle.as_secs_f64(),
            written,
        );
        println!("this process (the controller and the bench's copy of the input) once settled: peak RSS {} MiB", peak_rss_kib() / 1024);

        let mut images = Vec::new();
        for i in 0..changes {
            let svc = synth::service_name(i * 7 % p.services);
            let value = format!("img-{i}");
            images.push(put_to_derived(&mut client, &format!("desired/service/{svc}/image"), &value, &format!("effective/service/{svc}/image"), &value).await);
        }
        report("etcd put -> derived key committed, an image change (a rollout starts)", images);
        // A writer's intent above the others': the service's instance count
        // moves, and the derived key waits for its revision's whole
        // evaluation (the new instance's placement included).
        let mut intents = Vec::new();
        for i in 0..changes {
            let svc = synth::service_name((i * 11 + 3) % p.services);
            let effective = format!("effective/service/{svc}/instances");
            let now = client.get(effective.as_str(), None).await.unwrap().kvs().first().map_or(0, |kv| kv.value_str().unwrap().parse::<i64>().unwrap());
            let value = (now + 1).to_string();
            intents.push(put_to_derived(&mut client, &format!("intent/user/service/{svc}/instances"), &value, &effective, &value).await);
        }
        report("etcd put -> derived key committed, an intent change (scale up by one)", intents);
        if console {
            measure_console(&mut client, port, &p).await;
        }
        let _ = stop_tx.send(true);
        let _ = ctl.await;

        // The same derived keys written raw into a twin etcd that holds the
        // same input: etcd's own throughput at the size and state the
        // write-back met, beside the raw line above (into an empty etcd).
        let inputs: std::collections::HashSet<&str> = facts.iter().map(|(k, _)| k.as_str()).collect();
        let (_, held) = e::snapshot(&mut client, &controller::prefixes(&program), 5000).await.unwrap();
        let derived: Vec<(String, String)> =
            held.into_iter().filter(|(k, _)| !inputs.contains(k.as_str()) && k != "status/derived_revision").map(|(k, h)| (k, h.value)).collect();
        drop(inputs);
        let twin = Etcd::start();
        let twin_client = twin.client().await;
        let again = raw_write(&twin_client, &facts).await;
        settle_disk();
        let same = raw_write(&twin_client, &derived).await;
        println!(
            "raw etcd write of the same {} derived keys into a twin etcd holding the same input: {same:.0} keys/s (its input went in at {again:.0} keys/s); the write-back was {:.0}% of it",
            derived.len(),
            100.0 * write_back_rate / same
        );
        drop(twin);
    });
    drop(etcd);
}

/// Puts `key = value` and waits for `derived` to be committed with `want`
/// (watched before the put): the time between.
async fn put_to_derived(client: &mut etcd_client::Client, key: &str, value: &str, derived: &str, want: &str) -> std::time::Duration {
    let (_w, mut stream) = client.watch(derived, Some(WatchOptions::new())).await.unwrap();
    let t = Instant::now();
    client.put(key, value, None).await.unwrap();
    while let Some(resp) = stream.message().await.unwrap() {
        for ev in resp.events() {
            if ev.event_type() == EventType::Put && ev.kv().is_some_and(|kv| kv.value_str().ok() == Some(want)) {
                return t.elapsed();
            }
        }
    }
    panic!("the watch of {derived} ended");
}

/// p50, p99 and the three slowest samples, by index (to match against the
/// controller's debug log).
fn report(what: &str, mut lat: Vec<std::time::Duration>) {
    let mut by_size: Vec<(usize, std::time::Duration)> = lat.iter().copied().enumerate().collect();
    by_size.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    let slowest: Vec<String> = by_size.iter().take(3).map(|(i, d)| format!("#{i} {:.1} ms", d.as_secs_f64() * 1e3)).collect();
    lat.sort();
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    println!("{what}: p50 {:.1} ms, p99 {:.1} ms (n={}; slowest {})", pct(0.5), pct(0.99), lat.len(), slowest.join(", "));
}

/// The process's peak resident memory so far (`VmHWM`), KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

/// The console at this size, measured in the browser: navigation to the
/// first painted state, and a scale-up put to the page showing its revision
/// (the console recounts at most every second, so that is in it).
async fn measure_console(client: &mut etcd_client::Client, port: u16, p: &Params) {
    let root = std::env::temp_dir().join(format!("ccattler-console-bench-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let browser = webdriver::Browser::start(&root);
    let mut firsts = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        browser.open(&format!("http://127.0.0.1:{port}/ui#nodes"), None);
        browser.wait_for("the first state", std::time::Duration::from_secs(300), || browser.eval("return String(window.ccattlerTiming?.first ?? '')") != "");
        let wall = t.elapsed();
        let first: f64 = browser.eval("return String(window.ccattlerTiming.first)").parse().unwrap();
        firsts.push((first, wall));
        browser.open("about:blank", None);
    }
    browser.open(&format!("http://127.0.0.1:{port}/ui#services"), None);
    browser.wait_for("the first state", std::time::Duration::from_secs(300), || browser.eval("return String(window.ccattlerTiming?.first ?? '')") != "");
    let mut live = Vec::new();
    for i in 0..20 {
        let svc = synth::service_name(i * 11 % p.services);
        let key = format!("intent/user/service/{svc}/instances");
        let now = client.get(key.as_str(), None).await.unwrap().kvs().first().map(|kv| kv.value_str().unwrap().parse::<i64>().unwrap()).unwrap_or(0);
        let t = Instant::now();
        let rev = client.put(key.as_str(), (now + 1).to_string(), None).await.unwrap().header().unwrap().revision();
        browser.wait_for("the put on the page", std::time::Duration::from_secs(300), || {
            browser.eval("return String(window.ccattlerTiming.revision)").parse::<i64>().is_ok_and(|r| r >= rev)
        });
        live.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let applied: Vec<f64> = serde_json::from_str(&browser.eval("return JSON.stringify(window.ccattlerTiming.applied)")).unwrap();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let resources = browser.eval("return String(performance.getEntriesByType('resource').length)");
    println!(
        "console at this size: first state painted p50 {:.0} ms after navigation (wall {:.0} ms; {} runs); put -> page shows it p50 {:.0} ms, max {:.0} ms (n={}); one state from arrival to paint p50 {:.0} ms, max {:.0} ms; {resources} resources fetched",
        median(firsts.iter().map(|f| f.0).collect()),
        median(firsts.iter().map(|f| f.1.as_secs_f64() * 1e3).collect()),
        firsts.len(),
        median(live.clone()),
        live.iter().cloned().fold(0.0, f64::max),
        live.len(),
        median(applied.clone()),
        applied.iter().cloned().fold(0.0, f64::max),
    );
    let _ = std::fs::remove_dir_all(&root);
}
