//! Shared by the bridge benchmarks: a throwaway etcd of their own, raw write
//! throughput, and reading a controller's metrics.
#![allow(dead_code)]

use ccattler_bridge::etcd::{self as e, EtcdConfig};
use etcd_client::{Client, Txn, TxnOp};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The controller's logs on stderr when `RUST_LOG` is set (e.g. `RUST_LOG=info`
/// shows where a cold start's time goes).
pub fn log_if_asked() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn metric(port: u16, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines().find_map(|l| l.strip_prefix(&format!("ccattler_{name} "))).and_then(|v| v.trim().parse().ok())
}

pub async fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(1800);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes facts in 128-op transactions with 8 in flight; returns keys/s.
pub async fn raw_write(client: &Client, facts: &[(String, String)]) -> f64 {
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

/// Flushes the page cache to disk (`sync`), so a measurement does not pay
/// for the writes before it.
pub fn settle_disk() {
    let _ = Command::new("sync").status();
}

/// A throwaway etcd (8 GiB quota), stopped and removed on drop.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    pub url: String,
}

impl Etcd {
    pub fn start() -> Etcd {
        // (A bench may run two at once: each its own directory.)
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ccattler-bench-etcd-{}-{n}", std::process::id()));
        let (cport, pport) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{cport}");
        let peer = format!("http://127.0.0.1:{pport}");
        let child = Command::new("etcd")
            .args(["--name", "bench", "--data-dir", dir.join("data").to_str().unwrap(), "--quota-backend-bytes", "8589934592"])
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer, "--initial-cluster", &format!("bench={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (is it installed?)");
        Etcd { child, dir, url }
    }

    pub fn config(&self) -> EtcdConfig {
        EtcdConfig { endpoints: vec![self.url.clone()], ..EtcdConfig::default() }
    }

    /// A client, once etcd answers.
    pub async fn client(&self) -> Client {
        loop {
            if let Ok(mut c) = e::connect(&self.config()).await {
                if c.get("x", None).await.is_ok() {
                    return c;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
