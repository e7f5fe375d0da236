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

pub(crate) fn apply(file: &std::path::Path, writer: &str, rules: &[PathBuf], etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    if !ccattler_parser::pattern::is_valid_name(writer) {
        return Ok(usage_error(anyhow::anyhow!("--writer {writer:?} is not a name")));
    }
    let prefixes = writer_prefixes(writer);
    let allowed = prefixes.join(" or ");
    let facts = read_facts(file)?;
    // Everything is checked before anything is written: the writer's
    // prefixes, then every key and value against the rules' inputs.
    let refused: Vec<String> = facts
        .iter()
        .filter(|f| !prefixes.iter().any(|p| f.key.starts_with(p.as_str())))
        .map(|f| format!("{}:{}: {} is not under {allowed}", file.display(), f.line, f.key))
        .collect();
    if !refused.is_empty() {
        for r in &refused {
            eprintln!("error: {r}");
        }
        eprintln!("nothing written: writer {writer} may write only {allowed}");
        return Ok(ExitCode::from(1));
    }
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let (errors, warnings) = lint_facts(&program, file, &facts);
    for w in &warnings {
        eprintln!("{w}");
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        eprintln!("nothing written: {} value(s) the controller would reject", errors.len());
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
    let bytes: usize = facts.iter().map(|f| f.key.len() + f.value.len() + 16).sum();
    let whole = facts.len() <= APPLY_TXN_OPS && bytes <= APPLY_TXN_BYTES;
    if !whole {
        eprintln!("note: {} fact(s), {bytes} bytes: more than one transaction holds, so the file is written in parts", facts.len());
    }
    let cfg = etcd.config()?;
    let written = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let mut last = 0;
        // In one transaction when it fits: the file is applied whole or not at all.
        let (mut chunk, mut size) = (Vec::new(), 0);
        for f in facts.iter() {
            let b = f.key.len() + f.value.len() + 16;
            if !chunk.is_empty() && (chunk.len() == APPLY_TXN_OPS || size + b > APPLY_TXN_BYTES) {
                let resp = client.txn(etcd_client::Txn::new().and_then(std::mem::take(&mut chunk))).await?;
                last = resp.header().map_or(0, |h| h.revision());
                size = 0;
            }
            size += b;
            chunk.push(etcd_client::TxnOp::put(f.key.as_str(), f.value.as_str(), None));
        }
        if !chunk.is_empty() {
            let resp = client.txn(etcd_client::Txn::new().and_then(chunk)).await?;
            last = resp.header().map_or(0, |h| h.revision());
        }
        Ok::<_, etcd_client::Error>(last)
    });
    let revision = match written {
        Ok(rev) => rev,
        Err(e) if ccattler_store::auth::is_permission_denied(&e) => {
            let who = cfg.user.as_ref().map_or("this etcd user".to_string(), |(u, _)| format!("etcd user {u}"));
            eprintln!("error: etcd refused the write: {who} may not write these keys (each user writes only its own prefixes, DESIGN §6); nothing written");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    println!("applied {} fact(s) from {} at revision {revision}", facts.len(), file.display());
    Ok(ExitCode::SUCCESS)
}
