//! The controller against a real etcd holding the synthetic cluster.
//!
//! `cargo bench -p ccattler-bridge --bench bridge [-- --nodes N --services N
//! --instances N --changes N --workers N]` (defaults 5,000 / 1,000 / 150,000 /
//! 100 / one engine worker per core, as `ccattler controller`).
//! Starts its own throwaway etcd (needs `etcd` on PATH) and reports, in one run:
//! raw etcd write throughput (128-op transactions, 8 in flight), the time to
//! merely read the snapshot, the controller's cold start beside it, its bulk
//! write-back throughput beside raw, and put → derived key committed p50/p99.

use ccattler_bridge::controller::{self, ControllerConfig};
use ccattler_bridge::etcd as e;
use ccattler_engine::synth::{self, Params};
use etcd_client::{EventType, WatchOptions};
use std::path::PathBuf;
use std::time::Instant;

mod common;
use common::*;

/// The allocator the `ccattler` binary uses, so the numbers are its numbers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    ccattler_engine::disable_huge_pages();
    log_if_asked();
    let p = Params::from_args();
    let changes: usize = synth::arg("--changes").unwrap_or(100);
    let workers: usize = synth::arg("--workers").unwrap_or_else(ccattler_engine::default_workers);
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
            max_txn_ops: 128,
            max_txn_bytes: 1 << 20,
            leader_ttl: 10,
            id: "bench".into(),
            listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
            ui: None,
            secret_key: None,
            stall_bound: std::time::Duration::from_secs(600),
        };
        settle_disk();
        let t = Instant::now();
        let ctl = tokio::spawn(controller::run_until(ccfg, stop_rx));
        wait("the first write-back", || metric(port, "keys_written_total").is_some_and(|k| k > 0.0)).await;
        let cold = t.elapsed();
        let start_rev = client.get("x", None).await.unwrap().header().unwrap().revision() as f64;
        // When the last key was committed (the written count's last rise),
        // and when the controller settled: it has seen its writes come back
        // through its watch, which etcd streams after the commits.
        let (mut written, mut committed) = (0.0, cold);
        wait("write-back to settle", || {
            let now = metric(port, "keys_written_total").unwrap_or(0.0);
            if now > written {
                (written, committed) = (now, t.elapsed());
            }
            metric(port, "settled_revision").is_some_and(|s| s >= start_rev)
        })
        .await;
        let settle = t.elapsed() - cold;
        let commit = committed - cold;
        println!(
            "controller cold start (snapshot + evaluate, to its first write): {:.2} s = {:.2}x the snapshot read",
            cold.as_secs_f64(),
            cold.as_secs_f64() / read.as_secs_f64()
        );
        println!(
            "bulk write-back: {written:.0} keys committed in {:.2} s = {:.0} keys/s = {:.0}% of raw; settled (its watch caught up) after {:.2} s = {:.0} keys/s",
            commit.as_secs_f64(),
            written / commit.as_secs_f64(),
            100.0 * written / commit.as_secs_f64() / raw,
            settle.as_secs_f64(),
            written / settle.as_secs_f64(),
        );

        let mut lat = Vec::new();
        for i in 0..changes {
            let svc = synth::service_name(i * 7 % p.services);
            let key = format!("effective/service/{svc}/image");
            let value = format!("img-{i}");
            let (_w, mut stream) = client.watch(key.as_str(), Some(WatchOptions::new())).await.unwrap();
            let t = Instant::now();
            client.put(format!("desired/service/{svc}/image"), value.as_str(), None).await.unwrap();
            'wait: while let Some(resp) = stream.message().await.unwrap() {
                for ev in resp.events() {
                    if ev.event_type() == EventType::Put && ev.kv().is_some_and(|kv| kv.value_str().ok() == Some(value.as_str())) {
                        break 'wait;
                    }
                }
            }
            lat.push(t.elapsed());
        }
        lat.sort();
        let pct = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
        println!("etcd put -> derived key committed: p50 {:.1} ms, p99 {:.1} ms (n={})", pct(0.5), pct(0.99), lat.len());
        let _ = stop_tx.send(true);
        let _ = ctl.await;
    });
    drop(etcd);
}
