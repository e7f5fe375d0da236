//! Helpers shared by the end-to-end tests: the real etcd that `scripts/test`
//! starts (CCATTLER_ETCD) with auth on (`ccattler auth bootstrap`; the
//! credentials in CCATTLER_TEST_CREDENTIALS, the cluster key in
//! CCATTLER_TEST_SECRET_KEY), real `ccattler` child processes each with its
//! own etcd user, and waiting for a condition with a deadline.
#![allow(dead_code)]

use etcd_client::{Client, ConnectOptions, DeleteOptions, GetOptions};
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

fn test_env(var: &str) -> PathBuf {
    PathBuf::from(std::env::var(var).unwrap_or_else(|_| panic!("{var} is set by scripts/test; run the tests through it")))
}

/// The credentials `scripts/test` bootstrapped the shared etcd with.
pub fn credentials() -> PathBuf {
    test_env("CCATTLER_TEST_CREDENTIALS")
}

/// The shared etcd's cluster secret key.
pub fn secret_key() -> PathBuf {
    test_env("CCATTLER_TEST_SECRET_KEY")
}

/// A client of `url` as `user` of the credentials file `creds`.
pub async fn connect_as(url: &str, creds: &Path, user: &str) -> Client {
    let password = ccattler_store::credentials::password(creds, user).expect("credentials");
    let opts = ConnectOptions::new().with_user(user, password.as_str());
    Client::connect([url], Some(opts)).await.unwrap_or_else(|e| panic!("connect to {url} as {user}: {e}"))
}

/// A root client on an empty store (auth, users and roles stay).
pub async fn fresh_etcd() -> Client {
    let mut c = connect_as(&etcd_url(), &credentials(), "root").await;
    c.delete("\0", Some(DeleteOptions::new().with_from_key())).await.expect("wipe");
    c
}

/// Creates node `node`'s agent user on the etcd `root` is a client of, if it
/// does not exist yet (its password goes to `creds`).
pub async fn ensure_agent_user(root: &mut Client, creds: &Path, node: &str) {
    let user = ccattler_store::auth::agent_user(node);
    if !root.user_list().await.expect("user list").users().contains(&user) {
        ccattler_store::auth::add_node(root, node, creds).await.expect("add-node");
    }
}

/// `ccattler ARGS` as `user` of the shared etcd's credentials, from the repository root.
pub fn ccattler_as(user: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CCATTLER_CREDENTIALS", credentials())
        .env("CCATTLER_AS", user)
        .output()
        .expect("run ccattler")
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
    /// On the shared etcd, as its `controller` user, with its cluster key.
    pub fn start(id: &str, rules: &Path) -> Controller {
        Controller::start_on(&etcd_url(), &credentials(), &secret_key(), id, rules)
    }

    pub fn start_on(url: &str, creds: &Path, key: &Path, id: &str, rules: &Path) -> Controller {
        let port = free_port();
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("controller-{id}-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["controller", "--rules", rules.to_str().unwrap(), "--id", id, "--leader-ttl", "2"])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--etcd", url])
            .args(["--credentials", creds.to_str().unwrap(), "--as", "controller", "--secret-key", key.to_str().unwrap()])
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

/// An etcd of a test's own, for tests that stop or restart it; auth is
/// bootstrapped on it at the first `client()` (credentials and cluster key
/// in its directory).
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
    pub fn credentials(&self) -> PathBuf {
        self.dir.join("credentials")
    }
    pub fn secret_key(&self) -> PathBuf {
        self.dir.join("secret.key")
    }
    /// A root client, once etcd answers (bootstrapping auth the first time).
    pub async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.credentials().exists() {
                let password = ccattler_store::credentials::password(&self.credentials(), "root").expect("root credentials");
                let opts = ConnectOptions::new().with_user("root", password.as_str());
                if let Ok(mut c) = Client::connect([self.url()], Some(opts)).await {
                    if c.get("x", None).await.is_ok() {
                        return c;
                    }
                }
            } else if let Ok(mut c) = Client::connect([self.url()], None).await {
                if c.get("x", None).await.is_ok() {
                    ccattler_store::seal::ClusterKeys::create(&self.secret_key()).expect("cluster key");
                    ccattler_store::auth::bootstrap(&mut c, &self.credentials()).await.expect("bootstrap");
                    continue;
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
