//! ccattler node cordon|uncordon|drain.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn node(action: NodeAction, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    let name = match &action {
        NodeAction::Cordon { node } | NodeAction::Uncordon { node } | NodeAction::Drain { node, .. } => node.clone(),
    };
    if !ccattler_parser::pattern::is_valid_name(&name) {
        return Ok(usage_error(anyhow::anyhow!("{name:?} is not a node name ([a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters)")));
    }
    let key = |k: &str| format!("desired/node/{name}/{k}");
    let cfg = etcd.config()?;
    runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let wait = match action {
            NodeAction::Cordon { .. } => {
                client.put(key("cordon"), "true", None).await?;
                println!("{name}: cordoned (nothing new is placed there; `ccattler node drain {name}` moves what runs there)");
                None
            }
            NodeAction::Uncordon { .. } => {
                let ops = vec![etcd_client::TxnOp::delete(key("cordon"), None), etcd_client::TxnOp::delete(key("drain"), None)];
                client.txn(etcd_client::Txn::new().and_then(ops)).await?;
                println!("{name}: uncordoned (it takes instances again)");
                None
            }
            NodeAction::Drain { wait, .. } => {
                client.put(key("drain"), "true", None).await?;
                println!("{name}: draining (watch `ccattler get effective/node/{name}/state`; `ccattler get status/drain/{name}/` says what holds it back)");
                wait
            }
        };
        let Some(seconds) = wait else { return Ok(ExitCode::SUCCESS) };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        let mut shown = String::new();
        loop {
            let state = client.get(format!("effective/node/{name}/state"), None).await?;
            let state = state.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_default();
            if state == "drained" {
                println!("{name}: drained");
                return Ok(ExitCode::SUCCESS);
            }
            let held = client.get(format!("status/drain/{name}/"), Some(etcd_client::GetOptions::new().with_prefix())).await?;
            let now: String = held.kvs().iter().map(|kv| format!("  {}\n", String::from_utf8_lossy(kv.value()))).collect();
            if now != shown {
                print!("{now}");
                shown = now;
            }
            if std::time::Instant::now() >= until {
                eprintln!("{name}: still {state} after {seconds} s");
                return Ok(ExitCode::from(1));
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    })
}
