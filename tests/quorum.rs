//! A three-member etcd cluster on loopback: the controller, an agent and the
//! CLI keep working whenever a quorum stands, whichever member is down —
//! the one listed first and leading included, killed several times while
//! changes flow.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// Makes member `i` the leader (etcd's MoveLeader, asked of the leader).
async fn lead_with(cluster: &EtcdCluster, i: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = cluster.client().await;
        let members = c.member_list().await.unwrap();
        let want = members.members().iter().find(|m| m.name() == format!("m{i}")).map(|m| m.id()).unwrap();
        if cluster.leader().await == Some(i) {
            return;
        }
        if let Some(l) = cluster.leader().await {
            let password = ccattler_store::credentials::password(&cluster.credentials(), "root").unwrap();
            let opts = etcd_client::ConnectOptions::new().with_user("root", password.as_str());
            if let Ok(mut lc) = etcd_client::Client::connect([format!("http://127.0.0.1:{}", cluster.client_ports[l])], Some(opts)).await {
                let _ = lc.move_leader(want).await;
            }
        }
        assert!(Instant::now() < deadline, "member {i} never led");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leading_member_listed_first_stops_nothing_while_a_quorum_stands() {
    let _serial = serial();
    let dir = fresh_dir("quorum");
    let mut cluster = EtcdCluster::start(dir.clone());
    let _ = cluster.client().await;
    let urls = cluster.urls();
    let c = Controller::start_with(
        &urls,
        &cluster.credentials(),
        &cluster.secret_key(),
        "quorum",
        &shipped_rules(),
        &["--stall-bound", "5"],
        &[("CCATTLER_LOG", "info,ccattler_store=debug,ccattler_bridge=debug")],
    );
    let agent_dir = dir.join("agents");
    std::fs::create_dir_all(&agent_dir).unwrap();
    // (TTL 15 s: an etcd leader change may keep the agent from renewing for
    // a second or two, which at the suite's 3 s crosses the fencing bound and
    // rightly stops web-0; this test is about the quorum, not fencing.)
    let _agent = Agent::start_on(&urls, &cluster.credentials(), &agent_dir, 1, 4000, 8192, &["--ttl=15"]);
    // Adding the agent's user changed etcd's auth store: older tokens are refused.
    let mut root = cluster.client().await;
    root.put("desired/service/web/image", "builtin:http", None).await.unwrap();
    root.put("intent/user/service/web/instances", "1", None).await.unwrap();
    wait_for("web-0 serves", Duration::from_secs(30), || {
        let mut e = root.clone();
        async move { endpoints(&mut e, "web").await.contains_key("web-0") }
    })
    .await;
    let web0 = processes_of("web")["web-0"].clone();
    for round in 0..3 {
        lead_with(&cluster, 0).await;
        cluster.kill(0);
        let killed = Instant::now();
        // Changes made through the surviving members reach the controller,
        // and the CLI (given every member, the dead one first) still works.
        let mut survivor = cluster.client().await;
        let want = (2 + round).to_string();
        survivor.put("intent/user/service/web/instances", want.as_str(), None).await.unwrap();
        wait_for("the controller follows a change made with member 0 down", Duration::from_secs(20), || {
            let mut e = survivor.clone();
            let want = want.clone();
            async move { get(&mut e, "effective/service/web/instances").await == Some(want) }
        })
        .await;
        let followed = killed.elapsed();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .args(["get", "effective/service/web/instances", "--etcd", &urls, "--credentials", cluster.credentials().to_str().unwrap(), "--as", "user"])
            .output()
            .unwrap();
        assert!(out.status.success(), "the CLI with member 0 down: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("effective/service/web/instances = {}", 2 + round));
        wait_for("every instance serving", Duration::from_secs(20), || {
            let mut e = survivor.clone();
            let n = 2 + round;
            async move { endpoints(&mut e, "web").await.len() == n }
        })
        .await;
        assert_eq!(c.metric("leader"), Some(1.0), "the controller still leads");
        assert_eq!(http_status(c.port, "/healthz"), Some(200), "healthy with a quorum");
        eprintln!("round {round}: member 0 (leading, listed first) killed; the controller followed a change after {followed:?}");
        cluster.restart(0);
        let _ = cluster.client().await;
    }
    assert_eq!(processes_of("web")["web-0"], web0, "web-0 was never restarted");
}
