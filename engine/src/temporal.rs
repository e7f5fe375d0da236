//! The clock joined as a temporal filter.
//!
//! ```text
//! stale(n) :- heartbeat(n, b), grace(n, g), clock(c), max(c - b - g, b - c) > 0.
//! ```
//! joins every binding with the clock's one row, so a plain join evaluates
//! every node's binding again at each tick (5,000 at 5,000 nodes) to find
//! that almost none changed. Where the reading `c` is only compared — in
//! sums and differences with values the binding holds, under `min` and
//! `max` — whether a binding passes is a step function of `c`: it changes
//! only where one side of a comparison crosses the other, at one or two
//! readings per comparison (its *flips*: readings `f` at which `f` and
//! `f + 1` are judged differently). The operator holds the bindings indexed
//! by their flips; when the readings move from `c1` to `c2` it evaluates
//! only the bindings with a flip in `[c1, c2)`, and a binding that changes
//! meets every reading there is, as a join would. Materialize's temporal
//! filters answer `mz_now()` the same way.
//!
//! Where the readings change otherwise (one appears, or is gone) or a value
//! is not a small int, the operator evaluates every binding it holds: the
//! result is the join's in every case, only the work differs.

use crate::dataflow::Coll;
use crate::plan::{AtomFilter, CExpr, CHead, RulePlan, Step};
use crate::value::{Row, Value};
use ccattler_parser::ast::{BinOp, CmpOp, Func};
use ccattler_parser::program::RelId;
use differential_dataflow::AsCollection;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::vec::Broadcast;

/// Values (and readings) whose size is at most this are small: sums and
/// differences of a few of them never overflow, so a comparison of such
/// sums is judged as arithmetic judges it.
const SMALL: i64 = 1 << 40;

/// A rule's join that can run as a temporal filter ([`find`]).
#[derive(Clone, Debug)]
pub struct Temporal {
    /// The relation joined (the clock), with no key.
    pub rel: RelId,
    pub filter: AtomFilter,
    /// Where the reading sits in its facts, and the variable it binds.
    pos: usize,
    var: usize,
    /// Whether no step after the segment (nor the head) reads the reading.
    hidden: bool,
    /// The comparisons the reading takes part in, as `linear op linear`;
    /// none where the reading is used otherwise (in the head, a later step
    /// or a comparison not cut so): then every binding is judged anew at
    /// every move, as a join would, and the operator is quiet only while it
    /// holds none.
    atoms: Option<Vec<Atom>>,
}

/// `a·c + Σ ±term`: one side of a comparison, with `c` the reading and each
/// term an expression that does not read it.
#[derive(Clone, Debug)]
struct Linear {
    a: i64,
    terms: Vec<(bool, CExpr)>,
}

impl Linear {
    fn constant(e: &CExpr) -> Linear {
        Linear { a: 0, terms: vec![(false, e.clone())] }
    }

    fn negated(mut self) -> Linear {
        self.a = -self.a;
        self.terms.iter_mut().for_each(|(neg, _)| *neg = !*neg);
        self
    }

    /// `Σ ±term` over a binding, if every term is a small int.
    fn offset(&self, row: &[Value]) -> Option<i128> {
        let mut sum = 0i128;
        for (neg, term) in &self.terms {
            let v = term.eval(row)?.as_int().filter(|v| v.unsigned_abs() <= SMALL as u64)?;
            sum += if *neg { -(v as i128) } else { v as i128 };
        }
        Some(sum)
    }
}

/// An expression in the reading: linear, or `max`/`min` of two.
enum Shape {
    Linear(Linear),
    Max(Box<Shape>, Box<Shape>),
    Min(Box<Shape>, Box<Shape>),
}

impl Shape {
    fn of(e: &CExpr, c: usize) -> Option<Shape> {
        let mut read = BTreeSet::new();
        e.vars(&mut read);
        if !read.contains(&c) {
            return Some(Shape::Linear(Linear::constant(e)));
        }
        Some(match e {
            CExpr::Var(_) => Shape::Linear(Linear { a: 1, terms: Vec::new() }),
            CExpr::Neg(x) => Shape::of(x, c)?.negated(),
            CExpr::Bin(BinOp::Add, x, y) => Shape::of(x, c)?.plus(Shape::of(y, c)?)?,
            CExpr::Bin(BinOp::Sub, x, y) => Shape::of(x, c)?.plus(Shape::of(y, c)?.negated())?,
            CExpr::Call(Func::Max, args) if args.len() == 2 => Shape::Max(Box::new(Shape::of(&args[0], c)?), Box::new(Shape::of(&args[1], c)?)),
            CExpr::Call(Func::Min, args) if args.len() == 2 => Shape::Min(Box::new(Shape::of(&args[0], c)?), Box::new(Shape::of(&args[1], c)?)),
            _ => return None,
        })
    }

    fn negated(self) -> Shape {
        match self {
            Shape::Linear(l) => Shape::Linear(l.negated()),
            Shape::Max(x, y) => Shape::Min(Box::new(x.negated()), Box::new(y.negated())),
            Shape::Min(x, y) => Shape::Max(Box::new(x.negated()), Box::new(y.negated())),
        }
    }

    /// The sum of two linear shapes (of `max` or `min`, not followed).
    fn plus(self, other: Shape) -> Option<Shape> {
        match (self, other) {
            (Shape::Linear(mut x), Shape::Linear(y)) => {
                x.a = x.a.checked_add(y.a)?;
                x.terms.extend(y.terms);
                Some(Shape::Linear(x))
            }
            _ => None,
        }
    }
}

/// `lhs op rhs`, both linear in the reading.
#[derive(Clone, Debug)]
struct Atom {
    op: CmpOp,
    lhs: Linear,
    rhs: Linear,
}

/// Cuts `lhs op rhs` into comparisons of linear sides whose truths decide
/// it: `max(x, y) > r` holds when `x > r` or `y > r`, `min(x, y) > r` when
/// both do, and alike for `<`, `<=`, `>=` and either side. (`=` and `!=`
/// of a `max` are not cut: false.)
fn atoms(op: CmpOp, lhs: &Shape, rhs: &Shape, out: &mut Vec<Atom>) -> bool {
    let ordered = matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge);
    match (lhs, rhs) {
        (Shape::Max(x, y) | Shape::Min(x, y), _) if ordered => atoms(op, x, rhs, out) && atoms(op, y, rhs, out),
        (_, Shape::Max(x, y) | Shape::Min(x, y)) if ordered => atoms(op, lhs, x, out) && atoms(op, lhs, y, out),
        (Shape::Linear(l), Shape::Linear(r)) => {
            out.push(Atom { op, lhs: l.clone(), rhs: r.clone() });
            true
        }
        _ => false,
    }
}

impl Temporal {
    /// Whether nothing after its segment reads the reading.
    pub fn hidden(&self) -> bool {
        self.hidden
    }

    /// Whether its bindings are indexed by their flips (else each is judged
    /// at every move).
    pub fn indexed(&self) -> bool {
        self.atoms.is_some()
    }

    /// The readings at which a binding (a full row) is judged otherwise than
    /// at the next one; false if it cannot tell (a term is not a small int).
    fn flips(&self, row: &[Value], out: &mut Vec<i64>) -> bool {
        let Some(atoms) = &self.atoms else { return false };
        for atom in atoms {
            let (Some(l), Some(r)) = (atom.lhs.offset(row), atom.rhs.offset(row)) else { return false };
            // lhs op rhs ⇔ a·c + e op 0, monotone in c: it changes next to
            // where a·c + e crosses 0.
            let a = (atom.lhs.a - atom.rhs.a) as i128;
            if a == 0 {
                continue;
            }
            let e = l - r;
            let holds = |c: i128| ccattler_parser::program::compare(atom.op, &(a * c + e).cmp(&0));
            let root = floor_div(-e, a);
            for f in [root - 1, root, root + 1] {
                if holds(f) != holds(f + 1) {
                    match i64::try_from(f) {
                        Ok(f) => out.push(f),
                        Err(_) => return false,
                    }
                }
            }
        }
        true
    }
}

fn floor_div(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d != 0 && ((n < 0) != (d < 0)) {
        q - 1
    } else {
        q
    }
}

/// The segment of a rule's plan whose join runs as a temporal filter, and
/// how: a join on no key (after the first segment) that binds one variable,
/// the reading. Its bindings are indexed by their flips where the reading
/// is read after it only by comparisons in the same segment, each of sums
/// and differences of the reading with values the binding arrives with
/// (under `min` and `max`); otherwise, where the relation has one column
/// (a clock), each is judged at every move ([`Temporal::atoms`]). Not in
/// aggregate rules (their bindings keep every variable). The segment is
/// counted as `dataflow` cuts the plan.
pub fn find(plan: &RulePlan, arity: impl Fn(RelId) -> usize) -> Option<(usize, Temporal)> {
    if plan.has_aggregate() {
        return None;
    }
    let segments = crate::dataflow::segments(&plan.steps);
    let layouts = crate::dataflow::layouts(plan, &segments);
    let mut read_later = BTreeSet::new();
    for h in &plan.head_terms {
        if let CHead::Expr(e) = h {
            e.vars(&mut read_later);
        }
    }
    let mut found = None;
    // From the last segment back, so what later segments read is known.
    for n in (1..segments.len()).rev() {
        let (head, pure) = &segments[n];
        if let Some(Step::Join { rel, filter, key, bind }) = head {
            if let ([(pos, var)], true) = (&bind[..], key.is_empty()) {
                let hidden = !read_later.contains(var);
                let atoms = if hidden { comparisons(pure, *var, &layouts[n - 1]) } else { None };
                if atoms.is_some() || arity(*rel) == 1 {
                    found = Some((n, Temporal { rel: *rel, filter: filter.clone(), pos: *pos, var: *var, hidden, atoms }));
                }
            }
        }
        for step in head.iter().copied().chain(pure) {
            step.reads(&mut read_later);
        }
    }
    found
}

/// The atoms of the steps that read `c`, if all are comparisons whose other
/// variables are among `arriving`.
fn comparisons(steps: &[Step], c: usize, arriving: &[usize]) -> Option<Vec<Atom>> {
    let mut out = Vec::new();
    for step in steps {
        let mut read = BTreeSet::new();
        step.reads(&mut read);
        if !read.contains(&c) {
            continue;
        }
        let Step::Filter { op, lhs, rhs } = step else { return None };
        if !read.iter().all(|v| *v == c || arriving.contains(v)) {
            return None;
        }
        if !atoms(*op, &Shape::of(lhs, c)?, &Shape::of(rhs, c)?, &mut out) {
            return None;
        }
    }
    Some(out)
}

/// How the operator sees its bindings and hands on its rows.
pub struct Placed {
    pub temporal: Temporal,
    /// The variables a binding arrives with that are read (what is held).
    pub arriving: Rc<[usize]>,
    pub nvars: usize,
    /// Whether the rows handed on are bindings (not head rows): their
    /// reading is then set to 0, as no step after reads it.
    pub blank: bool,
    /// The segment's steps (and the head) over one binding with its reading.
    pub finish: Rc<dyn Fn(Row) -> Vec<Row>>,
    /// Where the operator says which readings it is quiet for.
    pub quiet: Arc<Quiet>,
}

/// The readings `[lo, hi]` an operator would judge every binding it holds
/// as it judges them now: a move of its one reading within them changes
/// nothing it derives, so the runtime need not hand it over ([`crate::runtime`]).
/// Empty (`lo > hi`) while it holds no one small reading, or a binding
/// it cannot index, or before it ran.
#[derive(Debug)]
pub struct Quiet {
    lo: AtomicI64,
    hi: AtomicI64,
}

impl Default for Quiet {
    fn default() -> Quiet {
        Quiet { lo: AtomicI64::new(1), hi: AtomicI64::new(0) }
    }
}

impl Quiet {
    /// The readings it is quiet for, as of its last run.
    pub fn readings(&self) -> (i64, i64) {
        (self.lo.load(Ordering::Acquire), self.hi.load(Ordering::Acquire))
    }

    fn set(&self, (lo, hi): (i64, i64)) {
        self.lo.store(lo, Ordering::Release);
        self.hi.store(hi, Ordering::Release);
    }
}

/// `bindings ⋈ facts` as a temporal filter: the rows `finish` makes of each
/// binding with each reading, with their multiplicities, as a join's. Each
/// worker holds the bindings that hash to it, and meets them with every
/// reading.
pub fn join<'s>(bindings: Coll<'s, u64>, facts: Coll<'s, u64>, placed: Placed, name: &str) -> Coll<'s, u64> {
    let (filter, pos) = (placed.temporal.filter.clone(), placed.temporal.pos);
    // Every worker meets its own bindings with every reading.
    let readings = facts.filter(move |f| filter.accepts(f)).map(move |f| Row::from_elem(f[pos].clone(), 1)).inner.broadcast();
    // Every change of one binding meets on one worker (a binding's
    // insertion and its retraction may come from different workers).
    let arriving = placed.arriving.clone();
    let by_binding = Exchange::new(move |(row, _, _): &(Row, u64, isize)| {
        // (One seed in every process, as differential's own exchanges.)
        let mut h = foldhash::quality::FixedState::with_seed(0).build_hasher();
        arriving.iter().for_each(|v| row[*v].hash(&mut h));
        h.finish()
    });
    let mut held = Held::new(placed);
    bindings
        .inner
        .binary_frontier::<_, timely::container::CapacityContainerBuilder<Vec<(Row, u64, isize)>>, _, _, _, _>(
            readings,
            by_binding,
            Pipeline,
            name,
            move |_, _| {
                // Per revision not yet passed: a capability for it, the
                // bindings' changes and the readings'.
                type Pending = (timely::dataflow::operators::Capability<u64>, Vec<(Row, isize)>, Vec<(Value, isize)>);
                let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
                move |(bindings, bindings_frontier), (readings, readings_frontier), output| {
                    let port = output.output_index();
                    bindings.for_each(|cap, data| {
                        for (row, t, d) in data.drain(..) {
                            pending.entry(t).or_insert_with(|| (cap.delayed(&t, port), Vec::new(), Vec::new())).1.push((row, d));
                        }
                    });
                    readings.for_each(|cap, data| {
                        for (mut row, t, d) in data.drain(..) {
                            let reading = row.pop().expect("one value");
                            pending.entry(t).or_insert_with(|| (cap.delayed(&t, port), Vec::new(), Vec::new())).2.push((reading, d));
                        }
                    });
                    // Revisions both inputs have passed, in order.
                    while let Some(entry) = pending.first_entry() {
                        let t = *entry.key();
                        if bindings_frontier.less_equal(&t) || readings_frontier.less_equal(&t) {
                            break;
                        }
                        let (cap, changed, moved) = entry.remove();
                        let mut out = Vec::new();
                        held.step(changed, moved, |row, d| out.push((row, t, d)));
                        if !out.is_empty() {
                            output.session(&cap).give_iterator(out.into_iter());
                        }
                        held.placed.quiet.set(held.quiet());
                    }
                }
            },
        )
        .as_collection()
}

/// What the operator holds: the bindings, indexed by their flips, and the
/// readings.
struct Held {
    placed: Placed,
    /// Each binding's arriving variables, with its multiplicity.
    bindings: HashMap<Row, isize>,
    /// Each binding under each of its flips.
    flips: BTreeSet<(i64, Row)>,
    /// Bindings whose flips could not be told: met with every move.
    unsure: HashSet<Row>,
    readings: BTreeMap<Value, isize>,
}

impl Held {
    fn new(placed: Placed) -> Held {
        Held { placed, bindings: HashMap::new(), flips: BTreeSet::new(), unsure: HashSet::new(), readings: BTreeMap::new() }
    }

    /// One revision: Δ(B ⋈ C) = B·ΔC + ΔB·(C + ΔC) — the readings' change
    /// against the bindings as they were, then the bindings' change against
    /// the readings as they are now.
    fn step(&mut self, changed: Vec<(Row, isize)>, moved: Vec<(Value, isize)>, mut emit: impl FnMut(Row, isize)) {
        let moved = consolidate(moved);
        if !moved.is_empty() {
            // Readings that only moved (as many gone as came), all small:
            // only a binding with a flip between the least and the greatest
            // can be judged otherwise at one than at another.
            let net: isize = moved.values().sum();
            let small = |v: &Value| v.as_int().filter(|v| v.unsigned_abs() <= SMALL as u64);
            let span = match (moved.keys().next().and_then(small), moved.keys().next_back().and_then(small)) {
                (Some(lo), Some(hi)) if net == 0 && moved.keys().all(|v| small(v).is_some()) => Some((lo, hi)),
                _ => None,
            };
            let visit: Vec<Row> = match span {
                Some((lo, hi)) => {
                    let mut rows: BTreeSet<&Row> = self.flips.range((lo, Row::new())..(hi, Row::new())).map(|(_, row)| row).collect();
                    rows.extend(self.unsure.iter());
                    rows.into_iter().cloned().collect()
                }
                None => self.bindings.keys().cloned().collect(),
            };
            for row in visit {
                let m = self.bindings[&row];
                for (reading, d) in &moved {
                    self.meet(&row, reading, m * d, &mut emit);
                }
            }
            for (reading, d) in moved {
                let count = self.readings.entry(reading.clone()).or_default();
                *count += d;
                if *count == 0 {
                    self.readings.remove(&reading);
                }
            }
        }
        let arriving = self.placed.arriving.clone();
        let changed = consolidate(changed.into_iter().map(|(row, d)| (arriving.iter().map(|v| row[*v].clone()).collect::<Row>(), d)));
        for (row, d) in changed {
            for (reading, m) in &self.readings {
                self.meet(&row, reading, d * m, &mut emit);
            }
            let count = self.bindings.entry(row.clone()).or_default();
            let was = *count;
            *count += d;
            let now = *count;
            if now == 0 {
                self.bindings.remove(&row);
            }
            if (was == 0) != (now == 0) {
                self.index(row, now != 0);
            }
        }
    }

    /// The readings it is quiet for ([`Quiet`]): from just after the
    /// greatest flip below its reading to the least flip at or above it.
    fn quiet(&self) -> (i64, i64) {
        const NONE: (i64, i64) = (1, 0);
        let mut readings = self.readings.iter();
        let (Some((reading, _)), None) = (readings.next(), readings.next()) else { return NONE };
        let Some(c) = reading.as_int().filter(|c| c.unsigned_abs() <= SMALL as u64) else { return NONE };
        if !self.unsure.is_empty() {
            return NONE;
        }
        let below = self.flips.range(..(c, Row::new())).next_back().map_or(-SMALL, |(f, _)| f + 1);
        let above = self.flips.range((c, Row::new())..).next().map_or(SMALL, |(f, _)| *f);
        (below.max(-SMALL), above.min(SMALL))
    }

    /// Adds a binding to the flip index, or takes it out.
    fn index(&mut self, row: Row, add: bool) {
        let mut flips = Vec::new();
        if !self.placed.temporal.flips(&self.full(&row, Value::Int(0)), &mut flips) {
            if add {
                self.unsure.insert(row);
            } else {
                self.unsure.remove(&row);
            }
            return;
        }
        for f in flips {
            if add {
                self.flips.insert((f, row.clone()));
            } else {
                self.flips.remove(&(f, row.clone()));
            }
        }
    }

    /// A binding's full row with the reading in its place.
    fn full(&self, row: &[Value], reading: Value) -> Row {
        let mut full = Row::from_elem(Value::Int(0), self.placed.nvars);
        for (v, x) in self.placed.arriving.iter().zip(row) {
            full[*v] = x.clone();
        }
        full[self.placed.temporal.var] = reading;
        full
    }

    /// The rows one binding makes with one reading, `d` times each.
    fn meet(&self, row: &[Value], reading: &Value, d: isize, emit: &mut impl FnMut(Row, isize)) {
        for mut out in (self.placed.finish)(self.full(row, reading.clone())) {
            if self.placed.blank {
                out[self.placed.temporal.var] = Value::Int(0);
            }
            emit(out, d);
        }
    }
}

fn consolidate<K: Ord>(updates: impl IntoIterator<Item = (K, isize)>) -> BTreeMap<K, isize> {
    let mut out: BTreeMap<K, isize> = BTreeMap::new();
    for (k, d) in updates {
        *out.entry(k).or_default() += d;
    }
    out.retain(|_, d| *d != 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The temporal join each rule of `text` gets: (segment, flips of
    /// `row` as a full binding).
    fn flips_of(text: &str, row: &[i64]) -> Option<(usize, Vec<i64>)> {
        let checked = ccattler_parser::check_str("t.rules", text);
        let program = checked.program.clone().unwrap_or_else(|| panic!("{}", checked.render()));
        let plan = crate::plan::plan(&program).pop().expect("one rule");
        let (n, t) = find(&plan, |rel| program.relations[rel].arity())?;
        if t.atoms.is_none() {
            return Some((n, vec![i64::MIN]));
        }
        let full: Row = row.iter().map(|v| Value::Int(*v)).collect();
        let mut out = Vec::new();
        assert!(t.flips(&full, &mut out), "small ints");
        out.sort();
        Some((n, out))
    }

    const DECLS: &str = "input hb(n: int, b: int) from \"hb/{n}/{b}\"\ninput grace(n: int, g: int) from \"g/{n}/{g}\"\n\
                         input clock(c: int) from \"clock/{c}\"\n";
    const STALE: &str = "output stale(n: int) to \"s/{n}\"\n";

    /// `max(c - b - g, b - c) > 0` with b = 100, g = 30: stale again from
    /// 131 on (the flip is 130) and while the clock is below 100 (99).
    #[test]
    fn a_heartbeat_flips_where_it_goes_stale_and_where_it_comes_due() {
        let rule = "output stale(n: int) to \"s/{n}\"\nstale(n) :- hb(n, b), grace(n, g), clock(c), max(c - b - g, b - c) > 0.\n";
        // Variables in order of appearance: n, b, g, c.
        assert_eq!(flips_of(&format!("{DECLS}{rule}"), &[1, 100, 30, 0]), Some((2, vec![99, 130])));
    }

    /// `=` flips on both sides of the one reading where it holds; `!=` too.
    #[test]
    fn an_equality_flips_on_both_sides_of_its_reading() {
        let rule = "stale(n) :- hb(n, b), grace(n, _), clock(c), c + c = b.\n";
        assert_eq!(flips_of(&format!("{DECLS}{STALE}{rule}"), &[1, 10, 0]), Some((2, vec![4, 5])));
        assert_eq!(flips_of(&format!("{DECLS}{STALE}{rule}"), &[1, 11, 0]), Some((2, vec![])), "2c = 11 never holds");
    }

    /// What cannot be indexed by flips: the reading in the head, in an
    /// assignment, multiplied, `=` of a `max`. Joined on a clock of one
    /// column, each binding is judged at every move (marked `i64::MIN`
    /// here); in an aggregate, joined as usual.
    #[test]
    fn a_reading_used_otherwise_than_compared_is_judged_at_every_move() {
        for rule in [
            "output at(n: int, c: int) to \"at/{n}/{c}\"\nat(n, c) :- hb(n, b), grace(n, _), clock(c), c > b.\n",
            "output stale(n: int) to \"s/{n}\"\nstale(n) :- hb(n, b), grace(n, _), clock(c), d = c - b, d > 3.\n",
            "output stale(n: int) to \"s/{n}\"\nstale(n) :- hb(n, b), grace(n, _), clock(c), c * 2 > b.\n",
            "output stale(n: int) to \"s/{n}\"\nstale(n) :- hb(n, b), grace(n, _), clock(c), max(c, b) = 7.\n",
        ] {
            assert_eq!(flips_of(&format!("{DECLS}{rule}"), &[1, 2, 3, 4]), Some((2, vec![i64::MIN])), "{rule}");
        }
        let aggregate = "output k(n: int, k: int) to \"k/{n}/{k}\"\nk(n, count()) :- hb(n, b), grace(n, _), clock(c), c > b.\n";
        assert_eq!(flips_of(&format!("{DECLS}{aggregate}"), &[1, 2, 3, 4]), None);
        let wide = "input clock2(c: int, z: int) from \"c2/{c}/{z}\"\noutput at(n: int, c: int) to \"at/{n}/{c}\"\nat(n, c) :- hb(n, b), grace(n, _), clock2(c, _), c > b.\n";
        assert_eq!(flips_of(&format!("{DECLS}{wide}"), &[1, 2, 3, 4]), None, "a relation of two columns, the reading in the head");
    }
}
