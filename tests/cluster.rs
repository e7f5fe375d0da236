//! The live cluster: the real etcd from `scripts/test` with auth on, a real
//! controller, three real `ccattler agent` processes (lease TTL 3 s), each
//! with its own etcd user, and real instance processes (`builtin:http`)
//! answering real HTTP.

mod common;
use common::*;
use etcd_client::{Client, EventType, WatchOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Watches every revision from `from` on and records each one at which a
/// node's placed cpu or memory exceeds its capacity.
fn watch_capacity(etcd: &Client, from: i64, requests: BTreeMap<&'static str, (i64, i64)>) -> Arc<Mutex<Vec<String>>> {
    let violations = Arc::new(Mutex::new(Vec::new()));
    let (mut etcd, out) = (etcd.clone(), violations.clone());
    tokio::spawn(async move {
        let (_w, mut stream) = etcd.watch("", Some(WatchOptions::new().with_prefix().with_start_revision(from))).await.unwrap();
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        while let Ok(Some(resp)) = stream.message().await {
            let mut by_rev: BTreeMap<i64, Vec<(String, Option<String>)>> = BTreeMap::new();
            for ev in resp.events() {
                let kv = ev.kv().unwrap();
                let v = (ev.event_type() == EventType::Put).then(|| kv.value_str().unwrap().to_string());
                by_rev.entry(kv.mod_revision()).or_default().push((kv.key_str().unwrap().to_string(), v));
            }
            for (rev, changes) in by_rev {
                for (k, v) in changes {
                    match v {
                        Some(v) => held.insert(k, v),
                        None => held.remove(&k),
                    };
                }
                let mut used: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
                for (k, n) in held.range("placement/instance/".to_string()..) {
                    let Some(i) = k.strip_prefix("placement/instance/") else { break };
                    let service = i.rsplit_once('-').unwrap().0;
                    let (c, m) = requests[service];
                    let u = used.entry(n.as_str()).or_default();
                    *u = (u.0 + c, u.1 + m);
                }
                for (n, (c, m)) in used {
                    let cap = |f: &str| held.get(&format!("observed/node/{n}/{f}")).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
                    if c > cap("cpu") || m > cap("memory") {
                        out.lock().unwrap().push(format!("revision {rev}: {n} holds cpu {c}/{} memory {m}/{}", cap("cpu"), cap("memory")));
                    }
                }
            }
        }
    });
    violations
}

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_0_6_2_then_kill_9_a_node_and_its_instances_move_without_overcommit() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("scale");
    let start = revision(&mut etcd).await;
    let violations = watch_capacity(&etcd, start + 1, BTreeMap::from([("web", (500, 256))]));
    let _c = Controller::start("scale", &shipped_rules());
    // Capacity for exactly two web instances per node.
    let mut agents: Vec<Agent> = (1..=3).map(|n| Agent::start(&root, n, 1000, 2048, &[])).collect();
    put_facts(
        &mut etcd,
        &[
            ("desired/service/web/image", "builtin:http"),
            ("desired/service/web/cpu", "500"),
            ("desired/service/web/memory", "256"),
            ("desired/probe/web/readiness/method", "http:/healthz"),
            ("intent/user/service/web/instances", "0"),
        ],
    )
    .await;
    wait_for("three ready nodes", T, || {
        let mut e = etcd.clone();
        async move { keys(&mut e, "effective/node/").await.iter().filter(|(_, v)| v == "ready").count() == 3 }
    })
    .await;
    assert!(processes_of("web").is_empty());

    etcd.put("intent/user/service/web/instances", "6", None).await.unwrap();
    wait_for("six endpoints that answer HTTP", T, || {
        let mut e = etcd.clone();
        async move {
            let eps = endpoints(&mut e, "web").await;
            eps.len() == 6 && eps.iter().all(|(i, addr)| http_get(addr).is_some_and(|b| b.starts_with(&format!("{i} of web on node-"))))
        }
    })
    .await;
    let procs = processes_of("web");
    assert_eq!(procs.len(), 6, "{procs:?}");
    assert!(procs.values().all(|p| p.len() == 1), "one process per instance: {procs:?}");

    etcd.put("intent/user/service/web/instances", "2", None).await.unwrap();
    wait_for("scaled down to web-0 and web-1, processes and endpoints", T, || {
        let mut e = etcd.clone();
        async move {
            let eps = endpoints(&mut e, "web").await;
            eps.keys().map(String::as_str).collect::<Vec<_>>() == ["web-0", "web-1"]
                && processes_of("web").keys().map(String::as_str).collect::<Vec<_>>() == ["web-0", "web-1"]
        }
    })
    .await;
    let gone = keys(&mut etcd, "observed/node/").await.into_iter().filter(|(k, _)| k.contains("/instance/web-2/")).collect::<Vec<_>>();
    assert!(gone.is_empty(), "a stopped instance's observed facts go: {gone:?}");

    // kill -9 the node running web-0: it moves within TTL + 2 s and serves again.
    let victim = get(&mut etcd, "placement/instance/web-0").await.unwrap();
    let idx = agents.iter().position(|a| a.node == victim).unwrap();
    let killed_at = Instant::now();
    agents[idx].kill_9();
    wait_for("web-0 placed on another node", Duration::from_secs(TTL + 2), || {
        let mut e = etcd.clone();
        let victim = victim.clone();
        async move { get(&mut e, "placement/instance/web-0").await.is_some_and(|n| n != victim) }
    })
    .await;
    let moved_after = killed_at.elapsed();
    let target = get(&mut etcd, "placement/instance/web-0").await.unwrap();
    let target_addr = agents.iter().find(|a| a.node == target).unwrap().address.clone();
    wait_for("web-0's endpoint on its new node answers", T, || {
        let mut e = etcd.clone();
        let prefix = format!("{target_addr}:");
        let on = format!("on {target}");
        async move {
            let eps = endpoints(&mut e, "web").await;
            eps.get("web-0").is_some_and(|a| a.starts_with(&prefix) && http_get(a).is_some_and(|b| b.contains(&on)))
        }
    })
    .await;
    eprintln!("web-0 re-placed {moved_after:?} after kill -9 of {victim}");
    assert_eq!(get(&mut etcd, &format!("effective/node/{victim}/state")).await.as_deref(), Some("unreachable"));

    // The killed agent comes back over its state dir: the orphaned web-0 it
    // left running is stopped, and no instance ever runs twice.
    agents[idx].spawn();
    wait_for("one process per instance after the restart", T, || async {
        let p = processes_of("web");
        p.keys().map(String::as_str).collect::<Vec<_>>() == ["web-0", "web-1"] && p.values().all(|v| v.len() == 1)
    })
    .await;
    wait_for("the node is ready again", T, || {
        let mut e = etcd.clone();
        let victim = victim.clone();
        async move { get(&mut e, &format!("effective/node/{victim}/state")).await.as_deref() == Some("ready") }
    })
    .await;
    // Coming back does not pull web-0 back.
    assert_eq!(get(&mut etcd, "placement/instance/web-0").await, Some(target));
    for a in &mut agents {
        assert!(a.terminate().success());
    }
    assert!(processes_of("web").is_empty(), "SIGTERM stops every instance");
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "overcommitted: {v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_probes_config_secrets_and_volumes_reach_the_instances_and_a_self_labelled_agent_gets_none() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("spec");
    let _c = Controller::start("spec", &shipped_rules());
    // node-1's agent claims zone b, where the operator put only node-3.
    let _agents: Vec<Agent> = [(1, &["zone=b"][..]), (2, &["zone=a", "--resource=gpu=1"][..]), (3, &["zone=b"][..])]
        .iter()
        .map(|(n, l)| Agent::start(&root, *n, 4000, 8192, l))
        .collect();
    put_facts(
        &mut etcd,
        &[
            // The operator's labels, which selectors match.
            ("desired/node/node-1/label/zone", "a"),
            ("desired/node/node-2/label/zone", "a"),
            ("desired/node/node-3/label/zone", "b"),
            // zone b only, with config, a granted secret and a persistent volume.
            ("desired/service/db/image", "builtin:http"),
            ("desired/service/db/selector/zone", "b"),
            ("desired/config/db/LOG_LEVEL", "debug"),
            ("desired/secret_grant/db/db-pass", ""),
            ("desired/volume/data/size", "1"),
            ("desired/volume/data/persistent", "true"),
            ("desired/service/db/volume/data", "/var/lib/db"),
            ("intent/user/service/db/instances", "2"),
            // A readiness probe that fails: running, but no endpoint.
            ("desired/service/gated/image", "builtin:http"),
            ("desired/probe/gated/readiness/method", "http:/missing"),
            ("intent/user/service/gated/instances", "1"),
            // One gpu in the cluster (node-2's `--resource gpu=1`): one trainer runs.
            ("desired/service/train/image", "builtin:http"),
            ("desired/service/train/resource/gpu", "1"),
            ("intent/user/service/train/instances", "2"),
        ],
    )
    .await;
    set_secret("db-pass", "s3cret");
    wait_for("db's two endpoints", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "db").await.len() == 2 }
    })
    .await;
    for i in ["db-0", "db-1"] {
        assert_eq!(get(&mut etcd, &format!("placement/instance/{i}")).await.as_deref(), Some("node-3"), "the selector keeps {i} on zone b");
    }
    assert!(
        etcd.get("secret/node/node-1/", Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap().kvs().is_empty(),
        "node-1's agent said zone=b of itself: it gets neither db nor its secret"
    );
    // The instance's environment: port, config, secret, volume.
    let pid = processes_of("db")["db-0"][0];
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let env: BTreeMap<String, String> =
        environ.split(|b| *b == 0).filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
    assert_eq!(env["LOG_LEVEL"], "debug");
    assert_eq!(env["SECRET_DB_PASS"], "s3cret");
    assert_eq!(env["VOLUME_DATA_MOUNT"], "/var/lib/db");
    assert!(Path::new(&env["VOLUME_DATA"]).is_dir());
    assert!(env["VOLUME_DATA"].starts_with(root.join("node-3").to_str().unwrap()));
    let port = get(&mut etcd, "observed/node/node-3/instance/db-0/port").await.unwrap();
    assert_eq!(env["PORT"], port);
    assert_eq!(get(&mut etcd, "observed/node/node-3/volume/data/size").await.as_deref(), Some("1"));
    assert_eq!(get(&mut etcd, "effective/volume/data/node").await.as_deref(), Some("node-3"));

    wait_for("gated runs but is unhealthy", T, || {
        let mut e = etcd.clone();
        async move {
            get(&mut e, "effective/instance/gated-0/state").await.as_deref() == Some("running")
                && get(&mut e, "effective/instance/gated-0/health").await.as_deref() == Some("unhealthy")
                && processes_of("gated").contains_key("gated-0")
        }
    })
    .await;
    assert!(endpoints(&mut etcd, "gated").await.is_empty(), "no endpoint while the readiness probe fails");
    let before = processes_of("gated");
    // A working probe: the endpoint appears, without restarting the instance.
    etcd.put("desired/probe/gated/readiness/method", "tcp", None).await.unwrap();
    wait_for("gated's endpoint once its probe passes", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "gated").await.len() == 1 }
    })
    .await;
    assert_eq!(processes_of("gated"), before);
    assert_eq!(get(&mut etcd, "observed/node/node-2/resource/gpu").await.as_deref(), Some("1"));
    wait_for("train-0 runs", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "effective/instance/train-0/state").await.as_deref() == Some("running") }
    })
    .await;
    assert_eq!(get(&mut etcd, "placement/instance/train-0").await.as_deref(), Some("node-2"), "the node with the gpu");
    assert_eq!(get(&mut etcd, "placement/instance/train-1").await, None, "one gpu, one trainer");
    assert_eq!(processes_of("train").len(), 1);
}

/// The 900 KB config wedge: a node's view larger than etcd's 4 MiB message
/// limit (20 instances × 240 KB of config) is read in pages, and every
/// instance starts with its config; a config past one instance's budget
/// (900 KB) is refused with its reason under `status/config/`, its instance
/// waits, and the node stays ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_past_etcds_message_limit_is_read_in_pages_and_a_900_kb_config_is_refused_by_name() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("big-view");
    let _c = Controller::start("big-view", &shipped_rules());
    let _agent = Agent::start(&root, 1, 4000, 8192, &[]);
    let (a, b) = ("a".repeat(120_000), "b".repeat(120_000));
    put_facts(
        &mut etcd,
        &[
            ("desired/service/big/image", "builtin:http"),
            ("desired/service/big/cpu", "10"),
            ("desired/config/big/A", &a),
            ("desired/config/big/B", &b),
            ("intent/user/service/big/instances", "20"),
        ],
    )
    .await;
    wait_for("all 20 instances of big run", Duration::from_secs(90), || {
        let mut e = etcd.clone();
        async move {
            let mut running = 0;
            for i in 0..20 {
                running += usize::from(get(&mut e, &format!("effective/instance/big-{i}/state")).await.as_deref() == Some("running"));
            }
            running == 20 && processes_of("big").len() == 20
        }
    })
    .await;
    let view: usize = etcd
        .get("effective/node/node-1/", Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .filter(|kv| kv.key_str().unwrap().contains("/config/"))
        .count();
    assert_eq!(view, 40, "20 instances × 2 config entries in the node's view (≈ 4.8 MB)");
    let pid = processes_of("big")["big-19"][0];
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(environ.windows(a.len() + 2).any(|w| w == format!("A={a}").as_bytes()), "big-19 runs with its config");

    etcd.put("desired/service/huge/image", "builtin:http", None).await.unwrap();
    etcd.put("desired/config/huge/BLOB", "x".repeat(900_000), None).await.unwrap();
    etcd.put("intent/user/service/huge/instances", "1", None).await.unwrap();
    wait_for("huge's config is refused by name", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/config/huge").await.is_some_and(|r| r.contains("config entry BLOB is 900006 bytes")) }
    })
    .await;
    assert!(get(&mut etcd, "status/unplaced/huge-0").await.is_some_and(|r| r.contains("status/config/huge")));
    assert_eq!(get(&mut etcd, "placement/instance/huge-0").await, None);
    assert_eq!(get(&mut etcd, "effective/node/node-1/state").await.as_deref(), Some("ready"));
    assert_eq!(get(&mut etcd, "observed/node/node-1/view_error").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_after_kill_9_adopts_its_instances_and_a_crashed_instance_restarts() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("adopt");
    let _c = Controller::start("adopt", &shipped_rules());
    let mut agent = Agent::start(&root, 1, 4000, 8192, &[]);
    put_facts(&mut etcd, &[("desired/service/app/image", "builtin:http"), ("intent/user/service/app/instances", "2")]).await;
    wait_for("two endpoints", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "app").await.len() == 2 }
    })
    .await;
    let before = processes_of("app");
    let lease = get(&mut etcd, "observed/node/node-1/alive").await.unwrap();

    // Killed and restarted within the TTL: same lease, same processes.
    agent.kill_9();
    agent.spawn();
    wait_for("the restarted agent keeps its lease and reports its instances", T, || {
        let mut e = etcd.clone();
        let log = agent.log.clone();
        async move {
            std::fs::read_to_string(&log).unwrap_or_default().matches("registered with etcd").count() == 2
                && get(&mut e, "observed/node/node-1/instance/app-0/state").await.as_deref() == Some("running")
        }
    })
    .await;
    assert_eq!(get(&mut etcd, "observed/node/node-1/alive").await, Some(lease.clone()), "the lease was reused");
    assert_eq!(processes_of("app"), before, "adopted, not restarted or duplicated");

    // An instance that dies is started again, and says so.
    let pid = before["app-1"][0];
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    wait_for("app-1 restarted", T, || {
        let mut e = etcd.clone();
        async move {
            let p = processes_of("app");
            p.get("app-1").is_some_and(|v| v.len() == 1 && v[0] != pid)
                && get(&mut e, "observed/node/node-1/instance/app-1/restarts").await.as_deref() == Some("1")
                && get(&mut e, "observed/node/node-1/instance/app-1/state").await.as_deref() == Some("running")
        }
    })
    .await;

    // The lease is lost (revoked here, as if it had expired): the agent takes
    // a new one and registers again. Meanwhile the node was unreachable, so
    // the controller may have taken its instances away and given them back.
    etcd.lease_revoke(lease.parse().unwrap()).await.unwrap();
    wait_for("re-registered under a new lease with its instances", T, || {
        let mut e = etcd.clone();
        let old = lease.clone();
        async move {
            get(&mut e, "observed/node/node-1/alive").await.is_some_and(|l| l != old)
                && get(&mut e, "observed/node/node-1/instance/app-1/state").await.as_deref() == Some("running")
                && get(&mut e, "observed/node/node-1/probe_state/app-1/readiness").await.is_none()
                && endpoints(&mut e, "app").await.len() == 2
        }
    })
    .await;
    assert!(processes_of("app").values().all(|p| p.len() == 1));

    // SIGTERM: instances stopped, lease revoked at once (not after the TTL).
    assert!(agent.terminate().success());
    assert!(processes_of("app").is_empty());
    assert_eq!(get(&mut etcd, "observed/node/node-1/alive").await, None);
    assert!(keys(&mut etcd, "observed/node/node-1/instance/").await.is_empty());
    let left: BTreeSet<String> =
        std::fs::read_dir(root.join("node-1/instances")).unwrap().flatten().map(|d| d.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.is_empty(), "instance dirs removed: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_keep_running_while_etcd_is_down_and_the_agent_reconnects() {
    let _serial = serial();
    let root = scratch("outage");
    std::fs::create_dir_all(root.join("etcd")).unwrap();
    let etcd = PrivateEtcd::start(root.join("etcd"), free_port(), free_port());
    let mut client = etcd.client().await;
    // No controller: placements are written by hand, as the controller would.
    // An outage shorter than the fencing bound (TTL 15 s: instances stop
    // ~10 s after the last renewal) leaves instances running; with the
    // suite's TTL of 3 s, an etcd restart of 2 s under load crossed the bound
    // and the agent rightly fenced solo-0 (a longer outage is the partition
    // test's case).
    let mut agent = Agent::start_on(&etcd.url(), &etcd.credentials(), &root, 1, 1000, 1000, &["--ttl=15"]);
    for (k, v) in [("effective/node/node-1/instance/solo-0/image", "builtin:http"), ("placement/node/node-1/solo-0", "solo")] {
        client.put(k, v, None).await.unwrap();
    }
    // (Reported running once started: its process may not have exec'd yet.)
    wait_for("solo-0 runs", T, || {
        let mut e = client.clone();
        async move { get(&mut e, "observed/node/node-1/instance/solo-0/state").await.as_deref() == Some("running") && processes_of("solo").contains_key("solo-0") }
    })
    .await;
    let before = processes_of("solo");
    let etcd = {
        let mut etcd = etcd;
        let _ = etcd.child.kill();
        let _ = etcd.child.wait();
        wait_for("the agent notices etcd is gone", T, || async { std::fs::read_to_string(&agent.log).unwrap_or_default().contains("lost etcd") }).await;
        assert_eq!(processes_of("solo"), before, "instances keep running without etcd");
        etcd.restart()
    };
    let mut client = etcd.client().await;
    // A change made while the agent reconnects is acted on.
    client.put("effective/node/node-1/instance/solo-1/image", "builtin:http", None).await.unwrap();
    client.put("placement/node/node-1/solo-1", "solo", None).await.unwrap();
    wait_for("reconnected; solo-1 runs too", T, || {
        let mut e = client.clone();
        async move { get(&mut e, "observed/node/node-1/instance/solo-1/state").await.as_deref() == Some("running") }
    })
    .await;
    assert_eq!(processes_of("solo")["solo-0"], before["solo-0"]);
    assert!(get(&mut client, "observed/node/node-1/alive").await.is_some());
    assert!(agent.terminate().success());
    assert!(processes_of("solo").is_empty());
}

/// Samples every 50 ms, from `since` for at most `within`, until `instance`
/// serves from a node other than `victim`: the most processes one instance
/// of `service` ever had at once, when `instance` had no process left, and
/// when it served elsewhere.
async fn until_moved(
    etcd: &mut Client,
    service: &str,
    instance: &str,
    victim: &str,
    since: Instant,
    within: Duration,
) -> (usize, Option<Duration>, Option<Duration>) {
    let (mut most, mut gone, mut moved) = (0, None, None);
    while moved.is_none() && since.elapsed() < within {
        let procs = processes_of(service);
        most = most.max(procs.values().map(Vec::len).max().unwrap_or(0));
        if gone.is_none() && procs.get(instance).is_none_or(|p| p.is_empty()) {
            gone = Some(since.elapsed());
        }
        let placed = get(etcd, &format!("placement/instance/{instance}")).await;
        if placed.is_some_and(|n| n != victim) && endpoints(etcd, service).await.contains_key(instance) {
            moved = Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (most, gone, moved)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_9_fences_its_instances_so_none_ever_runs_twice() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("fence");
    let _c = Controller::start("fence", &shipped_rules());
    let mut agents: Vec<Agent> = (1..=2).map(|n| Agent::start(&root, n, 4000, 8192, &[])).collect();
    put_facts(&mut etcd, &[("desired/service/fenced/image", "builtin:http"), ("intent/user/service/fenced/instances", "2")]).await;
    wait_for("fenced's two endpoints", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "fenced").await.len() == 2 }
    })
    .await;
    let victim = get(&mut etcd, "placement/instance/fenced-0").await.unwrap();
    let idx = agents.iter().position(|a| a.node == victim).unwrap();
    let killed = Instant::now();
    agents[idx].kill_9();
    // Never two processes for one instance, and the orphan gone before its replacement.
    let (most, orphan_gone, moved) = until_moved(&mut etcd, "fenced", "fenced-0", &victim, killed, Duration::from_secs(TTL + 10)).await;
    let (gone, moved) = (orphan_gone.expect("the orphan was fenced"), moved.expect("fenced-0 runs elsewhere"));
    eprintln!("after kill -9: orphan fenced at {gone:?}, fenced-0 serving elsewhere at {moved:?}");
    assert_eq!(most, 1, "an instance ran twice");
    assert!(gone <= moved, "the orphan outlived its replacement's start");
    assert!(gone <= Duration::from_secs(TTL + 1), "fenced only after {gone:?} (lease TTL {TTL} s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_agent_fences_its_instances_before_their_replacements_start_elsewhere() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("partition");
    let _c = Controller::start("partition", &shipped_rules());
    // Each agent reaches etcd through a proxy of its own: cutting one is a
    // partition between that agent (alive, its instances running) and etcd.
    let proxies: Vec<Proxy> = (0..2).map(|_| Proxy::start(&etcd_url())).collect();
    let mut agents: Vec<Agent> = (1..=2).map(|n| Agent::start_on(&proxies[n - 1].url(), &credentials(), &root, n, 4000, 8192, &[])).collect();
    put_facts(&mut etcd, &[("desired/service/cut/image", "builtin:http"), ("intent/user/service/cut/instances", "2")]).await;
    wait_for("cut's two endpoints", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "cut").await.len() == 2 }
    })
    .await;
    let victim = get(&mut etcd, "placement/instance/cut-0").await.unwrap();
    let idx = agents.iter().position(|a| a.node == victim).unwrap();
    let cut_at = Instant::now();
    proxies[idx].cut();
    // Never two processes for one instance, and the partitioned copy gone before its replacement.
    let (most, fenced, moved) = until_moved(&mut etcd, "cut", "cut-0", &victim, cut_at, Duration::from_secs(TTL + 15)).await;
    let (fenced, moved) = (fenced.expect("the partitioned instance was fenced"), moved.expect("cut-0 runs elsewhere"));
    eprintln!("partition: cut-0 fenced at {fenced:?}, serving elsewhere at {moved:?}, most processes for one instance {most}");
    assert_eq!(most, 1, "an instance ran twice across the partition");
    assert!(fenced <= moved, "the partitioned copy outlived its replacement's start");
    assert!(agents[idx].child.as_mut().unwrap().try_wait().unwrap().is_none(), "the partitioned agent itself lives on");
    // Healed: the agent registers again and runs nothing twice.
    proxies[idx].heal();
    wait_for("the healed agent's node is alive again", T, || {
        let mut e = etcd.clone();
        let node = victim.clone();
        async move { get(&mut e, &format!("observed/node/{node}/alive")).await.is_some() }
    })
    .await;
    assert!(processes_of("cut").values().all(|p| p.len() <= 1), "{:?}", processes_of("cut"));
}

/// A controller and three ready agents running six instances of `web` (this
/// image, a tcp readiness probe), all six serving: what the drain and rollout
/// tests start from. The second value keeps the processes alive.
async fn six_web_instances_behind_a_probe(name: &str, image: &str) -> (etcd_client::Client, (Controller, Vec<Agent>)) {
    let mut etcd = fresh_etcd().await;
    let root = scratch(name);
    let c = Controller::start(name, &shipped_rules());
    let agents: Vec<Agent> = (1..=3).map(|n| Agent::start(&root, n, 4000, 8192, &[])).collect();
    ready_nodes(&etcd, 3).await;
    put_facts(
        &mut etcd,
        &[
            ("desired/service/web/image", image),
            ("desired/service/web/cpu", "100"),
            ("desired/probe/web/readiness/method", "tcp"),
            ("intent/user/service/web/instances", "6"),
        ],
    )
    .await;
    wait_for("six endpoints", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "web").await.len() == 6 }
    })
    .await;
    (etcd, (c, agents))
}

/// Reads a service's endpoints every 100 ms until stopped; `stop` gives the
/// fewest it saw.
struct FewestEndpoints {
    fewest: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FewestEndpoints {
    fn start(etcd: &etcd_client::Client, service: &'static str) -> FewestEndpoints {
        let fewest = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (f, st, mut e) = (fewest.clone(), stop.clone(), etcd.clone());
        let task = tokio::spawn(async move {
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                let n = endpoints(&mut e, service).await.len();
                f.fetch_min(n, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        FewestEndpoints { fewest, stop, task }
    }

    async fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.unwrap();
        self.fewest.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `ccattler node drain`: with three real agents and a service of six behind
/// a readiness probe, a sampler reading the endpoints every 100 ms never sees
/// fewer than five (the default budget: all but one) while node-1 drains,
/// and the drain completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_a_nodes_instances_without_going_below_the_budget() {
    let _serial = serial();
    let (mut etcd, _cluster) = six_web_instances_behind_a_probe("drain", "builtin:http").await;
    let on_node_1 = keys(&mut etcd, "placement/node/node-1/").await.len();
    assert!(on_node_1 >= 2, "spread puts two on each node: {on_node_1}");
    let sampler = FewestEndpoints::start(&etcd, "web");
    let out = tokio::task::spawn_blocking(|| ccattler_as("user", &["node", "drain", "node-1", "--wait", "60"])).await.unwrap();
    let fewest = sampler.stop().await;
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("node-1: drained"));
    assert!(keys(&mut etcd, "placement/node/node-1/").await.is_empty());
    assert!(fewest >= 5, "endpoints fell to {fewest} during the drain");
    wait_for("six endpoints again, elsewhere", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "web").await.len() == 6 }
    })
    .await;
    // Uncordon: node-1 takes instances again.
    let out = ccattler_as("user", &["node", "uncordon", "node-1"]);
    assert!(out.status.success());
    etcd.put("intent/user/service/web/instances", "9", None).await.unwrap();
    wait_for("node-1 takes new instances", T, || {
        let mut e = etcd.clone();
        async move { !keys(&mut e, "placement/node/node-1/").await.is_empty() }
    })
    .await;
    // A name that is not one is refused before anything is written.
    let out = ccattler_as("user", &["node", "cordon", "node-1/../x"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A rolling update with three real agents: a service of six behind a
/// readiness probe gets a new image; a sampler reading the endpoints every
/// 100 ms never sees fewer than five (6 − max_unavailable), every instance
/// ends on the new image, and `ccattler rollout status --watch` sees it
/// complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_never_takes_more_than_max_unavailable_down() {
    let _serial = serial();
    let (mut etcd, _cluster) = six_web_instances_behind_a_probe("rollout", "builtin:http#1").await;
    wait_for("the rollout status says complete", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/rollout/web/state").await.as_deref() == Some("complete") }
    })
    .await;
    let before = processes_of("web");
    let sampler = FewestEndpoints::start(&etcd, "web");
    etcd.put("desired/service/web/image", "builtin:http#2", None).await.unwrap();
    wait_for("the rollout to start (generation 2)", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/rollout/web/generation").await.as_deref() == Some("2") }
    })
    .await;
    let out = tokio::task::spawn_blocking(|| ccattler_as("user", &["rollout", "status", "web", "--watch", "--timeout", "60"])).await.unwrap();
    wait_for("six endpoints after the rollout", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "web").await.len() == 6 }
    })
    .await;
    let fewest = sampler.stop().await;
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{printed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("web: generation 2, 6/6 updated, 6 ready, complete"), "{printed}");
    assert!(fewest >= 5, "endpoints fell to {fewest} during the rollout");
    for i in 0..6 {
        let node = get(&mut etcd, &format!("placement/instance/web-{i}")).await.unwrap();
        let image = get(&mut etcd, &format!("observed/node/{node}/instance/web-{i}/image")).await;
        assert_eq!(image.as_deref(), Some("builtin:http#2"), "web-{i}");
    }
    // Every instance was restarted once, with the new image.
    let after = processes_of("web");
    for (i, pids) in &after {
        assert_ne!(before.get(i), Some(pids), "{i} was not restarted");
    }
}

/// A crashing new template stalls its rollout at once: the agent once
/// dropped `version` while an instance was crashed, so the stall rule never
/// saw that the crash was the new template's and the rollout said
/// "progressing" for the whole progress deadline (300 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_new_template_stalls_the_rollout_within_seconds() {
    let _serial = serial();
    let (mut etcd, _cluster) = six_web_instances_behind_a_probe("crashroll", "builtin:http#1").await;
    wait_for("the rollout status says complete", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/rollout/web/state").await.as_deref() == Some("complete") }
    })
    .await;
    etcd.put("desired/service/web/image", "exec:/bin/false", None).await.unwrap();
    let t = Instant::now();
    wait_for("the rollout to start (generation 2)", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/rollout/web/generation").await.as_deref() == Some("2") }
    })
    .await;
    let out = tokio::task::spawn_blocking(|| ccattler_as("user", &["rollout", "status", "web", "--watch", "--timeout", "60"])).await.unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "stalled is a failure of --watch: {printed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("stalled: web-") && printed.contains("runs the new template and is crashed"), "{printed}");
    assert!(t.elapsed() < Duration::from_secs(30), "stalled after {:?}, not within a few probe periods", t.elapsed());
    eprintln!("a crashing template stalled its rollout {:?} after the image change", t.elapsed());
    // The budget held: the other five still serve the old template.
    assert!(endpoints(&mut etcd, "web").await.len() >= 5);
}

/// The autoscaler daemon, as its own etcd user, over three real agents:
/// load on a service's instances (the built-in HTTP image burns cpu on
/// `/burn`) scales it up to its max, and down again once the load stops and
/// the window has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_scales_a_service_up_and_its_end_scales_it_down_after_the_window() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("autoscale");
    let _c = Controller::start("autoscale", &shipped_rules());
    let _agents: Vec<Agent> = (1..=3).map(|n| Agent::start(&root, n, 4000, 8192, &[])).collect();
    let log = std::fs::File::create(root.join("autoscaler.log")).unwrap();
    let rules = shipped_rules().join("autoscaler");
    let _autoscaler = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["autoscaler", "--period", "1", "--rules", rules.to_str().unwrap(), "--etcd", &etcd_url()])
            .args(["--credentials", credentials().to_str().unwrap(), "--as", "autoscaler"])
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    put_facts(
        &mut etcd,
        &[
            ("desired/service/web/image", "builtin:http"),
            ("desired/service/web/cpu", "100"),
            ("desired/probe/web/readiness/method", "tcp"),
            ("desired/service/web/autoscale/max", "3"),
            ("desired/service/web/autoscale/target_cpu", "50"),
            ("desired/service/web/autoscale/window", "5"),
            ("intent/user/service/web/instances", "1"),
        ],
    )
    .await;
    wait_for("web's endpoint", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "web").await.len() == 1 }
    })
    .await;
    // Load: two clients burning 300 ms a request on the one instance.
    let address = endpoints(&mut etcd, "web").await.into_values().next().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (stop, address) = (stop.clone(), address.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if http_get_path(&address, "/burn?ms=300").is_none() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
        })
        .collect();
    wait_for("the autoscaler asks for 3 and web has 3 instances", Duration::from_secs(60), || {
        let mut e = etcd.clone();
        async move {
            get(&mut e, "intent/autoscaler/service/web/instances").await.as_deref() == Some("3")
                && get(&mut e, "effective/service/web/instances").await.as_deref() == Some("3")
        }
    })
    .await;
    let used: i64 = get(&mut etcd, "effective/service/web/usage/cpu").await.unwrap().parse().unwrap();
    assert!(used > 150, "the load shows as cpu use: {used} millicores");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in load {
        t.join().unwrap();
    }
    let quiet = Instant::now();
    // Within: a node's usage changes at most every 30 s (agent/src/usage.rs),
    // then a 5 s sample, the 5 s window and the autoscaler's period.
    wait_for("back to the user's 1 after the window", Duration::from_secs(90), || {
        let mut e = etcd.clone();
        async move { get(&mut e, "effective/service/web/instances").await.as_deref() == Some("1") }
    })
    .await;
    // The window runs from the last recommendation of 3, made from the last
    // usage sample that saw the load: at the earliest one autoscaler period
    // (1 s) before the load stopped.
    assert!(quiet.elapsed() >= Duration::from_secs(4), "not before the 5 s window: {:?}", quiet.elapsed());
}

/// `ccattler status` against a live cluster: the tables an operator reads
/// (they once came from an awk script of the demo's), and `--watch`
/// redrawing when a node dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_the_cluster_as_tables_and_watch_follows_a_node_dying() {
    let _serial = serial();
    let (mut etcd, (c, mut agents)) = six_web_instances_behind_a_probe("status", "builtin:http").await;
    etcd.put("desired/service/huge/cpu", "100000", None).await.unwrap();
    etcd.put("intent/user/service/huge/instances", "1", None).await.unwrap();
    wait_for("huge-0 waits", T, || {
        let mut e = etcd.clone();
        async move { get(&mut e, "status/unplaced/huge-0").await.is_some() }
    })
    .await;
    let run = |args: &[&str]| {
        let out = ccattler_as("user", args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let nodes = run(&["status", "nodes", "-o", "wide"]);
    assert!(nodes.starts_with("NAME") && nodes.contains("ADDRESS"), "{nodes}");
    for n in 1..=3 {
        let line = nodes.lines().find(|l| l.starts_with(&format!("node-{n} "))).unwrap_or_else(|| panic!("node-{n}: {nodes}"));
        assert!(line.contains("ready") && line.contains("200/4000") && line.contains(&format!("127.0.0.{}", 10 + n)), "{line}");
    }
    let services = run(&["status", "services"]);
    let web = services.lines().find(|l| l.starts_with("web ")).unwrap_or_else(|| panic!("{services}"));
    assert_eq!(web.split_whitespace().collect::<Vec<_>>(), ["web", "6", "6", "6", "6", "complete"], "{services}");
    let pending = run(&["status", "pending"]);
    assert!(pending.contains("huge-0") && pending.contains("huge"), "{pending}");
    let json: serde_json::Value = serde_json::from_str(&run(&["status", "instances", "--format", "json"])).unwrap();
    assert_eq!(json["tables"][0]["rows"].as_array().unwrap().len(), 7, "{json}");
    let summary = run(&["status"]);
    assert!(summary.contains("3 ready") && summary.contains("6 running"), "{summary}");

    // --watch redraws when the cluster changes: node-3's agent dies.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .args(["status", "nodes", "--watch"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CCATTLER_CREDENTIALS", credentials())
        .env("CCATTLER_AS", "user")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                seen.lock().unwrap().push_str(&(line + "\n"));
            }
        })
    };
    wait_for("the first table", T, || {
        let seen = seen.clone();
        async move { seen.lock().unwrap().contains("node-3") }
    })
    .await;
    agents[2].kill_9();
    wait_for("node-3 shown unreachable without a rerun", Duration::from_secs(TTL + 10), || {
        let seen = seen.clone();
        async move { seen.lock().unwrap().lines().any(|l| l.starts_with("node-3 ") && l.contains("unreachable")) }
    })
    .await;
    let _ = watch.kill();
    let _ = watch.wait();
    let _ = reader.join();
    // The controller's cluster metrics say the same.
    wait_for("/metrics counts nodes and instances by state", T, || async {
        let body = c.metrics_text();
        [
            "ccattler_nodes{state=\"unreachable\"} 1",
            "ccattler_nodes{state=\"ready\"} 2",
            "ccattler_unplaced_instances 1",
            "ccattler_rollouts{state=\"complete\"} 2",
        ]
        .iter()
        .all(|l| body.lines().any(|b| b == *l))
    })
    .await;
    let body = c.metrics_text();
    assert!(body.lines().any(|l| l.starts_with("ccattler_instances{state=\"running\"}")), "{body}");
}

/// Heartbeats carry the cluster clock and the controller records nothing
/// per beat, so a node's verdict is a function of what etcd holds. A
/// controller killed and replaced (twice, at once, with no standby) must
/// never find a live node stale — the clock stands still without a leader
/// and goes on from where it stood — and must find a node whose agent beat
/// once and stopped unreachable, and keep it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restarts_never_flip_a_live_node_and_a_silent_one_stays_unreachable() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("restart-verdict");
    let mut c = Controller::start("verdict-a", &shipped_rules());
    let _agents: Vec<Agent> = (1..=2).map(|n| Agent::start(&root, n, 4000, 8192, &[])).collect();
    ready_nodes(&etcd, 2).await;
    let clock = |mut e: Client| async move { get(&mut e, "status/clock").await.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0) };
    // A node whose agent beat once, at the clock as it is now, and stopped;
    // its `alive` key is kept (as a user keeping its lease alive would).
    // The beat, TTL and lease go first and the capacity (which makes the node
    // known) last: put the other way round, the node is first known without
    // a beat, found unreachable for that, and then briefly ready — and the
    // wait below could take that first verdict for the stale one.
    let now = clock(etcd.clone()).await;
    let beat = now.to_string();
    put_facts(
        &mut etcd,
        &[
            ("observed/node/silent/heartbeat", &beat),
            ("observed/node/silent/ttl", "3"),
            ("observed/node/silent/alive", "1"),
            ("observed/node/silent/cpu", "1000"),
        ],
    )
    .await;
    wait_for("the silent node found unreachable, its beat older than its TTL", T, || {
        let mut e = etcd.clone();
        async move { clock(e.clone()).await > now + 3 && get(&mut e, "effective/node/silent/state").await.as_deref() == Some("unreachable") }
    })
    .await;
    // Every state any node is given from here on.
    let from = revision(&mut etcd).await + 1;
    let states: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let (mut w, seen) = (etcd.clone(), states.clone());
    tokio::spawn(async move {
        let (_w, mut stream) = w.watch("effective/node/", Some(WatchOptions::new().with_prefix().with_start_revision(from))).await.unwrap();
        while let Ok(Some(resp)) = stream.message().await {
            for ev in resp.events() {
                let kv = ev.kv().unwrap();
                let v = if ev.event_type() == EventType::Put { kv.value_str().unwrap().to_string() } else { "(deleted)".into() };
                seen.lock().unwrap().push((kv.key_str().unwrap().to_string(), v));
            }
        }
    });
    for id in ["verdict-b", "verdict-c"] {
        c.child.kill().unwrap();
        c.child.wait().unwrap();
        c = Controller::start(id, &shipped_rules());
        let at = clock(etcd.clone()).await;
        // Past the live nodes' TTL (3 s) on the clock, under the new leader.
        wait_for(&format!("{id} leads and the clock passes {}", at + 8), Duration::from_secs(40), || {
            let e = etcd.clone();
            async move { clock(e).await > at + 8 }
        })
        .await;
    }
    let seen = states.lock().unwrap().clone();
    let flipped: Vec<&(String, String)> = seen.iter().filter(|(k, v)| k.ends_with("/state") && !k.contains("/silent/") && v != "ready").collect();
    assert!(flipped.is_empty(), "a live node was given another state across the restarts: {flipped:?}");
    let silent: Vec<&(String, String)> = seen.iter().filter(|(k, _)| k == "effective/node/silent/state").collect();
    assert!(silent.iter().all(|(_, v)| v == "unreachable"), "the silent node was found alive: {silent:?}");
    assert_eq!(get(&mut etcd, "effective/node/silent/state").await.as_deref(), Some("unreachable"));
    assert_eq!(get(&mut etcd, "effective/node/node-1/state").await.as_deref(), Some("ready"));
}
