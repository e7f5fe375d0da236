//! Why a fact does not hold. For every rule that could derive it, the body is
//! matched literal by literal with the fact's values fixed; each binding that
//! stops is reported with every literal that fails for it (not just the
//! first), the nearest facts for a positive atom, the proof of what exists for
//! a negated one, and, one level down, why a missing derived fact is missing.
//!
//! For the built-in `assign` (an unplaced instance), every node is checked
//! against every constraint and the reasons are summarised with counts and
//! node names.

use super::how::Prover;
use super::matcher::{self, dense, Binding};
use super::{fact_text, row_text, value_text, Db, Node, Options, RuleRef};
use crate::plan::{CHead, RulePlan, Step};
use crate::value::Value;
use ccattler_parser::program::{Builtin, RelId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bindings carried from one literal to the next (more are counted, not followed).
const FRONTIER: usize = 20_000;
/// Failing bindings reported per rule.
const SHOWN: usize = 20;
/// Failing bindings per rule whose missing facts are explained one level down.
const BECAUSE: usize = 3;
/// How deep "because" goes.
const WHY_DEPTH: usize = 6;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WhyNot {
    /// The fact or pattern (`_` = any value).
    pub fact: String,
    /// For a relation read from keys: the key, and what the store holds there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputWhyNot>,
    /// Facts of the relation that agree with the pattern except in one column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nearest: Vec<String>,
    pub rules: Vec<RuleWhyNot>,
    /// For the built-in `assign`: why no node took the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assign: Option<AssignWhyNot>,
    /// For the built-in `preempt`: why the instance is no victim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempt: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct InputWhyNot {
    /// The key (with `*` for columns the pattern leaves open).
    pub key: String,
    /// The value the store holds at the key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<String>,
    /// Why the stored value was rejected, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuleWhyNot {
    pub rule: RuleRef,
    /// Set when the rule's head cannot give the fact at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_mismatch: Option<String>,
    /// Literals in the rule's body.
    pub literals: usize,
    /// Bindings that stopped, deepest (nearest to a match) first.
    pub failures: Vec<Failure>,
    /// Failing bindings not shown.
    pub more_failures: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Failure {
    pub bindings: super::Bindings,
    /// Body literals that matched before the first failure.
    pub matched: usize,
    /// Every literal that fails under these bindings.
    pub failed: Vec<FailedLiteral>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FailedLiteral {
    /// As written in the rule.
    pub literal: String,
    /// With the bindings filled in.
    pub instance: String,
    /// For an atom: its relation and the pattern it asked for (null = any value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<Vec<Option<super::Val>>>,
    /// `no matching fact`, `holds` (a negated atom), `false` (a comparison),
    /// or the aggregate's actual value.
    pub reason: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nearest: Vec<String>,
    /// For a negated atom: the proof of the fact that exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<Node>,
    /// For a missing derived fact: why it is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub because: Option<Box<WhyNot>>,
}

impl FailedLiteral {
    fn new(literal: String, instance: String, reason: String) -> FailedLiteral {
        FailedLiteral { literal, instance, relation: None, pattern: None, reason, nearest: vec![], proof: None, because: None }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssignWhyNot {
    pub instance: String,
    /// The pending fact (service and requests), if the instance is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// The nodes considered (every value of a `node` column).
    pub nodes: usize,
    /// Nodes that could take the instance.
    pub fit: usize,
    /// Each reason, with how many nodes and which; a node is listed under
    /// every reason that rules it out.
    pub reasons: Vec<Reason>,
    /// Each node that lacks a resource: what it has free and in total.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lacking: Vec<Lack>,
    /// For an instance no node can take because of room: `waits for room`,
    /// or `fits nowhere, ever: …` when no node it may use is big enough.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verdict: String,
    /// `0/12 nodes can take web-7 — waits for room: 7 insufficient cpu (…), …`
    pub summary: String,
}

/// A node without room for a resource the instance needs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Lack {
    pub node: String,
    pub resource: String,
    pub needs: i64,
    pub free: i64,
    pub total: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reason {
    pub reason: String,
    pub count: usize,
    pub nodes: Vec<String>,
}

pub fn why_not(db: &Db, rel: RelId, pattern: &[Option<Value>], opts: Options) -> Result<WhyNot, String> {
    let prover = std::cell::RefCell::new(Prover::new(db, Options { depth: 2 }));
    WhyNotCx { db, plans: crate::plan::plan(db.program), opts, prover, memo: Default::default(), lean: Default::default() }.why_not(rel, pattern, 0)
}

struct WhyNotCx<'d, 'a> {
    db: &'d Db<'a>,
    plans: Vec<RulePlan>,
    opts: Options,
    /// Proves what exists where a negated literal fails (one level deep).
    prover: std::cell::RefCell<Prover<'d, 'a>>,
    /// Why-nots already worked out, by (relation, pattern, depth, lean): two rules
    /// failing on one missing fact explain it once.
    memo: std::cell::RefCell<std::collections::HashMap<(RelId, Vec<Option<Value>>, usize, bool), WhyNot>>,
    /// Set while only the reasons matter (the per-node summary): nearest
    /// facts and bindings, which nobody reads there, are skipped.
    lean: std::cell::Cell<bool>,
}

impl WhyNotCx<'_, '_> {
    fn why_not(&self, rel: RelId, pattern: &[Option<Value>], depth: usize) -> Result<WhyNot, String> {
        let key = (rel, pattern.to_vec(), depth, self.lean.get());
        if let Some(w) = self.memo.borrow().get(&key) {
            return Ok(w.clone());
        }
        let w = self.why_not_uncached(rel, pattern, depth)?;
        self.memo.borrow_mut().insert(key, w.clone());
        Ok(w)
    }

    fn why_not_uncached(&self, rel: RelId, pattern: &[Option<Value>], depth: usize) -> Result<WhyNot, String> {
        let program = self.db.program;
        let r = &program.relations[rel];
        let mut out =
            WhyNot { fact: fact_text(program, rel, pattern), input: None, nearest: self.nearest(rel, pattern)?, rules: vec![], assign: None, preempt: vec![] };
        if self.db.is_input(rel) {
            if let Some(key) = super::pattern_key(program, rel, pattern) {
                let stored = self.db.inputs.facts.get(&key).map(|f| f.value.clone());
                let rejected = self.db.inputs.rejected.get(&key).cloned();
                out.input = Some(InputWhyNot { key, stored, rejected });
            }
            return Ok(out);
        }
        if let Some(b @ Builtin::Assign(_)) = &r.builtin {
            out.assign = Some(self.assign(pattern, b, depth)?);
            return Ok(out);
        }
        if let Some(b @ Builtin::Preempt(_)) = &r.builtin {
            out.preempt = self.preempt(pattern, b)?;
            return Ok(out);
        }
        for plan in self.plans.iter().filter(|p| p.head == rel) {
            out.rules.push(self.rule(plan, pattern, depth)?);
        }
        Ok(out)
    }

    /// Facts agreeing with the pattern in all fixed columns but one.
    fn nearest(&self, rel: RelId, pattern: &[Option<Value>]) -> Result<Vec<String>, String> {
        let fixed: Vec<usize> = (0..pattern.len()).filter(|i| pattern[*i].is_some()).collect();
        let mut out = Vec::new();
        if fixed.is_empty() || self.lean.get() {
            return Ok(out);
        }
        for skip in &fixed {
            let pos: Vec<usize> = fixed.iter().cloned().filter(|p| p != skip).collect();
            if pos.is_empty() {
                continue; // "anything else in the relation" is not near
            }
            let vals: Vec<Value> = pos.iter().map(|p| pattern[*p].clone().expect("fixed")).collect();
            for row in self.db.lookup(rel, &pos, &vals)?.into_iter().take(3) {
                out.push(row_text(self.db.program, rel, &row));
            }
        }
        out.sort();
        out.dedup();
        out.truncate(5);
        Ok(out)
    }

    fn rule(&self, plan: &RulePlan, pattern: &[Option<Value>], depth: usize) -> Result<RuleWhyNot, String> {
        let program = self.db.program;
        let rule = self.db.rule_ref(plan.rule);
        // Aggregates: the group is what the rule body decides; the value is the aggregate's.
        let group_pattern: Vec<Option<Value>> =
            plan.head_terms.iter().zip(pattern).map(|(t, v)| if matches!(t, CHead::Agg(..)) { None } else { v.clone() }).collect();
        let Some(start) = matcher::head_binding(plan, &group_pattern) else {
            return Ok(RuleWhyNot {
                rule,
                head_mismatch: Some(format!("the head {} cannot give {}", head_text(program, plan), fact_text(program, plan.head, pattern))),
                literals: plan.steps.len(),
                failures: vec![],
                more_failures: 0,
            });
        };
        let mut failures: Vec<Failure> = Vec::new();
        let mut more = 0;
        let mut frontier = vec![start];
        for i in 0..plan.steps.len() {
            let mut next = Vec::new();
            for b in &frontier {
                let extended = matcher::step(self.db, plan, i, b)?;
                if extended.is_empty() {
                    if failures.len() < SHOWN * 4 {
                        failures.push(self.failure(plan, b, i, depth, failures.len() < BECAUSE)?);
                    } else {
                        more += 1
                    }
                } else {
                    for (nb, _) in extended {
                        if next.len() < FRONTIER {
                            next.push(nb);
                        }
                    }
                }
            }
            frontier = next;
        }
        // Complete matches: the head gives another value, or the aggregate another result.
        let others: Vec<&Binding> = frontier.iter().filter(|b| !matcher::head_agrees(plan, b, &group_pattern)).collect();
        if !others.is_empty() && failures.is_empty() && !frontier.iter().any(|b| matcher::head_agrees(plan, b, &group_pattern)) {
            // Every match gives another fact (an id that does not exist, a
            // typo): one line, with the nearest it does give, not every one.
            let gives: Vec<crate::value::Row> = others.iter().filter_map(|b| plan.head_row(&dense(b))).collect();
            let asked = fact_text(program, plan.head, pattern);
            let nearest = nearest_row(&gives, pattern).map(|r| format!("; did you mean {}?", row_text(program, plan.head, &r))).unwrap_or_default();
            return Ok(RuleWhyNot {
                rule,
                head_mismatch: Some(format!("no such fact: the rule gives {} other fact(s), none {asked}{nearest}", gives.len() + more)),
                literals: plan.steps.len(),
                failures: vec![],
                more_failures: 0,
            });
        }
        for b in others.iter().take(SHOWN) {
            let got = plan.head_row(&dense(b)).map(|r| row_text(program, plan.head, &r)).unwrap_or_default();
            failures.push(Failure {
                bindings: self.bindings(plan.rule, b),
                matched: plan.steps.len(),
                failed: vec![FailedLiteral::new(head_text(program, plan), got, "the head gives another fact".into())],
            });
        }
        if plan.has_aggregate() && frontier.iter().any(|b| matcher::head_agrees(plan, b, &group_pattern)) {
            // The group exists; its aggregate is something else.
            let (pos, vals): (Vec<usize>, Vec<Value>) = group_pattern.iter().enumerate().filter_map(|(i, v)| v.clone().map(|v| (i, v))).unzip();
            let actual: Vec<String> = self.db.lookup(plan.head, &pos, &vals)?.iter().map(|r| row_text(program, plan.head, r)).collect();
            failures.push(Failure {
                bindings: self.bindings(plan.rule, frontier.first().expect("some")),
                matched: plan.steps.len(),
                failed: vec![FailedLiteral::new(
                    head_text(program, plan),
                    fact_text(program, plan.head, pattern),
                    format!("the group's aggregate gives {}", actual.join(", ")),
                )],
            });
        }
        failures.sort_by(|a, b| b.matched.cmp(&a.matched));
        if failures.len() > SHOWN {
            more += failures.len() - SHOWN;
            failures.truncate(SHOWN);
        }
        Ok(RuleWhyNot { rule, head_mismatch: None, literals: plan.steps.len(), failures, more_failures: more })
    }

    /// A binding stopped at step `first`: that literal, and every later one
    /// that can be checked with what is bound (and binds nothing new).
    fn failure(&self, plan: &RulePlan, b: &Binding, first: usize, depth: usize, explain: bool) -> Result<Failure, String> {
        let mut failed = vec![self.failed_literal(plan, b, first, depth, explain)?];
        let mut b = b.clone();
        for i in first + 1..plan.steps.len() {
            if !checkable(&plan.steps[i], &b) {
                continue;
            }
            let r = matcher::step(self.db, plan, i, &b)?;
            match r.as_slice() {
                [] => failed.push(self.failed_literal(plan, &b, i, depth, explain)?),
                [(nb, _)] => b = nb.clone(),
                _ => {}
            }
        }
        Ok(Failure { bindings: self.bindings(plan.rule, &b), matched: first, failed })
    }

    fn failed_literal(&self, plan: &RulePlan, b: &Binding, i: usize, depth: usize, explain: bool) -> Result<FailedLiteral, String> {
        let program = self.db.program;
        let literal = self.db.literal(plan.rule, i);
        let mut f = FailedLiteral::new(literal, String::new(), String::new());
        match &plan.steps[i] {
            Step::Join { rel, filter, key, bind } => {
                let pattern = matcher::atom_pattern(program.relations[*rel].arity(), filter, key, bind, b);
                f.instance = fact_text(program, *rel, &pattern);
                f.relation = Some(program.relations[*rel].name.clone());
                f.pattern = Some(pattern.iter().map(|v| v.as_ref().map(super::Val::from)).collect());
                f.reason = "no matching fact".into();
                f.nearest = self.nearest(*rel, &pattern)?;
                if explain && depth < WHY_DEPTH.min(self.opts.depth) {
                    let because = self.why_not(*rel, &pattern, depth + 1)?;
                    f.nearest.clear(); // the explanation below lists them
                    f.because = Some(Box::new(because));
                }
            }
            Step::AntiJoin { rel, filter, key } => {
                let pattern = matcher::atom_pattern(program.relations[*rel].arity(), filter, key, &[], b);
                f.instance = format!("not {}", fact_text(program, *rel, &pattern));
                f.relation = Some(program.relations[*rel].name.clone());
                f.pattern = Some(pattern.iter().map(|v| v.as_ref().map(super::Val::from)).collect());
                f.reason = "holds".into();
                if let Some(row) = matcher::matching(self.db, *rel, &pattern, filter)?.first() {
                    f.proof = Some(self.prover.borrow_mut().prove(*rel, row)?);
                }
            }
            Step::Filter { lhs, rhs, .. } => {
                let d = dense(b);
                let show = |e: &crate::plan::CExpr| e.eval(&d).map_or("?".into(), |v| value_text(&v));
                f.instance = format!("{} with {} and {}", f.literal, show(lhs), show(rhs));
                f.reason = "false".into();
            }
            Step::Assign { var, expr } => {
                let got = expr.eval(&dense(b)).map_or("no value (overflow or division by zero)".into(), |v| value_text(&v));
                f.instance = f.literal.clone();
                f.reason = match &b[*var] {
                    Some(want) => format!("gives {got}, not {}", value_text(&want)),
                    None => format!("gives {got}"),
                };
            }
            Step::Range { var, lo, hi } => {
                let d = dense(b);
                let bound = |e: &crate::plan::CExpr| e.eval(&d).map_or("?".into(), |v| value_text(&v));
                f.instance = format!("{} in {}..{}", b[*var].clone().map_or("_".into(), |v| value_text(&v)), bound(lo), bound(hi));
                f.reason = "out of range".into();
            }
        }
        Ok(f)
    }

    fn bindings(&self, rule: usize, b: &Binding) -> super::Bindings {
        if self.lean.get() {
            return super::Bindings::new();
        }
        super::bindings(self.db.program, rule, b)
    }

    /// Every node against every constraint, for one pending instance.
    /// Why `preempt` does not take the instance: not a candidate, no
    /// preemptor, its budget (named, with what it spares), or another choice.
    fn preempt(&self, pattern: &[Option<Value>], b: &Builtin) -> Result<Vec<String>, String> {
        use ccattler_parser::program::preempt_arg as a;
        let rel = |x: usize| b.arg(x);
        let Some(victim) = pattern.first().cloned().flatten() else { return Ok(vec!["why-not of a preemption needs the victim".into()]) };
        let mut round = crate::builtin::Inputs { args: Vec::new() };
        for x in 0..ccattler_parser::program::PREEMPT.len() {
            round.args.push(self.db.rows(rel(x))?.iter().cloned().collect());
        }
        if round.arg(a::PREEMPTOR).is_empty() {
            return Ok(vec!["no instance waits to preempt (nothing was left unplaced in the last round)".into()]);
        }
        let Some(v) = round.arg(a::VICTIM).iter().find(|r| r[0] == victim).cloned() else {
            return Ok(vec![format!("{victim} is no candidate: it is not kept, or no preemptor has a higher priority than its service")]);
        };
        let service = &v[2];
        let spare = round.arg(a::BUDGET).iter().find(|r| r[0] == *service).and_then(|r| r[1].as_int());
        let strict = round.arg(a::STRICT).iter().any(|r| r[0] == *service);
        let mut out = Vec::new();
        match (spare, strict) {
            (Some(s), true) if s <= 0 => out.push(format!("the strict disruption budget of {service} spares none ({s} to spare): it is never broken")),
            (Some(s), false) if s <= 0 => {
                out.push(format!("the disruption budget of {service} spares none ({s} to spare): it is broken only when no node makes room otherwise"))
            }
            (Some(s), _) => out.push(format!("the disruption budget of {service} spares {s}")),
            (None, _) => {}
        }
        let taken = round.preempt();
        if let Some((_, p, _)) = taken.iter().find(|(x, _, _)| *x == victim) {
            out.push(format!("it is a victim: {p} takes its room"));
        } else {
            let on = &v[1];
            let elsewhere: Vec<String> = taken.iter().map(|(x, p, _)| format!("{x} for {p}")).collect();
            if elsewhere.is_empty() {
                out.push(format!("no preemptor gains room on {on} by evicting it"));
            } else {
                out.push(format!("not needed: the preemptors make room with fewer, lower-priority or in-budget victims ({})", elsewhere.join(", ")));
            }
        }
        Ok(out)
    }

    fn assign(&self, pattern: &[Option<Value>], b: &Builtin, depth: usize) -> Result<AssignWhyNot, String> {
        use ccattler_parser::program::assign_arg as a;
        let program = self.db.program;
        let rel = |x: usize| b.arg(x);
        let Some(instance) = pattern[0].clone() else { return Err("why-not of an assignment needs the instance".into()) };
        let mut out = AssignWhyNot {
            instance: instance.to_string(),
            pending: None,
            nodes: 0,
            fit: 0,
            reasons: vec![],
            lacking: vec![],
            verdict: String::new(),
            summary: String::new(),
        };
        let pend = self.db.lookup(rel(a::PENDING), &[0], &[instance.clone()])?;
        let Some(p) = pend.first().cloned() else {
            let none: Vec<Option<Value>> =
                std::iter::once(Some(instance.clone())).chain(std::iter::repeat(None)).take(program.relations[rel(a::PENDING)].arity()).collect();
            let why = self.why_not(rel(a::PENDING), &none, depth + 1)?;
            out.summary = format!("{instance} is not pending: {}", short(&why));
            out.reasons.push(Reason { reason: format!("not pending: {}", short(&why)), count: 0, nodes: vec![] });
            return Ok(out);
        };
        let service = &p[1].clone();
        // The round, as the dataflow ran it (the same built-in).
        let mut round = crate::builtin::Inputs { args: Vec::new() };
        for x in 0..ccattler_parser::program::ASSIGN.len() {
            round.args.push(self.db.rows(rel(x))?.iter().cloned().collect());
        }
        let int = |v: &Value| v.as_int().unwrap_or(0);
        // By resource name (the engine's own order of strings is arbitrary).
        let mut needs: Vec<(Value, i64)> = round.arg(a::NEED).iter().filter(|r| r[0] == *service).map(|r| (r[1].clone(), int(&r[2]))).collect();
        needs.sort_by(|a, b| a.0.cmp_text(&b.0));
        out.pending = Some(format!(
            "{}{}",
            row_text(program, rel(a::PENDING), &p),
            if needs.is_empty() { String::new() } else { format!(", needs {}", needs.iter().map(|(r, n)| format!("{r} {n}")).collect::<Vec<_>>().join(", ")) }
        ));
        let is_restricted = round.arg(a::RESTRICTED).iter().any(|r| r[0] == *service);
        let hard = round.arg(a::HARD_SPREAD).iter().find(|r| r[0] == *service).map(|r| (r[1].clone(), int(&r[2])));
        let node_col = program.relations[rel(a::OFFER)].columns[0].name.clone();
        let nodes = match &pattern[1] {
            Some(n) => vec![n.clone()],
            None => self.db.domain(&node_col)?,
        };
        out.nodes = nodes.len();
        let assigned = round.assign();
        let taken_by = assigned.iter().find(|(i, _)| *i == instance).map(|(_, n)| n.clone());
        // What the round handed out per node and resource.
        let service_of: BTreeMap<Value, Value> = round.arg(a::PENDING).iter().map(|r| (r[0].clone(), r[1].clone())).collect();
        let mut charged: BTreeMap<(Value, Value), i64> = BTreeMap::new();
        for (i, n) in &assigned {
            let s = service_of.get(i).cloned();
            for r in round.arg(a::NEED).iter().filter(|r| Some(r[0].clone()) == s) {
                *charged.entry((n.clone(), r[1].clone())).or_default() += int(&r[2]);
            }
        }
        // Domain counts of a hard spread, as the round left them.
        let domain_of = |n: &Value| -> Option<Value> {
            let (key, _) = hard.as_ref()?;
            round.arg(a::TOPOLOGY).iter().find(|r| r[0] == *n && r[1] == *key).map(|r| r[2].clone())
        };
        let mut domain_count: BTreeMap<String, i64> = BTreeMap::new();
        if hard.is_some() {
            for r in round.arg(a::OFFER) {
                if let Some(d) = domain_of(&r[0]) {
                    domain_count.entry(d.to_string()).or_default();
                }
            }
            for r in round.arg(a::SPREAD).iter().filter(|r| r[0] == *service) {
                if let Some(d) = domain_of(&r[1]) {
                    *domain_count.entry(d.to_string()).or_default() += int(&r[2]);
                }
            }
            for (i, n) in &assigned {
                if service_of.get(i) == Some(&service) {
                    if let Some(d) = domain_of(n) {
                        *domain_count.entry(d.to_string()).or_default() += 1;
                    }
                }
            }
        }
        let min_count = domain_count.values().min().cloned().unwrap_or(0);
        // Why a fact about one node does not hold, as reasons in which the
        // node's own name becomes the column's, so nodes with the same reason group.
        let reasons_for = |what: &str, r: RelId, pattern: &[Option<Value>], n: &Value| -> Result<Vec<String>, String> {
            self.lean.set(true);
            let why = self.why_not(r, pattern, depth + 1);
            self.lean.set(false);
            let why = why?;
            let (quoted, raw) = (value_text(n), n.to_string());
            let mut reasons: Vec<String> = leaves(&why)
                .into_iter()
                .map(|l| format!("{what}: {}", l.replace(&quoted, &node_col).replace(&format!("/{raw}/"), &format!("/{{{node_col}}}/"))))
                .collect();
            if reasons.is_empty() {
                reasons.push(what.to_string());
            }
            Ok(reasons)
        };
        let mut by_reason: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // Whether some usable node could ever hold the instance (its totals).
        let mut big_enough = false;
        for n in &nodes {
            let name = n.to_string();
            let mut reasons: Vec<String> = Vec::new();
            let offered = round.arg(a::OFFER).iter().any(|r| r[0] == *n);
            let reserved = round.arg(a::RESERVED).iter().any(|r| r[0] == *n);
            if is_restricted && !round.arg(a::ALLOWED).iter().any(|r| r[0] == *service && r[1] == *n) {
                reasons = reasons_for("not allowed", rel(a::ALLOWED), &[Some(service.clone()), Some(n.clone())], n)?;
            } else if reserved && !round.arg(a::ADMITTED).iter().any(|r| r[0] == *service && r[1] == *n) {
                // What reserves the node (its taints, as the rules name them).
                let mut why: Vec<String> = round.arg(a::RESERVED).iter().filter(|r| r[0] == *n).filter_map(|r| r.get(1).map(|x| x.to_string())).collect();
                why.sort();
                why.dedup();
                let what = if why.is_empty() { "reserved, not admitted".to_string() } else { format!("reserved ({}), not admitted", why.join(", ")) };
                reasons = reasons_for(&what, rel(a::ADMITTED), &[Some(service.clone()), Some(n.clone())], n)?;
            } else if !offered {
                let none: Vec<Option<Value>> =
                    std::iter::once(Some(n.clone())).chain(std::iter::repeat(None)).take(program.relations[rel(a::OFFER)].arity()).collect();
                reasons = reasons_for("offers nothing", rel(a::OFFER), &none, n)?;
            } else if let (Some((key, _)), None) = (&hard, domain_of(n)) {
                reasons.push(format!("has no {key} domain (its hard spread's topology key)"));
            } else {
                let room: BTreeMap<Value, (i64, i64)> =
                    round.arg(a::ROOM).iter().filter(|r| r[0] == *n).map(|r| (r[1].clone(), (int(&r[2]), int(&r[3])))).collect();
                let mut lacks = false;
                let mut ever = true;
                for (res, need) in &needs {
                    let (free, total) = room.get(res).cloned().unwrap_or((0, 0));
                    if free < *need {
                        lacks = true;
                        reasons.push(format!("insufficient {res} (needs {need})"));
                        out.lacking.push(Lack { node: name.clone(), resource: res.to_string(), needs: *need, free, total });
                    }
                    ever &= total >= *need;
                }
                big_enough |= ever;
                if !lacks {
                    let left = |res: &Value| room.get(res).map_or(0, |x| x.0) - charged.get(&(n.clone(), res.clone())).cloned().unwrap_or(0);
                    let skew = hard.as_ref().and_then(|(_, max)| {
                        let d = domain_of(n)?.to_string();
                        let c = domain_count.get(&d).cloned().unwrap_or(0);
                        (c + 1 - min_count > *max).then(|| format!("its domain {d} has {c} instance(s), the least filled {min_count}: over max_skew {max}"))
                    });
                    if taken_by == Some(n.clone()) {
                        out.fit += 1;
                        continue;
                    } else if needs.iter().any(|(res, need)| left(res) < *need) {
                        reasons.push("room taken by other instances assigned in the same round".into());
                    } else if let Some(why) = skew {
                        reasons.push(why);
                    } else if let Some(t) = &taken_by {
                        reasons.push(format!("fits, but {} ranks better", t));
                    } else {
                        out.fit += 1;
                        continue;
                    }
                }
            }
            reasons.sort();
            reasons.dedup();
            for r in reasons {
                by_reason.entry(r).or_default().push(name.clone());
            }
        }
        let mut reasons: Vec<Reason> = by_reason
            .into_iter()
            .map(|(reason, mut nodes)| {
                nodes.sort_by(|a, b| natural(a, b));
                Reason { reason, count: nodes.len(), nodes }
            })
            .collect();
        reasons.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
        out.lacking.sort_by(|a, b| natural(&a.node, &b.node).then_with(|| a.resource.cmp(&b.resource)));
        let parts: Vec<String> = reasons.iter().map(|r| format!("{} {} ({})", r.count, r.reason, names(&r.nodes, 5))).collect();
        out.verdict = if out.fit == 0 && !out.lacking.is_empty() && !big_enough {
            "fits nowhere, ever: no node it may use is big enough".into()
        } else if out.fit == 0 && !out.lacking.is_empty() {
            "waits for room".into()
        } else {
            String::new()
        };
        let verdict = if out.verdict.is_empty() { String::new() } else { format!(" — {}", out.verdict) };
        out.summary = format!("{}/{} nodes can take {}{verdict}: {}", out.fit, out.nodes, instance, parts.join(", "));
        out.reasons = reasons;
        Ok(out)
    }
}

/// The row nearest to `pattern` by the text of its fixed columns (at most a
/// few edits away), if any.
fn nearest_row(rows: &[crate::value::Row], pattern: &[Option<Value>]) -> Option<crate::value::Row> {
    let text = |v: &Value| v.to_string();
    rows.iter()
        .filter_map(|r| {
            let d: usize = pattern.iter().zip(r).filter_map(|(p, v)| p.clone().map(|p| ccattler_parser::check::edit_distance(&text(&p), &text(v)))).sum();
            let len: usize = pattern.iter().flatten().map(|p| text(p).len()).sum();
            (d <= 2.max(len / 3)).then(|| (d, r.clone()))
        })
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| crate::value::cmp_rows(&a.1, &b.1)))
        .map(|(_, r)| r)
}

/// Orders names as people do: node-2 before node-10.
pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut text = String::new();
        let mut num = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                num.push(c);
            } else {
                if !num.is_empty() {
                    out.push((std::mem::take(&mut text), num.parse().unwrap_or(u64::MAX)));
                    num.clear();
                }
                text.push(c);
            }
        }
        out.push((text, num.parse().unwrap_or(0)));
        out
    }
    parts(a).cmp(&parts(b)).then_with(|| a.cmp(b))
}

/// Up to `max` names, then `…`.
pub fn names(names: &[String], max: usize) -> String {
    let mut s = names.iter().take(max).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > max {
        s.push_str(", …");
    }
    s
}

/// The deepest reasons in a why-not: chains of failing literals, `a ← b ← c`,
/// sorted, each once.
fn leaves(w: &WhyNot) -> Vec<String> {
    let mut out = Vec::new();
    leaf_reasons(w, &mut Vec::new(), &mut out);
    out.sort();
    out.dedup();
    out
}

fn leaf_reasons(w: &WhyNot, chain: &mut Vec<String>, out: &mut Vec<String>) {
    if let Some(i) = &w.input {
        let mut c = chain.clone();
        c.push(match (&i.stored, &i.rejected) {
            (_, Some(r)) => format!("{} rejected: {r}", i.key),
            (Some(v), None) => format!("{} is {v:?}", i.key),
            (None, None) => format!("no key {}", i.key),
        });
        out.push(c.join(" ← "));
        return;
    }
    for r in &w.rules {
        if let Some(m) = r.head_mismatch.as_ref().filter(|m| m.starts_with("no such fact")) {
            let mut c = chain.clone();
            c.push(m.clone());
            out.push(c.join(" ← "));
        }
        for f in &r.failures {
            for l in &f.failed {
                chain.push(l.instance.clone());
                match &l.because {
                    Some(b) => leaf_reasons(b, chain, out),
                    None => {
                        let tail = match &l.proof {
                            Some(p) => format!("{} holds{}", l.instance.trim_start_matches("not "), proof_premises(p)),
                            None => format!("{}: {}", l.instance, l.reason),
                        };
                        let mut c = chain[..chain.len() - 1].to_vec();
                        c.push(tail);
                        out.push(c.join(" ← "));
                    }
                }
                chain.pop();
            }
        }
    }
}

/// ` (a by file:line, no b)` — the first level of a proof, for a one-line
/// reason: each derived premise names the rule that gave it (an
/// exclusion's reason and where it comes from, in whatever file).
fn proof_premises(p: &Node) -> String {
    match &p.how {
        super::How::Rule { premises, .. } => {
            let parts: Vec<String> = premises
                .iter()
                .filter_map(|pr| match pr {
                    super::Premise::Fact { proof, .. } => Some(match &proof.how {
                        super::How::Rule { rule, .. } | super::How::Aggregate { rule, .. } => format!("{} by {}", proof.fact(), rule.location),
                        _ => proof.fact().to_string(),
                    }),
                    super::Premise::Absent { fact, .. } => Some(format!("no {fact}")),
                    super::Premise::Condition { .. } => None,
                })
                .collect();
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join(", "))
            }
        }
        _ => String::new(),
    }
}

/// A one-line summary of a why-not.
pub fn short(w: &WhyNot) -> String {
    let leaves = leaves(w);
    if leaves.is_empty() {
        format!("no rule derives {}", w.fact)
    } else {
        leaves.join("; ")
    }
}

/// A literal with its bindings known binds nothing new.
fn checkable(step: &Step, b: &Binding) -> bool {
    let bound = |e: &crate::plan::CExpr| {
        let mut vars = Vec::new();
        e.vars(&mut vars);
        vars.iter().all(|v| b[*v].is_some())
    };
    match step {
        Step::Join { bind, .. } => bind.iter().all(|(_, v)| b[*v].is_some()),
        Step::AntiJoin { key, .. } => key.iter().all(|(_, v)| b[*v].is_some()),
        Step::Filter { lhs, rhs, .. } => bound(lhs) && bound(rhs),
        Step::Assign { expr, .. } => bound(expr),
        Step::Range { var, lo, hi } => b[*var].is_some() && bound(lo) && bound(hi),
    }
}

fn head_text(program: &ccattler_parser::program::Program, plan: &RulePlan) -> String {
    let text = program.rule_text(plan.rule);
    text.split(":-").next().unwrap_or(text).split_whitespace().collect::<Vec<_>>().join(" ")
}
