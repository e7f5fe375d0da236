//! Proves the test wiring: `scripts/test` started a real etcd, bootstrapped
//! its auth, and exported its address and root's credentials.

mod common;
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// `Guard::Unchanged` (one compare over a range of keys, at a revision)
/// refuses whatever a compare per key refuses — a key created or changed
/// since — and more: a neighbour in the range written since. A guard per key
/// then passes the same ops.
#[tokio::test]
async fn a_range_guard_refuses_a_key_created_or_changed_since_and_a_neighbour_written_since() {
    use ccattler_store::etcd::{write_guarded, Fence, Guard, Op, Written};
    let mut client = connect_as(&etcd_url(), &credentials(), "root").await;
    let p = format!("test/rangeguard/{}/", std::process::id());
    let key = |k: &str| format!("{p}{k}");
    let rev = |c: &mut etcd_client::Client| {
        let mut c = c.clone();
        async move { c.get("x", None).await.unwrap().header().unwrap().revision() }
    };
    let fence_rev = client.put(key("fence"), "me", None).await.unwrap().header().unwrap().revision();
    let fence = Fence { key: key("fence"), create_revision: fence_rev };
    let range = |from: &str, to: &str, revision: i64| {
        let mut end = key(to).into_bytes();
        end.push(0);
        Guard::Unchanged { from: key(from), to: end, revision }
    };
    let create = |k: &str| Op::Create { key: key(k), value: "v".into() };
    let committed = |w: Written| matches!(w, Written::Committed(_));

    // An empty range: created.
    let at = rev(&mut client).await;
    assert!(committed(write_guarded(&mut client, &fence, &[create("a"), create("c")], &range("a", "c", at), None).await.unwrap()));
    // A neighbour written since the plan: refused though a and c did not move;
    // a compare per key passes.
    let at = rev(&mut client).await;
    client.put(key("b"), "other", None).await.unwrap();
    let held = |c: &mut etcd_client::Client, k: String| {
        let mut c = c.clone();
        async move { c.get(k, None).await.unwrap().kvs()[0].mod_revision() }
    };
    let (ra, rc) = (held(&mut client, key("a")).await, held(&mut client, key("c")).await);
    let update = |k: &str, r: i64| Op::Update { key: key(k), value: "w".into(), mod_revision: r };
    let ops = [update("a", ra), update("c", rc)];
    assert!(!committed(write_guarded(&mut client, &fence, &ops, &range("a", "c", at), None).await.unwrap()));
    assert!(committed(write_guarded(&mut client, &fence, &ops, &Guard::EachKey, None).await.unwrap()));
    // A key planned absent and created since: never overwritten.
    let at = rev(&mut client).await;
    client.put(key("d"), "theirs", None).await.unwrap();
    assert!(!committed(write_guarded(&mut client, &fence, &[create("d"), create("e")], &range("d", "e", at), None).await.unwrap()));
    assert_eq!(client.get(key("d"), None).await.unwrap().kvs()[0].value_str().unwrap(), "theirs");
    // A key changed since: refused.
    let at = rev(&mut client).await;
    let rd = held(&mut client, key("d")).await;
    client.put(key("d"), "again", None).await.unwrap();
    assert!(!committed(write_guarded(&mut client, &fence, &[update("d", rd)], &range("d", "d", at), None).await.unwrap()));
    // Fenced as ever: another leader's fence refuses it.
    let at = rev(&mut client).await;
    let stale = Fence { key: key("fence"), create_revision: fence_rev + 1 };
    assert!(!committed(write_guarded(&mut client, &stale, &[create("f"), create("g")], &range("f", "g", at), None).await.unwrap()));
    assert!(client.get(key("f"), None).await.unwrap().kvs().is_empty());
    client.delete(p.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
}

/// The controller's watch reader reads on while the loop is busy (etcd
/// streams a watcher that keeps up from memory), up to a bound on what
/// waits; past it, the rest waits in etcd. Nothing is lost either way.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_backlog_over_its_bound_waits_in_etcd_and_nothing_is_lost() {
    use ccattler_bridge::controller::{Health, Shared};
    use ccattler_bridge::watch::{WatchMsg, WatchReader};
    let mut client = connect_as(&etcd_url(), &credentials(), "root").await;
    let prefix = format!("test/backlog/{}/", std::process::id());
    let start = client.get("x", None).await.unwrap().header().unwrap().revision() + 1;
    let opts = etcd_client::WatchOptions::new().with_prefix().with_start_revision(start);
    let (watcher, stream) = ccattler_store::etcd::watch(&client, prefix.as_str(), opts).await.expect("watch");
    let (explain, _asked) = tokio::sync::mpsc::channel(1);
    let shared =
        Arc::new(Shared { ready: Default::default(), metrics: Default::default(), explain, health: Health::new(Duration::from_secs(60)), console: None });
    // 64 KiB may wait; 200 transactions of 8 KiB each are written.
    let mut reader = WatchReader::spawn_bounded(watcher, stream, shared, 64);
    let value = "v".repeat(8 * 1024);
    for t in 0..200 {
        client.put(format!("{prefix}{t:03}"), value.as_str(), None).await.unwrap();
    }
    // The reader reads ahead up to its bound (seven responses of 9 KiB, or
    // fewer larger ones if etcd sent several revisions in one) and stops
    // there. Every response holds at least one 9 KiB revision, so no more
    // than 64 / 9 responses ever wait (`waiting_kib` is the bound's own
    // count, never above it: not a check of the bound).
    let deadline = Instant::now() + Duration::from_secs(20);
    while reader.waiting_kib() < 64 - 9 {
        assert!(Instant::now() < deadline, "the reader did not read ahead: {} KiB waiting", reader.waiting_kib());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        assert!(reader.waiting() <= 64 / 9, "{} responses ({} KiB by the bound's count) wait: over the 64 KiB bound", reader.waiting(), reader.waiting_kib());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Taken, everything comes, in order, once.
    let mut seen = Vec::new();
    while seen.len() < 200 {
        for msg in tokio::time::timeout(Duration::from_secs(20), reader.next_all()).await.expect("within 20 s") {
            match msg {
                WatchMsg::Events { events, .. } => seen.extend(events.into_iter().map(|e| e.key)),
                other => panic!("the watch broke: {other:?}"),
            }
        }
    }
    let want: Vec<String> = (0..200).map(|t| format!("{prefix}{t:03}")).collect();
    assert_eq!(seen, want);
    client.delete(prefix.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
}
