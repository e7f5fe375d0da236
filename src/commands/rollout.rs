//! ccattler rollout status.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn rollout_status(service: &str, watch: bool, timeout: u64, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    if !ccattler_parser::pattern::is_valid_name(service) {
        return Ok(usage_error(anyhow::anyhow!("{service:?} is not a service name")));
    }
    let cfg = etcd.config()?;
    runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
        let mut shown = String::new();
        loop {
            let prefix = format!("status/rollout/{service}/");
            let resp = client.get(prefix.as_str(), Some(etcd_client::GetOptions::new().with_prefix())).await?;
            let field =
                |f: &str| resp.kvs().iter().find(|kv| kv.key() == format!("{prefix}{f}").as_bytes()).map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
            let Some(state) = field("state") else {
                eprintln!("{service}: no rollout status (is it a service with instances?)");
                return Ok(ExitCode::from(1));
            };
            let want = client.get(format!("effective/service/{service}/instances"), None).await?;
            let want = want.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_else(|| "?".into());
            let line = format!(
                "{service}: generation {}, {}/{want} updated, {} ready, {state}",
                field("generation").unwrap_or_default(),
                field("updated").unwrap_or_default(),
                field("ready").unwrap_or_default()
            );
            if line != shown {
                println!("{line}");
                shown = line;
            }
            let done = state == "complete";
            if !watch || done {
                return Ok(if done || !watch { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
            if state.starts_with("stalled") || state == "paused" {
                return Ok(ExitCode::from(1));
            }
            if std::time::Instant::now() >= until {
                eprintln!("{service}: not complete after {timeout} s");
                return Ok(ExitCode::from(1));
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    })
}
