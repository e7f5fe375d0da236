//! Small helpers every command shares.

#[allow(unused_imports)]
use crate::prelude::*;

/// A panic anywhere in the daemon — an engine worker's included, where the
/// other workers would otherwise wait for it forever — is logged and ends the
/// process at once with exit code 70, so systemd restarts it and a standby
/// takes over, instead of a controller that spins and writes nothing.
pub(crate) fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(panic = %info, "a thread panicked; exiting so that a standby or a restart takes over");
        default(info);
        std::process::exit(70);
    }));
}

pub(crate) fn usage_error(e: anyhow::Error) -> ExitCode {
    eprintln!("error: {e:#}");
    ExitCode::from(2)
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "controller".into())
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}
