//! The agent's loop. Level-triggered, like the controller: each pass reads
//! what is placed on the node, makes the processes match (start, stop,
//! restart after a crash with backoff, restart when the launch spec
//! changes), and writes the difference between what it observes and what it
//! last wrote under its own `observed/node/N/`. It reads only its node's
//! view (`placement/node/N/`, `effective/node/N/`, `secret/node/N/`: etcd
//! allows it nothing else), watches all three to wake early, and re-reads
//! them on a resync timer. The lease is kept alive and the heartbeat
//! advanced by a task of its own ([`Pulse`]), so a slow step never lets them
//! lapse. etcd being away never stops the instances: the loop reconnects
//! with backoff, reuses its lease while it lives, and otherwise takes a new
//! one and registers again.

use crate::keys::ObservedKey;
use crate::probe;
use crate::runtime::{self, Identity, Launch};
use crate::spec::{self, InstanceSpec, Secrets};
use crate::state::{Record, StateDir, StateError};
use ccattler_parser::pattern::is_valid_name as is_name;
use ccattler_store::etcd::{connect, EtcdConfig};
use ccattler_store::layout;
use ccattler_store::seal::{NodeKey, SealError};
use etcd_client::{Client, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp, WatchOptions, WatchStream, Watcher};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub etcd: EtcdConfig,
    pub node: String,
    pub cpu: i64,
    pub memory: i64,
    pub address: String,
    pub labels: BTreeMap<String, String>,
    /// Capacity of resources other than cpu and memory (`gpu = 2`).
    pub resources: BTreeMap<String, i64>,
    /// Lease TTL in seconds.
    pub ttl: i64,
    pub state_dir: PathBuf,
    /// SIGTERM → SIGKILL grace when stopping an instance.
    pub grace: Duration,
    /// Re-read the specs at least this often.
    pub resync: Duration,
    /// The uids instances run as, one each; `None`: as the agent's user.
    pub instance_uids: Option<crate::confine::UidRange>,
    /// The most processes an instance may have at once (its cgroup's `pids.max`).
    pub pids_max: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    State(#[from] StateError),
    /// etcd refused the agent's credentials at start: retrying them cannot help.
    #[error("{0}")]
    Credentials(String),
    #[error("--node {0:?} is not a name ([a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters)")]
    Node(String),
    #[error("--label {0:?}: {1}")]
    Label(String, &'static str),
    #[error("--address {0:?} is not an IP address")]
    Address(String),
    #[error("--ttl must be at least 2 seconds, not {0}")]
    Ttl(i64),
    #[error("--{0} must be a positive amount, not {1}")]
    Capacity(String, i64),
    #[error("--resource {0:?}: the name must be a name other than cpu and memory (they have flags of their own)")]
    Resource(String),
    #[error("the node key: {0}")]
    Key(#[from] SealError),
}

/// Why an instance is in the state it is in; reported as `observed/instance/I/state`.
#[derive(Clone, Debug, PartialEq)]
enum Phase {
    /// Its process runs.
    Running,
    /// Its process exited; it starts again at `retry_at`.
    Crashed { exit: String, retry_at: Instant },
    /// It cannot start until its spec changes (unsupported image, …).
    Failed(String),
    /// It cannot start yet (no image, a secret not sealed to this node yet).
    Waiting(Option<String>),
    /// Its process was signalled to stop.
    Stopping,
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Crashed { .. } => "crashed",
            Phase::Failed(_) => "failed",
            Phase::Waiting(_) => "waiting",
            Phase::Stopping => "stopping",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Proc {
    pid: u32,
    start_time: u64,
    generation: u64,
    /// The user it runs as (`None`: the agent's).
    uid: Option<u32>,
}

struct ProbeRun {
    spec: spec::ProbeSpec,
    next: Instant,
    in_flight: bool,
    healthy: Option<bool>,
}

struct Instance {
    service: String,
    image: Option<String>,
    /// What its process was started with.
    launch: Option<Launch>,
    port: u16,
    proc: Option<Proc>,
    phase: Phase,
    restarts: u32,
    probes: BTreeMap<String, ProbeRun>,
    /// The template version its process runs (once it runs what the spec asks).
    version: Option<i64>,
    /// CPU (millicores) and memory (MiB) it used over the last sample
    /// period, and its cpu time (ns) at the last sample.
    usage: Option<(i64, i64)>,
    cpu_ns: Option<(u64, Instant)>,
    /// The cgroup its current process runs in: one per start, so a restart
    /// of the same instance never shares one with its predecessor's cleanup.
    cgroup: Option<crate::confine::InstanceCgroup>,
}

enum Event {
    Exited { instance: String, generation: u64, status: String },
    Probed { instance: String, generation: u64, probe: String, healthy: bool },
}

struct Conn {
    client: Client,
    lease: i64,
    pulse: Pulse,
    _watcher: Watcher,
    watch: WatchStream,
}

/// Keeps the lease alive and beats every third of the TTL, on a task of its
/// own: a slow read or a long step of the loop never lets either lapse. A
/// beat writes `observed/node/N/heartbeat` = the cluster clock as etcd holds
/// it now (`status/clock`, 0 before there is one): the rules judge the beat's
/// age on that clock, so a beat costs this one write and nothing of the
/// controller's. A beat that would repeat the last one (the clock stands
/// still without a leader) is not written. It stops at the first failure and
/// says why.
struct Pulse {
    task: tokio::task::JoinHandle<()>,
    lost: tokio::sync::watch::Receiver<Option<String>>,
}

impl Pulse {
    fn start(
        mut client: Client,
        (mut keeper, mut responses): (LeaseKeeper, LeaseKeepAliveStream),
        heartbeat: ObservedKey,
        ttl: i64,
        deadline_file: PathBuf,
    ) -> Pulse {
        let (tx, lost) = tokio::sync::watch::channel(None);
        let period = Duration::from_millis(ttl.max(1) as u64 * 1000 / 3);
        let task = tokio::spawn(async move {
            let (mut last_beat, mut denied, mut bad_clock) = (None, false, None::<String>);
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // Taken before asking: etcd renews the lease after this, so
                // it lives at least a TTL from here.
                let asked_at = crate::supervise::now_ms();
                let renewed = tokio::time::timeout(Duration::from_secs(2), async {
                    keeper.keep_alive().await?;
                    responses.message().await
                })
                .await;
                let why = match renewed {
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        // The lease lives at least this long: what instance
                        // supervisors fence by if the agent dies.
                        let deadline = asked_at + resp.ttl() * 1000;
                        if let Err(e) = crate::supervise::write_ms(&deadline_file, deadline) {
                            tracing::warn!(error = %e, "cannot record the lease deadline for the instance supervisors");
                        }
                        let beat = match read_clock(&mut client).await {
                            Ok(Ok(beat)) => beat,
                            // Said once per bad value, not every beat.
                            Ok(Err(bad)) => {
                                if bad_clock.as_ref() != Some(&bad) {
                                    tracing::warn!(key = layout::CLOCK, value = %bad, "the cluster clock is not a reading; beating with 0");
                                    bad_clock = Some(bad);
                                }
                                0
                            }
                            // A role from before agents read the clock: the lease
                            // is kept, but without a beat the node goes stale.
                            Err(e) if ccattler_store::etcd::permanent_refusal(&e).is_some() => {
                                if !denied {
                                    tracing::error!(key = layout::CLOCK, error = %e, "etcd denies this agent the cluster clock, so it cannot beat and its node will be unreachable; its role predates it: as root, run `ccattler auth regrant`");
                                }
                                denied = true;
                                continue;
                            }
                            Err(e) => {
                                let _ = tx.send(Some(format!("reading the cluster clock ({}): {e}", layout::CLOCK)));
                                return;
                            }
                        };
                        if last_beat == Some(beat) {
                            continue;
                        }
                        match client.put(heartbeat.as_str(), beat.to_string(), None).await {
                            Ok(_) => {
                                last_beat = Some(beat);
                                continue;
                            }
                            Err(e) => format!("heartbeat: {e}"),
                        }
                    }
                    Ok(Ok(Some(_))) => "the lease expired".to_string(),
                    Ok(Ok(None)) => "the keep-alive stream ended".to_string(),
                    Ok(Err(e)) => format!("keep-alive: {e}"),
                    Err(_) => "keep-alive timed out".to_string(),
                };
                let _ = tx.send(Some(why));
                return;
            }
        });
        Pulse { task, lost }
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The name of this agent's cgroup parent (`ccattler/<this>/<instance>`): the
/// node and its state dir, so two agents on one host (tests, a demo) never
/// share one, and a restarted agent finds its instances' cgroups again.
fn cgroup_group(node: &str, state_dir: &std::path::Path) -> String {
    let dir = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    // FNV-1a: stable across builds, unlike the std hasher.
    let hash = dir.as_os_str().as_encoded_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    format!("{node}-{:08x}", hash as u32)
}

/// The cluster clock as etcd holds it (a linearizable read: never a lagging
/// member's older reading), 0 while there is none; `Err` with the value
/// when it is not a clock reading (the beat is 0 then: the rules judge by
/// the controller's own clock).
async fn read_clock(client: &mut Client) -> Result<Result<i64, String>, etcd_client::Error> {
    let resp = client.get(layout::CLOCK, None).await?;
    let Some(kv) = resp.kvs().first() else { return Ok(Ok(0)) };
    Ok(clock_reading(kv.value()))
}

/// A clock reading (seconds, 0 or more), or the value (at most 64
/// characters of it) when it is not one.
fn clock_reading(value: &[u8]) -> Result<i64, String> {
    let text = String::from_utf8_lossy(value);
    text.parse::<i64>().ok().filter(|c| *c >= 0).ok_or_else(|| text.chars().take(64).collect())
}

/// A fact the agent writes: its value, and whether it dies with the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fact {
    value: String,
    leased: bool,
}

pub struct Agent {
    cfg: AgentConfig,
    state: StateDir,
    instances: BTreeMap<String, Instance>,
    /// What etcd last held from us (keys we own).
    written: BTreeMap<ObservedKey, Fact>,
    /// The last spec read, once one was.
    wanted: Option<BTreeMap<String, InstanceSpec>>,
    /// The secret values those specs use, opened with the node key (memory only).
    secrets: Secrets,
    /// This node's key pair (its public half is `observed/node/N/pubkey`).
    key: NodeKey,
    /// Set by a fresh read: leftover instance dirs are swept once per read.
    fresh: bool,
    /// Why the view could not be read, while etcd refuses it for good (not a
    /// lost connection): reported as `observed/node/N/view_error`, which the
    /// rules turn into the node's `impaired` state.
    view_error: Option<String>,
    /// Persistent volumes on disk (read at start, added to as instances start).
    volumes: BTreeSet<String>,
    conn: Option<Conn>,
    next_connect: Instant,
    /// Whether it ever registered (credentials then known good).
    registered: bool,
    /// The last connect failure logged (each new one is, once).
    last_failure: Option<String>,
    /// etcd refused the credentials before the agent ever registered.
    refused: Option<String>,
    /// The cgroup hierarchies instances are confined in.
    cgroups: crate::confine::Cgroups,
    backoff: Duration,
    generation: u64,
    /// The usage figures reported, per service (crate::usage).
    usage: crate::usage::Held,
    events: (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>),
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often instances' CPU and memory use are sampled: the average over the
/// period, cpu rounded to 10 millicores and memory to 4 MiB. (What is written,
/// and how often, is crate::usage's.)
const USAGE_PERIOD: Duration = Duration::from_secs(5);
const TXN_OPS: usize = 64;

/// Restart delay after the n-th crash: 0.5 s, doubling up to 16 s.
fn crash_backoff(restarts: u32) -> Duration {
    Duration::from_millis(500).saturating_mul(1 << restarts.min(6).saturating_sub(1)).min(Duration::from_secs(30))
}

impl AgentConfig {
    pub fn validate(&self) -> Result<(), AgentError> {
        if !is_name(&self.node) {
            return Err(AgentError::Node(self.node.clone()));
        }
        for (k, v) in &self.labels {
            if !is_name(k) {
                return Err(AgentError::Label(format!("{k}={v}"), "the key is not a name"));
            }
        }
        if self.address.parse::<std::net::IpAddr>().is_err() {
            return Err(AgentError::Address(self.address.clone()));
        }
        if self.ttl < 2 {
            return Err(AgentError::Ttl(self.ttl));
        }
        for (what, amount) in [("cpu", self.cpu), ("memory", self.memory)] {
            if amount <= 0 {
                return Err(AgentError::Capacity(what.to_string(), amount));
            }
        }
        for (what, amount) in &self.resources {
            if !is_name(what) || what == "cpu" || what == "memory" {
                return Err(AgentError::Resource(what.clone()));
            }
            if *amount <= 0 {
                return Err(AgentError::Capacity(what.clone(), *amount));
            }
        }
        Ok(())
    }
}

impl Agent {
    /// Opens the state dir and adopts the instances a previous run left
    /// running; records of processes that are gone are dropped.
    pub fn new(cfg: AgentConfig) -> Result<Self, AgentError> {
        cfg.validate()?;
        let state = StateDir::open(&cfg.state_dir)?;
        let key = NodeKey::load_or_create(&state.node_key())?;
        let cgroups = crate::confine::Cgroups::detect(&cgroup_group(&cfg.node, &cfg.state_dir));
        match &cgroups {
            crate::confine::Cgroups::Unavailable(why) => {
                tracing::warn!(reason = %why, "instances run WITHOUT cgroups: their memory, cpu and pids are not limited, and a process that leaves its group outlives a stop")
            }
            c if !c.missing().is_empty() => tracing::warn!(missing = ?c.missing(), "some cgroup controllers are not available; those limits are not enforced"),
            c => tracing::info!(cgroups = ?c, "instances are confined in cgroups"),
        }
        if cfg.instance_uids.is_none() {
            tracing::warn!("instances and exec probes run as the agent's own user (no --instance-uids)");
        }
        let mut agent = Agent {
            cgroups,
            state,
            instances: BTreeMap::new(),
            written: BTreeMap::new(),
            wanted: None,
            secrets: Secrets::new(),
            key,
            fresh: false,
            view_error: None,
            volumes: BTreeSet::new(),
            conn: None,
            registered: false,
            last_failure: None,
            refused: None,
            next_connect: Instant::now(),
            backoff: Duration::from_millis(250),
            generation: 0,
            usage: Default::default(),
            events: mpsc::unbounded_channel(),
            cfg,
        };
        agent.volumes = agent.state.persistent_volumes().into_iter().collect();
        for (name, rec) in agent.state.records() {
            if runtime::alive(rec.pid, rec.start_time) {
                tracing::info!(instance = %name, pid = rec.pid, "adopting an instance started by a previous run");
                agent.generation += 1;
                let proc = Proc { pid: rec.pid, start_time: rec.start_time, generation: agent.generation, uid: rec.uid };
                agent.watch_adopted(name.clone(), proc);
                agent.instances.insert(
                    name,
                    Instance {
                        service: rec.service,
                        image: Some(rec.launch.image.clone()),
                        launch: Some(rec.launch),
                        port: rec.port,
                        proc: Some(proc),
                        phase: Phase::Running,
                        restarts: 0,
                        probes: BTreeMap::new(),
                        version: None,
                        usage: None,
                        cpu_ns: None,
                        cgroup: (!rec.cgroup.is_empty()).then(|| crate::confine::InstanceCgroup::from_dirs(rec.cgroup.clone())),
                    },
                );
            } else {
                agent.state.forget(&name)?;
            }
        }
        Ok(agent)
    }

    /// Runs until `stop` resolves; then stops every instance, revokes the lease and returns.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) -> Result<(), AgentError> {
        tokio::pin!(stop);
        // While this process lives, its instances' supervisors know it does.
        let alive_file = crate::supervise::Signals::in_dir(&self.cfg.state_dir).alive;
        let alive = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                if let Err(e) = crate::supervise::write_ms(&alive_file, crate::supervise::now_ms()) {
                    tracing::warn!(error = %e, "cannot tell the instance supervisors the agent lives");
                }
            }
        });
        let _alive = AbortOnDrop(alive);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_resync = Instant::now();
        let mut next_usage = Instant::now() + USAGE_PERIOD;
        loop {
            let mut dirty = false;
            tokio::select! {
                _ = &mut stop => break,
                Some(ev) = self.events.1.recv() => self.on_event(ev),
                msg = watch_message(&mut self.conn) => match msg {
                    Ok(true) => dirty = true,
                    Ok(false) => self.lost("the watch of the node's view ended"),
                    Err(e) => self.lost(&format!("the watch of the node's view failed: {e}")),
                },
                _ = tick.tick() => {}
            }
            while let Ok(ev) = self.events.1.try_recv() {
                self.on_event(ev);
            }
            if self.conn.is_none() && Instant::now() >= self.next_connect {
                self.connect().await;
                dirty = true;
                if let Some(why) = self.refused.take() {
                    return Err(AgentError::Credentials(why));
                }
            }
            if self.conn.is_some() && (dirty || Instant::now() >= next_resync) {
                next_resync = Instant::now() + self.cfg.resync;
                self.read_wanted().await;
            }
            self.check_pulse();
            self.converge();
            self.probe();
            if Instant::now() >= next_usage {
                next_usage = Instant::now() + USAGE_PERIOD;
                self.sample_usage();
            }
            // Every pass: a service whose last instance left drops its figures
            // in the same write that reports the instance gone.
            let sums = self.usage_sums();
            self.usage.offer(sums, Instant::now().into_std());
            self.publish().await;
        }
        self.shutdown().await
    }

    fn lost(&mut self, why: &str) {
        if self.conn.take().is_some() {
            tracing::warn!(reason = why, "lost etcd; instances keep running, reconnecting");
        }
        self.next_connect = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Connects, keeps the lease if it still lives (else takes a new one), and
    /// learns what etcd holds from us, so only differences are written.
    async fn connect(&mut self) {
        match self.try_connect().await {
            Ok(conn) => {
                tracing::info!(node = %self.cfg.node, lease = conn.lease, "registered with etcd");
                self.registered = true;
                self.last_failure = None;
                self.backoff = Duration::from_millis(250);
                self.conn = Some(conn);
            }
            Err(e) => {
                let why = ccattler_store::etcd::describe_error(&e, &self.cfg.etcd);
                // Wrong credentials before the agent ever registered: say so
                // and stop (a supervisor restarts it once they are fixed).
                if !self.registered && ccattler_store::etcd::is_denied_credentials(&e) {
                    self.refused = Some(why);
                    return;
                }
                if self.conn.is_none() && self.last_failure.as_deref() != Some(why.as_str()) {
                    tracing::warn!(reason = %why, "cannot connect to etcd; retrying");
                    self.last_failure = Some(why.clone());
                }
                self.lost(&format!("connect: {why}"))
            }
        }
    }

    async fn try_connect(&mut self) -> Result<Conn, etcd_client::Error> {
        let mut client = connect(&self.cfg.etcd).await?;
        let old = self.conn.as_ref().map(|c| c.lease).or(self.state.lease());
        let mut lease = None;
        if let Some(id) = old {
            if client.lease_time_to_live(id, None).await?.ttl() > 0 {
                lease = Some(id);
            }
        }
        let lease = match lease {
            Some(id) => id,
            None => {
                let id = client.lease_grant(self.cfg.ttl, None).await?.id();
                tracing::info!(lease = id, ttl = self.cfg.ttl, "granted a new lease");
                id
            }
        };
        if let Err(e) = self.state.set_lease(Some(lease)) {
            tracing::warn!(error = %e, "cannot remember the lease; a restart will take a new one");
        }
        let node = &self.cfg.node;
        let watch = WatchOptions::new().with_prefix();
        let (mut watcher, watch_stream) = ccattler_store::etcd::watch(&client, layout::placement_prefix(node), watch.clone()).await?;
        watcher.watch(layout::view_prefix(node), Some(watch.clone())).await?;
        watcher.watch(layout::secret_prefix(node), Some(watch)).await?;
        self.written = self.read_written(&mut client, lease).await?;
        let heartbeat = ObservedKey::new(node, "heartbeat").expect("the node name was checked");
        let deadline_file = crate::supervise::Signals::in_dir(&self.cfg.state_dir).deadline;
        let pulse = Pulse::start(client.clone(), client.lease_keep_alive(lease).await?, heartbeat, self.cfg.ttl, deadline_file);
        Ok(Conn { client, lease, pulse, _watcher: watcher, watch: watch_stream })
    }

    /// The keys under `observed/node/N/` that etcd holds as we would write
    /// them (value and lease); anything else will be rewritten. (The
    /// heartbeat is the pulse's.)
    async fn read_written(&self, client: &mut Client, lease: i64) -> Result<BTreeMap<ObservedKey, Fact>, etcd_client::Error> {
        let node = &self.cfg.node;
        let resp = client.get(layout::observed_prefix(node), Some(GetOptions::new().with_prefix())).await?;
        let mut out = BTreeMap::new();
        for kv in resp.kvs() {
            let (Ok(k), Ok(v)) = (kv.key_str(), kv.value_str()) else { continue };
            let Ok(key) = ObservedKey::parse(node, k) else { continue };
            if key.as_str().ends_with("/heartbeat") && key == ObservedKey::new(node, "heartbeat").expect("a name") {
                continue;
            }
            let leased = kv.lease() != 0;
            if leased && kv.lease() != lease {
                continue; // held by an old lease: write it again under ours
            }
            out.insert(key, Fact { value: v.to_string(), leased });
        }
        Ok(out)
    }

    /// Reads the placements and specs, and what etcd holds from us (someone
    /// may have changed or deleted it: level-triggered, like the controller).
    async fn read_wanted(&mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        let read = async {
            let wanted = spec::read(&mut conn.client, &self.cfg.node, &self.key).await?;
            let written = self.read_written(&mut conn.client, conn.lease).await?;
            Ok::<_, etcd_client::Error>((wanted, written))
        }
        .await;
        self.conn = Some(conn);
        match read {
            Ok((wanted, written)) => {
                self.wanted = Some(wanted.instances);
                self.secrets = wanted.secrets;
                self.fresh = true;
                self.written = written;
                if self.view_error.take().is_some() {
                    tracing::info!("the node's view is readable again");
                }
            }
            // The connection works but etcd will not hand the view over: say
            // so (acting on the last view read) rather than reconnect forever.
            Err(e) => match ccattler_store::etcd::permanent_refusal(&e) {
                Some(why) => {
                    if self.view_error.is_none() {
                        tracing::error!(reason = %why, "the node's view cannot be read; reporting it and acting on the last view read");
                    }
                    self.view_error = Some(format!("reading the node's view: {why}"));
                }
                None => self.lost(&format!("reading placements: {e}")),
            },
        }
    }

    /// Whether the pulse still runs; if not, reconnect.
    fn check_pulse(&mut self) {
        let why = self.conn.as_ref().and_then(|c| c.pulse.lost.borrow().clone());
        if let Some(why) = why {
            self.lost(&why);
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Exited { instance, generation, status } => {
                let Some(inst) = self.instances.get_mut(&instance) else { return };
                if inst.proc.is_none_or(|p| p.generation != generation) {
                    return;
                }
                inst.proc = None;
                for p in inst.probes.values_mut() {
                    p.healthy = None;
                }
                if let Err(e) = self.state.forget(&instance) {
                    tracing::warn!(error = %e, "cannot forget a stopped instance");
                }
                if inst.phase == Phase::Stopping {
                    tracing::info!(instance = %instance, %status, "instance stopped");
                    inst.phase = Phase::Waiting(None); // converge restarts or removes it
                } else {
                    inst.restarts += 1;
                    let delay = crash_backoff(inst.restarts);
                    tracing::warn!(instance = %instance, %status, restarts = inst.restarts, retry_in = ?delay, "instance crashed");
                    inst.phase = Phase::Crashed { exit: status, retry_at: Instant::now() + delay };
                }
            }
            Event::Probed { instance, generation, probe, healthy } => {
                let Some(inst) = self.instances.get_mut(&instance) else { return };
                let Some(run) = inst.probes.get_mut(&probe) else { return };
                run.in_flight = false;
                if inst.proc.is_some_and(|p| p.generation == generation) {
                    run.healthy = Some(healthy);
                }
            }
        }
    }

    /// Samples what each running instance used since the last sample: from
    /// its cgroup's counters (cpu time and memory working set, everything it
    /// started included), or without a cgroup from /proc, summed over its
    /// process group.
    fn sample_usage(&mut self) {
        let mut groups = None;
        let ticks_per_s = runtime::clock_ticks();
        let now = Instant::now();
        for inst in self.instances.values_mut() {
            let Some(proc) = &inst.proc else {
                inst.usage = None;
                inst.cpu_ns = None;
                continue;
            };
            let counted = inst.cgroup.as_ref().map(|c| c.usage()).filter(|(cpu, mem)| cpu.is_some() && mem.is_some());
            let (cpu_ns, bytes) = match counted {
                Some((Some(cpu), Some(mem))) => (cpu, mem),
                _ => {
                    let groups = groups.get_or_insert_with(runtime::usage_by_group);
                    let Some(&(ticks, rss)) = groups.get(&proc.pid) else { continue };
                    (ticks.saturating_mul(1_000_000_000) / ticks_per_s, rss)
                }
            };
            if let Some((before, at)) = inst.cpu_ns.filter(|(b, _)| *b <= cpu_ns) {
                let period_ns = (now - at).as_nanos().max(1);
                let millicores = ((cpu_ns - before) as u128 * 1000 / period_ns) as i64;
                let mib = (bytes / (1024 * 1024)) as i64;
                inst.usage = Some(((millicores + 5) / 10 * 10, (mib + 2) / 4 * 4));
            }
            inst.cpu_ns = Some((cpu_ns, now));
        }
    }

    /// What the instances placed here use now, summed per service.
    fn usage_sums(&self) -> crate::usage::Sums {
        let mut sums = crate::usage::Sums::new();
        let placed = |name: &String| self.wanted.as_ref().is_some_and(|w| w.contains_key(name));
        for inst in self.instances.iter().filter(|(name, _)| placed(name)).map(|(_, inst)| inst) {
            if let (Some((cpu, mem)), true) = (inst.usage, inst.proc.is_some()) {
                let sum = sums.entry(inst.service.clone()).or_insert((0, 0));
                *sum = (sum.0.saturating_add(cpu), sum.1.saturating_add(mem));
            }
        }
        sums
    }

    /// Makes the processes match the placements: [`crate::plan::plan`]
    /// decides, this executes. An error on one instance (a directory that
    /// cannot be removed) is logged; it never stops the agent.
    fn converge(&mut self) {
        use crate::plan::{self, Action, Have, Wanted};
        // Taken for the pass (methods below need `&mut self`), put back after.
        let Some(wanted) = self.wanted.take() else { return };
        let mut want = BTreeMap::new();
        for (name, spec) in &wanted {
            let w = match self.launch_for(name, spec) {
                Ok(Ok(l)) => Wanted::Run(l),
                Ok(Err(why)) => Wanted::Wait(why),
                Err(why) => Wanted::Cannot(why),
            };
            // A process that runs what the spec asks runs the spec's template version.
            if let (Wanted::Run(l), Some(inst)) = (&w, self.instances.get_mut(name)) {
                if inst.proc.is_some() && inst.launch.as_ref() == Some(l) {
                    inst.version = spec.version;
                }
            }
            want.insert(name.clone(), w);
            // Known from now on; its fields and probes follow the spec (probes without a restart).
            let inst = self.instances.entry(name.clone()).or_insert_with(|| Instance {
                service: spec.service.clone(),
                image: spec.image.clone(),
                launch: None,
                port: 0,
                proc: None,
                phase: Phase::Waiting(None),
                restarts: 0,
                probes: BTreeMap::new(),
                version: None,
                usage: None,
                cpu_ns: None,
                cgroup: None,
            });
            inst.service = spec.service.clone();
            inst.image = spec.image.clone();
            inst.probes.retain(|p, run| spec.probes.get(p) == Some(&run.spec));
            for (p, ps) in &spec.probes {
                inst.probes.entry(p.clone()).or_insert_with(|| ProbeRun { spec: ps.clone(), next: Instant::now(), in_flight: false, healthy: None });
            }
        }
        let have: BTreeMap<String, Have> = self
            .instances
            .iter()
            .map(|(n, i)| {
                let phase = match &i.phase {
                    Phase::Running => plan::Phase::Running,
                    Phase::Crashed { retry_at, .. } => plan::Phase::Crashed { retry_at: retry_at.into_std() },
                    Phase::Failed(_) => plan::Phase::Failed,
                    Phase::Waiting(_) => plan::Phase::Waiting,
                    Phase::Stopping => plan::Phase::Stopping,
                };
                (n.clone(), Have { phase, process: i.proc.is_some(), launch: i.launch.clone() })
            })
            .collect();
        // Leftover dirs (e.g. from a crash of the agent), once per fresh read.
        let leftover = if std::mem::take(&mut self.fresh) { self.state.instance_dirs() } else { Vec::new() };
        for action in plan::plan(&want, &have, &leftover, Instant::now().into_std()) {
            match action {
                Action::Start { instance, launch } => {
                    let version = wanted.get(&instance).and_then(|spec| spec.version);
                    self.start(&instance, launch, version);
                    // Its persistent volumes exist on this node from now on.
                    if let Some(spec) = wanted.get(&instance) {
                        self.volumes.extend(spec.volumes.iter().filter(|(_, v)| v.persistent).map(|(v, _)| v.clone()));
                    }
                }
                Action::Stop { instance } => {
                    let placed = wanted.contains_key(&instance);
                    tracing::info!(instance = %instance, "{}", if placed { "spec changed; restarting" } else { "no longer placed here; stopping" });
                    self.stop(&instance);
                }
                Action::Forget { instance } | Action::RemoveDir { instance } => {
                    self.instances.remove(&instance);
                    if let Err(e) = self.state.remove_instance(&instance) {
                        tracing::warn!(instance = %instance, error = %e, "cannot remove the instance's directory; will try again");
                    }
                }
                Action::Wait { instance, why } => {
                    if let Some(i) = self.instances.get_mut(&instance) {
                        i.phase = Phase::Waiting(why);
                    }
                }
                Action::Fail { instance, why } => {
                    if let Some(i) = self.instances.get_mut(&instance) {
                        i.phase = Phase::Failed(why);
                    }
                }
            }
        }
        self.wanted = Some(wanted);
    }

    /// The launch spec of a placed instance: `Ok(Err(why))` while it must
    /// wait (no image yet, a secret not yet sealed to this node), `Err` when
    /// it cannot run here.
    fn launch_for(&self, name: &str, spec: &InstanceSpec) -> Result<Result<Launch, Option<String>>, String> {
        let Some(image) = &spec.image else { return Ok(Err(None)) };
        runtime::command_for(image, name).map_err(|e| e.to_string())?;
        let mut secrets = BTreeMap::new();
        for (secret, version) in &spec.secrets {
            match version {
                // A template pins a value by the revision it was stored at:
                // a copy sealed from an older one is not it yet.
                Some((tag, sealed_at)) if tag.parse::<i64>().is_ok_and(|pinned| *sealed_at < pinned) => {
                    return Ok(Err(Some(format!("secret {secret} is not yet sealed to this node at the value its template pins ({tag})"))))
                }
                Some((tag, _)) => secrets.insert(secret.clone(), tag.clone()),
                None => return Ok(Err(Some(format!("secret {secret} is not sealed to this node yet")))),
            };
        }
        let volumes = spec.volumes.iter().map(|(v, vs)| (v.clone(), (self.state.volume(name, v, vs.persistent), vs.mount.clone()))).collect();
        let limits = crate::confine::Limits { pids: Some(self.cfg.pids_max), ..spec.requests };
        Ok(Ok(Launch { image: image.clone(), config: spec.config.clone(), secrets, volumes, limits }))
    }

    /// The uid for a new instance: the lowest of the range no other live instance holds.
    fn pick_user(&self, name: &str) -> Result<Option<(u32, u32)>, String> {
        let Some(range) = self.cfg.instance_uids else { return Ok(None) };
        let taken: BTreeSet<u32> = self.instances.iter().filter(|(n, _)| n.as_str() != name).filter_map(|(_, i)| i.proc.and_then(|p| p.uid)).collect();
        let uid = range.pick(&taken).ok_or_else(|| format!("every uid of --instance-uids {}-{} is in use", range.start, range.end))?;
        Ok(Some((uid, uid)))
    }

    /// Whether the node's lease was renewed recently enough that a new
    /// instance would not be fenced at once: an agent cut off from etcd
    /// starts nothing (its instances may already run elsewhere).
    fn lease_fresh(&self) -> bool {
        let signals = crate::supervise::Signals::in_dir(&self.cfg.state_dir);
        let grace = crate::supervise::fence_grace(self.cfg.grace, self.cfg.ttl);
        crate::supervise::read_ms(&signals.deadline).is_some_and(|d| crate::supervise::now_ms() < crate::supervise::term_at(d, grace))
    }

    /// Starts `name` as `launch` says: the template `version` it is (which
    /// it reports, running or crashed).
    fn start(&mut self, name: &str, launch: Launch, version: Option<i64>) {
        if !self.lease_fresh() {
            let inst = self.instances.get_mut(name).expect("started instances exist");
            inst.phase = Phase::Waiting(Some("the node's lease is not renewed (etcd unreachable?); nothing starts until it is".into()));
            return;
        }
        let user = self.pick_user(name);
        let inst = self.instances.get_mut(name).expect("started instances exist");
        let started = (|| {
            let user = user?;
            let port = runtime::free_port(&self.cfg.address).map_err(|e| format!("no free port on {}: {e}", self.cfg.address))?;
            let dir = self.state.instance_dir(name);
            self.state.create(&dir).map_err(|e| e.to_string())?;
            // Its user passes through to `work/`; its record and log are the agent's.
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711)).map_err(|e| format!("{}: {e}", dir.display()))?;
            let work = self.state.work_dir(name);
            self.state.create(&work).map_err(|e| e.to_string())?;
            runtime::hand_over(&work, user).map_err(|e| format!("{}: {e}", work.display()))?;
            for (dir, _) in launch.volumes.values() {
                self.state.create(dir).map_err(|e| e.to_string())?;
                runtime::hand_over(dir, user).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            let cgroup = self.cgroups.instance(&format!("{name}.{}", crate::supervise::now_ms()));
            if let Some(c) = &cgroup {
                c.create(&launch.limits).map_err(|e| format!("cannot make the instance's cgroup: {e}"))?;
            }
            let id = Identity { instance: name, service: &inst.service, node: &self.cfg.node, host: &self.cfg.address, port };
            let signals = crate::supervise::Signals::in_dir(&self.cfg.state_dir);
            let confine =
                runtime::Confine { cgroup: cgroup.as_ref(), user, work: &work, fence_grace: crate::supervise::fence_grace(self.cfg.grace, self.cfg.ttl) };
            let child = runtime::spawn(&id, &launch, &self.secrets, &self.state.log(name), &signals, &confine).map_err(|e| e.to_string())?;
            let pid = child.id().ok_or("the process exited at once")?;
            let start_time = runtime::start_time(pid).unwrap_or(0);
            Ok::<_, String>((child, pid, start_time, port, user.map(|(u, _)| u), cgroup))
        })();
        match started {
            Ok((child, pid, start_time, port, uid, cgroup)) => {
                let memory = launch.limits.memory_mib;
                self.generation += 1;
                let proc = Proc { pid, start_time, generation: self.generation, uid };
                let record = Record {
                    service: inst.service.clone(),
                    pid,
                    start_time,
                    port,
                    launch: launch.clone(),
                    uid,
                    cgroup: cgroup.as_ref().map(|c| c.dirs.clone()).unwrap_or_default(),
                };
                if let Err(e) = self.state.save(name, &record) {
                    tracing::warn!(instance = name, error = %e, "cannot record the instance; a restarted agent will not adopt it");
                }
                tracing::info!(instance = name, pid, port, image = %launch.image, "started");
                inst.proc = Some(proc);
                inst.cgroup = cgroup;
                inst.port = port;
                inst.launch = Some(launch);
                inst.version = version;
                inst.phase = Phase::Running;
                for p in inst.probes.values_mut() {
                    p.healthy = None;
                    p.next = Instant::now();
                }
                let tx = self.events.0.clone();
                let instance = name.to_string();
                let mut child = child;
                tokio::spawn(async move {
                    let status = match child.wait().await {
                        Ok(s) if s.code() == Some(crate::supervise::OOM_KILLED) => {
                            format!("out of memory: killed at its limit of {} MiB", memory.unwrap_or(0))
                        }
                        Ok(s) => s.to_string(),
                        Err(e) => format!("wait failed: {e}"),
                    };
                    let _ = tx.send(Event::Exited { instance, generation: proc.generation, status });
                });
            }
            Err(why) => {
                tracing::warn!(instance = name, error = %why, "cannot start");
                inst.restarts += 1;
                inst.launch = Some(launch);
                inst.version = version;
                inst.phase = Phase::Crashed { exit: why, retry_at: Instant::now() + crash_backoff(inst.restarts) };
            }
        }
    }

    /// An adopted process is not our child: watch for it to go away.
    fn watch_adopted(&self, instance: String, proc: Proc) {
        let tx = self.events.0.clone();
        tokio::spawn(async move {
            while runtime::alive(proc.pid, proc.start_time) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let _ = tx.send(Event::Exited { instance, generation: proc.generation, status: "exited (adopted process)".into() });
        });
    }

    /// SIGTERM to the instance's process group; SIGKILL after the grace period.
    fn stop(&mut self, name: &str) {
        let Some(inst) = self.instances.get_mut(name) else { return };
        let Some(proc) = inst.proc else { return };
        inst.phase = Phase::Stopping;
        let cgroup = inst.cgroup.clone();
        runtime::signal_instance(proc.pid, cgroup.as_ref(), libc::SIGTERM);
        let grace = self.cfg.grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if runtime::alive(proc.pid, proc.start_time) || cgroup.as_ref().is_some_and(|c| !c.procs().is_empty()) {
                // Killing until the cgroup is empty waits between rounds: off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || {
                    if let Some(c) = &cgroup {
                        c.kill_until_empty(100);
                    }
                    runtime::signal_group(proc.pid, libc::SIGKILL);
                })
                .await;
            }
        });
    }

    /// Starts the probes that are due.
    fn probe(&mut self) {
        let now = Instant::now();
        for (name, inst) in &mut self.instances {
            let Some(proc) = inst.proc.filter(|_| inst.phase == Phase::Running) else { continue };
            for (p, run) in &mut inst.probes {
                if run.in_flight || now < run.next {
                    continue;
                }
                run.next = now + run.spec.interval;
                let Ok(method) = run.spec.method.clone() else {
                    run.healthy = Some(false);
                    continue;
                };
                run.in_flight = true;
                let (tx, instance, probe, host, port) = (self.events.0.clone(), name.clone(), p.clone(), self.cfg.address.clone(), inst.port);
                let ctx = probe::Context {
                    user: proc.uid.map(|u| (u, u)),
                    cgroup: inst.cgroup.as_ref().map(|c| c.dirs.clone()).unwrap_or_default(),
                    work: Some(self.state.work_dir(name)),
                };
                tokio::spawn(async move {
                    let healthy = probe::run(&method, &host, port, &ctx).await;
                    let _ = tx.send(Event::Probed { instance, generation: proc.generation, probe, healthy });
                });
            }
        }
    }

    /// Everything the agent observes, as facts (all under `observed/node/N/`).
    fn observed(&self, lease: i64) -> BTreeMap<ObservedKey, Fact> {
        let node = &self.cfg.node;
        let mut out = BTreeMap::new();
        let mut put = |key: Result<ObservedKey, _>, value: String, leased: bool| {
            // Names were checked (node, labels) or come from etcd keys that
            // already matched a name pattern; a bad one is skipped, loudly.
            match key {
                Ok(k) => {
                    out.insert(k, Fact { value, leased });
                }
                Err(e) => tracing::error!(error = %e, "not writing"),
            }
        };
        put(ObservedKey::new(node, "cpu"), self.cfg.cpu.to_string(), false);
        put(ObservedKey::new(node, "memory"), self.cfg.memory.to_string(), false);
        put(ObservedKey::new(node, "address"), self.cfg.address.clone(), false);
        put(ObservedKey::new(node, "ttl"), self.cfg.ttl.to_string(), false);
        put(ObservedKey::new(node, layout::PUBKEY), self.key.public(), false);
        for (k, v) in &self.cfg.labels {
            put(ObservedKey::new(node, &format!("label/{k}")), v.clone(), false);
        }
        for (r, amount) in &self.cfg.resources {
            put(ObservedKey::new(node, &format!("resource/{r}")), amount.to_string(), false);
        }
        put(ObservedKey::new(node, "alive"), lease.to_string(), true);
        if let Some(why) = &self.view_error {
            put(ObservedKey::new(node, "view_error"), why.clone(), true);
        }
        // Only instances placed here: one that moved away is the new node's to report.
        let placed = |name: &String| self.wanted.as_ref().is_some_and(|w| w.contains_key(name));
        for (name, inst) in self.instances.iter().filter(|(name, _)| placed(name)) {
            // Only what the contract lets this state carry (crate::keys).
            let allowed = crate::keys::reported_fields(inst.phase.name()).unwrap_or(&[]);
            let mut field = |f: &str, v: String| {
                debug_assert!(allowed.contains(&f), "{f} is not reported in state {}", inst.phase.name());
                if allowed.contains(&f) {
                    put(ObservedKey::instance(node, name, f), v, true)
                }
            };
            field("service", inst.service.clone());
            field("state", inst.phase.name().into());
            if let Some(image) = &inst.image {
                field("image", image.clone());
            }
            field("restarts", inst.restarts.to_string());
            match &inst.phase {
                Phase::Crashed { exit, .. } => field("reason", exit.clone()),
                Phase::Failed(why) | Phase::Waiting(Some(why)) => field("reason", why.clone()),
                _ => {}
            }
            // The template version its process runs — or, crashed or
            // failed, the one it last tried (a crash loop of a new template
            // is that template's, and stalls its rollout).
            let tried = matches!(inst.phase, Phase::Crashed { .. } | Phase::Failed(_));
            if let (Some(v), true) = (inst.version, inst.proc.is_some() || tried) {
                field("version", v.to_string());
            }
            if inst.proc.is_some() {
                field("ip", self.cfg.address.clone());
                field("port", inst.port.to_string());
            }
            let health = match inst.probes.get("readiness") {
                None => "none",
                Some(ProbeRun { healthy: None, .. }) => "unknown",
                Some(ProbeRun { healthy: Some(true), .. }) => "healthy",
                Some(ProbeRun { healthy: Some(false), .. }) => "unhealthy",
            };
            field("health", health.into());
            for (p, run) in &inst.probes {
                if let Some(h) = run.healthy {
                    put(ObservedKey::probe(node, name, p), if h { "healthy" } else { "unhealthy" }.into(), true);
                }
            }
        }
        // What the instances use, per service (crate::usage); with the lease.
        for (service, (cpu, mem)) in self.usage.figures() {
            put(ObservedKey::new(node, &format!("usage/{service}/cpu")), cpu.to_string(), true);
            put(ObservedKey::new(node, &format!("usage/{service}/memory")), mem.to_string(), true);
        }
        // Persistent volumes outlive the agent; they are reported without the lease.
        if let Some(wanted) = &self.wanted {
            let sizes: BTreeMap<&str, Option<i64>> =
                wanted.values().flat_map(|s| s.volumes.iter().filter(|(_, v)| v.persistent).map(|(n, v)| (n.as_str(), v.size_gib))).collect();
            for v in &self.volumes {
                let size = sizes.get(v.as_str()).copied().flatten().map_or_else(String::new, |s| s.to_string());
                put(ObservedKey::volume(node, v, "size"), size, false);
            }
        }
        out
    }

    /// Writes what changed since the last write (every key is this node's own).
    async fn publish(&mut self) {
        let Some(lease) = self.conn.as_ref().map(|c| c.lease) else { return };
        let want = self.observed(lease);
        let mut conn = self.conn.take().expect("connected");
        let puts: Vec<(&ObservedKey, &Fact)> = want.iter().filter(|(k, f)| self.written.get(*k) != Some(*f)).collect();
        let deletes: Vec<ObservedKey> = self.written.keys().filter(|k| !want.contains_key(*k)).cloned().collect();
        // Puts and deletes together: one revision per TXN_OPS changes, not
        // one for the puts and another for the deletes.
        let changes: Vec<(&ObservedKey, Option<&Fact>)> = puts.iter().map(|(k, f)| (*k, Some(*f))).chain(deletes.iter().map(|k| (k, None))).collect();
        let result: Result<(), etcd_client::Error> = async {
            for chunk in changes.chunks(TXN_OPS) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|(k, f)| match f {
                        Some(f) => TxnOp::put(k.as_str(), f.value.as_str(), f.leased.then(|| PutOptions::new().with_lease(lease))),
                        None => TxnOp::delete(k.as_str(), None),
                    })
                    .collect();
                conn.client.txn(Txn::new().and_then(ops)).await?;
                for (k, f) in chunk {
                    match f {
                        Some(f) => self.written.insert((*k).clone(), (*f).clone()),
                        None => self.written.remove(*k),
                    };
                }
            }
            Ok(())
        }
        .await;
        self.conn = Some(conn);
        if let Err(e) = result {
            self.lost(&format!("writing observed facts: {e}"));
        }
    }

    /// SIGTERM: stop every instance (SIGKILL after the grace period), revoke
    /// the lease (etcd deletes `alive` and the instance facts), exit.
    async fn shutdown(mut self) -> Result<(), AgentError> {
        tracing::info!(instances = self.instances.len(), "stopping");
        let names: Vec<String> = self.instances.keys().cloned().collect();
        for n in &names {
            self.stop(n);
        }
        let deadline = Instant::now() + self.cfg.grace + Duration::from_secs(2);
        while self.instances.values().any(|i| i.proc.is_some()) && Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, self.events.1.recv()).await {
                Ok(Some(ev)) => self.on_event(ev),
                _ => break,
            }
        }
        for n in &names {
            self.state.remove_instance(n)?;
        }
        if let Some(mut conn) = self.conn.take() {
            match conn.client.lease_revoke(conn.lease).await {
                Ok(_) => tracing::info!(lease = conn.lease, "lease revoked"),
                Err(e) => tracing::warn!(error = %e, "cannot revoke the lease; it expires on its own"),
            }
        }
        self.state.set_lease(None)?;
        Ok(())
    }
}

/// The next watch response: Ok(true) on events, Ok(false) when the stream
/// ended; never resolves without a connection.
async fn watch_message(conn: &mut Option<Conn>) -> Result<bool, etcd_client::Error> {
    match conn {
        Some(c) => match c.watch.message().await? {
            Some(resp) if resp.canceled() => Ok(false),
            Some(_) => Ok(true),
            None => Ok(false),
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_that_is_not_a_reading_is_named_and_never_a_beat() {
        assert_eq!(clock_reading(b"1730000000"), Ok(1_730_000_000));
        assert_eq!(clock_reading(b"0"), Ok(0));
        assert_eq!(clock_reading(b"-5"), Err("-5".into()));
        assert_eq!(clock_reading(b" 12"), Err(" 12".into()));
        assert_eq!(clock_reading(b"99999999999999999999"), Err("99999999999999999999".into()));
        assert_eq!(clock_reading(b"\xff\xfe"), Err("\u{fffd}\u{fffd}".into()));
        assert_eq!(clock_reading("x".repeat(1000).as_bytes()).unwrap_err().len(), 64);
    }

    #[test]
    fn crash_backoff_doubles_and_caps() {
        assert_eq!(crash_backoff(1), Duration::from_millis(500));
        assert_eq!(crash_backoff(2), Duration::from_secs(1));
        assert_eq!(crash_backoff(3), Duration::from_secs(2));
        assert_eq!(crash_backoff(50), Duration::from_secs(16));
    }
}
