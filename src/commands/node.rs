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
        // A node the cluster does not know is an error, with the nearest it
        // does (the list is read only then: it is every node's view).
        let exists = client.get(format!("effective/node/{name}/state"), None).await?.count() > 0;
        if !exists {
            let states = client.get("effective/node/", Some(etcd_client::GetOptions::new().with_prefix().with_keys_only())).await?;
            let known: Vec<String> = states
                .kvs()
                .iter()
                .filter_map(|kv| kv.key_str().ok()?.strip_prefix("effective/node/")?.strip_suffix("/state").map(String::from))
                .filter(|n| !n.contains('/'))
                .collect();
            let near =
                known.iter().min_by_key(|k| ccattler_parser::check::edit_distance(k, &name)).filter(|k| ccattler_parser::check::edit_distance(k, &name) <= 3);
            let hint = match near {
                Some(k) => format!("; did you mean {k}?"),
                None if known.is_empty() => "; the cluster knows no node yet".into(),
                None => format!(" ({} node(s) known: `ccattler get effective/node/` lists them)", known.len()),
            };
            eprintln!("error: no node {name}{hint}; nothing changed");
            return Ok(ExitCode::from(1));
        }
        // What runs there now (to report, after a drain, what found no other place).
        let placed = client.get(format!("placement/node/{name}/"), Some(etcd_client::GetOptions::new().with_prefix().with_keys_only())).await?;
        let on_node: Vec<String> = placed.kvs().iter().filter_map(|kv| kv.key_str().ok()?.rsplit('/').next().map(String::from)).collect();
        let wait = match action {
            NodeAction::Cordon { .. } => {
                client.put(key("cordon"), "true", None).await?;
                println!("{name}: cordoned (nothing new is placed there; `ccattler node drain {name}` moves what runs there)");
                None
            }
            NodeAction::Uncordon { .. } => {
                let ops = vec![etcd_client::TxnOp::delete(key("cordon"), None), etcd_client::TxnOp::delete(key("drain"), None)];
                let resp = client.txn(etcd_client::Txn::new().and_then(ops)).await?;
                let deleted: i64 = resp.op_responses().iter().map(|r| if let etcd_client::TxnOpResponse::Delete(d) = r { d.deleted() } else { 0 }).sum();
                if deleted == 0 {
                    println!("{name}: was neither cordoned nor draining (nothing changed)");
                } else {
                    println!("{name}: uncordoned (it takes instances again)");
                }
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
                // Moved, but to nowhere: an evicted instance that waits.
                let mut stranded = Vec::new();
                for i in &on_node {
                    let why = client.get(format!("status/unplaced/{i}"), None).await?;
                    if let Some(kv) = why.kvs().first() {
                        stranded.push(format!("  {i}: {}", String::from_utf8_lossy(kv.value())));
                    }
                }
                if stranded.is_empty() {
                    println!("{name}: drained");
                    return Ok(ExitCode::SUCCESS);
                }
                println!("{name}: drained, but {} instance(s) it ran have nowhere to go:\n{}", stranded.len(), stranded.join("\n"));
                return Ok(ExitCode::from(1));
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
