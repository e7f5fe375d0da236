//! Instances confined as a kubelet confines pods, tried as a hostile tenant
//! would: the real etcd with auth on, a real agent (as root, so instances run
//! as uids of their own, in cgroups of their own), placements written by
//! hand as the controller writes them, and real `exec:` instances.

mod common;
use common::*;
use etcd_client::Client;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Places `instance` of `service` on node-1 with `image` (and any extra view keys).
async fn place(etcd: &mut Client, instance: &str, service: &str, image: &str, extra: &[(&str, &str)]) {
    let view = format!("effective/node/node-1/instance/{instance}");
    etcd.put(format!("{view}/image"), image, None).await.unwrap();
    for (k, v) in extra {
        etcd.put(format!("{view}/{k}"), *v, None).await.unwrap();
    }
    etcd.put(format!("placement/node/node-1/{instance}"), service, None).await.unwrap();
}

async fn state(etcd: &mut Client, instance: &str, field: &str) -> Option<String> {
    get(etcd, &format!("observed/node/node-1/instance/{instance}/{field}")).await
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its parent has not reaped it yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Waits until `path` exists (an instance or probe wrote it; they write and rename).
async fn appears(what: &str, path: &Path) {
    wait_for(what, T, || {
        let p = path.to_path_buf();
        async move { p.exists() }
    })
    .await;
}

/// A directory any instance user may write its findings to.
fn drop_box(root: &Path) -> PathBuf {
    let d = root.join("dropbox");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_that_calls_setsid_is_stopped_with_its_instance_and_sigterm_reaches_exec_instances() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("setsid");
    let out = drop_box(&root);
    let mut agent = Agent::start(&root, 1, 4000, 8192, &[]);
    // The escapee leaves the instance's process group and session.
    let escapee = out.join("escapee");
    let cmd = format!("setsid sh -c 'echo $$ > {}; exec sleep 1000' & exec sleep 1000", escapee.display());
    place(&mut etcd, "runaway-0", "runaway", &format!("exec:{cmd}"), &[]).await;
    // A shell that traps SIGTERM and says so: it can only if SIGTERM is not ignored.
    let termed = out.join("termed");
    let polite = format!("trap 'echo term > {}; exit 0' TERM; while :; do sleep 0.1; done", termed.display());
    place(&mut etcd, "polite-0", "polite", &format!("exec:{polite}"), &[]).await;
    wait_for("both run", T, || {
        let mut e = etcd.clone();
        async move {
            state(&mut e, "runaway-0", "state").await.as_deref() == Some("running") && state(&mut e, "polite-0", "state").await.as_deref() == Some("running")
        }
    })
    .await;
    wait_for("the escapee wrote its pid", T, || async { read_pid(&escapee).is_some() }).await;
    let pid = read_pid(&escapee).unwrap();
    assert!(alive(pid));
    // Scale to 0: both placements go.
    etcd.delete("placement/node/node-1/runaway-0", None).await.unwrap();
    etcd.delete("placement/node/node-1/polite-0", None).await.unwrap();
    wait_for("the setsid escapee is stopped with its instance", T, || async move { !alive(pid) }).await;
    wait_for("the exec instance got SIGTERM (not a SIGKILL after the grace)", T, || {
        let t = termed.clone();
        async move { std::fs::read_to_string(&t).is_ok_and(|s| s.contains("term")) }
    })
    .await;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_run_as_their_own_users_cannot_read_each_others_environment_and_probes_get_no_agent_variables() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("tenants");
    let out = drop_box(&root);
    let mut agent = Agent::start(&root, 1, 4000, 8192, &[]);
    // The victim holds a token in its environment.
    place(&mut etcd, "victim-0", "victim", "exec:exec sleep 1000", &[("config/TOKEN", "canary-token-9f3")]).await;
    wait_for("the victim runs", T, || {
        let mut e = etcd.clone();
        async move { state(&mut e, "victim-0", "state").await.as_deref() == Some("running") }
    })
    .await;
    // The snoop reads every environment it can, and says who it is.
    let seen = out.join("seen");
    let snoop = format!(
        "id -u > {o}/uid; for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done | tr '\\0' '\\n' > {s}.tmp; mv {s}.tmp {s}; exec sleep 1000",
        o = out.display(),
        s = seen.display()
    );
    // Its exec probe records its own environment.
    place(
        &mut etcd,
        "snoop-0",
        "snoop",
        &format!("exec:{snoop}"),
        &[("probe/env/method", &format!("exec:env > {}/probe-env.tmp; mv {}/probe-env.tmp {}/probe-env", out.display(), out.display(), out.display()))],
    )
    .await;
    appears("the snoop has looked", &seen).await;
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert!(!seen.contains("canary-token-9f3"), "an instance read another's environment");
    assert!(!seen.contains("CCATTLER_ETCD"), "an instance read the agent's environment");
    let uid: u32 = std::fs::read_to_string(out.join("uid")).unwrap().trim().parse().unwrap();
    assert!(uid >= 200_000, "the instance runs as uid {uid}, not a user of its own");
    appears("the exec probe ran", &out.join("probe-env")).await;
    let probe_env = std::fs::read_to_string(out.join("probe-env")).unwrap();
    assert!(probe_env.contains("PORT="), "{probe_env}");
    for leaked in ["CCATTLER_", "CARGO", "RUST"] {
        assert!(!probe_env.lines().any(|l| l.starts_with(leaked)), "the probe saw the agent's {leaked}…: {probe_env}");
    }
    // Logs and records are the agent's alone.
    use std::os::unix::fs::PermissionsExt;
    let log = root.join("node-1/instances/victim-0/log");
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600, "{}", log.display());
    let record = root.join("node-1/instances/victim-0/record.json");
    assert_eq!(std::fs::metadata(&record).unwrap().permissions().mode() & 0o077, 0, "{}", record.display());
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_killed_at_its_limit_and_the_reason_says_out_of_memory() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("oom");
    let mut agent = Agent::start(&root, 1, 4000, 8192, &[]);
    if std::fs::read_to_string(&agent.log).unwrap_or_default().contains("WITHOUT cgroups") {
        panic!("no writable cgroup hierarchy on this host; the agent's log says why:\n{}", std::fs::read_to_string(&agent.log).unwrap_or_default());
    }
    // /dev/zero has no newline: tail holds all it reads in memory, for ever.
    place(&mut etcd, "hog-0", "hog", "exec:exec tail /dev/zero", &[("request/memory", "32")]).await;
    wait_for("the hog is reported killed out of memory", Duration::from_secs(30), || {
        let mut e = etcd.clone();
        async move { state(&mut e, "hog-0", "reason").await.is_some_and(|x| x.contains("out of memory")) }
    })
    .await;
    assert!(agent.terminate().success());
}

/// Usage once summed the instance's process group from /proc: a workload
/// that left its group with `setsid` burnt cpu unseen. The cgroup's own
/// counters count every process in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_comes_from_the_cgroup_and_counts_a_process_that_left_the_group() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("usage");
    let mut agent = Agent::start(&root, 1, 4000, 8192, &[]);
    if std::fs::read_to_string(&agent.log).unwrap_or_default().contains("WITHOUT cgroups") {
        panic!("no writable cgroup hierarchy on this host; the agent's log says why:\n{}", std::fs::read_to_string(&agent.log).unwrap_or_default());
    }
    // The burner leaves the process group at once; the instance's own process only sleeps.
    place(&mut etcd, "burn-0", "burn", "exec:setsid sh -c 'while :; do :; done' & exec sleep 1000", &[]).await;
    // (Reported per service: burn-0 is the node's one instance of burn.)
    wait_for("node-1 reports the cpu burn-0's escaped child burns", Duration::from_secs(60), || {
        let mut e = etcd.clone();
        async move { get(&mut e, "observed/node/node-1/usage/burn/cpu").await.and_then(|v| v.parse::<i64>().ok()).is_some_and(|m| m >= 300) }
    })
    .await;
    assert!(agent.terminate().success());
}
