//! ccattler autoscaler: the autoscaler daemon.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn autoscaler(cfg: ccattler_bridge::autoscaler::AutoscalerConfig) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            let _ = tx.send(true);
        });
        ccattler_bridge::autoscaler::run(cfg, rx).await?;
        Ok(ExitCode::SUCCESS)
    })
}
