//! Runs one rule's compiled plan ([`crate::plan::RulePlan`]) against the
//! facts of a [`Db`], with some variables fixed in advance (from the fact
//! being explained), and reports what each body literal matched. Steps mean
//! exactly what they mean in the dataflow: the same filters, the same
//! expression evaluation, the same comparison.

use super::db::Db;
use crate::plan::{compare, CExpr, CHead, RulePlan, Step};
use crate::value::{Row, Value};
use ccattler_parser::program::RelId;

/// A (partial) binding: one slot per rule variable.
pub type Binding = Vec<Option<Value>>;

/// What one body literal matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// A positive atom matched this fact.
    Fact(RelId, Row),
    /// A negated atom: no fact matches this pattern (None = any value).
    Absent(RelId, Vec<Option<Value>>),
    /// A comparison, assignment or range held.
    Held,
}

/// One way the body matched.
#[derive(Clone, Debug)]
pub struct Match {
    pub binding: Binding,
    pub evidence: Vec<Evidence>,
}

pub fn dense(b: &Binding) -> Vec<Value> {
    b.iter().map(|v| v.clone().unwrap_or(Value::Int(0))).collect()
}

/// The variables a fact's head fixes: plain variables take the fact's
/// values. None if the head cannot give this fact (a constant differs, or
/// one variable would need two values).
pub fn head_binding(plan: &RulePlan, target: &[Option<Value>]) -> Option<Binding> {
    let mut b: Binding = vec![None; plan.nvars];
    for (term, want) in plan.head_terms.iter().zip(target) {
        let Some(want) = want else { continue };
        match term {
            CHead::Expr(CExpr::Var(v)) => match &b[*v] {
                Some(x) if *x != *want => return None,
                _ => b[*v] = Some(want.clone()),
            },
            CHead::Expr(CExpr::Val(c)) if c != want => return None,
            _ => {}
        }
    }
    Some(b)
}

/// Whether a complete binding's head agrees with the target's fixed columns
/// (aggregate columns are checked by the caller).
pub fn head_agrees(plan: &RulePlan, b: &Binding, target: &[Option<Value>]) -> bool {
    let d = dense(b);
    plan.head_terms.iter().zip(target).all(|(term, want)| match (term, want) {
        (CHead::Expr(e), Some(w)) => e.eval(&d) == Some(w.clone()),
        _ => true,
    })
}

/// The pattern a positive or negated atom asks for under a binding.
pub fn atom_pattern(arity: usize, filter: &crate::plan::AtomFilter, key: &[(usize, usize)], bind: &[(usize, usize)], b: &Binding) -> Vec<Option<Value>> {
    let mut p = vec![None; arity];
    for (pos, v) in &filter.consts {
        p[*pos] = Some(v.clone());
    }
    for (pos, var) in key.iter().chain(bind) {
        if let Some(v) = &b[*var] {
            p[*pos] = Some(v.clone());
        }
    }
    p
}

/// Facts of `rel` matching a pattern (and the atom's repeated-variable filter).
pub fn matching(db: &Db, rel: RelId, pattern: &[Option<Value>], filter: &crate::plan::AtomFilter) -> Result<Vec<Row>, String> {
    let (positions, values): (Vec<usize>, Vec<Value>) = pattern.iter().enumerate().filter_map(|(i, v)| v.clone().map(|v| (i, v))).unzip();
    Ok(db.lookup(rel, &positions, &values)?.into_iter().filter(|r| filter.accepts(r)).collect())
}

/// The outcome of one step for one binding: the bindings it leads to, with
/// the evidence for each; empty when the literal fails.
pub fn step(db: &Db, plan: &RulePlan, i: usize, b: &Binding) -> Result<Vec<(Binding, Evidence)>, String> {
    let d = dense(b);
    Ok(match &plan.steps[i] {
        Step::Join { rel, filter, key, bind } => {
            let arity = db.program.relations[*rel].arity();
            let pattern = atom_pattern(arity, filter, key, bind, b);
            matching(db, *rel, &pattern, filter)?
                .into_iter()
                .map(|row| {
                    let mut nb = b.clone();
                    for (pos, var) in bind {
                        nb[*var] = Some(row[*pos].clone());
                    }
                    (nb, Evidence::Fact(*rel, row))
                })
                .collect()
        }
        Step::AntiJoin { rel, filter, key } => {
            let arity = db.program.relations[*rel].arity();
            let pattern = atom_pattern(arity, filter, key, &[], b);
            if matching(db, *rel, &pattern, filter)?.is_empty() {
                vec![(b.clone(), Evidence::Absent(*rel, pattern))]
            } else {
                vec![]
            }
        }
        Step::Filter { op, lhs, rhs } => match (lhs.eval(&d), rhs.eval(&d)) {
            (Some(l), Some(r)) if compare(*op, &l, &r) => vec![(b.clone(), Evidence::Held)],
            _ => vec![],
        },
        Step::Assign { var, expr } => match expr.eval(&d) {
            Some(v) if b[*var].clone().is_none_or(|x| x == v) => {
                let mut nb = b.clone();
                nb[*var] = Some(v);
                vec![(nb, Evidence::Held)]
            }
            _ => vec![],
        },
        Step::Range { var, lo, hi } => {
            let (Some(lo), Some(hi)) = (lo.eval(&d).and_then(|v| v.as_int()), hi.eval(&d).and_then(|v| v.as_int())) else { return Ok(vec![]) };
            match &b[*var] {
                Some(v) => match v.as_int() {
                    Some(x) if lo <= x && x < hi => vec![(b.clone(), Evidence::Held)],
                    _ => vec![],
                },
                None => (lo..hi.max(lo))
                    .map(|x| {
                        let mut nb = b.clone();
                        nb[*var] = Some(Value::Int(x));
                        (nb, Evidence::Held)
                    })
                    .collect(),
            }
        }
    })
}

/// Every complete match of the body from `start`, at most `limit`.
pub fn matches(db: &Db, plan: &RulePlan, start: Binding, limit: usize) -> Result<Vec<Match>, String> {
    let mut out = Vec::new();
    let mut stack = vec![(0usize, Match { binding: start, evidence: vec![] })];
    while let Some((i, m)) = stack.pop() {
        if i == plan.steps.len() {
            out.push(m);
            if out.len() >= limit {
                break;
            }
            continue;
        }
        let next = step(db, plan, i, &m.binding)?;
        // Reverse, so the stack yields matches in the facts' order.
        for (nb, ev) in next.into_iter().rev() {
            let mut evidence = m.evidence.clone();
            evidence.push(ev);
            stack.push((i + 1, Match { binding: nb, evidence }));
        }
    }
    Ok(out)
}
