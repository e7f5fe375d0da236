//! Proves the test wiring: `scripts/test` started a real etcd, bootstrapped
//! its auth, and exported its address and root's credentials.

mod common;
use common::*;
use std::time::Duration;

#[tokio::test]
async fn etcd_from_scripts_test_answers() {
    let mut client = tokio::time::timeout(Duration::from_secs(10), connect_as(&etcd_url(), &credentials(), "root")).await.expect("connect within 10 s");
    let key = format!("test/wiring/{}", std::process::id());
    client.put(key.as_str(), "ok", None).await.expect("put");
    let got = client.get(key.as_str(), None).await.expect("get");
    assert_eq!(got.kvs()[0].value_str().unwrap(), "ok");
    client.delete(key.as_str(), None).await.expect("delete");
}

/// A watch that starts behind gets up to 1,000 revisions per response; with
/// large transactions that is over gRPC's default 4 MiB, which must not break
/// the watch (the controller would take a new snapshot every time).
#[tokio::test]
async fn a_watch_catching_up_takes_responses_over_4_mib() {
    let mut client = connect_as(&etcd_url(), &credentials(), "root").await;
    let prefix = format!("test/bigwatch/{}/", std::process::id());
    let start = client.get("x", None).await.expect("get").header().expect("header").revision() + 1;
    let value = "v".repeat(1024);
    for t in 0..100 {
        let ops: Vec<etcd_client::TxnOp> = (0..100).map(|k| etcd_client::TxnOp::put(format!("{prefix}{t}/{k}"), value.as_str(), None)).collect();
        client.txn(etcd_client::Txn::new().and_then(ops)).await.expect("txn");
    }
    let opts = etcd_client::WatchOptions::new().with_prefix().with_start_revision(start);
    let (_watcher, mut stream) = ccattler_store::etcd::watch(&client, prefix.as_str(), opts).await.expect("watch");
    let (mut events, mut largest) = (0, 0);
    while events < 10_000 {
        let resp = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("events within 20 s")
            .expect("a response, not an error")
            .expect("open stream");
        largest = largest.max(resp.events().iter().map(|e| e.kv().map_or(0, |kv| kv.value().len())).sum::<usize>());
        events += resp.events().len();
    }
    assert_eq!(events, 10_000);
    assert!(largest > 4 << 20, "the test needs a response over 4 MiB; the largest was {largest} bytes");
    client.delete(prefix.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.expect("clean up");
}
