//! An offline session: a key/value store standing in for etcd, the engine, and
//! the write-back loop, run to a fixed point. `eval`, `test` and `explain
//! --facts` use it, so offline results are the controller's results.

use crate::facts::{is_output_key, Conflict, Derived, InputFacts, OutputFacts, REJECTED, REJECTED_DERIVED};
use crate::runtime::{Engine, EngineError};
use ccattler_parser::program::Program;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// How many write-back rounds settle may take before it gives up.
pub const MAX_ROUNDS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the rules did not reach a fixed point after {MAX_ROUNDS} write-back rounds; still changing: {0}")]
    NoFixedPoint(String),
}

/// Revisions with at least this many writes keep the store's side of them
/// on a thread of their own while the engine evaluates them.
const STORE_THREAD_WRITES: usize = 10_000;

/// The simulated store's side of a revision.
struct Store<'a> {
    outputs: &'a mut HashMap<String, String, foldhash::fast::RandomState>,
    records: &'a mut BTreeMap<String, String>,
}

impl Store<'_> {
    /// Stores the writes to output keys and rejection records; returns the
    /// output keys written from outside (the write-back writes what is
    /// derived, so its keys match until the engine changes them).
    fn write(self, program: &Program, writes: &[Write], writer: Writer) -> Vec<String> {
        let mut dirty = Vec::new();
        for (key, value) in writes {
            if is_output_key(program, key) {
                match value {
                    Some(v) => self.outputs.insert(key.clone(), v.clone()),
                    None => self.outputs.remove(key),
                };
                if writer == Writer::Outside {
                    dirty.push(key.clone());
                }
            } else if key.starts_with(REJECTED) {
                match value {
                    Some(v) => self.records.insert(key.clone(), v.clone()),
                    None => self.records.remove(key),
                };
            }
        }
        dirty
    }
}

/// Who writes a revision.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Writer {
    /// A user, a test, an agent: anything may differ from what is derived.
    Outside,
    /// The write-back: the derived value of each key it writes.
    WriteBack,
}

/// A write: `Some(value)` puts, `None` deletes.
pub type Write = (String, Option<String>);

pub struct Session {
    engine: Engine,
    /// What the simulated store holds under output patterns.
    /// (Looked up by key only: a hash map, as keys share long prefixes.)
    stored_outputs: HashMap<String, String, foldhash::fast::RandomState>,
    /// The rejection records it holds (`status/rejected/K`), written back
    /// as the controller writes them.
    stored_records: BTreeMap<String, String>,
    pub inputs: InputFacts,
    pub outputs: OutputFacts,
    rev: u64,
    /// Write-back rounds the last `write` took.
    pub last_rounds: usize,
    /// Keys the last `write` wrote back (puts and deletes, over all rounds).
    pub last_writes: usize,
    /// How long the last `write` took until its own revision's output diff was
    /// complete (before any write-back round).
    pub last_first_diff: std::time::Duration,
}

impl Session {
    pub fn new(program: Arc<Program>, workers: usize) -> Result<Session, SessionError> {
        Ok(Session::on(Engine::start(program, workers)?))
    }

    /// A session over an engine already started (e.g. on a cluster).
    pub fn on(engine: Engine) -> Session {
        Session {
            engine,
            stored_outputs: HashMap::default(),
            stored_records: BTreeMap::new(),
            inputs: InputFacts::default(),
            outputs: OutputFacts::default(),
            rev: 0,
            last_rounds: 0,
            last_writes: 0,
            last_first_diff: std::time::Duration::ZERO,
        }
    }

    pub fn program(&self) -> &Arc<Program> {
        self.engine.program()
    }
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
    pub fn revision(&self) -> u64 {
        self.rev
    }

    /// Writes keys in one revision, then writes back what the rules derive (as
    /// the bridge does) until the store holds exactly the derived outputs.
    pub fn write(&mut self, writes: &[Write]) -> Result<(), SessionError> {
        let start = std::time::Instant::now();
        let mut dirty = self.apply(writes, Writer::Outside)?;
        self.last_first_diff = start.elapsed();
        self.last_writes = 0;
        for round in 0..MAX_ROUNDS {
            let back = self.reconcile(&dirty);
            self.last_writes += back.len();
            if back.is_empty() {
                self.last_rounds = round;
                return Ok(());
            }
            dirty = self.apply(&back, Writer::WriteBack)?;
        }
        let mut pending: Vec<String> = self.reconcile(&dirty).into_iter().map(|(k, _)| k).collect();
        pending.sort_unstable();
        pending.truncate(5);
        Err(SessionError::NoFixedPoint(pending.join(", ")))
    }

    /// Loads a store's facts as they are, each with the revision it was
    /// written at, at revision `rev` (a snapshot), and writes nothing back:
    /// what is derived is what the rules give for the store as it is.
    pub fn load(&mut self, rev: u64, facts: &[(String, String, u64)]) -> Result<(), SessionError> {
        let program = self.engine.program().clone();
        self.rev = rev.max(self.rev + 1);
        let mut changes = Vec::new();
        for (key, value, mod_revision) in facts {
            self.inputs.put(&program, key, value, *mod_revision, &mut changes);
            if is_output_key(&program, key) {
                self.stored_outputs.insert(key.clone(), value.clone());
            } else if key.starts_with(REJECTED) {
                self.stored_records.insert(key.clone(), value.clone());
            }
        }
        let diffs = self.engine.apply(self.rev, changes)?;
        self.outputs.apply(&program, &diffs);
        Ok(())
    }

    /// What the store holds at an output key.
    pub fn stored_output(&self, key: &str) -> Option<&String> {
        self.stored_outputs.get(key)
    }

    /// One revision: store the writes, run the engine; returns the keys that
    /// may now need writing back, each once: those the engine's diffs touch,
    /// and output keys written from outside (the write-back writes what
    /// is derived, so its keys match until the engine changes them).
    fn apply(&mut self, writes: &[Write], writer: Writer) -> Result<Vec<String>, SessionError> {
        self.rev += 1;
        let rev = self.rev;
        let program = self.engine.program().clone();
        let mut changes = Vec::new();
        for (key, value) in writes {
            match value {
                Some(v) => self.inputs.put(&program, key, v, rev, &mut changes),
                None => self.inputs.delete(&program, key, &mut changes),
            }
        }
        // As the controller does, the output diffs are counted while the
        // workers still run, and resolved once all are in. The store's side
        // of a large revision is kept on a thread of its own meanwhile (a
        // small one is not worth a thread).
        let store = Store { outputs: &mut self.stored_outputs, records: &mut self.stored_records };
        let (engine, outputs) = (&mut self.engine, &mut self.outputs);
        let mut touched = Vec::new();
        let evaluate = || engine.apply_streaming(vec![(rev, changes)], |part| outputs.count(&program, &part, &mut touched));
        let (written, evaluated) = if writes.len() < STORE_THREAD_WRITES {
            (store.write(&program, writes, writer), evaluate())
        } else {
            std::thread::scope(|s| {
                let store = s.spawn(|| store.write(&program, writes, writer));
                let evaluated = evaluate();
                (store.join().expect("the store's bookkeeping does not panic"), evaluated)
            })
        };
        evaluated?;
        self.outputs.resolve_all(&program, &touched);
        // Each once; reconciling does not depend on the order.
        let dirty: HashSet<String, foldhash::fast::RandomState> = written.into_iter().chain(touched).collect();
        Ok(dirty.into_iter().collect())
    }

    /// For the given keys, the writes that make the store equal the derived
    /// outputs: puts for missing or different values, deletes for keys nothing
    /// derives (a conflicted key is left as it is).
    fn reconcile(&self, keys: &[String]) -> Vec<Write> {
        let mut writes = Vec::new();
        // Rejection records, as the controller keeps them (there are few).
        for (key, why) in self.inputs.rejected.iter() {
            let record = crate::facts::rejection_record(key);
            if self.stored_records.get(&record) != Some(why) {
                writes.push((record, Some(why.clone())));
            }
        }
        let program = self.engine.program();
        let invalid: BTreeMap<String, String> =
            self.outputs.invalid_relations().filter_map(|r| Some((format!("{REJECTED_DERIVED}{r}"), self.outputs.invalid_record(program, r)?))).collect();
        for (record, why) in &invalid {
            if self.stored_records.get(record) != Some(why) {
                writes.push((record.clone(), Some(why.clone())));
            }
        }
        for record in self.stored_records.keys() {
            let rejected = crate::facts::rejected_key(record).is_some_and(|k| self.inputs.rejected.contains_key(&k));
            if !rejected && !invalid.contains_key(record) {
                writes.push((record.clone(), None));
            }
        }
        for k in keys {
            let stored = self.stored_outputs.get(k);
            match self.outputs.resolved.get(k) {
                Some(v) if stored.map(String::as_str) != Some(v.as_str()) => writes.push((k.clone(), Some(v.to_string()))),
                None if stored.is_some() && !self.outputs.conflicts.contains_key(k) => writes.push((k.clone(), None)),
                _ => {}
            }
        }
        writes
    }

    /// Every derived key and value, sorted by key.
    pub fn derived(&self) -> &BTreeMap<String, Derived> {
        &self.outputs.resolved
    }
    pub fn rejected(&self) -> &BTreeMap<String, String> {
        &self.inputs.rejected
    }
    /// A record the session wrote back (`status/rejected/…`), if it holds one.
    pub fn record(&self, key: &str) -> Option<&String> {
        self.stored_records.get(key)
    }

    pub fn conflicts(&self) -> impl Iterator<Item = &Conflict> {
        self.outputs.conflicts.values()
    }
}
