//! Derivation trees. For a fact the engine holds, every rule that can derive
//! it is matched with the fact's values fixed; the derivation shown is one of
//! least height (so recursion always bottoms out), the others are counted.

use super::matcher::{self, Evidence, Match};
use super::{bindings, fact_text, pattern_key, row_text, value_text, Contribution, Db, How, Node, Options, Premise, Val};
use crate::plan::{CHead, RulePlan};
use crate::value::{Row, Value};
use ccattler_parser::program::{Builtin, RelId};
use std::collections::{HashMap, HashSet};

/// Derivations looked at per fact (more are counted up to this, not shown).
pub const LIMIT: usize = 1000;
/// Contributions of one aggregate shown.
pub const SHOWN_CONTRIBUTIONS: usize = 200;

type Fact = (RelId, Row);

pub struct Prover<'d, 'a> {
    db: &'d Db<'a>,
    plans: Vec<RulePlan>,
    opts: Options,
    /// Least proof height of facts whose height is known.
    heights: HashMap<Fact, Option<usize>>,
    in_progress: HashSet<Fact>,
    /// Derived facts already shown in the current tree.
    shown: HashSet<Fact>,
}

/// One way to derive a fact: the rule's plan index and the body match (for
/// an aggregate, every match of the group).
#[derive(Clone)]
struct Derivation {
    plan: usize,
    matches: Vec<Match>,
}

impl<'d, 'a> Prover<'d, 'a> {
    pub fn new(db: &'d Db<'a>, opts: Options) -> Self {
        Prover { db, plans: crate::plan::plan(db.program), opts, heights: HashMap::new(), in_progress: HashSet::new(), shown: HashSet::new() }
    }

    /// The derivation tree of a fact the engine holds.
    pub fn prove(&mut self, rel: RelId, row: &[Value]) -> Result<Node, String> {
        self.shown.clear();
        self.node(rel, row, 0)
    }

    /// All derivations of a derived fact (at most LIMIT).
    fn derivations(&self, rel: RelId, row: &[Value]) -> Result<Vec<Derivation>, String> {
        let target: Vec<Option<Value>> = row.iter().cloned().map(Some).collect();
        let mut out = Vec::new();
        for (pi, plan) in self.plans.iter().enumerate().filter(|(_, p)| p.head == rel) {
            if plan.has_aggregate() {
                // The group: the plain head terms are fixed, the aggregates are what the group gives.
                let group_target: Vec<Option<Value>> =
                    plan.head_terms.iter().zip(&target).map(|(t, v)| if matches!(t, CHead::Agg(..)) { None } else { v.clone() }).collect();
                let Some(start) = matcher::head_binding(plan, &group_target) else { continue };
                let ms: Vec<Match> =
                    matcher::matches(self.db, plan, start, usize::MAX)?.into_iter().filter(|m| matcher::head_agrees(plan, &m.binding, &group_target)).collect();
                if ms.is_empty() {
                    continue;
                }
                // Distinct matches of the body feed the aggregate (docs/language.md).
                let mut args: Vec<Row> = Vec::new();
                for m in &ms {
                    if let Some((_, a)) = plan.group_and_args(&matcher::dense(&m.binding)) {
                        args.push(a);
                    }
                }
                let input: Vec<(&Row, isize)> = args.iter().map(|a| (a, 1)).collect();
                let group: Vec<Value> = plan.head_terms.iter().zip(row).filter(|(t, _)| !matches!(t, CHead::Agg(..))).map(|(_, v)| v.clone()).collect();
                let result = plan.aggregate(&input).map(|aggs| plan.head_from_group(&group, &aggs));
                if result.as_deref() == Some(row) {
                    out.push(Derivation { plan: pi, matches: ms });
                }
            } else {
                let Some(start) = matcher::head_binding(plan, &target) else { continue };
                for m in matcher::matches(self.db, plan, start, LIMIT)? {
                    if matcher::head_agrees(plan, &m.binding, &target) {
                        out.push(Derivation { plan: pi, matches: vec![m] });
                    }
                }
            }
            if out.len() >= LIMIT {
                break;
            }
        }
        Ok(out)
    }

    /// Derived facts a derivation rests on.
    fn premises_of(d: &Derivation) -> impl Iterator<Item = Fact> + '_ {
        d.matches.iter().flat_map(|m| m.evidence.iter()).filter_map(|e| match e {
            Evidence::Fact(r, row) => Some((*r, row.clone())),
            _ => None,
        })
    }

    /// The greatest height among premises (0 for none), or None if one has
    /// no proof that avoids the facts being proved above it.
    fn tallest(&mut self, premises: Vec<Fact>) -> Result<Option<usize>, String> {
        let mut tallest = 0;
        for (r, p) in premises {
            match self.height(r, &p)? {
                Some(h) => tallest = tallest.max(h),
                None => return Ok(None),
            }
        }
        Ok(Some(tallest))
    }

    /// Least height of a proof of the fact (inputs 0), or None if none exists
    /// without going through a fact being proved above it.
    fn height(&mut self, rel: RelId, row: &[Value]) -> Result<Option<usize>, String> {
        if self.db.is_input(rel) {
            return Ok(Some(0));
        }
        let key = (rel, Row::from(row));
        if let Some(h) = self.heights.get(&key) {
            return Ok(*h);
        }
        if !self.in_progress.insert(key.clone()) {
            return Ok(None);
        }
        let mut best: Option<usize> = None;
        if let Some(b) = &self.db.program.relations[rel].builtin {
            let parts = self.builtin_premises(row, b)?;
            best = self.tallest(parts)?.map(|h| h + 1);
        } else {
            for d in self.derivations(rel, row)? {
                if let Some(h) = self.tallest(Self::premises_of(&d).collect())? {
                    best = Some(best.map_or(h + 1, |b: usize| b.min(h + 1)));
                }
            }
        }
        self.in_progress.remove(&key);
        // Only a result found with no cycle cut below is final.
        if best.is_some() || self.in_progress.is_empty() {
            self.heights.insert(key, best);
        }
        Ok(best)
    }

    /// The facts behind a built-in assignment: the instance's pending fact,
    /// its service's needs, the node's offer and room, the service's spread
    /// there (if listed); for a restricted service that restriction and the
    /// node being allowed; for a reserved node that reservation and the
    /// service's admission; for a hard spread that spread and the node's
    /// domain; and a packing policy.
    fn builtin_premises(&self, row: &[Value], b: &Builtin) -> Result<Vec<Fact>, String> {
        match b {
            Builtin::Assign(_) => self.assign_premises(row, b),
            Builtin::Preempt(_) => self.preempt_premises(row, b),
        }
    }

    /// The facts behind an eviction: the preemptor's fact, the victim's, and
    /// the victim service's budget (if it has one).
    fn preempt_premises(&self, row: &[Value], b: &Builtin) -> Result<Vec<Fact>, String> {
        use ccattler_parser::program::preempt_arg as a;
        let rel = |x: usize| b.arg(x);
        let (victim, preemptor) = (row[0].clone(), row[1].clone());
        let mut out = Vec::new();
        out.extend(self.db.lookup(rel(a::PREEMPTOR), &[0], &[preemptor])?.into_iter().take(1).map(|r| (rel(a::PREEMPTOR), r)));
        let v = self.db.lookup(rel(a::VICTIM), &[0], &[victim])?;
        if let Some(v) = v.first() {
            out.push((rel(a::VICTIM), v.clone()));
            out.extend(self.db.lookup(rel(a::BUDGET), &[0], &[v[2].clone()])?.into_iter().take(1).map(|r| (rel(a::BUDGET), r)));
        }
        Ok(out)
    }

    fn assign_premises(&self, row: &[Value], b: &Builtin) -> Result<Vec<Fact>, String> {
        use ccattler_parser::program::assign_arg as a;
        let rel = |x: usize| b.arg(x);
        let (instance, node) = (row[0].clone(), row[1].clone());
        let p = self.db.lookup(rel(a::PENDING), &[0], &[instance.clone()])?;
        let Some(p) = p.first() else { return Err(format!("assigned {instance} has no pending fact")) };
        let service = &p[1];
        let mut out = vec![(rel(a::PENDING), p.clone())];
        let mut all = |x: usize, cols: &[usize], vals: &[Value], take: usize| -> Result<Vec<Value>, String> {
            let rows = self.db.lookup(rel(x), cols, vals)?;
            let firsts = rows.iter().map(|r| r[r.len() - 1].clone()).collect();
            out.extend(rows.into_iter().take(take).map(|r| (rel(x), r)));
            Ok(firsts)
        };
        all(a::NEED, &[0], &[service.clone()], usize::MAX)?;
        all(a::OFFER, &[0], &[node.clone()], 1)?;
        all(a::ROOM, &[0], &[node.clone()], usize::MAX)?;
        all(a::SPREAD, &[0, 1], &[service.clone(), node.clone()], 1)?;
        if !all(a::RESTRICTED, &[0], &[service.clone()], 1)?.is_empty() {
            all(a::ALLOWED, &[0, 1], &[service.clone(), node.clone()], 1)?;
        }
        if !all(a::RESERVED, &[0], &[node.clone()], 1)?.is_empty() {
            all(a::ADMITTED, &[0, 1], &[service.clone(), node.clone()], 1)?;
        }
        let hard = self.db.lookup(rel(a::HARD_SPREAD), &[0], &[service.clone()])?;
        if let Some(h) = hard.first() {
            out.push((rel(a::HARD_SPREAD), h.clone()));
            out.extend(self.db.lookup(rel(a::TOPOLOGY), &[0, 1], &[node, h[1].clone()])?.into_iter().take(1).map(|r| (rel(a::TOPOLOGY), r)));
        }
        out.extend(self.db.lookup(rel(a::PACKED), &[0], &[service.clone()])?.into_iter().take(1).map(|r| (rel(a::PACKED), r)));
        Ok(out)
    }

    fn node(&mut self, rel: RelId, row: &[Value], depth: usize) -> Result<Node, String> {
        let program = self.db.program;
        let fact = row_text(program, rel, row);
        let node = |how: How| Node { fact: fact.clone(), relation: program.relations[rel].name.clone(), tuple: row.iter().map(Val::from).collect(), how };
        if self.db.is_input(rel) {
            let Some((key, stored)) = self.db.input_key(rel, row) else { return Err(format!("input fact {fact} has no stored key")) };
            let namespace = key.split('/').next().unwrap_or_default().to_string();
            let writer = key.strip_prefix("intent/").and_then(|r| r.split('/').next()).map(str::to_string);
            return Ok(node(How::Input { key, value: stored.value.clone(), mod_revision: stored.mod_revision, namespace, writer }));
        }
        if !self.db.contains(rel, row)? {
            return Err(format!("internal: {fact} is not a fact the engine holds"));
        }
        let key = (rel, Row::from(row));
        if self.shown.contains(&key) {
            return Ok(node(How::Seen));
        }
        if depth >= self.opts.depth {
            return Ok(node(How::Cut));
        }
        self.shown.insert(key);
        if let Some(b) = &program.relations[rel].builtin {
            let parts = self.builtin_premises(row, b)?;
            let mut premises = Vec::new();
            for (r, p) in parts {
                premises.push(self.node(r, &p, depth + 1)?);
            }
            let note = match b {
                Builtin::Assign(_) => format!(
                    "assign gave {} the first node with room for all it needs among those its service may use, ordered by (domain count for a hard spread, spread, score, node name; most allocated first when packed), charging capacity as it went (docs/language.md)",
                    value_text(&row[0])
                ),
                Builtin::Preempt(_) => format!(
                    "preempt evicts {} for {}, which no node had room for: on the node where the fewest lower-priority victims make room (lowest priority first, within disruption budgets) (docs/language.md)",
                    value_text(&row[0]),
                    value_text(&row[1])
                ),
            };
            return Ok(node(How::Assigned { builtin: b.name().into(), premises, note }));
        }
        let derivations = self.derivations(rel, row)?;
        if derivations.is_empty() {
            return Err(format!("internal: the engine holds {fact} but no rule derives it"));
        }
        // The derivation of least height.
        let mut best: Option<(usize, usize)> = None;
        for (i, d) in derivations.iter().enumerate() {
            if let Some(h) = self.tallest(Self::premises_of(d).collect())? {
                if best.is_none_or(|(bh, _)| h < bh) {
                    best = Some((h, i));
                }
            }
        }
        let (_, chosen) = best.ok_or_else(|| format!("internal: no well-founded derivation of {fact}"))?;
        let d = &derivations[chosen];
        let plan = &self.plans[d.plan];
        let rule = plan.rule;
        let rule_ref = self.db.rule_ref(rule);
        if plan.has_aggregate() {
            let plan = plan.clone();
            let (aggregate, decisive) = decisive(&plan, row);
            let mut contributions = Vec::new();
            for m in d.matches.iter().take(SHOWN_CONTRIBUTIONS) {
                let args = plan.group_and_args(&matcher::dense(&m.binding)).map(|(_, a)| a).unwrap_or_default();
                let decides = decisive.as_ref().is_none_or(|v| args.iter().any(|a| a == v));
                let premises = self.premises(&plan, m, depth)?;
                let value = args.iter().map(value_text).collect::<Vec<_>>().join(", ");
                contributions.push(Contribution { bindings: bindings(program, rule, &m.binding), value, decides, premises });
            }
            return Ok(node(How::Aggregate { rule: rule_ref, aggregate, contributions }));
        }
        let m = d.matches[0].clone();
        let plan = plan.clone();
        let premises = self.premises(&plan, &m, depth)?;
        let bindings = bindings(program, rule, &m.binding);
        Ok(node(How::Rule { rule: rule_ref, bindings, premises, other_derivations: derivations.len() - 1 }))
    }

    fn premises(&mut self, plan: &RulePlan, m: &Match, depth: usize) -> Result<Vec<Premise>, String> {
        let program = self.db.program;
        let mut out = Vec::new();
        for (i, ev) in m.evidence.iter().enumerate() {
            let literal = self.db.literal(plan.rule, i);
            out.push(match ev {
                Evidence::Fact(r, row) => Premise::Fact { literal, proof: self.node(*r, row, depth + 1)? },
                Evidence::Absent(r, pattern) => {
                    let key = Some(*r).filter(|r| self.db.is_input(*r)).and_then(|r| pattern_key(program, r, pattern));
                    Premise::Absent { literal, fact: fact_text(program, *r, pattern), key }
                }
                Evidence::Held => Premise::Condition { literal },
            });
        }
        Ok(out)
    }
}

/// The aggregate's name, and the argument value that decided it (None when
/// every contribution counts: count, sum).
fn decisive(plan: &RulePlan, row: &[Value]) -> (String, Option<Value>) {
    use ccattler_parser::ast::AggKind;
    for (t, v) in plan.head_terms.iter().zip(row) {
        if let CHead::Agg(kind, _) = t {
            let decided = !matches!(kind, AggKind::Count | AggKind::Sum);
            return (kind.keyword().into(), decided.then_some(v.clone()));
        }
    }
    (String::new(), None)
}
