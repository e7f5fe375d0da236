//! etcd keys and values ⇄ tuples. Inputs: a key enters every input relation
//! whose pattern it matches, or none if its value does not fit (rejected, with
//! the reason). Outputs: tuples become keys; two values for one key conflict.

use crate::runtime::Change;
use crate::value::{Row, Value};
use ccattler_parser::ast::DeclKind;
use ccattler_parser::program::{Program, RelId};
use std::collections::{BTreeMap, HashMap};

/// Values larger than this are rejected.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// Why an input fact was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub key: String,
    pub reason: String,
}

/// Decodes a key/value into the tuples of every input relation it matches.
/// `Ok(vec![])` means no pattern matches (the key is not an input).
pub fn decode(program: &Program, key: &str, value: &str) -> Result<Vec<(RelId, Row)>, Rejection> {
    let reject = |reason: String| Rejection { key: key.to_string(), reason };
    if value.len() > MAX_VALUE_BYTES {
        return Err(reject(format!("value is {} bytes, over the {} byte limit", value.len(), MAX_VALUE_BYTES)));
    }
    let mut out = Vec::new();
    for (rel, r) in program.inputs() {
        let Some(pattern) = &r.pattern else { continue };
        let Some(parts) = pattern.match_key(key) else { continue };
        let mut row = Vec::with_capacity(r.arity());
        for (i, col) in r.columns.iter().enumerate() {
            let text = parts[i].unwrap_or(value);
            let v = Value::parse(col.ty, text).map_err(|e| {
                let what = if Some(i) == pattern.value_column { "value".to_string() } else { format!("key segment `{}`", col.name) };
                reject(format!("{what} of `{}`: {e}", r.name))
            })?;
            row.push(v);
        }
        out.push((rel, row));
    }
    Ok(out)
}

/// The tuple of one input relation a stored key/value gives, if its pattern
/// matches (a stored fact decoded when it was stored, so its values parse).
fn decode_one(program: &Program, rel: RelId, key: &str, value: &str) -> Option<Row> {
    let r = &program.relations[rel];
    let parts = r.pattern.as_ref()?.match_key(key)?;
    r.columns.iter().enumerate().map(|(i, col)| Value::parse(col.ty, parts[i].unwrap_or(value)).ok()).collect()
}

/// One stored fact: its value and the revision it was last written at. (Its
/// tuples are not kept: decoding is deterministic, so a delete decodes again.)
#[derive(Clone, Debug)]
pub struct Fact {
    pub value: String,
    pub mod_revision: u64,
}

/// The input side's view of the store: every key an input pattern matches.
#[derive(Default)]
pub struct InputFacts {
    pub facts: BTreeMap<String, Fact>,
    pub rejected: BTreeMap<String, String>,
}

impl InputFacts {
    /// Records `key = value` at `rev`; returns the tuple changes it causes.
    pub fn put(&mut self, program: &Program, key: &str, value: &str, rev: u64, out: &mut Vec<Change>) {
        let decoded = decode(program, key, value);
        self.remove(program, key, out);
        match decoded {
            Ok(tuples) if tuples.is_empty() => {}
            Ok(tuples) => {
                out.extend(tuples.into_iter().map(|(rel, row)| (rel, row, 1)));
                self.facts.insert(key.to_string(), Fact { value: value.to_string(), mod_revision: rev });
            }
            Err(r) => {
                self.rejected.insert(r.key, r.reason);
            }
        }
    }

    pub fn delete(&mut self, program: &Program, key: &str, out: &mut Vec<Change>) {
        self.remove(program, key, out);
    }

    fn remove(&mut self, program: &Program, key: &str, out: &mut Vec<Change>) {
        self.rejected.remove(key);
        if let Some(old) = self.facts.remove(key) {
            // It decoded when it was stored, and decoding is deterministic.
            let tuples = decode(program, key, &old.value).unwrap_or_default();
            out.extend(tuples.into_iter().map(|(rel, row)| (rel, row, -1)));
        }
    }

    /// The current tuples of an input relation, decoded from the stored facts.
    pub fn tuples(&self, program: &Program, rel: RelId) -> Vec<Row> {
        self.tuples_matching(program, rel, &[])
    }

    /// The tuples of an input relation with the given values at the given
    /// columns: a range of the stored keys, not a scan of the relation.
    pub fn tuples_matching(&self, program: &Program, rel: RelId, bound: &[(usize, Value)]) -> Vec<Row> {
        let Some(pattern) = &program.relations[rel].pattern else { return Vec::new() };
        let prefix = pattern.prefix_with(|c| bound.iter().find(|(p, _)| *p == c).map(|(_, v)| v.to_string()));
        self.facts
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, f)| decode_one(program, rel, k, &f.value))
            .filter(|row| bound.iter().all(|(p, v)| row[*p] == *v))
            .collect()
    }
}

/// A derived key with more than one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub key: String,
    /// Each value with the rules that derived it (`file:line`).
    pub values: Vec<(String, Vec<String>)>,
}

/// The output side: every derived tuple, grouped by the key it renders to.
#[derive(Default)]
pub struct OutputFacts {
    /// key → candidate value → rule → count of tuples giving it
    candidates: HashMap<String, BTreeMap<String, BTreeMap<usize, isize>>>,
    /// What the rules derive now, one value per key (conflicted keys keep their
    /// last unique value, or are absent if they never had one).
    pub resolved: BTreeMap<String, String>,
    pub conflicts: BTreeMap<String, Conflict>,
}

/// Whether some output pattern can produce `key` (so the controller manages it).
pub fn is_output_key(program: &Program, key: &str) -> bool {
    program.outputs().any(|(_, r)| r.pattern.as_ref().is_some_and(|p| p.match_key(key).is_some()))
}

/// Renders an output tuple as its key and value.
pub fn encode(program: &Program, rel: RelId, row: &[Value]) -> Option<(String, String)> {
    let r = &program.relations[rel];
    let pattern = r.pattern.as_ref()?;
    let cols: Vec<String> = row.iter().map(|v| v.to_string()).collect();
    let value = pattern.value_column.map(|c| cols[c].clone()).unwrap_or_default();
    Some((pattern.render(&cols), value))
}

impl OutputFacts {
    /// Applies output tuple diffs (rows prefixed with their rule id, as
    /// [`crate::Engine::apply`] returns them); returns every key they touched
    /// (its resolved value or its conflict may have changed).
    pub fn apply(&mut self, program: &Program, diffs: &[Change]) -> Vec<String> {
        let mut touched = Vec::new();
        for (rel, tagged, d) in diffs {
            if program.relations[*rel].kind != DeclKind::Output {
                continue;
            }
            let Some((Value::Int(rule), row)) = tagged.split_first() else { continue };
            let Some((key, value)) = encode(program, *rel, row) else { continue };
            let cands = self.candidates.entry(key.clone()).or_default();
            let rules = cands.entry(value.clone()).or_default();
            let count = rules.entry(*rule as usize).or_insert(0);
            *count += d;
            if *count == 0 {
                rules.remove(&(*rule as usize));
            }
            if rules.is_empty() {
                cands.remove(&value);
            }
            if cands.is_empty() {
                self.candidates.remove(&key);
            }
            touched.push(key);
        }
        touched.sort();
        touched.dedup();
        for key in &touched {
            match self.candidates.get(key) {
                None => {
                    self.resolved.remove(key);
                    self.conflicts.remove(key);
                }
                Some(c) if c.len() == 1 => {
                    let v = c.keys().next().expect("one candidate").clone();
                    self.resolved.insert(key.clone(), v);
                    self.conflicts.remove(key);
                }
                Some(c) => {
                    let values = c.iter().map(|(v, rules)| (v.clone(), rules.keys().map(|r| program.rule_location(*r)).collect())).collect();
                    self.conflicts.insert(key.clone(), Conflict { key: key.clone(), values });
                }
            }
        }
        touched
    }
}
