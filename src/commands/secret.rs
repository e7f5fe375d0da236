//! ccattler secret set|rm|reseal.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn secret(action: SecretAction) -> anyhow::Result<ExitCode> {
    use ccattler_store::seal::ClusterKeys;
    use etcd_client::{Txn, TxnOp};
    let check_name = |name: &str| {
        if ccattler_parser::pattern::is_valid_name(name) {
            Ok(())
        } else {
            Err(anyhow::anyhow!("secret name {name:?} is not a name ([a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters)"))
        }
    };
    let rt = runtime()?;
    match action {
        SecretAction::Set { name, secret_key, etcd } => {
            if let Err(e) = check_name(&name) {
                return Ok(usage_error(e));
            }
            let keys = ClusterKeys::load(&secret_key)?;
            let mut value = zeroize::Zeroizing::new(Vec::new());
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut value).map_err(|e| anyhow::anyhow!("reading the value from stdin: {e}"))?;
            let sealed = match keys.seal(&name, &value) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}; nothing written");
                    return Ok(ExitCode::from(1));
                }
            };
            let cfg = etcd.config()?;
            let rev = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                // The value first, then its tag: the revision it was stored
                // at, which the copies sealed to nodes carry as their version.
                let resp = client.put(format!("{}{name}", ccattler_store::layout::SECRET_VALUE), sealed, None).await?;
                let stored = resp.header().map_or(0, |h| h.revision());
                client.put(format!("desired/secret/{name}"), stored.to_string(), None).await?;
                anyhow::Ok(stored)
            })?;
            eprintln!("secret {name} sealed with key {} and stored at revision {rev}", keys.current_id());
        }
        SecretAction::Rm { name, etcd } => {
            if let Err(e) = check_name(&name) {
                return Ok(usage_error(e));
            }
            let cfg = etcd.config()?;
            rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let txn = Txn::new().and_then([
                    TxnOp::delete(format!("{}{name}", ccattler_store::layout::SECRET_VALUE), None),
                    TxnOp::delete(format!("desired/secret/{name}"), None),
                ]);
                client.txn(txn).await?;
                anyhow::Ok(())
            })?;
            eprintln!("secret {name} removed");
        }
        SecretAction::Reseal { secret_key, etcd } => {
            let keys = ClusterKeys::load(&secret_key)?;
            let cfg = etcd.config()?;
            let (done, failed) = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let prefix = [ccattler_store::layout::SECRET_VALUE.to_string()];
                let (_, values) = ccattler_store::etcd::snapshot(&mut client, &prefix, 1000).await?;
                let (mut done, mut failed) = (0, 0);
                for (key, held) in values {
                    let Some(name) = ccattler_store::layout::secret_value_name(&key) else { continue };
                    if ClusterKeys::sealed_with(&held.value) == Some(keys.current_id()) {
                        continue;
                    }
                    let resealed = keys.open(name, &held.value).and_then(|plain| keys.seal(name, &plain));
                    let sealed = match resealed {
                        Ok(s) => s,
                        Err(e) => {
                            eprintln!("error: {e}");
                            failed += 1;
                            continue;
                        }
                    };
                    // Only if nobody changed it meanwhile.
                    let cmp = etcd_client::Compare::mod_revision(key.as_str(), etcd_client::CompareOp::Equal, held.mod_revision);
                    if client.txn(Txn::new().when([cmp]).and_then([TxnOp::put(key.as_str(), sealed, None)])).await?.succeeded() {
                        done += 1;
                    } else {
                        eprintln!("error: {key} changed while being resealed; run reseal again");
                        failed += 1;
                    }
                }
                anyhow::Ok((done, failed))
            })?;
            eprintln!("{done} secret(s) sealed again with key {}; {failed} failed", keys.current_id());
            if failed > 0 {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
