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
/// Reads the tuples of a relation with given values at given columns, when
/// it can do so without reading the whole relation (None: it cannot).
pub type Lookup<'a> = Box<dyn Fn(RelId, &[(usize, Value)]) -> Option<Result<Vec<Row>, String>> + 'a>;

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
    some: Option<Lookup<'a>>,
    loaded: RefCell<HashMap<RelId, Loaded>>,
    /// Keyed lookups answered without loading the relation.
    looked_up: RefCell<HashMap<(RelId, Vec<(usize, Value)>), Rc<Vec<Row>>>>,
    /// Keyed reads per relation: past [`KEYED_READS`], loading it whole and
    /// indexing it is cheaper (a why-not across thousands of nodes).
    reads: RefCell<HashMap<RelId, usize>>,
    /// Each rule as users see it, and its body literals' text (made once).
    texts: std::cell::OnceCell<Vec<(super::RuleRef, Vec<String>)>>,
}

/// Keyed reads of one relation before it is loaded whole instead.
const KEYED_READS: usize = 64;

impl<'a> Db<'a> {
    pub fn new(program: &'a Program, inputs: &'a InputFacts, revision: u64, source: Source<'a>, some: Option<Lookup<'a>>) -> Db<'a> {
        Db {
            program,
            inputs,
            revision,
            source,
            some,
            loaded: RefCell::new(HashMap::new()),
            looked_up: RefCell::new(HashMap::new()),
            reads: RefCell::new(HashMap::new()),
            texts: std::cell::OnceCell::new(),
        }
    }

    /// Over an engine and the input facts that feed it: keyed lookups seek
    /// in the engine's arrangements (leading columns) or range over the
    /// stored keys, so an explanation reads what it needs, not every relation.
    pub fn over_engine(program: &'a Program, inputs: &'a InputFacts, revision: u64, engine: &'a dyn crate::runtime::Reads) -> Db<'a> {
        let all: Source<'a> = Box::new(move |rel| {
            if program.relations[rel].kind == DeclKind::Input {
                return Ok(inputs.tuples(program, rel));
            }
            engine.query(rel).map_err(|e| e.to_string())
        });
        let some: Lookup<'a> = Box::new(move |rel, bound| {
            if program.relations[rel].kind == DeclKind::Input {
                return Some(Ok(inputs.tuples_matching(program, rel, bound)));
            }
            // The arrangement is ordered by whole rows: seek the bound leading columns.
            let lead: Vec<Value> = (0..).map_while(|c| bound.iter().find(|(p, _)| *p == c).map(|(_, v)| v.clone())).collect();
            if lead.is_empty() {
                return None;
            }
            Some(engine.lookup(rel, &lead).map(|rows| rows.into_iter().filter(|r| bound.iter().all(|(p, v)| r[*p] == *v)).collect()).map_err(|e| e.to_string()))
        });
        Db::new(program, inputs, revision, all, Some(some))
    }

    /// From an offline session (facts file, or a snapshot loaded into one).
    pub fn of_session(s: &'a crate::Session) -> Db<'a> {
        Db::over_engine(s.program(), &s.inputs, s.revision(), s.engine())
    }

    fn load(&self, rel: RelId) -> Result<(), String> {
        if self.loaded.borrow().contains_key(&rel) {
            return Ok(());
        }
        // In the order users read (the engine's own order of strings is
        // arbitrary), so an explanation reads the same every time.
        let mut rows = (self.source)(rel)?;
        rows.sort_by(|a, b| crate::value::cmp_rows(a, b));
        let set = rows.iter().cloned().collect();
        self.loaded.borrow_mut().insert(rel, Loaded { rows: Rc::new(rows), set, indexes: HashMap::new() });
        Ok(())
    }

    pub fn rows(&self, rel: RelId) -> Result<Rc<Vec<Row>>, String> {
        self.load(rel)?;
        Ok(self.loaded.borrow()[&rel].rows.clone())
    }

    pub fn contains(&self, rel: RelId, row: &[Value]) -> Result<bool, String> {
        if !self.loaded.borrow().contains_key(&rel) && self.some.is_some() {
            let all: Vec<usize> = (0..row.len()).collect();
            return Ok(self.lookup(rel, &all, row)?.iter().any(|r| r.as_slice() == row));
        }
        self.load(rel)?;
        Ok(self.loaded.borrow()[&rel].set.contains(row))
    }

    /// Rows whose values at `positions` equal `values`.
    pub fn lookup(&self, rel: RelId, positions: &[usize], values: &[Value]) -> Result<Vec<Row>, String> {
        // Not loaded: a keyed read, if the source can do one (and it has not
        // been asked so often that a whole load is cheaper).
        let reads = {
            let mut r = self.reads.borrow_mut();
            let n = r.entry(rel).or_default();
            *n += 1;
            *n
        };
        if !positions.is_empty() && reads <= KEYED_READS && !self.loaded.borrow().contains_key(&rel) {
            if let Some(some) = &self.some {
                let bound: Vec<(usize, Value)> = positions.iter().cloned().zip(values.iter().cloned()).collect();
                if let Some(rows) = self.looked_up.borrow().get(&(rel, bound.clone())) {
                    return Ok(rows.to_vec());
                }
                if let Some(rows) = some(rel, &bound) {
                    let mut rows = rows?;
                    rows.sort_by(|a, b| crate::value::cmp_rows(a, b));
                    let rows = Rc::new(rows);
                    self.looked_up.borrow_mut().insert((rel, bound), rows.clone());
                    return Ok(rows.to_vec());
                }
            }
        }
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
                        ix.entry(positions.iter().map(|p| r[*p].clone()).collect()).or_default().push(i);
                    }
                    Rc::new(ix)
                })
                .clone()
        };
        Ok(index.get(values).map(|ids| ids.iter().map(|i| rows[*i].clone()).collect()).unwrap_or_default())
    }

    fn texts(&self) -> &[(super::RuleRef, Vec<String>)] {
        self.texts.get_or_init(|| {
            let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            self.program
                .rules
                .iter()
                .map(|r| (super::RuleRef::of(self.program, r.id), r.body.iter().map(|l| words(self.program.sources.slice(l.span))).collect()))
                .collect()
        })
    }

    /// A rule's location and text.
    pub fn rule_ref(&self, rule: usize) -> super::RuleRef {
        self.texts()[rule].0.clone()
    }

    /// The text of a rule's `i`-th body literal.
    pub fn literal(&self, rule: usize, i: usize) -> String {
        self.texts()[rule].1[i].clone()
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
        let value_ok = pattern.value_column.is_none_or(|c| Value::parse(r.columns[c].ty, &fact.value).ok() == Some(row[c].clone()));
        value_ok.then_some((key, fact))
    }

    /// Every value in a first column named `column` of an input relation:
    /// the "nodes" of a why-not summary are every node the stored facts
    /// about nodes (`node_cpu(node, …)`, …) name. (Derived relations hold
    /// no value their inputs or rules do not.)
    pub fn domain(&self, column: &str) -> Result<Vec<Value>, String> {
        let mut seen = BTreeMap::new();
        for (rel, r) in self.program.inputs() {
            if r.columns.first().is_none_or(|c| c.name != column) {
                continue;
            }
            for row in self.rows(rel)?.iter() {
                seen.entry(row[0].to_string()).or_insert(row[0].clone());
            }
        }
        Ok(seen.into_values().collect())
    }
}
