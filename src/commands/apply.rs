//! ccattler apply: write a facts file as a writer.

#[allow(unused_imports)]
use crate::prelude::*;

/// Prefixes a writer may write with `apply` (DESIGN §6): the user writes
/// `desired/` and `intent/user/`; any other writer only its own `intent/<writer>/`.
pub(crate) fn writer_prefixes(writer: &str) -> Vec<String> {
    if writer == "user" {
        vec!["desired/".into(), "intent/user/".into()]
    } else {
        vec![format!("intent/{writer}/")]
    }
}

/// Operations etcd takes in one transaction by default (`--max-txn-ops`).
pub(crate) const APPLY_TXN_OPS: usize = 128;

/// Bytes a transaction of `apply` may carry (under `--max-request-bytes`).
pub(crate) const APPLY_TXN_BYTES: usize = 1 << 20;

pub(crate) fn apply(file: &std::path::Path, writer: &str, rules: &[PathBuf], allow_unknown: bool, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    if !ccattler_parser::pattern::is_valid_name(writer) {
        return Ok(usage_error(anyhow::anyhow!("--writer {writer:?} is not a name")));
    }
    let prefixes = writer_prefixes(writer);
    let allowed = prefixes.join(" or ");
    // `KEY = VALUE` puts and `- KEY` deletes, with their lines.
    let changes = read_changes(file)?;
    let facts: Vec<ccattler_engine::factfile::FactLine> = changes
        .iter()
        .filter_map(|(line, key, value)| value.as_ref().map(|v| ccattler_engine::factfile::FactLine { line: *line, key: key.clone(), value: v.clone() }))
        .collect();
    // Everything is checked before anything is written: the writer's
    // prefixes, then every key and value against the rules' inputs.
    let refused: Vec<String> = changes
        .iter()
        .filter(|(_, key, _)| !prefixes.iter().any(|p| key.starts_with(p.as_str())))
        .map(|(line, key, _)| format!("{}:{line}: {key} is not under {allowed}", file.display()))
        .collect();
    if !refused.is_empty() {
        for r in &refused {
            eprintln!("error: {r}");
        }
        eprintln!("nothing written: writer {writer} may write only {allowed}");
        return Ok(ExitCode::from(1));
    }
    let Some(program) = load_program_for(rules, etcd)? else { return Ok(ExitCode::from(1)) };
    let (mut errors, warnings) = lint_facts(&program, file, &facts);
    // A key no rule reads is a typo until said otherwise.
    for w in warnings {
        if allow_unknown {
            eprintln!("{w}");
        } else {
            errors.push(w.replacen("warning: ", "error: ", 1) + " (--allow-unknown writes it anyway)");
        }
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        eprintln!("nothing written: {} key(s) or value(s) the controller would reject or not read", errors.len());
        return Ok(ExitCode::from(1));
    }
    let denied = policy_denials(&program, file, &facts)?;
    if !denied.is_empty() {
        for d in &denied {
            eprintln!("{d}");
        }
        eprintln!("nothing written: {} key(s) the rules' policy denies", denied.len());
        return Ok(ExitCode::from(1));
    }
    let ops: Vec<(String, Option<String>)> = changes.into_iter().map(|(_, k, v)| (k, v)).collect();
    let revision = match write_changes(etcd, &ops)? {
        Ok(rev) => rev,
        Err(code) => return Ok(code),
    };
    let deletes = ops.iter().filter(|(_, v)| v.is_none()).count();
    let what = if deletes > 0 { format!("{} fact(s) and {deletes} delete(s)", ops.len() - deletes) } else { format!("{} fact(s)", ops.len()) };
    println!("applied {what} from {} at revision {revision}", file.display());
    Ok(ExitCode::SUCCESS)
}

/// Puts (`Some`) and deletes (`None`) in one transaction when they fit, else
/// in parts; a write etcd's roles refuse is said so (exit 1).
fn write_changes(etcd: &EtcdArgs, ops: &[(String, Option<String>)]) -> anyhow::Result<Result<i64, ExitCode>> {
    let bytes: usize = ops.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, String::len) + 16).sum();
    if ops.len() > APPLY_TXN_OPS || bytes > APPLY_TXN_BYTES {
        eprintln!("note: {} change(s), {bytes} bytes: more than one transaction holds, so they are written in parts", ops.len());
    }
    let cfg = etcd.config()?;
    let written = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let mut last = 0;
        // In one transaction when it fits: the file is applied whole or not at all.
        let (mut chunk, mut size) = (Vec::new(), 0);
        for (key, value) in ops {
            let b = key.len() + value.as_ref().map_or(0, String::len) + 16;
            if !chunk.is_empty() && (chunk.len() == APPLY_TXN_OPS || size + b > APPLY_TXN_BYTES) {
                let resp = client.txn(etcd_client::Txn::new().and_then(std::mem::take(&mut chunk))).await?;
                last = resp.header().map_or(0, |h| h.revision());
                size = 0;
            }
            size += b;
            chunk.push(match value {
                Some(v) => etcd_client::TxnOp::put(key.as_str(), v.as_str(), None),
                None => etcd_client::TxnOp::delete(key.as_str(), None),
            });
        }
        if !chunk.is_empty() {
            let resp = client.txn(etcd_client::Txn::new().and_then(chunk)).await?;
            last = resp.header().map_or(0, |h| h.revision());
        }
        Ok::<_, etcd_client::Error>(last)
    });
    match written {
        Ok(rev) => Ok(Ok(rev)),
        Err(e) if ccattler_store::auth::is_permission_denied(&e) => {
            let who = cfg.user.as_ref().map_or("this etcd user".to_string(), |(u, _)| format!("etcd user {u}"));
            eprintln!("error: etcd refused the write: {who} may not write these keys (each user writes only its own prefixes, DESIGN §6); nothing written");
            Ok(Err(ExitCode::from(1)))
        }
        Err(e) => Err(e.into()),
    }
}

/// `ccattler delete KEY…`: the keys, under the writer's prefixes, all in one
/// transaction; a key that does not exist is named and nothing is deleted.
pub(crate) fn delete(keys: &[String], writer: &str, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    if !ccattler_parser::pattern::is_valid_name(writer) {
        return Ok(usage_error(anyhow::anyhow!("--writer {writer:?} is not a name")));
    }
    let prefixes = writer_prefixes(writer);
    let outside: Vec<&String> = keys.iter().filter(|k| !prefixes.iter().any(|p| k.starts_with(p.as_str()))).collect();
    if !outside.is_empty() {
        for k in &outside {
            eprintln!("error: {k} is not under {}", prefixes.join(" or "));
        }
        eprintln!("nothing deleted: writer {writer} may delete only its own keys");
        return Ok(ExitCode::from(1));
    }
    let cfg = etcd.config()?;
    let missing: Vec<String> = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let mut missing = Vec::new();
        for k in keys {
            if client.get(k.as_str(), Some(etcd_client::GetOptions::new().with_count_only())).await?.count() == 0 {
                missing.push(k.clone());
            }
        }
        Ok::<_, etcd_client::Error>(missing)
    })?;
    if !missing.is_empty() {
        for k in &missing {
            eprintln!("error: {k}: no such key");
        }
        eprintln!("nothing deleted");
        return Ok(ExitCode::from(1));
    }
    let ops: Vec<(String, Option<String>)> = keys.iter().map(|k| (k.clone(), None)).collect();
    match write_changes(etcd, &ops)? {
        Ok(rev) => {
            println!("deleted {} key(s) at revision {rev}", keys.len());
            Ok(ExitCode::SUCCESS)
        }
        Err(code) => Ok(code),
    }
}
