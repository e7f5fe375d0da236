//! AST → text. Printing then parsing gives back the same AST (modulo spans);
//! the property tests hold it to that.

use crate::ast::*;
use std::fmt::Write;

pub fn file(f: &File) -> String {
    let mut out = String::new();
    for item in &f.items {
        match item {
            Item::Decl(d) => {
                doc(&mut out, &d.doc);
                decl(&mut out, d)
            }
            Item::Type(t) => {
                doc(&mut out, &t.doc);
                type_decl(&mut out, t)
            }
            Item::Rule(r) => rule(&mut out, r),
        }
        out.push('\n');
    }
    out
}

fn doc(out: &mut String, doc: &Option<String>) {
    for line in doc.iter().flat_map(|d| d.lines()) {
        let _ = writeln!(out, "/// {line}");
    }
}

fn type_decl(out: &mut String, t: &TypeDecl) {
    let _ = write!(out, "type {} = ", t.name.name);
    match &t.def {
        TypeDef::IntRange { lo, hi: Some(hi) } => {
            let _ = write!(out, "int in {lo}..={hi}");
        }
        TypeDef::IntRange { lo, hi: None } => {
            let _ = write!(out, "int in {lo}..");
        }
        TypeDef::Enum(values) => out.push_str(&values.iter().map(|(v, _)| string(v)).collect::<Vec<_>>().join(" | ")),
    }
}

fn decl(out: &mut String, d: &Decl) {
    let kw = match d.kind {
        DeclKind::Input => "input",
        DeclKind::Output => "output",
        DeclKind::Relation => "relation",
    };
    let cols: Vec<String> = d.columns.iter().map(|c| format!("{}: {}", c.name.name, c.ty_name.as_deref().unwrap_or(c.ty.keyword()))).collect();
    let _ = write!(out, "{kw} {}({})", d.name.name, cols.join(", "));
    if let Some((p, _)) = &d.pattern {
        let word = if d.kind == DeclKind::Input { "from" } else { "to" };
        let _ = write!(out, " {word} {}", string(p));
    }
    if let Some(b) = &d.builtin {
        let args: Vec<&str> = b.args.iter().map(|a| a.name.as_str()).collect();
        let _ = write!(out, " = {}({})", b.name.name, args.join(", "));
    }
}

fn rule(out: &mut String, r: &Rule) {
    let terms: Vec<String> = r
        .head_terms
        .iter()
        .map(|t| match t {
            HeadTerm::Expr(e) => expr(e),
            HeadTerm::Agg(k, args, default, _) => {
                let d = default.as_ref().map(|d| format!(" default {}", expr(d))).unwrap_or_default();
                format!("{}({}){d}", k.keyword(), args.iter().map(expr).collect::<Vec<_>>().join(", "))
            }
        })
        .collect();
    let _ = write!(out, "{}({})", r.head.name, terms.join(", "));
    if !r.body.is_empty() {
        let items: Vec<String> = r.body.iter().map(body_item).collect();
        let _ = write!(out, " :- {}", items.join(", "));
        if let Some(p) = &r.per {
            let _ = write!(out, " per {}", atom(p));
        }
    }
    out.push('.');
}

fn atom(a: &Atom) -> String {
    format!("{}({})", a.relation.name, a.args.iter().map(expr).collect::<Vec<_>>().join(", "))
}

fn body_item(b: &BodyItem) -> String {
    match b {
        BodyItem::Pos(a) => atom(a),
        BodyItem::Neg(a) => format!("not {}", atom(a)),
        BodyItem::Cmp(op, l, r, _) => format!("{} {} {}", expr(l), op.symbol(), expr(r)),
        BodyItem::Range(v, lo, hi, _) => format!("{} in {}..{}", v.name, expr(lo), expr(hi)),
    }
}

/// Quotes a string with the language's escapes.
pub fn string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn expr(e: &Expr) -> String {
    prec_expr(e, 0)
}

fn prec_expr(e: &Expr, min: u8) -> String {
    match &e.kind {
        ExprKind::Lit(Literal::Int(n)) => {
            if *n < 0 && min > 0 {
                format!("({n})")
            } else {
                n.to_string()
            }
        }
        ExprKind::Lit(Literal::Str(s)) => string(s),
        ExprKind::Var(v) => v.clone(),
        ExprKind::Wildcard => "_".into(),
        // `-5` reads back as a literal, so negating a literal keeps its parentheses.
        ExprKind::Neg(x) if matches!(x.kind, ExprKind::Lit(Literal::Int(_))) => format!("-({})", expr(x)),
        ExprKind::Neg(x) => format!("-{}", prec_expr(x, 4)),
        ExprKind::Call(f, args) => format!("{}({})", f.name(), args.iter().map(expr).collect::<Vec<_>>().join(", ")),
        ExprKind::Bin(op, a, b) => {
            let p = op.precedence();
            // Left-associative: the right operand needs parentheses at equal precedence.
            let s = format!("{} {} {}", prec_expr(a, p), op.symbol(), prec_expr(b, p + 1));
            if p < min {
                format!("({s})")
            } else {
                s
            }
        }
    }
}
