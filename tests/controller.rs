//! The controller as operators run it: real `ccattler controller` processes
//! against the real etcd that `scripts/test` starts (CCATTLER_ETCD), with
//! auth on: the controller as user `controller`, the CLI as `user`, test
//! setup as `root`. The tests share that etcd, so they run one at a time and
//! start from an empty store.

mod common;
use common::*;
use etcd_client::{Client, GetOptions};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test]
async fn intent_converges_and_follows_changes() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "3", None).await.unwrap();
    let c = Controller::start("a", &shipped_rules());
    etcd.put("intent/autoscaler/service/web/instances", "5", None).await.unwrap();
    wait_for("effective 5", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("5") }
    })
    .await;
    assert_eq!(instance_count(&mut etcd).await, 5);
    etcd.delete("intent/autoscaler/service/web/instances", None).await.unwrap();
    wait_for("effective 3 once the autoscaler's intent is gone", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("3") }
    })
    .await;
    wait_for("scaled down to 3 instances", T, || {
        let mut e = etcd.clone();
        async move { instance_count(&mut e).await == 3 }
    })
    .await;
    let derived: i64 = get(&mut etcd, "status/derived_revision").await.unwrap().parse().unwrap();
    assert!(derived > 0);
    assert!(c.stop().success());
}

#[tokio::test]
async fn restart_on_a_converged_cluster_writes_nothing_and_hand_deleted_keys_come_back() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    for (k, v) in [
        ("intent/user/service/web/instances", "2"),
        ("observed/node/node-1/cpu", "1000"),
        ("observed/node/node-1/memory", "1000"),
        ("observed/node/node-1/alive", "1"),
        ("observed/node/node-1/heartbeat", "0"),
    ] {
        etcd.put(k, v, None).await.unwrap();
    }
    let c = Controller::start("first", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    assert_eq!(get(&mut etcd, "placement/instance/web-1").await.as_deref(), Some("node-1"));
    assert!(c.stop().success());
    // Resigning deleted the leader key; nothing else may change from here on.
    assert_eq!(get(&mut etcd, "status/leader").await, None);
    let before = revision(&mut etcd).await;
    let c = Controller::start("second", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    // Only the new leader key and the clock it advances may be written.
    let all = etcd.get("\0", Some(GetOptions::new().with_from_key())).await.unwrap();
    let written: Vec<&str> = all.kvs().iter().filter(|kv| kv.mod_revision() > before).map(|kv| kv.key_str().unwrap()).collect();
    assert!(written.iter().all(|k| ["status/leader", "status/clock"].contains(k)), "a restart rewrote {written:?}");

    etcd.delete("placement/node/node-1/web-0", None).await.unwrap();
    etcd.put("effective/service/web/instances", "99", None).await.unwrap();
    wait_for("hand-changed keys restored", T, || {
        let mut e = etcd.clone();
        async move {
            get(&mut e, "placement/node/node-1/web-0").await.as_deref() == Some("web")
                && get(&mut e, "effective/service/web/instances").await.as_deref() == Some("2")
        }
    })
    .await;
}

#[tokio::test]
async fn an_invalid_value_is_recorded_as_rejected_and_changes_nothing_else() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    let c = Controller::start("a", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let before = keys(&mut etcd, "effective/").await;
    etcd.put("intent/autoscaler/service/web/instances", "three", None).await.unwrap();
    wait_for("status/rejected entry", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/rejected/intent/autoscaler/service/web/instances").await.is_some_and(|r| r.contains("three")) }
    })
    .await;
    settled(&c, &mut etcd, T).await;
    assert_eq!(keys(&mut etcd, "effective/").await, before);
    assert_eq!(c.metric("rejected_facts"), Some(1.0));
    etcd.put("intent/autoscaler/service/web/instances", "4", None).await.unwrap();
    wait_for("rejection cleared and the fixed value used", T, || {
        let mut e = etcd.clone();
        async move {
            get(&mut e, "status/rejected/intent/autoscaler/service/web/instances").await.is_none()
                && get(&mut e, "effective/service/web/instances").await.as_deref() == Some("4")
        }
    })
    .await;
}

#[tokio::test]
async fn two_controllers_one_writes_and_the_standby_takes_over_after_kill_9() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "1", None).await.unwrap();
    let a = Controller::start("a", &shipped_rules());
    settled(&a, &mut etcd, T).await;
    let b = Controller::start("b", &shipped_rules());
    wait_for("the standby is ready", T, || async { b.metric("revision").is_some_and(|r| r > 0.0) }).await;
    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    settled(&a, &mut etcd, T).await;
    assert_eq!(get(&mut etcd, "status/leader").await.as_deref(), Some("a"));
    assert_eq!(b.metric("leader"), Some(0.0));
    assert_eq!(b.metric("keys_written_total"), Some(0.0), "a standby writes nothing");
    assert_eq!(instance_count(&mut etcd).await, 2);

    let mut a = a;
    a.signal("-KILL");
    let _ = a.child.wait();
    let killed_at = Instant::now();
    // a's heartbeat stops; once the leader key stood still for the TTL (2 s), b takes over.
    wait_for("b leads", Duration::from_secs(10), || async { b.metric("leader") == Some(1.0) }).await;
    let takeover = killed_at.elapsed();
    assert!(takeover < Duration::from_secs(6), "took over after {takeover:?}");
    assert_eq!(get(&mut etcd, "status/leader").await.as_deref(), Some("b"));
    etcd.put("intent/user/service/web/instances", "4", None).await.unwrap();
    wait_for("b writes the new state", T, || {
        let mut e = etcd.clone();
        async move { instance_count(&mut e).await == 4 }
    })
    .await;
}

#[tokio::test]
async fn sighup_with_broken_or_too_deeply_nested_rules_keeps_the_old_rules_and_good_rules_replace_them() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("sighup-rules");
    for file in ["intent.rules", "types.rules"] {
        std::fs::copy(shipped_rules().join(file), dir.join(file)).unwrap();
    }
    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    let c = Controller::start("a", &dir);
    settled(&c, &mut etcd, T).await;

    std::fs::write(dir.join("broken.rules"), "output x(a: int) to \"x/{a}\"\nx(a) :- nothing(a).\n").unwrap();
    c.signal("-HUP");
    wait_for("the reload is refused", T, || async { c.log().contains("reload refused") }).await;
    // A file nested 20,000 deep is refused the same way, never a stack overflow.
    let n = 20_000;
    std::fs::write(dir.join("broken.rules"), format!("output x(a: int) to \"status/x/{{a}}\"\nx(a) :- a = {}1{}.\n", "(".repeat(n), ")".repeat(n))).unwrap();
    c.signal("-HUP");
    wait_for("the deep reload is refused", T, || async { c.log().matches("reload refused").count() >= 2 }).await;
    assert!(c.log().contains("nested at most"), "the refusal names why");
    etcd.put("intent/user/service/web/instances", "3", None).await.unwrap();
    wait_for("the old rules still run", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("3") }
    })
    .await;

    std::fs::write(dir.join("broken.rules"), "output doubled(s: name, n: int) to \"status/doubled/{s}\"\ndoubled(s, n * 2) :- effective_instances(s, n).\n")
        .unwrap();
    c.signal("-HUP");
    wait_for("the new rules run without a restart", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/doubled/web").await.as_deref() == Some("6") }
    })
    .await;
    assert!(c.log().contains("rules reloaded"));
}

#[tokio::test]
async fn a_rule_output_on_the_leader_key_or_secrets_is_refused_at_start_and_on_reload() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("reserved-output");
    for file in ["intent.rules", "types.rules"] {
        std::fs::copy(shipped_rules().join(file), dir.join(file)).unwrap();
    }
    let steal = "input i(s: name, n: int) from \"intent/user/service/{s}/instances\"\noutput x(v: string) to \"status/leader\"\nx(\"mine\") :- i(_, _).\n";
    std::fs::write(dir.join("steal.rules"), steal).unwrap();
    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    // At start: the controller refuses the program and exits, having led nothing.
    let mut c = Controller::start("a", &dir);
    let deadline = Instant::now() + T;
    let status = loop {
        if let Some(s) = c.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "a controller with a rule on status/leader kept running:\n{}", c.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{}", c.log());
    assert!(c.log().contains("reserved-output") && c.log().contains("leadership key"), "{}", c.log());
    assert_eq!(get(&mut etcd, "effective/service/web/instances").await, None, "nothing derived");

    // On reload: refused, the old rules keep running and leadership stays b's.
    std::fs::remove_file(dir.join("steal.rules")).unwrap();
    let c = Controller::start("b", &dir);
    settled(&c, &mut etcd, T).await;
    let leader_of = |kvs: &[etcd_client::KeyValue]| kvs.first().map(|kv| (kv.value_str().unwrap().to_string(), kv.create_revision()));
    let leader = leader_of(etcd.get("status/leader", None).await.unwrap().kvs());
    assert!(leader.as_ref().is_some_and(|(id, _)| id == "b"), "b leads");
    for (name, text) in [
        ("steal.rules", steal.to_string()),
        ("leak.rules", "input i(s: name, n: int) from \"intent/user/service/{s}/instances\"\noutput x(s: name, v: string) to \"secret/node/{s}\"\nx(s, \"v\") :- i(s, _).\n".to_string()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        let refusals = c.log().matches("reload refused").count();
        c.signal("-HUP");
        wait_for("the reload is refused", T, || async { c.log().matches("reload refused").count() > refusals }).await;
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    assert!(c.log().contains("sealed secrets"), "{}", c.log());
    etcd.put("intent/user/service/web/instances", "3", None).await.unwrap();
    wait_for("the old rules still run", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("3") }
    })
    .await;
    assert_eq!(leader_of(etcd.get("status/leader", None).await.unwrap().kvs()), leader, "the leader key is untouched");
    assert_eq!(keys(&mut etcd, "secret/node/").await, Vec::<(String, String)>::new());
}

/// Puts many facts quickly, in transactions of 100.
async fn put_all(etcd: &mut Client, facts: &[(String, String)]) {
    for chunk in facts.chunks(100) {
        let ops: Vec<etcd_client::TxnOp> = chunk.iter().map(|(k, v)| etcd_client::TxnOp::put(k.as_str(), v.as_str(), None)).collect();
        etcd.txn(etcd_client::Txn::new().and_then(ops)).await.expect("txn");
    }
}

/// `n` nodes with room for everything, and `instances` instances of one service.
fn cluster(nodes: usize, instances: usize) -> Vec<(String, String)> {
    let mut f = Vec::new();
    for n in 0..nodes {
        for (k, v) in [("cpu", "100000"), ("memory", "100000"), ("alive", "1"), ("heartbeat", "0")] {
            f.push((format!("observed/node/node-{n}/{k}"), v.to_string()));
        }
    }
    f.push(("desired/service/web/cpu".into(), "10".into()));
    f.push(("intent/user/service/web/instances".into(), instances.to_string()));
    f
}

/// Waits (up to 60 s) for a watch to show its first event: the write-back
/// it watches is under way.
async fn under_way(stream: &mut etcd_client::WatchStream) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(resp) = stream.message().await.unwrap() {
            if !resp.events().is_empty() {
                return;
            }
        }
    })
    .await
    .expect("the write-back to be under way within 60 s");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_large_write_back_then_restart_converges_and_never_overwrites_a_placement() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let instances = 8000;
    put_all(&mut etcd, &cluster(50, instances)).await;
    // Killed as soon as the first placements commit (seen through a watch:
    // polling every 50 ms was too slow once the write-back got faster).
    let (_watcher, mut placed) = etcd.watch("placement/instance/", Some(etcd_client::WatchOptions::new().with_prefix())).await.unwrap();
    let mut c = Controller::start("a", &shipped_rules());
    under_way(&mut placed).await;
    c.signal("-KILL");
    let _ = c.child.wait();
    let partial = etcd.get("placement/instance/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
    assert!((partial as usize) < instances, "killed too late to test anything ({partial} placements written)");

    let c = Controller::start("b", &shipped_rules());
    wait_for("every instance placed", Duration::from_secs(120), || {
        let mut e = etcd.clone();
        async move {
            let n = e.get("placement/instance/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
            n as usize == instances
        }
    })
    .await;
    settled(&c, &mut etcd, Duration::from_secs(60)).await;
    let placements = etcd.get("placement/instance/", Some(GetOptions::new().with_prefix())).await.unwrap();
    for kv in placements.kvs() {
        assert_eq!(kv.version(), 1, "{} was overwritten (version {})", kv.key_str().unwrap(), kv.version());
    }
    // The per-node view matches the placements exactly.
    let per_node = etcd.get("placement/node/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
    assert_eq!(per_node as usize, instances);
}

/// A write-back's bulk goes in transactions guarded by one compare over the
/// range of their keys. A key inside that range written meanwhile by someone
/// else (root here, on keys no rule manages) refuses the transaction though
/// none of its own keys moved: it is retried key by key, everything is
/// written, and the other writer's keys are never touched.
#[tokio::test(flavor = "multi_thread")]
async fn a_range_guarded_write_refused_by_a_neighbour_written_meanwhile_is_retried_key_by_key() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let instances = 2000;
    put_all(&mut etcd, &cluster(20, instances)).await;
    // Between an instance's derived keys (`…/state` < `…/zz` < the next
    // instance's): twenty, so that some lie inside a transaction's range
    // rather than between two.
    let neighbours: Vec<String> = (1000..1020).map(|i| format!("effective/instance/web-{i}/zz")).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mut etcd, neighbours, stop) = (etcd.clone(), neighbours.clone(), stop.clone());
        tokio::spawn(async move {
            let mut puts = vec![0i64; neighbours.len()];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (n, key) in neighbours.iter().enumerate() {
                    puts[n] += 1;
                    etcd.put(key.as_str(), puts[n].to_string(), None).await.expect("put");
                }
            }
            puts
        })
    };
    let c = Controller::start("a", &shipped_rules());
    wait_for("every instance placed", Duration::from_secs(120), || {
        let mut e = etcd.clone();
        async move { e.get("placement/instance/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count() as usize == instances }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let puts = writer.await.unwrap();
    settled(&c, &mut etcd, Duration::from_secs(60)).await;
    let retried = c.metric("range_guard_retries_total").unwrap_or(0.0);
    assert!(retried >= 1.0, "no range-guarded transaction was refused and retried: the test tested nothing\n{}", c.metrics_text());
    let states = etcd.get("effective/instance/", Some(GetOptions::new().with_prefix())).await.unwrap();
    let written = states.kvs().iter().filter(|kv| kv.key_str().unwrap().ends_with("/service")).count();
    assert_eq!(written, instances, "every instance's derived keys are written");
    for (key, n) in neighbours.iter().zip(puts) {
        let kv = etcd.get(key.as_str(), None).await.unwrap().kvs().first().cloned().unwrap_or_else(|| panic!("{key} was deleted"));
        assert_eq!((kv.value_str().unwrap(), kv.version()), (n.to_string().as_str(), n), "{key} was written by someone other than its writer");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_restart_is_survived_without_losing_a_change() {
    let _serial = serial();
    let dir = fresh_dir("private-etcd");
    let etcd = PrivateEtcd::start(dir, free_port(), free_port());
    let mut client = etcd.client().await;
    client.put("intent/user/service/web/instances", "1", None).await.unwrap();

    let c = Controller::start_on(&etcd.url(), &etcd.credentials(), &etcd.secret_key(), "r", &shipped_rules());
    let port = c.port;
    wait_for("converged before the restart", T, || {
        let mut e = client.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("1") }
    })
    .await;
    assert_eq!(http_status(port, "/readyz"), Some(200));

    let etcd = {
        let mut etcd = etcd;
        let _ = etcd.child.kill();
        let _ = etcd.child.wait();
        wait_for("/readyz to say not ready while etcd is down", T, || async { http_status(port, "/readyz") == Some(503) }).await;
        assert_eq!(http_status(port, "/healthz"), Some(200), "the process itself is healthy");
        etcd.restart()
    };
    let mut client = etcd.client().await;
    // Written while the controller may still be reconnecting: it must not be lost.
    client.put("intent/user/service/web/instances", "3", None).await.unwrap();
    wait_for("the change made across the restart is applied", Duration::from_secs(30), || {
        let mut e = client.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("3") && instance_count(&mut e).await == 3 }
    })
    .await;
    assert_eq!(http_status(port, "/readyz"), Some(200));
    assert!(c.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn compaction_while_the_watch_is_behind_resyncs_without_loss_or_rewrites() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    let c = Controller::start("a", &shipped_rules());
    settled(&c, &mut etcd, T).await;

    // Freeze the controller, and push far more than its watch buffers hold.
    c.signal("-STOP");
    let big = "x".repeat(8 * 1024);
    for i in 0..1500 {
        etcd.put(format!("desired/config/other/K{i}"), big.as_str(), None).await.unwrap();
    }
    etcd.put("intent/user/service/web/instances", "3", None).await.unwrap();
    let rev = revision(&mut etcd).await;
    etcd.compact(rev, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();
    c.signal("-CONT");

    wait_for("the change made while frozen is applied", Duration::from_secs(60), || {
        let mut e = etcd.clone();
        async move { instance_count(&mut e).await == 3 }
    })
    .await;
    settled(&c, &mut etcd, Duration::from_secs(60)).await;
    // etcd either cancels the compacted watch or, with the frozen client's
    // connection stalled, breaks the connection; both end in a resync.
    assert!(c.log().contains("taking a new snapshot"), "no resync happened, so none was tested:\n{}", c.log());
    // Nothing that was right before was rewritten by the resync.
    for key in ["effective/instance/web-0/service", "effective/instance/web-1/service", "placement/node/node-1/web-0"] {
        if let Some(kv) = etcd.get(key, None).await.unwrap().kvs().first() {
            assert_eq!(kv.version(), 1, "{key} rewritten");
        }
    }
    let kv = etcd.get("effective/service/web/instances", None).await.unwrap();
    assert_eq!(kv.kvs()[0].version(), 2, "written once for 2, once for 3");
}

/// The CLI as the user.
fn ccattler(args: &[&str]) -> std::process::Output {
    ccattler_as("user", args)
}

/// The CLI with no credentials (an etcd without auth).
fn ccattler_plain(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ccattler")).args(args).output().expect("run ccattler")
}

#[tokio::test]
async fn plan_shows_the_difference_and_writes_nothing() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    etcd.put("effective/service/web/instances", "7", None).await.unwrap();
    etcd.put("endpoint/service/gone/gone-0", "127.0.0.1:1", None).await.unwrap();
    let before = revision(&mut etcd).await;
    let rules = shipped_rules();
    let out = ccattler(&["plan", "--etcd", &etcd_url(), "--rules", rules.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("~ effective/service/web/instances = 2 (was 7)"), "{stdout}");
    assert!(stdout.contains("+ effective/instance/web-1/service = web"), "{stdout}");
    assert!(stdout.contains("- endpoint/service/gone/gone-0"), "{stdout}");
    assert_eq!(revision(&mut etcd).await, before, "plan wrote something");
}

#[tokio::test]
async fn a_conflict_is_recorded_and_the_key_keeps_its_value() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("conflict-rules");
    std::fs::write(
        dir.join("c.rules"),
        "input v(s: name, n: int) from \"v/{s}\"\ninput bump(s: name) from \"bump/{s}\"\n\
         output o(s: name, n: int) to \"effective/o/{s}\"\n\
         // the value itself\no(s, n) :- v(s, n).\n// one more, only while bumped: a conflict\no(s, m) :- v(s, n), bump(s), m = n + 1.\n",
    )
    .unwrap();
    etcd.put("v/web", "1", None).await.unwrap();
    let c = Controller::start("a", &dir);
    settled(&c, &mut etcd, T).await;
    assert_eq!(get(&mut etcd, "effective/o/web").await.as_deref(), Some("1"));
    etcd.put("bump/web", "", None).await.unwrap();
    wait_for("the conflict is recorded", T, || {
        let mut e = etcd.clone();
        async move {
            get(&mut e, "status/conflict/effective/o/web")
                .await
                .is_some_and(|v| v.contains("\"1\"") && v.contains("\"2\"") && v.contains("c.rules:5") && v.contains("c.rules:7"))
        }
    })
    .await;
    settled(&c, &mut etcd, T).await;
    assert_eq!(get(&mut etcd, "effective/o/web").await.as_deref(), Some("1"), "a conflicted key keeps its previous value");
    assert_eq!(c.metric("conflicts"), Some(1.0));
    etcd.delete("bump/web", None).await.unwrap();
    wait_for("the conflict is cleared", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/conflict/effective/o/web").await.is_none() }
    })
    .await;
}

#[tokio::test]
async fn a_write_back_longer_than_the_leader_ttl_keeps_leadership() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("bulk-rules");
    std::fs::write(
        dir.join("b.rules"),
        "input n(s: name, count: int) from \"n/{s}\"\noutput o(s: name, i: int, v: int) to \"effective/o/{s}/{i}\"\n\
         // one key per i below the count\no(s, i, i) :- n(s, c), i in 0..c.\n",
    )
    .unwrap();
    let c = Controller::start("a", &dir);
    settled(&c, &mut etcd, T).await;
    let leader_key = |kvs: &[etcd_client::KeyValue]| kvs.first().map(|kv| kv.create_revision());
    let leader_before = leader_key(etcd.get("status/leader", None).await.unwrap().kvs());
    assert!(leader_before.is_some(), "the controller leads");
    // 100,000 keys take the controller several seconds to write, far longer
    // than its 2 s TTL: the key is renewed meanwhile, so no transaction is
    // refused and the leader key is the same one.
    let t = Instant::now();
    etcd.put("n/bulk", "100000", None).await.unwrap();
    settled(&c, &mut etcd, Duration::from_secs(120)).await;
    let took = t.elapsed();
    assert_eq!(get(&mut etcd, "effective/o/bulk/99999").await.as_deref(), Some("99999"));
    assert_eq!(c.metric("transactions_total{result=\"refused\"}").unwrap_or(0.0), 0.0, "a transaction was refused:\n{}", c.log());
    assert_eq!(leader_key(etcd.get("status/leader", None).await.unwrap().kvs()), leader_before, "leadership changed hands:\n{}", c.log());
    eprintln!("100,000 keys written and settled in {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_a_ca_file() {
    let _serial = serial();
    let dir = fresh_dir("tls-etcd");
    let sh = |script: &str| {
        let out = Command::new("sh").arg("-c").arg(script).current_dir(&dir).output().unwrap();
        assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    };
    sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=ccattler-test-ca");
    sh("openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1");
    sh("printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext");
    let (cport, pport) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{cport}");
    let peer = format!("http://127.0.0.1:{pport}");
    let child = Command::new("etcd")
        .args(["--name", "tls", "--data-dir", dir.join("data").to_str().unwrap()])
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--cert-file", dir.join("server.pem").to_str().unwrap(), "--key-file", dir.join("server.key").to_str().unwrap()])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer, "--initial-cluster", &format!("tls={peer}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
        .spawn()
        .unwrap();
    let _etcd = PrivateEtcd { child, dir: dir.clone(), client_port: cport, peer_port: pport };
    let ca = dir.join("ca.pem");
    let rules = shipped_rules();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = ccattler_plain(&["plan", "--etcd", &url, "--etcd-ca", ca.to_str().unwrap(), "--rules", rules.to_str().unwrap()]);
        if out.status.success() {
            assert!(String::from_utf8_lossy(&out.stdout).contains("# plan against etcd revision"));
            break;
        }
        assert!(Instant::now() < deadline, "plan over TLS failed: {}", String::from_utf8_lossy(&out.stderr));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without the CA the server's certificate is not trusted.
    let out = ccattler_plain(&["plan", "--etcd", &url, "--rules", rules.to_str().unwrap()]);
    assert!(!out.status.success());
    // A missing CA file is named.
    let out = ccattler_plain(&["plan", "--etcd", &url, "--etcd-ca", "/no/such/ca.pem"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/ca.pem"));
}

#[tokio::test]
async fn apply_writes_user_facts_only_and_get_reads_them() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("apply");
    let good = dir.join("good.facts");
    std::fs::write(&good, "desired/service/web/image = nginx:1.28\nintent/user/service/web/instances = 3\ndesired/config/web/GREETING = \"hello world\"\n")
        .unwrap();
    let out = ccattler(&["apply", good.to_str().unwrap(), "--etcd", &etcd_url()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(get(&mut etcd, "intent/user/service/web/instances").await.as_deref(), Some("3"));
    assert_eq!(get(&mut etcd, "desired/config/web/GREETING").await.as_deref(), Some("hello world"));

    // A team's exec policy (a rule file beside the shipped rules) refuses
    // an `exec:` image it does not allow, by line and reason; nothing of
    // the file is written.
    let before = revision(&mut etcd).await;
    let denied = dir.join("denied.facts");
    std::fs::write(&denied, "intent/user/service/web/instances = 5\ndesired/service/web/image = exec:/bin/sh\n").unwrap();
    let out = ccattler(&["apply", denied.to_str().unwrap(), "--rules", "rules", "--rules", "examples/policy", "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("denied.facts:2: desired/service/web/image: denied by policy"), "{err}");
    assert_eq!(revision(&mut etcd).await, before, "a denied file writes nothing");
    let allowed = dir.join("allowed.facts");
    std::fs::write(&allowed, "desired/service/batch/image = exec:/bin/sleep 5\n").unwrap();
    let out = ccattler(&["apply", allowed.to_str().unwrap(), "--rules", "rules", "--rules", "examples/policy", "--etcd", &etcd_url()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(get(&mut etcd, "desired/service/batch/image").await.as_deref(), Some("exec:/bin/sleep 5"));
    etcd.delete("desired/service/batch/image", None).await.unwrap();

    let before = revision(&mut etcd).await;
    let bad = dir.join("bad.facts");
    std::fs::write(&bad, "intent/user/service/web/instances = 9\nobserved/node/n1/alive = 1\nintent/autoscaler/service/web/instances = 9\n").unwrap();
    let out = ccattler(&["apply", bad.to_str().unwrap(), "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.facts:2: observed/node/n1/alive is not under desired/ or intent/user/"), "{err}");
    assert!(err.contains("bad.facts:3: intent/autoscaler/service/web/instances"), "{err}");
    assert_eq!(revision(&mut etcd).await, before, "a refused file writes nothing");
    assert_eq!(get(&mut etcd, "intent/user/service/web/instances").await.as_deref(), Some("3"));

    // Every key and value is checked against the rules first: the bad ones
    // are named, and nothing of the file is written.
    let careless = dir.join("careless.facts");
    std::fs::write(
        &careless,
        "intent/user/service/web/instances = 4\nintent/user/service//instances = 2\nintent/user/service/api/instances = three\n\
         intent/user/service/Bad_7/instances = 1\ndesired/service/web/cpu = -500\n",
    )
    .unwrap();
    let before = revision(&mut etcd).await;
    let out = ccattler(&["apply", careless.to_str().unwrap(), "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["careless.facts:2:", "is empty", "careless.facts:3:", "`three` is not an int", "careless.facts:4:", "Bad_7", "careless.facts:5:", "-500"] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    assert_eq!(revision(&mut etcd).await, before, "a file with a bad value writes nothing");
    // A typo is an error, with the key meant; --allow-unknown writes it
    // anyway (a key for rules not deployed yet), with the warning.
    let typo = dir.join("typo.facts");
    std::fs::write(&typo, "desired/servce/web/image = nginx:1.29\n").unwrap();
    let before = revision(&mut etcd).await;
    let out = ccattler(&["apply", typo.to_str().unwrap(), "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("typo.facts:1: no rule reads desired/servce/web/image; did you mean desired/service/web/image?"), "{err}");
    assert_eq!(revision(&mut etcd).await, before, "a typo writes nothing");
    let out = ccattler(&["apply", typo.to_str().unwrap(), "--allow-unknown", "--etcd", &etcd_url()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning:"));
    // … and `- KEY` in a file, or `ccattler delete KEY`, takes it away.
    let undo = dir.join("undo.facts");
    std::fs::write(&undo, "- desired/servce/web/image\n").unwrap();
    let out = ccattler(&["apply", undo.to_str().unwrap(), "--etcd", &etcd_url()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 fact(s) and 1 delete(s)"), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(get(&mut etcd, "desired/servce/web/image").await, None);
    etcd.put("desired/config/web/OLD", "x", None).await.unwrap();
    let out = ccattler(&["delete", "desired/config/web/OLD", "desired/config/web/NOPE", "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1), "a missing key: nothing deleted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("desired/config/web/NOPE: no such key"));
    assert_eq!(get(&mut etcd, "desired/config/web/OLD").await.as_deref(), Some("x"));
    let out = ccattler(&["delete", "observed/node/n1/alive", "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("observed/node/n1/alive is not under desired/ or intent/user/"));
    let out = ccattler(&["delete", "desired/config/web/OLD", "--etcd", &etcd_url()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(get(&mut etcd, "desired/config/web/OLD").await, None);

    // Another writer writes only its own intent prefix.
    let auto = dir.join("auto.facts");
    std::fs::write(&auto, "intent/autoscaler/service/web/instances = 5\n").unwrap();
    let out = ccattler_as("autoscaler", &["apply", auto.to_str().unwrap(), "--writer", "autoscaler", "--etcd", &etcd_url()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = ccattler_as("autoscaler", &["apply", good.to_str().unwrap(), "--writer", "autoscaler", "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("good.facts:1: desired/service/web/image is not under intent/autoscaler/"));
    etcd.delete("intent/autoscaler/service/web/instances", None).await.unwrap();

    let out = ccattler(&["get", "desired/", "--etcd", &etcd_url()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "desired/config/web/GREETING = hello world\ndesired/service/web/image = nginx:1.28\n");
    let out = ccattler(&["get", "--format", "json", "--etcd", &etcd_url()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["facts"]["intent/user/service/web/instances"]["value"], "3");
    assert_eq!(v["facts"].as_object().unwrap().len(), 3);
}

#[tokio::test]
async fn explain_reads_live_etcd_at_a_revision_and_shows_key_revisions() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let user = etcd.put("intent/user/service/web/instances", "3", None).await.unwrap().header().unwrap().revision();
    let auto = etcd.put("intent/autoscaler/service/web/instances", "5", None).await.unwrap().header().unwrap().revision();
    let c = Controller::start("explain", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let rules = shipped_rules();
    let rules = rules.to_str().unwrap();
    let at_five = revision(&mut etcd).await;
    let out = ccattler(&["explain", "effective/service/web/instances", "--etcd", &etcd_url(), "--rules", rules]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("at revision {at_five}")), "{text}");
    assert!(text.contains("→ 5"), "the deciding contribution: {text}");
    assert!(text.contains(&format!("key intent/autoscaler/service/web/instances = \"5\" (mod_revision {auto}, writer autoscaler)")), "{text}");
    assert!(text.contains(&format!("key intent/user/service/web/instances = \"3\" (mod_revision {user}, writer user)")), "{text}");

    // The autoscaler leaves; the past revision still explains 5, the latest 3.
    etcd.delete("intent/autoscaler/service/web/instances", None).await.unwrap();
    settled(&c, &mut etcd, T).await;
    let past = ccattler(&[
        "explain",
        "effective/service/web/instances=5",
        "--revision",
        &at_five.to_string(),
        "--etcd",
        &etcd_url(),
        "--rules",
        rules,
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&past.stdout).unwrap();
    assert_eq!(v["holds"], true);
    assert_eq!(v["revision"], at_five);
    assert!(v["source"].as_str().unwrap().ends_with(&format!("at revision {at_five}")));
    let now = ccattler(&["explain", "effective/service/web/instances=5", "--why-not", "--etcd", &etcd_url(), "--rules", rules, "--format", "json"]);
    assert_eq!(now.status.code(), Some(1), "5 no longer holds");
    let v: serde_json::Value = serde_json::from_slice(&now.stdout).unwrap();
    assert_eq!(v["holds"], false);
    assert_eq!(v["proofs"][0]["tuple"], serde_json::json!(["web", 3]), "what holds instead");
    assert_eq!(v["stored"]["value"], "3");
    let why = v["why_not"]["rules"][0]["failures"][0]["failed"][0]["reason"].as_str().unwrap();
    assert!(why.contains("the group's aggregate gives effective_instances(\"web\", 3)"), "{v}");
    // The controller answers too, from its warm engine, at the revision it has applied.
    let url = format!("http://127.0.0.1:{}", c.port);
    let served = ccattler(&["explain", "effective/service/web/instances", "--controller", &url]);
    let text = String::from_utf8_lossy(&served.stdout);
    assert!(served.status.success(), "{text}{}", String::from_utf8_lossy(&served.stderr));
    assert!(text.contains(&format!("# controller {url} at revision")), "{text}");
    assert!(text.contains(&format!("key intent/user/service/web/instances = \"3\" (mod_revision {user}, writer user)")), "{text}");
    let served = ccattler(&["explain", "effective/service/web/instances=5", "--why-not", "--controller", &url, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&served.stdout).unwrap();
    assert_eq!(v["holds"], false);
    assert_eq!(v["proofs"][0]["tuple"], serde_json::json!(["web", 3]));
    let unknown = ccattler(&["explain", "nothing/here", "--controller", &url]);
    assert_eq!(unknown.status.code(), Some(1));
    // A key no rule knows is named.
    let bad = ccattler(&["explain", "nothing/here", "--etcd", &etcd_url(), "--rules", rules]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"nothing/here\" is not a key any relation of the rules reads or derives"));
    assert!(c.stop().success());
}

#[tokio::test]
async fn a_derived_key_that_cannot_be_a_key_is_recorded_and_never_stalls_the_others() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("bad-derived-key");
    // A careless rule: `s ++ "/x"` puts a `/` into what should be one segment.
    std::fs::write(
        dir.join("b.rules"),
        "input v(s: name, n: int) from \"v/{s}\"\noutput o(s: string, n: int) to \"effective/o/{s}\"\n\
         // each value, under its name\no(s, n) :- v(s, n), n >= 0.\n// a careless one\no(s ++ \"/x\", n) :- v(s, n), n < 0.\n",
    )
    .unwrap();
    for i in 0..200 {
        etcd.put(format!("v/k{i:03}"), if i == 100 { "-1".to_string() } else { i.to_string() }, None).await.unwrap();
    }
    let c = Controller::start("a", &dir);
    settled(&c, &mut etcd, T).await;
    assert_eq!(keys(&mut etcd, "effective/o/").await.len(), 199, "every good key is written, in the same write-back as the bad one");
    let record = get(&mut etcd, "status/rejected/derived/o").await.expect("the bad tuple is recorded");
    assert!(record.contains("b.rules:6") && record.contains("\"k100/x\" holds a `/`"), "{record}");
    assert_eq!(c.metric("transactions_total{result=\"refused\"}").unwrap_or(0.0), 0.0, "no transaction was refused:\n{}", c.log());
    // Fixed: the record goes.
    etcd.put("v/k100", "100", None).await.unwrap();
    wait_for("the record cleared and the key written", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/rejected/derived/o").await.is_none() && get(&mut e, "effective/o/k100").await.as_deref() == Some("100") }
    })
    .await;
}

#[tokio::test]
async fn a_panicking_engine_worker_makes_the_controller_exit_non_zero_at_once() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "1", None).await.unwrap();
    let at = revision(&mut etcd).await + 3;
    let mut c = Controller::start_with(
        &etcd_url(),
        &credentials(),
        &secret_key(),
        "panics",
        &shipped_rules(),
        &[],
        &[("CCATTLER_INJECT_WORKER_PANIC", &at.to_string())],
    );
    for i in 0..5 {
        etcd.put("intent/user/service/web/instances", (2 + i).to_string(), None).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = c.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the controller did not exit after its worker panicked:\n{}", c.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(70), "{}", c.log());
    assert!(c.log().contains("injected worker panic"), "{}", c.log());
}

#[tokio::test]
async fn a_derived_key_etcd_refuses_is_blocked_and_recorded_and_the_rest_is_written() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let dir = fresh_dir("refused-key");
    // `refused/` is no role's: the controller's etcd role may not write it (check warns).
    std::fs::write(
        dir.join("r.rules"),
        "input v(s: name, n: int) from \"v/{s}\"\noutput o(s: name, n: int) to \"effective/o/{s}\"\noutput bad(s: name, n: int) to \"refused/bad/{s}\"\n\
         // allowed\no(s, n) :- v(s, n).\n// not the controller's to write\nbad(s, n) :- v(s, n), n = 3.\n",
    )
    .unwrap();
    for i in 0..10 {
        etcd.put(format!("v/k{i}"), i.to_string(), None).await.unwrap();
    }
    let c = Controller::start("a", &dir);
    settled(&c, &mut etcd, T).await;
    assert_eq!(keys(&mut etcd, "effective/o/").await.len(), 10);
    assert_eq!(get(&mut etcd, "refused/bad/k3").await, None);
    let why = get(&mut etcd, "status/blocked/refused/bad/k3").await.expect("recorded");
    assert!(why.contains("permission denied"), "{why}");
    assert_eq!(c.metric("blocked_keys"), Some(1.0));
    assert!(c.log().contains("etcd refuses to write this derived key"), "{}", c.log());
    assert_eq!(http_status(c.port, "/healthz"), Some(200), "blocking a key is progress");
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_fails_while_etcd_stays_unreachable_and_recovers_with_it() {
    let _serial = serial();
    let dir = fresh_dir("stall-etcd");
    let etcd = PrivateEtcd::start(dir, free_port(), free_port());
    let mut client = etcd.client().await;
    client.put("intent/user/service/web/instances", "1", None).await.unwrap();
    let c = Controller::start_with(&etcd.url(), &etcd.credentials(), &etcd.secret_key(), "stall", &shipped_rules(), &["--stall-bound", "2"], &[]);
    wait_for("healthy and ready", T, || async { http_status(c.port, "/healthz") == Some(200) && http_status(c.port, "/readyz") == Some(200) }).await;
    let etcd = {
        let mut etcd = etcd;
        let _ = etcd.child.kill();
        let _ = etcd.child.wait();
        wait_for("/healthz to fail while etcd stays down", T, || async { http_status(c.port, "/healthz") == Some(503) }).await;
        etcd.restart()
    };
    let _ = etcd.client().await;
    wait_for("/healthz to recover with etcd", Duration::from_secs(30), || async { http_status(c.port, "/healthz") == Some(200) }).await;
}

/// etcd out of space (a rule deriving 40 MB into a 16 MiB quota): the
/// controller names the NOSPACE alarm in its log and `ccattler_etcd_nospace`,
/// `/healthz` fails (its retries are not progress); it keeps leading and
/// deletes what the rules no longer derive once the cause is removed; after
/// the administrator compacts, defragments and disarms, it writes again.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_out_of_space_is_named_fails_healthz_and_recovers_once_disarmed() {
    let _serial = serial();
    let dir = fresh_dir("nospace");
    let etcd = PrivateEtcd::start_with(dir.clone(), free_port(), free_port(), &["--quota-backend-bytes", "16777216"]);
    let mut root = etcd.client().await;
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("fill.rules"),
        "input blob(v: string) from \"fill/blob\"\ninput copies(n: int) from \"fill/copies\"\n\
         output copy(i: int, v: string) to \"effective/fill/{i}\"\n// n copies of the blob\ncopy(i, v) :- blob(v), copies(n), i in 0..n.\n",
    )
    .unwrap();
    let c = Controller::start_with(&etcd.url(), &etcd.credentials(), &etcd.secret_key(), "full", &rules, &["--stall-bound", "3"], &[]);
    wait_for("healthy and leading", T, || async { http_status(c.port, "/healthz") == Some(200) && c.metric("leader") == Some(1.0) }).await;
    root.put("fill/blob", "z".repeat(100_000), None).await.unwrap();
    root.put("fill/copies", "400", None).await.unwrap();
    wait_for("the NOSPACE alarm is named", Duration::from_secs(60), || async { c.metric("etcd_nospace") == Some(1.0) }).await;
    assert!(c.log().contains("NOSPACE alarm"), "{}", c.log());
    wait_for("/healthz fails while etcd is out of space", Duration::from_secs(30), || async { http_status(c.port, "/healthz") == Some(503) }).await;

    // Remove the cause (a delete is allowed under the alarm): the controller,
    // still leading, deletes what the rules no longer derive, alarm or not.
    root.delete("fill/copies", None).await.unwrap();
    let count = |e: &Client| {
        let mut e = e.clone();
        async move { e.get("effective/fill/", Some(etcd_client::GetOptions::new().with_prefix().with_count_only())).await.unwrap().count() }
    };
    wait_for("the controller deletes every copy under the alarm", Duration::from_secs(60), || {
        let e = root.clone();
        async move { count(&e).await == 0 }
    })
    .await;
    assert_eq!(c.metric("leader"), Some(1.0), "leadership held through the alarm:\n{}", c.log());
    // Nothing left to write is no sign that etcd takes puts again: the
    // alarm is still raised, and the metric and /healthz keep saying so
    // (they once cleared as soon as write-back had nothing to do).
    let still = Instant::now() + Duration::from_secs(3);
    while Instant::now() < still {
        assert_eq!(c.metric("etcd_nospace"), Some(1.0), "the alarm is still raised:\n{}", c.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!c.log().contains("takes writes again"), "{}", c.log());
    disarm_nospace(&mut root).await;
    wait_for("healthy again once disarmed", Duration::from_secs(30), || async {
        http_status(c.port, "/healthz") == Some(200) && c.metric("etcd_nospace") == Some(0.0)
    })
    .await;
    root.put("fill/copies", "2", None).await.unwrap();
    wait_for("new keys are derived again", T, || {
        let e = root.clone();
        async move { count(&e).await == 2 }
    })
    .await;
    assert_eq!(c.metric("etcd_nospace"), Some(0.0));
    assert_eq!(c.metric("leader"), Some(1.0));
}

/// The administrator's part after a NOSPACE alarm (etcd allows it root
/// only): compact, defragment, disarm.
async fn disarm_nospace(root: &mut Client) {
    let rev = root.get("any", None).await.unwrap().header().unwrap().revision();
    root.compact(rev, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();
    root.defragment().await.unwrap();
    let alarms = root.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await.unwrap();
    for a in alarms.alarms() {
        let mut opts = etcd_client::AlarmOptions::new();
        opts.with_member(a.member_id());
        root.alarm(etcd_client::AlarmAction::Deactivate, etcd_client::AlarmType::Nospace, Some(opts)).await.unwrap();
    }
}

/// etcd filled by someone else while the leader has nothing to write: only
/// its heartbeat's put is refused. The controller once stayed healthy and
/// silent then (the alarm was named only when write-back hit it), which
/// also made the test above flaky: when etcd took all 400 copies before
/// its size caught up, the first refused put was the heartbeat's.
#[tokio::test]
async fn etcd_filled_by_others_is_named_out_of_space_though_write_back_is_idle() {
    let _serial = serial();
    let dir = fresh_dir("nospace-idle");
    let etcd = PrivateEtcd::start_with(dir.clone(), free_port(), free_port(), &["--quota-backend-bytes", "16777216"]);
    let mut root = etcd.client().await;
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("echo.rules"),
        "input wanted(v: string) from \"echo/wanted\"\noutput echoed(v: string) to \"effective/echo\"\n// what is wanted, echoed\nechoed(v) :- wanted(v).\n",
    )
    .unwrap();
    let c = Controller::start_with(&etcd.url(), &etcd.credentials(), &etcd.secret_key(), "idle", &rules, &["--stall-bound", "3"], &[]);
    wait_for("healthy and leading", T, || async { http_status(c.port, "/healthz") == Some(200) && c.metric("leader") == Some(1.0) }).await;
    let blob = "z".repeat(100_000);
    let mut filled = false;
    for i in 0..2000 {
        match root.put(format!("elsewhere/{i}"), blob.as_str(), None).await {
            Ok(_) => {}
            Err(e) if e.to_string().contains("database space exceeded") => {
                filled = true;
                break;
            }
            Err(e) => panic!("filling etcd: {e}"),
        }
    }
    assert!(filled, "200 MB did not fill a 16 MB quota");
    wait_for("the NOSPACE alarm is named", Duration::from_secs(30), || async { c.metric("etcd_nospace") == Some(1.0) }).await;
    assert!(c.log().contains("renewal was refused"), "{}", c.log());
    wait_for("/healthz fails while etcd is out of space", Duration::from_secs(30), || async { http_status(c.port, "/healthz") == Some(503) }).await;
    assert_eq!(c.metric("leader"), Some(1.0), "leadership held through the alarm:\n{}", c.log());
    root.delete("elsewhere/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    disarm_nospace(&mut root).await;
    wait_for("healthy again once disarmed", Duration::from_secs(30), || async {
        http_status(c.port, "/healthz") == Some(200) && c.metric("etcd_nospace") == Some(0.0)
    })
    .await;
    root.put("echo/wanted", "hello", None).await.unwrap();
    wait_for("new keys are derived again", T, || {
        let mut e = root.clone();
        async move { e.get("effective/echo", None).await.unwrap().kvs().first().map(|kv| kv.value().to_vec()) == Some(b"hello".to_vec()) }
    })
    .await;
}

#[tokio::test]
async fn odd_bytes_are_rejected_and_recorded_never_read_lossily() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "1", None).await.unwrap();
    etcd.put("desired/service/web/image", b"builtin:h\xfftp".to_vec(), None).await.unwrap();
    etcd.put(b"desired/service/\xfe\xff/image".to_vec(), "x", None).await.unwrap();
    etcd.put("intent/user/service//instances", "3", None).await.unwrap();
    let c = Controller::start("odd", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let image = get(&mut etcd, "status/rejected/desired/service/web/image").await.expect("a non-UTF-8 value is recorded");
    assert!(image.contains("not UTF-8"), "{image}");
    assert_eq!(get(&mut etcd, "effective/service/web/image").await, None, "never used lossily");
    let key = keys(&mut etcd, "status/rejected/not-utf8/").await;
    assert_eq!(key.len(), 1, "a non-UTF-8 key is recorded: {key:?}");
    let hex: String = b"desired/service/\xfe\xff/image".iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(key[0].0, format!("status/rejected/not-utf8/{hex}"));
    assert!(key[0].1.contains("not UTF-8"), "{key:?}");
    let empty = get(&mut etcd, "status/rejected/intent/user/service//instances").await.expect("an empty segment is recorded");
    assert!(empty.contains("key segment `service`") && empty.contains("is empty"), "{empty}");
    assert_eq!(get(&mut etcd, "effective/service/web/instances").await.as_deref(), Some("1"));
    // The same through the watch, after the start: the watch once skipped
    // events whose key was not UTF-8, so such a key went unrecorded.
    etcd.put(b"desired/service/\xfa/image".to_vec(), "y", None).await.unwrap();
    let later: String = b"desired/service/\xfa/image".iter().map(|b| format!("{b:02x}")).collect();
    wait_for("a non-UTF-8 key put after the start to be recorded", T, || {
        let mut etcd = etcd.clone();
        let record = format!("status/rejected/not-utf8/{later}");
        async move { get(&mut etcd, &record).await.is_some() }
    })
    .await;
    etcd.delete(b"desired/service/\xfa/image".to_vec(), None).await.unwrap();
    wait_for("its record to go with it", T, || {
        let mut etcd = etcd.clone();
        let record = format!("status/rejected/not-utf8/{later}");
        async move { get(&mut etcd, &record).await.is_none() }
    })
    .await;
    assert!(c.stop().success());
}

#[tokio::test]
async fn a_slow_explanation_never_delays_the_write_back_and_answers_as_of_when_asked() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    etcd.put("intent/user/service/web/instances", "3", None).await.unwrap();
    // Every explanation takes 8 s longer than it would.
    let c = Controller::start_with(
        &etcd_url(),
        &credentials(),
        &secret_key(),
        "slow-explain",
        &shipped_rules(),
        &[],
        &[("CCATTLER_INJECT_EXPLAIN_DELAY_MS", "8000")],
    );
    settled(&c, &mut etcd, T).await;
    let asked_at = revision(&mut etcd).await;
    let url = format!("http://127.0.0.1:{}", c.port);
    let asking = std::thread::spawn(move || ccattler(&["explain", "effective/service/web/instances", "--controller", &url, "--format", "json"]));
    wait_for("the explanation to be under way", T, || async { c.metric("explanations_running") == Some(1.0) }).await;
    // While it runs, a change is applied and written.
    let t = Instant::now();
    let changed_at = etcd.put("intent/user/service/web/instances", "5", None).await.unwrap().header().unwrap().revision();
    wait_for("web's 5 instances to be written while the explanation runs", Duration::from_secs(6), || {
        let mut etcd = etcd.clone();
        async move { keys(&mut etcd, "effective/service/web/instances").await == vec![("effective/service/web/instances".to_string(), "5".to_string())] }
    })
    .await;
    let written_in = t.elapsed();
    assert_eq!(c.metric("explanations_running"), Some(1.0), "written before the explanation ended");
    // The answer is of the state when it was asked, not of what came after.
    let out = asking.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["holds"], true);
    assert_eq!(v["proofs"][0]["tuple"], serde_json::json!(["web", 3]), "{v}");
    let answered_at = v["revision"].as_i64().unwrap();
    assert!(asked_at <= answered_at && answered_at < changed_at, "asked at {asked_at}, changed at {changed_at}: {v}");
    eprintln!("written {written_in:?} after the change, while an explanation ran");
    assert!(c.stop().success());
}

/// The interner once never freed: any writer of a string input could grow
/// the controller without bound by writing fresh values. Rounds of 2,000
/// fresh 1 KB config values (the same keys, new values): the interned bytes
/// and the resident memory stay flat once warm.
#[tokio::test]
async fn unique_value_churn_releases_interned_strings_and_memory_stays_flat() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let c = Controller::start("churn", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap()
    };
    let (keys, rounds) = (2000, 16);
    let mut samples = Vec::new();
    for round in 0..rounds {
        let mut ops = Vec::new();
        for k in 0..keys {
            // 1 KB, unique to this round and key.
            let value = format!("{round:04}-{k:05}-").repeat(1024 / 11 + 1)[..1024].to_string();
            ops.push(etcd_client::TxnOp::put(format!("desired/config/churn/K{k}"), value, None));
        }
        for chunk in ops.chunks(100) {
            etcd.txn(etcd_client::Txn::new().and_then(chunk.to_vec())).await.unwrap();
        }
        settled(&c, &mut etcd, Duration::from_secs(60)).await;
        let sample = (c.metric("interned_bytes").unwrap(), rss(c.child.id()));
        eprintln!("round {round}: interned {} bytes, RSS {} kB", sample.0, sample.1);
        samples.push(sample);
    }
    // One round's values are 2 MB: the interned bytes hold at most a few
    // rounds' worth (a round's old values go as the dataflow compacts its
    // traces), never the sum of all rounds (32 MB).
    let round_bytes = samples[0].0;
    let most = samples[rounds - 6..].iter().map(|s| s.0).fold(0.0, f64::max);
    assert!(most <= 4.0 * round_bytes, "interned bytes grow with churn: {samples:?}");
    // Resident memory: within 5 % (plus 8 MiB of allocator slack) of the warm rounds.
    let warm_rss = samples[4..8].iter().map(|s| s.1).max().unwrap();
    let last_rss = samples[rounds - 4..].iter().map(|s| s.1).max().unwrap();
    assert!(last_rss as f64 <= warm_rss as f64 * 1.05 + 8192.0, "resident memory grows with churn: {samples:?}");
    assert!(c.stop().success());
}

/// `explain` of a placement kept since an earlier round once said only
/// "kept": it now also shows why its node was chosen when it was placed, from
/// etcd as the round that wrote it saw it (the derived revision its write
/// stamped), with the offers and room of that round.
#[tokio::test]
async fn explain_of_a_kept_placement_shows_why_its_node_was_chosen_then() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    for (n, cpu) in [("sim-0", "4000"), ("sim-1", "8000")] {
        let k = |f: &str| format!("observed/node/{n}/{f}");
        for (key, v) in [(k("cpu"), cpu), (k("memory"), "8192"), (k("alive"), "1"), (k("heartbeat"), "0"), (k("ttl"), "86400")] {
            etcd.put(key, v, None).await.unwrap();
        }
    }
    etcd.put("desired/service/web/cpu", "1000", None).await.unwrap();
    etcd.put("intent/user/service/web/instances", "1", None).await.unwrap();
    let c = Controller::start("explain-kept", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let node = get(&mut etcd, "placement/instance/web-0").await.expect("placed");
    // Later rounds change the cluster; the placement is kept.
    etcd.put("intent/user/service/api/instances", "2", None).await.unwrap();
    settled(&c, &mut etcd, T).await;
    let rules = shipped_rules();
    let out = ccattler(&["explain", "placement/instance/web-0", "--etcd", &etcd_url(), "--rules", rules.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("kept("), "held because kept now: {text}");
    let then = text.split("# when it was placed").nth(1).unwrap_or_else(|| panic!("no origin section: {text}"));
    assert!(then.contains("derived from revision"), "{text}");
    assert!(then.contains("assign") && then.contains(&format!("offer(\"{node}\"")), "the round's offer for {node}: {then}");
    let json = ccattler(&["explain", "placement/instance/web-0", "--etcd", &etcd_url(), "--rules", rules.to_str().unwrap(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["placed"]["derived_at"].as_i64().is_some(), "{v}");
    assert_eq!(v["placed"]["explanation"]["holds"], true, "{v}");
    assert!(c.stop().success());
}

/// `node cordon` of a node that does not exist once succeeded and `drain
/// --wait` waited out its timeout; `uncordon` of one never cordoned claimed
/// success; `drain --wait` reported success while an instance it moved had
/// nowhere to go.
#[tokio::test]
async fn node_commands_name_unknown_nodes_and_drain_reports_what_found_no_place() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    for (n, cpu) in [("sim-0", "1000"), ("sim-1", "1000")] {
        let k = |f: &str| format!("observed/node/{n}/{f}");
        for (key, v) in [(k("cpu"), cpu), (k("memory"), "8192"), (k("alive"), "1"), (k("heartbeat"), "0"), (k("ttl"), "86400")] {
            etcd.put(key, v, None).await.unwrap();
        }
    }
    // Two instances of 800 millicores: one per node, no room for a second anywhere.
    etcd.put("desired/service/big/cpu", "800", None).await.unwrap();
    // (No agent serves them: a budget of 0 lets the drain move them.)
    etcd.put("desired/service/big/min_available", "0", None).await.unwrap();
    etcd.put("intent/user/service/big/instances", "2", None).await.unwrap();
    let c = Controller::start("node-cmds", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let out = ccattler(&["node", "cordon", "sim-9", "--etcd", &etcd_url()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no node sim-9; did you mean sim-0?") && err.contains("nothing changed"), "{err}");
    assert_eq!(get(&mut etcd, "desired/node/sim-9/cordon").await, None);
    let out = ccattler(&["node", "uncordon", "sim-1", "--etcd", &etcd_url()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("was neither cordoned nor draining"), "{}", String::from_utf8_lossy(&out.stdout));
    let on_zero = keys(&mut etcd, "placement/node/sim-0/").await;
    assert_eq!(on_zero.len(), 1, "{on_zero:?}");
    let out = ccattler(&["node", "drain", "sim-0", "--wait", "30", "--etcd", &etcd_url()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("sim-0: drained, but 1 instance(s) it ran have nowhere to go"), "{stdout}");
    let out = ccattler(&["node", "uncordon", "sim-0", "--etcd", &etcd_url()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("sim-0: uncordoned"));
    assert!(c.stop().success());
}

/// etcd errors once came out as raw gRPC dumps naming neither the URL nor the
/// user; an agent with a wrong password printed nothing and the controller
/// called it "unreachable" and retried for ever. Each now names where, as
/// whom, and what to do; wrong credentials at start stop the daemons.
#[tokio::test]
async fn etcd_errors_name_the_url_and_user_and_wrong_credentials_stop_the_daemons() {
    let _serial = serial();
    let _etcd = fresh_etcd().await;
    let url = etcd_url();
    let bare =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_ccattler")).args(args).env_remove("CCATTLER_CREDENTIALS").env_remove("CCATTLER_AS").output().unwrap();
    let out = bare(&["get", "desired/", "--etcd", &url, "--etcd-user", "user", "--etcd-password", "wrong"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains(&format!("etcd at {url} refused the password of user user")) && err.contains("ccattler auth rotate user"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["get", "desired/", "--etcd", &url])
        .env_remove("CCATTLER_CREDENTIALS")
        .env_remove("CCATTLER_AS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("etcd at {url} has auth on and no user was given")), "{err}");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let out = ccattler(&["get", "desired/", "--etcd", &dead]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot reach etcd at {dead} (as user user)")), "{err}");

    // The agent and the controller, with a wrong password: exit non-zero at once, saying why.
    let dir = fresh_dir("wrong-password");
    let agent = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["agent", "--node", "nobody", "--cpu", "1000", "--memory", "1000", "--address", "127.0.0.1", "--state-dir"])
        .arg(dir.join("agent"))
        .args(["--etcd", &url, "--etcd-user", "agent-nobody", "--etcd-password", "wrong"])
        .env_remove("CCATTLER_CREDENTIALS")
        .env_remove("CCATTLER_AS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&agent.stderr);
    assert!(!agent.status.success(), "{err}");
    assert!(err.contains("refused the password of user agent-nobody"), "{err}");
    let controller = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["controller", "--listen", &format!("127.0.0.1:{}", free_port()), "--etcd", &url, "--etcd-user", "controller", "--etcd-password", "wrong"])
        .args(["--rules", shipped_rules().to_str().unwrap()])
        .env_remove("CCATTLER_CREDENTIALS")
        .env_remove("CCATTLER_AS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&controller.stderr);
    assert!(!controller.status.success(), "{err}");
    assert!(err.contains("refused the password of user controller"), "{err}");
}

/// `apply`, `plan` and `explain` once needed a `./rules` and failed outside
/// a checkout: the controller publishes the program it runs under
/// `status/program/`, and the CLI uses it when given no `--rules`.
#[tokio::test]
async fn outside_a_checkout_the_cli_uses_the_rules_the_controller_publishes() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let c = Controller::start("program", &shipped_rules());
    settled(&c, &mut etcd, T).await;
    let published = keys(&mut etcd, "status/program/").await;
    let shipped = std::fs::read_dir(shipped_rules()).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "rules")).count();
    assert_eq!(published.len(), shipped, "{:?}", published.iter().map(|(k, _)| k).collect::<Vec<_>>());
    assert!(published.iter().any(|(k, v)| k.ends_with("-intent.rules") && v.contains("effective_instances")));
    let elsewhere = fresh_dir("no-checkout");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(args)
            .current_dir(&elsewhere)
            .env("CCATTLER_CREDENTIALS", credentials())
            .env("CCATTLER_AS", "user")
            .output()
            .unwrap()
    };
    std::fs::write(elsewhere.join("typo.facts"), "desired/servce/web/image = nginx\n").unwrap();
    let out = run(&["apply", "typo.facts"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the rules the cluster runs") && err.contains("did you mean desired/service/web/image?"), "{err}");
    std::fs::write(elsewhere.join("good.facts"), "intent/user/service/web/instances = 2\n").unwrap();
    let out = run(&["apply", "good.facts"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    settled(&c, &mut etcd, T).await;
    let out = run(&["explain", "effective/service/web/instances"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("intent/user/service/web/instances"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The write-back leaves the published files alone.
    assert_eq!(keys(&mut etcd, "status/program/").await.len(), shipped);
    assert!(c.stop().success());
}

/// How many writes `ccattler plan` (one process, the shipped rules) says the
/// controller would still make: 0 when etcd holds what the rules derive.
fn pending_writes() -> Option<usize> {
    let out = ccattler(&["plan", "--etcd", &etcd_url(), "--rules", shipped_rules().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next()?.split(": ").nth(1)?.split(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_group_leads_as_one_and_a_process_killed_mid_write_back_hands_over_to_the_standby_group() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    put_all(&mut etcd, &cluster(50, 500)).await;
    // (Small transactions: a write-back long enough to be cut.)
    let mut a = Group::start_with(&etcd_url(), &credentials(), &secret_key(), "a", &shipped_rules(), 2, &["--max-txn-ops", "32"]);
    settled(&a.lead, &mut etcd, Duration::from_secs(60)).await;
    assert_eq!(instance_count(&mut etcd).await, 500);
    // What the group wrote is what one process derives: nothing left to plan.
    assert_eq!(pending_writes(), Some(0));
    let b = Group::start("b", &shipped_rules(), 2);
    wait_for("the standby group is ready", Duration::from_secs(60), || async { b.lead.metric("revision").is_some_and(|r| r > 0.0) }).await;
    assert_eq!(b.lead.metric("leader"), Some(0.0));

    // A large write-back, and group a's second process killed in the middle of it.
    let from = revision(&mut etcd).await;
    let (_watcher, mut placed) =
        etcd.watch("effective/instance/", Some(etcd_client::WatchOptions::new().with_prefix().with_start_revision(from + 1))).await.unwrap();
    etcd.put("intent/user/service/web/instances", "6000", None).await.unwrap();
    under_way(&mut placed).await;
    a.kill_9(1);
    let killed = Instant::now();
    // The group is one failure domain: process 0 stops too, at once and non-zero.
    let status = exit_within(&mut a.lead.child, Duration::from_secs(15)).expect("process 0 of the group to stop with its peer");
    assert!(!status.success(), "process 0 exited {status} after its peer died");
    let partial = etcd.get("placement/instance/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
    assert!((partial as usize) < 6000, "killed too late to test anything ({partial} placements written)");
    wait_for("the standby group leads", Duration::from_secs(20), || async { b.lead.metric("leader") == Some(1.0) }).await;
    eprintln!("the standby group took over {:?} after the kill", killed.elapsed());
    wait_for("every instance placed", Duration::from_secs(120), || {
        let mut e = etcd.clone();
        async move { e.get("placement/instance/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count() == 6000 }
    })
    .await;
    settled(&b.lead, &mut etcd, Duration::from_secs(60)).await;
    // 0 moved, 0 placed twice, 0 lost.
    for kv in etcd.get("placement/instance/", Some(GetOptions::new().with_prefix())).await.unwrap().kvs() {
        assert_eq!(kv.version(), 1, "{} was overwritten (version {})", kv.key_str().unwrap(), kv.version());
    }
    let per_node = etcd.get("placement/node/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
    assert_eq!(per_node, 6000);
    assert_eq!(pending_writes(), Some(0));
    assert_eq!(status.code(), Some(70), "process 0 stops through the panic hook when its peer dies");

    // New rules need every process: a group refuses SIGHUP and goes on leading.
    b.lead.signal("-HUP");
    wait_for("the reload refused", T, || async { b.lead.log().contains("reload refused, the old rules keep running: a controller group") }).await;
    etcd.put("intent/user/service/web/instances", "6001", None).await.unwrap();
    settled(&b.lead, &mut etcd, Duration::from_secs(60)).await;
    assert_eq!(instance_count(&mut etcd).await, 6001);

    // Stopped in order: process 0 resigns, and the group's other process follows it out cleanly.
    let mut b = b;
    let status = terminate(&mut b.lead.child, Duration::from_secs(20), &b.lead.log);
    assert!(status.success(), "process 0 exited {status} on SIGTERM");
    let status = b.exit_of(1, Duration::from_secs(20)).expect("process 1 to stop with the group");
    assert!(status.success(), "process 1 exited {status} after process 0 stopped the group");
    assert_eq!(get(&mut etcd, "status/leader").await, None, "the group resigned");
}

#[test]
fn a_controller_group_whose_processes_loaded_other_rules_refuses_to_start_and_names_it() {
    let (same, more) = (fresh_dir("group-rules"), fresh_dir("group-other-rules"));
    for e in std::fs::read_dir(shipped_rules()).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "rules")) {
        std::fs::copy(e.path(), same.join(e.file_name())).unwrap();
        std::fs::copy(e.path(), more.join(e.file_name())).unwrap();
    }
    std::fs::write(more.join("zz-extra.rules"), "// a file more than process 0 has\n").unwrap();
    let dir = fresh_dir("group-hosts");
    let addresses = [free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, addresses.join("\n")).unwrap();
    let run = |rules: &std::path::Path, process: &str| {
        Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["controller", "--rules", rules.to_str().unwrap(), "--hosts", hosts.to_str().unwrap(), "--process", process, "--workers", "1"])
            .args(["--etcd", "http://127.0.0.1:1", "--listen", &format!("127.0.0.1:{}", free_port())])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let p0 = run(&same, "0");
    let p1 = run(&more, "1");
    for (i, p) in [(0, p0), (1, p1)] {
        let out = p.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "process {i} started with other rules than its peer:\n{err}");
        assert!(err.contains(&format!("process {} at {}", 1 - i, addresses[1 - i])) && err.contains("loaded other rules"), "process {i}:\n{err}");
    }
}

#[test]
fn a_group_process_0_told_to_stop_while_it_waits_for_its_peers_stops_at_once() {
    let dir = fresh_dir("group-stop-waiting");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port())).unwrap();
    let log = dir.join("p0.log");
    let mut p0 = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["controller", "--rules", shipped_rules().to_str().unwrap(), "--hosts", hosts.to_str().unwrap(), "--process", "0", "--workers", "1"])
        .args(["--etcd", "http://127.0.0.1:1", "--listen", &format!("127.0.0.1:{}", free_port())])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("waiting for the group's processes to connect") {
        assert!(Instant::now() < deadline, "{}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = Instant::now();
    let status = terminate(&mut p0, Duration::from_secs(5), &log);
    assert!(status.success(), "exited {status}");
    assert!(asked.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_group_process_index_outside_the_hosts_file_or_a_bad_line_is_a_usage_error_naming_the_file() {
    let dir = fresh_dir("group-bad-hosts");
    let hosts = dir.join("hosts");
    for (text, process, says) in [
        ("127.0.0.1:7001\n127.0.0.1:7002\n", "2", "process 2 is not below the 2 processes listed"),
        ("127.0.0.1:7001\n127.0.0.1/7002\n", "1", "line 2: \"127.0.0.1/7002\" is not host:port"),
        ("127.0.0.1:7001\n127.0.0.1:7001\n", "1", "127.0.0.1:7001 is listed twice"),
    ] {
        std::fs::write(&hosts, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["controller", "--rules", shipped_rules().to_str().unwrap(), "--hosts", hosts.to_str().unwrap(), "--process", process])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(err.contains(&hosts.display().to_string()) && err.contains(says), "{text:?}: {err}");
    }
}
