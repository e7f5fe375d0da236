//! An offline session: a key/value store standing in for etcd, the engine, and
//! the write-back loop, run to a fixed point. `eval`, `test` and `explain
//! --facts` use it, so offline results are the controller's results.

use crate::facts::{is_output_key, Conflict, Derived, InputFacts, OutputFacts, REJECTED, REJECTED_DERIVED};
use crate::runtime::{Engine, EngineError};
use ccattler_parser::program::Program;
use std::collections::{BTreeMap, HashMap};
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

/// Revisions with at least this many writes pick out the store's keys
/// among them on a thread of their own while the engine evaluates them.
const STORE_THREAD_WRITES: usize = 10_000;

/// The store's side of a revision, as far as it needs no derived value:
/// the write-back's writes to output keys hold what is derived (nothing has
/// resolved since they were planned), so they leave `unwritten` here.
/// Returns the writes left to store: rejection records, and output keys
/// written from outside.
fn take_writes<'w>(program: &Program, writes: &'w [Write], writer: Writer, unwritten: &mut Unwritten) -> Vec<&'w Write> {
    let mut rest = Vec::new();
    for write in writes {
        let key = &write.0;
        if key.starts_with(REJECTED) {
            rest.push(write);
        } else if is_output_key(program, key) {
            match writer {
                Writer::WriteBack => {
                    unwritten.remove(key);
                }
                Writer::Outside => rest.push(write),
            }
        }
    }
    rest
}

/// Output keys whose stored value is not the derived one: what each holds.
type Unwritten = HashMap<String, Option<String>, foldhash::fast::RandomState>;

/// Keys a session's revision and its write-back must write (a cold start)
/// before the memory freed meanwhile is given back to the OS.
const COLLECT_AFTER_ROWS: usize = 100_000;

/// Gives the pages this thread's allocator freed back to the OS (mimalloc,
/// the binaries' allocator; with another allocator, nothing of note). A
/// cold start frees much of what it allocated — batches merged, buffers
/// drained — and mimalloc otherwise keeps those pages for reuse: resident
/// memory after the 500-node benchmark's cold load fell from 335 to 266
/// MiB (live heap 194 MiB). Called on the thread that drove the revision
/// (workers calling it too gave back nothing more); costs a walk over the
/// heap, so only after large revisions. (The controller, whose cold start
/// runs on tokio's threads, gained nothing from it at 5,000 nodes: RSS once
/// settled 1,659 and 1,646 MiB with it, 1,645 without; it does not call it.)
fn give_back_freed_memory() {
    // SAFETY: mi_collect takes no pointers and may be called on any thread.
    unsafe { libmimalloc_sys::mi_collect(true) };
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
    /// The simulated store's output keys that do not hold what is derived:
    /// what each holds instead (`None`: nothing). Every other output key
    /// holds its derived value, so the store keeps no second copy of the
    /// derived keys it agrees with (nearly all of them, once written back).
    /// (Looked up by key only: a hash map, as keys share long prefixes.)
    unwritten: Unwritten,
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
            unwritten: HashMap::default(),
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
        self.apply(writes, Writer::Outside)?;
        self.last_first_diff = start.elapsed();
        self.last_writes = 0;
        for round in 0..MAX_ROUNDS {
            let back = self.reconcile();
            self.last_writes += back.len();
            if back.is_empty() {
                self.last_rounds = round;
                // Give back the room a large revision (a cold start) made.
                if self.unwritten.capacity() > 64.max(4 * self.unwritten.len()) {
                    self.unwritten.shrink_to(2 * self.unwritten.len());
                }
                if writes.len() + self.last_writes >= COLLECT_AFTER_ROWS {
                    give_back_freed_memory();
                }
                return Ok(());
            }
            self.apply(&back, Writer::WriteBack)?;
        }
        let mut pending: Vec<String> = self.reconcile().into_iter().map(|(k, _)| k).collect();
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
                self.store_output(key, Some(value));
            } else if key.starts_with(REJECTED) {
                self.stored_records.insert(key.clone(), value.clone());
            }
        }
        let diffs = self.engine.apply(self.rev, changes)?;
        let mut touched = Vec::new();
        self.outputs.count(&program, &diffs, &mut touched);
        self.resolve(&program, touched);
        Ok(())
    }

    /// What the store holds at an output key.
    pub fn stored_output(&self, key: &str) -> Option<&String> {
        match self.unwritten.get(key) {
            Some(instead) => instead.as_ref(),
            None => self.outputs.resolved.get(key).map(|d| &**d),
        }
    }

    /// The store's output key `key` now holds `value` (`None`: nothing).
    fn store_output(&mut self, key: &str, value: Option<&String>) {
        if self.outputs.resolved.get(key).map(|d| &**d) == value {
            self.unwritten.remove(key);
        } else {
            self.unwritten.insert(key.to_string(), value.cloned());
        }
    }

    /// Resolves the keys counted diffs touched. A key whose derived value
    /// changes keeps what the store holds in `unwritten` (until written
    /// back); one whose derived value comes to equal the store's leaves it.
    fn resolve(&mut self, program: &Program, mut touched: Vec<String>) {
        let unwritten = &mut self.unwritten;
        // Keys new to `unwritten`, moved out of `touched` afterwards.
        let mut entering = Vec::new();
        self.outputs.resolve_all_noting(program, &touched, |at, key, old, new| match unwritten.get(key) {
            Some(stored) => {
                if stored.as_deref() == new {
                    unwritten.remove(key);
                }
            }
            None => entering.push((at, old.map(Derived::into_value))),
        });
        unwritten.reserve(entering.len());
        for (at, old) in entering {
            unwritten.insert(std::mem::take(&mut touched[at]), old);
        }
    }

    /// One revision: store the writes, run the engine, resolve what it
    /// derives; what then differs from the store is in `unwritten`.
    fn apply(&mut self, writes: &[Write], writer: Writer) -> Result<(), SessionError> {
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
        // workers still run, and resolved once all are in. The store's keys
        // among a large revision's writes are picked out on a thread of
        // their own meanwhile (a small one is not worth a thread).
        let (engine, outputs, unwritten) = (&mut self.engine, &mut self.outputs, &mut self.unwritten);
        let mut touched = Vec::new();
        let evaluate = || engine.apply_streaming(vec![(rev, changes)], |part| outputs.count(&program, &part, &mut touched));
        let program_ref: &Program = &program;
        let store = move || {
            let unwritten = unwritten; // moved in: the closure runs once
            take_writes(program_ref, writes, writer, unwritten)
        };
        let (stored, evaluated) = if writes.len() < STORE_THREAD_WRITES {
            (store(), evaluate())
        } else {
            std::thread::scope(|s| {
                let stored = s.spawn(store);
                let evaluated = evaluate();
                (stored.join().expect("the store's bookkeeping does not panic"), evaluated)
            })
        };
        evaluated?;
        // The store takes the writes before the rules' answer to them.
        for (key, value) in stored {
            if key.starts_with(REJECTED) {
                match value {
                    Some(v) => self.stored_records.insert(key.clone(), v.clone()),
                    None => self.stored_records.remove(key),
                };
            } else {
                self.store_output(key, value.as_ref());
            }
        }
        self.resolve(&program, touched);
        Ok(())
    }

    /// The writes that make the store equal the derived outputs: puts for
    /// missing or different values, deletes for keys nothing derives (a
    /// conflicted key is left as it is).
    fn reconcile(&self) -> Vec<Write> {
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
        // Every key in `unwritten` differs from what is derived.
        for (k, stored) in &self.unwritten {
            match self.outputs.resolved.get(k) {
                Some(v) => writes.push((k.clone(), Some(v.to_string()))),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        let text = "input v(s: name, n: int) from \"v/{s}\"\ninput w(s: name, n: int) from \"w/{s}\"\noutput o(s: name, n: int) to \"o/{s}\"\no(s, n) :- v(s, n).\no(s, n) :- w(s, n).\n";
        let program = ccattler_parser::check_str("t.rules", text).program.expect("valid");
        Session::new(Arc::new(program), 1).expect("starts")
    }

    fn put(k: &str, v: &str) -> Write {
        (k.to_string(), Some(v.to_string()))
    }

    #[test]
    fn the_store_keeps_no_copy_of_keys_that_hold_what_is_derived() {
        let mut s = session();
        s.write(&[put("v/a", "1"), put("v/b", "2")]).unwrap();
        assert_eq!((s.last_writes, s.stored_output("o/a").map(String::as_str)), (2, Some("1")));
        assert!(s.unwritten.is_empty(), "written back: no second copy");

        // A user overwrites a derived key, and writes one nothing derives:
        // the write-back restores the first and deletes the second.
        s.write(&[put("o/a", "9"), put("o/zzz", "x")]).unwrap();
        assert_eq!(s.last_writes, 2);
        assert_eq!(s.stored_output("o/a").map(String::as_str), Some("1"));
        assert_eq!(s.stored_output("o/zzz"), None);

        // What the rules stop deriving is deleted; a new value is written.
        s.write(&[("v/a".to_string(), None), put("v/b", "3")]).unwrap();
        assert_eq!(s.last_writes, 2, "a delete and a put, each written back");
        assert_eq!((s.stored_output("o/a"), s.stored_output("o/b").map(String::as_str)), (None, Some("3")));
        assert!(s.unwritten.is_empty());
    }

    #[test]
    fn a_conflicted_key_is_left_as_the_store_holds_it() {
        let mut s = session();
        s.write(&[put("v/c", "1")]).unwrap();
        s.write(&[put("w/c", "2")]).unwrap();
        assert_eq!(s.conflicts().count(), 1);
        assert_eq!((s.last_writes, s.stored_output("o/c").map(String::as_str)), (0, Some("1")));
        // Nothing derives a value of its own, and the store's is kept.
        s.write(&[("v/c".to_string(), None), put("v/c", "5")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.stored_output("o/c").map(String::as_str), Some("1"));
    }

    #[test]
    fn a_loaded_snapshot_holds_what_it_held_until_written_back() {
        let mut s = session();
        let facts = [("v/a".to_string(), "1".to_string(), 3), ("o/a".to_string(), "5".to_string(), 4), ("o/old".to_string(), "x".to_string(), 4)];
        s.load(4, &facts).unwrap();
        assert_eq!(s.derived().get("o/a").map(|d| d.as_str()), Some("1"));
        assert_eq!(s.stored_output("o/a").map(String::as_str), Some("5"));
        assert_eq!(s.stored_output("o/old").map(String::as_str), Some("x"));
        s.write(&[]).unwrap();
        assert_eq!((s.stored_output("o/a").map(String::as_str), s.stored_output("o/old")), (Some("1"), None));
        assert!(s.unwritten.is_empty());
    }
}
