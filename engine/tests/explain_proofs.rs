//! Explanations checked as proofs, on random programs and facts. For every
//! fact the engine derives, the derivation tree must be a valid proof: each
//! step re-checked against its rule (bindings, every body literal, the head)
//! and the facts, by an evaluator that shares nothing with the engine; input
//! leaves must be the stored keys; aggregates must list every contribution
//! and recompute to the fact. Facts that do not hold get a why-not (never a
//! proof), every rule is accounted for, and every failure it claims is true.
//!
//! Replay: `EXPLAIN_SEED=<seed> cargo test -p ccattler-engine --test explain_proofs`.

mod common;
use ccattler_engine::explain::{self, How, Node, Premise, Val};
use ccattler_engine::{Row, Session, Value};
use ccattler_parser::ast::DeclKind;
use ccattler_parser::program::{HeadTerm, Lit, Program, Rule};
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn value(v: &Val) -> Value {
    match v {
        Val::Int(n) => Value::Int(*n),
        Val::Str(s) => Value::str(s),
    }
}

struct Checker<'a> {
    program: &'a Program,
    /// Every relation, evaluated from scratch by the oracle.
    db: &'a Db,
    session: &'a Session,
    /// Facts whose proof was checked (a `seen` node must refer to one).
    proven: BTreeSet<(usize, Row)>,
}

impl Checker<'_> {
    fn rel(&self, name: &str) -> Result<usize, String> {
        self.program.relations.iter().position(|r| r.name == name).ok_or(format!("unknown relation {name}"))
    }

    fn holds(&self, rel: usize, row: &Row) -> bool {
        self.db.get(&rel).is_some_and(|s| s.contains(row))
    }

    /// The rules at `location` with `text`: the aggregate one or those that
    /// are not (a rule with a `default` is several, desugared: the
    /// aggregate, the rule passing its rows on, and the rule giving the
    /// default to groups with nothing to aggregate).
    fn rules_at(&self, head: usize, location: &str, text: &str, aggregate: bool) -> Result<Vec<&Rule>, String> {
        let found: Vec<&Rule> = self
            .program
            .rules
            .iter()
            .filter(|r| {
                r.head == head
                    && r.has_aggregate() == aggregate
                    && self.program.rule_location(r.id) == location
                    && self.program.rule_text(r.id).split_whitespace().collect::<Vec<_>>().join(" ") == text
            })
            .collect();
        if found.is_empty() {
            return Err(format!("no rule {location} `{text}` derives {}", self.program.relations[head].name));
        }
        Ok(found)
    }

    /// A binding from a node's bindings. A variable the checker made for a
    /// `_` (`_#v1`, as `per d0(x, _)` desugars) is not shown: it stays
    /// unbound here.
    fn binding(&self, rule: &Rule, named: &explain::Bindings) -> Result<Vec<Option<Value>>, String> {
        rule.vars
            .iter()
            .map(|(name, _)| match named.get(name) {
                Some(v) => Ok(Some(value(v))),
                None if name.starts_with("_#") => Ok(None),
                None => Err(format!("variable {name} unbound in {}", self.program.rule_text(rule.id))),
            })
            .collect()
    }

    /// Every body literal under a binding, with the premise given for it.
    fn body(&mut self, rule: &Rule, b: &[Option<Value>], premises: &[Premise]) -> Result<(), String> {
        if premises.len() != rule.body.len() {
            return Err(format!("{} premises for {} literals", premises.len(), rule.body.len()));
        }
        for (lit, premise) in rule.body.iter().zip(premises) {
            match (&lit.lit, premise) {
                (Lit::Pos { rel, args }, Premise::Fact { proof, .. }) => {
                    let row: Row = proof.tuple.iter().map(value).collect();
                    if proof.relation != self.program.relations[*rel].name || !matches(args, &row, &mut b.to_vec()) {
                        return Err(format!("premise {} does not match {}", proof.fact, self.program.sources.slice(lit.span)));
                    }
                    self.node(proof)?;
                }
                (Lit::Neg { rel, args }, Premise::Absent { .. }) => {
                    if let Some(row) = self.db.get(rel).into_iter().flatten().find(|row| matches(args, row, &mut b.to_vec())) {
                        return Err(format!("{} is said absent but {row:?} holds", self.program.sources.slice(lit.span)));
                    }
                }
                (Lit::Filter { op, lhs, rhs }, Premise::Condition { .. }) => {
                    let ok = matches!((eval_expr(lhs, b), eval_expr(rhs, b)), (Some(l), Some(r)) if ccattler_parser::program::compare(*op, &l.cmp_text(&r)));
                    if !ok {
                        return Err(format!("condition {} is false", self.program.sources.slice(lit.span)));
                    }
                }
                (Lit::Assign { var, expr }, Premise::Condition { .. }) => {
                    if eval_expr(expr, b) != b[*var] {
                        return Err(format!("assignment {} does not give the bound value", self.program.sources.slice(lit.span)));
                    }
                }
                (Lit::Range { var, lo, hi }, Premise::Condition { .. }) => {
                    let (lo, hi, v) =
                        (eval_expr(lo, b).and_then(|v| v.as_int()), eval_expr(hi, b).and_then(|v| v.as_int()), b[*var].clone().and_then(|v| v.as_int()));
                    if !matches!((lo, hi, v), (Some(l), Some(h), Some(v)) if l <= v && v < h) {
                        return Err(format!("range {} does not hold", self.program.sources.slice(lit.span)));
                    }
                }
                (l, p) => return Err(format!("premise {p:?} does not fit literal {l:?}")),
            }
        }
        Ok(())
    }

    fn node(&mut self, n: &Node) -> Result<(), String> {
        let rel = self.rel(&n.relation)?;
        let row: Row = n.tuple.iter().map(value).collect();
        if !self.holds(rel, &row) {
            return Err(format!("{} is explained but does not hold", n.fact));
        }
        match &n.how {
            How::Input { key, value, mod_revision, .. } => {
                let stored = self.session.inputs.facts.get(key).ok_or(format!("{} rests on key {key}, which is not stored", n.fact))?;
                if stored.value != *value || stored.mod_revision != *mod_revision {
                    return Err(format!("{key}: stored {:?}@{}, explained {value:?}@{mod_revision}", stored.value, stored.mod_revision));
                }
                let decoded = ccattler_engine::facts::decode(self.program, key, value).map_err(|r| r.reason)?;
                if !decoded.contains(&(rel, row.clone())) {
                    return Err(format!("{key} = {value} does not give {}", n.fact));
                }
            }
            How::Seen => {
                if !self.proven.contains(&(rel, row.clone())) {
                    return Err(format!("{} is `seen` before it was proven (circular?)", n.fact));
                }
            }
            How::Cut => return Err(format!("{} cut at the default depth", n.fact)),
            How::Rule { rule, bindings, premises, other_derivations } => {
                // Of the rules with this text, the one whose body the
                // premises fit and whose head they give. A variable made
                // for a `_` takes its value from the premise shown for its
                // atom.
                let mut fitting = None;
                for r in self.rules_at(rel, &rule.location, &rule.text, false)? {
                    let Ok(mut b) = self.binding(r, bindings) else { continue };
                    let fits = r.body.len() == premises.len()
                        && r.body.iter().zip(premises.iter()).all(|(lit, premise)| match (&lit.lit, premise) {
                            (Lit::Pos { rel, args }, Premise::Fact { proof, .. }) => {
                                let row: Row = proof.tuple.iter().map(value).collect();
                                proof.relation == self.program.relations[*rel].name && matches(args, &row, &mut b)
                            }
                            _ => true,
                        });
                    let gives = r.head_terms.iter().zip(&row).all(|(t, v)| matches!(t, HeadTerm::Expr(e) if eval_expr(e, &b) == Some(v.clone())));
                    if fits && gives {
                        fitting = Some((r.clone(), b));
                        break;
                    }
                }
                let Some((r, b)) = fitting else { return Err(format!("no rule `{}` with these premises gives {}", rule.text, n.fact)) };
                self.body(&r, &b, premises)?;
                // The count of other derivations: every match of every rule
                // giving the fact — each combination of premise facts, so
                // `c(_, v)` matched by c(0, 2) and by c(2, 2) is two.
                let total: usize = self
                    .program
                    .rules
                    .iter()
                    .filter(|x| x.head == rel && !x.has_aggregate())
                    .map(|x| body_matches(x, self.db).into_iter().filter(|b| head_row(x, b).as_ref() == Some(&row)).count())
                    .sum();
                if total.min(explain::how::LIMIT) != other_derivations + 1 {
                    return Err(format!("{}: {other_derivations} other derivations claimed, {} exist", n.fact, total - 1));
                }
            }
            How::Aggregate { rule, contributions, .. } => {
                let r = self.rules_at(rel, &rule.location, &rule.text, true)?[0].clone();
                let mut shown = BTreeSet::new();
                let mut args: Vec<Vec<Value>> = Vec::new();
                for c in contributions {
                    let b = self.binding(&r, &c.bindings)?;
                    for (t, v) in r.head_terms.iter().zip(&row) {
                        if let HeadTerm::Expr(e) = t {
                            if eval_expr(e, &b) != Some(v.clone()) {
                                return Err(format!("a contribution to {} is in another group", n.fact));
                            }
                        }
                    }
                    self.body(&r, &b, &c.premises)?;
                    args.push(agg_args(&r, &b).ok_or("aggregate arguments do not evaluate")?);
                    shown.insert(b);
                }
                // Every contribution is listed.
                let all: BTreeSet<Vec<Option<Value>>> = body_bindings(&r, self.db)
                    .into_iter()
                    .filter(|b| r.head_terms.iter().zip(&row).all(|(t, v)| !matches!(t, HeadTerm::Expr(e) if eval_expr(e, b) != Some(v.clone()))))
                    .collect();
                if all != shown {
                    return Err(format!("{}: {} contributions listed, {} exist", n.fact, shown.len(), all.len()));
                }
                // And they give the fact.
                let mut off = 0;
                for (t, v) in r.head_terms.iter().zip(&row) {
                    if let HeadTerm::Agg(k, es) = t {
                        let slice: Vec<Vec<Value>> = args.iter().map(|a| a[off..off + es.len()].to_vec()).collect();
                        off += es.len();
                        if aggregate(*k, &slice) != *v {
                            return Err(format!("{}: the contributions aggregate to {:?}", n.fact, aggregate(*k, &slice)));
                        }
                    }
                }
            }
            How::Assigned { .. } => return Err("random programs have no built-in".into()),
        }
        self.proven.insert((rel, row));
        Ok(())
    }
}

fn body_bindings(rule: &Rule, db: &Db) -> Vec<Vec<Option<Value>>> {
    let distinct: BTreeSet<_> = body_matches(rule, db).into_iter().collect();
    distinct.into_iter().collect()
}

/// The bindings of a rule body, one per combination of facts it matches
/// (two facts that differ only under a `_` give one binding twice).
fn body_matches(rule: &Rule, db: &Db) -> Vec<Vec<Option<Value>>> {
    let lits: Vec<Lit> = rule.body.iter().map(|b| b.lit.clone()).collect();
    let mut out = Vec::new();
    bindings(&lits, db, vec![None; rule.vars.len()], &mut out);
    out
}

fn head_row(rule: &Rule, b: &[Option<Value>]) -> Option<Row> {
    rule.head_terms.iter().map(|h| if let HeadTerm::Expr(e) = h { eval_expr(e, b) } else { None }).collect()
}

fn agg_args(rule: &Rule, b: &[Option<Value>]) -> Option<Vec<Value>> {
    rule.head_terms.iter().filter_map(|h| if let HeadTerm::Agg(_, es) = h { Some(es) } else { None }).flatten().map(|e| eval_expr(e, b)).collect()
}

/// The key of an output tuple in the random programs (`out/{d}/{x}/{y}` or `labels/{x}/{s}`).
fn key_of(program: &Program, rel: usize, row: &Row) -> String {
    let cols: Vec<String> = row.iter().map(|v| v.to_string()).collect();
    program.relations[rel].pattern.as_ref().unwrap().render(&cols)
}

fn run_case(seed: u64) -> Result<usize, String> {
    let mut rng = Rng(seed.max(1));
    let src = random_program(&mut rng);
    let checked = ccattler_parser::check_str("random.rules", &src);
    let program = Arc::new(checked.program.ok_or_else(|| format!("does not check:\n{src}"))?);
    let mut session = Session::new(program.clone(), 1).map_err(|e| e.to_string())?;
    let mut writes = Vec::new();
    let mut inputs: Db = BTreeMap::new();
    for _ in 0..rng.below(14) + 2 {
        let rel = rng.below(INPUTS.len());
        let (x, y) = (rng.below(DOMAIN), rng.below(DOMAIN));
        writes.push((format!("in/{rel}/{x}/{y}"), Some(String::new())));
        inputs.entry(rel).or_default().insert(smallvec::smallvec![Value::Int(x as i64), Value::Int(y as i64)]);
    }
    session.write(&writes).map_err(|e| e.to_string())?;
    let db = oracle(&program, &inputs);
    let exdb = explain::Db::of_session(&session);
    let mut checker = Checker { program: &program, db: &db, session: &session, proven: BTreeSet::new() };
    let ctx = |what: String| format!("seed {seed}: {what}\nprogram:\n{src}\ninputs: {inputs:?}");
    let mut checked_facts = 0;
    for (rel, r) in program.relations.iter().enumerate() {
        if r.kind != DeclKind::Output {
            continue;
        }
        let held = db.get(&rel).cloned().unwrap_or_default();
        // Every derived fact: explained, and the explanation is a proof.
        for row in &held {
            let key = key_of(&program, rel, row);
            let e = explain::explain(&exdb, &key, None, true, explain::Options::default()).map_err(|e| ctx(e.to_string()))?;
            if !e.holds || e.why_not.is_some() || e.proofs.len() != 1 {
                return Err(ctx(format!("{key}: holds {} with {} proofs and why-not {}", e.holds, e.proofs.len(), e.why_not.is_some())));
            }
            checker.proven.clear();
            checker.node(&e.proofs[0]).map_err(|m| ctx(format!("{key}: {m}\n{}", explain::render::text(&e))))?;
            checked_facts += 1;
        }
        // Facts that do not hold: a why-not, never a proof, and its claims are true.
        if r.columns.iter().all(|c| c.ty == ccattler_parser::ast::Type::Int) {
            for _ in 0..4 {
                let row: Row = smallvec::smallvec![Value::Int(rng.below(DOMAIN) as i64), Value::Int(rng.below(DOMAIN) as i64 + 1)];
                if held.contains(&row) {
                    continue;
                }
                let key = key_of(&program, rel, &row);
                let e = explain::explain(&exdb, &key, None, true, explain::Options::default()).map_err(|e| ctx(e.to_string()))?;
                let w = e.why_not.as_ref().filter(|_| !e.holds && e.proofs.is_empty()).ok_or_else(|| ctx(format!("{key} does not hold but is explained")))?;
                let rules = program.rules.iter().filter(|x| x.head == rel).count();
                if w.rules.len() != rules {
                    return Err(ctx(format!("{key}: {} of {rules} rules accounted for", w.rules.len())));
                }
                for rw in &w.rules {
                    if rw.head_mismatch.is_none() && rw.failures.is_empty() {
                        return Err(ctx(format!("{key}: rule {} neither fails nor mismatches", rw.rule.text)));
                    }
                    for f in rw.failures.iter().flat_map(|f| &f.failed) {
                        let (Some(name), Some(pattern)) = (&f.relation, &f.pattern) else { continue };
                        let prel = checker.rel(name).map_err(ctx)?;
                        let any =
                            db.get(&prel).into_iter().flatten().any(|row| pattern.iter().zip(row).all(|(p, v)| p.as_ref().is_none_or(|p| value(p) == *v)));
                        let claim_true = if f.reason == "holds" { any } else { !any };
                        if !claim_true {
                            return Err(ctx(format!("{key}: false claim `{}` — {}", f.instance, f.reason)));
                        }
                    }
                }
            }
        }
    }
    Ok(checked_facts)
}

#[test]
fn explanations_are_proofs_and_why_nots_are_true() {
    if let Ok(seed) = std::env::var("EXPLAIN_SEED") {
        let seed: u64 = seed.parse().expect("EXPLAIN_SEED is a number");
        run_case(seed).unwrap_or_else(|e| panic!("{e}"));
        return;
    }
    let cases: u64 = std::env::var("EXPLAIN_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(200);
    let mut facts = 0;
    for seed in 1..=cases {
        facts += run_case(seed * 7919).unwrap_or_else(|e| panic!("{e}\nreplay: EXPLAIN_SEED={}", seed * 7919));
    }
    // The check must have had something to check.
    assert!(facts > cases as usize, "only {facts} derived facts in {cases} programs");
}
