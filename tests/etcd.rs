//! Proves the test wiring: `scripts/test` started a real etcd and exported its address.

use std::time::Duration;

fn etcd_url() -> String {
    std::env::var("CCATTLER_ETCD").expect("CCATTLER_ETCD is set by scripts/test; run the tests through it")
}

#[tokio::test]
async fn etcd_from_scripts_test_answers() {
    let mut client =
        tokio::time::timeout(Duration::from_secs(10), etcd_client::Client::connect([etcd_url()], None)).await.expect("connect within 10 s").expect("connect");
    let key = format!("test/wiring/{}", std::process::id());
    client.put(key.as_str(), "ok", None).await.expect("put");
    let got = client.get(key.as_str(), None).await.expect("get");
    assert_eq!(got.kvs()[0].value_str().unwrap(), "ok");
    client.delete(key.as_str(), None).await.expect("delete");
}
