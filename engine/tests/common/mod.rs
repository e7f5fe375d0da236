//! Shared by the oracle and the explanation proof checks: random stratified
//! programs, and a naive from-scratch evaluator that knows nothing of the
//! engine.
#![allow(dead_code)]

use ccattler_engine::{Row, Value};
use ccattler_parser::ast::{AggKind, BinOp};
use ccattler_parser::program::{Const, Expr, HeadTerm, Lit, Program, Term};
use std::collections::{BTreeMap, BTreeSet};

/// xorshift64*: small, seedable, good enough to pick shapes.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

pub const INPUTS: [&str; 3] = ["a", "b", "c"];
pub const DOMAIN: usize = 5;

/// A random program: three int×int inputs, then derived relations d0…dn where
/// each may read inputs and earlier d's (positively, negated or aggregated) and
/// itself positively (recursion).
pub fn random_program(rng: &mut Rng) -> String {
    let mut src = String::new();
    for (i, name) in INPUTS.iter().enumerate() {
        src += &format!("input {name}(x: int, y: int) from \"in/{i}/{{x}}/{{y}}\"\n");
    }
    let n = 2 + rng.below(4);
    for d in 0..n {
        src += &format!("output d{d}(x: int, y: int) to \"out/{d}/{{x}}/{{y}}\"\n");
    }
    src += "relation label(x: int, s: string)\n";
    src += "label(x, s) :- a(x, y), s = \"n\" ++ x ++ \"-\" ++ y.\n";
    let mut uses_label = false;
    for d in 0..n {
        let mut lower: Vec<String> = INPUTS.iter().map(|s| s.to_string()).collect();
        lower.extend((0..d).map(|j| format!("d{j}")));
        let rules = 1 + rng.below(3);
        for r in 0..rules {
            let p = rng.pick(&lower).clone();
            let q = rng.pick(&lower).clone();
            // A recursive rule only as a later rule, so a base rule exists.
            let shape = if r > 0 && rng.below(3) == 0 { 99 } else { rng.below(13) };
            let rule = match shape {
                0 => format!("d{d}(x, z) :- {p}(x, y), {q}(y, z)."),
                1 => format!("d{d}(x, y) :- {p}(x, y), not {q}(y, _)."),
                2 => format!("d{d}(x, y) :- {p}(x, y), not {q}(x, y)."),
                3 if rules == 1 => {
                    let agg = *rng.pick(&["count()", "sum(y)", "min(y)", "max(y)", "arg_max(y, z)", "arg_min(z, y)"]);
                    if agg.contains('z') {
                        format!("d{d}(x, {agg}) :- {p}(x, y), {q}(y, z).")
                    } else if rng.below(4) == 0 {
                        // Every group `q` lists gets a row; the unmatched the default.
                        format!("d{d}(x, {agg} default -1) :- {p}(x, y) per {q}(x, _).")
                    } else if rng.below(2) == 0 {
                        // `_` columns still tell matches apart: count() counts
                        // every (x, _, y) match, sum(y) adds y once per match.
                        format!("d{d}(x, {agg}) :- {p}(x, _), {q}(_, y), x <= y.")
                    } else {
                        format!("d{d}(x, {agg}) :- {p}(x, y).")
                    }
                }
                4 => format!("d{d}(x, w) :- {p}(x, y), y < 3, w = y * 2 - x."),
                5 => format!("d{d}(x, i) :- {p}(x, y), y <= 3, i in x..y."),
                6 => {
                    uses_label = true;
                    format!("d{d}(x, y) :- {p}(x, y), label(x, s), s != \"n0-0\", x != y.")
                }
                7 => format!("d{d}(y, x) :- {p}(x, y), x >= 1, x % 2 = 1."),
                // Functions: two-argument min and max, text length, predicates.
                8 => format!("d{d}(min(x, y), max(x, y)) :- {p}(x, y)."),
                9 => {
                    uses_label = true;
                    let pred = *rng.pick(&[
                        "starts_with(s, \"n1\")",
                        "not contains(s, \"-2\")",
                        "len(s) > 3",
                        "to_string(x) = \"2\"",
                        "before(s, \"-\") = \"n1\"",
                        "after(s, \"-\") != \"0\"",
                        "in_network(\"10.0.0.\" ++ to_string(x), \"10.0.0.0/31, fd00::/8\")",
                    ]);
                    format!("d{d}(x, y) :- {p}(x, y), label(x, s), {pred}.")
                }
                // A reading joined on no key and only compared: a temporal
                // filter (the engine's `temporal`), or a plain join where
                // the reading is used otherwise.
                10 | 11 => {
                    let test = *rng.pick(&[
                        "max(c - x - y, y - c) > 0",
                        "min(c, y) >= x",
                        "c + x != y",
                        "x - c = y",
                        "c - x < 2, y <= c + c",
                        "max(x, y) <= c",
                        "-c > -y",
                    ]);
                    if shape == 11 && rng.below(3) == 0 {
                        format!("d{d}(x, c) :- {p}(x, y), {q}(_, c), {test}.")
                    } else {
                        format!("d{d}(x, y) :- {p}(x, y), {q}(_, c), {test}.")
                    }
                }
                99 => format!("d{d}(x, z) :- d{d}(x, y), {p}(y, z)."),
                _ => format!("d{d}(x, y) :- {p}(x, y)."),
            };
            src += &rule;
            src.push('\n');
        }
    }
    if !uses_label {
        src += "output labels(x: int, s: string) to \"labels/{x}/{s}\"\nlabels(x, s) :- label(x, s).\n";
    }
    src
}

// ---------------------------------------------------------------------------
// The oracle: naive bottom-up evaluation of the checked program, stratum by
// stratum, to a fixed point. Sets of rows, nested loops, nothing incremental.

pub type Db = BTreeMap<usize, BTreeSet<Row>>;

pub fn eval_expr(e: &Expr, b: &[Option<Value>]) -> Option<Value> {
    Some(match e {
        Expr::Const(Const::Int(n)) => Value::Int(*n),
        Expr::Const(Const::Str(s)) => Value::str(s),
        Expr::Var(v) => b[*v].clone()?,
        Expr::Neg(x) => Value::Int(eval_expr(x, b)?.as_int()?.checked_neg()?),
        Expr::Bin(BinOp::Concat, x, y) => Value::str(&format!("{}{}", eval_expr(x, b)?, eval_expr(y, b)?)),
        // The functions, written out on their own (not the engine's code).
        Expr::Call(f, args) => {
            let vals: Option<Vec<Value>> = args.iter().map(|a| eval_expr(a, b)).collect();
            let vals = vals?;
            let s = |i: usize| vals[i].to_string();
            let truth = |t: bool| Value::str(if t { "true" } else { "false" });
            match f {
                ccattler_parser::ast::Func::Len => Value::Int(s(0).chars().count() as i64),
                ccattler_parser::ast::Func::Bytes => Value::Int(s(0).len() as i64),
                ccattler_parser::ast::Func::ToString => Value::str(&s(0)),
                ccattler_parser::ast::Func::StartsWith => truth(s(0).starts_with(s(1).as_str())),
                ccattler_parser::ast::Func::Contains => truth(s(0).contains(s(1).as_str())),
                ccattler_parser::ast::Func::Before | ccattler_parser::ast::Func::After => {
                    let (text, sep) = (s(0), s(1));
                    let part = match (text.find(sep.as_str()), *f == ccattler_parser::ast::Func::Before) {
                        (Some(at), true) => text[..at].to_string(),
                        (Some(at), false) => text[at + sep.len()..].to_string(),
                        (None, true) => text.clone(),
                        (None, false) => String::new(),
                    };
                    Value::str(&part)
                }
                ccattler_parser::ast::Func::InNetwork => truth(s(1).split(',').any(|net| in_network_by_bits(s(0).trim(), net.trim()))),
                ccattler_parser::ast::Func::Min | ccattler_parser::ast::Func::Max => {
                    let less = match (vals[0].clone(), vals[1].clone()) {
                        (Value::Int(x), Value::Int(y)) => y < x,
                        (x, y) => y.to_string() < x.to_string(),
                    };
                    let take_second = if *f == ccattler_parser::ast::Func::Min { less } else { vals[0] != vals[1] && !less };
                    if take_second {
                        vals[1].clone()
                    } else {
                        vals[0].clone()
                    }
                }
            }
        }
        Expr::Bin(op, x, y) => {
            let (x, y) = (eval_expr(x, b)?.as_int()?, eval_expr(y, b)?.as_int()?);
            Value::Int(match op {
                BinOp::Add => x.checked_add(y)?,
                BinOp::Sub => x.checked_sub(y)?,
                BinOp::Mul => x.checked_mul(y)?,
                BinOp::Div => x.checked_div(y)?,
                BinOp::Rem => x.checked_rem(y)?,
                BinOp::Concat => unreachable!(),
            })
        }
    })
}

pub fn matches(args: &[Term], row: &Row, b: &mut [Option<Value>]) -> bool {
    for (t, v) in args.iter().zip(row) {
        let want = match t {
            Term::Wildcard => continue,
            Term::Const(Const::Int(n)) => Value::Int(*n),
            Term::Const(Const::Str(s)) => Value::str(s),
            Term::Var(x) => match &b[*x] {
                Some(bound) => bound.clone(),
                None => {
                    b[*x] = Some(v.clone());
                    continue;
                }
            },
        };
        if want != *v {
            return false;
        }
    }
    true
}

/// All complete bindings of a rule body, literal by literal.
pub fn bindings(lits: &[Lit], db: &Db, b: Vec<Option<Value>>, out: &mut Vec<Vec<Option<Value>>>) {
    let Some((lit, rest)) = lits.split_first() else {
        out.push(b);
        return;
    };
    let empty = BTreeSet::new();
    match lit {
        Lit::Pos { rel, args } => {
            for row in db.get(rel).unwrap_or(&empty) {
                let mut nb = b.clone();
                if matches(args, row, &mut nb) {
                    bindings(rest, db, nb, out);
                }
            }
        }
        Lit::Neg { rel, args } => {
            if !db.get(rel).unwrap_or(&empty).iter().any(|row| matches(args, row, &mut b.clone())) {
                bindings(rest, db, b, out);
            }
        }
        Lit::Filter { op, lhs, rhs } => {
            if let (Some(l), Some(r)) = (eval_expr(lhs, &b), eval_expr(rhs, &b)) {
                if ccattler_parser::program::compare(*op, &l.cmp_text(&r)) {
                    bindings(rest, db, b, out);
                }
            }
        }
        Lit::Assign { var, expr } => {
            if let Some(v) = eval_expr(expr, &b) {
                let mut nb = b.clone();
                nb[*var] = Some(v);
                bindings(rest, db, nb, out);
            }
        }
        Lit::Range { var, lo, hi } => {
            let lo = eval_expr(lo, &b).and_then(|v| v.as_int());
            let hi = eval_expr(hi, &b).and_then(|v| v.as_int());
            let (Some(l), Some(h)) = (lo, hi) else { return };
            for i in l..h {
                let mut nb = b.clone();
                nb[*var] = Some(Value::Int(i));
                bindings(rest, db, nb, out);
            }
        }
    }
}

/// One aggregate over the argument tuples of a group's distinct bindings.
pub fn aggregate(kind: AggKind, args: &[Vec<Value>]) -> Value {
    match kind {
        AggKind::Count => Value::Int(args.len() as i64),
        AggKind::Sum => Value::Int(args.iter().map(|v| v[0].as_int().unwrap()).sum()),
        AggKind::Min => args.iter().map(|v| v[0].clone()).min_by(|a, b| a.cmp_text(b)).unwrap(),
        AggKind::Max => args.iter().map(|v| v[0].clone()).max_by(|a, b| a.cmp_text(b)).unwrap(),
        AggKind::ArgMax | AggKind::ArgMin => {
            let mut best = (args[0][0].clone(), args[0][1].clone());
            for v in &args[1..] {
                let (val, key) = (v[0].clone(), v[1].clone());
                let better = match key.cmp_text(&best.1) {
                    std::cmp::Ordering::Equal => val.cmp_text(&best.0).is_lt(),
                    o if kind == AggKind::ArgMax => o.is_gt(),
                    o => o.is_lt(),
                };
                if better {
                    best = (val, key);
                }
            }
            best.0
        }
    }
}

pub fn derive(rule: &ccattler_parser::program::Rule, db: &Db) -> BTreeSet<Row> {
    let lits: Vec<Lit> = rule.body.iter().map(|b| b.lit.clone()).collect();
    let mut bs = Vec::new();
    bindings(&lits, db, vec![None; rule.vars.len()], &mut bs);
    let plain = |b: &[Option<Value>]| -> Option<Row> {
        rule.head_terms.iter().filter_map(|h| if let HeadTerm::Expr(e) = h { Some(eval_expr(e, b)) } else { None }).collect()
    };
    if !rule.has_aggregate() {
        return bs.iter().filter_map(|b| plain(b)).collect();
    }
    let distinct: BTreeSet<Vec<Option<Value>>> = bs.into_iter().collect();
    let mut groups: BTreeMap<Row, Vec<Vec<Value>>> = BTreeMap::new();
    for b in &distinct {
        let args: Option<Vec<Value>> =
            rule.head_terms.iter().filter_map(|h| if let HeadTerm::Agg(_, es) = h { Some(es) } else { None }).flatten().map(|e| eval_expr(e, b)).collect();
        if let (Some(g), Some(a)) = (plain(b), args) {
            groups.entry(g).or_default().push(a);
        }
    }
    let mut out = BTreeSet::new();
    for (g, args) in groups {
        let mut gi = g.iter();
        let mut off = 0;
        let row = rule
            .head_terms
            .iter()
            .map(|h| match h {
                HeadTerm::Expr(_) => gi.next().unwrap().clone(),
                HeadTerm::Agg(k, es) => {
                    let slice: Vec<Vec<Value>> = args.iter().map(|a| a[off..off + es.len()].to_vec()).collect();
                    off += es.len();
                    aggregate(*k, &slice)
                }
            })
            .collect();
        out.insert(row);
    }
    out
}

pub fn oracle(program: &Program, inputs: &Db) -> Db {
    let mut db = inputs.clone();
    for stratum in &program.strata {
        loop {
            let mut changed = false;
            for &rid in &stratum.rules {
                let rule = &program.rules[rid];
                let derived = derive(rule, &db);
                let set = db.entry(rule.head).or_default();
                for r in derived {
                    changed |= set.insert(r);
                }
            }
            if !changed {
                break;
            }
        }
    }
    db
}

/// The oracle's `in_network` for one network: the address's and the
/// network's bits as text, compared over the prefix.
fn in_network_by_bits(addr: &str, net: &str) -> bool {
    fn bits(a: &str) -> Option<String> {
        match a.parse::<std::net::IpAddr>().ok()? {
            std::net::IpAddr::V4(v) => Some(v.octets().iter().map(|o| format!("{o:08b}")).collect()),
            std::net::IpAddr::V6(v) => Some(v.octets().iter().map(|o| format!("{o:08b}")).collect()),
        }
    }
    let (base, len) = match net.split_once('/') {
        Some((b, l)) => (b, l.parse::<usize>().ok()),
        None => (net, bits(net).map(|b| b.len())),
    };
    match (bits(addr), bits(base), len) {
        (Some(a), Some(b), Some(l)) => a.len() == b.len() && l <= b.len() && a[..l] == b[..l],
        _ => false,
    }
}
