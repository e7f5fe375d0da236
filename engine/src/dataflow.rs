//! Plans → one differential dataflow. Relations are collections of rows; each
//! stratum is built in order; recursive strata iterate to a fixed point.

use crate::plan::{compare, AtomFilter, CExpr, CHead, RulePlan, Step};
use crate::rows::{RowKeyBatcher, RowKeyBuilder, RowKeySpine, RowRef, RowValBatcher, RowValBuilder, RowValSpine};
use crate::temporal;
use crate::value::{Row, Value};
use ccattler_parser::program::{Builtin, Program, RelId};
use differential_dataflow::lattice::Lattice;
use differential_dataflow::operators::arrange::{Arranged, TraceAgent};
use differential_dataflow::operators::iterate::VecVariable;
use differential_dataflow::VecCollection;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use timely::order::Product;
use timely::progress::Timestamp;

pub type Coll<'s, T> = VecCollection<'s, T, Row, isize>;
/// A relation's current tuples, readable by point-in-time queries.
pub type QueryTrace = TraceAgent<RowKeySpine<u64>>;
/// A relation's facts arranged by a join key: (key values, the others).
pub type JoinTrace = TraceAgent<RowValSpine<u64>>;
pub type Arr<'s, T> = Arranged<'s, TraceAgent<RowValSpine<T>>>;
/// A set of rows, arranged (what `distinct` makes).
pub type SetArr<'s, T> = Arranged<'s, TraceAgent<RowKeySpine<T>>>;

/// (key, rest) pairs arranged by key, rows laid end to end ([`crate::rows`]).
fn arrange_pairs<'s, T: Timestamp + Lattice + Ord>(pairs: VecCollection<'s, T, (Row, Row), isize>, name: &str) -> Arr<'s, T> {
    pairs.arrange_named::<RowValBatcher<T>, RowValSpine<T>>(name, RowValBatcher::new)
}

/// Rows arranged as a set of keys, laid end to end ([`crate::rows`]).
pub fn arrange_set<'s, T: Timestamp + Lattice + Ord>(rows: Coll<'s, T>, name: &str) -> SetArr<'s, T> {
    rows.map(|row| (row, ())).arrange_named::<RowKeyBatcher<T>, RowKeySpine<T>>(name, RowKeyBatcher::new)
}

/// Collections and shared arrangements of one scope. Ordered maps only: every
/// worker must build the same operators in the same order.
struct Scope<'s, T: Timestamp + Lattice> {
    rels: BTreeMap<RelId, Coll<'s, T>>,
    /// One empty row: where a rule with no leading atom starts.
    unit: Coll<'s, T>,
    /// Arrangements of relations by join key, shared by every rule that joins
    /// the same relation, with the same filter, on the same positions: each
    /// fact as (its values at the key's positions, its other values).
    arranged: BTreeMap<(RelId, AtomFilter, Vec<usize>), Arr<'s, T>>,
    /// What anti-joins look up ([`Scope::present`]), shared like `arranged`.
    present: BTreeMap<(RelId, AtomFilter, Vec<usize>), SetArr<'s, T>>,
    /// Relation names, for naming operators.
    names: Rc<[String]>,
    /// Relation arities, and whether each relation's rows are a set (all
    /// but a built-in's, [`build`]).
    arities: Rc<[(usize, bool)]>,
    /// The relations operators of this scope read (not those only looked
    /// up in arrangements built elsewhere).
    read: BTreeSet<RelId>,
    /// `distinct` as this scope's time allows ([`distinct_total`] where it
    /// is a revision).
    dedup: fn(Coll<'s, T>, &str) -> Coll<'s, T>,
    /// A join run as a temporal filter ([`temporal`]), where time is a
    /// revision (its operator takes revisions in order).
    temporal: Option<fn(Coll<'s, T>, Coll<'s, T>, temporal::Placed, &str) -> Coll<'s, T>>,
    /// Each temporal join's relation and where it says what it is quiet for.
    quiet: Vec<(RelId, Arc<temporal::Quiet>)>,
}

impl<'s, T: Timestamp + Lattice + Ord> Scope<'s, T> {
    /// A relation's collection, for an operator to read.
    fn relation(&mut self, rel: RelId) -> Coll<'s, T> {
        self.read.insert(rel);
        self.rels.get(&rel).cloned().expect("strata are built in dependency order")
    }

    fn arrangement(&mut self, rel: RelId, filter: &AtomFilter, key_pos: Vec<usize>) -> Arr<'s, T> {
        let at = (rel, filter.clone(), key_pos.clone());
        if let Some(arranged) = self.arranged.get(&at) {
            return arranged.clone();
        }
        let arranged = arrange_join(self.relation(rel), filter, key_pos, &self.names[rel]);
        self.arranged.insert(at, arranged.clone());
        arranged
    }

    /// The distinct values of `rel`'s facts at `positions` (those `filter`
    /// accepts), arranged: what an anti-join looks up. Shared by every rule
    /// of the scope that anti-joins the same atom.
    fn present(&mut self, rel: RelId, filter: &AtomFilter, positions: Vec<usize>) -> SetArr<'s, T> {
        let at = (rel, filter.clone(), positions.clone());
        if let Some(present) = self.present.get(&at) {
            return present.clone();
        }
        let (arity, set) = self.arities[rel];
        let present = arrange_present(self.relation(rel), filter, positions, &self.names[rel], arity, set);
        self.present.insert(at, present.clone());
        present
    }

    /// The bindings after a rule's first two atoms where nothing comes
    /// between them ([`paired_start`]), then `finish` (the steps after the
    /// second). A join joins the two relations' arrangements by the key
    /// (`pos_a`: the first atom's positions of the key's variables); an
    /// anti-join takes the first relation's facts less those its
    /// arrangement by the key meets in the second's.
    fn paired_join(&mut self, segments: &[(Option<&Step>, Vec<Step>)], pos_a: Vec<usize>, finish: Finish, nvars: usize) -> Coll<'s, T> {
        let Some(Step::Join { rel: rel_a, filter: filter_a, bind: bind_a, .. }) = segments[0].0 else { unreachable!("paired_start checked it is a join") };
        let a = self.arrangement(*rel_a, filter_a, pos_a.clone());
        // Where each variable sits in what a join hands over: the key's in
        // the key; the others in each fact's rest (its positions outside
        // the key, in order).
        let arities = self.arities.clone();
        let in_rest = move |rel: RelId, key_pos: &[usize], bind: &[(usize, usize)]| -> Vec<(usize, usize)> {
            let rest: Vec<usize> = (0..arities[rel].0).filter(|p| !key_pos.contains(p)).collect();
            bind.iter().filter_map(|(p, var)| rest.iter().position(|r| r == p).map(|at| (at, *var))).collect()
        };
        let from_a = in_rest(*rel_a, &pos_a, bind_a);
        let (rel_b, filter_b, key, bind_b) = match segments[1].0 {
            Some(Step::Join { rel, filter, key, bind }) => (rel, filter, key, bind),
            Some(Step::AntiJoin { rel, filter, key }) => {
                let key_vars: Vec<usize> = key.iter().map(|(_, var)| *var).collect();
                let present = self.present(*rel, filter, key.iter().map(|(p, _)| *p).collect());
                // The first atom's bindings, as a scan of it makes them…
                let (f, bind) = (filter_a.clone(), bind_a.clone());
                let all = self.relation(*rel_a).filter(move |fact| f.accepts(fact)).map(move |fact| scanned_row(nvars, &bind, &fact));
                // … less those whose key is present: the same rows, made from
                // (key, rest) as the join hands them over.
                let matched = a.join_core(present, move |k: RowRef, rest_a: RowRef, _: &()| Some(joined_row(nvars, &key_vars, &k, &[(&from_a, &rest_a)])));
                return all.concat(matched.negate()).flat_map(move |row| finish.run(row));
            }
            _ => unreachable!("paired_start checked it is a join or an anti-join"),
        };
        let pos_b: Vec<usize> = key.iter().map(|(p, _)| *p).collect();
        let b = self.arrangement(*rel_b, filter_b, pos_b.clone());
        let from_b = in_rest(*rel_b, &pos_b, bind_b);
        let key_vars: Vec<usize> = key.iter().map(|(_, var)| *var).collect();
        a.join_core(b, move |k: RowRef, rest_a: RowRef, rest_b: RowRef| finish.run(joined_row(nvars, &key_vars, &k, &[(&from_a, &rest_a), (&from_b, &rest_b)])))
    }

    /// The head rows one rule derives (not yet deduplicated).
    ///
    /// The plan is cut into segments: a leading atom or a join/anti-join, then
    /// the filters, assignments and ranges after it, which run inside the same
    /// operator's closure (and the head projection inside the last one).
    /// A binding goes into a join or an anti-join as (the key's variables,
    /// the rest of those still read after it: [`layouts`]), so what the
    /// operator arranges holds each value once and nothing no later step
    /// reads; between operators it streams as a full row (nothing holds it).
    /// `set_bindings`: the bindings of an aggregate rule are known to be a
    /// set ([`aggregate_bindings_are_set`]), so they are aggregated as they
    /// are, not deduplicated first.
    fn rule(&mut self, plan: &Rc<RulePlan>, set_bindings: bool) -> Coll<'s, T> {
        let nvars = plan.nvars;
        let aggregate = plan.has_aggregate();
        let segments = segments(&plan.steps);
        let layouts = layouts(plan, &segments);
        let last = segments.len().saturating_sub(1);
        let mut b: Option<Coll<'s, T>> = None;
        let mut skip = 0;
        let arities = self.arities.clone();
        let mut temporal = self.temporal.and_then(|join| Some((join, temporal::find(plan, |rel| arities[rel].0)?)));
        if let Some(pos_a) = paired_start(&segments).filter(|_| !matches!(temporal, Some((_, (1, _))))) {
            let finish = Finish { pure: segments[1].1.clone().into(), head: (last == 1 && !aggregate).then(|| plan.clone()) };
            b = Some(self.paired_join(&segments, pos_a, finish, nvars));
            skip = 2;
        }
        for (n, (head, pure)) in segments.into_iter().enumerate().skip(skip) {
            // What to do with each binding after this segment's operator: the
            // head rows after the last (unless aggregated: full bindings).
            let finish = Finish { pure: pure.into(), head: (n == last && !aggregate).then(|| plan.clone()) };
            // The variables a binding arrives with that are still read.
            let arriving: Rc<[usize]> = if n == 0 { Rc::from(Vec::new()) } else { layouts[n - 1].clone() };
            if let Some((join, (_, t))) = temporal.take_if(|(_, (at, _))| *at == n) {
                let facts = self.relation(t.rel);
                let name = format!("Bindings of {} against {} (temporal)", plan.label, self.names[t.rel]);
                let blank = finish.head.is_none() && t.hidden();
                let quiet = Arc::new(temporal::Quiet::default());
                self.quiet.push((t.rel, quiet.clone()));
                let placed = temporal::Placed { temporal: t, arriving, nvars, blank, finish: Rc::new(move |row| finish.run(row)), quiet };
                b = Some(join(b.expect("a temporal join follows a segment"), facts, placed, &name));
                continue;
            }
            b = Some(match (head, b) {
                // A leading atom is a scan of its relation, not a join.
                (Some(Step::Join { rel, filter, key, bind }), None) => {
                    debug_assert!(key.is_empty());
                    let (f, bind) = (filter.clone(), bind.clone());
                    self.relation(*rel).filter(move |row| f.accepts(row)).flat_map(move |fact| finish.run(scanned_row(nvars, &bind, &fact)))
                }
                (Some(Step::Join { rel, filter, key, bind }), Some(b)) => {
                    let key_pos: Vec<usize> = key.iter().map(|(p, _)| *p).collect();
                    let arr = self.arrangement(*rel, filter, key_pos.clone());
                    let split = KeyCut::new(&arriving, key);
                    // Where each bound position sits in the arranged fact's rest
                    // (a bound position is never a key position).
                    debug_assert!(bind.iter().all(|(pos, _)| !key_pos.contains(pos)));
                    let bind: Vec<(usize, usize)> = bind.iter().map(|(pos, var)| (pos - key_pos.iter().filter(|k| *k < pos).count(), *var)).collect();
                    let s = split.clone();
                    let left = format!("Bindings of {} into {}", plan.label, self.names[*rel]);
                    arrange_pairs(b.map(move |row| s.split(row)), &left).join_core(arr, move |k: RowRef, rest: RowRef, fact_rest: RowRef| {
                        let mut out = split.join(nvars, k.0, rest.0);
                        for (at, var) in &bind {
                            out[*var] = fact_rest[*at].clone();
                        }
                        finish.run(out)
                    })
                }
                (Some(Step::AntiJoin { rel, filter, key }), b) => {
                    let b = b.unwrap_or_else(|| self.unit.clone().map(move |_| Row::new()));
                    let positions: Vec<usize> = key.iter().map(|(p, _)| *p).collect();
                    let present = self.present(*rel, filter, positions);
                    let split = KeyCut::new(&arriving, key);
                    let s = split.clone();
                    // b ▷ present = b − (b ⋈ present), joined against the
                    // arrangement `distinct` already built.
                    let left = b.map(move |row| s.split(row));
                    let name = format!("Bindings of {} against {}", plan.label, self.names[*rel]);
                    let matched = arrange_pairs(left.clone(), &name).join_core(present, |k: RowRef, v: RowRef, _| Some((k.to_row(), v.to_row())));
                    left.concat(matched.negate()).flat_map(move |(k, rest)| finish.run(split.join(nvars, &k, &rest)))
                }
                // No atom yet: start from the one empty row.
                (None, None) => self.unit.clone().flat_map(move |_| finish.run(Row::from_elem(Value::Int(0), nvars))),
                (None, Some(b)) => b.flat_map(move |row| finish.run(row)),
                (Some(_), _) => unreachable!("segments start with a join or an anti-join"),
            });
        }
        let b = b.unwrap_or_else(|| {
            let finish = Finish { pure: Rc::from(Vec::new()), head: (!aggregate).then(|| plan.clone()) };
            self.unit.clone().flat_map(move |_| finish.run(Row::from_elem(Value::Int(0), nvars)))
        });
        if !aggregate {
            return b;
        }
        // Aggregates range over the distinct bindings of the body.
        let (p1, p2, p3) = (plan.clone(), plan.clone(), plan.clone());
        let bindings = if set_bindings { b } else { (self.dedup)(b, &format!("Bindings of {} (aggregated)", plan.label)) };
        let groups = bindings.flat_map(move |row| p1.group_and_args(&row));
        arrange_pairs(groups, &format!("Arrange Aggregate of {}", plan.label))
            .reduce_abelian::<_, RowValBuilder<T>, RowValSpine<T>, _, _>(
                &format!("Aggregate of {}", plan.label),
                move |_group, input: &[(RowRef, isize)], out: &mut Vec<(Row, isize)>| {
                    if let Some(aggs) = p2.aggregate(input) {
                        out.push((aggs, 1));
                    }
                },
                keyed,
            )
            .as_collection(move |group: RowRef, aggs: RowRef| p3.head_from_group(&group, &aggs))
    }
}

/// A binding of `nvars` variables from a leading atom's fact: `bind` says
/// which position gives which variable.
fn scanned_row(nvars: usize, bind: &[(usize, usize)], fact: &[Value]) -> Row {
    let mut row = Row::from_elem(Value::Int(0), nvars);
    for (pos, var) in bind {
        row[*var] = fact[*pos].clone();
    }
    row
}

/// A binding of `nvars` variables from what a join of two arrangements hands
/// over: the key's variables from the key, the others from each side's rest
/// (`(place in the rest, variable)` pairs).
fn joined_row(nvars: usize, key_vars: &[usize], key: &[Value], rests: &[(&[(usize, usize)], &[Value])]) -> Row {
    let mut row = Row::from_elem(Value::Int(0), nvars);
    for (at, var) in key_vars.iter().enumerate() {
        row[*var] = key[at].clone();
    }
    for (places, rest) in rests {
        for (at, var) in places.iter() {
            row[*var] = rest[*at].clone();
        }
    }
    row
}

/// Whether a rule starts with an atom joined or anti-joined at once with a
/// second (no filter, assignment or range between them): then the first is
/// looked up in its arrangement by the key, shared with every rule that
/// looks it up alike, and its bindings are not arranged for this rule
/// alone ([`Scope::paired_join`]). The first atom's positions of the key's
/// variables, if so.
fn paired_start(segments: &[(Option<&Step>, Vec<Step>)]) -> Option<Vec<usize>> {
    let [(Some(Step::Join { key: leading, bind, .. }), between), (Some(Step::Join { key, .. } | Step::AntiJoin { key, .. }), _), ..] = segments else {
        return None;
    };
    if !leading.is_empty() || !between.is_empty() {
        return None;
    }
    key.iter().map(|(_, var)| bind.iter().find(|(_, v)| v == var).map(|(p, _)| *p)).collect()
}

/// Splits a plan into (join or anti-join, the pure steps after it). A plan
/// that starts with pure steps gets a first segment without a join.
pub(crate) fn segments(steps: &[Step]) -> Vec<(Option<&Step>, Vec<Step>)> {
    let mut out: Vec<(Option<&Step>, Vec<Step>)> = Vec::new();
    for step in steps {
        match step {
            Step::Join { .. } | Step::AntiJoin { .. } => out.push((Some(step), Vec::new())),
            pure => match out.last_mut() {
                Some((_, p)) => p.push(pure.clone()),
                None => out.push((None, vec![pure.clone()])),
            },
        }
    }
    out
}

/// The variables each segment's bindings leave with, in order: those read by
/// a later step or the head. An aggregate ranges over the distinct bindings
/// of its body, so an aggregate rule's bindings keep every variable bound so
/// far (two bindings that differ only in one no step reads are two).
pub(crate) fn layouts(plan: &RulePlan, segments: &[(Option<&Step>, Vec<Step>)]) -> Vec<Rc<[usize]>> {
    let aggregate = plan.has_aggregate();
    let mut head_reads = BTreeSet::new();
    for h in &plan.head_terms {
        match h {
            CHead::Expr(e) => e.vars(&mut head_reads),
            CHead::Agg(_, es) => es.iter().for_each(|e| e.vars(&mut head_reads)),
        }
    }
    // Read after segment n: by the segments after it, or the head.
    let mut read_after = vec![head_reads; segments.len()];
    for n in (0..segments.len().saturating_sub(1)).rev() {
        let mut r = read_after[n + 1].clone();
        let (head, pure) = &segments[n + 1];
        for step in head.iter().copied().chain(pure) {
            step.reads(&mut r);
        }
        read_after[n] = r;
    }
    let mut bound = BTreeSet::new();
    segments
        .iter()
        .zip(read_after)
        .map(|((head, pure), read)| {
            for step in head.iter().copied().chain(pure) {
                step.binds(&mut bound);
            }
            let keep: Vec<usize> = bound.iter().copied().filter(|v| aggregate || read.contains(v)).collect();
            Rc::from(keep)
        })
        .collect()
}

/// A full binding row cut for a join or an anti-join on `key`'s variables:
/// (the key's values, the values of the other variables still read after
/// it), and put back together as a full row (one slot per rule variable).
#[derive(Clone)]
struct KeyCut {
    key: Rc<[usize]>,
    rest: Rc<[usize]>,
}

impl KeyCut {
    fn new(live: &[usize], key: &[(usize, usize)]) -> KeyCut {
        let key: Vec<usize> = key.iter().map(|(_, v)| *v).collect();
        debug_assert!(key.iter().all(|v| live.contains(v)), "a join key variable is bound before the join");
        KeyCut { rest: live.iter().copied().filter(|v| !key.contains(v)).collect(), key: key.into() }
    }

    fn split(&self, row: Row) -> (Row, Row) {
        (self.key.iter().map(|v| row[*v].clone()).collect(), self.rest.iter().map(|v| row[*v].clone()).collect())
    }

    fn join(&self, nvars: usize, key: &[Value], rest: &[Value]) -> Row {
        let mut full = Row::from_elem(Value::Int(0), nvars);
        for (v, x) in self.key.iter().zip(key) {
            full[*v] = x.clone();
        }
        for (v, x) in self.rest.iter().zip(rest) {
            full[*v] = x.clone();
        }
        full
    }
}

/// Filters, assignments and ranges applied to one binding, then (for the last
/// segment of a non-aggregate rule) the head projection.
struct Finish {
    pure: Rc<[Step]>,
    head: Option<Rc<RulePlan>>,
}

impl Finish {
    fn run(&self, row: Row) -> Vec<Row> {
        let mut rows = vec![row];
        for step in self.pure.iter() {
            rows = match step {
                Step::Filter { op, lhs, rhs } => rows
                    .into_iter()
                    .filter(|row| match (lhs.eval(row), rhs.eval(row)) {
                        (Some(a), Some(b)) => compare(*op, &a, &b),
                        _ => false,
                    })
                    .collect(),
                Step::Assign { var, expr } => rows
                    .into_iter()
                    .filter_map(|mut row| {
                        row[*var] = expr.eval(&row)?;
                        Some(row)
                    })
                    .collect(),
                Step::Range { var, lo, hi } => rows
                    .into_iter()
                    .flat_map(|row| {
                        let lo = lo.eval(&row).and_then(|v| v.as_int());
                        let hi = hi.eval(&row).and_then(|v| v.as_int());
                        let (l, h) = lo.zip(hi).unwrap_or((0, 0));
                        (l..h.max(l)).map(move |i| {
                            let mut r = row.clone();
                            r[*var] = Value::Int(i);
                            r
                        })
                    })
                    .collect(),
                Step::Join { .. } | Step::AntiJoin { .. } => unreachable!("only pure steps are fused"),
            };
            if rows.is_empty() {
                break;
            }
        }
        match &self.head {
            Some(plan) => rows.iter().filter_map(|b| plan.head_row(b)).collect(),
            None => rows,
        }
    }
}

impl<'s> Scope<'s, u64> {
    /// A built-in over whole relations. `assign` needs every input at once, so
    /// all rows meet on one worker and the assignment is recomputed when any
    /// of them changes; its inputs stay small (one row a node, and (service,
    /// node) rows only where a service has instances or is restricted), and
    /// with nothing pending it returns at once.
    fn builtin(&mut self, b: &Builtin) -> Coll<'s, u64> {
        let tagged: Vec<Coll<'s, u64>> = b.reads().into_iter().enumerate().map(|(i, rel)| tag(i, self.relation(rel))).collect();
        let (body, name): (fn(&[(&Row, isize)]) -> Vec<Row>, &str) = match b {
            Builtin::Assign(_) => (crate::builtin::assign_rows, "Built-in assign"),
            Builtin::Preempt(_) => (crate::builtin::preempt_rows, "Built-in preempt"),
        };
        let rows = differential_dataflow::collection::concatenate(self.unit.scope(), tagged);
        if builtins_by_reduce() {
            return rows.map(|row| ((), row)).reduce(move |_unit, input, out| out.extend(body(input).into_iter().map(|r| (r, 1)))).map(|((), row)| row);
        }
        whole(rows, body, name)
    }
}

/// Whether built-ins run as differential's `reduce` on one key, as before
/// [`whole`] (`CCATTLER_ENGINE_BUILTINS=reduce`, for comparing; unset or
/// `whole`: [`whole`]). Read once per process, as the runtime reads
/// `CCATTLER_ENGINE_HUBS`: every worker builds the same operators.
fn builtins_by_reduce() -> bool {
    static BY_REDUCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BY_REDUCE.get_or_init(|| {
        let named = std::env::var("CCATTLER_ENGINE_BUILTINS").ok();
        builtins_named(named.as_deref()).unwrap_or_else(|why| {
            tracing::warn!("{why}; built-ins run whole");
            false
        })
    })
}

/// `CCATTLER_ENGINE_BUILTINS`'s value: whether built-ins run by `reduce`.
fn builtins_named(name: Option<&str>) -> Result<bool, String> {
    match name {
        None | Some("whole") => Ok(false),
        Some("reduce") => Ok(true),
        Some(other) => Err(format!("CCATTLER_ENGINE_BUILTINS={other:?} is not whole or reduce")),
    }
}

/// `body` over a whole collection, on one worker: the rows as they stand
/// at each revision the collection changed, and the difference of what
/// `body` makes of them from what it made before. The operator holds the
/// rows and its last output and nothing else; differential's `reduce` on
/// one key, which this replaces, replayed the key's history from its
/// arrangement at each revision — at 5,000 nodes as long again as `assign`
/// itself took — from a spine that cloned every row it merged.
///
/// `body` sees the rows in `Row` order, with their multiplicities (never
/// zero), as `reduce` gave them.
fn whole<'s>(rows: Coll<'s, u64>, body: fn(&[(&Row, isize)]) -> Vec<Row>, name: &str) -> Coll<'s, u64> {
    use differential_dataflow::AsCollection;
    use timely::dataflow::channels::pact::Exchange;
    use timely::dataflow::operators::generic::Operator;
    use timely::dataflow::operators::Capability;
    // Every row meets on the first worker.
    let one_worker = Exchange::new(|_: &(Row, u64, isize)| 0u64);
    rows.inner
        .unary_frontier::<timely::container::CapacityContainerBuilder<Vec<(Row, u64, isize)>>, _, _, _>(one_worker, name, move |_, _| {
            // Per revision not yet passed: a capability for it and its changes.
            let mut pending: BTreeMap<u64, (Capability<u64>, Vec<(Row, isize)>)> = BTreeMap::new();
            let mut held: BTreeMap<Row, isize> = BTreeMap::new();
            let mut made: Vec<Row> = Vec::new();
            move |(input, frontier), output| {
                let port = output.output_index();
                input.for_each(|cap, data| {
                    for (row, t, d) in data.drain(..) {
                        pending.entry(t).or_insert_with(|| (cap.delayed(&t, port), Vec::new())).1.push((row, d));
                    }
                });
                // Revisions the input has passed, in order.
                while let Some(entry) = pending.first_entry() {
                    let t = *entry.key();
                    if frontier.less_equal(&t) {
                        break;
                    }
                    let (cap, mut changes) = entry.remove();
                    differential_dataflow::consolidation::consolidate(&mut changes);
                    if changes.is_empty() {
                        continue;
                    }
                    for (row, d) in changes {
                        match held.entry(row) {
                            std::collections::btree_map::Entry::Vacant(v) => {
                                v.insert(d);
                            }
                            std::collections::btree_map::Entry::Occupied(mut o) => {
                                *o.get_mut() += d;
                                if *o.get() == 0 {
                                    o.remove();
                                }
                            }
                        }
                    }
                    let rows: Vec<(&Row, isize)> = held.iter().map(|(row, m)| (row, *m)).collect();
                    let mut now = body(&rows);
                    now.sort_unstable();
                    let mut diff: Vec<(Row, isize)> = made.iter().map(|row| (row.clone(), -1)).chain(now.iter().map(|row| (row.clone(), 1))).collect();
                    differential_dataflow::consolidation::consolidate(&mut diff);
                    made = now;
                    if !diff.is_empty() {
                        output.session(&cap).give_iterator(diff.into_iter().map(|(row, d)| (row, t, d)));
                    }
                }
            }
        })
        .as_collection()
}

/// What [`build`] makes: a collection per relation; for each output relation
/// its rows tagged with the rule that derived them (`[rule, row…]`, with
/// multiplicity), so a conflict can name the rules behind each value; and the
/// query traces that deduplication already built.
pub struct Built<'s> {
    pub relations: BTreeMap<RelId, Coll<'s, u64>>,
    pub attributed: BTreeMap<RelId, Coll<'s, u64>>,
    pub traces: BTreeMap<RelId, QueryTrace>,
    /// The relations an operator reads: an input of the part outside it is
    /// only looked up in a hub's arrangement ([`Imported`]).
    pub read: BTreeSet<RelId>,
    /// The temporal joins' relations and what each is quiet for.
    pub quiet: Vec<(RelId, Arc<temporal::Quiet>)>,
}

/// `distinct` at the top level (time is a revision), keeping the arrangement
/// it counts rows in as the relation's query trace: a query reads a row
/// with a positive count as there ([`crate::runtime`]'s `read_trace`), so
/// the relation needs no second arrangement.
fn distinct_with_trace<'s>(rows: Coll<'s, u64>, name: &str) -> (Coll<'s, u64>, QueryTrace) {
    let counted = arrange_set(rows, &format!("Arrange {name}"));
    let trace = counted.trace.clone();
    (distinct_total(counted, name), trace)
}

/// `distinct` where time is totally ordered (a revision): a row is in the
/// output while its count in `counted` is positive, read from that one
/// arrangement (what it was before a batch, then after each of its times),
/// so no arrangement of the output is kept, as `reduce` keeps one.
/// Differential's `ThresholdTotal`, for rows laid end to end.
fn distinct_total<'s>(counted: SetArr<'s, u64>, name: &str) -> Coll<'s, u64> {
    use differential_dataflow::trace::cursor::{cursor_list, Cursor};
    use differential_dataflow::trace::TraceReader;
    use differential_dataflow::AsCollection;
    use timely::dataflow::channels::pact::Pipeline;
    use timely::dataflow::operators::{CapabilitySet, Operator};
    use timely::progress::Antichain;
    let mut trace = counted.trace.clone();
    counted
        .stream
        .unary_frontier::<timely::container::CapacityContainerBuilder<Vec<(Row, u64, isize)>>, _, _, _>(Pipeline, name, move |_, _| {
            // Batches come in order: [lower, upper) is what arrived this time.
            let mut lower = Antichain::from_elem(0u64);
            let mut upper = Antichain::from_elem(0u64);
            move |(input, _frontier), output| {
                lower.clone_from(&upper);
                let mut batches = Vec::new();
                let mut caps = CapabilitySet::new();
                input.for_each(|cap, spans| {
                    for cap in cap.retain_stamp(0).iter() {
                        caps.insert(cap.clone());
                    }
                    for span in spans.drain(..) {
                        upper.clone_from(span.upper());
                        batches.extend(span.inner);
                    }
                });
                if !caps.is_empty() {
                    let mut session = output.session(&caps);
                    let (mut new, new_storage) = cursor_list(batches);
                    let (mut old, old_storage) =
                        cursor_list(trace.batches_through(lower.borrow()).expect("the trace is not compacted past what this operator read"));
                    while let Some(row) = new.get_key(&new_storage) {
                        let mut count = 0isize;
                        old.seek_key(&old_storage, row);
                        if old.get_key(&old_storage) == Some(row) {
                            old.map_times(&old_storage, |_, d| count += *d);
                        }
                        // The batches in order, each key's times in order.
                        new.map_times(&new_storage, |t, d| {
                            let was = count > 0;
                            count += *d;
                            if was != (count > 0) {
                                session.give((row.to_row(), *t, if was { -1 } else { 1 }));
                            }
                        });
                        new.step_key(&new_storage);
                    }
                }
                trace.advance_upper(&mut upper);
                trace.set_logical_compaction(upper.borrow());
                trace.set_physical_compaction(upper.borrow());
            }
        })
        .as_collection()
}

/// `distinct` in a scope whose time is a revision.
fn dedup_total<'s>(rows: Coll<'s, u64>, name: &str) -> Coll<'s, u64> {
    distinct_total(arrange_set(rows, &format!("Arrange {name}")), name)
}

/// `distinct` in any scope (an iteration's time is not totally ordered).
fn dedup<'s, T: Timestamp + Lattice + Ord>(rows: Coll<'s, T>, name: &str) -> Coll<'s, T> {
    rows_of(distinct_arranged(rows, name))
}

/// `distinct` as an arrangement of its output, which joins and queries can
/// use as it is.
fn distinct_arranged<'s, T: Timestamp + Lattice + Ord>(rows: Coll<'s, T>, name: &str) -> SetArr<'s, T> {
    arrange_set(rows, &format!("Arrange {name}")).reduce_abelian::<_, RowKeyBuilder<T>, RowKeySpine<T>, _, _>(
        name,
        |_row, _count, out| out.push(((), 1)),
        keyed,
    )
}

/// What a `reduce` hands its output builder: each of one key's output
/// updates, with the key.
fn keyed<V, T>(out: &mut Vec<((Row, V), T, isize)>, key: RowRef, upds: &mut Vec<(V, T, isize)>) {
    out.clear();
    out.extend(upds.drain(..).map(|(v, t, r)| ((key.to_row(), v), t, r)));
}

/// A set's rows as a collection again.
fn rows_of<'s, T: Timestamp + Lattice + Ord>(set: SetArr<'s, T>) -> Coll<'s, T> {
    set.as_collection(|row: RowRef, _| row.to_row())
}

/// The variables a rule's positive atoms and ranges bind, if its bindings
/// are a set whenever the relations it scans and joins are: every position
/// of every positive atom is a variable or a constant (no `_`, so a binding
/// determines the atom rows it came from and each is in its relation once).
/// Anti-joins, filters and assignments keep a set a set.
fn set_bindings(plan: &RulePlan, sets: &BTreeSet<RelId>, arity: impl Fn(RelId) -> usize) -> Option<Vec<usize>> {
    let mut bound = Vec::new();
    for step in &plan.steps {
        match step {
            Step::Join { rel, filter, key, bind } => {
                let covered = filter.consts.len() + filter.eqs.len() + key.len() + bind.len();
                if !sets.contains(rel) || covered != arity(*rel) {
                    return None;
                }
                bound.extend(bind.iter().map(|(_, v)| *v));
            }
            Step::Range { var, .. } => bound.push(*var),
            Step::AntiJoin { .. } | Step::Filter { .. } | Step::Assign { .. } => {}
        }
    }
    Some(bound)
}

/// Whether a rule's head rows are a set whenever the relations it scans and
/// joins are: its bindings are ([`set_bindings`]), and the head keeps every
/// variable an atom or a range binds (assigned ones are functions of the
/// rest), so two bindings never give one head row. Such a relation needs no
/// `distinct`.
///
/// ```text
/// view_image(n, i, img) :- placed_version(n, i, s, v), template_image(s, v, img).
/// ```
/// is one (each head row names the one pair of rows behind it); dropping `s`
/// or `v` from the head would not be.
fn yields_set(plan: &RulePlan, sets: &BTreeSet<RelId>, arity: impl Fn(RelId) -> usize) -> bool {
    let kept: Vec<usize> = plan.head_terms.iter().filter_map(|h| if let CHead::Expr(CExpr::Var(v)) = h { Some(*v) } else { None }).collect();
    !plan.has_aggregate() && set_bindings(plan, sets, arity).is_some_and(|bound| bound.iter().all(|v| kept.contains(v)))
}

/// Whether an aggregate rule's bindings are a set as they stand, so the
/// aggregate needs no `distinct` of them: they keep every variable bound
/// ([`layouts`]), so [`set_bindings`] is all it takes.
///
/// ```text
/// block_queued(s, b, count()) :- queued(_, s, _, b).
/// ```
/// is one (in an aggregate rule each `_` binds a hidden variable, so a
/// binding names the one `queued` row behind it); a rule that reads a
/// built-in's relation (not known to be a set) is not.
fn aggregate_bindings_are_set(plan: &RulePlan, sets: &BTreeSet<RelId>, arity: impl Fn(RelId) -> usize) -> bool {
    plan.has_aggregate() && set_bindings(plan, sets, arity).is_some()
}

fn tag<'s, T: Timestamp + Lattice + Ord>(rule: usize, rows: Coll<'s, T>) -> Coll<'s, T> {
    rows.map(move |row| std::iter::once(Value::Int(rule as i64)).chain(row).collect())
}

/// Builds every stratum into `scope`. `inputs` holds a collection per input
/// relation.
/// The program's independent parts: relations joined when a rule reads one
/// and derives the other (or a built-in reads one for the other), as
/// connected components, each sorted and the list ordered by its first
/// relation. Each part is a dataflow of its own, so a revision that changes
/// nothing a part reads costs that part nothing (see `runtime`).
pub fn components(program: &Program, plans: &[Rc<RulePlan>]) -> Vec<Vec<RelId>> {
    let n = program.relations.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut union = |a: usize, b: usize| {
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    };
    for p in plans {
        for step in &p.steps {
            if let Step::Join { rel, .. } | Step::AntiJoin { rel, .. } = step {
                union(p.head, *rel);
            }
        }
    }
    for (rel, r) in program.relations.iter().enumerate() {
        for read in r.builtin.iter().flat_map(|b| b.reads()) {
            union(rel, read);
        }
    }
    let mut parts: BTreeMap<usize, Vec<RelId>> = BTreeMap::new();
    for rel in 0..n {
        let r = root(&mut parent, rel);
        parts.entry(r).or_default().push(rel);
    }
    parts.into_values().collect()
}

/// What the rules deriving `derived` read: relations their atoms join or
/// anti-join, and what their built-ins read (outside `derived` or not).
pub fn reads(program: &Program, plans: &[Rc<RulePlan>], derived: &BTreeSet<RelId>) -> BTreeSet<RelId> {
    let mut out = BTreeSet::new();
    for p in plans.iter().filter(|p| derived.contains(&p.head)) {
        for step in &p.steps {
            if let Step::Join { rel, .. } | Step::AntiJoin { rel, .. } = step {
                out.insert(*rel);
            }
        }
    }
    for &rel in derived {
        out.extend(program.relations[rel].builtin.iter().flat_map(|b| b.reads()));
    }
    out
}

/// The program as groups of derived relations, in an order where a group
/// reads only inputs and relations of groups before it: one per stratum
/// (each a dataflow of its own, advanced only when rows reach it), or one
/// per independent part (`parts`), or a single one (`one`).
pub fn groups(program: &Program, plans: &[Rc<RulePlan>], split: Split) -> Vec<BTreeSet<RelId>> {
    let is_input = |rel: RelId| program.relations[rel].kind == ccattler_parser::ast::DeclKind::Input;
    let derived_of = |rels: &mut dyn Iterator<Item = RelId>| -> BTreeSet<RelId> { rels.filter(|r| !is_input(*r)).collect() };
    let groups: Vec<BTreeSet<RelId>> = match split {
        Split::Strata => program.strata.iter().map(|s| derived_of(&mut s.relations.iter().copied())).collect(),
        Split::Parts => components(program, plans).into_iter().map(|c| derived_of(&mut c.into_iter())).collect(),
        Split::One => vec![derived_of(&mut (0..program.relations.len()))],
    };
    groups.into_iter().filter(|g| !g.is_empty()).collect()
}

/// An arrangement a rule looks up: of a relation's facts an atom filter
/// accepts, by the values at some positions — (key, rest) for a join, the
/// distinct keys for an anti-join.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lookup {
    Join(RelId, AtomFilter, Vec<usize>),
    Present(RelId, AtomFilter, Vec<usize>),
}

impl Lookup {
    pub fn rel(&self) -> RelId {
        match self {
            Lookup::Join(rel, ..) | Lookup::Present(rel, ..) => *rel,
        }
    }

    /// How a scope finds the arrangement: the relation, filter and positions.
    fn key(&self) -> (RelId, AtomFilter, Vec<usize>) {
        match self {
            Lookup::Join(rel, filter, pos) | Lookup::Present(rel, filter, pos) => (*rel, filter.clone(), pos.clone()),
        }
    }
}

/// The arrangement a [`Lookup`] names, built or imported.
pub enum LookupArrangement<'s> {
    Join(Arr<'s, u64>),
    Present(SetArr<'s, u64>),
}

/// Arrangements built outside a group's dataflow (a hub's, imported into
/// it), which its rules use instead of building their own.
pub struct Imported<'s> {
    pub joins: BTreeMap<(RelId, AtomFilter, Vec<usize>), Arr<'s, u64>>,
    pub present: BTreeMap<(RelId, AtomFilter, Vec<usize>), SetArr<'s, u64>>,
}

impl<'s> Imported<'s> {
    pub fn none() -> Self {
        Imported { joins: BTreeMap::new(), present: BTreeMap::new() }
    }

    /// Adds the arrangement `lookup` names, for the group's rules to use.
    pub fn add(&mut self, lookup: &Lookup, arrangement: LookupArrangement<'s>) {
        match arrangement {
            LookupArrangement::Join(arr) => {
                self.joins.insert(lookup.key(), arr);
            }
            LookupArrangement::Present(arr) => {
                self.present.insert(lookup.key(), arr);
            }
        }
    }
}

/// The arrangements the rules of each group look up in relations it does
/// not derive (outside recursive strata, whose rules arrange inside their
/// loop). Where several groups look up the same, one copy can serve them
/// all ([`crate::runtime`]'s hubs), not one per group.
pub fn lookups(program: &Program, plans: &[Rc<RulePlan>], groups: &[BTreeSet<RelId>]) -> Vec<BTreeSet<Lookup>> {
    groups
        .iter()
        .map(|derived| {
            let mut out = BTreeSet::new();
            for stratum in program.strata.iter().filter(|s| !s.recursive) {
                for p in plans.iter().filter(|p| derived.contains(&p.head) && stratum.rules.contains(&p.rule)) {
                    if program.relations[p.head].builtin.is_some() {
                        continue;
                    }
                    // As `Scope::rule` cuts it: a join after the first
                    // segment's is a lookup; a leading atom is a scan,
                    // unless a join or an anti-join follows it at once
                    // ([`paired_start`]).
                    // A temporal join ([`temporal`]) reads its relation's
                    // collection, not an arrangement.
                    let segs = segments(&p.steps);
                    let temporal_at = temporal::find(p, |rel| program.relations[rel].arity()).map(|(n, _)| n);
                    if let (Some(pos), Some((Some(Step::Join { rel, filter, .. }), _))) = (paired_start(&segs), segs.first()) {
                        if !derived.contains(rel) && temporal_at != Some(1) {
                            out.insert(Lookup::Join(*rel, filter.clone(), pos));
                        }
                    }
                    for (n, (head, _)) in segs.into_iter().enumerate() {
                        match head {
                            _ if temporal_at == Some(n) => {}
                            Some(Step::Join { rel, filter, key, .. }) if n > 0 && !derived.contains(rel) => {
                                out.insert(Lookup::Join(*rel, filter.clone(), key.iter().map(|(p, _)| *p).collect()));
                            }
                            Some(Step::AntiJoin { rel, filter, key }) if !derived.contains(rel) => {
                                out.insert(Lookup::Present(*rel, filter.clone(), key.iter().map(|(p, _)| *p).collect()));
                            }
                            _ => {}
                        }
                    }
                }
            }
            out
        })
        .collect()
}

/// Builds, over a relation's collection, the arrangement `lookup` names.
pub fn arrange_lookup<'s>(rows: Coll<'s, u64>, lookup: &Lookup, rel: &ccattler_parser::program::Relation) -> LookupArrangement<'s> {
    let rel_name = &rel.name;
    match lookup.clone() {
        Lookup::Join(_, filter, key_pos) => LookupArrangement::Join(arrange_join(rows, &filter, key_pos, rel_name)),
        Lookup::Present(_, filter, positions) => {
            LookupArrangement::Present(arrange_present(rows, &filter, positions, rel_name, rel.arity(), rel.builtin.is_none()))
        }
    }
}

/// A relation's facts `filter` accepts as (values at `key_pos`, the others),
/// arranged by the first: what a join looks up.
fn arrange_join<'s, T: Timestamp + Lattice + Ord>(rows: Coll<'s, T>, filter: &AtomFilter, key_pos: Vec<usize>, rel_name: &str) -> Arr<'s, T> {
    let f = filter.clone();
    let name = format!("Arrange {rel_name} by {key_pos:?}");
    let pairs = rows.filter(move |row| f.accepts(row)).map(move |row| {
        let key = key_pos.iter().map(|p| row[*p].clone()).collect::<Row>();
        let rest = row.iter().enumerate().filter(|(p, _)| !key_pos.contains(p)).map(|(_, v)| v.clone()).collect::<Row>();
        (key, rest)
    });
    arrange_pairs(pairs, &name)
}

/// The distinct values at `positions` of a relation's facts `filter`
/// accepts, arranged: what an anti-join looks up. Where the relation's rows
/// are a `set` (all but a built-in's, see [`build`]) and `positions` name
/// every column once, they are arranged as they come, not deduplicated.
fn arrange_present<'s, T: Timestamp + Lattice + Ord>(
    rows: Coll<'s, T>,
    filter: &AtomFilter,
    positions: Vec<usize>,
    rel_name: &str,
    arity: usize,
    set: bool,
) -> SetArr<'s, T> {
    let f = filter.clone();
    let name = format!("Present {rel_name} at {positions:?}");
    let a_set_already = set && positions.len() == arity && (0..arity).all(|c| positions.contains(&c));
    let keys = rows.filter(move |row| f.accepts(row)).map(move |row| positions.iter().map(|p| row[*p].clone()).collect::<Row>());
    if a_set_already {
        arrange_set(keys, &name)
    } else {
        distinct_arranged(keys, &name)
    }
}

/// How the program is cut into dataflows ([`groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Strata,
    Parts,
    One,
}

/// Builds the relations of one part (`only`, from [`components`]; the
/// inputs given are that part's).
pub fn build<'s>(
    program: &Program,
    plans: &[Rc<RulePlan>],
    inputs: BTreeMap<RelId, Coll<'s, u64>>,
    unit: Coll<'s, u64>,
    only: &BTreeSet<RelId>,
    imported: Imported<'s>,
) -> Built<'s> {
    let is_output = |rel: RelId| program.relations[rel].kind == ccattler_parser::ast::DeclKind::Output;
    let mut attributed = BTreeMap::new();
    let mut traces = BTreeMap::new();
    // Relations known to hold each row once: inputs (a key gives one row, and
    // a row renders to one key), and what `distinct` or an aggregate makes.
    let mut sets: BTreeSet<RelId> = inputs.keys().copied().collect();
    let arity = |rel: RelId| program.relations[rel].arity();
    let names: Rc<[String]> = program.relations.iter().map(|r| r.name.clone()).collect();
    let arities: Rc<[(usize, bool)]> = program.relations.iter().map(|r| (r.arity(), r.builtin.is_none())).collect();
    let mut top = Scope {
        rels: inputs,
        unit,
        arranged: imported.joins,
        present: imported.present,
        names: names.clone(),
        arities: arities.clone(),
        read: BTreeSet::new(),
        dedup: dedup_total,
        temporal: Some(temporal::join),
        quiet: Vec::new(),
    };
    for stratum in &program.strata {
        let derived: Vec<RelId> = stratum.relations.iter().copied().filter(|r| only.contains(r) && !top.rels.contains_key(r)).collect();
        if derived.is_empty() {
            continue;
        }
        let rules_of = |rel: RelId| plans.iter().filter(move |p| p.head == rel && stratum.rules.contains(&p.rule));
        if !stratum.recursive {
            for &rel in &derived {
                // Built-ins define internal relations only (never outputs).
                if let Some(builtin) = &program.relations[rel].builtin {
                    let coll = top.builtin(builtin);
                    top.rels.insert(rel, coll);
                    continue;
                }
                let mut parts = Vec::new();
                let mut tagged = Vec::new();
                for p in rules_of(rel) {
                    let rows = top.rule(p, aggregate_bindings_are_set(p, &sets, arity));
                    if is_output(rel) {
                        tagged.push(tag(p.rule, rows.clone()));
                    }
                    parts.push(rows);
                }
                if is_output(rel) {
                    attributed.insert(rel, differential_dataflow::collection::concatenate(top.unit.scope(), tagged));
                }
                let single_aggregate = parts.len() == 1 && rules_of(rel).all(|p| p.has_aggregate());
                let single_set = parts.len() == 1 && rules_of(rel).all(|p| yields_set(p, &sets, arity));
                let all = differential_dataflow::collection::concatenate(top.unit.scope(), parts);
                sets.insert(rel);
                // One aggregate rule already yields one row per group, and
                // some rules a set (the runtime arranges it for queries).
                let rel_coll = if single_aggregate || single_set {
                    all
                } else {
                    let (coll, trace) = distinct_with_trace(all, &format!("Distinct {}", names[rel]));
                    traces.insert(rel, trace);
                    coll
                };
                top.rels.insert(rel, rel_coll);
            }
            continue;
        }
        // A recursive stratum: one variable per relation, iterated to a fixed point.
        let outer = top.unit.scope();
        // (Every relation so far enters the loop: each is read.)
        top.read.extend(top.rels.keys().copied());
        let results: Vec<(RelId, Coll<'s, u64>)> = outer.iterative::<u64, _, _>(|inner| {
            let mut scope = Scope {
                rels: top.rels.iter().map(|(r, c)| (*r, c.clone().enter(inner))).collect(),
                unit: top.unit.clone().enter(inner),
                arranged: BTreeMap::new(),
                present: BTreeMap::new(),
                names: names.clone(),
                arities: arities.clone(),
                read: BTreeSet::new(),
                dedup,
                temporal: None,
                quiet: Vec::new(),
            };
            let mut vars = Vec::new();
            for &rel in &derived {
                let (var, coll) = VecVariable::new(inner, Product::new(Default::default(), 1));
                scope.rels.insert(rel, coll);
                vars.push((rel, var));
            }
            let mut results = Vec::new();
            for (rel, var) in vars {
                let parts: Vec<_> = rules_of(rel).map(|p| scope.rule(p, false)).collect();
                let name = format!("Distinct {} (recursive)", names[rel]);
                let next = rows_of(distinct_arranged(differential_dataflow::collection::concatenate(inner, parts), &name));
                var.set(next.clone());
                results.push((rel, next.leave(outer)));
            }
            results
        });
        sets.extend(results.iter().map(|(rel, _)| *rel));
        top.rels.extend(results);
        // Attribution of a recursive output: a row comes from rule r exactly
        // when r's body matches the fixed point, so evaluate each rule once more
        // over the final relations.
        for &rel in derived.iter().filter(|r| is_output(**r)) {
            let tagged: Vec<_> = rules_of(rel).map(|p| tag(p.rule, top.rule(p, false))).collect();
            attributed.insert(rel, differential_dataflow::collection::concatenate(outer, tagged));
        }
    }
    Built { relations: top.rels, attributed, traces, read: top.read, quiet: top.quiet }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builtins_value_that_is_neither_whole_nor_reduce_is_refused_and_named() {
        assert_eq!(builtins_named(None), Ok(false));
        assert_eq!(builtins_named(Some("whole")), Ok(false));
        assert_eq!(builtins_named(Some("reduce")), Ok(true));
        for careless in ["Reduce", "reduce ", "", "0", "off", "whole\n"] {
            let why = builtins_named(Some(careless)).unwrap_err();
            assert!(why.contains(&format!("{careless:?}")) && why.contains("whole or reduce"), "{why}");
        }
    }

    /// A rule that starts `a(x, y, 1), b(y, x, z)` joins a's arrangement by
    /// (y, x) — positions 1 then 0 — with b's by (0, 1), and takes z from
    /// b's rest: a key out of a's column order, a constant in a's rest.
    #[test]
    fn two_leading_atoms_join_their_arrangements_on_a_key_out_of_column_order() {
        let text = "input a(x: int, y: int, c: int) from \"a/{x}/{y}/{c}\"\n\
                    input b(y: int, x: int, z: int) from \"b/{y}/{x}/{z}\"\n\
                    output h(x: int, z: int) to \"h/{x}/{z}\"\n\
                    h(x, z) :- a(x, y, 1), b(y, x, z).\n";
        let (program, plans, _) = planned(text);
        assert_eq!(paired_start(&segments(&plans[0].steps)), Some(vec![1, 0]));
        let mut session = crate::Session::new(std::sync::Arc::new(program), 2).expect("engine");
        let put = |k: &str| (k.to_string(), Some(String::new()));
        // a(1,2,1) meets b(2,1,5) only: a(1,3,0) fails the constant, b(2,9,7) the key's x.
        session.write(&[put("a/1/2/1"), put("a/1/3/0"), put("b/2/1/5"), put("b/3/1/6"), put("b/2/9/7")]).expect("write");
        assert_eq!(session.derived().keys().collect::<Vec<_>>(), ["h/1/5"]);
        session.write(&[("a/1/2/1".to_string(), None), put("a/1/3/1")]).expect("write");
        assert_eq!(session.derived().keys().collect::<Vec<_>>(), ["h/1/6"]);
    }

    /// `a(x, y, 1), not b(y, x, _)`: a's facts less those its arrangement
    /// by (y, x) meets in b's keys present, the rows of both made alike.
    #[test]
    fn a_leading_atom_anti_joined_at_once_keeps_the_facts_whose_key_is_absent() {
        let text = "input a(x: int, y: int, c: int) from \"a/{x}/{y}/{c}\"\n\
                    input b(y: int, x: int, z: int) from \"b/{y}/{x}/{z}\"\n\
                    output h(x: int, y: int) to \"h/{x}/{y}\"\n\
                    h(x, y) :- a(x, y, 1), not b(y, x, _).\n";
        let (program, plans, _) = planned(text);
        assert_eq!(paired_start(&segments(&plans[0].steps)), Some(vec![1, 0]));
        let mut session = crate::Session::new(std::sync::Arc::new(program), 2).expect("engine");
        let put = |k: &str| (k.to_string(), Some(String::new()));
        session.write(&[put("a/1/2/1"), put("a/1/3/1"), put("a/4/5/0"), put("b/2/1/5"), put("b/2/1/6"), put("b/3/9/7")]).expect("write");
        assert_eq!(session.derived().keys().collect::<Vec<_>>(), ["h/1/3"], "a(1,2) has b(2,1,_) twice; a(4,5,0) fails the constant");
        session.write(&[("b/2/1/5".to_string(), None)]).expect("write");
        assert_eq!(session.derived().keys().collect::<Vec<_>>(), ["h/1/3"], "b(2,1,6) still there");
        session.write(&[("b/2/1/6".to_string(), None), put("b/3/1/0")]).expect("write");
        assert_eq!(session.derived().keys().collect::<Vec<_>>(), ["h/1/2"]);
    }

    /// Counts that rise past one, fall back, and cross zero twice within a
    /// revision: the output says each row once while its count is positive,
    /// and the counted arrangement (the query trace) reads the same.
    #[test]
    fn distinct_total_says_a_row_once_while_any_derivation_holds_it() {
        use differential_dataflow::input::Input as _;
        use std::cell::RefCell;
        use timely::dataflow::operators::probe::Handle;
        let row = |n: i64| Row::from_elem(Value::Int(n), 1);
        timely::execute_directly(move |worker| {
            let said: Rc<RefCell<Vec<(Row, u64, isize)>>> = Rc::default();
            let probe = Handle::new();
            let s = said.clone();
            let (mut input, mut trace) = worker.dataflow::<u64, _, _>(|scope| {
                let (input, rows) = scope.new_collection::<Row, isize>();
                let counted = arrange_set(rows, "Arrange t");
                let trace = counted.trace.clone();
                distinct_total(counted, "t").inspect(move |u| s.borrow_mut().push(u.clone())).probe_with(&probe);
                (input, trace)
            });
            // rev 1: a twice, b once; rev 2: a down to one, b gone and back
            // (net nothing), c in and out; rev 3: a gone; rev 4: a again.
            let steps: [&[(i64, isize)]; 4] = [&[(1, 2), (2, 1)], &[(1, -1), (3, 1), (3, -1)], &[(1, -1)], &[(1, 1)]];
            for (rev, step) in (1u64..).zip(steps) {
                for &(n, d) in step {
                    input.update_at(row(n), rev, d);
                }
                input.advance_to(rev + 1);
                input.flush();
                while probe.less_equal(&rev) {
                    worker.step();
                }
            }
            let mut said = said.borrow().clone();
            said.sort_by_key(|(r, t, _)| (*t, r.clone()));
            assert_eq!(said, vec![(row(1), 1, 1), (row(2), 1, 1), (row(1), 3, -1), (row(1), 4, 1)]);
            let mut at = |rev: u64| crate::runtime::read_trace(&mut trace, &[], rev);
            assert_eq!(at(2), vec![row(1), row(2)], "a (count 1) and b: counted rows read as a set");
            assert_eq!(at(3), vec![row(2)]);
            assert_eq!(at(4), vec![row(1), row(2)]);
        });
    }

    /// A checked program, its plans, and its input relations (known sets).
    fn planned(text: &str) -> (Program, Vec<RulePlan>, BTreeSet<RelId>) {
        let checked = ccattler_parser::check_str("t.rules", text);
        let program = checked.program.clone().unwrap_or_else(|| panic!("{}", checked.render()));
        let plans = crate::plan::plan(&program);
        let inputs = program.inputs().map(|(r, _)| r).collect();
        (program, plans, inputs)
    }

    /// Which aggregates skip the `distinct` of their bindings: those over
    /// relations known to be sets, `_` included (it binds a hidden variable).
    #[test]
    fn aggregates_over_sets_count_their_bindings_without_deduplicating() {
        let text = "input a(x: name, y: int) from \"a/{x}\"\ninput b(y: int, z: name) from \"b/{y}/{z}\"\n\
                    relation per_y(y: int, n: int)\nrelation wild(y: int, n: int)\n\
                    relation dropped(x: name)\nrelation on_derived(n: int)\n\
                    per_y(y, count()) :- a(x, y), b(y, z).\n\
                    wild(y, count()) :- b(y, _).\n\
                    dropped(x) :- a(x, y), b(y, _).\n\
                    on_derived(count()) :- dropped(x).\n";
        let (program, plans, inputs) = planned(text);
        let set = |name: &str, sets: &BTreeSet<RelId>| {
            let rel = program.relation(name).unwrap();
            plans.iter().filter(|p| p.head == rel).all(|p| aggregate_bindings_are_set(p, sets, |r| program.relations[r].arity()))
        };
        assert!(set("per_y", &inputs));
        assert!(set("wild", &inputs), "`_` binds a hidden variable in an aggregate rule");
        assert!(!set("dropped", &inputs), "not an aggregate");
        assert!(!set("on_derived", &inputs), "dropped is not known to be a set");
        let mut with_dropped = inputs.clone();
        with_dropped.insert(program.relation("dropped").unwrap());
        assert!(set("on_derived", &with_dropped));
    }

    /// Which rules skip `distinct`: only those whose head rows name the one
    /// binding, and so the one combination of set rows, behind them.
    #[test]
    fn only_rules_whose_head_names_its_binding_yield_a_set() {
        let text = "input a(x: name, y: int) from \"a/{x}\"\ninput b(y: int, z: name) from \"b/{y}/{z}\"\n\
                    relation whole(x: name, y: int, z: name)\nrelation dropped(x: name)\nrelation wild(x: name, y: int)\n\
                    relation assigned(x: name, y: int, w: int)\nrelation negated(x: name, y: int)\nrelation counted(x: name, n: int)\n\
                    relation ranged(x: name, y: int, i: int)\nrelation on_derived(x: name)\n\
                    whole(x, y, z) :- a(x, y), b(y, z).\n\
                    dropped(x) :- a(x, y), b(y, _).\n\
                    wild(x, y) :- a(x, y), b(y, _).\n\
                    assigned(x, y, w) :- a(x, y), w = y * 2.\n\
                    negated(x, y) :- a(x, y), not b(y, \"q\").\n\
                    counted(x, count()) :- a(x, y), b(y, z).\n\
                    ranged(x, y, i) :- a(x, y), i in 0..y.\n\
                    on_derived(x) :- dropped(x).\n";
        let (program, plans, inputs) = planned(text);
        let set = |name: &str, sets: &BTreeSet<RelId>| {
            let rel = program.relation(name).unwrap();
            yields_set(plans.iter().find(|p| p.head == rel).unwrap(), sets, |r| program.relations[r].arity())
        };
        assert!(set("whole", &inputs));
        assert!(!set("dropped", &inputs), "y is dropped: two a rows with one x give one head row");
        assert!(!set("wild", &inputs), "`_`: two b rows with one y give one binding");
        assert!(set("assigned", &inputs), "w is a function of the binding");
        assert!(set("negated", &inputs));
        assert!(!set("counted", &inputs), "aggregates are handled apart");
        assert!(set("ranged", &inputs));
        assert!(!set("on_derived", &inputs), "dropped is not known to be a set");
        let mut with_dropped = inputs.clone();
        with_dropped.insert(program.relation("dropped").unwrap());
        assert!(set("on_derived", &with_dropped));
    }
}
