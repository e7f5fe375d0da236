//! ccattler get: read facts under a prefix.

#[allow(unused_imports)]
use crate::prelude::*;

/// The namespaces keys live in (DESIGN §2).
const NAMESPACES: [&str; 8] = ["desired/", "intent/", "observed/", "effective/", "placement/", "endpoint/", "status/", "secret/"];

pub(crate) fn get(prefix: &str, etcd: &EtcdArgs, format: Format) -> anyhow::Result<ExitCode> {
    // `ccattler get nodes` read a prefix named `nodes` and answered
    // "permission denied": a prefix outside every namespace is named, with
    // the command meant.
    if !prefix.is_empty() && !NAMESPACES.iter().any(|ns| prefix.starts_with(ns) || ns.starts_with(prefix)) {
        let view = ["nodes", "services", "instances", "pending", "rollouts"].into_iter().find(|v| prefix.trim_end_matches('/') == *v || v.starts_with(prefix));
        let hint = view.map(|v| format!("; for a table, `ccattler status {v}`")).unwrap_or_default();
        eprintln!("error: {prefix:?} is not a key prefix: keys start with {}{hint}", NAMESPACES.join(", "));
        return Ok(ExitCode::from(2));
    }
    let cfg = etcd.config()?;
    let (rev, kvs) = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let whole = [prefix.to_string()];
        match ccattler_store::etcd::snapshot(&mut client, &whole, 10_000).await {
            // Everything, as a user who may not read all of it (`user`
            // reads all but `secret/`): the namespaces it may read, at one
            // revision.
            Err(e) if prefix.is_empty() && ccattler_store::auth::is_permission_denied(&e) => {
                let rev = ccattler_store::etcd::current_revision(&mut client).await?;
                let mut all = Vec::new();
                for ns in ccattler_store::auth::PUBLIC_NAMESPACES.iter().chain(["secret/"].iter()) {
                    match ccattler_store::etcd::snapshot_at(&mut client, &[ns.to_string()], 10_000, Some(rev)).await {
                        Ok((_, kvs)) => all.extend(kvs),
                        Err(e) if ccattler_store::auth::is_permission_denied(&e) => eprintln!("# {ns}: not readable as this user"),
                        Err(e) => return Err(e.into()),
                    }
                }
                anyhow::Ok((rev, all))
            }
            other => anyhow::Ok(other?),
        }
    })?;
    if kvs.is_empty() && format == Format::Text {
        eprintln!("no keys under {prefix:?} at revision {rev}");
    }
    match format {
        Format::Text => {
            for (k, h) in &kvs {
                println!("{k} = {}", ccattler_engine::factfile::format_value(&h.value));
            }
        }
        Format::Json => {
            let facts: serde_json::Map<String, serde_json::Value> =
                kvs.iter().map(|(k, h)| (k.clone(), serde_json::json!({ "value": h.value, "mod_revision": h.mod_revision }))).collect();
            println!("{}", serde_json::json!({ "revision": rev, "facts": facts }));
        }
    }
    Ok(ExitCode::SUCCESS)
}
