//! The security boundary (DESIGN §6) against the real etcd of `scripts/test`
//! with auth on: the role table cell by cell, and the attacks a compromised
//! node agent would try — writing another node's facts, lying about an
//! instance placed elsewhere, keeping a dead node's lease alive — and where
//! a secret's plain value may appear (only in its instances' environment).

mod common;
use common::*;
use etcd_client::{Client, GetOptions, WatchOptions};
use std::path::Path;
use std::time::{Duration, Instant};

fn denied(e: &etcd_client::Error) -> bool {
    ccattler_store::auth::is_permission_denied(e)
}

/// Ok(true) allowed, Ok(false) refused by etcd's auth, Err anything else.
fn allowed<T>(r: Result<T, etcd_client::Error>) -> Result<bool, String> {
    match r {
        Ok(_) => Ok(true),
        Err(e) if denied(&e) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_cell_of_the_role_table_is_what_etcd_enforces() {
    let _serial = serial();
    let mut root = fresh_etcd().await;
    for n in ["n1", "n2"] {
        ensure_agent_user(&mut root, &credentials(), n).await;
    }
    let table = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/security/rbac.table")).unwrap();
    let mut clients: std::collections::BTreeMap<String, Client> = Default::default();
    let (mut cells, mut wrong) = (0, Vec::new());
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [user, prefix, read, write] = f[..] else { panic!("bad table line {line:?}") };
        if !clients.contains_key(user) {
            clients.insert(user.to_string(), connect_as(&etcd_url(), &credentials(), user).await);
        }
        let c = clients.get_mut(user).unwrap();
        let key = format!("{prefix}rbac-probe");
        root.put(key.as_str(), "seeded", None).await.unwrap();
        let got_read =
            [allowed(c.get(key.as_str(), None).await), allowed(c.get(prefix, Some(GetOptions::new().with_prefix())).await), watch_allowed(c, prefix).await];
        let got_write = [allowed(c.put(key.as_str(), "probe", None).await), allowed(c.delete(key.as_str(), None).await)];
        let want = |s: &str| s == "yes";
        for (what, got, expected) in [("get", &got_read[0], want(read)), ("range read", &got_read[1], want(read)), ("watch", &got_read[2], want(read))] {
            match got {
                Ok(g) if *g == expected => {}
                other => wrong.push(format!("{user} {what} {prefix}: expected {}, got {other:?}", if expected { "allowed" } else { "denied" })),
            }
        }
        for (what, got) in [("put", &got_write[0]), ("delete", &got_write[1])] {
            match got {
                Ok(g) if *g == want(write) => {}
                other => wrong.push(format!("{user} {what} {prefix}: expected {}, got {other:?}", if want(write) { "allowed" } else { "denied" })),
            }
        }
        cells += 1;
    }
    assert!(cells >= 50, "the table has {cells} lines");
    assert!(wrong.is_empty(), "etcd does not enforce DESIGN's role table:\n{}", wrong.join("\n"));
}

/// An agent reads the cluster clock it beats with, and only that key of
/// `status/`: not the leader key, not a key that merely starts like the
/// clock's, and it may write none of them. `auth regrant` gives the read to
/// a role made without it, and is idempotent.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_reads_the_cluster_clock_and_nothing_else_of_status_and_regrant_restores_it() {
    let _serial = serial();
    let mut root = fresh_etcd().await;
    ensure_agent_user(&mut root, &credentials(), "n1").await;
    for k in ["status/clock", "status/clockwork", "status/leader"] {
        root.put(k, "7", None).await.unwrap();
    }
    let mut agent = connect_as(&etcd_url(), &credentials(), "agent-n1").await;
    assert_eq!(allowed(agent.get("status/clock", None).await), Ok(true));
    assert_eq!(allowed(agent.get("status/clockwork", None).await), Ok(false));
    assert_eq!(allowed(agent.get("status/leader", None).await), Ok(false));
    assert_eq!(allowed(agent.get("status/", Some(GetOptions::new().with_prefix())).await), Ok(false));
    for k in ["status/clock", "status/clockwork"] {
        assert_eq!(allowed(agent.put(k, "9999999999", None).await), Ok(false), "put {k}");
    }
    // A role from before: without the read. regrant gives it back, twice over.
    root.role_revoke_permission("agent-n1", "status/clock", None).await.unwrap();
    let mut stale = connect_as(&etcd_url(), &credentials(), "agent-n1").await;
    assert_eq!(allowed(stale.get("status/clock", None).await), Ok(false));
    for _ in 0..2 {
        let out = ccattler_as("root", &["auth", "regrant"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("agent-n1"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut fresh = connect_as(&etcd_url(), &credentials(), "agent-n1").await;
    assert_eq!(allowed(fresh.get("status/clock", None).await), Ok(true));
    assert_eq!(allowed(fresh.get("status/clockwork", None).await), Ok(false));
    // Only root may regrant: anyone else is refused and told so, and nothing changes.
    let out = ccattler_as("user", &["auth", "regrant"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("as root"), "{err}");
}

/// Whether etcd lets `c` watch `prefix`: a refused watch is created and
/// cancelled at once, with watch id -1.
async fn watch_allowed(c: &mut Client, prefix: &str) -> Result<bool, String> {
    match c.watch(prefix, Some(etcd_client::WatchOptions::new().with_prefix())).await {
        Ok((w, _stream)) => Ok(w.watch_id() != -1),
        Err(e) if denied(&e) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// A controller and agents node-1 and node-2 on the shared etcd, a service
/// `api` of one instance; returns the node it runs on and its endpoint.
async fn one_instance(etcd: &mut Client, root: &Path) -> (Controller, Vec<Agent>, String, String) {
    let c = Controller::start("security", &shipped_rules());
    let agents: Vec<Agent> = (1..=2).map(|n| Agent::start(root, n, 1000, 1000, &[])).collect();
    put_facts(etcd, &[("desired/service/api/image", "builtin:http"), ("intent/user/service/api/instances", "1")]).await;
    wait_for("api-0 serves", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "api").await.get("api-0").is_some_and(|a| http_get(a).is_some()) }
    })
    .await;
    let node = get(etcd, "placement/instance/api-0").await.unwrap();
    let endpoint = endpoints(etcd, "api").await["api-0"].clone();
    (c, agents, node, endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_report_is_refused_by_etcd_or_ignored_by_the_rules_and_changes_no_endpoint() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = scratch("forged");
    let (_c, mut agents, placed_on, endpoint) = one_instance(&mut etcd, &dir).await;
    let liar = agents.iter().position(|a| a.node != placed_on).unwrap();
    let liar_node = agents[liar].node.clone();
    // The liar's agent is compromised: its process is ours now, its credentials too.
    agents[liar].kill_9();
    let mut liar_client = connect_as(&etcd_url(), &credentials(), &format!("agent-{liar_node}")).await;

    // Under the node the instance is placed on: etcd refuses.
    let e = liar_client.put(format!("observed/node/{placed_on}/instance/api-0/state"), "crashed", None).await.unwrap_err();
    assert!(denied(&e), "{e}");
    let e = liar_client.put("desired/service/api/image", "exec:evil", None).await.unwrap_err();
    assert!(denied(&e), "{e}");

    // Under its own node: etcd allows it, the rules ignore it.
    let lie = format!("observed/node/{liar_node}/");
    for (k, v) in [("instance/api-0/state", "running"), ("instance/api-0/health", "healthy"), ("instance/api-0/ip", "127.0.0.99"), ("instance/api-0/port", "1")]
    {
        liar_client.put(format!("{lie}{k}"), v, None).await.unwrap();
    }
    liar_client.put(format!("{lie}probe_state/api-0/readiness"), "healthy", None).await.unwrap();
    let (why, _) = wait_for_key(&etcd, "the lie recorded as ignored", &format!("status/ignored/node/{liar_node}/instance/api-0")).await;
    assert_eq!(why, format!("the instance is placed on {placed_on}"));
    assert_eq!(endpoints(&mut etcd, "api").await, [("api-0".to_string(), endpoint)].into());
    assert_eq!(get(&mut etcd, "effective/instance/api-0/node").await, Some(placed_on.clone()));
    // `explain` says why the lie does not count.
    let asked = format!("effective/instance/api-0/node={liar_node}");
    let out = ccattler_as("user", &["explain", &asked, "--why-not", "--etcd", &etcd_url()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("✗ placement(\"api-0\", \"{liar_node}\")")), "{text}");
}

/// A compromised agent reports an address outside its node for the instance
/// it really runs: the endpoint never points there, and the lie is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_reports_a_foreign_address_for_its_instance_moves_no_endpoint_there() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = scratch("foreign-ip");
    let (_c, _agents, placed_on, endpoint) = one_instance(&mut etcd, &dir).await;
    let port = endpoint.rsplit_once(':').unwrap().1.to_string();
    let mut liar = connect_as(&etcd_url(), &credentials(), &format!("agent-{placed_on}")).await;
    let (mut watcher, mut seen) = etcd.watch("endpoint/service/api/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    liar.put(format!("observed/node/{placed_on}/instance/api-0/ip"), "10.66.6.6", None).await.unwrap();
    let ignored = format!("status/ignored/node/{placed_on}/instance/api-0/ip");
    let (why, at) = wait_for_key(&etcd, "the foreign address recorded as ignored", &ignored).await;
    assert_eq!(why, format!("address 10.66.6.6 is not node {placed_on}'s address and no range is registered for it"));
    // Every endpoint write from the lie up to the rules' answer to it: none
    // pointed at the foreign address.
    watcher.request_progress().await.unwrap();
    let mut written = Vec::new();
    let deadline = Instant::now() + T;
    loop {
        let resp = tokio::time::timeout_at(deadline.into(), seen.message()).await.expect("the watch reaches the answer").unwrap().unwrap();
        written.extend(resp.events().iter().filter_map(|e| e.kv().and_then(|kv| kv.value_str().ok()).map(String::from)));
        if resp.header().map_or(0, |h| h.revision()) >= at {
            break;
        }
    }
    assert!(!written.iter().any(|v| v.starts_with("10.66.6.6")), "an endpoint pointed at the foreign address: {written:?}");
    assert!(!endpoints(&mut etcd, "api").await.values().any(|v| v == &format!("10.66.6.6:{port}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_whose_lease_another_agent_keeps_alive_still_fails_over() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = scratch("forged-liveness");
    let (_c, mut agents, dead, _) = one_instance(&mut etcd, &dir).await;
    let victim = agents.iter().position(|a| a.node == dead).unwrap();
    let attacker_node = agents[1 - victim].node.clone();
    let attacker = connect_as(&etcd_url(), &credentials(), &format!("agent-{attacker_node}")).await;
    agents[victim].kill_9();
    let killed = Instant::now();

    // The attack: any etcd user may list every lease and keep it alive.
    let attack = keep_every_lease_alive(attacker.clone());
    wait_for("api-0 moves off the dead node", Duration::from_secs(TTL + 3), || {
        let mut e = etcd.clone();
        let dead = dead.clone();
        async move { get(&mut e, "placement/instance/api-0").await.is_some_and(|n| n != dead) }
    })
    .await;
    let moved = killed.elapsed();
    // The lease was kept alive all along: `alive` alone would still say ready.
    assert!(get(&mut etcd, &format!("observed/node/{dead}/alive")).await.is_some(), "the attack did not keep the lease alive");
    assert_eq!(get(&mut etcd, &format!("effective/node/{dead}/state")).await.as_deref(), Some("unreachable"));
    attack.abort();
    eprintln!("api-0 moved {moved:?} after its node died, its lease kept alive by {attacker_node}");
}

/// Keeps every lease etcd holds alive, as any authenticated user may
/// (etcd checks no role on LeaseKeepAlive), until aborted.
fn keep_every_lease_alive(mut keeper: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut kept = std::collections::BTreeMap::new();
        loop {
            for l in keeper.leases().await.expect("list leases").leases() {
                if let std::collections::btree_map::Entry::Vacant(v) = kept.entry(l.id()) {
                    // (A lease may be revoked between the listing and this:
                    // the helper once panicked on that, and the attack ended.)
                    if let Ok(k) = keeper.lease_keep_alive(l.id()).await {
                        v.insert(k);
                    }
                }
            }
            for (k, _) in kept.values_mut() {
                let _ = k.keep_alive().await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// The keep-alive attack on leadership: a user who keeps every lease alive
/// (and may not write `status/`) cannot hold leadership for a dead
/// controller. The leader key is under no lease and is judged by its
/// heartbeat: the standby takes over within the TTL (2 s) + 2 s of kill -9,
/// and the cluster clock moves on under it.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_leader_whose_leases_a_user_keeps_alive_is_replaced_within_its_ttl() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let a = Controller::start("a", &shipped_rules());
    settled(&a, &mut etcd, T).await;
    let b = Controller::start("b", &shipped_rules());
    wait_for("the standby is ready", T, || async { b.metric("revision").is_some_and(|r| r > 0.0) }).await;
    let kv = etcd.get("status/leader", None).await.unwrap().kvs().first().cloned().expect("a leader key");
    assert_eq!((kv.value_str().unwrap(), kv.lease()), ("a", 0), "the leader key is a's, under no lease");

    let mut user = connect_as(&etcd_url(), &credentials(), "user").await;
    assert!(user.put("status/leader", "a", None).await.is_err_and(|e| denied(&e)), "a user may not renew the leader key");
    let attack = keep_every_lease_alive(user.clone());
    let mut a = a;
    a.signal("-KILL");
    let _ = a.child.wait();
    let killed = Instant::now();
    wait_for("b leads", Duration::from_secs(2 + 4), || async { b.metric("leader") == Some(1.0) }).await;
    let takeover = killed.elapsed();
    assert!(takeover <= Duration::from_secs(2 + 2), "b took over {takeover:?} after the kill (TTL 2 s)");
    assert_eq!(get(&mut etcd, "status/leader").await.as_deref(), Some("b"));
    let clock = |e: &Client| {
        let mut e = e.clone();
        async move { get(&mut e, "status/clock").await.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0) }
    };
    let at = clock(&etcd).await;
    wait_for("b advances the cluster clock", T, || {
        let e = etcd.clone();
        async move { clock(&e).await > at }
    })
    .await;
    attack.abort();
    eprintln!("b took over {takeover:?} after a's kill -9, every lease kept alive by a user");
}

/// The same attack on the autoscaler's leader key (TTL: three periods of
/// 1 s): the standby takes over within the TTL + 2 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_autoscaler_whose_leases_a_user_keeps_alive_is_replaced_within_its_ttl() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = scratch("autoscaler-leader");
    let rules = shipped_rules().join("autoscaler");
    let start = |id: &str| {
        KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_ccattler"))
                .args(["autoscaler", "--period", "1", "--id", id, "--rules", rules.to_str().unwrap(), "--etcd", &etcd_url()])
                .args(["--credentials", credentials().to_str().unwrap(), "--as", "autoscaler"])
                .stderr(std::fs::File::create(dir.join(format!("{id}.log"))).unwrap())
                .spawn()
                .unwrap(),
        )
    };
    let mut a = start("a");
    wait_for("a leads", T, || async { get(&mut etcd.clone(), "intent/autoscaler/leader").await.as_deref() == Some("a") }).await;
    let b = start("b");
    let kv = etcd.get("intent/autoscaler/leader", None).await.unwrap().kvs().first().cloned().expect("a leader key");
    assert_eq!(kv.lease(), 0, "under no lease");
    let mut user = connect_as(&etcd_url(), &credentials(), "user").await;
    assert!(user.put("intent/autoscaler/leader", "a", None).await.is_err_and(|e| denied(&e)), "a user may not renew it");
    let attack = keep_every_lease_alive(user.clone());
    a.0.kill().unwrap();
    let _ = a.0.wait();
    let killed = Instant::now();
    wait_for("b leads", Duration::from_secs(3 + 4), || async { get(&mut etcd.clone(), "intent/autoscaler/leader").await.as_deref() == Some("b") }).await;
    let takeover = killed.elapsed();
    assert!(takeover <= Duration::from_secs(3 + 2), "b took over {takeover:?} after the kill (TTL 3 s)");
    attack.abort();
    drop(b);
    eprintln!("the standby autoscaler took over {takeover:?} after the leader's kill -9");
}

/// Every regular file below `dir`, recursively.
fn files_below(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_below(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Where `needle` occurs: etcd keys and values, files below `dirs`, logs.
async fn find_plain(etcd: &mut Client, needle: &str, dirs: &[&Path], logs: &[String]) -> Vec<String> {
    let mut hits = Vec::new();
    let all = etcd.get("\0", Some(GetOptions::new().with_from_key())).await.unwrap();
    for kv in all.kvs() {
        let (k, v) = (String::from_utf8_lossy(kv.key()), String::from_utf8_lossy(kv.value()));
        if k.contains(needle) || v.contains(needle) {
            hits.push(format!("etcd {k}"));
        }
    }
    let mut files = Vec::new();
    for d in dirs {
        files_below(d, &mut files);
    }
    for f in files {
        if std::fs::read(&f).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) {
            hits.push(format!("file {}", f.display()));
        }
    }
    for (i, log) in logs.iter().enumerate() {
        if log.contains(needle) {
            hits.push(format!("log #{i}"));
        }
    }
    hits
}

fn environ(pid: u32) -> std::collections::BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0).filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_plain_only_in_its_instances_environment_and_a_new_value_reaches_them() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = scratch("secret-scan");
    let c = Controller::start("secrets", &shipped_rules());
    let agents: Vec<Agent> = (1..=3).map(|n| Agent::start(&dir, n, 1000, 1000, &[])).collect();
    let (first, second) = ("plain-needle-7f3a9c", "plain-needle-rotated-41d2");
    set_secret("db-pass", first);
    put_facts(&mut etcd, &[("desired/service/db/image", "builtin:http"), ("desired/secret_grant/db/db-pass", ""), ("intent/user/service/db/instances", "2")])
        .await;
    wait_for("db's two instances run with the secret", T, || async {
        let p = processes_of("db");
        p.len() == 2 && p.values().all(|pids| pids.len() == 1 && environ(pids[0]).get("SECRET_DB_PASS").map(String::as_str) == Some(first))
    })
    .await;
    let before = processes_of("db");
    let logs = |c: &Controller, agents: &[Agent]| -> Vec<String> {
        std::iter::once(c.log()).chain(agents.iter().map(|a| std::fs::read_to_string(&a.log).unwrap_or_default())).collect()
    };
    let state_dirs: Vec<&Path> = agents.iter().map(|a| a.state_dir.as_path()).collect();
    let hits = find_plain(&mut etcd, first, &state_dirs, &logs(&c, &agents)).await;
    assert!(hits.is_empty(), "the plain value leaked: {hits:?}");
    // Only nodes running an instance granted it hold a sealed copy.
    let sealed: Vec<String> = keys(&mut etcd, "secret/node/").await.into_iter().map(|(k, _)| k).collect();
    let running_on: std::collections::BTreeSet<String> = keys(&mut etcd, "placement/instance/").await.into_iter().map(|(_, n)| n).collect();
    assert_eq!(sealed, running_on.iter().map(|n| format!("secret/node/{n}/db-pass")).collect::<Vec<_>>());

    // A new value: the instances restart with it, and it leaks nowhere either.
    set_secret("db-pass", second);
    wait_for("db's instances restarted with the new value", T, || async {
        let p = processes_of("db");
        p.len() == 2
            && p.iter()
                .all(|(i, pids)| pids.len() == 1 && pids[0] != before[i][0] && environ(pids[0]).get("SECRET_DB_PASS").map(String::as_str) == Some(second))
    })
    .await;
    let hits = find_plain(&mut etcd, second, &state_dirs, &logs(&c, &agents)).await;
    assert!(hits.is_empty(), "the new plain value leaked: {hits:?}");

    // Scaled to zero: no node holds a copy any more.
    etcd.put("intent/user/service/db/instances", "0", None).await.unwrap();
    wait_for("the sealed copies are deleted", T, || {
        let mut e = etcd.clone();
        async move { keys(&mut e, "secret/node/").await.is_empty() }
    })
    .await;
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ccattler")).args(args).output().expect("run ccattler")
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_once_then_add_rotate_and_remove_a_node_and_reseal_under_a_new_key() {
    let _serial = serial();
    let dir = fresh_dir("auth-commands");
    let etcd = PrivateEtcd::start(dir.clone(), free_port(), free_port());
    let url = etcd.url();
    let (creds, key) = (etcd.credentials(), etcd.secret_key());
    let (c, k) = (creds.to_str().unwrap(), key.to_str().unwrap());
    // Wait until it answers (without auth yet).
    wait_for("etcd answers", T, || {
        let url = url.clone();
        async move {
            match etcd_client::Client::connect([url], None).await {
                Ok(mut c) => c.get("x", None).await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;
    let out = cli(&["auth", "bootstrap", "--etcd", &url, "--credentials", c, "--secret-key", k]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for (name, pw) in ccattler_store::credentials::read_all(&creds).unwrap() {
        assert!(!printed.contains(pw.as_str()), "{name}'s password was printed");
    }
    let again = cli(&["auth", "bootstrap", "--etcd", &url, "--credentials", c]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("auth is already enabled"), "{}", String::from_utf8_lossy(&again.stderr));

    // add-node, then the node's user works; rotate: the old password stops working.
    let bad = cli(&["auth", "add-node", "n9", "--address-range", "10.9.0.0/24,10.9.1.0/33", "--etcd", &url, "--credentials", c]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"10.9.1.0/33\": the prefix length must be 0..=32"), "{}", String::from_utf8_lossy(&bad.stderr));
    let added = cli(&["auth", "add-node", "n9", "--address-range", "10.9.0.0/24, fd00::/64", "--etcd", &url, "--credentials", c]);
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let root_pw = ccattler_store::credentials::password(&creds, "root").unwrap();
    let mut root = etcd_client::Client::connect([url.clone()], Some(etcd_client::ConnectOptions::new().with_user("root", root_pw.to_string()))).await.unwrap();
    let range = root.get("desired/node/n9/address_range", None).await.unwrap();
    assert_eq!(range.kvs()[0].value_str().unwrap(), "10.9.0.0/24,fd00::/64", "the node's registered range");
    let old = ccattler_store::credentials::password(&creds, "agent-n9").unwrap();
    let try_as = |pw: String| {
        let url = url.clone();
        async move {
            let opts = etcd_client::ConnectOptions::new().with_user("agent-n9", pw);
            match etcd_client::Client::connect([url], Some(opts)).await {
                Ok(mut cl) => cl.put("observed/node/n9/cpu", "1", None).await.is_ok(),
                Err(_) => false,
            }
        }
    };
    assert!(try_as(old.to_string()).await);
    let out = cli(&["auth", "rotate", "agent-n9", "--etcd", &url, "--credentials", c]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let new = ccattler_store::credentials::password(&creds, "agent-n9").unwrap();
    assert_ne!(*old, *new);
    assert!(!try_as(old.to_string()).await, "the old password still works");
    assert!(try_as(new.to_string()).await);
    assert!(!cli(&["auth", "add-node", "n9", "--etcd", &url, "--credentials", c]).status.success(), "a second add-node");
    assert!(!cli(&["auth", "add-node", "../x", "--etcd", &url, "--credentials", c]).status.success(), "a name with a slash");
    let out = cli(&["auth", "remove-node", "n9", "--etcd", &url, "--credentials", c]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!try_as(new.to_string()).await, "a removed node's user still works");

    // A secret sealed under the first key; a new key put first; reseal as root.
    let mut set = std::process::Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["secret", "set", "db", "--etcd", &url, "--credentials", c, "--as", "user", "--secret-key", k])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut set.stdin.take().unwrap(), b"v1").unwrap();
    assert!(set.wait().unwrap().success());
    let first_id = ccattler_store::seal::ClusterKeys::load(&key).unwrap().current_id().to_string();
    let new_key = dir.join("new.key");
    ccattler_store::seal::ClusterKeys::create(&new_key).unwrap();
    let both = dir.join("both.key");
    std::fs::write(&both, std::fs::read_to_string(&new_key).unwrap() + &std::fs::read_to_string(&key).unwrap()).unwrap();
    std::fs::set_permissions(&both, std::fs::Permissions::from_mode(0o600)).unwrap();
    let as_user = cli(&["secret", "reseal", "--etcd", &url, "--credentials", c, "--as", "user", "--secret-key", both.to_str().unwrap()]);
    assert!(!as_user.status.success(), "the user cannot read secret values");
    let out = cli(&["secret", "reseal", "--etcd", &url, "--credentials", c, "--as", "root", "--secret-key", both.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut root = etcd.client().await;
    let sealed = get(&mut root, "secret/value/db").await.unwrap();
    let new_only = ccattler_store::seal::ClusterKeys::load(&new_key).unwrap();
    assert_ne!(ccattler_store::seal::ClusterKeys::sealed_with(&sealed), Some(first_id.as_str()));
    assert_eq!(new_only.open("db", &sealed).unwrap().as_slice(), b"v1", "the new key alone opens it");
}

#[tokio::test(flavor = "multi_thread")]
async fn adding_a_node_changes_no_leading_controllers_state_it_reconnects_with_a_new_token() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "1", None).await.unwrap();
    let c = Controller::start("tokens", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    // Users and roles change: tokens issued before are refused by etcd.
    let mut root = fresh_etcd_keep().await;
    let node = format!("late-{}", std::process::id());
    ensure_agent_user(&mut root, &credentials(), &node).await;
    let mut root = fresh_etcd_keep().await;
    root.put("intent/user/service/web/instances", "3", None).await.unwrap();
    wait_for("the change written", T, || {
        let mut e = root.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("3") }
    })
    .await;
    assert_eq!(c.log().matches("snapshot loaded").count(), 1, "an auth change made the controller read everything again:\n{}", c.log());
    let _ = ccattler_store::auth::remove_node(&mut root, &node).await;
}
