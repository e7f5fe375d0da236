//! An offline session: a key/value store standing in for etcd, the engine, and
//! the write-back loop, run to a fixed point. `eval`, `test` and `explain
//! --facts` use it, so offline results are the controller's results.

use crate::facts::{Conflict, InputFacts, OutputFacts};
use crate::runtime::{Engine, EngineError};
use ccattler_parser::program::Program;
use std::collections::BTreeMap;
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

pub struct Session {
    engine: Engine,
    /// The simulated store: every key, input or output.
    pub store: BTreeMap<String, (String, u64)>,
    pub inputs: InputFacts,
    pub outputs: OutputFacts,
    rev: u64,
}

impl Session {
    pub fn new(program: Arc<Program>, workers: usize) -> Result<Session, SessionError> {
        Ok(Session { engine: Engine::start(program, workers)?, store: BTreeMap::new(), inputs: InputFacts::default(), outputs: OutputFacts::default(), rev: 0 })
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

    /// Writes (Some) or deletes (None) keys in one revision, then settles.
    pub fn write(&mut self, changes: &[(String, Option<String>)]) -> Result<(), SessionError> {
        self.rev += 1;
        let rev = self.rev;
        let program = self.engine.program().clone();
        let mut tuple_changes = Vec::new();
        for (key, value) in changes {
            match value {
                Some(v) => {
                    self.store.insert(key.clone(), (v.clone(), rev));
                    self.inputs.put(&program, key, v, rev, &mut tuple_changes);
                }
                None => {
                    self.store.remove(key);
                    self.inputs.delete(key, &mut tuple_changes);
                }
            }
        }
        let diffs = self.engine.apply(rev, tuple_changes)?;
        self.outputs.apply(&program, &diffs);
        self.settle()
    }

    /// Writes what the rules derive back into the store (as the bridge does)
    /// until the store holds exactly the derived outputs.
    fn settle(&mut self) -> Result<(), SessionError> {
        for _ in 0..MAX_ROUNDS {
            let writes = self.reconcile();
            if writes.is_empty() {
                return Ok(());
            }
            self.rev += 1;
            let rev = self.rev;
            let program = self.engine.program().clone();
            let mut tuple_changes = Vec::new();
            for (key, value) in &writes {
                match value {
                    Some(v) => {
                        self.store.insert(key.clone(), (v.clone(), rev));
                        self.inputs.put(&program, key, v, rev, &mut tuple_changes);
                    }
                    None => {
                        self.store.remove(key);
                        self.inputs.delete(key, &mut tuple_changes);
                    }
                }
            }
            let diffs = self.engine.apply(rev, tuple_changes)?;
            self.outputs.apply(&program, &diffs);
        }
        let pending: Vec<String> = self.reconcile().into_iter().take(5).map(|(k, _)| k).collect();
        Err(SessionError::NoFixedPoint(pending.join(", ")))
    }

    /// The writes that make the store's output keys equal the derived outputs:
    /// puts for missing or different values, deletes for keys nothing derives.
    pub fn reconcile(&self) -> Vec<(String, Option<String>)> {
        let program = self.engine.program();
        let is_output_key = |k: &str| {
            program.outputs().any(|(_, r)| r.pattern.as_ref().is_some_and(|p| p.match_key(k).is_some()))
        };
        let mut writes = Vec::new();
        for (k, v) in &self.outputs.resolved {
            if self.store.get(k).map(|(sv, _)| sv) != Some(v) {
                writes.push((k.clone(), Some(v.clone())));
            }
        }
        for k in self.store.keys() {
            if is_output_key(k) && !self.outputs.resolved.contains_key(k) && !self.outputs.conflicts.contains_key(k) {
                writes.push((k.clone(), None));
            }
        }
        writes
    }

    /// Every derived key and value, sorted by key.
    pub fn derived(&self) -> &BTreeMap<String, String> {
        &self.outputs.resolved
    }
    pub fn rejected(&self) -> &BTreeMap<String, String> {
        &self.inputs.rejected
    }
    pub fn conflicts(&self) -> impl Iterator<Item = &Conflict> {
        self.outputs.conflicts.values()
    }
}
