//! The controller against a real etcd holding the synthetic cluster.
//!
//! `cargo bench -p ccattler-bridge --bench bridge [-- --nodes N --services N
//! --instances N --changes N]` (defaults 5,000 / 1,000 / 150,000 / 100).
//! Starts its own throwaway etcd (needs `etcd` on PATH) and reports, in one run:
//! raw etcd write throughput (128-op transactions, 8 in flight), the time to
//! merely read the snapshot, the controller's cold start beside it, its bulk
//! write-back throughput beside raw, and put → derived key committed p50/p99.

use ccattler_bridge::controller::{self, ControllerConfig};
use ccattler_bridge::etcd::{self as e, EtcdConfig};
use ccattler_engine::synth::{self, Params};
use etcd_client::{Client, EventType, Txn, TxnOp, WatchOptions};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn metric(port: u16, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines().find_map(|l| l.strip_prefix(&format!("ccattler_{name} "))).and_then(|v| v.trim().parse().ok())
}

async fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(1800);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes facts in 128-op transactions with 8 in flight; returns keys/s.
async fn raw_write(client: &Client, facts: &[(String, String)]) -> f64 {
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for chunk in facts.chunks(128) {
        if set.len() >= 8 {
            set.join_next().await.unwrap().unwrap();
        }
        let mut c = client.clone();
        let ops: Vec<TxnOp> = chunk.iter().map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None)).collect();
        set.spawn(async move {
            c.txn(Txn::new().and_then(ops)).await.expect("txn");
        });
    }
    while set.join_next().await.is_some() {}
    facts.len() as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let p = Params::from_args();
    let changes: usize = synth::arg("--changes").unwrap_or(100);
    let rules = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../rules"));
    let dir = std::env::temp_dir().join(format!("ccattler-bench-etcd-{}", std::process::id()));
    let (cport, pport) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{cport}");
    let peer = format!("http://127.0.0.1:{pport}");
    let mut etcd = Command::new("etcd")
        .args(["--name", "bench", "--data-dir", dir.join("data").to_str().unwrap(), "--quota-backend-bytes", "8589934592"])
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer, "--initial-cluster", &format!("bench={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd (is it installed?)");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = EtcdConfig { endpoints: vec![url.clone()], ..EtcdConfig::default() };
        let mut client = loop {
            if let Ok(mut c) = e::connect(&cfg).await {
                if c.get("x", None).await.is_ok() {
                    break c;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let facts = synth::cluster(&p);
        println!("cluster: {p:?}, {} input facts", facts.len());
        let raw = raw_write(&client, &facts).await;
        println!("raw etcd write (128-op txns, 8 in flight): {raw:.0} keys/s");

        let program = controller::load_rules(&rules).expect("rules");
        let t = Instant::now();
        let (_, snap) = e::snapshot(&mut client, &controller::prefixes(&program), 5000).await.unwrap();
        let read = t.elapsed();
        println!("snapshot read alone: {:.2} s ({} keys)", read.as_secs_f64(), snap.len());
        drop(snap);

        let port = free_port();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let ccfg = ControllerConfig {
            etcd: cfg.clone(),
            rules: rules.clone(),
            workers: 1,
            max_txn_ops: 128,
            leader_ttl: 10,
            id: "bench".into(),
            listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        };
        let t = Instant::now();
        let ctl = tokio::spawn(controller::run_until(ccfg, stop_rx));
        wait("the first write-back", || metric(port, "keys_written_total").is_some_and(|k| k > 0.0)).await;
        let cold = t.elapsed();
        let start_rev = client.get("x", None).await.unwrap().header().unwrap().revision() as f64;
        wait("write-back to settle", || metric(port, "settled_revision").is_some_and(|s| s >= start_rev)).await;
        let written = metric(port, "keys_written_total").unwrap_or(0.0);
        let settle = t.elapsed() - cold;
        println!(
            "controller cold start (snapshot + evaluate, to its first write): {:.2} s = {:.1}x the snapshot read",
            cold.as_secs_f64(),
            cold.as_secs_f64() / read.as_secs_f64()
        );
        println!(
            "bulk write-back: {written:.0} keys in {:.2} s = {:.0} keys/s = {:.0}% of raw",
            settle.as_secs_f64(),
            written / settle.as_secs_f64(),
            100.0 * written / settle.as_secs_f64() / raw
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
    let _ = etcd.kill();
    let _ = etcd.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
