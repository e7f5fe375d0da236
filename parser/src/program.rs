//! The checked program: relations resolved to ids, variables to slots, types
//! known, rule bodies in evaluation order, and strata. This is the interface
//! the engine compiles from.

use crate::ast::{AggKind, BinOp, CmpOp, DeclKind, Type};
use crate::pattern::{KeyPattern, Segment};
use crate::source::{Sources, Span};
use std::collections::HashMap;

pub type RelId = usize;
pub type VarId = usize;
pub type RuleId = usize;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Const {
    Int(i64),
    Str(String),
}

#[derive(Clone, Debug)]
pub struct ColumnDef {
    pub name: String,
    pub ty: Type,
    /// A named type's refinement (`bool`, or one declared with `type`).
    pub constraint: Option<std::sync::Arc<Constraint>>,
}

/// A named refinement of `int` or `string`: input values must fit it, and so
/// must the constants rules compare its columns with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    pub name: String,
    pub kind: ConstraintKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConstraintKind {
    /// An int in `lo..=hi` (`hi` None: no upper bound).
    IntRange { lo: i64, hi: Option<i64> },
    /// One of these strings, in declaration order.
    Enum(Vec<String>),
}

impl Constraint {
    /// The built-in `bool`: `true` or `false`.
    pub fn bool() -> Constraint {
        Constraint { name: "bool".into(), kind: ConstraintKind::Enum(vec!["true".into(), "false".into()]) }
    }

    /// What the type admits, as users write it: `int in 0..=100`, `"a" | "b"`.
    pub fn describe(&self) -> String {
        match &self.kind {
            ConstraintKind::IntRange { lo, hi: Some(hi) } => format!("int in {lo}..={hi}"),
            ConstraintKind::IntRange { lo, hi: None } => format!("int in {lo}.."),
            ConstraintKind::Enum(values) => values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(" | "),
        }
    }

    /// Why an int does not fit, if it does not.
    pub fn check_int(&self, n: i64) -> Result<(), String> {
        match &self.kind {
            ConstraintKind::IntRange { lo, hi } if n < *lo || hi.is_some_and(|h| n > h) => Err(format!("{n} is not a {} ({})", self.name, self.describe())),
            _ => Ok(()),
        }
    }

    /// Why a text does not fit, if it does not.
    pub fn check_text(&self, s: &str) -> Result<(), String> {
        match &self.kind {
            ConstraintKind::Enum(values) if !values.iter().any(|v| v == s) => Err(format!("{s:?} is not a {} ({})", self.name, self.describe())),
            _ => Ok(()),
        }
    }

    /// Why a constant does not fit, if it does not.
    pub fn check_const(&self, c: &Const) -> Result<(), String> {
        match c {
            Const::Int(n) => self.check_int(*n),
            Const::Str(s) => self.check_text(s),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Relation {
    pub name: String,
    pub kind: DeclKind,
    pub columns: Vec<ColumnDef>,
    /// `from` pattern of an input, `to` pattern of an output.
    pub pattern: Option<KeyPattern>,
    /// Set when a built-in, not rules, computes this relation.
    pub builtin: Option<Builtin>,
    /// Its `///` doc comment.
    pub doc: Option<String>,
    pub span: Span,
}

/// Relations computed by a built-in operator instead of rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// `assign(pending, need, …, preference, apart)`: capacity-respecting greedy
    /// assignment of instances to nodes (docs/language.md). Its arguments,
    /// in the order of [`ASSIGN`].
    Assign(Vec<RelId>),
    /// `preempt(preemptor, need, room, victim, budget, …)`: which
    /// lower-priority instances to evict so that instances no node had room
    /// for fit (docs/language.md). Its arguments, in the order of [`PREEMPT`].
    Preempt(Vec<RelId>),
}

impl Builtin {
    pub fn reads(&self) -> Vec<RelId> {
        match self {
            Builtin::Assign(args) | Builtin::Preempt(args) => args.clone(),
        }
    }
    /// The relation given for argument `arg` (an index into its signature).
    pub fn arg(&self, arg: usize) -> RelId {
        match self {
            Builtin::Assign(args) | Builtin::Preempt(args) => args[arg],
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            Builtin::Assign(_) => "assign",
            Builtin::Preempt(_) => "preempt",
        }
    }
}

/// A built-in: its name, its arguments, the columns of the relation it
/// computes, and how to make it from the argument relations.
pub struct BuiltinSig {
    pub name: &'static str,
    pub args: &'static [BuiltinArg],
    pub result: &'static [(&'static str, Type)],
    pub make: fn(Vec<RelId>) -> Builtin,
}

/// Every built-in.
pub const BUILTINS: &[BuiltinSig] = &[
    BuiltinSig { name: "assign", args: ASSIGN, result: &[("instance", Type::Name), ("node", Type::Name)], make: Builtin::Assign },
    BuiltinSig {
        name: "preempt",
        args: PREEMPT,
        result: &[("victim", Type::Name), ("preemptor", Type::Name), ("budget", Type::String)],
        make: Builtin::Preempt,
    },
];

/// `name(arg, …)` as users write it.
pub fn builtin_call(sig: &BuiltinSig) -> String {
    format!("{}({})", sig.name, sig.args.iter().map(|a| a.role).collect::<Vec<_>>().join(", "))
}

/// The arguments of `preempt`, in order.
pub const PREEMPT: &[BuiltinArg] = &[
    BuiltinArg {
        role: "preemptor",
        columns: &[("instance", Type::Name), ("service", Type::Name), ("priority", Type::Int)],
        doc: "instances no node had room for, that may evict lower-priority ones",
    },
    BuiltinArg {
        role: "request",
        columns: &[("service", Type::Name), ("resource", Type::Name), ("amount", Type::Int)],
        doc: "what each instance of a service asks for, per resource (preemptors' and victims' services)",
    },
    BuiltinArg {
        role: "room",
        columns: &[("node", Type::Name), ("resource", Type::Name), ("free", Type::Int), ("total", Type::Int)],
        doc: "what each offered node has left of each resource",
    },
    BuiltinArg {
        role: "victim",
        columns: &[("instance", Type::Name), ("node", Type::Name), ("service", Type::Name), ("priority", Type::Int)],
        doc: "instances that may be evicted, where they run, and their priority",
    },
    BuiltinArg {
        role: "budget",
        columns: &[("service", Type::Name), ("spare", Type::Int)],
        doc: "how many instances of a service may be evicted (unlisted: any)",
    },
    RESTRICTED,
    ALLOWED,
    RESERVED,
    ADMITTED,
    BuiltinArg { role: "strict", columns: &[("service", Type::Name)], doc: "services whose budget is never broken (others' only as a last resort)" },
];

// Where a service may run: the same four arguments for both built-ins.
const RESTRICTED: BuiltinArg =
    BuiltinArg { role: "restricted", columns: &[("service", Type::Name)], doc: "services that may use only the nodes `allowed` lists" };
const ALLOWED: BuiltinArg =
    BuiltinArg { role: "allowed", columns: &[("service", Type::Name), ("node", Type::Name)], doc: "where a restricted service may run" };
const RESERVED: BuiltinArg = BuiltinArg {
    role: "reserved",
    columns: &[("node", Type::Name), ("reason", Type::String)],
    doc: "nodes only the services `admitted` lists may use, and why (a taint, named for the why-not)",
};
const ADMITTED: BuiltinArg = BuiltinArg {
    role: "admitted",
    columns: &[("service", Type::Name), ("node", Type::Name)],
    doc: "a service that may use a reserved node (it tolerates its taints)",
};

/// Positions of `preempt`'s arguments in [`PREEMPT`].
pub mod preempt_arg {
    pub const PREEMPTOR: usize = 0;
    pub const NEED: usize = 1;
    pub const ROOM: usize = 2;
    pub const VICTIM: usize = 3;
    pub const BUDGET: usize = 4;
    pub const RESTRICTED: usize = 5;
    pub const ALLOWED: usize = 6;
    pub const RESERVED: usize = 7;
    pub const ADMITTED: usize = 8;
    pub const STRICT: usize = 9;
}

/// One argument of a built-in: its role, the columns it needs (text columns
/// take `name` or `string`) and what its rows mean. The one declaration the
/// checker checks against, the dataflow tags rows by (position), the
/// built-in reads, and explain names premises by.
#[derive(Debug)]
pub struct BuiltinArg {
    pub role: &'static str,
    pub columns: &'static [(&'static str, Type)],
    pub doc: &'static str,
}

/// The arguments of `assign`, in order.
pub const ASSIGN: &[BuiltinArg] = &[
    BuiltinArg {
        role: "pending",
        columns: &[("instance", Type::Name), ("service", Type::Name), ("priority", Type::Int)],
        doc: "instances waiting for a node; higher priority first",
    },
    BuiltinArg {
        role: "need",
        columns: &[("service", Type::Name), ("resource", Type::Name), ("amount", Type::Int)],
        doc: "what each instance of a service asks for, per resource (unlisted: 0)",
    },
    BuiltinArg {
        role: "offer",
        columns: &[("node", Type::Name), ("score", Type::Int)],
        doc: "the nodes that take instances and their preference (lower first)",
    },
    BuiltinArg {
        role: "room",
        columns: &[("node", Type::Name), ("resource", Type::Name), ("free", Type::Int), ("total", Type::Int)],
        doc: "what an offered node has left of each resource, and its total (unlisted: none)",
    },
    BuiltinArg {
        role: "spread",
        columns: &[("service", Type::Name), ("node", Type::Name), ("count", Type::Int)],
        doc: "instances of the service already on the node (fewer first)",
    },
    RESTRICTED,
    ALLOWED,
    RESERVED,
    ADMITTED,
    BuiltinArg {
        role: "hard_spread",
        columns: &[("service", Type::Name), ("key", Type::Name), ("max_skew", Type::Int)],
        doc: "services whose instances per topology domain may differ by at most max_skew",
    },
    BuiltinArg {
        role: "topology",
        columns: &[("node", Type::Name), ("key", Type::Name), ("domain", Type::String)],
        doc: "the domain of a node for a topology key (its label's value)",
    },
    BuiltinArg { role: "packed", columns: &[("service", Type::Name)], doc: "services placed most-allocated first (bin-packing) instead of least-allocated" },
    BuiltinArg {
        role: "preference",
        columns: &[("service", Type::Name), ("node", Type::Name), ("points", Type::Int)],
        doc: "points added to a node's score for one service only (lower first; e.g. a PreferNoSchedule taint it does not tolerate)",
    },
    BuiltinArg {
        role: "apart",
        columns: &[("service", Type::Name), ("other", Type::Name), ("key", Type::Name)],
        doc: "services whose instances this round may not share a topology domain (either way; required anti-affinity)",
    },
];

/// Positions of `assign`'s arguments in [`ASSIGN`].
pub mod assign_arg {
    pub const PENDING: usize = 0;
    pub const NEED: usize = 1;
    pub const OFFER: usize = 2;
    pub const ROOM: usize = 3;
    pub const SPREAD: usize = 4;
    pub const RESTRICTED: usize = 5;
    pub const ALLOWED: usize = 6;
    pub const RESERVED: usize = 7;
    pub const ADMITTED: usize = 8;
    pub const HARD_SPREAD: usize = 9;
    pub const TOPOLOGY: usize = 10;
    pub const PACKED: usize = 11;
    pub const PREFERENCE: usize = 12;
    pub const APART: usize = 13;
}

/// `assign(pending, need, …)` as users write it.
pub fn assign_call() -> String {
    builtin_call(&BUILTINS[0])
}

impl Relation {
    pub fn arity(&self) -> usize {
        self.columns.len()
    }
}

/// An argument of a body atom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Term {
    Var(VarId),
    Const(Const),
    Wildcard,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Const(Const),
    Var(VarId),
    Neg(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    Call(crate::ast::Func, Vec<Expr>),
}

impl Expr {
    pub fn vars(&self, out: &mut Vec<VarId>) {
        match self {
            Expr::Const(_) => {}
            Expr::Var(v) => out.push(*v),
            Expr::Call(_, args) => args.iter().for_each(|a| a.vars(out)),
            Expr::Neg(e) => e.vars(out),
            Expr::Bin(_, a, b) => {
                a.vars(out);
                b.vars(out);
            }
        }
    }
}

/// A body literal, in evaluation order: every variable a literal reads is bound
/// by an earlier one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lit {
    /// Join with (or, first, scan) a relation.
    Pos { rel: RelId, args: Vec<Term> },
    /// Keep bindings for which no matching fact exists.
    Neg { rel: RelId, args: Vec<Term> },
    /// Keep bindings where the comparison holds.
    Filter { op: CmpOp, lhs: Expr, rhs: Expr },
    /// Bind a new variable to a value.
    Assign { var: VarId, expr: Expr },
    /// Bind a new variable to each integer of `[lo, hi)`.
    Range { var: VarId, lo: Expr, hi: Expr },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyLit {
    pub lit: Lit,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadTerm {
    Expr(Expr),
    Agg(AggKind, Vec<Expr>),
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub id: RuleId,
    pub head: RelId,
    pub head_terms: Vec<HeadTerm>,
    pub body: Vec<BodyLit>,
    /// Variable names by slot, and their types.
    pub vars: Vec<(String, Type)>,
    pub span: Span,
}

impl Rule {
    pub fn has_aggregate(&self) -> bool {
        self.head_terms.iter().any(|t| matches!(t, HeadTerm::Agg(..)))
    }
}

/// A strongly connected component of the dependency graph, in evaluation order.
#[derive(Clone, Debug)]
pub struct Stratum {
    pub relations: Vec<RelId>,
    pub rules: Vec<RuleId>,
    /// Some rule reads a relation of its own stratum.
    pub recursive: bool,
}

#[derive(Clone, Debug)]
pub struct Program {
    pub sources: Sources,
    pub relations: Vec<Relation>,
    pub rules: Vec<Rule>,
    pub strata: Vec<Stratum>,
    /// The relations a key may belong to, by the key's shape.
    pub keys: KeyIndex,
}

/// Relations with a key pattern in a trie of their segments: a key walks it
/// segment by segment (a literal child, and a placeholder child), so it is
/// tried only against the patterns whose every literal it has, in one pass
/// over the key, whatever the number of patterns.
#[derive(Clone, Debug, Default)]
pub struct KeyIndex {
    root: KeyNode,
}

#[derive(Clone, Debug, Default)]
struct KeyNode {
    literal: HashMap<String, KeyNode, foldhash::fast::RandomState>,
    placeholder: Option<Box<KeyNode>>,
    /// Relations whose pattern ends here.
    ends: Vec<RelId>,
}

impl KeyIndex {
    pub fn new(relations: &[Relation]) -> KeyIndex {
        let mut index = KeyIndex::default();
        for (id, r) in relations.iter().enumerate() {
            let Some(p) = &r.pattern else { continue };
            let mut node = &mut index.root;
            for seg in &p.segments {
                node = match seg {
                    Segment::Lit(l) => node.literal.entry(l.clone()).or_default(),
                    Segment::Col(_) => node.placeholder.get_or_insert_with(Default::default),
                };
            }
            node.ends.push(id);
        }
        index
    }

    /// Every relation whose pattern may match `key`, each once, in the order
    /// they are declared: those whose literals the key has at their places
    /// (the caller still matches the pattern: a placeholder may be empty).
    pub fn relations_for(&self, key: &str) -> impl Iterator<Item = RelId> {
        fn walk(n: &KeyNode, mut parts: std::str::Split<'_, char>, found: &mut Vec<RelId>) {
            let Some(part) = parts.next() else { return found.extend_from_slice(&n.ends) };
            if let Some(lit) = n.literal.get(part) {
                walk(lit, parts.clone(), found);
            }
            if let Some(p) = &n.placeholder {
                walk(p, parts, found);
            }
        }
        let mut found = Vec::new();
        walk(&self.root, key.split('/'), &mut found);
        found.sort_unstable();
        found.into_iter()
    }
}

impl Program {
    pub fn relation(&self, name: &str) -> Option<RelId> {
        self.relations.iter().position(|r| r.name == name)
    }
    /// `file:line` of a rule and its source text, for explanations.
    pub fn rule_location(&self, rule: RuleId) -> String {
        let span = self.rules[rule].span;
        let (line, _) = self.sources.line_col(span.file, span.start);
        format!("{}:{}", self.sources.name(span.file), line)
    }
    pub fn rule_text(&self, rule: RuleId) -> &str {
        self.sources.slice(self.rules[rule].span)
    }
    pub fn inputs(&self) -> impl Iterator<Item = (RelId, &Relation)> {
        self.relations.iter().enumerate().filter(|(_, r)| r.kind == DeclKind::Input)
    }
    pub fn outputs(&self) -> impl Iterator<Item = (RelId, &Relation)> {
        self.relations.iter().enumerate().filter(|(_, r)| r.kind == DeclKind::Output)
    }
}

/// Evaluates a constant-free comparison of two values of one type class.
pub fn compare(op: CmpOp, a: &std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        CmpOp::Eq => *a == Equal,
        CmpOp::Ne => *a != Equal,
        CmpOp::Lt => *a == Less,
        CmpOp::Le => *a != Greater,
        CmpOp::Gt => *a == Greater,
        CmpOp::Ge => *a != Less,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_is_tried_only_against_patterns_of_its_shape() {
        let text = "input a(s: name, n: int) from \"desired/service/{s}/cpu\"\n\
                    input b(s: name, k: name, v: string) from \"desired/service/{s}/label/{k}\"\n\
                    input c(n: name, v: string) from \"observed/node/{n}/address\"\n\
                    input d(w: name, x: name, v: string) from \"{w}/thing/{x}\"\n\
                    output e(s: name, n: int) to \"effective/service/{s}/cpu\"\n\
                    e(s, n) :- a(s, n).\nx(v) :- b(_, _, v), c(_, v), d(_, _, v).\nrelation x(v: string)\n";
        let p = crate::check_str("t.rules", text).program.expect("valid");
        let rels = |key: &str| p.keys.relations_for(key).map(|r| p.relations[r].name.clone()).collect::<Vec<_>>();
        assert_eq!(rels("desired/service/web/cpu"), ["a"]);
        assert_eq!(rels("desired/service/web/label/zone"), ["b"]);
        assert_eq!(rels("observed/node/n1/address"), ["c"]);
        assert_eq!(rels("observed/thing/x"), ["d"]);
        assert_eq!(rels("effective/service/web/cpu"), ["e"]);
        assert_eq!(rels("any/thing/x"), ["d"]);
        // Only patterns whose literals the key has: d needs `thing` second.
        assert_eq!(rels("desired/service/web"), Vec::<String>::new());
        assert_eq!(rels("desired/thing/web"), ["d"]);
        // An empty segment still reaches a placeholder (decoding says it is empty).
        assert_eq!(rels("desired/service//cpu"), ["a"]);
        assert!(rels("").is_empty());
    }
}
