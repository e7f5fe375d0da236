//! ccattler agent (and the built-in HTTP image it runs).

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn agent(cfg: ccattler_agent::AgentConfig) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let agent = match ccattler_agent::Agent::new(cfg) {
            Ok(a) => a,
            Err(e) => return Ok(usage_error(e.into())),
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        agent.run(stop).await?;
        Ok(ExitCode::SUCCESS)
    })
}

pub(crate) fn serve_http(instance: String) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(ccattler_agent::http_image::serve(instance))?;
    Ok(ExitCode::SUCCESS)
}
