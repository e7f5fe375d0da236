//! Property tests of the parser: it never panics, and printing then parsing
//! gives back the same syntax tree.

use ccattler_parser::ast::*;
use ccattler_parser::source::Span;
use ccattler_parser::{pretty, syntax};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = ccattler_parser::check_str("fuzz.rules", &text);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = ccattler_parser::check_str("fuzz.rules", &text);
    }

    #[test]
    fn token_soup_never_panics(tokens in proptest::collection::vec(token(), 0..60)) {
        let text = tokens.join(" ");
        let _ = ccattler_parser::check_str("soup.rules", &text);
        let text = tokens.concat();
        let _ = ccattler_parser::check_str("soup.rules", &text);
    }

    #[test]
    fn print_then_parse_is_identity(file in file()) {
        let text = pretty::file(&file);
        let (parsed, diags) = syntax::parse_file(0, &text);
        prop_assert!(diags.is_empty(), "{text}\n{diags:?}");
        prop_assert_eq!(strip_file(parsed), strip_file(file), "{}", text);
    }
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("input".to_string()),
        Just("output".into()),
        Just("relation".into()),
        Just("from".into()),
        Just("to".into()),
        Just("not".into()),
        Just("in".into()),
        Just(":-".into()),
        Just(".".into()),
        Just("..".into()),
        Just(",".into()),
        Just("(".into()),
        Just(")".into()),
        Just(":".into()),
        Just("=".into()),
        Just("!=".into()),
        Just("<=".into()),
        Just("++".into()),
        Just("-".into()),
        Just("count()".into()),
        Just("max(".into()),
        Just("\"a/{x}\"".into()),
        Just("\"".into()),
        Just("//".into()),
        Just("\n".into()),
        Just("_".into()),
        Just("int".into()),
        Just("string".into()),
        Just("type".into()),
        Just("bool".into()),
        Just("true".into()),
        Just("|".into()),
        Just("..=".into()),
        Just("len(".into()),
        Just("min(".into()),
        Just("starts_with(".into()),
        Just("///".into()),
        Just("\"a\" | \"b\"".into()),
        "[a-z][a-z0-9_]{0,5}",
        "[0-9]{1,20}",
    ]
}

fn ident() -> impl Strategy<Value = Ident> {
    "[a-z][a-z0-9_]{0,6}"
        .prop_filter("not a keyword", |s| !KEYWORDS.contains(&s.as_str()) && AggKind::ALL.iter().all(|k| k.keyword() != s))
        .prop_map(|name| Ident { name, span: Span::default() })
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| ExprKind::Lit(Literal::Int(n))),
        "[ -~\\n\\t]{0,8}".prop_map(|s| ExprKind::Lit(Literal::Str(s))),
        ident().prop_map(|i| ExprKind::Var(i.name)),
    ]
    .prop_map(|kind| Expr { kind, span: Span::default() });
    leaf.prop_recursive(4, 24, 2, |inner| {
        let op = prop_oneof![Just(BinOp::Add), Just(BinOp::Sub), Just(BinOp::Mul), Just(BinOp::Div), Just(BinOp::Rem), Just(BinOp::Concat)];
        let func = proptest::sample::select(Func::ALL.to_vec());
        prop_oneof![
            inner.clone().prop_map(|e| ExprKind::Neg(Box::new(e))),
            (op, inner.clone(), inner.clone()).prop_map(|(op, a, b)| ExprKind::Bin(op, Box::new(a), Box::new(b))),
            (func, inner.clone(), inner).prop_map(|(f, a, b)| ExprKind::Call(f, if f.arity() == 1 { vec![a] } else { vec![a, b] })),
        ]
        .prop_map(|kind| Expr { kind, span: Span::default() })
    })
}

fn atom_arg() -> impl Strategy<Value = Expr> {
    prop_oneof![
        ident().prop_map(|i| ExprKind::Var(i.name)),
        Just(ExprKind::Wildcard),
        any::<i64>().prop_map(|n| ExprKind::Lit(Literal::Int(n))),
        "[a-z ]{0,5}".prop_map(|s| ExprKind::Lit(Literal::Str(s))),
    ]
    .prop_map(|kind| Expr { kind, span: Span::default() })
}

fn atom() -> impl Strategy<Value = Atom> {
    (ident(), proptest::collection::vec(atom_arg(), 0..4)).prop_map(|(relation, args)| Atom { relation, args, span: Span::default() })
}

fn body_item() -> impl Strategy<Value = BodyItem> {
    let cmp = prop_oneof![Just(CmpOp::Eq), Just(CmpOp::Ne), Just(CmpOp::Lt), Just(CmpOp::Le), Just(CmpOp::Gt), Just(CmpOp::Ge)];
    prop_oneof![
        atom().prop_map(BodyItem::Pos),
        atom().prop_map(BodyItem::Neg),
        (cmp, expr(), expr()).prop_map(|(op, a, b)| BodyItem::Cmp(op, a, b, Span::default())),
        (ident(), expr(), expr()).prop_map(|(v, lo, hi)| BodyItem::Range(v, lo, hi, Span::default())),
    ]
}

fn head_term() -> impl Strategy<Value = HeadTerm> {
    prop_oneof![
        expr().prop_map(HeadTerm::Expr),
        proptest::option::of(expr()).prop_map(|d| HeadTerm::Agg(AggKind::Count, vec![], d.map(Box::new), Span::default())),
        (prop_oneof![Just(AggKind::Sum), Just(AggKind::Min), Just(AggKind::Max)], expr()).prop_map(|(k, e)| HeadTerm::Agg(k, vec![e], None, Span::default())),
        (prop_oneof![Just(AggKind::ArgMax), Just(AggKind::ArgMin)], expr(), expr()).prop_map(|(k, a, b)| HeadTerm::Agg(k, vec![a, b], None, Span::default())),
    ]
}

fn item() -> impl Strategy<Value = Item> {
    let ty = prop_oneof![
        Just((Type::String, None)),
        Just((Type::Name, None)),
        Just((Type::Int, None)),
        Just((Type::String, Some("bool".to_string()))),
        ident().prop_map(|i| (Type::String, Some(i.name))),
    ];
    let column = (ident(), ty).prop_map(|(name, (ty, ty_name))| Column { name, ty, ty_span: Span::default(), ty_name });
    let kind = prop_oneof![Just(DeclKind::Input), Just(DeclKind::Output), Just(DeclKind::Relation)];
    let doc = proptest::option::of(proptest::collection::vec("[a-z]{1,4}( [a-z]{1,4}){0,2}", 1..3).prop_map(|lines| lines.join("\n")));
    let decl = (kind, ident(), proptest::collection::vec(column, 0..4), "[a-z{}/]{1,12}", doc.clone()).prop_map(|(kind, name, columns, p, doc)| {
        let pattern = (kind != DeclKind::Relation).then(|| (p, Span::default()));
        Item::Decl(Decl { kind, name, columns, pattern, builtin: None, doc, span: Span::default() })
    });
    let def = prop_oneof![
        (any::<i64>(), proptest::option::of(any::<i64>())).prop_map(|(lo, hi)| TypeDef::IntRange { lo, hi }),
        proptest::collection::vec("[a-z ]{0,5}".prop_map(|v| (v, Span::default())), 1..4).prop_map(TypeDef::Enum),
    ];
    let type_decl = (ident(), def, doc).prop_map(|(name, def, doc)| Item::Type(TypeDecl { name, def, doc, span: Span::default() }));
    let rule = (ident(), proptest::collection::vec(head_term(), 0..4), proptest::collection::vec(body_item(), 0..4), proptest::option::of(atom())).prop_map(
        |(head, head_terms, body, per)| {
            let per = per.filter(|_| !body.is_empty());
            Item::Rule(Rule { head, head_terms, head_span: Span::default(), body, per, span: Span::default() })
        },
    );
    prop_oneof![decl, type_decl, rule]
}

/// A key pattern over `n` columns (all placeholders in some order, with
/// literal segments between) and texts for its columns.
fn pattern_and_tuple() -> impl Strategy<Value = (String, Vec<String>)> {
    (1usize..5).prop_flat_map(|n| {
        let lits = proptest::collection::vec("[a-z]{1,3}", n + 1);
        let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
        let texts = proptest::collection::vec(prop_oneof!["[a-z0-9/.]{0,5}", any::<String>()], n);
        (lits, order, texts).prop_map(move |(lits, order, texts)| {
            let mut p = lits[0].clone();
            for (i, c) in order.iter().enumerate() {
                p.push_str(&format!("/{{c{c}}}/{}", lits[i + 1]));
            }
            (p, texts)
        })
    })
}

proptest! {
    /// render ∘ match = id: a tuple a pattern renders comes back from the key
    /// unchanged, so two different tuples never share a key; a text that
    /// could break that (`/`, empty, control characters) is refused.
    #[test]
    fn rendering_keys_is_injective((pattern, texts) in pattern_and_tuple()) {
        let names: Vec<String> = (0..texts.len()).map(|i| format!("c{i}")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let p = ccattler_parser::pattern::KeyPattern::parse(&pattern, &name_refs).unwrap();
        match p.render_checked(&texts, &name_refs) {
            Ok(key) => {
                let back: Vec<String> = p.match_key(&key).unwrap().into_iter().map(|t| t.unwrap().to_string()).collect();
                prop_assert_eq!(back, texts);
            }
            Err(_) => prop_assert!(texts.iter().any(|t| ccattler_parser::pattern::segment_problem(t).is_some())),
        }
    }
}

fn file() -> impl Strategy<Value = File> {
    proptest::collection::vec(item(), 0..6).prop_map(|items| File { items })
}

// Spans differ between a generated tree and a parsed one; compare without them.

fn strip_file(f: File) -> File {
    File { items: f.items.into_iter().map(strip_item).collect() }
}
fn strip_ident(i: Ident) -> Ident {
    Ident { name: i.name, span: Span::default() }
}
fn strip_expr(e: Expr) -> Expr {
    let kind = match e.kind {
        ExprKind::Neg(x) => ExprKind::Neg(Box::new(strip_expr(*x))),
        ExprKind::Bin(op, a, b) => ExprKind::Bin(op, Box::new(strip_expr(*a)), Box::new(strip_expr(*b))),
        ExprKind::Call(f, args) => ExprKind::Call(f, args.into_iter().map(strip_expr).collect()),
        k => k,
    };
    Expr { kind, span: Span::default() }
}
fn strip_atom(a: Atom) -> Atom {
    Atom { relation: strip_ident(a.relation), args: a.args.into_iter().map(strip_expr).collect(), span: Span::default() }
}
fn strip_item(i: Item) -> Item {
    let d = Span::default();
    match i {
        Item::Decl(x) => Item::Decl(Decl {
            kind: x.kind,
            name: strip_ident(x.name),
            columns: x.columns.into_iter().map(|c| Column { name: strip_ident(c.name), ty: c.ty, ty_span: d, ty_name: c.ty_name }).collect(),
            pattern: x.pattern.map(|(p, _)| (p, d)),
            builtin: x.builtin,
            doc: x.doc.filter(|d| !d.is_empty()),
            span: d,
        }),
        Item::Type(t) => Item::Type(TypeDecl {
            name: strip_ident(t.name),
            def: match t.def {
                TypeDef::Enum(vs) => TypeDef::Enum(vs.into_iter().map(|(v, _)| (v, d)).collect()),
                other => other,
            },
            doc: t.doc.filter(|d| !d.is_empty()),
            span: d,
        }),
        Item::Rule(r) => Item::Rule(Rule {
            head: strip_ident(r.head),
            head_terms: r
                .head_terms
                .into_iter()
                .map(|t| match t {
                    HeadTerm::Expr(e) => HeadTerm::Expr(strip_expr(e)),
                    HeadTerm::Agg(k, es, def, _) => HeadTerm::Agg(k, es.into_iter().map(strip_expr).collect(), def.map(|e| Box::new(strip_expr(*e))), d),
                })
                .collect(),
            head_span: d,
            body: r
                .body
                .into_iter()
                .map(|b| match b {
                    BodyItem::Pos(a) => BodyItem::Pos(strip_atom(a)),
                    BodyItem::Neg(a) => BodyItem::Neg(strip_atom(a)),
                    BodyItem::Cmp(op, l, r, _) => BodyItem::Cmp(op, strip_expr(l), strip_expr(r), d),
                    BodyItem::Range(v, lo, hi, _) => BodyItem::Range(strip_ident(v), strip_expr(lo), strip_expr(hi), d),
                })
                .collect(),
            per: r.per.map(strip_atom),
            span: d,
        }),
    }
}
