//! The controller daemon: snapshot at R, watch from R+1, every revision into
//! the engine, and — while this controller leads — the difference written back
//! in fenced compare-and-swap transactions. Standbys keep their engine warm.

use crate::etcd::{self, EtcdConfig, Fence, Guard, Written};
use crate::gate::WriteGate;
use crate::metrics::Metrics;
use crate::reconcile::{PlanCursor, Reconciler};
use crate::secrets::SecretBook;
use crate::watch::WatchReader;
use ccattler_parser::program::Program;
use ccattler_store::leader::{self, Heartbeat, Judge};
use ccattler_store::seal::ClusterKeys;
use etcd_client::{Client, WatchOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{debug, error, info, warn};

/// The key whose holder leads; created under the leader's lease.
pub const LEADER_KEY: &str = "status/leader";

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub etcd: EtcdConfig,
    /// Rule files or directories; the program is their union.
    pub rules: Vec<PathBuf>,
    pub workers: usize,
    /// This process's place in a controller group (`--hosts`, `--process
    /// 0`): the engine runs as a timely cluster with the group's other
    /// processes, started once (the group restarts together, never patched).
    pub cluster: Option<ccattler_engine::Cluster>,
    /// etcd's `--max-txn-ops`: operations per transaction list.
    pub max_txn_ops: usize,
    /// Bytes of keys and values per transaction (under etcd's `--max-request-bytes`).
    pub max_txn_bytes: usize,
    /// Leader lease TTL in seconds.
    pub leader_ttl: i64,
    /// This controller's name in `status/leader`.
    pub id: String,
    pub listen: Option<SocketAddr>,
    /// How long without progress before `/healthz` fails.
    pub stall_bound: Duration,
    /// The cluster's secret key file: secret values are re-sealed to the
    /// nodes that need them. Without it nothing is sealed.
    pub secret_key: Option<PathBuf>,
    /// Serve the web console at `/ui` (`--ui`), to the users listed (HTTP
    /// basic auth; none: to anyone who reaches the listener).
    pub ui: Option<Vec<(String, String)>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("rules in {path}: {errors} error(s)\n{rendered}")]
    Rules { path: String, errors: usize, rendered: String },
    #[error(transparent)]
    Load(#[from] ccattler_parser::LoadError),
    #[error(transparent)]
    Engine(#[from] ccattler_engine::EngineError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("--secret-key: {0}")]
    SecretKey(#[from] ccattler_store::seal::SealError),
    /// etcd refused the controller's credentials before it ever read a
    /// snapshot: retrying them cannot help.
    #[error("{0}")]
    Credentials(String),
    /// A controller group cannot go on without a new engine: its processes
    /// restart together (their supervisor starts them again).
    #[error("controller group: {0}")]
    Group(String),
}

/// State the HTTP endpoints read.
pub struct Shared {
    pub ready: AtomicBool,
    pub metrics: Metrics,
    /// `/explain` questions for the controller's loop.
    pub explain: tokio::sync::mpsc::Sender<crate::explain::Asked>,
    pub health: Health,
    /// The web console, when `--ui` is on.
    pub console: Option<Arc<crate::console::Console>>,
}

/// What `/healthz` judges: a controller is unhealthy once it has made no
/// progress for longer than `bound` — etcd unreachable, or (leading) its
/// write-back failing or refused over and over — or once its engine has not
/// applied a revision the watch delivered for that long.
pub struct Health {
    pub bound: Duration,
    /// Since when no progress has been made, and the last reason.
    stalled: std::sync::Mutex<Option<(Instant, String)>>,
    /// The newest revision the watch delivered, and the newest applied.
    received: std::sync::atomic::AtomicU64,
    applied: std::sync::atomic::AtomicU64,
    /// Since when a delivered revision has waited to be applied.
    behind_since: std::sync::Mutex<Option<Instant>>,
    /// What the control loop is doing, and since when.
    phase: std::sync::Mutex<(Instant, &'static str)>,
}

impl Health {
    pub fn new(bound: Duration) -> Health {
        Health {
            bound,
            stalled: std::sync::Mutex::new(None),
            received: Default::default(),
            applied: Default::default(),
            behind_since: std::sync::Mutex::new(None),
            phase: std::sync::Mutex::new((Instant::now(), IDLE)),
        }
    }

    /// The control loop starts on `phase` ([`IDLE`]: waiting for work).
    fn enter(&self, phase: &'static str) {
        *self.phase.lock().expect("health") = (Instant::now(), phase);
    }

    /// What the loop is busy with and since when (None while idle).
    fn busy(&self) -> Option<(&'static str, Instant)> {
        let (since, phase) = *self.phase.lock().expect("health");
        (phase != IDLE).then_some((phase, since))
    }

    fn progress(&self) {
        *self.stalled.lock().expect("health") = None;
    }

    /// No progress this time; the stall counts from the first of a row.
    fn no_progress(&self, why: String) {
        let mut s = self.stalled.lock().expect("health");
        let since = s.as_ref().map_or_else(Instant::now, |(t, _)| *t);
        *s = Some((since, why));
    }

    pub(crate) fn received(&self, rev: u64) {
        self.received.fetch_max(rev, Ordering::SeqCst);
        if rev > self.applied.load(Ordering::SeqCst) {
            self.behind_since.lock().expect("health").get_or_insert_with(Instant::now);
        }
    }

    fn applied(&self, rev: u64) {
        self.applied.fetch_max(rev, Ordering::SeqCst);
        if self.applied.load(Ordering::SeqCst) >= self.received.load(Ordering::SeqCst) {
            *self.behind_since.lock().expect("health") = None;
        }
    }

    /// Why the controller is unhealthy, if it is.
    pub fn problem(&self) -> Option<String> {
        if let Some((since, why)) = self.stalled.lock().expect("health").as_ref() {
            if since.elapsed() > self.bound {
                return Some(format!("no progress for {:.0} s: {why}", since.elapsed().as_secs_f64()));
            }
        }
        if let Some((phase, since)) = self.busy().filter(|(_, since)| since.elapsed() > self.bound.max(LOOP_STUCK)) {
            return Some(format!("the control loop has been {phase} for {:.0} s", since.elapsed().as_secs_f64()));
        }
        let behind = *self.behind_since.lock().expect("health");
        if let Some(since) = behind.filter(|s| s.elapsed() > self.bound) {
            let (got, done) = (self.received.load(Ordering::SeqCst), self.applied.load(Ordering::SeqCst));
            return Some(format!("the engine has not applied revision {got} (applied {done}) for {:.0} s", since.elapsed().as_secs_f64()));
        }
        None
    }
}

/// The control loop's phase while it waits for work.
const IDLE: &str = "waiting";

/// How long one phase of the control loop may take before the watchdog
/// names it (a loop that hangs says where).
const LOOP_STUCK: Duration = Duration::from_secs(20);

/// Logs, once per episode, a control loop busy with one thing for longer
/// than [`LOOP_STUCK`]. A thread of its own: it speaks even when every
/// runtime thread is blocked.
fn watch_the_loop(shared: std::sync::Weak<Shared>) {
    let spawned = std::thread::Builder::new().name("loop-watchdog".into()).spawn(move || {
        let mut reported: Option<Instant> = None;
        loop {
            std::thread::sleep(Duration::from_secs(2));
            let Some(shared) = shared.upgrade() else { return };
            if let Some((phase, since)) = shared.health.busy().filter(|(_, since)| since.elapsed() > LOOP_STUCK) {
                if reported != Some(since) {
                    let took = since.elapsed().as_secs();
                    error!(phase, seconds = took, "the control loop has been {phase} for {took} s without finishing");
                    reported = Some(since);
                }
            }
        }
    });
    if let Err(e) = spawned {
        warn!(error = %e, "the loop watchdog could not start");
    }
}

/// Loads and checks the rules; errors carry the rendered diagnostics.
pub fn load_rules(paths: &[PathBuf]) -> Result<Arc<Program>, ControllerError> {
    let checked = ccattler_parser::load(paths)?;
    match checked.program {
        Some(p) if checked.errors() == 0 => Ok(Arc::new(p)),
        _ => Err(ControllerError::Rules {
            path: paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            errors: checked.errors(),
            rendered: checked.render(),
        }),
    }
}

/// The key prefixes the controller reads: every pattern's literal prefix, and `status/`.
pub fn prefixes(program: &Program) -> Vec<String> {
    let mut all = pattern_prefixes(program);
    all.push("status/".into());
    covering(all)
}

/// The prefixes of the rules' key patterns, none covered by another.
pub fn pattern_prefixes(program: &Program) -> Vec<String> {
    covering(program.relations.iter().filter_map(|r| r.pattern.as_ref()).map(|p| p.prefix()).collect())
}

/// Sorted, without the prefixes a shorter one covers.
fn covering(mut all: Vec<String>) -> Vec<String> {
    all.sort();
    // Drop prefixes covered by a shorter one.
    let mut out: Vec<String> = Vec::new();
    for p in all {
        if !out.iter().any(|q| p.starts_with(q.as_str())) {
            out.push(p);
        }
    }
    out
}

/// What the controller reads: what the rules read and write, and `secret/`
/// (values to seal to nodes, and the sealed copies it keeps right).
pub fn controller_prefixes(program: &Program) -> Vec<String> {
    let mut p = prefixes(program);
    if !p.iter().any(|q| "secret/".starts_with(q.as_str())) {
        p.push("secret/".into());
        p.sort();
    }
    p
}

/// The smallest key range that holds every prefix: what the controller
/// watches, rather than the whole keyspace.
pub fn watch_range(prefixes: &[String]) -> (Vec<u8>, Vec<u8>) {
    let from = prefixes.iter().min().cloned().unwrap_or_default().into_bytes();
    let to = prefixes.iter().map(|p| etcd::prefix_end(p)).max().unwrap_or_else(|| vec![0]);
    if from.is_empty() {
        return (vec![0], vec![0]); // everything
    }
    (from, to)
}

/// The key of the cluster clock the rules judge heartbeats by.
pub const CLOCK_KEY: &str = ccattler_store::layout::CLOCK;

/// The cluster clock (`status/clock`, seconds), advanced by the leader every
/// second by its own monotonic clock from where the last leader left it: a
/// new leader whose wall clock is ahead never makes fresh heartbeats look
/// stale, and time without a leader does not count. A cluster's first leader
/// starts it at 0, the reading agents beat with before there is a clock
/// (rules/nodes.rules), so they stay fresh for their grace while they read
/// the first one. (Written only if the rules read it.)
struct LeaderClock {
    base: i64,
    since: Instant,
    written: Option<i64>,
}

impl LeaderClock {
    /// Starts from the clock etcd holds, or else from the nodes' beats
    /// ([`clock_start`]).
    fn start(r: &Reconciler) -> LeaderClock {
        let held = r.inputs.facts.get(CLOCK_KEY).and_then(|f| f.value.parse::<i64>().ok());
        let beats = r
            .inputs
            .facts
            .with_prefix("observed/node/")
            .into_iter()
            .filter(|(k, _)| k.ends_with("/heartbeat"))
            .filter_map(|(_, f)| f.value.parse::<i64>().ok());
        LeaderClock { base: clock_start(held, beats), since: Instant::now(), written: None }
    }

    fn now(&self) -> i64 {
        self.base.saturating_add(self.since.elapsed().as_secs() as i64)
    }
}

/// Where a new leader's clock starts: the clock etcd holds; with none (a
/// first leader: 0; or `status/clock` deleted by hand) the lower median of
/// the nodes' last beats. Restarting at 0 under live beats would put every
/// beat in the future and make every node stale at once; the median, not
/// the highest, so that a minority of agents beating absurd values cannot
/// push the clock past everyone else's beats.
fn clock_start(held: Option<i64>, beats: impl Iterator<Item = i64>) -> i64 {
    if let Some(held) = held {
        return held;
    }
    let mut beats: Vec<i64> = beats.filter(|b| *b >= 0).collect();
    if beats.is_empty() {
        return 0;
    }
    beats.sort_unstable();
    beats[(beats.len() - 1) / 2]
}

/// Whether the rules read the cluster clock.
fn rules_read_clock(program: &Program) -> bool {
    ccattler_engine::facts::decode(program, CLOCK_KEY, "0").is_ok_and(|t| !t.is_empty())
}

/// Leading: the fence every write compares, and the heartbeat that keeps it
/// (ccattler_store::leader — no lease, which any etcd user could keep alive).
struct Leadership {
    fence: Fence,
    /// The renewer's view of the heartbeat.
    heartbeat: tokio::sync::watch::Receiver<Heartbeat>,
    /// Rewrites the leader key every TTL/3 on a task of its own, so a
    /// write-back or an evaluation longer than the TTL never lets it lapse.
    renewer: tokio::task::JoinHandle<()>,
    /// Renewals refused for want of space that the loop has already heeded.
    refused_for_space_seen: u64,
}

impl Leadership {
    /// Leads by `fence`, last renewed (or created) by a request sent at `sent`.
    fn start(client: &Client, fence: Fence, id: &str, ttl: i64, sent: Instant) -> Leadership {
        let ttl = leader_ttl(ttl);
        let (tx, heartbeat) = tokio::sync::watch::channel(Heartbeat::new(ttl, sent));
        let (mut client, key, id) = (client.clone(), fence.clone(), id.to_string());
        let renewer = tokio::spawn(async move {
            let mut tick = tokio::time::interval(ttl / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let sent = Instant::now();
                // A slow renewal still counts (from when it was sent) if it
                // is answered before the heartbeat's deadline; after that it is
                // given up and the next one sent. (Given up at TTL/3, every
                // renewal was lost on a disk slower than that.)
                match tokio::time::timeout(ttl - leader::margin(ttl), leader::renew(&mut client, &key, &id)).await {
                    Ok(Ok(renewal)) => {
                        tx.send_modify(|h| h.answered(sent, renewal));
                        if !renewal.is_ours() {
                            return;
                        }
                    }
                    Ok(Err(e)) => warn!(error = %e, "renewing leadership failed; trying again"),
                    Err(_) => warn!("renewing leadership timed out; trying again"),
                }
            }
        });
        Leadership { fence, heartbeat, renewer, refused_for_space_seen: 0 }
    }

    fn is_lost(&self) -> bool {
        self.heartbeat.borrow().is_lost(Instant::now())
    }

    fn is_taken(&self) -> bool {
        self.heartbeat.borrow().is_taken()
    }

    /// Whether etcd refused a renewal for want of space since the last call.
    fn newly_refused_for_space(&mut self) -> bool {
        let refused = self.heartbeat.borrow().refused_for_space();
        std::mem::replace(&mut self.refused_for_space_seen, refused) < refused
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

fn leader_ttl(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(1) as u64)
}

/// Tries to become leader: takes the leader key if it is absent or stale.
async fn campaign(client: &mut Client, cfg: &ControllerConfig, judge: &mut Judge) -> Result<Option<Leadership>, etcd_client::Error> {
    let Some((fence, sent)) = leader::campaign(client, LEADER_KEY, &cfg.id, judge).await? else {
        return Ok(None);
    };
    Ok(Some(Leadership::start(client, fence, &cfg.id, cfg.leader_ttl, sent)))
}

/// A standby's campaign; on success every key is considered again, since a
/// standby plans nothing while it waits.
/// An etcd error here means the connection is unusable (its member may be
/// gone): the caller connects again, to a member that answers.
async fn take_over(client: &mut Client, cfg: &ControllerConfig, r: &mut Reconciler, judge: &mut Judge) -> Result<Option<Leadership>, etcd_client::Error> {
    let leader = campaign(client, cfg, judge).await?;
    if leader.is_some() {
        info!(id = %cfg.id, "took over leadership");
        r.mark_all_dirty();
    }
    Ok(leader)
}

/// After a reconnect, or a heartbeat that lapsed: keeps leading if the
/// leader key is still ours (one renewal succeeds; under NOSPACE, the key
/// still being ours counts). Safe whenever it succeeds: nobody else can
/// lead while our key stands, and every write compares its create revision.
async fn resume(client: &mut Client, fence: Fence, cfg: &ControllerConfig) -> Result<Option<Leadership>, etcd_client::Error> {
    let sent = Instant::now();
    Ok(leader::renew(client, &fence, &cfg.id).await?.is_ours().then(|| Leadership::start(client, fence, &cfg.id, cfg.leader_ttl, sent)))
}

/// Runs until SIGTERM or SIGINT. Rules must check at start; later reloads
/// (SIGHUP) that fail the checker are refused and the old rules keep running.
pub async fn run(cfg: ControllerConfig) -> Result<(), ControllerError> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = tx.send(true);
    });
    run_until(cfg, rx).await
}

/// Runs until `stop` turns true (then finishes the transaction in flight,
/// resigns and returns).
pub async fn run_until(cfg: ControllerConfig, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<(), ControllerError> {
    let mut program = load_rules(&cfg.rules)?;
    let secret_keys = cfg.secret_key.as_deref().map(ClusterKeys::load).transpose()?;
    let mut book = SecretBook::default();
    let mut unsealable: Vec<crate::secrets::Unsealable> = Vec::new();
    let (explain_tx, mut explain_rx) = tokio::sync::mpsc::channel::<crate::explain::Asked>(16);
    // Explanations answered at once; more wait their turn.
    let explaining = Arc::new(tokio::sync::Semaphore::new(EXPLAIN_AT_ONCE));
    let console = cfg.ui.clone().map(|users| Arc::new(crate::console::Console::new(users)));
    let shared =
        Arc::new(Shared { ready: AtomicBool::new(false), metrics: Metrics::new(), explain: explain_tx, health: Health::new(cfg.stall_bound), console });
    if let Some(addr) = cfg.listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        info!(%addr, "serving /healthz, /readyz, /metrics");
        tokio::spawn(crate::http::serve(listener, shared.clone()));
    }
    watch_the_loop(Arc::downgrade(&shared));
    let mut hup = signal(SignalKind::hangup())?;
    let mut reconciler: Option<Reconciler> = None;
    // The fence of the leadership held before a reconnect, if any.
    let mut held_fence: Option<Fence> = None;
    // What this controller knows of the leader key, across reconnects.
    let mut judge = Judge::new(leader_ttl(cfg.leader_ttl));
    // Since when etcd refuses puts for want of space: meanwhile write-back
    // only deletes (what filled etcd may be what the rules no longer derive),
    // until etcd's alarm list says the alarm is gone.
    let mut nospace_since: Option<Instant> = None;
    let mut backoff = Duration::from_millis(100);
    // Whether a snapshot was ever read (credentials then known good).
    let mut ever_loaded = false;
    // The leadership (its fence) under which the program was published.
    let mut published: Option<i64> = None;
    // When the cluster gauges were last recounted (a walk of the derived keys).
    let mut cluster_counted = Recount::every(CLUSTER_METRICS_EVERY);
    // … and the console's tables.
    let mut console = Recount::every(crate::console::EVERY);
    // Engines started (a group's starts once: its processes connect once).
    let mut engines = 0;
    // One op of each list is the fence / derived revision.
    let budget = crate::reconcile::Budget { ops: cfg.max_txn_ops.max(2) - 1, bytes: cfg.max_txn_bytes.max(1) };

    'connect: loop {
        // (Loading a snapshot is watched by its own errors, not the watchdog.)
        shared.health.enter(IDLE);
        shared.ready.store(false, Ordering::SeqCst);
        shared.metrics.leader.set(0);
        let t = Instant::now();
        let r = match reconciler.as_mut() {
            Some(r) => r,
            None => match start_engine(&program, &cfg, &mut engines, &mut stop).await? {
                Some(engine) => reconciler.insert(Reconciler::on(program.clone(), engine)),
                None => return Ok(()), // told to stop while a group connected
            },
        };
        let loaded = match etcd::connect(&cfg.etcd).await {
            Ok(client) => load_snapshot(client, &program, r, &mut book).await,
            Err(e) => Err(Fault::Retry(e)),
        };
        let (mut client, rev, keys) = match loaded {
            Ok(c) => c,
            Err(Fault::Fatal(e)) => return Err(e),
            Err(Fault::Retry(e)) => {
                let why = etcd::describe_error(&e, &cfg.etcd);
                // Denied is not unreachable: wrong credentials at start stop
                // the controller (its supervisor restarts it once fixed).
                if etcd::is_denied_credentials(&e) && !ever_loaded {
                    return Err(ControllerError::Credentials(why));
                }
                if etcd::is_denied_credentials(&e) {
                    error!(reason = %why, "etcd refuses the controller's credentials; retrying in {backoff:?}");
                } else {
                    warn!(reason = %why, "etcd unreachable or the snapshot failed; retrying in {backoff:?}");
                }
                shared.health.no_progress(why);
                // It may hold part of the snapshot: a new engine, then.
                if reconciler.as_ref().is_some_and(Reconciler::holds_part_of_a_snapshot) {
                    reconciler = None;
                }
                if sleep_or_stop(backoff, &mut stop).await {
                    return Ok(());
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let r = reconciler.as_mut().expect("the snapshot was loaded into it");
        ever_loaded = true;
        info!(revision = rev, keys, seconds = t.elapsed().as_secs_f64(), "snapshot loaded");
        // (A snapshot is no progress: a controller that reconnects over and
        // over writes nothing.)
        shared.health.applied(rev as u64);
        shared.metrics.observe(r, rev as u64);
        // The watch gets a connection of its own: a backlog of watch data left
        // unread while a transaction is awaited would otherwise use up the
        // shared HTTP/2 connection window and stall that transaction's reply.
        let watch_client = match etcd::connect(&cfg.etcd).await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "watch connection failed");
                continue 'connect;
            }
        };
        // One watch over the range the prefixes span (one stream keeps every
        // revision's events together, in order).
        let (from, to) = watch_range(&controller_prefixes(&program));
        let watch_opts = WatchOptions::new().with_range(to).with_start_revision(rev + 1).with_progress_notify();
        let (watcher, stream) = match etcd::watch(&watch_client, from, watch_opts).await {
            Ok(w) => w,
            Err(e) => {
                warn!(error = %e, "watch failed");
                continue 'connect;
            }
        };
        let mut watch = WatchReader::spawn(watcher, stream, shared.clone());
        backoff = Duration::from_millis(100);
        shared.ready.store(true, Ordering::SeqCst);
        let mut leader = match held_fence.take() {
            Some(fence) => resume(&mut client, fence, &cfg).await.ok().flatten(),
            None => None,
        };
        if leader.is_some() {
            info!(id = %cfg.id, "still leading after reconnecting");
        } else {
            leader = campaign(&mut client, &cfg, &mut judge).await.ok().flatten();
            if leader.is_some() {
                info!(id = %cfg.id, "leading");
            }
        }
        // How often a leader checks its heartbeat and a standby its judge
        // (no request unless the leader key may be takeable).
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut clock_tick = tokio::time::interval(Duration::from_secs(1));
        clock_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let with_clock = rules_read_clock(&program);
        // The clock of the leadership (by its fence) that advances it.
        let mut clock: Option<(i64, LeaderClock)> = None;
        // When a leader may plan and write (crate::gate).
        let mut gate = WriteGate::default();
        loop {
            if let Some(l) = leader.as_ref().filter(|l| l.is_lost()) {
                if l.is_taken() {
                    warn!("leadership lost: the leader key is another's");
                    held_fence = None;
                } else {
                    // (A slow etcd: the key may still be ours, and nobody
                    // else may create one under NOSPACE; `resume` tries.)
                    warn!("leadership lapsed: the leader key was not renewed in time; leading again if it is still ours");
                }
                leader = None;
            }
            if let Some(l) = &mut leader {
                held_fence = Some(l.fence.clone());
                // etcd refused our heartbeat for want of space: it refuses
                // every put, though write-back may have nothing to write.
                if l.newly_refused_for_space() {
                    out_of_space(&mut nospace_since, &shared, &"the leader key's renewal was refused: etcdserver: mvcc: database space exceeded");
                }
            }
            shared.metrics.leader.set(i64::from(leader.is_some()));
            // A standby has nothing to write while another leads; with no
            // live leader (its key stale or absent, and ours not taken) the
            // cluster's write-back stands still.
            if leader.is_none() {
                if judge.may_take(Instant::now()) {
                    shared.health.no_progress("no controller leads: the leader key is stale or absent and this one could not take it".into());
                } else {
                    shared.health.progress();
                }
            }
            // The program it runs, for the CLI: once per leadership and program.
            if let Some(l) = leader.as_ref().filter(|l| published != Some(l.fence.create_revision)) {
                shared.health.enter("publishing the rules under status/program/");
                match publish_program(&mut client, &l.fence, &program).await {
                    Ok(()) => published = Some(l.fence.create_revision),
                    Err(e) if etcd::is_nospace(&e) => {}
                    Err(e) => warn!(error = %e, "publishing the rule files under status/program/ failed; trying again"),
                }
            }
            let open = gate.open(r.revision(), watch.backlog(), Instant::now());
            let fence = leader.as_ref().map(|l| l.fence.clone()).filter(|_| open);
            if let Some(fence) = fence {
                // Out of space: only deletes, until etcd's alarm list (asked
                // every NOSPACE_RETRY) says the alarm is gone.
                if nospace_since.is_some_and(|t| t.elapsed() >= NOSPACE_RETRY) {
                    shared.health.enter("reading etcd's alarms");
                    match leader::nospace(&mut client).await {
                        Ok(false) => writes_again(&mut nospace_since, &shared.metrics),
                        Ok(true) => nospace_since = Some(Instant::now()),
                        Err(e) => {
                            warn!(error = %e, "reading etcd's alarms failed; reconnecting");
                            continue 'connect;
                        }
                    }
                }
                let deletes_only = nospace_since.is_some();
                shared.health.enter("writing back");
                match write_back(&mut client, r, &fence, budget, &shared.metrics, deletes_only).await {
                    Ok(WriteBack::Idle | WriteBack::Committed(_)) if deletes_only => {
                        shared.health.no_progress("etcd is out of space (NOSPACE alarm): only deleting".into());
                        if sleep_or_stop(Duration::from_millis(200), &mut stop).await {
                            return resign(&mut client, leader).await;
                        }
                    }
                    // Nothing derived to write: secret values next.
                    Ok(WriteBack::Idle) if book.is_dirty() => {
                        gate.committed(0);
                        shared.health.enter("sealing secrets");
                        match seal_secrets(&mut client, &mut book, secret_keys.as_ref(), &fence, budget, &mut unsealable).await {
                            Ok(Some(at)) => gate.committed(at),
                            Ok(None) => {}
                            Err(e) => {
                                warn!(error = %e, "writing sealed secrets failed; reconnecting");
                                continue 'connect;
                            }
                        }
                    }
                    Ok(WriteBack::Idle) => {
                        gate.committed(0);
                        shared.health.progress();
                    }
                    // Our own writes come back through the watch one revision at a
                    // time; the states in between are partial (some placements
                    // written, some not), so nothing is planned until the last one
                    // is applied.
                    Ok(WriteBack::Committed(at)) => {
                        gate.committed(at);
                        shared.health.progress();
                        writes_again(&mut nospace_since, &shared.metrics);
                    }
                    Ok(WriteBack::Refused(at)) => {
                        let back_off = gate.refused(at);
                        shared.health.no_progress(format!("{} write-back(s) in a row refused (a compare failed)", gate.refusals()));
                        tokio::time::sleep(back_off).await;
                        if !leader::still_ours(&mut client, &fence).await.unwrap_or(false) {
                            warn!("lost leadership");
                            leader = None;
                            held_fence = None;
                        }
                    }
                    // Users or roles changed (a node was added): a new token
                    // will do; the state and the watch stay as they are.
                    Err(e) if etcd::is_stale_auth(&e) => match etcd::connect(&cfg.etcd).await {
                        Ok(c) => {
                            info!("etcd's users or roles changed; connected again with a new token");
                            client = c;
                        }
                        Err(e) => {
                            warn!(error = %e, "reconnecting after an auth change failed");
                            continue 'connect;
                        }
                    },
                    Err(e) if etcd::is_nospace(&e) => {
                        shared.metrics.write_failure("nospace");
                        out_of_space(&mut nospace_since, &shared, &e);
                    }
                    Err(e) => {
                        warn!(error = %e, "write-back failed; reconnecting");
                        shared.metrics.write_failure("connection");
                        shared.health.no_progress(format!("write-back failed: {e}"));
                        continue 'connect;
                    }
                }
            }
            shared.health.enter(IDLE);
            tokio::select! {
                messages = watch.next_all() => {
                    shared.health.enter("applying revisions");
                    // Everything the watch has already delivered goes to the engine at once.
                    let crate::watch::Decoded { batch, observed, head, leader_seen, broken } = crate::watch::decode(messages, r.revision());
                    for (key, value) in &observed {
                        book.observe(key, value.as_ref());
                    }
                    if !batch.is_empty() {
                        let t = Instant::now();
                        let revisions = batch.len();
                        tokio::task::block_in_place(|| r.apply_many(batch))?;
                        shared.metrics.evaluation.observe(t.elapsed().as_secs_f64());
                        debug!(revisions, seconds = t.elapsed().as_secs_f64(), "applied");
                    }
                    shared.metrics.observe(r, head.max(r.revision()));
                    shared.health.applied(head.max(r.revision()));
                    if cluster_counted.is_due() {
                        let t = Instant::now();
                        shared.metrics.observe_cluster(r);
                        debug!(seconds = t.elapsed().as_secs_f64(), "recounted the cluster's gauges");
                        cluster_counted.counted(t.elapsed());
                    }
                    console_recount(&shared, r, &mut console);
                    if let Some(why) = broken {
                        warn!("{why}; taking a new snapshot");
                        continue 'connect;
                    }
                    if let Some(rev) = leader_seen {
                        judge.saw(rev, Instant::now());
                    }
                    if leader.is_none() && judge.may_take(Instant::now()) {
                        leader = match take_over(&mut client, &cfg, r, &mut judge).await {
                            Ok(l) => l,
                            Err(e) => {
                                warn!(error = %e, "campaign failed; reconnecting");
                                continue 'connect;
                            }
                        };
                    }
                }
                _ = clock_tick.tick(), if with_clock => {
                    shared.health.enter("writing the clock");
                    let Some(l) = leader.as_ref() else {
                        clock = None;
                        continue;
                    };
                    if clock.as_ref().is_none_or(|(f, _)| *f != l.fence.create_revision) {
                        clock = Some((l.fence.create_revision, LeaderClock::start(r)));
                    }
                    let c = &mut clock.as_mut().expect("just set").1;
                    let now = c.now();
                    if c.written != Some(now) {
                        match write_within(&mut client, &l.fence, &[], Some((CLOCK_KEY, now.to_string()))).await {
                            Ok(Written::Committed(_)) => c.written = Some(now),
                            Ok(Written::Refused(_)) => warn!("the clock was not written: leadership changed"),
                            // Out of space: the clock stands still (time without writes does not count).
                            Err(e) if etcd::is_nospace(&e) => out_of_space(&mut nospace_since, &shared, &e),
                            Err(e) if etcd::is_stale_auth(&e) => match etcd::connect(&cfg.etcd).await {
                                Ok(fresh) => client = fresh,
                                Err(_) => continue 'connect,
                            },
                            Err(e) => {
                                warn!(error = %e, "writing the clock failed; reconnecting");
                                continue 'connect;
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    shared.health.enter("on its 250 ms tick (console copy, leadership)");
                    // A change that came while the console waited out its
                    // period is counted here, though nothing else comes.
                    console_recount(&shared, r, &mut console);
                    // Our own write not even received for long: the watch is
                    // stuck (the loop would otherwise wait for it, silently).
                    let received = shared.health.received.load(Ordering::SeqCst);
                    if let Some((rev, waited)) = gate.stuck(r.revision(), received, Instant::now(), WATCH_STALL) {
                        warn!(revision = rev, received, applied = r.revision(), waited = ?waited, "the watch has not delivered a revision this controller wrote; taking a new snapshot and watch");
                        shared.health.no_progress(format!("the watch did not deliver revision {rev} (written by this controller) within {waited:?}"));
                        continue 'connect;
                    }
                    match leader.as_ref() {
                        // (The loop's head sees a lapse.)
                        Some(_) => {}
                        None if held_fence.is_some() => {
                            let fence = held_fence.clone().expect("matched");
                            match resume(&mut client, fence, &cfg).await {
                                Ok(Some(l)) => {
                                    info!(id = %cfg.id, "leading again: the leader key was still ours");
                                    r.mark_all_dirty();
                                    leader = Some(l);
                                }
                                Ok(None) => held_fence = None,
                                Err(e) => {
                                    warn!(error = %e, "renewing a lapsed leadership failed; reconnecting");
                                    continue 'connect;
                                }
                            }
                        }
                        None if !judge.worth_a_look(Instant::now()) => {}
                        None => match take_over(&mut client, &cfg, r, &mut judge).await {
                            Ok(l) => leader = l,
                            Err(e) => {
                                warn!(error = %e, "campaign failed; reconnecting");
                                shared.health.no_progress(format!("campaign failed: {e}"));
                                continue 'connect;
                            }
                        },
                    }
                }
                Some(asked) = explain_rx.recv() => {
                    // Frozen at r.revision() (a cheap copy) and answered on a
                    // thread of its own, a few at a time: the loop goes on
                    // applying and writing meanwhile.
                    match crate::explain::Frozen::of(r) {
                        Ok(frozen) => {
                            let (permits, shared) = (explaining.clone(), shared.clone());
                            tokio::spawn(async move {
                                let Ok(_permit) = permits.acquire_owned().await else { return };
                                shared.metrics.explaining.inc();
                                let answer = tokio::task::spawn_blocking(move || frozen.answer(&asked.question)).await;
                                shared.metrics.explaining.dec();
                                if let Ok(answer) = answer {
                                    let _ = asked.reply.send(answer);
                                }
                            });
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                _ = stop.changed() => return resign(&mut client, leader).await,
                _ = hup.recv() => match load_rules(&cfg.rules) {
                    // New rules need a new dataflow on every process.
                    Ok(_) if cfg.cluster.is_some() => error!(
                        "reload refused, the old rules keep running: a controller group (--hosts) takes new rules by restarting all its processes together (each with the new files)"
                    ),
                    Ok(p) => {
                        info!("rules reloaded");
                        program = p;
                        published = None;
                        reconciler = None;
                        if let Some(l) = leader.take() {
                            let _ = leader::resign(&mut client, &l.fence).await;
                        }
                        held_fence = None;
                        continue 'connect;
                    }
                    Err(e) => error!("reload refused, the old rules keep running: {e}"),
                },
            }
        }
    }
}

/// etcd refused a put for want of space: named once (log, metric, health);
/// write-back only deletes until the alarm is gone.
fn out_of_space(nospace_since: &mut Option<Instant>, shared: &Shared, e: &dyn std::fmt::Display) {
    if nospace_since.is_none() {
        error!(error = %e, "etcd is out of space (its NOSPACE alarm is raised): it refuses every put until an administrator compacts, defragments and disarms it (etcdctl compact, defrag, alarm disarm); meanwhile only deletes are written, so removing the rule or fact that filled it frees the space");
        *nospace_since = Some(Instant::now());
    }
    shared.metrics.nospace.set(1);
    shared.health.no_progress(format!("etcd is out of space (NOSPACE alarm): {e}"));
}

/// Where the controller publishes the rule files it runs: `status/program/NN-FILE`
/// (NN the file's place in the program; the CLI reads them when it is given no
/// `--rules` and has no `rules/` of its own).
pub const PROGRAM_PREFIX: &str = "status/program/";

/// Publishes the program's files under [`PROGRAM_PREFIX`], fenced by
/// leadership: puts what changed, deletes files no longer in it.
async fn publish_program(client: &mut Client, fence: &Fence, program: &Program) -> Result<(), etcd_client::Error> {
    use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
    let sources = &program.sources;
    let want: std::collections::BTreeMap<String, String> = sources
        .ids()
        .enumerate()
        .map(|(n, id)| {
            let base = std::path::Path::new(sources.name(id)).file_name().map_or_else(|| "rules".into(), |b| b.to_string_lossy().into_owned());
            (format!("{PROGRAM_PREFIX}{n:02}-{base}"), sources.text(id).to_string())
        })
        .collect();
    let held = client.get(PROGRAM_PREFIX, Some(GetOptions::new().with_prefix())).await?;
    let held: std::collections::BTreeMap<String, String> =
        held.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), String::from_utf8_lossy(kv.value()).into_owned())).collect();
    let mut ops: Vec<TxnOp> = want.iter().filter(|(k, v)| held.get(*k) != Some(*v)).map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None)).collect();
    ops.extend(held.keys().filter(|k| !want.contains_key(*k)).map(|k| TxnOp::delete(k.as_str(), None)));
    if ops.is_empty() {
        return Ok(());
    }
    let fenced = Txn::new().when([Compare::create_revision(fence.key.clone(), CompareOp::Equal, fence.create_revision)]).and_then(ops);
    client.txn(fenced).await?;
    Ok(())
}

/// etcd takes puts again (a put committed, or its alarm list is clear).
fn writes_again(nospace_since: &mut Option<Instant>, metrics: &Metrics) {
    if nospace_since.take().is_some() {
        info!("etcd takes writes again (its NOSPACE alarm is gone)");
        metrics.nospace.set(0);
    }
}

/// How often the cluster gauges (nodes and instances by state, …) are recounted
/// (at most: longer when counting takes long, see [`Recount`]).
const CLUSTER_METRICS_EVERY: Duration = Duration::from_secs(2);

/// How often etcd's alarm list is read while it is out of space.
const NOSPACE_RETRY: Duration = Duration::from_secs(2);

/// `/explain` questions answered at the same time (each holds a snapshot).
const EXPLAIN_AT_ONCE: usize = 2;

/// Keys in a snapshot's first page (later pages are sized by bytes).
const FIRST_PAGE: i64 = 5000;

/// Reads a snapshot of everything the rules read and write, at one revision,
/// into `r`. A fresh reconciler loads it page by page as the pages arrive, so
/// decoding and the engine's work overlap the read (a cold start pays little
/// more than the read); one that holds state is rebased onto the whole
/// snapshot (after a compaction or reconnect).
async fn load_snapshot(mut client: Client, program: &Program, r: &mut Reconciler, book: &mut SecretBook) -> Result<(Client, i64, usize), Fault> {
    let prefixes = controller_prefixes(program);
    book.clear();
    if !r.is_fresh() {
        let (rev, snap) = etcd::snapshot(&mut client, &prefixes, FIRST_PAGE).await.map_err(Fault::Retry)?;
        let keys = snap.len();
        for (k, h) in &snap {
            book.observe(k, Some(h));
        }
        tokio::task::block_in_place(|| r.rebase(rev as u64, snap))?;
        return Ok((client, rev, keys));
    }
    let rev = etcd::current_revision(&mut client).await.map_err(Fault::Retry)?;
    // The pages are read on a task of their own while this one loads them.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut reader = client.clone();
    let read = tokio::spawn(async move { etcd::read_pages(&mut reader, &prefixes, FIRST_PAGE, rev, |page| tx.send(page).is_ok()).await });
    let (t, mut keys) = (Instant::now(), 0);
    tokio::task::block_in_place(|| {
        while let Some(page) = rx.blocking_recv() {
            keys += page.len();
            for (k, h) in &page {
                book.observe(k, Some(h));
            }
            r.load_page(rev as u64, page)?;
        }
        Ok::<_, ControllerError>(())
    })?;
    read.await.expect("the snapshot reader does not panic").map_err(Fault::Retry)?;
    info!(keys, seconds = t.elapsed().as_secs_f64(), "snapshot read and staged");
    tokio::task::block_in_place(|| r.finish_load(rev as u64))?;
    Ok((client, rev, keys))
}

/// The controller's engine: on this process's workers, or, in a group, as
/// process 0 of the group's timely cluster (waits for the others to connect).
/// A group's engine starts once: its other processes serve one engine for
/// their lifetime. `None` if told to stop while waiting (the connecting thread is left
/// behind: the runtime is shut down without waiting for it).
async fn start_engine(
    program: &Arc<Program>,
    cfg: &ControllerConfig,
    started: &mut usize,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Option<ccattler_engine::Engine>, ControllerError> {
    *started += 1;
    let Some(cluster) = &cfg.cluster else { return Ok(Some(ccattler_engine::Engine::start(program.clone(), cfg.workers)?)) };
    if *started > 1 {
        return Err(ControllerError::Group(
            "the snapshot read failed part way and a group's engine cannot be started again in place; exiting so that the group restarts together".into(),
        ));
    }
    info!(processes = cluster.addresses.len(), workers = cluster.workers, "waiting for the group's processes to connect");
    let (program, cluster) = (program.clone(), cluster.clone());
    let mut connecting = tokio::task::spawn_blocking(move || ccattler_engine::Engine::start_cluster(program, &cluster));
    tokio::select! {
        started = &mut connecting => {
            let engine = started.map_err(|e| ControllerError::Group(format!("starting the engine panicked: {e}")))??;
            info!("the group's processes are connected");
            Ok(Some(engine))
        }
        _ = stop.changed() => {
            info!("stopping before the group's processes connected");
            Ok(None)
        }
    }
}

/// Why the loop leaves a connection: for good, or to connect again.
#[derive(Debug)]
enum Fault {
    /// The controller cannot go on (its engine stopped): it exits non-zero
    /// and a standby takes over.
    Fatal(ControllerError),
    /// etcd failed or refused: connect again, take a new snapshot.
    Retry(etcd_client::Error),
}

impl From<ControllerError> for Fault {
    fn from(e: ControllerError) -> Fault {
        Fault::Fatal(e)
    }
}

impl From<ccattler_engine::EngineError> for Fault {
    fn from(e: ccattler_engine::EngineError) -> Fault {
        Fault::Fatal(e.into())
    }
}

/// What a write-back pass did; the revisions say how far the watch must get
/// before the next plan.
enum WriteBack {
    Idle,
    Committed(u64),
    Refused(u64),
}

/// Transactions in flight at once during write-back.
const IN_FLIGHT: usize = 8;

/// How long one write-back transaction may go unanswered before the
/// connection counts as broken (an answer that never comes would otherwise
/// hold the loop, silently, for ever).
const TXN_DEADLINE: Duration = Duration::from_secs(30);

/// How long the watch may go without delivering a revision this controller
/// committed before it counts as stuck (a new snapshot and watch follow).
const WATCH_STALL: Duration = Duration::from_secs(30);

/// One fenced write, each op guarded by its own compare, failing with a
/// timeout after [`TXN_DEADLINE`].
async fn write_within(client: &mut Client, fence: &Fence, ops: &[crate::reconcile::Op], stamp: Option<(&str, String)>) -> Result<Written, etcd_client::Error> {
    write_guarded_within(client, fence, ops, &Guard::EachKey, stamp).await
}

/// [`write_within`] with the ops held by `guard`.
async fn write_guarded_within(
    client: &mut Client,
    fence: &Fence,
    ops: &[crate::reconcile::Op],
    guard: &Guard,
    stamp: Option<(&str, String)>,
) -> Result<Written, etcd_client::Error> {
    match tokio::time::timeout(TXN_DEADLINE, etcd::write_guarded(client, fence, ops, guard, stamp)).await {
        Ok(result) => result,
        Err(_) => Err(etcd_client::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("etcd did not answer a transaction of {} key(s) within {TXN_DEADLINE:?}", ops.len()),
        ))),
    }
}

/// Writes the planned difference in transactions of at most `max_ops` keys,
/// several in flight. Each is fenced on its own and touches distinct keys, so
/// their order does not matter; after a refusal no new one starts.
async fn write_back(
    client: &mut Client,
    r: &mut Reconciler,
    fence: &Fence,
    budget: crate::reconcile::Budget,
    metrics: &Metrics,
    deletes_only: bool,
) -> Result<WriteBack, etcd_client::Error> {
    // Planned a transaction at a time, while earlier ones are in flight;
    // each guarded as cheaply as holds it to its plan (one compare over a
    // run of keys in a cold start's bulk, a compare per key otherwise).
    let mut cursor = PlanCursor::default();
    let first = plan_chunk(r, &mut cursor, budget, deletes_only);
    if first.is_empty() {
        if !deletes_only {
            r.clean();
            metrics.settled.set(r.revision() as i64);
        }
        return Ok(WriteBack::Idle);
    }
    // (The derived revision is a put: not written while only deleting.)
    let stamp = (!deletes_only).then_some(crate::reconcile::DERIVED_REVISION);
    let derived = r.revision();
    let mut next = Some(first);
    // Halves of a transaction etcd refused for good, to find the key behind
    // it, and range-guarded ones refused, to try key by key.
    let mut retry: Vec<Vec<crate::reconcile::Op>> = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    let (mut last, mut refused, mut failure) = (0u64, None::<u64>, None);
    loop {
        while refused.is_none() && failure.is_none() && running.len() < IN_FLIGHT {
            let (chunk, guard) = match retry.pop() {
                Some(c) => (c, Guard::EachKey),
                None => {
                    let chunk = next.take().unwrap_or_else(|| plan_chunk(r, &mut cursor, budget, deletes_only));
                    let guard = r.guard_for(&chunk);
                    (chunk, guard)
                }
            };
            if chunk.is_empty() {
                break;
            }
            let (mut c, f) = (client.clone(), fence.clone());
            running.spawn(async move {
                let result = write_guarded_within(&mut c, &f, &chunk, &guard, stamp.map(|k| (k, derived.to_string()))).await;
                (chunk, guard, result)
            });
        }
        let Some(joined) = running.join_next().await else { break };
        let (chunk, guard, result) = joined.expect("write-back task does not panic");
        match result {
            Ok(Written::Committed(rev)) => {
                r.written(&chunk, rev);
                metrics.txn(true, chunk.len());
                last = last.max(rev as u64);
            }
            // Something in the range moved, not necessarily one of these
            // keys (another transaction of this write-back, or a neighbour):
            // again, a compare per key.
            Ok(Written::Refused(rev)) if guard != Guard::EachKey => {
                debug!(
                    revision = rev,
                    first_key = chunk.first().map_or("", |op| op.key()),
                    keys = chunk.len(),
                    "a range-guarded transaction was refused; retrying it key by key"
                );
                metrics.range_retried.inc();
                retry.push(chunk);
            }
            Ok(Written::Refused(rev)) => {
                metrics.txn(false, 0);
                warn!(
                    revision = rev,
                    first_key = chunk.first().map_or("", |op| op.key()),
                    keys = chunk.len(),
                    "transaction refused: a compare failed (a key moved since it was read, or leadership changed); will re-plan once the watch has caught up"
                );
                refused = Some(refused.unwrap_or(0).max(rev as u64));
            }
            Err(e) => match etcd::permanent_refusal(&e) {
                // Refused for good: find the key(s) behind it by halving, and
                // block those; the rest of the transaction is written.
                Some(why) if chunk.len() > 1 => {
                    let mut chunk = chunk;
                    let tail = chunk.split_off(chunk.len() / 2);
                    retry.push(tail);
                    retry.push(chunk);
                    metrics.write_failure("split");
                    let _ = why;
                }
                Some(why) => {
                    let op = &chunk[0];
                    error!(key = %op.key(), reason = %why, "etcd refuses to write this derived key; it is blocked (status/blocked/…) until the rules want another value");
                    metrics.write_failure("blocked");
                    r.block(op, format!("etcd refused to write it: {why}"));
                }
                None => failure = Some(e),
            },
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(match refused {
        Some(rev) => WriteBack::Refused(rev.max(last)),
        None => WriteBack::Committed(last),
    })
}

/// The next transaction's ops; only its deletes while etcd is out of space
/// (skipping chunks with none).
fn plan_chunk(r: &mut Reconciler, cursor: &mut PlanCursor, budget: crate::reconcile::Budget, deletes_only: bool) -> Vec<crate::reconcile::Op> {
    loop {
        let mut chunk = r.plan_next(cursor, budget);
        if !deletes_only || chunk.is_empty() {
            return chunk;
        }
        chunk.retain(|op| matches!(op, crate::reconcile::Op::Delete { .. }));
        if !chunk.is_empty() {
            return chunk;
        }
    }
}

/// Writes the sealed secret copies the book plans, fenced like the
/// write-back; logs what cannot be sealed when that changes. The revision to
/// wait for before planning again, if anything was written or refused.
async fn seal_secrets(
    client: &mut Client,
    book: &mut SecretBook,
    keys: Option<&ClusterKeys>,
    fence: &Fence,
    budget: crate::reconcile::Budget,
    reported: &mut Vec<crate::secrets::Unsealable>,
) -> Result<Option<u64>, etcd_client::Error> {
    let (ops, problems) = book.plan(keys);
    if problems != *reported {
        for p in problems.iter().filter(|p| !reported.contains(p)) {
            warn!(node = %p.node, secret = %p.secret, reason = %p.why, "a secret cannot be sealed to a node that needs it");
        }
        *reported = problems;
    }
    let mut last = None;
    for chunk in crate::reconcile::chunks(ops, budget) {
        let chunk = chunk.as_slice();
        match write_within(client, fence, chunk, None).await? {
            Written::Committed(rev) => {
                book.written(chunk, rev);
                info!(keys = chunk.len(), revision = rev, "sealed secrets written");
                last = Some(rev as u64);
            }
            Written::Refused(rev) => {
                book.refused();
                return Ok(Some(rev as u64));
            }
        }
    }
    Ok(last)
}

async fn resign(client: &mut Client, leader: Option<Leadership>) -> Result<(), ControllerError> {
    if let Some(l) = leader {
        match leader::resign(client, &l.fence).await {
            Ok(true) => info!("resigned leadership"),
            Ok(false) => info!("leadership had already passed on"),
            Err(e) => warn!(error = %e, "could not delete the leader key; a standby takes it once it is stale"),
        }
    }
    info!("stopped");
    Ok(())
}

/// Sleeps; true if a stop came first.
async fn sleep_or_stop(d: Duration, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.changed() => true,
    }
}

/// When something the loop recounts from scratch (the console's tables, the
/// cluster's gauges) was last counted, and how long to wait before the next:
/// its period, or longer when counting took long, so that recounting takes at
/// most a tenth of the loop (walking 150,000 instances' keys takes ~0.1 s).
struct Recount {
    counted: Option<Instant>,
    every: Duration,
    period: Duration,
}

impl Recount {
    fn every(every: Duration) -> Recount {
        Recount { counted: None, every, period: every }
    }

    fn is_due(&self) -> bool {
        self.counted.is_none_or(|t| t.elapsed() >= self.period)
    }

    /// Counted now, in `took`.
    fn counted(&mut self, took: Duration) {
        self.period = self.every.max(took * crate::console::LOOP_SHARE_INVERSE);
        self.counted = Some(Instant::now());
    }
}

/// The console's tables, if it is on, behind the reconciler and due: the loop
/// copies what they read and a blocking thread counts them; the copy's own
/// cost spaces the next one (at most a tenth of the loop).
fn console_recount(shared: &Shared, r: &Reconciler, clock: &mut Recount) {
    use std::sync::atomic::Ordering;
    let Some(console) = shared.console.as_ref() else { return };
    if !clock.is_due() || console.counting.load(Ordering::Acquire) || console.state.borrow().revision >= r.revision() {
        return;
    }
    let t = Instant::now();
    let copied = crate::console::copy(r);
    console.rules.send_replace(Arc::new(crate::console::rules(r)));
    clock.counted(t.elapsed());
    console.counting.store(true, Ordering::Release);
    let console = console.clone();
    tokio::task::spawn_blocking(move || {
        let state = crate::console::count(copied);
        console.state.send_replace(Arc::new(state));
        console.counting.store(false, Ordering::Release);
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_deleted_clock_restarts_at_the_beats_median_not_at_zero_nor_at_a_liars_beat() {
        use super::clock_start;
        // A held clock is kept; a first leader starts at 0.
        assert_eq!(clock_start(Some(42), [7, 9000].into_iter()), 42);
        assert_eq!(clock_start(None, std::iter::empty()), 0);
        // Deleted under live beats: near them, so none looks in the future.
        assert_eq!(clock_start(None, [1000, 1001, 1002].into_iter()), 1001);
        // One hostile agent (absurd or negative beats) moves it nowhere.
        assert_eq!(clock_start(None, [1000, 1001, 1002, i64::MAX].into_iter()), 1001);
        assert_eq!(clock_start(None, [-5, 1000, 1001, 1002].into_iter()), 1001);
        assert_eq!(clock_start(None, [-5, -9].into_iter()), 0);
    }

    use super::*;

    #[test]
    fn a_loop_busy_with_one_thing_too_long_fails_health_and_an_idle_one_never_does() {
        let h = Health::new(Duration::from_secs(3));
        h.enter("writing back");
        assert_eq!(h.problem(), None, "just started");
        let long_ago = Instant::now() - LOOP_STUCK - Duration::from_secs(5);
        *h.phase.lock().unwrap() = (long_ago, "writing back");
        let problem = h.problem().expect("stuck");
        assert!(problem.contains("the control loop has been writing back for 25 s"), "{problem}");
        assert_eq!(h.busy().map(|(p, _)| p), Some("writing back"));
        *h.phase.lock().unwrap() = (long_ago, IDLE);
        assert_eq!(h.problem(), None, "waiting for work is no problem, however long");
        assert_eq!(h.busy(), None);
    }

    #[test]
    fn the_watch_covers_the_declared_prefixes_not_the_keyspace() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(watch_range(&p(&["desired/", "secret/", "status/"])), (b"desired/".to_vec(), b"status0".to_vec()));
        // A pattern that starts with a placeholder reads everything.
        assert_eq!(watch_range(&p(&["", "status/"])), (vec![0], vec![0]));
        let program = ccattler_parser::check_str("t.rules", "input v(s: name) from \"v/{s}\"\noutput o(s: name) to \"effective/o/{s}\"\no(s) :- v(s).\n")
            .program
            .unwrap();
        assert_eq!(controller_prefixes(&program), p(&["effective/o/", "secret/", "status/", "v/"]));
    }
}
