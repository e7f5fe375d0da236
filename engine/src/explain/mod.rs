//! `ccattler explain`: why a fact holds (its derivation tree, down to the
//! stored keys and their revisions) and why one does not (for every rule that
//! could derive it, which literals fail under which bindings; for an
//! unplaced instance, every reason every node is ruled out).
//!
//! Stages, one file each: [`db`] (the engine's facts, indexed on demand) →
//! [`matcher`] (a rule's compiled plan run with some variables fixed) →
//! [`how`] (proof trees) and [`whynot`] (failure reports) → [`render`]
//! (text). The JSON form is these types serialized; docs/explain.md is its
//! schema.
//!
//! Explanations never decide what holds: the facts come from the engine, and
//! every derivation shown is a match of the same compiled plan the dataflow
//! runs. A derivation of a fact the engine does not hold is an internal error.

pub mod db;
pub mod how;
pub mod matcher;
pub mod render;
pub mod whynot;

use crate::value::{Row, Value};

use ccattler_parser::ast::DeclKind;
use ccattler_parser::program::{Program, RelId};
pub use db::Db;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The JSON schema's name and version (docs/explain.md).
pub const SCHEMA: &str = "ccattler.explain/v1";

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0:?} is not a key any relation of the rules reads or derives")]
    UnknownKey(String),
    #[error("{key:?}: {reason}")]
    BadValue { key: String, reason: String },
    #[error("reading facts: {0}")]
    Facts(String),
}

/// A bound value: a JSON number or string; shown quoted when a string.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Val {
    Int(i64),
    Str(String),
}

impl From<&Value> for Val {
    fn from(v: &Value) -> Val {
        match v {
            Value::Int(n) => Val::Int(*n),
            v => Val::Str(v.text().into_owned()),
        }
    }
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::Int(n) => write!(f, "{n}"),
            Val::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Variable → value.
pub type Bindings = BTreeMap<String, Val>;

/// A rule, as users find it in their files.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuleRef {
    /// `file:line`
    pub location: String,
    pub text: String,
}

impl RuleRef {
    pub fn of(program: &Program, rule: usize) -> RuleRef {
        RuleRef { location: program.rule_location(rule), text: program.rule_text(rule).split_whitespace().collect::<Vec<_>>().join(" ") }
    }
}

/// One node of a derivation tree: a fact, and how it holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Node {
    /// `relation("a", 3)`
    pub fact: String,
    pub relation: String,
    pub tuple: Vec<Val>,
    #[serde(flatten)]
    pub how: How,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum How {
    /// A stored fact: the key, its value and the revision it was written at.
    Input {
        key: String,
        value: String,
        mod_revision: u64,
        /// First key segment: desired, intent, observed, effective, placement, …
        namespace: String,
        /// For `intent/<writer>/…`: the writer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        writer: Option<String>,
    },
    /// Derived by a rule under these bindings, from these premises (one per body literal).
    Rule {
        rule: RuleRef,
        bindings: Bindings,
        premises: Vec<Premise>,
        /// Further derivations of the same fact (not shown).
        other_derivations: usize,
    },
    /// An aggregate: every contribution of its group, and which decided.
    Aggregate {
        rule: RuleRef,
        /// count, sum, min, max, arg_max, arg_min
        aggregate: String,
        contributions: Vec<Contribution>,
    },
    /// Given by the built-in `assign`, from the instance's pending fact, the
    /// node's offer, the service's spread there (if listed), and for a
    /// restricted service its restriction and the node being allowed.
    Assigned { builtin: String, premises: Vec<Node>, note: String },
    /// Explained earlier in this tree.
    Seen,
    /// Not expanded: `--depth` reached.
    Cut,
}

impl Node {
    pub fn fact(&self) -> &str {
        &self.fact
    }
}

/// What one body literal contributed to a derivation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Premise {
    /// A positive atom, matched by this fact.
    Fact { literal: String, proof: Node },
    /// A negated atom: this fact is absent (`_` = any value), and for an
    /// input relation, the key that would hold it.
    Absent {
        literal: String,
        fact: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// A comparison, assignment or range that held.
    Condition { literal: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Contribution {
    pub bindings: Bindings,
    /// The aggregate's argument(s) for this contribution.
    pub value: String,
    /// Whether this contribution decided the result (for min/max/arg_*: the
    /// chosen one; for count/sum: all do).
    pub decides: bool,
    pub premises: Vec<Premise>,
}

/// What `explain` answers for one key.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Explanation {
    pub schema: String,
    pub key: String,
    /// The value asked about (`KEY=VALUE`), if any.
    pub value: Option<String>,
    /// The revision of the facts explained.
    pub revision: u64,
    /// Whether the asked key (and value) is derived.
    pub holds: bool,
    /// The relation the key belongs to, and its `///` doc.
    pub relation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<String>,
    /// One derivation tree per derived fact for the key.
    pub proofs: Vec<Node>,
    /// When it does not hold (and `--why-not` was asked, or always when it
    /// does not hold): why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<whynot::WhyNot>,
}

/// Options of an explanation.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Levels of the tree shown below the asked fact; deeper nodes are cut.
    pub depth: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { depth: 12 }
    }
}

/// The relation a key belongs to (derived relations first) and the pattern
/// of its tuple: columns from the key, the value column from `value` if given.
pub fn target(program: &Program, key: &str, value: Option<&str>) -> Result<(RelId, Vec<Option<Value>>), ExplainError> {
    let mut found = None;
    for kind in [DeclKind::Output, DeclKind::Input] {
        for (rel, r) in program.relations.iter().enumerate().filter(|(_, r)| r.kind == kind) {
            let Some(pattern) = &r.pattern else { continue };
            let Some(parts) = pattern.match_key(key) else { continue };
            let mut row = Vec::with_capacity(r.arity());
            for (i, col) in r.columns.iter().enumerate() {
                let text = match parts[i] {
                    Some(t) => Some(t),
                    None => value,
                };
                row.push(match text {
                    Some(t) => Some(
                        Value::parse(col.ty, t)
                            .map_err(|e| ExplainError::BadValue { key: key.into(), reason: format!("`{}` of {}: {e}", col.name, r.name) })?,
                    ),
                    None => None,
                });
            }
            found = Some((rel, row));
            break;
        }
        if found.is_some() {
            break;
        }
    }
    found.ok_or_else(|| ExplainError::UnknownKey(key.into()))
}

/// Explains a key (and optionally one value of it) over the facts in `db`.
pub fn explain(db: &Db, key: &str, value: Option<&str>, why_not: bool, opts: Options) -> Result<Explanation, ExplainError> {
    let (rel, pattern) = target(db.program, key, value)?;
    let fixed: Vec<(usize, Value)> = pattern.iter().enumerate().filter_map(|(i, v)| v.clone().map(|v| (i, v))).collect();
    let (pos, vals): (Vec<usize>, Vec<Value>) = fixed.iter().cloned().unzip();
    let facts: Vec<Row> = db.lookup(rel, &pos, &vals).map_err(ExplainError::Facts)?;
    let holds = !facts.is_empty();
    // KEY=VALUE that does not hold: show what the key holds instead.
    let shown = if holds || value.is_none() {
        facts
    } else {
        let (key_pos, key_vals): (Vec<usize>, Vec<Value>) =
            fixed.iter().cloned().filter(|(i, _)| db.program.relations[rel].pattern.as_ref().is_none_or(|p| p.value_column != Some(*i))).unzip();
        db.lookup(rel, &key_pos, &key_vals).map_err(ExplainError::Facts)?
    };
    let mut proofs = Vec::new();
    let mut prover = how::Prover::new(db, opts);
    for row in &shown {
        proofs.push(prover.prove(rel, row).map_err(ExplainError::Facts)?);
    }
    let why_not = if !holds && why_not { Some(whynot::why_not(db, rel, &pattern, opts).map_err(ExplainError::Facts)?) } else { None };
    let r = &db.program.relations[rel];
    Ok(Explanation {
        schema: SCHEMA.into(),
        key: key.into(),
        value: value.map(str::to_string),
        revision: db.revision,
        holds,
        relation: r.name.clone(),
        doc: r.doc.clone(),
        proofs,
        why_not,
    })
}

/// A rule's named variables and their values (unbound ones left out).
pub fn bindings(program: &Program, rule: usize, b: &[Option<Value>]) -> Bindings {
    let vars = &program.rules[rule].vars;
    vars.iter().zip(b).filter_map(|((name, _), v)| Some((name.clone(), Val::from(v.as_ref()?)))).collect()
}

/// The key of an input pattern, `*` for columns it leaves open.
pub fn pattern_key(program: &Program, rel: RelId, pattern: &[Option<Value>]) -> Option<String> {
    let cols: Vec<String> = pattern.iter().map(|v| v.clone().map_or("*".to_string(), |v| v.to_string())).collect();
    Some(program.relations[rel].pattern.as_ref()?.render(&cols))
}

/// `rel("a", 3, _)`: a fact or pattern as users read it.
pub fn fact_text(program: &Program, rel: RelId, row: &[Option<Value>]) -> String {
    let r = &program.relations[rel];
    let args: Vec<String> = row.iter().map(|v| v.clone().map_or("_".to_string(), |v| value_text(&v))).collect();
    format!("{}({})", r.name, args.join(", "))
}

pub fn row_text(program: &Program, rel: RelId, row: &[Value]) -> String {
    fact_text(program, rel, &row.iter().cloned().map(Some).collect::<Vec<_>>())
}

/// Strings quoted, numbers bare.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::Int(n) => n.to_string(),
        v => format!("{:?}", v.text()),
    }
}
