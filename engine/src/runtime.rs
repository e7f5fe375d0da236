//! The engine's threads: timely workers that own the dataflow, driven over
//! channels. Callers talk to [`Engine`]; nothing of timely leaks out.

pub use crate::cluster::Cluster;
use crate::dataflow::{self, Coll, QueryTrace};
use crate::plan::{self, RulePlan, Step};
use crate::temporal;
use crate::value::{Row, Value};
use ccattler_parser::program::{Program, RelId};
use differential_dataflow::input::{Input, InputSession};
use differential_dataflow::trace::cursor::{cursor_list, Cursor};
use differential_dataflow::trace::TraceReader;
use differential_dataflow::AsCollection as _;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use timely::dataflow::operators::probe::{Handle as Probe, Probe as _};
use timely::dataflow::operators::Exchange as _;
use timely::progress::frontier::Antichain;

/// A change to one relation: +1 inserts a tuple, -1 removes it.
pub type Change = (RelId, Row, isize);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("revision {rev} is not after the last applied revision {last}")]
    RevisionOrder { rev: u64, last: u64 },
    #[error("relation {0} is not an input")]
    NotInput(RelId),
    #[error("tuple for `{relation}` has {found} values, expected {expected}")]
    Arity { relation: String, expected: usize, found: usize },
    #[error("the engine's workers stopped: {0}")]
    Stopped(String),
    #[error("cluster: {0}")]
    Cluster(String),
}

enum Cmd {
    /// Enter changes at a revision still open (more may follow before an
    /// `Apply` closes it) and start working on them while the caller prepares
    /// the next ones.
    Stage {
        at: u64,
        changes: Vec<Change>,
        /// The input relations changed (told to every worker).
        touched: Vec<RelId>,
    },
    /// Enter each batch of changes at its revision and run until every output
    /// is complete at the last one.
    Apply {
        batches: Vec<(u64, Vec<Change>)>,
        /// The input relations changed (told to every worker).
        touched: Vec<RelId>,
        /// Gates ([`Layout::gates`]) closed for this revision: (group,
        /// relation) pairs whose changes wait ([`Group::pending`]).
        closed: Vec<(usize, RelId)>,
    },
    /// Read a relation's tuples that start with `prefix` (all of them when
    /// it is empty) as of a revision: a seek in the arrangement. Each worker
    /// answers with its share.
    Read {
        rel: RelId,
        prefix: Row,
        as_of: u64,
        reply: Answer,
    },
    /// Keep the traces readable as of `rev` (compaction stops there) until
    /// the matching `Unpin`.
    Pin {
        rev: u64,
    },
    Unpin {
        rev: u64,
    },
    /// Return (the engine is dropped; readers may still hold senders).
    Stop,
}

/// What a worker reports while it runs an `Apply`: output diffs as they are
/// produced (not consolidated; together they are the revision's), then done.
enum Report {
    Part(Vec<Change>),
    Done { rev: u64 },
}

/// Output rows a worker gathers before it hands them on as a part.
const PART_ROWS: usize = 16 * 1024;

/// Turns transparent huge pages off for this process (Linux; elsewhere
/// nothing). mimalloc asks for huge pages for its arenas, and the kernel
/// then zeroes 2 MiB at each first touch, again after every purge: a fifth
/// of the offline placement benchmark's time (20.9 s against 16.2 s without).
/// Binaries call it first thing in `main`.
pub fn disable_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_THP_DISABLE only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// The default number of workers: one per core. On 2 cores, two workers
/// loaded the benchmark cluster 1.7x as fast as one and answered a single
/// change sooner too (each runs every operator on half the data).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A running engine: the compiled program on `workers` timely threads.
///
/// Reads are consistent "as of" a revision: [`Engine::snapshot`] pins the
/// last applied revision, and the [`Snapshot`] it returns reads the derived
/// relations as they were then from any thread, while the engine goes on
/// applying later revisions (the traces are not compacted past a pinned
/// revision until the snapshot is dropped).
pub struct Engine {
    program: Arc<Program>,
    senders: Vec<Sender<Cmd>>,
    reports: Receiver<Report>,
    guards: Option<timely::communication::WorkerGuards<()>>,
    /// The workers' barrier and flags (poisoned once a worker panicked).
    shared: Arc<Shared>,
    last_rev: u64,
    /// The revision changes were staged at, if any are waiting for an `apply`.
    staged: Option<u64>,
}

impl Engine {
    /// Compiles `program` and starts `workers` worker threads.
    pub fn start(program: Arc<Program>, workers: usize) -> Result<Engine, EngineError> {
        let workers = workers.max(1);
        let config = if workers == 1 { timely::Config::thread() } else { timely::Config::process(workers) };
        Engine::launch(program, Topology::Process(config), workers)
    }

    /// Starts this process's part of an engine that runs as a timely cluster
    /// of several processes: the first process (`cluster.process == 0`),
    /// whose first worker takes the commands and passes them on. Blocks until
    /// every process of the cluster has connected; the others run
    /// [`serve`].
    pub fn start_cluster(program: Arc<Program>, cluster: &Cluster) -> Result<Engine, EngineError> {
        cluster.check()?;
        if cluster.process != 0 {
            return Err(EngineError::Cluster(format!("process {} serves the cluster; only process 0 takes commands", cluster.process)));
        }
        Engine::launch(program, Topology::Cluster(cluster), cluster.workers)
    }

    fn launch(program: Arc<Program>, topology: Topology<'_>, workers: usize) -> Result<Engine, EngineError> {
        let cluster = matches!(topology, Topology::Cluster(_));
        // Who takes commands from the engine's channels: every worker of one
        // process, or a cluster's first worker alone.
        let leads = if cluster { 1 } else { workers };
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..leads {
            let (s, r) = channel();
            senders.push(s);
            receivers.push(Some(r));
        }
        let receivers = Arc::new(Mutex::new(receivers));
        let (done_tx, reports) = channel();
        // One sender per worker, taken by it: a worker that stops drops its
        // own (timely may keep the thread, and this closure, alive).
        let done_txs: Arc<Mutex<Vec<Option<Sender<Report>>>>> = Arc::new(Mutex::new((0..leads).map(|_| Some(done_tx.clone())).collect()));
        drop(done_tx);
        let prog = program.clone();
        let shared = Arc::new(Shared::new(workers, Layout::of(&program, if cluster { dataflow::Split::One } else { split() }, hubs(), cluster)));
        let workers_shared = shared.clone();
        let work = move |worker: &mut timely::worker::Worker| {
            let rx = receivers.lock().expect("receiver list").get_mut(worker.index()).and_then(Option::take);
            let tx = done_txs.lock().expect("sender list").get_mut(worker.index()).and_then(Option::take);
            let role = match (rx, cluster) {
                (Some(rx), false) => Role::Alone(rx),
                (Some(rx), true) => Role::Lead(rx),
                // A cluster's other workers on this process follow the first.
                (None, true) => Role::Follow,
                (None, false) => return,
            };
            run_worker(worker, &prog, &workers_shared, role, tx);
        };
        let guards = match topology {
            Topology::Process(config) => timely::execute(config, work).map_err(EngineError::Stopped)?,
            Topology::Cluster(cluster) => cluster.execute(crate::cluster::fingerprint(&program), work)?,
        };
        Ok(Engine { program, senders, reports, guards: Some(guards), shared, last_rev: 0, staged: None })
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    pub fn last_revision(&self) -> u64 {
        self.last_rev
    }

    /// Applies input changes at revision `rev` (which must increase) and returns
    /// the consolidated changes of every output relation, complete as of `rev`.
    /// Each output row is prefixed with the id of the rule that derived it
    /// (`[rule, col…]`); a row two rules derive appears once per rule.
    pub fn apply(&mut self, rev: u64, changes: Vec<Change>) -> Result<Vec<Change>, EngineError> {
        self.apply_many(vec![(rev, changes)])
    }

    /// Like [`Engine::apply`] for several revisions at once (increasing): each
    /// batch enters at its own revision, but the workers run once, so a burst
    /// of revisions pays the per-revision cost of stepping the dataflow once.
    /// Returns the output changes of all of them together.
    pub fn apply_many(&mut self, batches: Vec<(u64, Vec<Change>)>) -> Result<Vec<Change>, EngineError> {
        let mut all = Vec::new();
        self.apply_streaming(batches, |part| all.extend(part))?;
        Ok(consolidate(all))
    }

    /// Like [`Engine::apply_many`], but hands the output changes to `part` in
    /// pieces while the workers still run, unconsolidated (a row may come and
    /// go, or come from several pieces): the caller can take them in while
    /// the evaluation goes on. Summed, they are `apply_many`'s result.
    pub fn apply_streaming(&mut self, batches: Vec<(u64, Vec<Change>)>, mut part: impl FnMut(Vec<Change>)) -> Result<(), EngineError> {
        let Some(&(rev, _)) = batches.last() else { return Ok(()) };
        // Revisions increase; the first may be the staged one, still open.
        let mut prev = self.latest();
        for (i, (r, _)) in batches.iter().enumerate() {
            let open = i == 0 && self.staged == Some(*r);
            if *r <= prev && !open {
                return Err(EngineError::RevisionOrder { rev: *r, last: prev });
            }
            prev = *r;
        }
        self.check(batches.iter().flat_map(|(_, c)| c))?;
        let empty: Vec<(u64, Vec<Change>)> = batches.iter().map(|(r, _)| (*r, Vec::new())).collect();
        let touched = touched(batches.iter().flat_map(|(_, c)| c));
        let closed = self.closed_gates(&batches);
        self.send_split(Cmd::Apply { batches, touched: touched.clone(), closed: closed.clone() }, || Cmd::Apply {
            batches: empty.clone(),
            touched: touched.clone(),
            closed: closed.clone(),
        })?;
        let mut running = self.senders.len();
        while running > 0 {
            match self.reports.recv().map_err(gone)? {
                Report::Part(diffs) => part(diffs),
                Report::Done { rev: done } => {
                    debug_assert_eq!(done, rev);
                    running -= 1;
                }
            }
        }
        self.last_rev = rev;
        self.staged = None;
        Ok(())
    }

    /// Enters changes at revision `rev` without closing it: the workers start
    /// on them (e.g. sorting them into arrangements) while the caller reads
    /// and decodes the next ones. A later `apply` at `rev` (or after it)
    /// closes the revision and returns the output changes of everything
    /// staged and applied. Loading a large snapshot page by page this way
    /// overlaps the engine's work with the read.
    pub fn stage(&mut self, rev: u64, changes: Vec<Change>) -> Result<(), EngineError> {
        if rev <= self.last_rev || self.staged.is_some_and(|s| rev < s) {
            return Err(EngineError::RevisionOrder { rev, last: self.latest() });
        }
        self.check(&changes)?;
        let touched = touched(&changes);
        self.send_split(Cmd::Stage { at: rev, changes, touched: touched.clone() }, || Cmd::Stage { at: rev, changes: Vec::new(), touched: touched.clone() })?;
        self.staged = Some(rev);
        Ok(())
    }

    /// The gates a batch leaves closed: where the group's temporal joins
    /// hold, together, the readings within which they would derive nothing
    /// new ([`temporal::Quiet`]) and at every revision of the batch the
    /// relation's one reading only moves within them. (The joins ran last
    /// when the previous `apply` did: it returned only once every worker
    /// was done.)
    fn closed_gates(&self, batches: &[(u64, Vec<Change>)]) -> Vec<(usize, RelId)> {
        let mut closed = Vec::new();
        for gate in &self.shared.layout.gates {
            let slots = self.shared.quiet[gate.group].lock().unwrap_or_else(|e| e.into_inner());
            let (joins, lo, hi) = slots
                .iter()
                .filter(|(rel, _)| *rel == gate.rel)
                .map(|(_, q)| q.readings())
                .fold((0, i64::MIN, i64::MAX), |(n, lo, hi), (l, h)| (n + 1, lo.max(l), hi.min(h)));
            if joins != gate.joins * self.shared.workers {
                continue;
            }
            let (mut touched, mut quiet) = (false, lo <= hi);
            for (_, changes) in batches {
                let mut net = 0;
                for (_, row, d) in changes.iter().filter(|(rel, _, _)| *rel == gate.rel) {
                    touched = true;
                    net += d;
                    quiet &= row[0].as_int().is_some_and(|c| lo <= c && c <= hi);
                }
                quiet &= net == 0;
            }
            if touched && quiet {
                closed.push((gate.group, gate.rel));
            }
        }
        closed
    }

    /// How many times worker 0 advanced a group, since the engine started:
    /// what a revision cost in dataflows stepped.
    pub fn groups_advanced(&self) -> u64 {
        self.shared.advances.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How many changes wait at gates ([`Layout::gates`]) after the last
    /// apply: a few per gate (the reading gone and the reading come),
    /// however long the gate stays closed.
    pub fn waiting_at_gates(&self) -> u64 {
        self.shared.waiting.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The revision staged at (still open), or else the last one applied.
    fn latest(&self) -> u64 {
        self.staged.unwrap_or(self.last_rev)
    }

    /// Sends `first` to worker 0, which feeds the inputs, and `rest()` to
    /// every other worker (which only steps along).
    fn send_split(&self, first: Cmd, rest: impl Fn() -> Cmd) -> Result<(), EngineError> {
        let mut first = Some(first);
        for s in &self.senders {
            s.send(first.take().unwrap_or_else(&rest)).map_err(gone)?;
        }
        Ok(())
    }

    /// Every change must be to an input relation, with its arity.
    fn check<'a>(&self, changes: impl IntoIterator<Item = &'a Change>) -> Result<(), EngineError> {
        for (rel, row, _) in changes {
            let r = self.program.relations.get(*rel).ok_or(EngineError::NotInput(*rel))?;
            if r.kind != ccattler_parser::ast::DeclKind::Input {
                return Err(EngineError::NotInput(*rel));
            }
            if row.len() != r.arity() {
                return Err(EngineError::Arity { relation: r.name.clone(), expected: r.arity(), found: row.len() });
            }
        }
        Ok(())
    }

    /// The current tuples of a derived relation, sorted. (Input relations are
    /// not kept for queries: ask whoever feeds the engine, e.g. the session.)
    pub fn query(&self, rel: RelId) -> Result<Vec<Row>, EngineError> {
        query(&self.senders, rel, u64::MAX)
    }

    /// The current tuples of a derived relation whose first columns equal
    /// `prefix`: a seek in its arrangement, not a scan.
    pub fn lookup(&self, rel: RelId, prefix: &[Value]) -> Result<Vec<Row>, EngineError> {
        lookup(&self.senders, rel, prefix, u64::MAX)
    }

    /// A read-only view of the derived relations as of the last applied
    /// revision, usable from another thread while this engine applies later
    /// revisions.
    pub fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let rev = self.last_rev;
        for s in &self.senders {
            s.send(Cmd::Pin { rev }).map_err(gone)?;
        }
        Ok(Snapshot { senders: self.senders.clone(), rev })
    }
}

/// Reads of derived relations: the engine's current state, or a snapshot's.
pub trait Reads {
    fn query(&self, rel: RelId) -> Result<Vec<Row>, EngineError>;
    fn lookup(&self, rel: RelId, prefix: &[Value]) -> Result<Vec<Row>, EngineError>;
}

impl Reads for Engine {
    fn query(&self, rel: RelId) -> Result<Vec<Row>, EngineError> {
        Engine::query(self, rel)
    }
    fn lookup(&self, rel: RelId, prefix: &[Value]) -> Result<Vec<Row>, EngineError> {
        Engine::lookup(self, rel, prefix)
    }
}

impl Reads for Snapshot {
    fn query(&self, rel: RelId) -> Result<Vec<Row>, EngineError> {
        Snapshot::query(self, rel)
    }
    fn lookup(&self, rel: RelId, prefix: &[Value]) -> Result<Vec<Row>, EngineError> {
        Snapshot::lookup(self, rel, prefix)
    }
}

/// The derived relations as of one revision ([`Engine::snapshot`]). Reads
/// wait while the workers run an evaluation; they fail once the engine is
/// dropped.
pub struct Snapshot {
    senders: Vec<Sender<Cmd>>,
    rev: u64,
}

impl Snapshot {
    pub fn revision(&self) -> u64 {
        self.rev
    }
    /// A derived relation's tuples as of the snapshot's revision, sorted.
    pub fn query(&self, rel: RelId) -> Result<Vec<Row>, EngineError> {
        query(&self.senders, rel, self.rev)
    }
    /// Its tuples whose first columns equal `prefix`, as of the revision.
    pub fn lookup(&self, rel: RelId, prefix: &[Value]) -> Result<Vec<Row>, EngineError> {
        lookup(&self.senders, rel, prefix, self.rev)
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        for s in &self.senders {
            let _ = s.send(Cmd::Unpin { rev: self.rev });
        }
    }
}

fn query(senders: &[Sender<Cmd>], rel: RelId, as_of: u64) -> Result<Vec<Row>, EngineError> {
    let mut rows = ask(senders, |reply| Cmd::Read { rel, prefix: Row::new(), as_of, reply: Answer::Here(reply) })?;
    rows.sort_by(|a, b| crate::value::cmp_rows(a, b));
    Ok(rows)
}

fn lookup(senders: &[Sender<Cmd>], rel: RelId, prefix: &[Value], as_of: u64) -> Result<Vec<Row>, EngineError> {
    ask(senders, |reply| Cmd::Read { rel, prefix: Row::from(prefix), as_of, reply: Answer::Here(reply) })
}

/// Sends a read to every worker and gathers their shares; a worker that
/// stopped before answering makes it an error, not a partial answer.
fn ask(senders: &[Sender<Cmd>], cmd: impl Fn(Sender<Vec<Row>>) -> Cmd) -> Result<Vec<Row>, EngineError> {
    let (tx, rx) = channel();
    for s in senders {
        s.send(cmd(tx.clone())).map_err(gone)?;
    }
    drop(tx);
    let shares: Vec<Vec<Row>> = rx.iter().collect();
    if shares.len() < senders.len() {
        return Err(gone(()));
    }
    Ok(shares.into_iter().flatten().collect())
}

impl Drop for Engine {
    fn drop(&mut self) {
        // An explicit stop: a snapshot may still hold senders, so the
        // channels need not close.
        for s in &self.senders {
            let _ = s.send(Cmd::Stop);
        }
        self.senders.clear();
        if let Some(g) = self.guards.take() {
            if self.shared.is_poisoned() {
                // A worker panicked: the others stopped, but timely keeps
                // their threads until every dataflow completes, which a dead
                // peer never lets happen. Joining would wait for ever.
                std::mem::forget(g);
            } else {
                drop(g); // joins the worker threads
            }
        }
    }
}

/// A worker's channel closed: it stopped.
fn gone<E>(_: E) -> EngineError {
    EngineError::Stopped("worker gone".into())
}

/// Sums diffs per (relation, row), drops zeros, sorts.
pub fn consolidate(mut changes: Vec<Change>) -> Vec<Change> {
    changes.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut out: Vec<Change> = Vec::with_capacity(changes.len());
    for (rel, row, d) in changes {
        match out.last_mut() {
            Some(last) if last.0 == rel && last.1 == row => last.2 += d,
            _ => out.push((rel, row, d)),
        }
    }
    out.retain(|c| c.2 != 0);
    out
}

/// Output rows (relation, `[rule, col…]`, time, diff) a worker has seen and not yet reported.
type OutputBuffer = RefCell<Vec<(RelId, Row, u64, isize)>>;

/// Steps a worker takes on staged changes before it looks for more.
const STAGE_STEPS: usize = 32;

/// A test hook: `CCATTLER_INJECT_WORKER_PANIC=R` makes the last worker
/// panic when it applies revision R or later (to test fail-fast).
fn injected_panic_at() -> Option<u64> {
    std::env::var("CCATTLER_INJECT_WORKER_PANIC").ok()?.parse().ok()
}

/// How the program is cut into dataflows: by stratum unless
/// `CCATTLER_ENGINE_SPLIT` says `parts` (one per independent part) or `one`
/// (a single dataflow, as before either split: the benches' baselines;
/// `CCATTLER_ENGINE_ONE_DATAFLOW=1` is `one`).
fn split() -> dataflow::Split {
    if std::env::var_os("CCATTLER_ENGINE_ONE_DATAFLOW").is_some_and(|v| v == "1") {
        return dataflow::Split::One;
    }
    let named = std::env::var("CCATTLER_ENGINE_SPLIT").ok();
    split_named(named.as_deref()).unwrap_or_else(|why| {
        tracing::warn!("{why}; cutting by stratum");
        dataflow::Split::Strata
    })
}

/// `CCATTLER_ENGINE_SPLIT`'s value as a split (unset: by stratum).
fn split_named(name: Option<&str>) -> Result<dataflow::Split, String> {
    match name {
        None | Some("strata") => Ok(dataflow::Split::Strata),
        Some("parts") => Ok(dataflow::Split::Parts),
        Some("one") => Ok(dataflow::Split::One),
        Some(other) => Err(format!("CCATTLER_ENGINE_SPLIT={other:?} is not strata, parts or one")),
    }
}

/// Whether lookups several groups make share one arrangement in a hub
/// (`CCATTLER_ENGINE_HUBS=off` arranges them in every group, for comparing).
fn hubs() -> bool {
    let named = std::env::var("CCATTLER_ENGINE_HUBS").ok();
    hubs_named(named.as_deref()).unwrap_or_else(|why| {
        tracing::warn!("{why}; sharing lookups in hubs");
        true
    })
}

/// `CCATTLER_ENGINE_HUBS`'s value (unset: on).
fn hubs_named(name: Option<&str>) -> Result<bool, String> {
    match name {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(format!("CCATTLER_ENGINE_HUBS={other:?} is not on or off")),
    }
}

/// The program cut into groups ([`dataflow::groups`]), worked out once for
/// every worker.
struct Layout {
    /// Each group's derived relations, in dependency order.
    derived: Vec<std::collections::BTreeSet<RelId>>,
    /// Each group's inputs: the relations its rules read outside it.
    reads: Vec<Vec<RelId>>,
    /// Which groups read each relation (an input, or one a group before derives).
    readers: BTreeMap<RelId, Vec<usize>>,
    /// The lookups each group imports from a hub, not arranging its own.
    imports: Vec<Vec<dataflow::Lookup>>,
    /// Per relation with a hub, the lookups the hub arranges.
    hubs: BTreeMap<RelId, Vec<dataflow::Lookup>>,
    /// Input relations of one column that a group reads only through
    /// temporal joins ([`temporal`]): a change that only moves the one
    /// reading within what they are all quiet for waits, not advancing the
    /// group, until the group is advanced for something else or a reading
    /// leaves that range (a clock tick reaches no rule it changes nothing
    /// for). Not in a cluster of processes, whose groups all move together.
    gates: Vec<Gate>,
}

/// A group's input that reaches it only when it matters ([`Layout::gates`]).
struct Gate {
    group: usize,
    rel: RelId,
    /// The temporal joins of it in the group (on each worker).
    joins: usize,
}

/// The gates of a layout: for each group, each input relation of one
/// column every rule of it reading it reads through a temporal join.
fn gates(program: &Program, plans: &[Rc<RulePlan>], derived: &[std::collections::BTreeSet<RelId>], reads: &[Vec<RelId>]) -> Vec<Gate> {
    let recursive: std::collections::BTreeSet<usize> = program.strata.iter().filter(|s| s.recursive).flat_map(|s| s.rules.iter().copied()).collect();
    let mut gates = Vec::new();
    for (group, (d, rs)) in derived.iter().zip(reads).enumerate() {
        for &rel in rs {
            let r = &program.relations[rel];
            if r.kind != ccattler_parser::ast::DeclKind::Input || r.arity() != 1 {
                continue;
            }
            if d.iter().any(|h| program.relations[*h].builtin.as_ref().is_some_and(|b| b.reads().contains(&rel))) {
                continue;
            }
            let mut joins = 0;
            let mut only_temporal = true;
            for p in plans.iter().filter(|p| d.contains(&p.head)) {
                let reading = p.steps.iter().filter(|s| matches!(s, Step::Join { rel: x, .. } | Step::AntiJoin { rel: x, .. } if *x == rel)).count();
                if reading == 0 {
                    continue;
                }
                let temporal = temporal::find(p, |x| program.relations[x].arity()).is_some_and(|(_, t)| t.rel == rel);
                if reading == 1 && temporal && !recursive.contains(&p.rule) {
                    joins += 1;
                } else {
                    only_temporal = false;
                }
            }
            if only_temporal && joins > 0 {
                gates.push(Gate { group, rel, joins });
            }
        }
    }
    gates
}

impl Layout {
    /// The layout of `program` cut by `split`, with lookups several groups
    /// make shared in hubs if `hubs`.
    fn of(program: &Program, split: dataflow::Split, hubs: bool, cluster: bool) -> Layout {
        let plans: Vec<Rc<RulePlan>> = plan::plan(program).into_iter().map(Rc::new).collect();
        let derived = dataflow::groups(program, &plans, split);
        let reads: Vec<Vec<RelId>> = derived.iter().map(|d| dataflow::reads(program, &plans, d).into_iter().filter(|r| !d.contains(r)).collect()).collect();
        let mut readers: BTreeMap<RelId, Vec<usize>> = BTreeMap::new();
        for (g, rels) in reads.iter().enumerate() {
            for &r in rels {
                readers.entry(r).or_default().push(g);
            }
        }
        // A lookup two or more groups make is arranged once, in its
        // relation's hub, and imported by each.
        let lookups = dataflow::lookups(program, &plans, &derived);
        let mut users: BTreeMap<&dataflow::Lookup, usize> = BTreeMap::new();
        for l in lookups.iter().flatten() {
            *users.entry(l).or_default() += 1;
        }
        let shared = |l: &dataflow::Lookup| hubs && users[l] >= 2;
        let imports: Vec<Vec<dataflow::Lookup>> = lookups.iter().map(|ls| ls.iter().filter(|l| shared(l)).cloned().collect()).collect();
        let mut by_rel: BTreeMap<RelId, Vec<dataflow::Lookup>> = BTreeMap::new();
        for l in users.keys().filter(|l| shared(l)) {
            by_rel.entry(l.rel()).or_default().push((*l).clone());
        }
        let gates = if cluster { Vec::new() } else { gates(program, &plans, &derived, &reads) };
        Layout { derived, reads, readers, imports, hubs: by_rel, gates }
    }
}

/// What the workers share: a barrier, per group the last revision at which
/// some worker fed it rows (every worker advances a group together), and
/// whether a worker panicked (the others then stop instead of waiting for
/// it for ever, and `apply` fails).
struct Shared {
    layout: Layout,
    /// Workers arrived at the barrier, and its generation.
    barrier: Mutex<(usize, u64)>,
    arrived: std::sync::Condvar,
    workers: usize,
    poisoned: std::sync::atomic::AtomicBool,
    fed_at: Vec<std::sync::atomic::AtomicU64>,
    /// Per group, its temporal joins on every worker: each one's relation
    /// and what it is quiet for ([`Layout::gates`]).
    quiet: Vec<Mutex<Vec<(RelId, Arc<temporal::Quiet>)>>>,
    /// Groups advanced by worker 0 ([`Engine::groups_advanced`]).
    advances: std::sync::atomic::AtomicU64,
    /// Changes waiting at gates on worker 0 after its last apply
    /// ([`Engine::waiting_at_gates`]).
    waiting: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn new(workers: usize, layout: Layout) -> Shared {
        Shared {
            fed_at: (0..layout.derived.len()).map(|_| Default::default()).collect(),
            quiet: (0..layout.derived.len()).map(|_| Default::default()).collect(),
            advances: Default::default(),
            waiting: Default::default(),
            layout,
            barrier: Mutex::new((0, 0)),
            arrived: std::sync::Condvar::new(),
            workers,
            poisoned: Default::default(),
        }
    }

    /// Waits until every worker has arrived; false if a worker panicked.
    fn wait(&self) -> bool {
        let mut state = self.barrier.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_poisoned() {
            return false;
        }
        state.0 += 1;
        if state.0 == self.workers {
            *state = (0, state.1 + 1);
            self.arrived.notify_all();
            return true;
        }
        let generation = state.1;
        while state.1 == generation && !self.is_poisoned() {
            state = self.arrived.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        !self.is_poisoned()
    }

    fn poison(&self) {
        self.poisoned.store(true, std::sync::atomic::Ordering::SeqCst);
        let _state = self.barrier.lock().unwrap_or_else(|e| e.into_inner());
        self.arrived.notify_all();
    }

    fn is_poisoned(&self) -> bool {
        self.poisoned.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Marks the workers' shared state poisoned when its worker unwinds.
struct PoisonOnPanic<'a>(&'a Shared);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison();
        }
    }
}

/// Where an engine's workers run: threads of this process, or this
/// process's part of a cluster.
enum Topology<'a> {
    Process(timely::Config),
    Cluster(&'a Cluster),
}

/// A worker's place: alone among the threads of one process, or in a
/// cluster of processes the first (taking the engine's commands) or one
/// of the others (following it).
enum Role {
    Alone(Receiver<Cmd>),
    Lead(Receiver<Cmd>),
    Follow,
}

/// Where a read's answer goes.
enum Answer {
    /// Straight back to the caller (one process: each worker its share).
    Here(Sender<Vec<Row>>),
    /// To the caller, once every worker of the cluster sent its share to the
    /// first worker (read `id`).
    Gather(Sender<Vec<Row>>, u64),
    /// To the cluster's first worker, as the share of its read `id`.
    Relay(u64),
}

/// A command as the cluster's first worker passes it on to the others:
/// without the input changes (it feeds them alone; the dataflow spreads
/// them) and without channels.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
enum Wire {
    Stage { at: u64, touched: Vec<RelId> },
    Apply { revs: Vec<u64>, touched: Vec<RelId> },
    Read { id: u64, rel: RelId, prefix: Row, as_of: u64 },
    Pin { rev: u64 },
    Unpin { rev: u64 },
    Stop,
}

/// What a command source had.
enum Next {
    Cmd(Cmd),
    /// Nothing yet (asked not to wait).
    Empty,
    /// The source is gone: the worker stops.
    Closed,
}

/// Where a worker's commands come from.
enum Source {
    /// The engine's channel: every worker of a one-process engine.
    Channel(Receiver<Cmd>),
    /// The engine's channel, each command passed on to every other worker
    /// first: a cluster's first worker.
    Lead(Receiver<Cmd>, Relay),
    /// The commands the cluster's first worker passed on.
    Follow(Relay),
}

impl Source {
    /// The next command; with `wait`, blocks (stepping the dataflows, for a
    /// follower) until there is one.
    fn next(&mut self, worker: &mut timely::worker::Worker, shared: &Shared, wait: bool) -> Next {
        let (rx, relay) = match self {
            Source::Channel(rx) => return take(rx, wait),
            Source::Lead(rx, relay) => (rx, relay),
            Source::Follow(relay) => return relay.take(worker, shared, wait),
        };
        match take(rx, wait) {
            Next::Cmd(cmd) => Next::Cmd(relay.pass_on(cmd)),
            Next::Empty => Next::Empty,
            Next::Closed => {
                relay.send(Wire::Stop);
                Next::Closed
            }
        }
    }

    fn relay(&mut self) -> &mut Relay {
        match self {
            Source::Lead(_, relay) | Source::Follow(relay) => relay,
            Source::Channel(_) => unreachable!("only a cluster's workers gather and relay reads"),
        }
    }
}

fn take(rx: &Receiver<Cmd>, wait: bool) -> Next {
    use std::sync::mpsc::TryRecvError;
    if wait {
        return rx.recv().map_or(Next::Closed, Next::Cmd);
    }
    match rx.try_recv() {
        Ok(cmd) => Next::Cmd(cmd),
        Err(TryRecvError::Empty) => Next::Empty,
        Err(TryRecvError::Disconnected) => Next::Closed,
    }
}

/// How long a waiting worker of a cluster parks between looks at its
/// inbox (messages from other processes wake it sooner).
const PARK: std::time::Duration = std::time::Duration::from_millis(20);

/// A cluster's own channels, over timely's communication: commands from
/// the first worker to every other, numbered (taken in that order), and
/// the shares of reads back to the first worker.
struct Relay {
    commands: timely::dataflow::operators::vec::input::Handle<u64, (u64, u64, Wire)>,
    inbox: Rc<RefCell<BTreeMap<u64, Wire>>>,
    /// The next command's number: to send (first worker) or to take.
    seq: u64,
    shares: timely::dataflow::operators::vec::input::Handle<u64, (u64, Vec<Row>)>,
    /// Per read, the rows gathered and how many workers sent theirs.
    gathered: Rc<RefCell<BTreeMap<u64, (Vec<Row>, usize)>>>,
    peers: usize,
}

impl Relay {
    fn build(worker: &mut timely::worker::Worker) -> Relay {
        use timely::dataflow::operators::{vec::Input as _, Exchange as _, Inspect as _};
        let inbox: Rc<RefCell<BTreeMap<u64, Wire>>> = Default::default();
        let gathered: Rc<RefCell<BTreeMap<u64, (Vec<Row>, usize)>>> = Default::default();
        let (into, from) = (inbox.clone(), gathered.clone());
        let (commands, shares) = worker.dataflow::<u64, _, _>(move |scope| {
            let (commands, stream) = scope.new_input::<(u64, u64, Wire)>();
            stream.exchange(|(to, _, _)| *to).inspect(move |(_, seq, wire)| {
                into.borrow_mut().insert(*seq, wire.clone());
            });
            let (shares, stream) = scope.new_input::<(u64, Vec<Row>)>();
            stream.exchange(|_| 0).inspect(move |(id, rows)| {
                let mut gathered = from.borrow_mut();
                let entry = gathered.entry(*id).or_default();
                entry.0.extend(rows.iter().cloned());
                entry.1 += 1;
            });
            (commands, shares)
        });
        Relay { commands, inbox, seq: 0, shares, gathered, peers: worker.peers() }
    }

    /// Sends a command to every other worker (the first worker's part).
    fn send(&mut self, wire: Wire) {
        for to in 1..self.peers as u64 {
            self.commands.send((to, self.seq, wire.clone()));
        }
        // Closing the time is what wakes the operators downstream (a flush
        // alone leaves the rows queued until something else runs them).
        self.seq += 1;
        self.commands.advance_to(self.seq);
    }

    /// Passes a command from the engine's channel on to the other workers
    /// and returns it as the first worker runs it.
    fn pass_on(&mut self, cmd: Cmd) -> Cmd {
        let wire = match &cmd {
            Cmd::Stage { at, touched, .. } => Wire::Stage { at: *at, touched: touched.clone() },
            Cmd::Apply { batches, touched, .. } => Wire::Apply { revs: batches.iter().map(|(rev, _)| *rev).collect(), touched: touched.clone() },
            Cmd::Read { rel, prefix, as_of, .. } => Wire::Read { id: self.seq, rel: *rel, prefix: prefix.clone(), as_of: *as_of },
            Cmd::Pin { rev } => Wire::Pin { rev: *rev },
            Cmd::Unpin { rev } => Wire::Unpin { rev: *rev },
            Cmd::Stop => Wire::Stop,
        };
        let id = self.seq;
        self.send(wire);
        match cmd {
            Cmd::Read { rel, prefix, as_of, reply: Answer::Here(reply) } => Cmd::Read { rel, prefix, as_of, reply: Answer::Gather(reply, id) },
            cmd => cmd,
        }
    }

    /// The next command the first worker passed on (a follower's part).
    fn take(&mut self, worker: &mut timely::worker::Worker, shared: &Shared, wait: bool) -> Next {
        loop {
            if let Some(wire) = self.inbox.borrow_mut().remove(&self.seq) {
                self.seq += 1;
                return Next::Cmd(match wire {
                    Wire::Stage { at, touched } => Cmd::Stage { at, changes: Vec::new(), touched },
                    Wire::Apply { revs, touched } => {
                        Cmd::Apply { batches: revs.into_iter().map(|rev| (rev, Vec::new())).collect(), touched, closed: Vec::new() }
                    }
                    Wire::Read { id, rel, prefix, as_of } => Cmd::Read { rel, prefix, as_of, reply: Answer::Relay(id) },
                    Wire::Pin { rev } => Cmd::Pin { rev },
                    Wire::Unpin { rev } => Cmd::Unpin { rev },
                    Wire::Stop => Cmd::Stop,
                });
            }
            if !wait {
                return Next::Empty;
            }
            if shared.is_poisoned() {
                return Next::Closed;
            }
            worker.step_or_park(Some(PARK));
        }
    }

    /// Sends this worker's share of read `id` to the first worker.
    fn answer(&mut self, id: u64, rows: Vec<Row>) {
        self.shares.send((id, rows));
        let next = *self.shares.time() + 1;
        self.shares.advance_to(next);
    }

    /// The first worker's own share of read `id` with every other worker's,
    /// once all have come (None if a worker of this process panicked).
    fn gather(&mut self, worker: &mut timely::worker::Worker, shared: &Shared, id: u64, mut rows: Vec<Row>) -> Option<Vec<Row>> {
        loop {
            let complete = self.gathered.borrow().get(&id).map_or(self.peers == 1, |(_, n)| *n + 1 == self.peers);
            if complete {
                if let Some((theirs, _)) = self.gathered.borrow_mut().remove(&id) {
                    rows.extend(theirs);
                }
                return Some(rows);
            }
            if shared.is_poisoned() {
                return None;
            }
            worker.step_or_park(Some(PARK));
        }
    }
}

/// Runs this process's workers of a cluster whose process 0 runs the
/// [`Engine`] ([`Engine::start_cluster`]): they follow its commands until
/// it stops. Blocks until every process has connected and then until the
/// engine stops; an error if a worker panicked. The cluster is one failure
/// domain (timely's): a process that dies stops the computation, and its
/// supervisor restarts the group.
pub fn serve(program: Arc<Program>, cluster: &Cluster) -> Result<(), EngineError> {
    cluster.check()?;
    if cluster.process == 0 {
        return Err(EngineError::Cluster("process 0 runs the engine (Engine::start_cluster), not serve".into()));
    }
    let shared = Arc::new(Shared::new(cluster.workers, Layout::of(&program, dataflow::Split::One, hubs(), true)));
    let workers_shared = shared.clone();
    let guards = cluster.execute(crate::cluster::fingerprint(&program), move |worker| run_worker(worker, &program, &workers_shared, Role::Follow, None))?;
    let panicked = guards.join().into_iter().find_map(Result::err);
    match panicked {
        Some(why) => Err(EngineError::Stopped(why)),
        None if shared.is_poisoned() => Err(EngineError::Stopped("a worker panicked".into())),
        None => Ok(()),
    }
}

fn run_worker(worker: &mut timely::worker::Worker, program: &Program, shared: &Shared, role: Role, tx: Option<Sender<Report>>) {
    use std::sync::atomic::Ordering;
    let _poison = PoisonOnPanic(shared);
    let _tally = crate::arrangements::track(worker);
    let panic_at = injected_panic_at().filter(|_| worker.index() + 1 == worker.peers());
    let plans: Vec<Rc<RulePlan>> = plan::plan(program).into_iter().map(Rc::new).collect();
    let outputs: Rc<OutputBuffer> = Rc::new(RefCell::new(Vec::new()));
    // A cluster of processes: the first worker passes commands on over a
    // dataflow of their own (built first, on every worker alike), reads
    // are gathered to it, and so are output rows.
    let cluster = !matches!(role, Role::Alone(_));
    let mut source = match role {
        Role::Alone(rx) => Source::Channel(rx),
        Role::Lead(rx) => Source::Lead(rx, Relay::build(worker)),
        Role::Follow => Source::Follow(Relay::build(worker)),
    };
    // One dataflow per group of relations (a stratum, by default): a
    // revision advances only the groups rows reach, so the operators of a
    // group with nothing to do are not stepped at all.
    let mut groups: Vec<Group> = Vec::new();
    let mut traces: BTreeMap<RelId, QueryTrace> = BTreeMap::new();
    let Layout { derived: specs, reads: all_reads, readers, imports, hubs: hub_specs, .. } = &shared.layout;
    // Hubs first: a dataflow per relation whose lookups several groups
    // share, which those groups import.
    let mut hubs: BTreeMap<RelId, Hub> = BTreeMap::new();
    for (&rel, lookups) in hub_specs {
        let hub = worker.dataflow::<u64, _, _>(|scope| {
            let (input, coll) = scope.new_collection::<Row, isize>();
            let (mut joins, mut present) = (BTreeMap::new(), BTreeMap::new());
            for l in lookups {
                match dataflow::arrange_lookup(coll.clone(), l, &program.relations[rel]) {
                    dataflow::LookupArrangement::Join(arr) => {
                        joins.insert(l.clone(), arr.trace);
                    }
                    dataflow::LookupArrangement::Present(arr) => {
                        present.insert(l.clone(), arr.trace);
                    }
                }
            }
            Hub { input, joins, present, advanced: 0 }
        });
        hubs.insert(rel, hub);
    }
    for (g, derived) in specs.iter().enumerate() {
        let reads = &all_reads[g];
        // Rows of these relations go on to the groups that read them.
        let fed_on: std::collections::BTreeSet<RelId> = derived.iter().copied().filter(|r| readers.contains_key(r)).collect();
        let feed: Rc<OutputBuffer> = Rc::new(RefCell::new(Vec::new()));
        let probe = Probe::new();
        let (mut unit_input, inputs, group_traces) = worker.dataflow::<u64, _, _>(|scope| {
            let (unit_input, unit) = scope.new_collection::<Row, isize>();
            let mut inputs: BTreeMap<RelId, InputSession<u64, Row, isize>> = BTreeMap::new();
            let mut colls: BTreeMap<RelId, Coll<'_, u64>> = BTreeMap::new();
            for &rel in reads {
                let (input, coll) = scope.new_collection::<Row, isize>();
                inputs.insert(rel, input);
                colls.insert(rel, coll);
            }
            let mut imported = dataflow::Imported::none();
            for l in &imports[g] {
                let hub = hubs.get_mut(&l.rel()).expect("a hub for every import");
                let name = format!("Import {} from its hub", program.relations[l.rel()].name);
                let arrangement = match l {
                    dataflow::Lookup::Join(..) => dataflow::LookupArrangement::Join(hub.joins.get_mut(l).expect("the hub's").import_named(scope, &name)),
                    dataflow::Lookup::Present(..) => {
                        dataflow::LookupArrangement::Present(hub.present.get_mut(l).expect("the hub's").import_named(scope, &name))
                    }
                };
                imported.add(l, arrangement);
            }
            let built = dataflow::build(program, &plans, colls, unit, derived, imported);
            shared.quiet[g].lock().unwrap_or_else(|e| e.into_inner()).extend(built.quiet);
            // An input no operator reads (the group only looks its relation
            // up in a hub) is dropped: nothing would take what it is sent,
            // and timely's input keeps what no one takes, for ever.
            inputs.retain(|rel, _| built.read.contains(rel));
            for (rel, coll) in built.attributed {
                let coll = if cluster { coll.inner.exchange(|_| 0).as_collection() } else { coll };
                let buf = outputs.clone();
                coll.inspect_batch(move |_t, data| {
                    let mut b = buf.borrow_mut();
                    b.extend(data.iter().map(|(row, t, d)| (rel, row.clone(), *t, *d)));
                })
                .probe_with(&probe);
            }
            let mut traces = built.traces;
            for (rel, coll) in built.relations.into_iter().filter(|(rel, _)| derived.contains(rel)) {
                // (The probe comes after the inspect: it passes a revision
                // only once the rows to pass on have been taken.)
                let coll = if fed_on.contains(&rel) {
                    let buf = feed.clone();
                    coll.inspect_batch(move |_t, data| buf.borrow_mut().extend(data.iter().map(|(row, t, d)| (rel, row.clone(), *t, *d))))
                } else {
                    coll
                };
                if traces.contains_key(&rel) {
                    coll.probe_with(&probe);
                } else {
                    let arranged = dataflow::arrange_set(coll, &format!("Query {}", program.relations[rel].name));
                    arranged.stream.clone().probe_with(&probe);
                    traces.insert(rel, arranged.trace);
                }
            }
            (unit_input, inputs, traces)
        });
        if worker.index() == 0 {
            unit_input.insert(Row::new());
        }
        let rels = group_traces.keys().copied().collect();
        traces.extend(group_traces);
        // Every group runs once at the first revision (rules with no input).
        groups.push(Group { unit_input, inputs, probe, rels, feed, dirty: true, advanced: 0, pending: Vec::new() });
    }
    // A command that arrived while staged work was being done.
    let mut next: Option<Cmd> = None;
    // Revisions snapshots read at (with how many snapshots each): the traces
    // are compacted no further than the oldest.
    let mut pinned: BTreeMap<u64, usize> = BTreeMap::new();
    loop {
        let cmd = match next.take() {
            Some(cmd) => cmd,
            None => match source.next(worker, shared, true) {
                Next::Cmd(cmd) => cmd,
                Next::Empty | Next::Closed => return,
            },
        };
        match cmd {
            Cmd::Stage { at, changes, touched } => {
                mark(&mut groups, readers, &touched, &[]);
                // What waited goes in first.
                for group in groups.iter_mut().filter(|g| g.dirty) {
                    group.release(at);
                }
                feed(&mut groups, &mut hubs, readers, at, changes, &[]);
                for group in groups.iter_mut().filter(|g| g.dirty) {
                    for input in group.inputs.values_mut() {
                        input.flush();
                    }
                }
                for hub in hubs.values_mut() {
                    hub.input.flush();
                }
                // Work on it until the next command comes (or a few steps
                // have passed: what is left waits for the revision's close).
                for _ in 0..STAGE_STEPS {
                    match source.next(worker, shared, false) {
                        Next::Cmd(cmd) => {
                            next = Some(cmd);
                            break;
                        }
                        Next::Empty => {
                            worker.step();
                        }
                        Next::Closed => return,
                    }
                }
            }
            Cmd::Apply { batches, touched, closed } => {
                let Some(&(rev, _)) = batches.last() else { continue };
                let first = batches[0].0;
                mark(&mut groups, readers, &touched, &closed);
                if panic_at.is_some_and(|at| rev >= at) {
                    panic!("injected worker panic at revision {rev} (CCATTLER_INJECT_WORKER_PANIC)");
                }
                for (at, changes) in batches {
                    feed(&mut groups, &mut hubs, readers, at, changes, &closed);
                }
                // Output rows go out in parts as they come, so the caller
                // can take them in while the evaluation goes on.
                let mut reporting = true;
                let mut send_part = |outputs: &OutputBuffer| {
                    let part: Vec<Change> = std::mem::take(&mut *outputs.borrow_mut())
                        .into_iter()
                        .map(|(rel, row, t, d)| {
                            debug_assert!(t <= rev);
                            (rel, row, d)
                        })
                        .collect();
                    if let Some(tx) = tx.as_ref().filter(|_| reporting && !part.is_empty()) {
                        reporting = tx.send(Report::Part(part)).is_ok();
                    }
                };
                // Groups in order: one that some worker fed rows (or that
                // reads a changed input) moves to the next time, together
                // on every worker; the others keep their frontier (nothing
                // in them changed, so what they hold is what they would
                // hold at `rev`). In a cluster of processes every group moves
                // (which ones some worker fed is known only within a process),
                // so a cluster builds one group: a cut by stratum would pay a
                // round of progress messages between processes per stratum.
                for g in 0..groups.len() {
                    if !cluster && !groups[g].dirty && shared.fed_at[g].load(Ordering::Acquire) != rev {
                        continue;
                    }
                    // The hubs it imports move first (their rows at `rev`
                    // are all in: whoever derives them came before).
                    for l in &imports[g] {
                        hubs.get_mut(&l.rel()).expect("a hub for every import").advance(rev);
                    }
                    let group = &mut groups[g];
                    // Changes that waited at its gates go in with the rest:
                    // its temporal joins meet what comes with the reading as
                    // it is now.
                    group.release(first);
                    if worker.index() == 0 {
                        shared.advances.fetch_add(1, Ordering::Relaxed);
                    }
                    group.dirty = true;
                    group.unit_input.advance_to(rev + 1);
                    group.unit_input.flush();
                    for input in group.inputs.values_mut() {
                        input.advance_to(rev + 1);
                        input.flush();
                    }
                    while groups[g].probe.less_equal(&rev) {
                        // A peer that panicked never makes progress again.
                        if shared.is_poisoned() {
                            return;
                        }
                        worker.step();
                        if outputs.borrow().len() >= PART_ROWS {
                            send_part(&outputs);
                        }
                    }
                    // Taken, not drained: a drained buffer keeps the room
                    // its largest revision (a cold load) needed, for good.
                    let rows: Vec<(RelId, Row, u64, isize)> = std::mem::take(&mut *groups[g].feed.borrow_mut());
                    let mut fed = std::collections::BTreeSet::new();
                    for (rel, row, t, d) in rows {
                        let Some(gs) = readers.get(&rel) else { continue };
                        debug_assert!(gs.iter().all(|&reader| reader > g), "a group reads only groups before it");
                        enter(&mut groups, &mut hubs, gs, rel, row, t, d);
                        fed.extend(gs.iter().copied());
                    }
                    for reader in fed {
                        shared.fed_at[reader].store(rev, Ordering::Release);
                    }
                    // Every worker has passed this group on before any
                    // decides which group comes next.
                    if !cluster && !shared.wait() {
                        return;
                    }
                }
                let oldest = pinned.keys().next().copied().unwrap_or(rev).min(rev);
                for group in groups.iter_mut().filter(|g| g.dirty) {
                    group.dirty = false;
                    group.advanced = rev;
                    // A group's traces are compacted no further than the time
                    // it was last advanced to, and than the oldest pin.
                    let frontier = Antichain::from_elem(oldest.min(group.advanced));
                    for rel in &group.rels {
                        compact(traces.get_mut(rel).expect("a group's trace"), &frontier);
                    }
                }
                for hub in hubs.values_mut().filter(|h| h.advanced == rev) {
                    hub.compact(&Antichain::from_elem(oldest));
                }
                for group in &mut groups {
                    group.settle_pending(rev + 1);
                }
                if worker.index() == 0 {
                    shared.waiting.store(groups.iter().map(|g| g.pending.len() as u64).sum(), Ordering::Release);
                }
                send_part(&outputs);
                if let Some(tx) = &tx {
                    if !reporting || tx.send(Report::Done { rev }).is_err() {
                        return;
                    }
                }
            }
            Cmd::Read { rel, prefix, as_of, reply } => {
                let rows = traces.get_mut(&rel).map(|t| read_trace(t, &prefix, as_of)).unwrap_or_default();
                match reply {
                    Answer::Here(reply) => {
                        let _ = reply.send(rows);
                    }
                    Answer::Gather(reply, id) => {
                        let Some(all) = source.relay().gather(worker, shared, id, rows) else { return };
                        let _ = reply.send(all);
                    }
                    Answer::Relay(id) => source.relay().answer(id, rows),
                }
            }
            Cmd::Pin { rev } => *pinned.entry(rev).or_default() += 1,
            Cmd::Unpin { rev } => {
                if let Some(n) = pinned.get_mut(&rev) {
                    *n -= 1;
                    if *n == 0 {
                        pinned.remove(&rev);
                    }
                }
            }
            Cmd::Stop => return,
        }
    }
}

/// One group of the program ([`dataflow::groups`]): its own dataflow,
/// inputs and probe.
struct Group {
    unit_input: InputSession<u64, Row, isize>,
    /// Its inputs: the input relations it reads, and the relations of
    /// groups before it that it reads (fed their rows as they come).
    inputs: BTreeMap<RelId, InputSession<u64, Row, isize>>,
    probe: Probe<u64>,
    /// The relations whose query traces this group holds.
    rels: Vec<RelId>,
    /// Rows of its relations that later groups read, not yet passed on.
    feed: Rc<OutputBuffer>,
    /// Changes were fed since it last advanced: the next revision moves it.
    dirty: bool,
    /// The last revision it was advanced through.
    advanced: u64,
    /// Changes to inputs at its closed gates ([`Layout::gates`]), with their
    /// revisions: they go in when it next advances.
    pending: Vec<(RelId, u64, Row, isize)>,
}

impl Group {
    /// Enters what waited at its gates, at its revision or `from` if later
    /// (a revision it has not reached; those before changed nothing it
    /// derives).
    fn release(&mut self, from: u64) {
        for (rel, at, row, d) in std::mem::take(&mut self.pending) {
            self.inputs.get_mut(&rel).expect("a gate is on an input").update_at(row, at.max(from), d);
        }
    }

    /// Sums what waited at revisions before `first` (once a later apply
    /// comes, they all go in at its first revision, [`Group::release`]),
    /// so a gate closed for days holds one reading gone and one come, not
    /// every tick's.
    fn settle_pending(&mut self, first: u64) {
        if self.pending.iter().all(|(_, at, _, _)| *at >= first) {
            return;
        }
        let mut summed: BTreeMap<(RelId, Row), isize> = BTreeMap::new();
        let mut current = Vec::new();
        for (rel, at, row, d) in std::mem::take(&mut self.pending) {
            if at < first {
                *summed.entry((rel, row)).or_default() += d;
            } else {
                current.push((rel, at, row, d));
            }
        }
        self.pending = summed.into_iter().filter(|(_, d)| *d != 0).map(|((rel, row), d)| (rel, 0, row, d)).chain(current).collect();
    }
}

/// A relation's hub ([`Layout::hubs`]): a dataflow of its own, fed its rows
/// as its readers are, holding the arrangements several groups look up.
/// It moves to a revision when the first group importing it does.
struct Hub {
    input: InputSession<u64, Row, isize>,
    joins: BTreeMap<dataflow::Lookup, dataflow::JoinTrace>,
    present: BTreeMap<dataflow::Lookup, QueryTrace>,
    /// The last revision it was advanced through.
    advanced: u64,
}

impl Hub {
    /// Moves its input past `rev` (once per revision).
    fn advance(&mut self, rev: u64) {
        if self.advanced < rev {
            self.input.advance_to(rev + 1);
            self.input.flush();
            self.advanced = rev;
        }
    }

    /// Lets its arrangements forget history before `frontier`.
    fn compact(&mut self, frontier: &Antichain<u64>) {
        self.joins.values_mut().for_each(|t| compact(t, frontier));
        self.present.values_mut().for_each(|t| compact(t, frontier));
    }
}

/// Lets a trace forget history before `frontier`, logically and physically.
fn compact(trace: &mut impl TraceReader<Time = u64>, frontier: &Antichain<u64>) {
    trace.set_logical_compaction(frontier.borrow());
    trace.set_physical_compaction(frontier.borrow());
}

/// The input relations some change is to, sorted: every worker advances the
/// groups that read them (worker 0 alone is fed the changes, but all must
/// move a group's time together).
fn touched<'a>(changes: impl IntoIterator<Item = &'a Change>) -> Vec<RelId> {
    let set: std::collections::BTreeSet<RelId> = changes.into_iter().map(|(rel, _, _)| *rel).collect();
    set.into_iter().collect()
}

/// Marks the groups that read `touched` to be advanced at the next revision
/// (not where their gate of it is `closed`).
fn mark(groups: &mut [Group], readers: &BTreeMap<RelId, Vec<usize>>, touched: &[RelId], closed: &[(usize, RelId)]) {
    for rel in touched {
        for &g in readers.get(rel).into_iter().flatten() {
            if !closed.contains(&(g, *rel)) {
                groups[g].dirty = true;
            }
        }
    }
}

/// Enters input changes into the sessions of the groups that read them at
/// time `at` (not yet flushed); a group whose gate of the relation is
/// `closed` keeps them for later ([`Group::pending`]).
fn feed(
    groups: &mut [Group],
    hubs: &mut BTreeMap<RelId, Hub>,
    readers: &BTreeMap<RelId, Vec<usize>>,
    at: u64,
    changes: Vec<Change>,
    closed: &[(usize, RelId)],
) {
    for (rel, row, d) in changes {
        let Some(gs) = readers.get(&rel) else { continue };
        if !closed.iter().any(|(_, r)| *r == rel) {
            enter(groups, hubs, gs, rel, row, at, d);
            continue;
        }
        let mut open = Vec::with_capacity(gs.len());
        for &g in gs {
            if closed.contains(&(g, rel)) {
                groups[g].pending.push((rel, at, row.clone(), d));
            } else {
                open.push(g);
            }
        }
        enter(groups, hubs, &open, rel, row, at, d);
    }
}

/// Enters one row of `rel` into the input sessions of the groups `gs` (its
/// readers), and of its hub if it has one, at time `at`.
fn enter(groups: &mut [Group], hubs: &mut BTreeMap<RelId, Hub>, gs: &[usize], rel: RelId, row: Row, at: u64, d: isize) {
    if let Some(hub) = hubs.get_mut(&rel) {
        hub.input.update_at(row.clone(), at, d);
    }
    // (A reader that only looks `rel` up in its hub has no input of it.)
    let Some(last) = gs.iter().rposition(|&g| groups[g].inputs.contains_key(&rel)) else { return };
    for &g in &gs[..last] {
        if let Some(input) = groups[g].inputs.get_mut(&rel) {
            input.update_at(row.clone(), at, d);
        }
    }
    groups[gs[last]].inputs.get_mut(&rel).expect("found above").update_at(row, at, d);
}

/// Every row with a positive count as of revision `as_of` in a trace that
/// starts with `prefix` (rows are ordered, so that is a seek and a run).
/// Updates at later revisions are left out; the trace is not compacted past
/// a pinned `as_of`, so those are still told apart.
pub(crate) fn read_trace(trace: &mut QueryTrace, prefix: &[Value], as_of: u64) -> Vec<Row> {
    let mut upper = Antichain::new();
    trace.read_upper(&mut upper);
    let Some(batches) = trace.batches_through(upper.borrow()) else { return Vec::new() };
    let (mut cursor, storage) = cursor_list(batches);
    let mut rows = Vec::new();
    if !prefix.is_empty() {
        cursor.seek_key(&storage, crate::rows::RowRef(prefix));
    }
    while let Some(key) = cursor.get_key(&storage) {
        if !key.starts_with(prefix) {
            break;
        }
        let mut count = 0isize;
        cursor.map_times(&storage, |t, d| {
            if *t <= as_of {
                count += *d
            }
        });
        if count > 0 {
            rows.push(key.to_row());
        }
        cursor.step_key(&storage);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(workers: usize) -> (Engine, RelId, RelId) {
        let src = "input e(a: int, b: int) from \"e/{a}/{b}\"\noutput r(a: int, b: int) to \"r/{a}/{b}\"\nr(a, c) :- e(a, b), e(b, c).\n";
        let program = Arc::new(ccattler_parser::check_str("t.rules", src).program.unwrap());
        let (e, r) = (program.relation("e").unwrap(), program.relation("r").unwrap());
        (Engine::start(program, workers).unwrap(), e, r)
    }

    fn row(a: i64, b: i64) -> Row {
        smallvec::smallvec![Value::Int(a), Value::Int(b)]
    }

    #[test]
    fn a_snapshot_reads_as_of_its_revision_while_later_ones_apply() {
        for workers in [1, 2] {
            let (mut engine, e, r) = engine(workers);
            engine.apply(1, vec![(e, row(1, 2), 1), (e, row(2, 3), 1)]).unwrap();
            let snap = engine.snapshot().unwrap();
            // Later revisions add and remove derived rows…
            engine.apply(2, vec![(e, row(3, 4), 1)]).unwrap();
            engine.apply(3, vec![(e, row(1, 2), -1)]).unwrap();
            engine.apply(4, vec![(e, row(0, 2), 1)]).unwrap();
            assert_eq!(engine.query(r).unwrap(), vec![row(0, 3), row(2, 4)]);
            // …the snapshot still reads revision 1, from another thread too.
            let seen = std::thread::spawn(move || (snap.query(r).unwrap(), snap.lookup(r, &[Value::Int(1)]).unwrap())).join().unwrap();
            assert_eq!(seen, (vec![row(1, 3)], vec![row(1, 3)]), "{workers} worker(s)");
            // Unpinned: compaction catches up, reads stay right.
            engine.apply(5, vec![]).unwrap();
            assert_eq!(engine.query(r).unwrap(), vec![row(0, 3), row(2, 4)]);
        }
    }

    #[test]
    fn a_snapshot_of_a_dropped_engine_errors_instead_of_reading_nothing() {
        let (mut engine, e, r) = engine(2);
        engine.apply(1, vec![(e, row(1, 2), 1), (e, row(2, 3), 1)]).unwrap();
        let snap = engine.snapshot().unwrap();
        drop(engine);
        assert!(matches!(snap.query(r), Err(EngineError::Stopped(_))));
    }

    #[test]
    fn a_hubs_value_that_is_neither_on_nor_off_is_refused_and_named() {
        assert_eq!(hubs_named(None), Ok(true));
        assert_eq!(hubs_named(Some("on")), Ok(true));
        assert_eq!(hubs_named(Some("off")), Ok(false));
        for careless in ["Off", "off ", "", "0", "false", "no"] {
            let why = hubs_named(Some(careless)).unwrap_err();
            assert!(why.contains(&format!("{careless:?}")) && why.contains("on or off"), "{why}");
        }
    }

    #[test]
    fn a_split_name_that_is_none_of_the_three_is_refused_and_named() {
        assert_eq!(split_named(None), Ok(dataflow::Split::Strata));
        assert_eq!(split_named(Some("strata")), Ok(dataflow::Split::Strata));
        assert_eq!(split_named(Some("parts")), Ok(dataflow::Split::Parts));
        assert_eq!(split_named(Some("one")), Ok(dataflow::Split::One));
        for careless in ["Parts", "parts ", "", "stratum", "1"] {
            let why = split_named(Some(careless)).unwrap_err();
            assert!(why.contains(&format!("{careless:?}")) && why.contains("strata, parts or one"), "{why}");
        }
    }

    /// Two parts no rule connects: revisions that change only one leave the
    /// other where it was, and reads of it stay right at every revision.
    #[test]
    fn a_part_no_change_reaches_is_left_alone_and_still_reads_right() {
        let src = "input e(a: int, b: int) from \"e/{a}/{b}\"\ninput f(a: int, b: int) from \"f/{a}/{b}\"\n\
                   output r(a: int, b: int) to \"r/{a}/{b}\"\noutput q(a: int, b: int) to \"q/{a}/{b}\"\n\
                   r(a, c) :- e(a, b), e(b, c).\nq(a, b) :- f(a, b), not e(b, a).\nq(a, a) :- f(a, _).\n";
        let program = Arc::new(ccattler_parser::check_str("t.rules", src).program.unwrap());
        let plans: Vec<Rc<RulePlan>> = plan::plan(&program).into_iter().map(Rc::new).collect();
        // `q` reads `e` through the negation: one part. Without that rule, two.
        assert_eq!(dataflow::components(&program, &plans).iter().filter(|c| c.len() > 1).count(), 1);
        let src2 = "input e(a: int, b: int) from \"e/{a}/{b}\"\ninput f(a: int, b: int) from \"f/{a}/{b}\"\n\
                    output r(a: int, b: int) to \"r/{a}/{b}\"\noutput q(a: int, b: int) to \"q/{a}/{b}\"\n\
                    r(a, c) :- e(a, b), e(b, c).\nq(a, b) :- f(a, b), f(b, a).\n";
        let program = Arc::new(ccattler_parser::check_str("t.rules", src2).program.unwrap());
        let plans: Vec<Rc<RulePlan>> = plan::plan(&program).into_iter().map(Rc::new).collect();
        assert_eq!(dataflow::components(&program, &plans).iter().filter(|c| c.len() > 1).count(), 2);
        let [e, f, r, q] = ["e", "f", "r", "q"].map(|n| program.relation(n).unwrap());
        for workers in [1, 2] {
            let mut engine = Engine::start(program.clone(), workers).unwrap();
            let out = engine.apply(1, vec![(e, row(1, 2), 1), (e, row(2, 3), 1), (f, row(5, 6), 1), (f, row(6, 5), 1)]).unwrap();
            assert_eq!(out.len(), 3, "r(1,3), q(5,6), q(6,5) with their rule ids: {out:?}");
            let snap = engine.snapshot().unwrap();
            // Only `e` changes for a while: `q`'s part is not advanced…
            for rev in 2..40 {
                let out = engine.apply(rev, vec![(e, row(rev as i64, 1), 1)]).unwrap();
                assert!(out.iter().all(|(rel, _, _)| *rel == r), "{out:?}");
            }
            // …and still reads right, now and as of the snapshot.
            assert_eq!(engine.query(q).unwrap(), vec![row(5, 6), row(6, 5)]);
            engine.apply(40, vec![(f, row(6, 5), -1)]).unwrap();
            assert_eq!(engine.query(q).unwrap(), Vec::<Row>::new());
            assert_eq!(snap.query(q).unwrap(), vec![row(5, 6), row(6, 5)], "{workers} worker(s)");
            assert_eq!(snap.query(r).unwrap(), vec![row(1, 3)]);
            drop(snap);
            // Revisions with no changes at all advance nothing and answer.
            for rev in 41..45 {
                assert!(engine.apply(rev, vec![]).unwrap().is_empty());
            }
            let mut fresh = Engine::start(program.clone(), 1).unwrap();
            let all: Vec<Change> = [row(1, 2), row(2, 3)].into_iter().chain((2..40).map(|rev| row(rev, 1))).map(|x| (e, x, 1)).collect();
            fresh.apply(1, all).unwrap();
            assert_eq!(engine.query(r).unwrap(), fresh.query(r).unwrap());
        }
    }

    /// Two strata join `e` on its first column and anti-join `k`: each
    /// lookup is arranged once, in a hub both import, which moves whenever
    /// either stratum does — including revisions where only one of them has
    /// work, or only the hub's relation changed.
    #[test]
    fn a_lookup_two_strata_make_is_arranged_once_and_both_read_it_right() {
        let src = "input e(a: int, b: int) from \"e/{a}/{b}\"\ninput f(a: int) from \"f/{a}\"\ninput g(a: int) from \"g/{a}\"\n\
                   input k(a: int) from \"k/{a}\"\n\
                   output x(a: int, b: int) to \"x/{a}/{b}\"\noutput y(a: int, b: int) to \"y/{a}/{b}\"\n\
                   x(a, b) :- f(a), e(a, b), not k(b).\ny(a, b) :- g(a), e(a, b), not k(b).\n";
        let program = Arc::new(ccattler_parser::check_str("t.rules", src).program.unwrap());
        let [e, f, g, k, x, y] = ["e", "f", "g", "k", "x", "y"].map(|n| program.relation(n).unwrap());
        let layout = Layout::of(&program, dataflow::Split::Strata, true, false);
        assert_eq!(layout.derived.len(), 2, "x and y are strata of their own");
        assert_eq!(layout.hubs.keys().copied().collect::<Vec<_>>(), vec![e, k], "one hub each for e and k");
        assert!(layout.imports.iter().all(|i| i.len() == 2), "both strata import both: {:?}", layout.imports);
        let one = |a: i64| -> Row { smallvec::smallvec![Value::Int(a)] };
        // Each revision's changes: only f, only g, only e, only k, and all.
        let revisions: Vec<Vec<Change>> = vec![
            vec![(e, row(1, 10), 1), (e, row(2, 20), 1), (f, one(1), 1)],
            vec![(g, one(2), 1)],
            vec![(e, row(1, 11), 1), (e, row(2, 21), 1)],
            vec![(k, one(11), 1)],
            vec![(f, one(2), 1), (g, one(1), 1), (e, row(1, 10), -1), (k, one(11), -1), (k, one(20), 1)],
            vec![(e, row(2, 22), 1)],
        ];
        for workers in [1, 2] {
            let mut engine = Engine::start(program.clone(), workers).unwrap();
            let mut all: Vec<Change> = Vec::new();
            for (n, changes) in revisions.iter().enumerate() {
                let rev = n as u64 + 1;
                engine.apply(rev, changes.clone()).unwrap();
                all.extend(changes.iter().cloned());
                let mut fresh = Engine::start(program.clone(), 1).unwrap();
                fresh.apply(1, consolidate(all.clone())).unwrap();
                for rel in [x, y] {
                    assert_eq!(
                        engine.query(rel).unwrap(),
                        fresh.query(rel).unwrap(),
                        "{} after revision {rev}, {workers} worker(s)",
                        program.relations[rel].name
                    );
                }
            }
            assert_eq!(engine.query(x).unwrap(), vec![row(1, 11), row(2, 21), row(2, 22)]);
            assert_eq!(engine.query(y).unwrap(), vec![row(1, 11), row(2, 21), row(2, 22)]);
        }
    }
}

#[cfg(test)]
mod cluster_tests {
    use super::*;

    fn row(a: i64, b: i64) -> Row {
        smallvec::smallvec![Value::Int(a), Value::Int(b)]
    }

    /// Two processes (threads here, each its own timely instance over
    /// loopback TCP): the same outputs, reads and snapshots as one.
    #[test]
    fn a_cluster_of_two_processes_answers_as_one_process_does() {
        let src = "input e(a: int, b: int) from \"e/{a}/{b}\"\noutput r(a: int, b: int) to \"r/{a}/{b}\"\nr(a, c) :- e(a, b), e(b, c).\n";
        let program = Arc::new(ccattler_parser::check_str("t.rules", src).program.unwrap());
        let (e, r) = (program.relation("e").unwrap(), program.relation("r").unwrap());
        for workers in [1, 2] {
            let addresses = Cluster::loopback(2).unwrap();
            let (p, c) = (program.clone(), Cluster { workers, process: 1, addresses: addresses.clone() });
            let other = std::thread::spawn(move || serve(p, &c));
            let mut engine = Engine::start_cluster(program.clone(), &Cluster { workers, process: 0, addresses }).unwrap();
            let mut alone = Engine::start(program.clone(), 1).unwrap();
            let changes: Vec<Change> = (0..20).map(|i| (e, row(i % 7, (i * 3) % 7), 1)).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            assert_eq!(engine.apply(1, changes.clone()).unwrap(), alone.apply(1, changes).unwrap(), "{workers} worker(s)");
            let snap = engine.snapshot().unwrap();
            let gone = vec![(e, row(0, 0), -1), (e, row(3, 2), -1)];
            assert_eq!(engine.apply(2, gone.clone()).unwrap(), alone.apply(2, gone).unwrap());
            assert_eq!(engine.query(r).unwrap(), alone.query(r).unwrap());
            assert_eq!(engine.lookup(r, &[Value::Int(1)]).unwrap().len(), alone.lookup(r, &[Value::Int(1)]).unwrap().len());
            let before = snap.query(r).unwrap();
            drop(snap);
            assert!(before != engine.query(r).unwrap());
            drop(engine);
            other.join().unwrap().unwrap();
        }
    }
}
