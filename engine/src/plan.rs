//! Checked rules → join plans. A plan is a sequence of steps over a binding row
//! (one slot per rule variable): scan or join an atom, anti-join a negated
//! atom, filter, assign, expand a range; then build the head.

use crate::value::{Row, Value};
use ccattler_parser::ast::{AggKind, BinOp, CmpOp, Func};
use ccattler_parser::program::{self, Expr, HeadTerm, Lit, Program, RelId, Term};

/// An expression with its constants already interned.
#[derive(Clone, Debug)]
pub enum CExpr {
    Val(Value),
    Var(usize),
    Neg(Box<CExpr>),
    Bin(BinOp, Box<CExpr>, Box<CExpr>),
    Call(Func, Vec<CExpr>),
}

impl CExpr {
    fn lower(e: &Expr) -> CExpr {
        match e {
            Expr::Const(c) => CExpr::Val(Value::from_const(c)),
            Expr::Var(v) => CExpr::Var(*v),
            Expr::Neg(x) => CExpr::Neg(Box::new(CExpr::lower(x))),
            Expr::Bin(op, a, b) => CExpr::Bin(*op, Box::new(CExpr::lower(a)), Box::new(CExpr::lower(b))),
            Expr::Call(f, args) => CExpr::Call(*f, args.iter().map(CExpr::lower).collect()),
        }
    }

    /// The variables it reads.
    pub fn vars(&self, out: &mut impl Extend<usize>) {
        match self {
            CExpr::Val(_) => {}
            CExpr::Var(v) => out.extend([*v]),
            CExpr::Neg(x) => x.vars(out),
            CExpr::Bin(_, x, y) => {
                x.vars(out);
                y.vars(out);
            }
            CExpr::Call(_, args) => args.iter().for_each(|a| a.vars(out)),
        }
    }

    /// Evaluates over a binding row. `None` on overflow or division by zero:
    /// the literal using it does not hold.
    pub fn eval(&self, b: &[Value]) -> Option<Value> {
        Some(match self {
            CExpr::Val(v) => v.clone(),
            CExpr::Var(i) => b[*i].clone(),
            CExpr::Neg(x) => Value::Int(x.eval(b)?.as_int()?.checked_neg()?),
            CExpr::Call(f, args) => {
                let a = |i: usize| args.get(i).and_then(|e| e.eval(b));
                let truth = |t: bool| Value::str(if t { "true" } else { "false" });
                match f {
                    Func::Len => Value::Int(a(0)?.text().chars().count() as i64),
                    Func::Bytes => Value::Int(a(0)?.text().len() as i64),
                    Func::Min => {
                        let (x, y) = (a(0)?, a(1)?);
                        if y.cmp_text(&x).is_lt() {
                            y
                        } else {
                            x
                        }
                    }
                    Func::Max => {
                        let (x, y) = (a(0)?, a(1)?);
                        if y.cmp_text(&x).is_gt() {
                            y
                        } else {
                            x
                        }
                    }
                    Func::StartsWith => {
                        let (x, y) = (a(0)?, a(1)?);
                        truth(x.text().starts_with(&*y.text()))
                    }
                    Func::Contains => {
                        let (x, y) = (a(0)?, a(1)?);
                        truth(x.text().contains(&*y.text()))
                    }
                    Func::ToString => Value::str(&a(0)?.text()),
                    Func::InNetwork => {
                        let (x, y) = (a(0)?, a(1)?);
                        truth(ccattler_parser::ast::in_network(&x.text(), &y.text()))
                    }
                    Func::Before => {
                        let (x, y) = (a(0)?, a(1)?);
                        let (s, sep) = (x.text(), y.text());
                        Value::str(s.split_once(&*sep).map_or(&*s, |(b, _)| b))
                    }
                    Func::After => {
                        let (x, y) = (a(0)?, a(1)?);
                        let (s, sep) = (x.text(), y.text());
                        Value::str(s.split_once(&*sep).map_or("", |(_, a)| a))
                    }
                }
            }
            CExpr::Bin(BinOp::Concat, x, y) => {
                let (x, y) = (x.eval(b)?, y.eval(b)?);
                Value::str(&format!("{x}{y}"))
            }
            CExpr::Bin(op, x, y) => {
                let (x, y) = (x.eval(b)?.as_int()?, y.eval(b)?.as_int()?);
                Value::Int(match op {
                    BinOp::Add => x.checked_add(y)?,
                    BinOp::Sub => x.checked_sub(y)?,
                    BinOp::Mul => x.checked_mul(y)?,
                    BinOp::Div => x.checked_div(y)?,
                    BinOp::Rem => x.checked_rem(y)?,
                    BinOp::Concat => unreachable!("handled above"),
                })
            }
        })
    }
}

pub fn compare(op: CmpOp, a: &Value, b: &Value) -> bool {
    program::compare(op, &a.cmp_text(b))
}

/// Which facts of a relation an atom can match, independent of bindings:
/// constants at positions, and positions that repeat one variable.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AtomFilter {
    pub consts: Vec<(usize, Value)>,
    pub eqs: Vec<(usize, usize)>,
}

impl AtomFilter {
    pub fn accepts(&self, row: &[Value]) -> bool {
        self.consts.iter().all(|(p, v)| row[*p] == *v) && self.eqs.iter().all(|(a, b)| row[*a] == row[*b])
    }
}

#[derive(Clone, Debug)]
pub enum Step {
    /// Join bindings with the atom's relation on `key` (atom positions ⇔ bound
    /// variables); bind `bind` (atom position → new variable).
    Join {
        rel: RelId,
        filter: AtomFilter,
        key: Vec<(usize, usize)>,
        bind: Vec<(usize, usize)>,
    },
    /// Keep bindings with no fact matching on `key` (atom position ⇔ bound variable).
    AntiJoin {
        rel: RelId,
        filter: AtomFilter,
        key: Vec<(usize, usize)>,
    },
    Filter {
        op: CmpOp,
        lhs: CExpr,
        rhs: CExpr,
    },
    Assign {
        var: usize,
        expr: CExpr,
    },
    Range {
        var: usize,
        lo: CExpr,
        hi: CExpr,
    },
}

impl Step {
    /// The variables it reads: a join's or anti-join's key, an expression's.
    pub fn reads(&self, out: &mut impl Extend<usize>) {
        match self {
            Step::Join { key, .. } | Step::AntiJoin { key, .. } => out.extend(key.iter().map(|(_, v)| *v)),
            Step::Filter { lhs, rhs, .. } | Step::Range { lo: lhs, hi: rhs, .. } => {
                lhs.vars(out);
                rhs.vars(out);
            }
            Step::Assign { expr, .. } => expr.vars(out),
        }
    }

    /// The variables it binds.
    pub fn binds(&self, out: &mut impl Extend<usize>) {
        match self {
            Step::Join { bind, .. } => out.extend(bind.iter().map(|(_, v)| *v)),
            Step::Assign { var, .. } | Step::Range { var, .. } => out.extend([*var]),
            Step::AntiJoin { .. } | Step::Filter { .. } => {}
        }
    }
}

#[derive(Clone, Debug)]
pub enum CHead {
    Expr(CExpr),
    Agg(AggKind, Vec<CExpr>),
}

#[derive(Clone, Debug)]
pub struct RulePlan {
    pub rule: usize,
    /// `rule N (file.rules:LINE)`: how operators built for it are named.
    pub label: std::rc::Rc<str>,
    pub head: RelId,
    pub nvars: usize,
    pub steps: Vec<Step>,
    pub head_terms: Vec<CHead>,
}

impl RulePlan {
    pub fn has_aggregate(&self) -> bool {
        self.head_terms.iter().any(|h| matches!(h, CHead::Agg(..)))
    }

    /// The head tuple of a binding (non-aggregate rules).
    pub fn head_row(&self, b: &[Value]) -> Option<Row> {
        self.head_terms
            .iter()
            .map(|h| match h {
                CHead::Expr(e) => e.eval(b),
                CHead::Agg(..) => None,
            })
            .collect()
    }

    /// For aggregate rules: (group key = the non-aggregate head terms, the
    /// aggregates' arguments in order).
    pub fn group_and_args(&self, b: &[Value]) -> Option<(Row, Row)> {
        let mut group = Row::new();
        let mut args = Row::new();
        for h in &self.head_terms {
            match h {
                CHead::Expr(e) => group.push(e.eval(b)?),
                CHead::Agg(_, es) => {
                    for e in es {
                        args.push(e.eval(b)?);
                    }
                }
            }
        }
        Some((group, args))
    }

    /// Assembles head rows from a group and the aggregate results.
    pub fn head_from_group(&self, group: &[Value], aggs: &[Value]) -> Row {
        let (mut g, mut a) = (group.iter(), aggs.iter());
        self.head_terms
            .iter()
            .map(|h| match h {
                CHead::Expr(_) => g.next().expect("group has one value per plain head term").clone(),
                CHead::Agg(..) => a.next().expect("one result per aggregate").clone(),
            })
            .collect()
    }

    /// Computes every aggregate of the head over one group's (arguments, multiplicity).
    pub fn aggregate<R: AsRef<[Value]>>(&self, input: &[(R, isize)]) -> Option<Row> {
        let mut out = Row::new();
        let mut offset = 0;
        for h in &self.head_terms {
            let CHead::Agg(kind, es) = h else { continue };
            let arg = |row: &R, i: usize| row.as_ref()[offset + i].clone();
            let v = match kind {
                AggKind::Count => Value::Int(input.iter().map(|(_, m)| *m as i64).sum()),
                AggKind::Sum => {
                    let mut s: i64 = 0;
                    for (row, m) in input {
                        s = s.checked_add(arg(row, 0).as_int()?.checked_mul(*m as i64)?)?;
                    }
                    Value::Int(s)
                }
                AggKind::Min => input.iter().map(|(r, _)| arg(r, 0)).min_by(|a, b| a.cmp_text(b))?,
                AggKind::Max => input.iter().map(|(r, _)| arg(r, 0)).max_by(|a, b| a.cmp_text(b))?,
                AggKind::ArgMax | AggKind::ArgMin => {
                    let max = *kind == AggKind::ArgMax;
                    // Best key first; among equal keys the smallest value.
                    input
                        .iter()
                        .map(|(r, _)| (arg(r, 1), arg(r, 0)))
                        .min_by(|(ka, va), (kb, vb)| {
                            let by_key = if max { kb.cmp_text(ka) } else { ka.cmp_text(kb) };
                            by_key.then_with(|| va.cmp_text(vb))
                        })?
                        .1
                }
            };
            offset += es.len();
            out.push(v);
        }
        Some(out)
    }
}

/// Lowers every rule of a checked program.
pub fn plan(program: &Program) -> Vec<RulePlan> {
    program.rules.iter().map(|r| plan_rule(r, format!("rule {} ({})", r.id, program.rule_location(r.id)).into())).collect()
}

fn plan_rule(rule: &program::Rule, label: std::rc::Rc<str>) -> RulePlan {
    let mut bound = vec![false; rule.vars.len()];
    let mut steps = Vec::new();
    for lit in &rule.body {
        steps.push(match &lit.lit {
            // p(x, y, "c") joined on the variables already bound; binds the rest.
            Lit::Pos { rel, args } => {
                let (filter, key, bind) = atom_shape(args, &bound);
                for (_, v) in &bind {
                    bound[*v] = true;
                }
                Step::Join { rel: *rel, filter, key, bind }
            }
            // not p(x, _): the checker guarantees every variable here is bound.
            Lit::Neg { rel, args } => {
                let (filter, key, bind) = atom_shape(args, &bound);
                debug_assert!(bind.is_empty(), "negated atoms bind nothing");
                Step::AntiJoin { rel: *rel, filter, key }
            }
            Lit::Filter { op, lhs, rhs } => Step::Filter { op: *op, lhs: CExpr::lower(lhs), rhs: CExpr::lower(rhs) },
            Lit::Assign { var, expr } => {
                bound[*var] = true;
                Step::Assign { var: *var, expr: CExpr::lower(expr) }
            }
            Lit::Range { var, lo, hi } => {
                bound[*var] = true;
                Step::Range { var: *var, lo: CExpr::lower(lo), hi: CExpr::lower(hi) }
            }
        });
    }
    let head_terms = rule
        .head_terms
        .iter()
        .map(|h| match h {
            HeadTerm::Expr(e) => CHead::Expr(CExpr::lower(e)),
            HeadTerm::Agg(k, es) => CHead::Agg(*k, es.iter().map(CExpr::lower).collect()),
        })
        .collect();
    RulePlan { rule: rule.id, label, head: rule.head, nvars: rule.vars.len(), steps, head_terms }
}

type Shape = (AtomFilter, Vec<(usize, usize)>, Vec<(usize, usize)>);

/// Splits an atom's arguments into a static filter, join key (bound variables)
/// and new bindings (first occurrence of an unbound variable).
fn atom_shape(args: &[Term], bound: &[bool]) -> Shape {
    let mut filter = AtomFilter { consts: vec![], eqs: vec![] };
    let mut key = Vec::new();
    let mut bind: Vec<(usize, usize)> = Vec::new();
    for (pos, t) in args.iter().enumerate() {
        match t {
            Term::Const(c) => filter.consts.push((pos, Value::from_const(c))),
            Term::Wildcard => {}
            Term::Var(v) if bound[*v] => key.push((pos, *v)),
            Term::Var(v) => match bind.iter().find(|(_, w)| w == v) {
                Some((first, _)) => filter.eqs.push((*first, pos)),
                None => bind.push((pos, *v)),
            },
        }
    }
    (filter, key, bind)
}
