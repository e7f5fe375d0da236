//! ccattler controller: the daemon.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn controller(cfg: ccattler_bridge::controller::ControllerConfig) -> anyhow::Result<ExitCode> {
    match runtime()?.block_on(ccattler_bridge::controller::run(cfg)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e @ ccattler_bridge::controller::ControllerError::Rules { .. }) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.into()),
    }
}
