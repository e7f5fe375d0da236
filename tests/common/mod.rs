//! Helpers shared by the end-to-end tests: the real etcd that `scripts/test`
//! starts (CCATTLER_ETCD) with auth on (`ccattler auth bootstrap`; the
//! credentials in CCATTLER_TEST_CREDENTIALS, the cluster key in
//! CCATTLER_TEST_SECRET_KEY), real `ccattler` child processes each with its
//! own etcd user, and waiting for a condition with a deadline.
#![allow(dead_code)]

use etcd_client::{Client, ConnectOptions, DeleteOptions, GetOptions};
use std::collections::BTreeMap;
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

/// A root client of the shared etcd, without wiping it.
pub async fn fresh_etcd_keep() -> Client {
    connect_as(&etcd_url(), &credentials(), "root").await
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

/// How many instances the controller has derived (one `effective/instance/I/service`
/// each; an instance has several keys under `effective/instance/I/`).
pub async fn instance_count(c: &mut Client) -> usize {
    keys(c, "effective/instance/").await.iter().filter(|(k, _)| k.ends_with("/service")).count()
}

/// Waits until `n` nodes are ready (so a service applied next spreads over
/// all of them: placements made while one is still joining stay where they are).
pub async fn ready_nodes(etcd: &Client, n: usize) {
    wait_for(&format!("{n} ready nodes"), Duration::from_secs(30), || {
        let mut e = etcd.clone();
        async move { keys(&mut e, "effective/node/").await.iter().filter(|(k, v)| k.ends_with("/state") && v == "ready").count() == n }
    })
    .await;
}

/// Waits until `key` exists and returns its value and mod revision.
pub async fn wait_for_key(etcd: &Client, what: &str, key: &str) -> (String, i64) {
    wait_for(what, Duration::from_secs(30), || {
        let mut e = etcd.clone();
        async move { get(&mut e, key).await.is_some() }
    })
    .await;
    let r = etcd.clone().get(key, None).await.expect("get");
    let kv = r.kvs().first().expect("the key waited for");
    (kv.value_str().unwrap().to_string(), kv.mod_revision())
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
        Controller::start_with(url, creds, key, id, rules, &[], &[])
    }

    /// With extra arguments and environment variables.
    pub fn start_with(url: &str, creds: &Path, key: &Path, id: &str, rules: &Path, args: &[&str], env: &[(&str, &str)]) -> Controller {
        let port = free_port();
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("controller-{id}-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["controller", "--rules", rules.to_str().unwrap(), "--id", id, "--leader-ttl", "2"])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--etcd", url])
            .args(["--credentials", creds.to_str().unwrap(), "--as", "controller", "--secret-key", key.to_str().unwrap()])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start controller");
        Controller { child, port, log }
    }

    /// The whole /metrics text (empty if the controller does not answer).
    pub fn metrics_text(&self) -> String {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else { return String::new() };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body
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
        dump_if_failing("controller", &self.log);
    }
}

/// A controller group (`--hosts FILE --process I`, one worker each): process
/// 0 as a [`Controller`] (etcd, leadership, metrics), the others evaluating
/// only, with no etcd credential and no listener.
pub struct Group {
    pub lead: Controller,
    /// Processes 1…: the child and its log.
    pub others: Vec<(Child, PathBuf)>,
    pub hosts: PathBuf,
}

impl Group {
    /// On the shared etcd, process 0 as its `controller` user.
    pub fn start(id: &str, rules: &Path, processes: usize) -> Group {
        Group::start_on(&etcd_url(), &credentials(), &secret_key(), id, rules, processes)
    }

    pub fn start_on(url: &str, creds: &Path, key: &Path, id: &str, rules: &Path, processes: usize) -> Group {
        Group::start_with(url, creds, key, id, rules, processes, &[])
    }

    /// With extra arguments for process 0.
    pub fn start_with(url: &str, creds: &Path, key: &Path, id: &str, rules: &Path, processes: usize, args: &[&str]) -> Group {
        let addresses: Vec<String> = (0..processes).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let hosts = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("group-{id}-{}.hosts", addresses[0].rsplit(':').next().unwrap()));
        std::fs::write(&hosts, addresses.join("\n") + "\n").unwrap();
        let others = (1..processes).map(|i| Group::spawn_process(&hosts, id, rules, i)).collect();
        let mut all = vec!["--hosts", hosts.to_str().unwrap(), "--process", "0", "--workers", "1"];
        all.extend_from_slice(args);
        let lead = Controller::start_with(url, creds, key, id, rules, &all, &[]);
        Group { lead, others, hosts }
    }

    fn spawn_process(hosts: &Path, id: &str, rules: &Path, i: usize) -> (Child, PathBuf) {
        let log = hosts.with_extension(format!("{i}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["controller", "--rules", rules.to_str().unwrap(), "--hosts", hosts.to_str().unwrap()])
            .args(["--process", &i.to_string(), "--workers", "1", "--id", id])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start a group process");
        (child, log)
    }

    /// kill -9 of process `i` (≥ 1).
    pub fn kill_9(&mut self, i: usize) {
        let (child, _) = &mut self.others[i - 1];
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Process `i`'s (≥ 1) exit status, waiting at most `within`.
    pub fn exit_of(&mut self, i: usize, within: Duration) -> Option<std::process::ExitStatus> {
        exit_within(&mut self.others[i - 1].0, within)
    }
}

/// A child's exit status, if it exits within `within`.
pub fn exit_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Process 0 first: the others' death would stop it with a panic in its log.
        let _ = self.lead.child.kill();
        let _ = self.lead.child.wait();
        for (child, log) in &mut self.others {
            let _ = child.kill();
            let _ = child.wait();
            dump_if_failing("group process", log);
        }
    }
}

/// When a test fails, the last lines of a child's log go to its output:
/// a failure on CI then tells what the process saw.
pub fn dump_if_failing(what: &str, log: &Path) {
    if !std::thread::panicking() {
        return;
    }
    let text = String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(60)..];
    eprintln!("--- last {} lines of the {what} log {} ---\n{}\n--- end ---", tail.len(), log.display(), tail.join("\n"));
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
        PrivateEtcd::start_with(dir, client_port, peer_port, &[])
    }

    /// With extra etcd flags (e.g. a small `--quota-backend-bytes`).
    pub fn start_with(dir: PathBuf, client_port: u16, peer_port: u16, extra: &[&str]) -> PrivateEtcd {
        let url = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new("etcd")
            .args(["--name", "private", "--data-dir", dir.join("data").to_str().unwrap()])
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("private={peer}")])
            .args(extra)
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

/// A child process killed when the test ends, whether it passes or panics.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        dump_if_failing("private etcd", &self.dir.join("etcd.log"));
    }
}

// --- The live cluster: agents and their instances --------------------------

pub const TTL: u64 = 3;

/// A `ccattler agent` child process; on drop it is killed, and so is every
/// instance its state dir says it started (also after a kill -9).
pub struct Agent {
    pub child: Option<Child>,
    pub node: String,
    pub address: String,
    pub args: Vec<String>,
    pub state_dir: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    pub fn start(root: &Path, n: usize, cpu: i64, memory: i64, labels: &[&str]) -> Agent {
        Agent::start_on(&etcd_url(), &credentials(), root, n, cpu, memory, labels)
    }

    /// As user `agent-node-N` of `creds`, created (as root) if it does not exist.
    pub fn start_on(etcd: &str, creds: &Path, root: &Path, n: usize, cpu: i64, memory: i64, labels: &[&str]) -> Agent {
        let node = format!("node-{n}");
        let add = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["auth", "add-node", &node, "--etcd", etcd, "--credentials", creds.to_str().unwrap()])
            .output()
            .expect("auth add-node");
        let err = String::from_utf8_lossy(&add.stderr);
        assert!(add.status.success() || err.contains("already exists"), "auth add-node {node}: {err}");
        let address = format!("127.0.0.{}", 10 + n);
        let state_dir = root.join(&node);
        let mut args: Vec<String> = ["agent", "--node", &node, "--address", &address, "--grace", "2", "--resync", "1"].iter().map(|s| s.to_string()).collect();
        if !labels.iter().any(|l| l.starts_with("--ttl=")) {
            args.extend(["--ttl".into(), TTL.to_string()]);
        }
        args.extend(["--cpu".into(), cpu.to_string(), "--memory".into(), memory.to_string()]);
        args.extend(["--state-dir".into(), state_dir.display().to_string(), "--etcd".into(), etcd.to_string()]);
        args.extend(["--credentials".into(), creds.display().to_string(), "--as".into(), format!("agent-{node}")]);
        // `KEY=VALUE` is a label; a `--flag=value` goes as it is (`--resource=gpu=1`).
        for l in labels {
            if l.starts_with("--") {
                args.push(l.to_string());
            } else {
                args.extend(["--label".into(), l.to_string()]);
            }
        }
        let log = root.join(format!("{node}.log"));
        let mut a = Agent { child: None, node, address, args, state_dir, log };
        a.spawn();
        a
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ccattler")).args(&self.args).stdout(Stdio::null()).stderr(log).spawn().expect("start agent");
        self.child = Some(child);
    }

    pub fn kill_9(&mut self) {
        let mut c = self.child.take().expect("running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM; the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        terminate(&mut c, Duration::from_secs(15), &self.log)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Each record names an instance's supervisor, which leads the
        // instance's process group: the whole group goes.
        for pid in recorded_pids(&self.state_dir) {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        }
        dump_if_failing(&format!("agent {}", self.node), &self.log);
    }
}

/// Pids in an agent's instance records.
pub fn recorded_pids(state_dir: &Path) -> Vec<u32> {
    let Ok(dirs) = std::fs::read_dir(state_dir.join("instances")) else { return vec![] };
    dirs.flatten()
        .filter_map(|d| std::fs::read(d.path().join("record.json")).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()?["pid"].as_u64())
        .map(|p| p as u32)
        .collect()
}

/// Live `ccattler serve-http --instance I` processes, by instance.
pub fn instance_processes() -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmd.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.len() >= 4 && args[0] == env!("CARGO_BIN_EXE_ccattler") && args[1] == "serve-http" && args[2] == "--instance" {
            out.entry(args[3].clone()).or_default().push(pid);
        }
    }
    out
}

pub fn processes_of(service: &str) -> BTreeMap<String, Vec<u32>> {
    instance_processes().into_iter().filter(|(i, _)| i.rsplit_once('-').is_some_and(|(s, _)| s == service)).collect()
}

/// `GET /` on `address`: the body, if it answers 200.
pub fn http_get(address: &str) -> Option<String> {
    http_get_path(address, "/")
}

/// `GET path` on `address` over HTTP/1.0: the body if the status is 200.
pub fn http_get_path(address: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(address).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?;
    (status == "200").then(|| body.to_string())
}

/// `ccattler secret set NAME` as the user, the value on stdin.
pub fn set_secret(name: &str, value: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["secret", "set", name, "--secret-key", secret_key().to_str().unwrap(), "--etcd", &etcd_url()])
        .args(["--credentials", credentials().to_str().unwrap(), "--as", "user"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "secret set: {}", String::from_utf8_lossy(&out.stderr));
}

pub async fn endpoints(etcd: &mut Client, service: &str) -> BTreeMap<String, String> {
    let p = format!("endpoint/service/{service}/");
    keys(etcd, &p).await.into_iter().map(|(k, v)| (k[p.len()..].to_string(), v)).collect()
}

pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cluster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub async fn put_facts(etcd: &mut Client, facts: &[(&str, &str)]) {
    for (k, v) in facts {
        etcd.put(*k, *v, None).await.unwrap();
    }
}

// --- A three-member etcd cluster ---------------------------------------------

/// Three etcd members on loopback, one cluster, for tests that kill members.
pub struct EtcdCluster {
    pub dir: PathBuf,
    pub members: Vec<Option<Child>>,
    pub client_ports: Vec<u16>,
    pub peer_ports: Vec<u16>,
}

impl EtcdCluster {
    pub fn start(dir: PathBuf) -> EtcdCluster {
        let client_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peer_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut c = EtcdCluster { dir, members: vec![None, None, None], client_ports, peer_ports };
        for i in 0..3 {
            c.spawn(i, "new");
        }
        c
    }

    fn initial_cluster(&self) -> String {
        (0..3).map(|i| format!("m{i}=http://127.0.0.1:{}", self.peer_ports[i])).collect::<Vec<_>>().join(",")
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let url = format!("http://127.0.0.1:{}", self.client_ports[i]);
        let peer = format!("http://127.0.0.1:{}", self.peer_ports[i]);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("m{i}.log"))).unwrap();
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}"), "--data-dir", self.dir.join(format!("m{i}")).to_str().unwrap()])
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster(), "--initial-cluster-state", state, "--initial-cluster-token", "ccattler-test"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start an etcd member");
        self.members[i] = Some(child);
    }

    /// Every member's URL, comma-separated, member 0 first.
    pub fn urls(&self) -> String {
        self.client_ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    pub fn credentials(&self) -> PathBuf {
        self.dir.join("credentials")
    }
    pub fn secret_key(&self) -> PathBuf {
        self.dir.join("secret.key")
    }

    /// A root client over every member, once the cluster answers
    /// (bootstrapping auth the first time).
    pub async fn client(&self) -> Client {
        let endpoints: Vec<String> = self.urls().split(',').map(String::from).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.credentials().exists() {
                let password = ccattler_store::credentials::password(&self.credentials(), "root").expect("root credentials");
                // Pinned to a live member, as the product's own clients are.
                let cfg = ccattler_store::EtcdConfig { endpoints: endpoints.clone(), user: Some(("root".into(), password.to_string())), tls: None };
                if let Ok(mut c) = ccattler_store::etcd::connect(&cfg).await {
                    if c.get("x", None).await.is_ok() {
                        return c;
                    }
                }
            } else if let Ok(mut c) = ccattler_store::etcd::connect(&ccattler_store::EtcdConfig { endpoints: endpoints.clone(), user: None, tls: None }).await {
                // Pinned to one member that answers with a quorum behind it.
                if !self.secret_key().exists() {
                    ccattler_store::seal::ClusterKeys::create(&self.secret_key()).expect("cluster key");
                }
                ccattler_store::auth::bootstrap(&mut c, &self.credentials()).await.expect("bootstrap");
                continue;
            }
            assert!(Instant::now() < deadline, "the etcd cluster did not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The index of the member that leads now, by asking each live one.
    pub async fn leader(&self) -> Option<usize> {
        for i in (0..3).filter(|i| self.members[*i].is_some()) {
            let password = ccattler_store::credentials::password(&self.credentials(), "root").ok()?;
            let opts = ConnectOptions::new().with_user("root", password.as_str()).with_connect_timeout(Duration::from_secs(1));
            let Ok(mut c) = Client::connect([format!("http://127.0.0.1:{}", self.client_ports[i])], Some(opts)).await else { continue };
            if let Ok(s) = c.status().await {
                if s.leader() == s.header().map_or(0, |h| h.member_id()) {
                    return Some(i);
                }
            }
        }
        None
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed member again over its data dir.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..3 {
            self.kill(i);
        }
    }
}

/// The status code of `GET path` on a local port, if it answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.split_whitespace().nth(1)?.parse().ok()
}

/// A TCP proxy in front of etcd that can be cut (a network partition between
/// one agent and etcd: connections reset, new ones refused) and healed.
pub struct Proxy {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    live: std::sync::Arc<Mutex<Vec<std::net::TcpStream>>>,
}

#[allow(dead_code)]
impl Proxy {
    pub fn start(target: &str) -> Proxy {
        use std::sync::atomic::Ordering;
        let target = target.trim_start_matches("http://").to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let live: std::sync::Arc<Mutex<Vec<std::net::TcpStream>>> = Default::default();
        let (c, l) = (cut.clone(), live.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: the partition refuses it
                }
                let Ok(up) = std::net::TcpStream::connect(&target) else { continue };
                {
                    let mut live = l.lock().unwrap();
                    live.push(conn.try_clone().unwrap());
                    live.push(up.try_clone().unwrap());
                }
                for (mut from, mut to) in [(conn.try_clone().unwrap(), up.try_clone().unwrap()), (up, conn)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, live }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
