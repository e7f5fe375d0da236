//! Helpers shared by the end-to-end tests: the real etcd that `scripts/test`
//! starts (CCATTLER_ETCD), real `ccattler` child processes, and waiting for
//! a condition with a deadline.
#![allow(dead_code)]

use etcd_client::{Client, DeleteOptions, GetOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn etcd_url() -> String {
    std::env::var("CCATTLER_ETCD").expect("CCATTLER_ETCD is set by scripts/test; run the tests through it")
}

/// A client on an empty store.
pub async fn fresh_etcd() -> Client {
    let mut c = Client::connect([etcd_url()], None).await.expect("connect to etcd");
    c.delete("\0", Some(DeleteOptions::new().with_from_key())).await.expect("wipe");
    c
}

pub async fn get(c: &mut Client, key: &str) -> Option<String> {
    let r = c.get(key, None).await.expect("get");
    r.kvs().first().map(|kv| kv.value_str().unwrap().to_string())
}

pub async fn revision(c: &mut Client) -> i64 {
    c.get("\0", None).await.expect("get").header().unwrap().revision()
}

pub async fn keys(c: &mut Client, prefix: &str) -> Vec<(String, String)> {
    let r = c.get(prefix, Some(GetOptions::new().with_prefix())).await.expect("get");
    r.kvs().iter().map(|kv| (kv.key_str().unwrap().to_string(), kv.value_str().unwrap().to_string())).collect()
}

/// Polls `cond` until it holds or the deadline passes.
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {within:?} waiting for: {what}");
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An empty directory of a test's own under the target dir (emptied if a
/// previous run left it).
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn shipped_rules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules")
}

/// A `ccattler controller` child process, killed on drop.
pub struct Controller {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Controller {
    pub fn start(id: &str, rules: &Path) -> Controller {
        let port = free_port();
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("controller-{id}-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["controller", "--rules", rules.to_str().unwrap(), "--id", id, "--leader-ttl", "2"])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--etcd", &etcd_url()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start controller");
        Controller { child, port, log }
    }

    /// A metric's value from /metrics, if the controller answers.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.lines().find_map(|l| l.strip_prefix(&format!("ccattler_{name} "))).and_then(|v| v.trim().parse().ok())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig}");
    }

    /// SIGTERM and wait for the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        terminate(&mut self.child, Duration::from_secs(10), &self.log)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGTERM to a child process and its exit status, within `within`; the
/// assertion shows its log.
pub fn terminate(child: &mut Child, within: Duration, log: &Path) -> std::process::ExitStatus {
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success();
    assert!(ok, "kill -TERM");
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{} did not stop on SIGTERM:\n{}", log.display(), std::fs::read_to_string(log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `c` leads and has found nothing to write at a revision ≥ `rev`.
pub async fn settled(c: &Controller, etcd: &mut Client, within: Duration) {
    let rev = revision(etcd).await as f64;
    wait_for("the controller to lead and settle", within, || async {
        c.metric("leader") == Some(1.0) && c.metric("settled_revision").is_some_and(|s| s >= rev)
    })
    .await;
}

pub const T: Duration = Duration::from_secs(15);

/// An etcd of a test's own, for tests that stop or restart it.
pub struct PrivateEtcd {
    pub child: Child,
    pub dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
}

impl PrivateEtcd {
    pub fn start(dir: PathBuf, client_port: u16, peer_port: u16) -> PrivateEtcd {
        let url = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new("etcd")
            .args(["--name", "private", "--data-dir", dir.join("data").to_str().unwrap()])
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("private={peer}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
            .spawn()
            .expect("start etcd");
        PrivateEtcd { child, dir, client_port, peer_port }
    }
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
    pub async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Client::connect([self.url()], None).await {
                if c.get("x", None).await.is_ok() {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "private etcd did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    pub fn restart(mut self) -> PrivateEtcd {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (dir, c, p) = (self.dir.clone(), self.client_port, self.peer_port);
        std::mem::forget(self);
        PrivateEtcd::start(dir, c, p)
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
