//! The bridge's synchronous core: etcd's keys in, the engine in the middle,
//! the writes that make etcd match the rules out. No I/O here; `controller`
//! feeds it watch events and executes its plans.
//!
//! Level-triggered: a plan is the difference between what the rules derive
//! and what etcd holds (as last seen), for the keys that may have changed. A
//! restarted controller on a converged cluster plans nothing.

use ccattler_engine::facts::{Derived, InputFacts, OutputFacts};
use ccattler_engine::{Engine, EngineError};
use ccattler_parser::program::Program;
pub use ccattler_store::etcd::{Guard, Held, Op};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

/// Rejected input facts are recorded under this prefix (`status/rejected/<key>`).
pub use ccattler_engine::facts::REJECTED;
/// Conflicting output keys are recorded under this prefix.
pub const CONFLICT: &str = "status/conflict/";
/// A derived key etcd refused for good (`status/blocked/<key>`: why).
pub const BLOCKED: &str = "status/blocked/";
/// The revision the outputs were last derived from; written with every write-back.
pub const DERIVED_REVISION: &str = "status/derived_revision";
/// Keys the controller writes outside its plans (the stamp beside every
/// write-back, the clock, the leader key): never inside a range guard.
const UNPLANNED: [&str; 3] = [DERIVED_REVISION, ccattler_store::layout::CLOCK, crate::controller::LEADER_KEY];

/// One change seen in etcd: a put (`Some`) or a delete (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub key: String,
    pub value: Option<Held>,
}

/// How much one transaction may hold: operations (etcd's `--max-txn-ops`,
/// less the stamp) and bytes of keys and values (under etcd's
/// `--max-request-bytes`, 1.5 MiB by default).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub ops: usize,
    pub bytes: usize,
}

impl Budget {
    pub const UNLIMITED: Budget = Budget { ops: usize::MAX, bytes: usize::MAX };
}

/// What an op adds to a transaction's size: its key (in the compare and the
/// request) and value, and a little framing.
pub fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Create { key, value } | Op::Update { key, value, .. } => 2 * key.len() + value.len() + 32,
        Op::Delete { key, .. } => 2 * key.len() + 32,
    }
}

/// Splits ops into transactions within `budget` (each holds at least one).
pub fn chunks(ops: Vec<Op>, budget: Budget) -> Vec<Vec<Op>> {
    let mut out: Vec<Vec<Op>> = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let size = op_bytes(&op);
        match out.last_mut() {
            Some(last) if last.len() < budget.ops && bytes + size <= budget.bytes => {
                bytes += size;
                last.push(op);
            }
            _ => {
                bytes = size;
                out.push(vec![op]);
            }
        }
    }
    out
}

/// Where a plan made in chunks has got to ([`Reconciler::plan_next`]).
#[derive(Clone, Debug, Default)]
pub struct PlanCursor {
    phase: u8,
    /// The last key planned in this phase.
    after: Option<String>,
}

/// A key as etcd holds it, as far as planning needs: its value, and the
/// revision a compare-and-swap names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stored {
    value: String,
    mod_revision: i64,
}

pub struct Reconciler {
    engine: Engine,
    program: Arc<Program>,
    pub inputs: InputFacts,
    pub outputs: OutputFacts,
    /// Output and status keys as etcd holds them (as last seen), except a
    /// derived key etcd holds with its derived value: its resolved entry
    /// keeps etcd's revision of it ([`Derived::stored_at`]), so the key and
    /// value are held once. Here: records, keys nothing derives, keys whose
    /// derived value moved on and is not yet written.
    held: BTreeMap<String, Stored>,
    /// Keys whose derived or held value may differ.
    dirty: BTreeSet<String>,
    /// Every managed key may differ (a fresh start, a takeover): cheaper
    /// than listing them all in `dirty`, and nothing is added to `dirty`
    /// while it holds.
    all_dirty: bool,
    /// Derived keys whose write etcd refused for good (no permission, too
    /// large): not planned again while they want the same value; each
    /// recorded as `status/blocked/<key>`.
    blocked: BTreeMap<String, (String, Option<String>)>,
    /// The etcd revision the state reflects.
    revision: u64,
    /// The engine's logical time: the etcd revision, except that a resync onto
    /// a snapshot no newer than the state gets the next time (engine times
    /// must increase).
    time: u64,
    /// Pages of a first snapshot were staged and not yet closed.
    loading: bool,
    /// The cluster's gauges, kept as the derived keys change.
    counts: crate::counts::ClusterCounts,
}

impl Reconciler {
    pub fn new(program: Arc<Program>, workers: usize) -> Result<Reconciler, EngineError> {
        Ok(Reconciler::on(program.clone(), Engine::start(program, workers)?))
    }

    /// Over an engine already started on `program` (a group's, say).
    pub fn on(program: Arc<Program>, engine: Engine) -> Reconciler {
        Reconciler {
            engine,
            program,
            inputs: InputFacts::default(),
            outputs: OutputFacts::default(),
            held: BTreeMap::new(),
            dirty: BTreeSet::new(),
            all_dirty: false,
            blocked: BTreeMap::new(),
            revision: 0,
            time: 0,
            counts: Default::default(),
            loading: false,
        }
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// A managed key's value as etcd holds it (as last seen).
    pub fn held_value(&self, key: &str) -> Option<&str> {
        self.held_at(key).map(|(value, _)| value)
    }

    /// A managed key as etcd holds it (as last seen): value and revision.
    fn held_at(&self, key: &str) -> Option<(&str, i64)> {
        match self.held.get(key) {
            Some(s) => Some((&s.value, s.mod_revision)),
            None => self.outputs.resolved.get(key).and_then(|d| Some((d.as_str(), d.stored_at()?))),
        }
    }

    /// etcd now holds `now` (value, revision; `None`: nothing) at managed
    /// key `key`: kept in the key's resolved entry if that is its derived
    /// value, in `held` otherwise.
    fn hold(&mut self, key: &str, now: Option<(&str, i64)>) {
        let derived = self.outputs.resolved.get_mut(key);
        match (now, derived) {
            (Some((value, rev)), Some(d)) if d.as_str() == value => {
                d.set_stored_at(Some(rev));
                self.held.remove(key);
            }
            (now, derived) => {
                if let Some(d) = derived {
                    d.set_stored_at(None);
                }
                match now {
                    Some((value, mod_revision)) => {
                        self.held.insert(key.to_string(), Stored { value: value.to_string(), mod_revision });
                    }
                    None => {
                        self.held.remove(key);
                    }
                }
            }
        }
    }

    /// The last revision applied.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The engine (for queries between revisions: `explain`).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Input facts plus derived keys.
    pub fn facts_held(&self) -> usize {
        self.inputs.facts.len() + self.outputs.resolved.len()
    }

    fn is_managed_key(&self, key: &str) -> bool {
        key.starts_with(REJECTED) || key.starts_with(CONFLICT) || key.starts_with(BLOCKED) || ccattler_engine::facts::is_output_key(&self.program, key)
    }

    /// Records that etcd refused `op` for good: it is not planned again
    /// while the rules want the same value; `status/blocked/<key>` says why.
    pub fn block(&mut self, op: &Op, why: String) {
        let want = match op {
            Op::Create { value, .. } | Op::Update { value, .. } => Some(value.clone()),
            Op::Delete { .. } => None,
        };
        self.blocked.insert(op.key().to_string(), (why, want));
        self.dirty.remove(op.key());
        self.dirty.insert(format!("{BLOCKED}{}", op.key()));
    }

    /// Keys etcd refused for good, with why.
    pub fn blocked(&self) -> impl Iterator<Item = (&String, &String)> {
        self.blocked.iter().map(|(k, (why, _))| (k, why))
    }

    /// Applies every change of one revision.
    pub fn apply(&mut self, rev: u64, events: &[Event]) -> Result<(), EngineError> {
        self.apply_many(vec![(rev, events.to_vec())])
    }

    /// Applies several revisions (increasing) in one engine pass. Their
    /// changes enter together at the last revision: the outputs are what the
    /// rules derive as of it, and no operator recomputes at every revision in
    /// between (a reduce over a large group, like `assign`'s, would pay its
    /// whole input once per revision).
    pub fn apply_many(&mut self, revisions: Vec<(u64, Vec<Event>)>) -> Result<(), EngineError> {
        let mut changes = Vec::new();
        let mut last = self.revision;
        for (rev, events) in revisions {
            changes.extend(self.record(&events));
            last = last.max(rev);
        }
        // Revisions that change no input tuple (e.g. our own writes of
        // output-only keys coming back) need no engine pass at all.
        if !changes.is_empty() {
            self.time = last.max(self.time + 1);
            self.evaluate(self.time, changes)?;
        }
        self.revision = last;
        Ok(())
    }

    /// Whether pages of a first snapshot were staged and the snapshot not
    /// closed (its read failed part way): the engine holds part of it.
    pub fn holds_part_of_a_snapshot(&self) -> bool {
        self.loading
    }

    /// Whether nothing has been loaded yet.
    pub fn is_fresh(&self) -> bool {
        self.time == 0 && self.inputs.facts.is_empty() && self.inputs.rejected.is_empty() && self.held.is_empty()
    }

    /// Loads one page of the first snapshot (taken at `rev`) into a fresh
    /// reconciler: records its keys and stages their tuples in the engine,
    /// which starts on them while the caller reads the next page.
    /// [`Reconciler::finish_load`] closes the snapshot. If the read fails
    /// before that, the reconciler holds part of a snapshot: drop it.
    pub fn load_page(&mut self, rev: u64, page: Vec<(String, Held)>) -> Result<(), EngineError> {
        debug_assert_eq!(self.time, 0, "only a fresh reconciler loads pages");
        // Everything will be planned: no key needs listing as it is recorded.
        self.all_dirty = true;
        self.loading = true;
        let events: Vec<Event> = page.into_iter().map(|(key, h)| Event { key, value: Some(h) }).collect();
        let changes = self.record(&events);
        self.engine.stage(rev, changes)
    }

    /// Closes a snapshot loaded with [`Reconciler::load_page`]: the engine
    /// evaluates it, and every derived, held or rejected key is to be planned.
    pub fn finish_load(&mut self, rev: u64) -> Result<(), EngineError> {
        self.time = rev;
        self.loading = false;
        self.all_dirty = true; // also when there was no page
        self.evaluate(rev, Vec::new())?;
        self.revision = rev;
        Ok(())
    }

    /// Runs the engine on `changes` at `time`, taking its output in while it
    /// runs; marks each key it touches (and its conflict record, if that may
    /// change) dirty.
    fn evaluate(&mut self, time: u64, changes: Vec<ccattler_engine::Change>) -> Result<(), EngineError> {
        let t = std::time::Instant::now();
        let mut touched = Vec::new();
        let (outputs, program) = (&mut self.outputs, &self.program);
        self.engine.apply_streaming(vec![(time, changes)], |part| outputs.count(program, &part, &mut touched))?;
        let evaluated = t.elapsed();
        self.resolve(&touched);
        if t.elapsed().as_secs() >= 1 {
            tracing::debug!(time, evaluate = evaluated.as_secs_f64(), resolve = (t.elapsed() - evaluated).as_secs_f64(), "evaluated");
        }
        if self.all_dirty {
            return Ok(());
        }
        // A key's conflict record needs a look only if it is conflicted now or
        // some record is held (it may be this key's, now resolved).
        let records_held = self.held.range(CONFLICT.to_string()..).next().is_some_and(|(k, _)| k.starts_with(CONFLICT));
        let mut keys = Vec::with_capacity(touched.len());
        for key in touched {
            if records_held || self.outputs.conflicts.contains_key(&key) {
                keys.push(format!("{CONFLICT}{key}"));
            }
            keys.push(key);
        }
        // Many keys go in bulk, sorted.
        if keys.len() > self.dirty.len() {
            keys.extend(std::mem::take(&mut self.dirty));
            self.dirty = keys.into_iter().collect();
        } else {
            self.dirty.extend(keys);
        }
        Ok(())
    }

    /// Resolves the keys an evaluation touched, keeping etcd's copy of each
    /// where it belongs: a key whose derived value moves on leaves its copy
    /// in `held`; one whose new value is what `held` has takes it in.
    fn resolve(&mut self, touched: &[String]) {
        if self.outputs.resolved.is_empty() {
            // A first load: every key is new; one pass over both, in order.
            self.outputs.resolve_all(&self.program, touched);
            self.counts = crate::counts::ClusterCounts::of(self.outputs.resolved.iter().map(|(k, d)| (k.as_str(), d.as_str())));
            let mut resolved = self.outputs.resolved.iter_mut().peekable();
            self.held.retain(|key, stored| {
                while resolved.next_if(|(k, _)| k.as_str() < key.as_str()).is_some() {}
                match resolved.peek_mut() {
                    Some((k, d)) if *k == key && d.as_str() == stored.value => {
                        d.set_stored_at(Some(stored.mod_revision));
                        false
                    }
                    _ => true,
                }
            });
            return;
        }
        let held = &mut self.held;
        // New values etcd already holds: their revisions, set once resolved.
        let mut stored = Vec::new();
        let mut counted = Vec::new();
        self.outputs.resolve_all_noting(&self.program, touched, |at, key, old, new| {
            if crate::counts::is_counted(key) {
                counted.push((key.to_string(), old.as_ref().map(|d| d.as_str().to_string())));
            }
            match old.and_then(|d| d.stored_at().map(|rev| (d, rev))) {
                // etcd held the old value (so not the new one): it stays apart.
                Some((old, rev)) => {
                    held.insert(key.to_string(), Stored { value: Derived::into_value(old), mod_revision: rev });
                }
                None => {
                    if let Some(s) = held.get(key).filter(|s| Some(s.value.as_str()) == new) {
                        stored.push((at, s.mod_revision));
                        held.remove(key);
                    }
                }
            }
        });
        for (at, rev) in stored {
            if let Some(d) = self.outputs.resolved.get_mut(&touched[at]) {
                d.set_stored_at(Some(rev));
            }
        }
        let resolved = &self.outputs.resolved;
        self.counts.apply(&counted, |k| resolved.get(k).map(|d| d.as_str()));
    }

    /// The cluster's gauges as the rules see it now.
    pub fn counts(&self) -> &crate::counts::ClusterCounts {
        &self.counts
    }

    /// Records one revision's events; returns the tuple changes they cause.
    fn record(&mut self, events: &[Event]) -> Vec<ccattler_engine::Change> {
        let mut changes = Vec::new();
        for e in events {
            let was_rejected = self.inputs.rejected.contains_key(&e.key);
            match &e.value {
                Some(h) => self.inputs.put(&self.program, &e.key, &h.value, h.mod_revision as u64, &mut changes),
                None => self.inputs.delete(&self.program, &e.key, &mut changes),
            }
            if !self.all_dirty && (was_rejected || self.inputs.rejected.contains_key(&e.key)) {
                self.dirty.insert(ccattler_engine::facts::rejection_record(&e.key));
            }
            if self.is_managed_key(&e.key) {
                self.hold(&e.key, e.value.as_ref().map(|h| (h.value.as_str(), h.mod_revision)));
                if !self.all_dirty {
                    self.dirty.insert(e.key.clone());
                }
            }
        }
        changes
    }

    /// Makes the state equal a fresh snapshot taken at `rev` (after a
    /// compaction or a reconnect): applies exactly the differences, so
    /// nothing that did not change is rewritten.
    pub fn rebase(&mut self, rev: u64, snapshot: Vec<(String, Held)>) -> Result<(), EngineError> {
        if self.is_fresh() {
            // Nothing known yet: the snapshot is the difference, moved in as it is.
            self.load_page(rev, snapshot)?;
            return self.finish_load(rev);
        }
        let mut events = Vec::new();
        let snap: BTreeMap<String, Held> = snapshot.into_iter().collect();
        let stored = self.outputs.resolved.iter().filter(|(_, d)| d.stored_at().is_some()).map(|(k, _)| k);
        let known: BTreeSet<&String> = self.inputs.facts.keys().chain(self.inputs.rejected.keys()).chain(self.held.keys()).chain(stored).collect();
        for k in known {
            if !snap.contains_key(k) {
                events.push(Event { key: k.clone(), value: None });
            }
        }
        for (k, h) in &snap {
            let same_input = self.inputs.facts.get(k).is_some_and(|f| f.value == h.value && f.mod_revision == h.mod_revision as u64);
            let same_held = self.held_at(k) == Some((h.value.as_str(), h.mod_revision));
            // Unknown keys are applied too: an input or a managed key enters,
            // anything else is ignored by `apply`.
            if !(same_input || same_held) {
                events.push(Event { key: k.clone(), value: Some(h.clone()) });
            }
        }
        self.apply_many(vec![(rev, events)])
    }

    /// Considers every key again (a fresh start, a takeover).
    pub fn mark_all_dirty(&mut self) {
        self.all_dirty = true;
    }

    /// What a managed key should hold according to the rules.
    pub fn desired(&self, key: &str) -> Option<String> {
        self.desired_value(key).map(Cow::into_owned)
    }

    fn desired_value(&self, key: &str) -> Option<Cow<'_, str>> {
        if let Some(blocked) = key.strip_prefix(BLOCKED) {
            return self.blocked.get(blocked).map(|(why, _)| Cow::Borrowed(why.as_str()));
        }
        if let Some(relation) = key.strip_prefix(ccattler_engine::facts::REJECTED_DERIVED) {
            return self.outputs.invalid_record(&self.program, relation).map(Cow::Owned);
        }
        if let Some(input_key) = ccattler_engine::facts::rejected_key(key) {
            return self.inputs.rejected.get(&input_key).map(|r| Cow::Borrowed(r.as_str()));
        }
        if let Some(output_key) = key.strip_prefix(CONFLICT) {
            return self.outputs.conflicts.get(output_key).map(|c| {
                let values: Vec<String> = c.values.iter().map(|(v, rules)| format!("{v:?} from {}", rules.join(", "))).collect();
                Cow::Owned(values.join("; "))
            });
        }
        self.outputs.resolved.get(key).map(|v| Cow::Borrowed(v.as_str()))
    }

    /// The writes that make etcd hold what the rules derive, for the dirty keys.
    pub fn plan(&self) -> Vec<Op> {
        self.plan_chunk(self.all_dirty, &mut PlanCursor::default(), Budget::UNLIMITED)
    }

    /// The writes for every managed key, in key order (what `ccattler plan` shows).
    pub fn full_plan(&self) -> Vec<Op> {
        let mut ops = self.plan_chunk(true, &mut PlanCursor::default(), Budget::UNLIMITED);
        ops.sort_by(|a, b| a.key().cmp(b.key()));
        ops
    }

    /// The next (at most) `max` writes of the plan, from where `cursor` got
    /// to; empty when the plan is done. Between chunks the plan may be
    /// executed ([`Reconciler::written`]): a write-back starts on its first
    /// transaction without planning every key first.
    pub fn plan_next(&self, cursor: &mut PlanCursor, budget: Budget) -> Vec<Op> {
        self.plan_chunk(self.all_dirty, cursor, budget)
    }

    /// The cheapest guard that holds `chunk` to its plan: one compare over
    /// the range of its keys ([`Guard::Unchanged`] at the revision this
    /// state reflects) when they are sorted, lie in one namespace only the
    /// controller writes, and the range holds none of the keys written
    /// outside plans and at most four keys per op (etcd reads them to judge
    /// it); a compare per key otherwise. A range guard refused may be
    /// spurious (a neighbour written by another transaction of the same
    /// write-back): the writer retries it key by key.
    pub fn guard_for(&self, chunk: &[Op]) -> Guard {
        let (Some(first), Some(last)) = (chunk.first().map(Op::key), chunk.last().map(Op::key)) else { return Guard::EachKey };
        let sorted = chunk.windows(2).all(|w| w[0].key() < w[1].key());
        let one_namespace = ccattler_store::auth::CONTROLLER_WRITES.iter().any(|p| first.starts_with(p) && last.starts_with(p));
        if chunk.len() < 2 || !sorted || !one_namespace || UNPLANNED.iter().any(|k| (first..=last).contains(k)) {
            return Guard::EachKey;
        }
        let limit = 4 * chunk.len();
        let within = (Bound::Included(first), Bound::Included(last));
        let stored = self.outputs.resolved.range::<str, _>(within).take(limit + 1).count() + self.held.range::<str, _>(within).take(limit + 1).count();
        if stored > limit {
            return Guard::EachKey;
        }
        let mut to = last.as_bytes().to_vec();
        to.push(0);
        Guard::Unchanged { from: first.to_string(), to, revision: self.revision as i64 }
    }

    /// Plans over the dirty keys, or over every managed key (`all`) in three
    /// phases: derived keys, held keys not derived, rejection and conflict
    /// records not held.
    fn plan_chunk(&self, all: bool, cursor: &mut PlanCursor, budget: Budget) -> Vec<Op> {
        let mut ops = Vec::new();
        let mut bytes = 0usize;
        let mut full = false;
        while ops.len() < budget.ops && !full {
            let after = match &cursor.after {
                Some(k) => Bound::Excluded(k.as_str()),
                None => Bound::Unbounded,
            };
            let records: Vec<String>;
            let keys: Box<dyn Iterator<Item = &str>> = match (all, cursor.phase) {
                (false, 0) => Box::new(self.dirty.range::<str, _>((after, Bound::Unbounded)).map(String::as_str)),
                (true, 0) => Box::new(self.outputs.resolved.range::<str, _>((after, Bound::Unbounded)).map(|(k, _)| k.as_str())),
                (true, 1) => {
                    Box::new(self.held.range::<str, _>((after, Bound::Unbounded)).map(|(k, _)| k.as_str()).filter(|k| !self.outputs.resolved.contains_key(*k)))
                }
                (true, 2) => {
                    let rejected = self.inputs.rejected.keys().map(|k| ccattler_engine::facts::rejection_record(k));
                    let conflicts = self.outputs.conflicts.keys().map(|k| format!("{CONFLICT}{k}"));
                    let invalid = self.outputs.invalid_relations().map(|r| format!("{}{r}", ccattler_engine::facts::REJECTED_DERIVED));
                    let blocked = self.blocked.keys().map(|k| format!("{BLOCKED}{k}"));
                    let mut r: Vec<String> = rejected
                        .chain(conflicts)
                        .chain(invalid)
                        .chain(blocked)
                        .filter(|k| self.held_at(k).is_none() && !self.outputs.resolved.contains_key(k))
                        .collect();
                    r.sort();
                    records = r;
                    Box::new(records.iter().map(String::as_str).filter(|k| cursor.after.as_deref().is_none_or(|a| *k > a)))
                }
                _ => break,
            };
            let mut stopped_at = None;
            let mut last_taken: Option<String> = None;
            for key in keys {
                if let Some(op) = self.op_for(key) {
                    // A transaction stays under etcd's request size: the op
                    // that would cross the budget starts the next one.
                    let size = op_bytes(&op);
                    if !ops.is_empty() && bytes + size > budget.bytes {
                        full = true;
                        // Resume after the last key taken (nothing of this
                        // phase taken: where the phase was).
                        stopped_at = Some(last_taken.clone().or_else(|| cursor.after.clone()).unwrap_or_default());
                        break;
                    }
                    bytes += size;
                    ops.push(op);
                    last_taken = Some(key.to_string());
                    if ops.len() == budget.ops {
                        stopped_at = Some(key.to_string());
                        break;
                    }
                }
            }
            match stopped_at {
                Some(key) => cursor.after = Some(key),
                None => {
                    cursor.phase += 1;
                    cursor.after = None;
                }
            }
        }
        ops
    }

    /// The write a managed key needs, if any.
    fn op_for(&self, key: &str) -> Option<Op> {
        let held = self.held_at(key);
        if let Some((_, want)) = self.blocked.get(key) {
            // Refused for good: not again while the rules want the same.
            if self.desired_value(key).as_deref() == want.as_deref() {
                return None;
            }
        }
        // A conflicted output keeps whatever etcd holds.
        let conflicted = self.outputs.conflicts.contains_key(key);
        match (self.desired_value(key), held) {
            (Some(v), None) => Some(Op::Create { key: key.to_string(), value: v.into_owned() }),
            (Some(v), Some((value, mod_revision))) if v != value => Some(Op::Update { key: key.to_string(), value: v.into_owned(), mod_revision }),
            (None, Some((_, mod_revision))) if !conflicted => Some(Op::Delete { key: key.to_string(), mod_revision }),
            _ => None,
        }
    }

    /// Records writes that committed at `rev` (before their watch events come
    /// back), so they are not planned again.
    pub fn written(&mut self, ops: &[Op], rev: i64) {
        for op in ops {
            match op {
                Op::Create { key, value } | Op::Update { key, value, .. } => self.hold(key, Some((value, rev))),
                Op::Delete { key, .. } => self.hold(key, None),
            }
            self.dirty.remove(op.key());
        }
    }

    /// After a plan came out empty: no dirty key needs a write.
    pub fn clean(&mut self) {
        self.dirty.clear();
        self.all_dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program() -> Arc<Program> {
        let src = r#"
            input intent(w: name, s: name, n: int) from "intent/{w}/service/{s}/instances"
            output eff(s: name, n: int) to "effective/service/{s}/instances"
            eff(s, max(n)) :- intent(_, s, n).
        "#;
        Arc::new(ccattler_parser::check_str("t.rules", src).program.expect("checks"))
    }

    fn put(key: &str, value: &str, rev: i64) -> Event {
        Event { key: key.into(), value: Some(Held { value: value.into(), mod_revision: rev, create_revision: rev }) }
    }

    /// A cold start's run of creates in one namespace is held by one
    /// compare over its range; a chunk out of order, across namespaces, over
    /// a key written outside plans, or over a range holding many keys etcd
    /// has is held key by key.
    #[test]
    fn a_range_guard_only_for_a_sorted_run_in_one_controller_namespace_over_few_held_keys() {
        let mut r = Reconciler::new(program(), 1).unwrap();
        let intents: Vec<(String, Held)> =
            (0..50).map(|i| (format!("intent/user/service/s{i:02}/instances"), Held { value: "3".into(), mod_revision: 5, create_revision: 5 })).collect();
        r.rebase(10, intents).unwrap();
        let plan = r.plan();
        assert_eq!(plan.len(), 50);
        let (from, to) = (plan[0].key(), plan[49].key());
        let end = |k: &str| [k.as_bytes(), &[0]].concat();
        assert_eq!(r.guard_for(&plan), Guard::Unchanged { from: from.into(), to: end(to), revision: 10 });
        assert_eq!(r.guard_for(&plan[..1]), Guard::EachKey, "one key: its own compare");
        let mut unsorted = plan.clone();
        unsorted.swap(0, 1);
        assert_eq!(r.guard_for(&unsorted), Guard::EachKey);
        let create = |k: &str| Op::Create { key: k.into(), value: "v".into() };
        assert_eq!(r.guard_for(&[create("effective/z"), create("endpoint/a")]), Guard::EachKey, "across namespaces");
        assert_eq!(r.guard_for(&[create("desired/a"), create("desired/b")]), Guard::EachKey, "a namespace others write");
        assert_eq!(r.guard_for(&[create("status/a"), create("status/z")]), Guard::EachKey, "over the stamp, the clock and the leader key");
        assert!(matches!(r.guard_for(&[create("status/e"), create("status/f")]), Guard::Unchanged { .. }));
        // Written and seen back: two keys planned over a range of fifty held.
        r.written(&plan, 11);
        r.apply(12, &[put("intent/user/service/s00/instances", "4", 12), put("intent/user/service/s49/instances", "4", 12)]).unwrap();
        let sparse = r.plan();
        assert_eq!(sparse.len(), 2);
        assert_eq!(r.guard_for(&sparse), Guard::EachKey, "etcd would read 50 keys to judge 2");
    }

    #[test]
    fn plans_creates_updates_and_deletes_against_what_etcd_holds() {
        let mut r = Reconciler::new(program(), 1).unwrap();
        r.rebase(10, vec![("intent/user/service/web/instances".into(), Held { value: "3".into(), mod_revision: 5, create_revision: 5 })]).unwrap();
        assert_eq!(r.plan(), vec![Op::Create { key: "effective/service/web/instances".into(), value: "3".into() }]);
        r.written(&r.plan(), 11);
        assert!(r.plan().is_empty());
        // The write comes back through the watch: nothing more to do.
        r.apply(11, &[put("effective/service/web/instances", "3", 11)]).unwrap();
        assert!(r.plan().is_empty());
        r.apply(12, &[put("intent/autoscaler/service/web/instances", "5", 12)]).unwrap();
        assert_eq!(r.plan(), vec![Op::Update { key: "effective/service/web/instances".into(), value: "5".into(), mod_revision: 11 }]);
        // Deleted by hand: created again.
        r.written(&r.plan(), 13);
        r.apply(14, &[Event { key: "effective/service/web/instances".into(), value: None }]).unwrap();
        assert_eq!(r.plan(), vec![Op::Create { key: "effective/service/web/instances".into(), value: "5".into() }]);
    }

    #[test]
    fn rejected_facts_are_recorded_and_removed_when_fixed() {
        let mut r = Reconciler::new(program(), 1).unwrap();
        r.rebase(3, vec![]).unwrap();
        r.apply(4, &[put("intent/user/service/web/instances", "three", 4)]).unwrap();
        let plan = r.plan();
        assert_eq!(plan.len(), 1);
        assert!(matches!(&plan[0], Op::Create { key, value } if key == "status/rejected/intent/user/service/web/instances" && value.contains("three")));
        r.written(&plan, 5);
        r.apply(6, &[put("intent/user/service/web/instances", "3", 6)]).unwrap();
        let plan = r.plan();
        assert!(plan.contains(&Op::Delete { key: "status/rejected/intent/user/service/web/instances".into(), mod_revision: 5 }));
        assert!(plan.contains(&Op::Create { key: "effective/service/web/instances".into(), value: "3".into() }));
    }

    #[test]
    fn a_resync_at_an_old_revision_does_not_skip_the_next_one() {
        let mut r = Reconciler::new(program(), 1).unwrap();
        r.rebase(4, vec![]).unwrap();
        r.apply(5, &[put("intent/user/service/web/instances", "1", 5)]).unwrap();
        // Reconnected: the snapshot is at 5 again (nothing new).
        r.rebase(5, vec![("intent/user/service/web/instances".into(), Held { value: "1".into(), mod_revision: 5, create_revision: 5 })]).unwrap();
        assert_eq!(r.revision(), 5, "revision 6 must still be applied from the watch");
        r.apply(6, &[put("intent/user/service/web/instances", "3", 6)]).unwrap();
        assert_eq!(r.desired("effective/service/web/instances").as_deref(), Some("3"));
    }

    #[test]
    fn a_plan_made_in_chunks_while_it_is_written_equals_the_whole_plan() {
        let held = |v: &str, rev| Held { value: v.into(), mod_revision: rev, create_revision: rev };
        let snapshot = vec![
            ("intent/user/service/a/instances".to_string(), held("1", 2)),
            ("intent/user/service/b/instances".to_string(), held("2", 2)),
            ("intent/user/service/c/instances".to_string(), held("three", 2)),
            // Derived: one stale, one nothing derives any more.
            ("effective/service/b/instances".to_string(), held("1", 3)),
            ("effective/service/gone/instances".to_string(), held("1", 3)),
        ];
        let mut whole = Reconciler::new(program(), 1).unwrap();
        whole.rebase(9, snapshot.clone()).unwrap();
        let expected = whole.full_plan();
        assert_eq!(expected.len(), 4, "create a, update b, delete gone, record c's rejection: {expected:?}");
        assert_eq!(whole.plan(), expected);
        let budgets = [Budget { ops: 1, bytes: usize::MAX }, Budget { ops: 100, bytes: 120 }, Budget { ops: 2, bytes: 1 }];
        for (all, budget) in [true, false].into_iter().flat_map(|a| budgets.map(|b| (a, b))) {
            let mut r = Reconciler::new(program(), 1).unwrap();
            r.rebase(9, snapshot.clone()).unwrap();
            if !all {
                // The same keys listed one by one instead of "everything".
                r.all_dirty = false;
                r.dirty = expected.iter().map(|op| op.key().to_string()).collect();
            }
            let (mut cursor, mut chunks) = (PlanCursor::default(), Vec::new());
            loop {
                let chunk = r.plan_next(&mut cursor, budget);
                if chunk.is_empty() {
                    break;
                }
                let bytes: usize = chunk.iter().map(op_bytes).sum();
                assert!(chunk.len() <= budget.ops && (chunk.len() == 1 || bytes <= budget.bytes), "{chunk:?} over {budget:?}");
                r.written(&chunk, 10 + chunks.len() as i64);
                chunks.extend(chunk);
            }
            chunks.sort_by(|a, b| a.key().cmp(b.key()));
            assert_eq!(chunks, expected, "all dirty: {all}, {budget:?}");
            assert!(r.plan().is_empty());
        }
    }

    #[test]
    fn a_snapshot_loaded_in_pages_equals_one_loaded_whole() {
        let held = |v: &str| Held { value: v.into(), mod_revision: 2, create_revision: 2 };
        let snapshot: Vec<(String, Held)> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("intent/user/service/{s}/instances"), held(&(i + 1).to_string())))
            .chain([("intent/autoscaler/service/a/instances".to_string(), held("7")), ("effective/service/d/instances".to_string(), held("4"))])
            .collect();
        let mut whole = Reconciler::new(program(), 1).unwrap();
        whole.rebase(9, snapshot.clone()).unwrap();
        let mut paged = Reconciler::new(program(), 2).unwrap();
        for page in snapshot.chunks(2) {
            paged.load_page(9, page.to_vec()).unwrap();
        }
        paged.finish_load(9).unwrap();
        assert_eq!(paged.outputs.resolved, whole.outputs.resolved);
        assert_eq!(paged.outputs.resolved["effective/service/a/instances"], "7");
        assert_eq!(paged.plan(), whole.plan());
        assert_eq!(paged.plan().len(), 3, "d is already right");
        assert_eq!(paged.revision(), 9);
    }

    #[test]
    fn a_converged_snapshot_plans_nothing() {
        let mut r = Reconciler::new(program(), 1).unwrap();
        r.rebase(
            9,
            vec![
                ("intent/user/service/web/instances".into(), Held { value: "3".into(), mod_revision: 5, create_revision: 5 }),
                ("effective/service/web/instances".into(), Held { value: "3".into(), mod_revision: 6, create_revision: 6 }),
            ],
        )
        .unwrap();
        assert!(r.plan().is_empty());
        assert!(r.full_plan().is_empty());
    }

    #[test]
    fn a_derived_key_etcd_holds_as_derived_is_held_once() {
        let mut r = Reconciler::new(program(), 1).unwrap();
        let held = |v: &str, rev| Held { value: v.into(), mod_revision: rev, create_revision: rev };
        r.rebase(
            9,
            vec![
                ("intent/user/service/web/instances".into(), held("3", 5)),
                ("effective/service/web/instances".into(), held("3", 6)),
                ("effective/service/gone/instances".into(), held("1", 7)),
            ],
        )
        .unwrap();
        // etcd's copy of the derived key is its resolved entry's revision;
        // the key nothing derives stays apart, to be deleted.
        assert_eq!(r.held.keys().collect::<Vec<_>>(), ["effective/service/gone/instances"]);
        assert_eq!(r.held_at("effective/service/web/instances"), Some(("3", 6)));
        assert_eq!(r.plan(), vec![Op::Delete { key: "effective/service/gone/instances".into(), mod_revision: 7 }]);
        r.written(&r.plan(), 10);

        // The derived value moves on: etcd's copy leaves the entry, and the
        // update names etcd's revision of it.
        r.apply(11, &[put("intent/user/service/web/instances", "4", 11)]).unwrap();
        assert_eq!(r.held_at("effective/service/web/instances"), Some(("3", 6)));
        assert_eq!(r.plan(), vec![Op::Update { key: "effective/service/web/instances".into(), value: "4".into(), mod_revision: 6 }]);
        r.written(&r.plan(), 12);
        assert!(r.held.is_empty() && r.plan().is_empty());
        r.apply(12, &[put("effective/service/web/instances", "4", 12)]).unwrap();
        assert!(r.held.is_empty() && r.plan().is_empty());

        // Someone else writes the key: its copy is apart until restored.
        r.apply(13, &[put("effective/service/web/instances", "9", 13)]).unwrap();
        assert_eq!(r.plan(), vec![Op::Update { key: "effective/service/web/instances".into(), value: "4".into(), mod_revision: 13 }]);
        // The rules come round to what etcd holds: nothing to write.
        r.apply(14, &[put("intent/user/service/web/instances", "9", 14)]).unwrap();
        assert!(r.plan().is_empty());
        assert!(r.held.is_empty(), "taken into the entry: {:?}", r.held);
        assert_eq!(r.held_at("effective/service/web/instances"), Some(("9", 13)));

        // Deleted by hand: created again.
        r.apply(15, &[Event { key: "effective/service/web/instances".into(), value: None }]).unwrap();
        assert_eq!(r.held_at("effective/service/web/instances"), None);
        assert_eq!(r.plan(), vec![Op::Create { key: "effective/service/web/instances".into(), value: "9".into() }]);
    }

    #[test]
    fn a_resync_onto_the_same_state_rewrites_nothing() {
        let snapshot = |eff_rev| {
            vec![
                ("intent/user/service/web/instances".to_string(), Held { value: "3".into(), mod_revision: 5, create_revision: 5 }),
                ("effective/service/web/instances".to_string(), Held { value: "3".into(), mod_revision: eff_rev, create_revision: 6 }),
            ]
        };
        let mut r = Reconciler::new(program(), 1).unwrap();
        r.rebase(9, snapshot(6)).unwrap();
        r.clean();
        r.rebase(10, snapshot(6)).unwrap();
        assert!(r.plan().is_empty());
        // Rewritten with the same value meanwhile: the new revision is taken.
        r.rebase(11, snapshot(10)).unwrap();
        assert!(r.plan().is_empty());
        assert_eq!(r.held_at("effective/service/web/instances"), Some(("3", 10)));
    }
}
