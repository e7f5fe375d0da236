//! ccattler controller: the daemon (and a group's other processes).

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn controller(cfg: ccattler_bridge::controller::ControllerConfig) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    let ran = rt.block_on(ccattler_bridge::controller::run(cfg));
    // (Not waiting for a group's connecting thread, if one is left.)
    rt.shutdown_background();
    match ran {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => failed(e),
    }
}

/// Bad rules are the user's to fix: said plainly, exit 1; anything else is
/// an error with its causes.
fn failed(e: ccattler_bridge::controller::ControllerError) -> anyhow::Result<ExitCode> {
    if let ccattler_bridge::controller::ControllerError::Rules { .. } = e {
        eprintln!("{e}");
        return Ok(ExitCode::from(1));
    }
    Err(e.into())
}

/// How long a group's process told to stop waits for process 0 to stop the
/// group (it resigns first) before it goes anyway.
const GROUP_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Process I > 0 of a controller group: evaluates its share of the engine
/// that process 0 runs, until process 0 stops it. It holds no etcd
/// credential and listens only on its cluster port. The group is one failure
/// domain: a peer that dies makes timely stop here too (exit 70 through the
/// panic hook), and the supervisor restarts the group.
pub(crate) fn controller_serve(rules: &[PathBuf], cluster: &ccattler_engine::Cluster) -> anyhow::Result<ExitCode> {
    let program = match ccattler_bridge::controller::load_rules(rules) {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    tracing::info!(
        process = cluster.process,
        processes = cluster.addresses.len(),
        workers = cluster.workers,
        "serving process 0's engine as one process of a controller group"
    );
    let cluster = cluster.clone();
    runtime()?.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        let mut served = tokio::task::spawn_blocking(move || ccattler_engine::serve(program, &cluster));
        let stopped = tokio::select! {
            r = &mut served => Some(r),
            _ = term.recv() => None,
            _ = int.recv() => None,
        };
        let stopped = match stopped {
            Some(r) => r,
            // Told to stop: the whole group is, as a rule (systemd stops its
            // units together); process 0 resigns and then stops the engine.
            None => match tokio::time::timeout(GROUP_STOP_GRACE, &mut served).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("process 0 did not stop the group within {GROUP_STOP_GRACE:?}; leaving it (the group stops with this process)");
                    // (The engine's threads are timely's: not waited for.)
                    std::process::exit(0);
                }
            },
        };
        stopped.map_err(|e| anyhow::anyhow!("the engine's process panicked: {e}"))??;
        tracing::info!("process 0 stopped the group");
        Ok(ExitCode::SUCCESS)
    })
}
