//! [`ast::File`]s → [`Program`]: resolves names, checks arity, types, variable
//! safety, stratification and key patterns. Reports every problem it finds.

use crate::ast::{self, AggKind, BinOp, CmpOp, DeclKind, ExprKind, Type};
use crate::diag::Diagnostic;
use crate::pattern::{KeyPattern, Segment};
use crate::program::*;
use crate::source::{Sources, Span};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Checks parsed files. Returns the program when there are no errors; the
/// diagnostics (warnings included) either way.
///
/// `complete` is false when some statements did not parse: usage checks
/// (underived outputs, unused inputs) would then be misleading and are skipped.
pub fn check(sources: Sources, files: &[ast::File], complete: bool) -> (Option<Program>, Vec<Diagnostic>) {
    let mut cx = Checker { diags: Vec::new(), relations: Vec::new(), by_name: HashMap::new(), rules: Vec::new(), types: HashMap::new() };
    cx.types.insert("bool".into(), (Type::String, Arc::new(Constraint::bool()), None));
    for file in files {
        for item in &file.items {
            if let ast::Item::Type(t) = item {
                cx.declare_type(t);
            }
        }
    }
    for file in files {
        for item in &file.items {
            if let ast::Item::Decl(d) = item {
                cx.declare(d);
            }
        }
    }
    for file in files {
        for item in &file.items {
            if let ast::Item::Decl(d) = item {
                cx.builtin(d);
            }
        }
    }
    for file in files {
        for item in &file.items {
            if let ast::Item::Rule(r) = item {
                cx.rule(r);
            }
        }
    }
    if complete {
        cx.usage();
    }
    cx.output_collisions();
    let strata = cx.stratify();
    let ok = !cx.diags.iter().any(Diagnostic::is_error);
    let program = ok.then(|| Program { sources, keys: KeyIndex::new(&cx.relations), relations: cx.relations, rules: cx.rules, strata });
    (program, cx.diags)
}

struct Checker {
    diags: Vec<Diagnostic>,
    relations: Vec<Relation>,
    by_name: HashMap<String, RelId>,
    rules: Vec<Rule>,
    /// Named types: `bool` and those declared with `type` (with where).
    types: HashMap<String, (Type, Arc<Constraint>, Option<Span>)>,
}

/// Variable scope of one rule while it is checked.
#[derive(Default)]
struct Vars {
    names: Vec<String>,
    types: Vec<Option<Type>>,
    /// The named type of the column that first bound each variable, if any.
    constraints: Vec<Option<Arc<Constraint>>>,
    /// Where each variable first appears.
    spans: Vec<Span>,
}

impl Vars {
    fn slot(&mut self, name: &str, span: Span) -> VarId {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return i;
        }
        self.names.push(name.to_string());
        self.types.push(None);
        self.constraints.push(None);
        self.spans.push(span);
        self.names.len() - 1
    }
}

impl Checker {
    fn error(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    /// `type NAME = …`: a refinement columns can name.
    fn declare_type(&mut self, t: &ast::TypeDecl) {
        let name = &t.name.name;
        if ["string", "name", "int"].contains(&name.as_str()) || self.types.contains_key(name) {
            let mut d = Diagnostic::error("duplicate-type", t.name.span, format!("type `{name}` is already defined")).with_help("give the type another name");
            if let Some(Some(prev)) = self.types.get(name).map(|(_, _, s)| *s) {
                d = d.with_note(prev, "first defined here");
            }
            self.error(d);
            return;
        }
        let (ty, kind) = match &t.def {
            ast::TypeDef::IntRange { lo, hi } => {
                if hi.is_some_and(|h| h < *lo) {
                    self.error(
                        Diagnostic::error("empty-type", t.span, format!("type `{name}` admits no value: {lo}..={} is empty", hi.unwrap_or_default()))
                            .with_help("write the smaller bound first: `int in LO..=HI` with LO ≤ HI"),
                    );
                    return;
                }
                (Type::Int, ConstraintKind::IntRange { lo: *lo, hi: *hi })
            }
            ast::TypeDef::Enum(values) => {
                let mut seen: HashMap<&str, Span> = HashMap::new();
                for (v, span) in values {
                    if let Some(prev) = seen.insert(v, *span) {
                        self.error(
                            Diagnostic::error("duplicate-value", *span, format!("{v:?} appears twice in type `{name}`"))
                                .with_note(prev, "first here")
                                .with_help("list every value once"),
                        );
                    }
                }
                (Type::String, ConstraintKind::Enum(values.iter().map(|(v, _)| v.clone()).collect()))
            }
        };
        self.types.insert(name.clone(), (ty, Arc::new(Constraint { name: name.clone(), kind }), Some(t.span)));
    }

    /// A column's base type and refinement.
    fn column_type(&mut self, c: &ast::Column) -> (Type, Option<Arc<Constraint>>) {
        let Some(name) = &c.ty_name else { return (c.ty, None) };
        if let Some((ty, constraint, _)) = self.types.get(name) {
            return (*ty, Some(constraint.clone()));
        }
        let mut known: Vec<&str> = self.types.keys().map(String::as_str).chain(["string", "name", "int"]).collect();
        known.sort();
        let near = known.iter().map(|k| (edit_distance(k, name), *k)).filter(|(d, k)| *d <= 2.max(k.len() / 4)).min().map(|(_, k)| k);
        let help = match near {
            Some(k) => format!("did you mean `{k}`?"),
            None => format!("the types are {}; declare others with `type {name} = int in LO..=HI` or `type {name} = \"a\" | \"b\"`", known.join(", ")),
        };
        self.error(Diagnostic::error("unknown-type", c.ty_span, format!("unknown type `{name}`")).with_help(help));
        (Type::String, None)
    }

    /// A constant where a named type is expected: it must fit, or the
    /// literal can never match (a typo in a state or a flag).
    fn check_constant(&mut self, c: &Const, constraint: &Option<Arc<Constraint>>, span: Span, what: &str) {
        let Some(constraint) = constraint else { return };
        if let Err(why) = constraint.check_const(c) {
            let mut d = Diagnostic::error("constant-type", span, format!("{why}, but {what} is a {}", constraint.name));
            d = match (&constraint.kind, c) {
                (ConstraintKind::Enum(values), Const::Str(s)) => {
                    match values.iter().map(|v| (edit_distance(v, s), v)).filter(|(dist, v)| *dist <= 2.max(v.len() / 3)).min() {
                        Some((_, v)) => d.with_help(format!("did you mean {v:?}?")),
                        None if constraint.name == "bool" => d.with_help("write `true` or `false` (no quotes needed)"),
                        None => d.with_help(format!("use one of {}", constraint.describe())),
                    }
                }
                _ => d.with_help(format!("use an {}", constraint.describe())),
            };
            self.error(d);
        }
    }

    fn declare(&mut self, d: &ast::Decl) {
        if let Some(&prev) = self.by_name.get(&d.name.name) {
            let prev_span = self.relations[prev].span;
            self.error(
                Diagnostic::error("duplicate-declaration", d.name.span, format!("relation `{}` is declared twice", d.name.name))
                    .with_note(prev_span, "first declared here")
                    .with_help("remove one declaration or rename one relation"),
            );
            return;
        }
        let mut seen: HashMap<&str, Span> = HashMap::new();
        for c in &d.columns {
            if let Some(prev) = seen.insert(&c.name.name, c.name.span) {
                self.error(
                    Diagnostic::error("duplicate-column", c.name.span, format!("column `{}` appears twice in `{}`", c.name.name, d.name.name))
                        .with_note(prev, "first here")
                        .with_help("give every column its own name"),
                );
            }
        }
        let names: Vec<&str> = d.columns.iter().map(|c| c.name.name.as_str()).collect();
        let pattern = match &d.pattern {
            None => None,
            Some((text, span)) => match KeyPattern::parse(text, &names) {
                Ok(p) => Some(p),
                Err(e) => {
                    self.error(Diagnostic::error("bad-pattern", *span, e.to_string()).with_help(
                        "write each placeholder as a whole segment `{column}` naming a column; \
                         every column but at most one (the value) must appear",
                    ));
                    None
                }
            },
        };
        let columns = d
            .columns
            .iter()
            .map(|c| {
                let (ty, constraint) = self.column_type(c);
                ColumnDef { name: c.name.name.clone(), ty, constraint }
            })
            .collect();
        let id = self.relations.len();
        self.by_name.insert(d.name.name.clone(), id);
        self.relations.push(Relation { name: d.name.name.clone(), kind: d.kind, columns, pattern, builtin: None, doc: d.doc.clone(), span: d.span });
    }

    /// Resolves `relation r(…) = assign(…)` and checks
    /// every relation's columns against what the built-in needs.
    fn builtin(&mut self, d: &ast::Decl) {
        let Some(call) = &d.builtin else { return };
        let Some(&id) = self.by_name.get(&d.name.name) else { return };
        if self.relations[id].span != d.span {
            return; // a duplicate declaration, already reported
        }
        let Some(sig) = crate::program::BUILTINS.iter().find(|b| b.name == call.name.name) else {
            let known: Vec<String> = crate::program::BUILTINS.iter().map(crate::program::builtin_call).collect();
            self.error(
                Diagnostic::error("unknown-builtin", call.name.span, format!("unknown built-in `{}`", call.name.name))
                    .with_help(format!("the built-ins are `{}`", known.join("` and `"))),
            );
            return;
        };
        let signature = sig.args;
        if call.args.len() != signature.len() {
            self.error(
                Diagnostic::error("builtin-arity", call.span, format!("`{}` takes {} relations, found {}", sig.name, signature.len(), call.args.len()))
                    .with_help(format!("write `{}`", crate::program::builtin_call(sig))),
            );
            return;
        }
        let mut ids = Vec::new();
        for (arg, want) in call.args.iter().zip(signature) {
            let Some(rel) = self.lookup(arg) else { return };
            let cols: Vec<Type> = self.relations[rel].columns.iter().map(|c| c.ty).collect();
            if cols.len() != want.columns.len() || cols.iter().zip(want.columns).any(|(a, (_, b))| !a.compatible(*b)) {
                let shape = want.columns.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
                self.error(
                    Diagnostic::error("builtin-signature", arg.span, format!("`{}` does not have the columns of {}({shape})", arg.name, want.role))
                        .with_help(format!(
                            "declare it with columns of types ({}): {}",
                            want.columns.iter().map(|(_, t)| if t.is_text() { "name" } else { "int" }).collect::<Vec<_>>().join(", "),
                            want.doc
                        ))
                        .with_note(self.relations[rel].span, "declared here"),
                );
                return;
            }
            ids.push(rel);
        }
        let own: Vec<Type> = self.relations[id].columns.iter().map(|c| c.ty).collect();
        if own.len() != sig.result.len() || own.iter().zip(sig.result).any(|(a, (_, b))| !a.compatible(*b)) {
            let cols = sig.result.iter().map(|(n, t)| format!("{n}: {}", t.keyword())).collect::<Vec<_>>().join(", ");
            self.error(
                Diagnostic::error("builtin-signature", d.name.span, format!("`{}` must have the columns ({cols})", d.name.name))
                    .with_help(format!("what `{}` computes", sig.name)),
            );
            return;
        }
        self.relations[id].builtin = Some((sig.make)(ids));
    }

    fn lookup(&mut self, name: &ast::Ident) -> Option<RelId> {
        if let Some(&id) = self.by_name.get(&name.name) {
            return Some(id);
        }
        let suggestion = self
            .relations
            .iter()
            .map(|r| (edit_distance(&r.name, &name.name), &r.name))
            .filter(|(d, n)| *d <= 2.max(n.len() / 4))
            .min()
            .map(|(_, n)| format!("did you mean `{n}`? Otherwise declare it: `relation {}(…)`", name.name));
        let help = suggestion.unwrap_or_else(|| format!("declare it: `relation {}(col: type, …)`, or `input`/`output` with a key pattern", name.name));
        self.error(Diagnostic::error("unknown-relation", name.span, format!("unknown relation `{}`", name.name)).with_help(help));
        None
    }

    /// A rule; one with `per` becomes the rules that give every group of
    /// the `per` atom a row:
    ///
    /// ```text
    /// h(g, sum(c) default 0) :- body per p(g).
    ///   h#agg(g, sum(c)) :- body, with p(g)     the groups the body matches
    ///     after its first atom naming g
    ///   h#has(g) :- h#agg(g, _).
    ///   h(g, v) :- h#agg(g, v).
    ///   h(g, 0) :- p(g), not h#has(g).         the others get the default
    /// ```
    fn rule(&mut self, r: &ast::Rule) {
        let defaults = r.head_terms.iter().any(|t| matches!(t, ast::HeadTerm::Agg(_, _, Some(_), _)));
        let aggregate = r.head_terms.iter().any(|t| matches!(t, ast::HeadTerm::Agg(..)));
        let Some(per) = &r.per else {
            if defaults {
                let span = r.head_terms.iter().find_map(|t| matches!(t, ast::HeadTerm::Agg(_, _, Some(_), _)).then(|| t.span())).unwrap_or(r.span);
                self.error(Diagnostic::error("default-without-per", span, "an aggregate's `default` needs the rule to say which groups exist").with_help(
                    "end the rule with `per ATOM`, the relation whose rows are the groups: `used(n, sum(c) default 0) :- kept(i, n), cpu(i, c) per node(n).`",
                ));
            }
            return self.rule_checked(r);
        };
        if !aggregate {
            self.error(
                Diagnostic::error("per-without-aggregate", per.span, "`per` names the groups of an aggregate, but this rule has none")
                    .with_help("remove `per …`, or aggregate in the head: `h(g, count()) :- … per p(g).`"),
            );
            return;
        }
        let Some(head) = self.lookup(&r.head) else { return };
        let group_vars: Vec<Option<String>> = r
            .head_terms
            .iter()
            .map(|t| match t {
                ast::HeadTerm::Expr(ast::Expr { kind: ExprKind::Var(v), .. }) => Some(v.clone()),
                _ => None,
            })
            .collect();
        if r.head_terms.iter().zip(&group_vars).any(|(t, g)| matches!(t, ast::HeadTerm::Expr(_)) && g.is_none()) {
            self.error(
                Diagnostic::error("per-group", r.head_span, "with `per`, every head term but the aggregates is a variable (the group)")
                    .with_help("bind expressions in the body (`x = …`) and put the variable in the head"),
            );
            return;
        }
        let in_per = |g: &str| per.args.iter().any(|a| matches!(&a.kind, ExprKind::Var(v) if v == g));
        if let Some(g) = group_vars.iter().flatten().find(|g| !in_per(g)) {
            self.error(
                Diagnostic::error("per-group", per.span, format!("the `per` atom must list the groups, but it does not bind the group `{g}`"))
                    .with_help(format!("use `{g}` in the `per` atom, the relation whose rows are the groups: `… per {}(…{g}…)`", per.relation.name)),
            );
            return;
        }
        let columns = self.relations[head].columns.clone();
        if columns.len() != r.head_terms.len() {
            return self.rule_checked(r); // the arity error is reported there
        }
        let name = &r.head.name;
        let ident = |n: String| ast::Ident { name: n, span: r.head.span };
        let var = |n: &str| ast::Expr { kind: ExprKind::Var(n.to_string()), span: r.head_span };
        let wild = ast::Expr { kind: ExprKind::Wildcard, span: r.head_span };
        let agg_rel = format!("{name}#agg");
        let has_rel = format!("{name}#has");
        let group_cols: Vec<ColumnDef> = columns.iter().zip(&group_vars).filter(|(_, g)| g.is_some()).map(|(c, _)| c.clone()).collect();
        let all_default = r.head_terms.iter().all(|t| !matches!(t, ast::HeadTerm::Agg(_, _, None, _)));
        self.declare_hidden(&agg_rel, columns.clone(), r.span);
        if all_default {
            self.declare_hidden(&has_rel, group_cols, r.span);
        }
        let agg_vars: Vec<String> = (0..columns.len()).map(|i| format!("_#v{i}")).collect();
        // h#agg(g, sum(c)) :- p(g), body. The group atom goes right after the
        // body's first positive atom that names a group (first if none does),
        // so it filters what is bound instead of pairing every group with the
        // body's first atom.
        let names_group = |item: &ast::BodyItem| match item {
            ast::BodyItem::Pos(a) => a.args.iter().any(|e| matches!(&e.kind, ExprKind::Var(v) if group_vars.iter().flatten().any(|g| g == v))),
            _ => false,
        };
        let at = r.body.iter().position(names_group).map_or(0, |i| i + 1);
        let mut body = r.body.clone();
        body.insert(at, ast::BodyItem::Pos(per.clone()));
        let agg_terms = r
            .head_terms
            .iter()
            .map(|t| match t {
                ast::HeadTerm::Agg(k, args, _, s) => ast::HeadTerm::Agg(*k, args.clone(), None, *s),
                other => other.clone(),
            })
            .collect();
        self.rule_checked(&ast::Rule { head: ident(agg_rel.clone()), head_terms: agg_terms, head_span: r.head_span, body, per: None, span: r.span });
        // h#has(g) :- h#agg(g, _).
        let group_args: Vec<ast::Expr> = group_vars.iter().flatten().map(|g| var(g)).collect();
        let agg_atom_wild =
            ast::Atom { relation: ident(agg_rel.clone()), args: group_vars.iter().map(|g| g.as_deref().map_or(wild.clone(), var)).collect(), span: r.span };
        if all_default {
            self.rule_checked(&ast::Rule {
                head: ident(has_rel.clone()),
                head_terms: group_args.iter().cloned().map(ast::HeadTerm::Expr).collect(),
                head_span: r.head_span,
                body: vec![ast::BodyItem::Pos(agg_atom_wild)],
                per: None,
                span: r.span,
            });
        }
        // h(g, v) :- h#agg(g, v).
        let all: Vec<ast::Expr> = group_vars.iter().zip(&agg_vars).map(|(g, v)| var(g.as_deref().unwrap_or(v))).collect();
        self.rule_checked(&ast::Rule {
            head: r.head.clone(),
            head_terms: all.iter().cloned().map(ast::HeadTerm::Expr).collect(),
            head_span: r.head_span,
            body: vec![ast::BodyItem::Pos(ast::Atom { relation: ident(agg_rel), args: all, span: r.span })],
            per: None,
            span: r.span,
        });
        // h(g, default) :- p(g), not h#has(g).
        let mut defaults = Vec::new();
        for t in &r.head_terms {
            match t {
                ast::HeadTerm::Expr(e) => defaults.push(ast::HeadTerm::Expr(e.clone())),
                ast::HeadTerm::Agg(_, _, Some(d), _) => defaults.push(ast::HeadTerm::Expr((**d).clone())),
                // No default: a group the body does not match has no row.
                ast::HeadTerm::Agg(_, _, None, _) => return,
            }
        }
        self.rule_checked(&ast::Rule {
            head: r.head.clone(),
            head_terms: defaults,
            head_span: r.head_span,
            body: vec![ast::BodyItem::Pos(per.clone()), ast::BodyItem::Neg(ast::Atom { relation: ident(has_rel), args: group_args, span: r.span })],
            per: None,
            span: r.span,
        });
    }

    /// A relation the checker makes for a construct (never written by users:
    /// its name holds `#`).
    fn declare_hidden(&mut self, name: &str, columns: Vec<ColumnDef>, span: Span) {
        if self.by_name.contains_key(name) {
            return;
        }
        self.by_name.insert(name.to_string(), self.relations.len());
        self.relations.push(Relation { name: name.into(), kind: DeclKind::Relation, columns, pattern: None, builtin: None, doc: None, span });
    }

    fn rule_checked(&mut self, r: &ast::Rule) {
        let errors_before = self.diags.iter().filter(|d| d.is_error()).count();
        let mut vars = Vars::default();
        let head = self.lookup(&r.head);
        if let Some(h) = head {
            if self.relations[h].kind == DeclKind::Input {
                let span = self.relations[h].span;
                self.error(
                    Diagnostic::error("derived-input", r.head.span, format!("`{}` is an input: its facts come from etcd, rules cannot derive it", r.head.name))
                        .with_note(span, "declared as input here")
                        .with_help("derive a new relation (declare it with `relation` or `output`) instead"),
                );
            }
            if self.relations[h].builtin.is_some() {
                let span = self.relations[h].span;
                self.error(
                    Diagnostic::error("derived-builtin", r.head.span, format!("`{}` is computed by a built-in; rules cannot also derive it", r.head.name))
                        .with_note(span, "declared here")
                        .with_help("derive another relation and combine the two in a third"),
                );
            }
            let arity = self.relations[h].arity();
            if arity != r.head_terms.len() {
                self.arity_error(&r.head, arity, r.head_terms.len(), r.head_span);
            }
        }

        // Body: resolve atoms and give every variable a slot; infer types from atoms and ranges.
        struct Pending {
            item: PendingItem,
            span: Span,
        }
        enum PendingItem {
            Atom { neg: bool, rel: RelId, args: Vec<Term> },
            Cmp(CmpOp, ast::Expr, ast::Expr),
            Range(VarId, ast::Expr, ast::Expr),
        }
        let mut pending = Vec::new();
        let aggregate = r.head_terms.iter().any(|t| matches!(t, ast::HeadTerm::Agg(..)));
        let mut hidden = 0;
        // Variables of atoms that did not resolve: treated as bound, so one
        // unknown relation does not also report every variable it would bind.
        let mut poisoned = Vec::new();
        for item in &r.body {
            match item {
                ast::BodyItem::Pos(a) | ast::BodyItem::Neg(a) => {
                    let neg = matches!(item, ast::BodyItem::Neg(_));
                    // `starts_with(s, "web")` (or `not …`): a function that
                    // gives true or false, used as a literal.
                    let func = ast::Func::from_name(&a.relation.name).filter(|f| f.is_predicate() && !self.by_name.contains_key(&a.relation.name));
                    if let Some(f) = func {
                        let call = ast::Expr { kind: ExprKind::Call(f, a.args.clone()), span: a.span };
                        let want = ast::Expr { kind: ExprKind::Lit(ast::Literal::Str((!neg).to_string())), span: a.span };
                        self.register_vars(&mut vars, &call);
                        pending.push(Pending { item: PendingItem::Cmp(CmpOp::Eq, call, want), span: a.span });
                        continue;
                    }
                    let resolved = self.lookup(&a.relation).filter(|&rel| {
                        let arity = self.relations[rel].arity();
                        if arity != a.args.len() {
                            self.arity_error(&a.relation, arity, a.args.len(), a.span);
                        }
                        arity == a.args.len()
                    });
                    let Some(rel) = resolved else {
                        for e in &a.args {
                            if let ExprKind::Var(v) = &e.kind {
                                poisoned.push(vars.slot(v, e.span));
                            }
                        }
                        continue;
                    };
                    let mut args = Vec::new();
                    for (i, e) in a.args.iter().enumerate() {
                        let col_ty = self.relations[rel].columns[i].ty;
                        let constraint = self.relations[rel].columns[i].constraint.clone();
                        let term = match &e.kind {
                            // In an aggregate rule, a positive atom's `_` still
                            // tells matches apart: `count()` over `placed(_, n)`
                            // counts instances, not nodes. It binds a hidden
                            // variable (no user can name it).
                            ExprKind::Wildcard if aggregate && !neg => {
                                hidden += 1;
                                let slot = vars.slot(&format!("_#{hidden}"), e.span);
                                self.unify_var(&mut vars, slot, col_ty, e.span, "a `_`");
                                Term::Var(slot)
                            }
                            ExprKind::Wildcard => Term::Wildcard,
                            ExprKind::Var(v) => {
                                let slot = vars.slot(v, e.span);
                                if vars.constraints[slot].is_none() {
                                    vars.constraints[slot] = constraint;
                                }
                                self.unify_var(
                                    &mut vars,
                                    slot,
                                    col_ty,
                                    e.span,
                                    &format!("column `{}` of `{}`", self.relations[rel].columns[i].name, a.relation.name),
                                );
                                Term::Var(slot)
                            }
                            ExprKind::Lit(l) => {
                                let (c, ty) = lit_const(l);
                                let what = format!("column `{}` of `{}`", self.relations[rel].columns[i].name, a.relation.name);
                                if !ty.compatible(col_ty) {
                                    self.type_error(e.span, col_ty, ty, &what);
                                } else {
                                    self.check_constant(&c, &constraint, e.span, &what);
                                }
                                Term::Const(c)
                            }
                            _ => {
                                let mut names = BTreeSet::new();
                                collect_vars(e, &mut names);
                                poisoned.extend(names.iter().map(|n| vars.slot(n, e.span)));
                                self.error(
                                    Diagnostic::error("expression-in-atom", e.span, "an atom's arguments are variables, constants or `_`")
                                        .with_help("bind the expression first: `x = <expression>`, then use `x` in the atom"),
                                );
                                Term::Wildcard
                            }
                        };
                        args.push(term);
                    }
                    pending.push(Pending { item: PendingItem::Atom { neg, rel, args }, span: a.span });
                }
                ast::BodyItem::Cmp(op, lhs, rhs, span) => {
                    self.register_vars(&mut vars, lhs);
                    self.register_vars(&mut vars, rhs);
                    pending.push(Pending { item: PendingItem::Cmp(*op, lhs.clone(), rhs.clone()), span: *span });
                }
                ast::BodyItem::Range(v, lo, hi, span) => {
                    let slot = vars.slot(&v.name, v.span);
                    self.unify_var(&mut vars, slot, Type::Int, v.span, "a range variable");
                    self.register_vars(&mut vars, lo);
                    self.register_vars(&mut vars, hi);
                    pending.push(Pending { item: PendingItem::Range(slot, lo.clone(), hi.clone()), span: *span });
                }
            }
        }
        for t in &r.head_terms {
            match t {
                ast::HeadTerm::Expr(e) => self.register_vars(&mut vars, e),
                ast::HeadTerm::Agg(_, args, _, _) => args.iter().for_each(|e| self.register_vars(&mut vars, e)),
            }
        }

        // Order the body for evaluation: filters and binders as soon as their inputs
        // are bound, otherwise the next positive atom in source order.
        let mut bound = vec![false; vars.names.len()];
        for v in poisoned {
            bound[v] = true;
        }
        let mut body: Vec<BodyLit> = Vec::new();
        let mut done = vec![false; pending.len()];
        loop {
            let mut progressed = false;
            for (i, p) in pending.iter().enumerate() {
                if done[i] {
                    continue;
                }
                let lit = match &p.item {
                    PendingItem::Atom { neg: true, rel, args } => {
                        if args.iter().all(|t| !matches!(t, Term::Var(v) if !bound[*v])) {
                            Some(Lit::Neg { rel: *rel, args: args.clone() })
                        } else {
                            None
                        }
                    }
                    PendingItem::Atom { neg: false, .. } => None,
                    PendingItem::Cmp(op, lhs, rhs) => self.cmp_lit(&mut vars, &bound, *op, lhs, rhs),
                    PendingItem::Range(v, lo, hi) => {
                        if !bound[*v] && self.expr_bound(&vars, &bound, lo) && self.expr_bound(&vars, &bound, hi) {
                            let lo = self.typed_expr(&mut vars, lo, Some(Type::Int));
                            let hi = self.typed_expr(&mut vars, hi, Some(Type::Int));
                            Some(Lit::Range { var: *v, lo, hi })
                        } else {
                            None
                        }
                    }
                };
                if let Some(lit) = lit {
                    match &lit {
                        Lit::Assign { var, .. } | Lit::Range { var, .. } => bound[*var] = true,
                        _ => {}
                    }
                    body.push(BodyLit { lit, span: p.span });
                    done[i] = true;
                    progressed = true;
                }
            }
            if progressed {
                continue;
            }
            let next_atom = pending.iter().enumerate().find(|(i, p)| !done[*i] && matches!(p.item, PendingItem::Atom { neg: false, .. }));
            match next_atom {
                Some((i, p)) => {
                    if let PendingItem::Atom { rel, args, .. } = &p.item {
                        for t in args {
                            if let Term::Var(v) = t {
                                bound[*v] = true;
                            }
                        }
                        body.push(BodyLit { lit: Lit::Pos { rel: *rel, args: args.clone() }, span: p.span });
                    }
                    done[i] = true;
                }
                None => break,
            }
        }
        for (i, p) in pending.iter().enumerate() {
            if done[i] {
                continue;
            }
            let mut names = BTreeSet::new();
            match &p.item {
                PendingItem::Atom { args, .. } => args.iter().for_each(|t| {
                    if let Term::Var(v) = t {
                        if !bound[*v] {
                            names.insert(vars.names[*v].clone());
                        }
                    }
                }),
                PendingItem::Cmp(_, l, rr) => {
                    collect_unbound(&vars, &bound, l, &mut names);
                    collect_unbound(&vars, &bound, rr, &mut names);
                }
                PendingItem::Range(v, lo, hi) => {
                    if bound[*v] {
                        names.insert(format!("{} (already bound: a range must bind a new variable)", vars.names[*v]));
                    }
                    collect_unbound(&vars, &bound, lo, &mut names);
                    collect_unbound(&vars, &bound, hi, &mut names);
                }
            }
            // What this item would have bound is not reported again at the head.
            match &p.item {
                PendingItem::Range(v, _, _) => bound[*v] = true,
                PendingItem::Cmp(CmpOp::Eq, l, rr) => {
                    for side in [l, rr] {
                        if let ExprKind::Var(n) = &side.kind {
                            if let Some(i) = vars.names.iter().position(|x| x == n) {
                                bound[i] = true;
                            }
                        }
                    }
                }
                _ => {}
            }
            let list = names.into_iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
            self.error(Diagnostic::error("unsafe-variable", p.span, format!("{list} not bound by any positive atom")).with_help(
                "every variable used in `not`, a comparison or a range bound must also appear in a positive atom, or be bound by `x = …` or `x in lo..hi`",
            ));
        }

        // Head terms: every variable must be bound.
        let mut head_terms = Vec::new();
        for (i, t) in r.head_terms.iter().enumerate() {
            let col_ty = head.and_then(|h| self.relations[h].columns.get(i).map(|c| c.ty));
            let constraint = head.and_then(|h| self.relations[h].columns.get(i).and_then(|c| c.constraint.clone()));
            let what = head.and_then(|h| self.relations[h].columns.get(i).map(|c| format!("column `{}` of `{}`", c.name, self.relations[h].name)));
            match t {
                ast::HeadTerm::Expr(e) => {
                    self.check_head_vars(&vars, &bound, e);
                    let (ir, ty) = self.expr(&mut vars, e);
                    if let (Some(col), Some(ty), Some(w)) = (col_ty, ty, &what) {
                        if !col.compatible(ty) {
                            self.type_error(e.span, col, ty, w);
                        } else if let Expr::Const(c) = &ir {
                            self.check_constant(c, &constraint, e.span, w);
                        }
                    }
                    head_terms.push(HeadTerm::Expr(ir));
                }
                ast::HeadTerm::Agg(kind, args, _, span) => {
                    if args.len() != kind.arity() {
                        let shape = match kind {
                            AggKind::Count => "count()".to_string(),
                            AggKind::ArgMax | AggKind::ArgMin => format!("{}(value, key)", kind.keyword()),
                            _ => format!("{}(expression)", kind.keyword()),
                        };
                        self.error(
                            Diagnostic::error(
                                "aggregate-arity",
                                *span,
                                format!("`{}` takes {} argument(s), found {}", kind.keyword(), kind.arity(), args.len()),
                            )
                            .with_help(format!("write `{shape}`")),
                        );
                        continue;
                    }
                    let mut irs = Vec::new();
                    let mut tys = Vec::new();
                    for a in args {
                        self.check_head_vars(&vars, &bound, a);
                        let (ir, ty) = self.expr(&mut vars, a);
                        irs.push(ir);
                        tys.push(ty);
                    }
                    let result_ty = match kind {
                        AggKind::Count => Some(Type::Int),
                        AggKind::Sum => {
                            if let Some(t) = tys[0] {
                                if t != Type::Int {
                                    self.type_error(args[0].span, Type::Int, t, "`sum`");
                                }
                            }
                            Some(Type::Int)
                        }
                        _ => tys[0],
                    };
                    if let (Some(col), Some(ty), Some(w)) = (col_ty, result_ty, &what) {
                        if !col.compatible(ty) {
                            self.type_error(*span, col, ty, w);
                        }
                    }
                    head_terms.push(HeadTerm::Agg(*kind, irs));
                }
            }
        }

        // A rule with errors is not added (ids stay dense; no program is built).
        let errors_after = self.diags.iter().filter(|d| d.is_error()).count();
        if let (Some(head), true) = (head, errors_after == errors_before) {
            let vars = vars.names.into_iter().zip(vars.types.into_iter().map(|t| t.unwrap_or(Type::Int))).collect();
            let id = self.rules.len();
            self.rules.push(Rule { id, head, head_terms, body, vars, span: r.span });
        }
    }

    fn arity_error(&mut self, name: &ast::Ident, expected: usize, found: usize, span: Span) {
        let decl = self.by_name.get(&name.name).map(|&r| self.relations[r].span);
        let mut d = Diagnostic::error("arity", span, format!("`{}` has {} column(s), but {} argument(s) are given here", name.name, expected, found))
            .with_help(format!("give `{}` exactly {} argument(s) (use `_` for columns you do not need)", name.name, expected));
        if let Some(s) = decl {
            d = d.with_note(s, "declared here");
        }
        self.error(d);
    }

    fn type_error(&mut self, span: Span, expected: Type, found: Type, what: &str) {
        self.error(
            Diagnostic::error("type", span, format!("type mismatch: {what} is {}, but this is {}", expected.keyword(), found.keyword()))
                .with_help(if expected.is_text() { "use a string here; `++` turns an int into text" } else { "use an int here" }),
        );
    }

    fn unify_var(&mut self, vars: &mut Vars, v: VarId, ty: Type, span: Span, what: &str) {
        match vars.types[v] {
            None => vars.types[v] = Some(ty),
            Some(t) if t.compatible(ty) => {}
            Some(t) => {
                let first = vars.spans[v];
                self.error(
                    Diagnostic::error(
                        "type",
                        span,
                        format!("variable `{}` is {} here ({what}) but {} where it first appears", vars.names[v], ty.keyword(), t.keyword()),
                    )
                    .with_note(first, "first appears here")
                    .with_help("use two different variables, or fix the column types"),
                );
            }
        }
    }

    fn register_vars(&mut self, vars: &mut Vars, e: &ast::Expr) {
        match &e.kind {
            ExprKind::Var(v) => {
                vars.slot(v, e.span);
            }
            ExprKind::Neg(x) => self.register_vars(vars, x),
            ExprKind::Call(_, args) => args.iter().for_each(|a| self.register_vars(vars, a)),
            ExprKind::Bin(_, a, b) => {
                self.register_vars(vars, a);
                self.register_vars(vars, b);
            }
            ExprKind::Lit(_) | ExprKind::Wildcard => {}
        }
    }

    fn expr_bound(&self, vars: &Vars, bound: &[bool], e: &ast::Expr) -> bool {
        let mut names = BTreeSet::new();
        collect_unbound(vars, bound, e, &mut names);
        names.is_empty() && !has_wildcard(e)
    }

    /// A comparison becomes a filter when both sides are bound, or an assignment
    /// when it is `x = e` (or `e = x`) with `x` unbound and `e` bound.
    fn cmp_lit(&mut self, vars: &mut Vars, bound: &[bool], op: CmpOp, lhs: &ast::Expr, rhs: &ast::Expr) -> Option<Lit> {
        if self.expr_bound(vars, bound, lhs) && self.expr_bound(vars, bound, rhs) {
            let (l, lt) = self.expr(vars, lhs);
            let (r, rt) = self.expr(vars, rhs);
            if let (Some(a), Some(b)) = (lt, rt) {
                if !a.compatible(b) {
                    self.error(
                        Diagnostic::error("type", lhs.span.to(rhs.span), format!("cannot compare {} with {}", a.keyword(), b.keyword()))
                            .with_help("compare values of one type; `++` turns an int into text"),
                    );
                } else if matches!(op, CmpOp::Eq | CmpOp::Ne) {
                    // `state = "runing"` with `state` from a column of a named type.
                    for (var, other, span) in [(&l, &r, rhs.span), (&r, &l, lhs.span)] {
                        if let (Expr::Var(v), Expr::Const(c)) = (var, other) {
                            let constraint = vars.constraints[*v].clone();
                            let what = format!("variable `{}`", vars.names[*v]);
                            self.check_constant(c, &constraint, span, &what);
                        }
                    }
                }
            }
            return Some(Lit::Filter { op, lhs: l, rhs: r });
        }
        if op != CmpOp::Eq {
            return None;
        }
        for (var_side, expr_side) in [(lhs, rhs), (rhs, lhs)] {
            if let ExprKind::Var(name) = &var_side.kind {
                let v = vars.slot(name, var_side.span);
                if !bound[v] && self.expr_bound(vars, bound, expr_side) {
                    let (e, ty) = self.expr(vars, expr_side);
                    if let Expr::Const(c) = &e {
                        let constraint = vars.constraints[v].clone();
                        let what = format!("variable `{}`", vars.names[v]);
                        self.check_constant(c, &constraint, expr_side.span, &what);
                    }
                    if let Some(ty) = ty {
                        self.unify_var(vars, v, ty, var_side.span, "an assignment");
                    }
                    return Some(Lit::Assign { var: v, expr: e });
                }
            }
        }
        None
    }

    fn check_head_vars(&mut self, vars: &Vars, bound: &[bool], e: &ast::Expr) {
        if has_wildcard(e) {
            self.error(
                Diagnostic::error("wildcard-in-head", e.span, "`_` cannot appear in a rule head")
                    .with_help("a head needs a value for every column: use a bound variable or a constant"),
            );
        }
        let mut names = BTreeSet::new();
        collect_unbound(vars, bound, e, &mut names);
        for n in names {
            self.error(
                Diagnostic::error("unsafe-variable", e.span, format!("head variable `{n}` is not bound by the body"))
                    .with_help(format!("use `{n}` in a positive body atom, or bind it with `{n} = …` or `{n} in lo..hi`")),
            );
        }
    }

    fn typed_expr(&mut self, vars: &mut Vars, e: &ast::Expr, want: Option<Type>) -> Expr {
        let (ir, ty) = self.expr(vars, e);
        if let (Some(w), Some(t)) = (want, ty) {
            if !w.compatible(t) {
                self.type_error(e.span, w, t, "a range bound");
            }
        }
        ir
    }

    /// Lowers and types an expression whose variables are all known.
    fn expr(&mut self, vars: &mut Vars, e: &ast::Expr) -> (Expr, Option<Type>) {
        match &e.kind {
            ExprKind::Lit(l) => {
                let (c, t) = lit_const(l);
                (Expr::Const(c), Some(t))
            }
            ExprKind::Var(n) => {
                let v = vars.slot(n, e.span);
                (Expr::Var(v), vars.types[v])
            }
            ExprKind::Wildcard => (Expr::Const(Const::Int(0)), None),
            ExprKind::Neg(x) => {
                let (ir, t) = self.expr(vars, x);
                if let Some(t) = t {
                    if t != Type::Int {
                        self.type_error(x.span, Type::Int, t, "the operand of unary `-`");
                    }
                }
                (Expr::Neg(Box::new(ir)), Some(Type::Int))
            }
            ExprKind::Bin(op, a, b) => {
                let (ia, ta) = self.expr(vars, a);
                let (ib, tb) = self.expr(vars, b);
                let ty = if *op == BinOp::Concat {
                    Type::String
                } else {
                    for (t, x) in [(ta, a), (tb, b)] {
                        if let Some(t) = t {
                            if t != Type::Int {
                                self.type_error(x.span, Type::Int, t, &format!("an operand of `{}`", op.symbol()));
                            }
                        }
                    }
                    Type::Int
                };
                (Expr::Bin(*op, Box::new(ia), Box::new(ib)), Some(ty))
            }
            ExprKind::Call(f, args) => {
                let typed: Vec<(Expr, Option<Type>)> = args.iter().map(|a| self.expr(vars, a)).collect();
                if args.len() != f.arity() {
                    self.error(
                        Diagnostic::error("function-arity", e.span, format!("`{}` takes {} argument(s), found {}", f.name(), f.arity(), args.len()))
                            .with_help(format!("write `{}`", function_shape(*f))),
                    );
                }
                let want_text = |this: &mut Self, i: usize| {
                    if let (Some((_, Some(t))), Some(a)) = (typed.get(i), args.get(i)) {
                        if !t.is_text() {
                            this.type_error(a.span, Type::String, *t, &format!("argument {} of `{}`", i + 1, f.name()));
                        }
                    }
                };
                let ty = match f {
                    ast::Func::Len | ast::Func::Bytes => {
                        want_text(self, 0);
                        Type::Int
                    }
                    ast::Func::StartsWith | ast::Func::Contains | ast::Func::Before | ast::Func::After | ast::Func::InNetwork => {
                        want_text(self, 0);
                        want_text(self, 1);
                        Type::String
                    }
                    ast::Func::ToString => {
                        if let (Some((_, Some(t))), Some(a)) = (typed.first(), args.first()) {
                            if *t != Type::Int {
                                self.type_error(a.span, Type::Int, *t, "the argument of `to_string`");
                            }
                        }
                        Type::String
                    }
                    ast::Func::Min | ast::Func::Max => match (typed.first().and_then(|t| t.1), typed.get(1).and_then(|t| t.1)) {
                        (Some(a), Some(b)) if !a.compatible(b) => {
                            self.error(
                                Diagnostic::error("type", e.span, format!("`{}` compares {} with {}", f.name(), a.keyword(), b.keyword()))
                                    .with_help("give both arguments one type"),
                            );
                            a
                        }
                        (Some(a), _) | (None, Some(a)) => {
                            if a.is_text() {
                                Type::String
                            } else {
                                Type::Int
                            }
                        }
                        (None, None) => Type::Int,
                    },
                };
                (Expr::Call(*f, typed.into_iter().map(|(e, _)| e).collect()), Some(ty))
            }
        }
    }

    /// Declared relations that nothing derives or reads.
    fn usage(&mut self) {
        let mut derived = vec![false; self.relations.len()];
        let mut read = vec![false; self.relations.len()];
        for (id, rel) in self.relations.iter().enumerate() {
            if let Some(b) = &rel.builtin {
                derived[id] = true;
                for r in b.reads() {
                    read[r] = true;
                }
            }
        }
        for r in &self.rules {
            derived[r.head] = true;
            for b in &r.body {
                if let Lit::Pos { rel, .. } | Lit::Neg { rel, .. } = &b.lit {
                    read[*rel] = true;
                }
            }
        }
        let had_errors = self.diags.iter().any(Diagnostic::is_error);
        for (id, rel) in self.relations.iter().enumerate() {
            let span = rel.span;
            match rel.kind {
                // With other errors, some rules were not kept: usage would be misreported.
                _ if had_errors => {}
                DeclKind::Output if !derived[id] => self.diags.push(
                    Diagnostic::error("underived-output", span, format!("output `{}` is never derived by any rule", rel.name))
                        .with_help(format!("add a rule `{}(…) :- ….` or remove the declaration", rel.name)),
                ),
                DeclKind::Input if !read[id] => self.diags.push(
                    Diagnostic::warning("unused-input", span, format!("input `{}` is not read by any rule", rel.name))
                        .with_help("use it in a rule body, or remove the declaration"),
                ),
                DeclKind::Relation if !derived[id] => self.diags.push(
                    Diagnostic::error("underived-relation", span, format!("relation `{}` is never derived: it is always empty", rel.name))
                        .with_help(format!("add a rule `{}(…) :- ….`, or declare it as an `input` with a key pattern", rel.name)),
                ),
                DeclKind::Relation if !read[id] => self.diags.push(
                    Diagnostic::warning("unused-relation", span, format!("relation `{}` is derived but never read", rel.name))
                        .with_help("use it in a rule body, make it an `output`, or remove it"),
                ),
                _ => {}
            }
        }
    }

    fn output_collisions(&mut self) {
        let outs: Vec<RelId> = (0..self.relations.len()).filter(|&i| self.relations[i].kind == DeclKind::Output).collect();
        // The controller's etcd role writes only these (DESIGN §6).
        const WRITABLE: [&str; 4] = ["effective/", "placement/", "endpoint/", "status/"];
        // A program whose every output is under one `intent/<writer>/` is
        // that writer's (the autoscaler's rules): its role writes there.
        let writer_of = |text: &str| text.strip_prefix("intent/").and_then(|r| r.split_once('/')).map(|(w, _)| w.to_string()).filter(|w| !w.contains('{'));
        let writers: BTreeSet<Option<String>> = outs.iter().filter_map(|&o| self.relations[o].pattern.as_ref()).map(|p| writer_of(&p.text)).collect();
        let writer_program = writers.len() == 1 && writers.iter().next().is_some_and(Option::is_some);
        let own_writer = if writer_program { writers.iter().next().cloned().flatten() } else { None };
        for &o in &outs {
            let r = &self.relations[o];
            let Some(p) = &r.pattern else { continue };
            if let Some((key, whose)) = reserved_key(p, own_writer.as_deref()) {
                let d = Diagnostic::error(
                    "reserved-output",
                    r.span,
                    format!("output `{}` (\"{}\") can write `{key}`: {whose}", r.name, p.text),
                )
                .with_help("rules may not write keys the controller keeps for itself or keys another role writes; choose a pattern under effective/, placement/, endpoint/ or status/ that starts with a literal segment");
                self.diags.push(d);
                continue;
            }
            if !writer_program && !WRITABLE.iter().any(|w| p.text.starts_with(w)) {
                let d = Diagnostic::warning(
                    "unwritable-output",
                    r.span,
                    format!("output `{}` writes `{}`, which the controller's etcd role may not write", r.name, p.text),
                )
                .with_help("outputs go under effective/, placement/, endpoint/ or status/ (DESIGN §6); elsewhere etcd refuses the writes and the keys are blocked (status/blocked/…)");
                self.diags.push(d);
            }
        }
        for (n, &a) in outs.iter().enumerate() {
            for &b in &outs[n + 1..] {
                let (ra, rb) = (&self.relations[a], &self.relations[b]);
                if let (Some(pa), Some(pb)) = (&ra.pattern, &rb.pattern) {
                    if pa.overlaps(pb) {
                        let d = Diagnostic::error(
                            "output-collision",
                            rb.span,
                            format!("outputs `{}` (\"{}\") and `{}` (\"{}\") can write the same key", ra.name, pa.text, rb.name, pb.text),
                        )
                        .with_note(ra.span, "the other output")
                        .with_help("make the patterns differ in a literal segment or in length");
                        self.diags.push(d);
                    }
                }
            }
        }
    }

    /// Strongly connected components of the relation dependency graph, in
    /// evaluation order; rejects negation and aggregation inside a component.
    fn stratify(&mut self) -> Vec<Stratum> {
        let n = self.relations.len();
        let mut deps: Vec<Vec<RelId>> = vec![Vec::new(); n]; // head -> body relations
        for r in &self.rules {
            for b in &r.body {
                if let Lit::Pos { rel, .. } | Lit::Neg { rel, .. } = &b.lit {
                    deps[r.head].push(*rel);
                }
            }
        }
        for (id, rel) in self.relations.iter().enumerate() {
            if let Some(b) = &rel.builtin {
                deps[id].extend(b.reads());
            }
        }
        let comp = sccs(&deps);
        let ncomp = comp.iter().copied().max().map_or(0, |m| m + 1);
        // `sccs` numbers components so that dependencies come first.
        let mut strata: Vec<Stratum> = (0..ncomp).map(|_| Stratum { relations: vec![], rules: vec![], recursive: false }).collect();
        for (rel, &c) in comp.iter().enumerate() {
            strata[c].relations.push(rel);
        }
        for r in &self.rules {
            let c = comp[r.head];
            strata[c].rules.push(r.id);
            for b in &r.body {
                let (rel, neg) = match &b.lit {
                    Lit::Pos { rel, .. } => (*rel, false),
                    Lit::Neg { rel, .. } => (*rel, true),
                    _ => continue,
                };
                if comp[rel] != c {
                    continue;
                }
                strata[c].recursive = true;
                if neg || r.has_aggregate() {
                    let cycle = self.cycle_names(&deps, &comp, r.head, rel);
                    let what = if neg { "negation" } else { "aggregation" };
                    let (head, via) = (&self.relations[r.head].name, &self.relations[rel].name);
                    let mut d = Diagnostic::error("unstratifiable", b.span, format!("{what} through recursion: {cycle}"));
                    // Every step of the cycle, at the rule behind it.
                    for (rule_span, step) in self.cycle_steps(&deps, &comp, r.head, rel) {
                        d = d.with_note(rule_span, step);
                    }
                    let help = if neg {
                        format!(
                            "`{head}` cannot depend on the absence of `{via}` while `{via}` depends on `{head}`: derive `{via}` without reading \
                             `{head}` (from inputs, or relations computed before `{head}`), or read what `{head}` derived back from etcd \
                             through an input (as placement reads `placed`), so the negation sees a settled value"
                        )
                    } else {
                        format!(
                            "`{head}` cannot aggregate over `{via}` while `{via}` depends on `{head}`: aggregate over a relation computed \
                             without `{head}`, or read what `{head}` derived back from etcd through an input"
                        )
                    };
                    self.diags.push(d.with_help(help));
                }
            }
        }
        for (id, rel) in self.relations.iter().enumerate() {
            let Some(b) = &rel.builtin else { continue };
            if let Some(&r) = b.reads().iter().find(|&&r| comp[r] == comp[id]) {
                let cycle = self.cycle_names(&deps, &comp, id, r);
                self.diags.push(
                    Diagnostic::error("unstratifiable", rel.span, format!("a built-in through recursion: {cycle}"))
                        .with_help("the built-in's inputs must not depend on its result; read the result back from etcd through an input instead"),
                );
            }
        }
        strata.retain(|s| {
            !s.rules.is_empty()
                || s.relations.iter().any(|&r| self.relations[r].builtin.is_some())
                || s.relations.iter().any(|&r| self.relations[r].kind == DeclKind::Input)
        });
        strata
    }

    /// A readable cycle `a -> b -> a` from `head` through `via` back to `head`.
    /// The cycle `head` → `via` → … → `head` as (span of the literal, "`a` reads `b`") steps.
    fn cycle_steps(&self, deps: &[Vec<RelId>], comp: &[usize], head: RelId, via: RelId) -> Vec<(Span, String)> {
        let mut order = vec![head];
        order.extend(self.cycle_path(deps, comp, head, via));
        let mut out = Vec::new();
        for pair in order.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let lit = self.rules.iter().filter(|r| r.head == a).find_map(|r| {
                r.body
                    .iter()
                    .find(|l| matches!(&l.lit, Lit::Pos { rel, .. } | Lit::Neg { rel, .. } if *rel == b))
                    .map(|l| (l.span, matches!(l.lit, Lit::Neg { .. })))
            });
            if let Some((span, neg)) = lit {
                let how = if neg { "reads the absence of" } else { "reads" };
                out.push((span, format!("`{}` {how} `{}` here", self.relations[a].name, self.relations[b].name)));
            }
        }
        out
    }

    /// via, …, head: the path back to `head` inside the component.
    fn cycle_path(&self, deps: &[Vec<RelId>], comp: &[usize], head: RelId, via: RelId) -> Vec<RelId> {
        let c = comp[head];
        let mut prev: HashMap<RelId, RelId> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([via]);
        let mut seen = BTreeSet::from([via]);
        while let Some(x) = queue.pop_front() {
            if x == head {
                break;
            }
            for &y in &deps[x] {
                if comp[y] == c && seen.insert(y) {
                    prev.insert(y, x);
                    queue.push_back(y);
                }
            }
        }
        let mut path = vec![head];
        let mut cur = head;
        while cur != via {
            match prev.get(&cur) {
                Some(&p) => {
                    path.push(p);
                    cur = p;
                }
                None => break,
            }
        }
        path.reverse();
        path
    }

    fn cycle_names(&self, deps: &[Vec<RelId>], comp: &[usize], head: RelId, via: RelId) -> String {
        // BFS from `via` to `head` inside the component.
        let c = comp[head];
        let mut prev: HashMap<RelId, RelId> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([via]);
        let mut seen = BTreeSet::from([via]);
        while let Some(x) = queue.pop_front() {
            if x == head {
                break;
            }
            for &y in &deps[x] {
                if comp[y] == c && seen.insert(y) {
                    prev.insert(y, x);
                    queue.push_back(y);
                }
            }
        }
        let mut path = vec![head];
        let mut cur = head;
        while cur != via {
            match prev.get(&cur) {
                Some(&p) => {
                    path.push(p);
                    cur = p;
                }
                None => break,
            }
        }
        // path: head <- ... <- via ; the cycle reads head depends on via depends on ... head
        let mut names: Vec<&str> = vec![&self.relations[head].name];
        names.extend(path.iter().rev().map(|&r| self.relations[r].name.as_str()));
        names.join(" depends on ")
    }
}

/// Tarjan's algorithm, iterative. Components are numbered in the order Tarjan
/// completes them, which puts dependencies first: for every edge `a -> b`
/// (a depends on b), `comp[b] <= comp[a]`.
fn sccs(deps: &[Vec<RelId>]) -> Vec<usize> {
    const NONE: usize = usize::MAX;
    let n = deps.len();
    let mut index = vec![NONE; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut comp = vec![NONE; n];
    let mut next_index = 0;
    let mut next_comp = 0;
    for root in 0..n {
        if index[root] != NONE {
            continue;
        }
        let mut call: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(&mut (v, ref mut i)) = call.last_mut() {
            if *i == 0 && index[v] == NONE {
                index[v] = next_index;
                low[v] = next_index;
                next_index += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if *i < deps[v].len() {
                let w = deps[v][*i];
                *i += 1;
                if index[w] == NONE {
                    call.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            call.pop();
            if let Some(&(parent, _)) = call.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp[w] = next_comp;
                    if w == v {
                        break;
                    }
                }
                next_comp += 1;
            }
        }
    }
    comp
}

fn lit_const(l: &ast::Literal) -> (Const, Type) {
    match l {
        ast::Literal::Int(n) => (Const::Int(*n), Type::Int),
        ast::Literal::Str(s) => (Const::Str(s.clone()), Type::String),
    }
}

/// How a function is called, for help texts.
fn function_shape(f: ast::Func) -> &'static str {
    match f {
        ast::Func::Len => "len(text)",
        ast::Func::Bytes => "bytes(text)",
        ast::Func::Min => "min(a, b)",
        ast::Func::Max => "max(a, b)",
        ast::Func::StartsWith => "starts_with(text, prefix)",
        ast::Func::InNetwork => "in_network(address, networks)",
        ast::Func::Contains => "contains(text, part)",
        ast::Func::ToString => "to_string(int)",
        ast::Func::Before => "before(text, separator)",
        ast::Func::After => "after(text, separator)",
    }
}

fn has_wildcard(e: &ast::Expr) -> bool {
    match &e.kind {
        ExprKind::Wildcard => true,
        ExprKind::Neg(x) => has_wildcard(x),
        ExprKind::Bin(_, a, b) => has_wildcard(a) || has_wildcard(b),
        ExprKind::Call(_, args) => args.iter().any(has_wildcard),
        _ => false,
    }
}

fn collect_unbound(vars: &Vars, bound: &[bool], e: &ast::Expr, out: &mut BTreeSet<String>) {
    match &e.kind {
        ExprKind::Var(n) => {
            if let Some(i) = vars.names.iter().position(|x| x == n) {
                if !bound[i] {
                    out.insert(n.clone());
                }
            }
        }
        ExprKind::Neg(x) => collect_unbound(vars, bound, x, out),
        ExprKind::Bin(_, a, b) => {
            collect_unbound(vars, bound, a, out);
            collect_unbound(vars, bound, b, out);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| collect_unbound(vars, bound, a, out)),
        _ => {}
    }
}

fn collect_vars(e: &ast::Expr, out: &mut BTreeSet<String>) {
    match &e.kind {
        ExprKind::Var(n) => {
            out.insert(n.clone());
        }
        ExprKind::Neg(x) => collect_vars(x, out),
        ExprKind::Bin(_, a, b) => {
            collect_vars(a, out);
            collect_vars(b, out);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| collect_vars(a, out)),
        _ => {}
    }
}

/// Levenshtein distance in characters (for "did you mean" suggestions).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The first key a rule output may never write that `p` could write, and
/// whose it is: the controller's own bookkeeping (leadership, the clock, the
/// derived revision, its blocked and conflict records) and everything a role
/// other than the rules' writer writes (DESIGN §6). `own_writer` is the
/// writer whose `intent/<writer>/` a writer program (the autoscaler's) owns.
fn reserved_key(p: &KeyPattern, own_writer: Option<&str>) -> Option<(String, &'static str)> {
    const EXACT: [(&str, &str); 3] = [
        ("status/leader", "the controller's leadership key"),
        ("status/clock", "the cluster clock, which the controller keeps"),
        ("status/derived_revision", "the controller's record of what it has written"),
    ];
    const PREFIX: [(&str, &str); 7] = [
        ("status/blocked", "the controller's records of refused writes"),
        ("status/program", "the rule files the controller runs, which it publishes"),
        ("status/conflict", "the controller's records of conflicting writes"),
        ("secret", "sealed secrets, written only by `ccattler secret` and the controller's sealing"),
        ("desired", "the user's desired state"),
        ("observed", "node agents' reports about their own node"),
        ("intent", "the intent writers' (user, autoscaler, …)"),
    ];
    for (key, whose) in EXACT {
        if p.may_write(key, true) {
            return Some((key.to_string(), whose));
        }
    }
    if let Some(w) = own_writer {
        let leader = format!("intent/{w}/leader");
        if p.may_write(&leader, true) {
            return Some((leader, "the writer's leadership key"));
        }
        // The writer program's own intent/<w>/… is its to write.
        if p.may_write(&format!("intent/{w}"), false) && matches!(p.segments.get(1), Some(Segment::Lit(x)) if x == w) {
            return None;
        }
    }
    for (prefix, whose) in PREFIX {
        if p.may_write(prefix, false) {
            return Some((format!("{prefix}/…"), whose));
        }
    }
    None
}
