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
use ccattler_store::leader::{self, Heartbeat, Judge};
use etcd_client::Client;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Everything the autoscaler writes lives under this prefix.
pub const PREFIX: &str = "intent/autoscaler/";
/// The key whose holder leads (rewritten by the leader every round: see
/// ccattler_store::leader).
pub const LEADER_KEY: &str = "intent/autoscaler/leader";
/// The clock its rules judge windows by, in seconds.
pub const CLOCK_KEY: &str = "intent/autoscaler/clock";

#[derive(Clone, Debug)]
pub struct AutoscalerConfig {
    pub etcd: EtcdConfig,
    /// Rule files or directories; the program is their union.
    pub rules: Vec<PathBuf>,
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
    // The leader renews its key every round; a standby may take it once it
    // stood still for three periods, and looks every STANDBY_LOOK meanwhile.
    let ttl = judge_ttl(&cfg);
    let mut judge = Judge::new(ttl);
    let mut client: Option<Client> = None;
    let mut leading: Option<Leading> = None;
    loop {
        if leading.is_none() {
            match campaign(&cfg, &mut client, &mut judge).await {
                Ok(l) => leading = l,
                Err(e) => {
                    warn!(reason = %etcd::describe_error(&e, &cfg.etcd), "cannot reach etcd or campaign; retrying");
                    client = None;
                }
            }
        }
        if let (Some(Leading { fence, heartbeat }), Some(c)) = (leading.as_mut(), client.as_mut()) {
            let sent = Instant::now();
            match leader::renew(c, fence, &cfg.id).await {
                Ok(renewal) => heartbeat.answered(sent, renewal),
                Err(e) => warn!(error = %e, "renewing leadership failed"),
            }
            if heartbeat.is_lost(Instant::now()) {
                warn!("leadership lost: the leader key was not renewed in time, or is another's");
                leading = None;
            } else {
                match round(c, fence, &program).await {
                    Ok(n) if n > 0 => info!(keys = n, "intent written"),
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %e, "round failed; campaigning again");
                        leading = None;
                        client = None;
                    }
                }
            }
        }
        let wait = if leading.is_some() { cfg.period } else { cfg.period.min(STANDBY_LOOK) };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {
                if let (Some(l), Some(c)) = (leading.take(), client.as_mut()) {
                    let _ = leader::resign(c, &l.fence).await;
                }
                info!("stopped");
                return Ok(());
            }
        }
    }
}

/// How often a standby reads the leader key.
const STANDBY_LOOK: Duration = Duration::from_millis(500);

/// Leadership: the fence its writes compare, and its heartbeat.
struct Leading {
    fence: Fence,
    heartbeat: Heartbeat,
}

/// Takes the leader key if it is absent or stale (connecting first if need be).
async fn campaign(cfg: &AutoscalerConfig, client: &mut Option<Client>, judge: &mut Judge) -> Result<Option<Leading>, EtcdError> {
    let c = match client {
        Some(c) => c,
        None => client.insert(etcd::connect(&cfg.etcd).await?),
    };
    let Some((fence, sent)) = leader::campaign(c, LEADER_KEY, &cfg.id, judge).await? else {
        return Ok(None);
    };
    info!(id = %cfg.id, "leading");
    Ok(Some(Leading { fence, heartbeat: Heartbeat::new(judge_ttl(cfg), sent) }))
}

fn judge_ttl(cfg: &AutoscalerConfig) -> Duration {
    (cfg.period * 3).max(Duration::from_secs(3))
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
            None => ops.push(Op::Create { key: k.clone(), value: v.to_string() }),
            Some(h) if h.value != *v => ops.push(Op::Update { key: k.clone(), value: v.to_string(), mod_revision: h.mod_revision }),
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
