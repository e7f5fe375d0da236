//! The facts an explanation reads: every relation's current tuples as the
//! engine holds them (inputs as decoded from the stored keys, derived
//! relations from the engine's arrangements), loaded on first use and
//! indexed by whichever columns a rule step binds.

use crate::facts::{Fact, InputFacts};
use crate::value::{Row, Value};
use ccattler_parser::ast::DeclKind;
use ccattler_parser::program::{Program, RelId};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

/// Reads one relation's tuples (the engine's query).
pub type Source<'a> = Box<dyn Fn(RelId) -> Result<Vec<Row>, String> + 'a>;

struct Loaded {
    rows: Rc<Vec<Row>>,
    set: HashSet<Row>,
    /// bound positions → values at them → row indexes
    indexes: HashMap<Vec<usize>, Rc<HashMap<Vec<Value>, Vec<usize>>>>,
}

pub struct Db<'a> {
    pub program: &'a Program,
    pub inputs: &'a InputFacts,
    /// The revision the facts are at.
    pub revision: u64,
    source: Source<'a>,
    loaded: RefCell<HashMap<RelId, Loaded>>,
}

impl<'a> Db<'a> {
    pub fn new(program: &'a Program, inputs: &'a InputFacts, revision: u64, source: Source<'a>) -> Db<'a> {
        Db { program, inputs, revision, source, loaded: RefCell::new(HashMap::new()) }
    }

    /// From an offline session (facts file, or a snapshot loaded into one).
    pub fn of_session(s: &'a crate::Session) -> Db<'a> {
        Db::new(s.program(), &s.inputs, s.revision(), Box::new(move |rel| s.query(rel).map_err(|e| e.to_string())))
    }

    fn load(&self, rel: RelId) -> Result<(), String> {
        if self.loaded.borrow().contains_key(&rel) {
            return Ok(());
        }
        let rows = (self.source)(rel)?;
        let set = rows.iter().cloned().collect();
        self.loaded.borrow_mut().insert(rel, Loaded { rows: Rc::new(rows), set, indexes: HashMap::new() });
        Ok(())
    }

    pub fn rows(&self, rel: RelId) -> Result<Rc<Vec<Row>>, String> {
        self.load(rel)?;
        Ok(self.loaded.borrow()[&rel].rows.clone())
    }

    pub fn contains(&self, rel: RelId, row: &[Value]) -> Result<bool, String> {
        self.load(rel)?;
        Ok(self.loaded.borrow()[&rel].set.contains(row))
    }

    /// Rows whose values at `positions` equal `values`.
    pub fn lookup(&self, rel: RelId, positions: &[usize], values: &[Value]) -> Result<Vec<Row>, String> {
        let rows = self.rows(rel)?;
        if positions.is_empty() {
            return Ok(rows.to_vec());
        }
        let index = {
            let mut loaded = self.loaded.borrow_mut();
            let l = loaded.get_mut(&rel).expect("loaded above");
            l.indexes
                .entry(positions.to_vec())
                .or_insert_with(|| {
                    let mut ix: HashMap<Vec<Value>, Vec<usize>> = HashMap::new();
                    for (i, r) in rows.iter().enumerate() {
                        ix.entry(positions.iter().map(|p| r[*p]).collect()).or_default().push(i);
                    }
                    Rc::new(ix)
                })
                .clone()
        };
        Ok(index.get(values).map(|ids| ids.iter().map(|i| rows[*i].clone()).collect()).unwrap_or_default())
    }

    pub fn is_input(&self, rel: RelId) -> bool {
        self.program.relations[rel].kind == DeclKind::Input
    }

    /// The stored key (and fact) an input tuple comes from.
    pub fn input_key(&self, rel: RelId, row: &[Value]) -> Option<(String, &'a Fact)> {
        let r = &self.program.relations[rel];
        let pattern = r.pattern.as_ref()?;
        let cols: Vec<String> = row.iter().map(|v| v.to_string()).collect();
        let key = pattern.render(&cols);
        let fact = self.inputs.facts.get(&key)?;
        let value_ok = pattern.value_column.is_none_or(|c| Value::parse(r.columns[c].ty, &fact.value).ok() == Some(row[c]));
        value_ok.then_some((key, fact))
    }

    /// Every value that appears in a column named `column` of any relation:
    /// the "nodes" of a why-not summary are everything in a `node` column.
    pub fn domain(&self, column: &str) -> Result<Vec<Value>, String> {
        let mut seen = BTreeMap::new();
        for (rel, r) in self.program.relations.iter().enumerate() {
            let Some(pos) = r.columns.iter().position(|c| c.name == column) else { continue };
            for row in self.rows(rel)?.iter() {
                seen.entry(row[pos].to_string()).or_insert(row[pos]);
            }
        }
        Ok(seen.into_values().collect())
    }
}
