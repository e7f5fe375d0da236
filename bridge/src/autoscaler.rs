//! `ccattler autoscaler`: the seed's second intent writer, a daemon of its
//! own with its own rules (`rules/autoscaler/`) and its own etcd user, which
//! may read `effective/` and `observed/` and write `intent/autoscaler/`
//! only. Each round (level-triggered, as a controller's reconcile): read what
//! its rules read at one revision, run them to a fixed point in an offline
//! session with the clock as a fact, and write the difference under
//! `intent/autoscaler/` in transactions fenced by its leader key — which,
//! like its clock, lives in its own prefix (`intent/autoscaler/leader`,
//! `intent/autoscaler/clock`). What the rules read is small: per-service
//! figures the controller publishes (rules/autoscale.rules), not every
//! instance's report.

use crate::etcd::{self, EtcdConfig, EtcdError, Fence, Op, Written};
use ccattler_engine::Session;
use ccattler_parser::program::Program;
use etcd_client::Client;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Everything the autoscaler writes lives under this prefix.
pub const PREFIX: &str = "intent/autoscaler/";
/// The key whose holder leads (under the leader's lease).
pub const LEADER_KEY: &str = "intent/autoscaler/leader";
/// The clock its rules judge windows by, in seconds.
pub const CLOCK_KEY: &str = "intent/autoscaler/clock";

#[derive(Clone, Debug)]
pub struct AutoscalerConfig {
    pub etcd: EtcdConfig,
    pub rules: PathBuf,
    /// Seconds between rounds.
    pub period: Duration,
    /// This autoscaler's name in its leader key.
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AutoscalerError {
    #[error(transparent)]
    Rules(#[from] crate::controller::ControllerError),
    #[error("{0}: the autoscaler's rules may write only under {PREFIX} (its etcd role allows nothing else)")]
    Output(String),
    #[error(transparent)]
    Session(#[from] ccattler_engine::SessionError),
}

/// Runs rounds until `stop` turns true; a standby waits for the leader key.
pub async fn run(cfg: AutoscalerConfig, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<(), AutoscalerError> {
    let program = crate::controller::load_rules(&cfg.rules)?;
    for r in program.outputs() {
        let p = &r.1.pattern.as_ref().expect("outputs have patterns").text;
        if !p.starts_with(PREFIX) {
            return Err(AutoscalerError::Output(format!("output `{}` writes `{p}`", r.1.name)));
        }
    }
    let ttl = (cfg.period.as_secs() as i64 * 3).max(3);
    let mut leading: Option<Leading> = None;
    loop {
        if leading.is_none() {
            match campaign(&cfg, ttl).await {
                Ok(l) => leading = l,
                Err(e) => warn!(error = %e, "etcd unreachable; retrying"),
            }
        }
        if let Some(Leading { client, fence, keeper, responses }) = leading.as_mut() {
            let kept = keeper.keep_alive().await.is_ok() && matches!(responses.message().await, Ok(Some(r)) if r.ttl() > 0);
            match round(client, fence, &program).await {
                Ok(n) if kept => {
                    if n > 0 {
                        info!(keys = n, "intent written");
                    }
                }
                Ok(_) => {
                    warn!("the leader lease could not be renewed; campaigning again");
                    leading = None;
                }
                Err(e) => {
                    warn!(error = %e, "round failed; campaigning again");
                    leading = None;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.period) => {}
            _ = stop.changed() => {
                if let Some(mut l) = leading.take() {
                    let _ = l.client.delete(LEADER_KEY, None).await;
                }
                info!("stopped");
                return Ok(());
            }
        }
    }
}

/// Leadership: the connection, the fence its writes compare, its lease's keep-alive.
struct Leading {
    client: Client,
    fence: Fence,
    keeper: etcd_client::LeaseKeeper,
    responses: etcd_client::LeaseKeepAliveStream,
}

/// Takes the leader key if nobody holds it.
async fn campaign(cfg: &AutoscalerConfig, ttl: i64) -> Result<Option<Leading>, EtcdError> {
    let mut client = etcd::connect(&cfg.etcd).await?;
    let Some((lease, fence)) = etcd::claim(&mut client, LEADER_KEY, &cfg.id, ttl).await? else {
        return Ok(None);
    };
    let (keeper, responses) = client.lease_keep_alive(lease).await?;
    info!(id = %cfg.id, "leading");
    Ok(Some(Leading { client, fence, keeper, responses }))
}

/// One round: the rules' facts at one revision plus the clock, to a fixed
/// point; the difference written. Returns the keys written or deleted.
async fn round(client: &mut Client, fence: &Fence, program: &Arc<Program>) -> Result<usize, RoundError> {
    let prefixes = crate::controller::pattern_prefixes(program);
    let (rev, snap) = etcd::snapshot(client, &prefixes, 5000).await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let mut facts: Vec<(String, String, u64)> =
        snap.iter().filter(|(k, _)| k != CLOCK_KEY).map(|(k, h)| (k.clone(), h.value.clone(), h.mod_revision as u64)).collect();
    facts.push((CLOCK_KEY.into(), now.to_string(), rev as u64));
    let (derived, rejected) = tokio::task::block_in_place(|| {
        let mut session = Session::new(program.clone(), 1)?;
        session.load(rev as u64, &facts)?;
        session.write(&[])?;
        Ok::<_, ccattler_engine::SessionError>((session.derived().clone(), session.rejected().clone()))
    })?;
    for (key, why) in &rejected {
        warn!(%key, reason = %why, "a fact the autoscaler's rules reject");
    }
    // What etcd holds at output keys, against what the rules derive.
    let held: BTreeMap<&String, &crate::Held> = snap.iter().filter(|(k, _)| ccattler_engine::facts::is_output_key(program, k)).map(|(k, h)| (k, h)).collect();
    let mut ops = Vec::new();
    for (k, v) in &derived {
        match held.get(k) {
            None => ops.push(Op::Create { key: k.clone(), value: v.clone() }),
            Some(h) if h.value != *v => ops.push(Op::Update { key: k.clone(), value: v.clone(), mod_revision: h.mod_revision }),
            Some(_) => {}
        }
    }
    for (k, h) in &held {
        if !derived.contains_key(*k) {
            ops.push(Op::Delete { key: (*k).clone(), mod_revision: h.mod_revision });
        }
    }
    let n = ops.len();
    // Bounded as the controller's are (a transaction also carries the clock);
    // with nothing to write, the clock alone.
    let mut chunks = crate::reconcile::chunks(ops, crate::reconcile::Budget { ops: 64, bytes: 1 << 20 });
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    for chunk in chunks {
        match etcd::write(client, fence, &chunk, Some((CLOCK_KEY, now.to_string()))).await? {
            Written::Committed(_) => {}
            Written::Refused(_) => return Err(RoundError::Refused),
        }
    }
    Ok(n)
}

#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Session(#[from] ccattler_engine::SessionError),
    #[error("a compare failed: a key moved since it was read, or leadership was lost")]
    Refused,
}
