//! Every example in docs/language.md is checked: ```rules blocks must check
//! clean, ```rules-error blocks must be rejected.

#[test]
fn docs_examples_check() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/language.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let mut blocks = 0;
    let mut lines = doc.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let expect_error = match line.trim() {
            "```rules" => false,
            "```rules-error" => true,
            _ => continue,
        };
        let body: Vec<&str> = lines.by_ref().map(|(_, l)| l).take_while(|l| l.trim() != "```").collect();
        let name = format!("docs/language.md:{}", n + 1);
        let checked = ccattler_parser::check_str(&name, &body.join("\n"));
        if expect_error {
            assert!(checked.errors() > 0, "{name}: expected the checker to reject this example");
        } else {
            assert!(checked.diagnostics.is_empty(), "{name}:\n{}", checked.render());
        }
        blocks += 1;
    }
    assert!(blocks >= 10, "found only {blocks} examples");
}

/// The grammar at the end of docs/language.md names the parser's keywords,
/// aggregates, functions and the `assign` built-in's arity as they are.
#[test]
fn docs_grammar_matches_the_parser() {
    use ccattler_parser::ast::{AggKind, Func, KEYWORDS};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/language.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let grammar = &doc[doc.find("## Grammar").expect("a Grammar section")..];
    let line = |name: &str| -> String {
        let start = grammar.find(&format!("\n{name} ")).unwrap_or_else(|| panic!("grammar has no `{name}` line"));
        let rest = &grammar[start + 1..];
        // A production runs to its `;` (it may span lines).
        rest[..rest.find(" ;").unwrap()].to_string()
    };
    let quoted = |text: &str| -> Vec<String> { text.split('"').skip(1).step_by(2).map(str::to_string).collect() };
    let mut keywords = quoted(&line("KEYWORDS"));
    keywords.sort();
    let mut want: Vec<String> = KEYWORDS.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(keywords, want, "KEYWORDS in docs/language.md");
    let mut functions = quoted(&line("FUNCTION"));
    functions.sort();
    let mut want: Vec<String> = Func::ALL.iter().map(|f| f.name().to_string()).collect();
    want.sort();
    assert_eq!(functions, want, "FUNCTION in docs/language.md");
    let aggregate = line("aggregate");
    for k in AggKind::ALL {
        assert!(quoted(&aggregate).contains(&k.keyword().to_string()), "aggregate `{}` missing from the grammar", k.keyword());
    }
    for sig in ccattler_parser::program::BUILTINS {
        assert_eq!(line(sig.name).matches("IDENT").count(), sig.args.len(), "{}'s arity in the grammar", sig.name);
        assert!(line("builtin").contains(sig.name), "`builtin` lists {}", sig.name);
    }
    let arity = ccattler_parser::program::ASSIGN.len();
    // And the parser accepts exactly that arity.
    let call = |n: usize| {
        let args: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
        let decls: String = (0..n).map(|i| format!("relation r{i}(x: int)\nr{i}(1).\n")).collect();
        format!("{decls}relation a(instance: name, node: name) = assign({})\n", args.join(", "))
    };
    let arity_errors = |n: usize| {
        let checked = ccattler_parser::check_str("t.rules", &call(n));
        checked.diagnostics.iter().filter(|d| d.code == "builtin-arity").count()
    };
    assert!(arity_errors(arity - 1) > 0, "assign with {} arguments must be refused", arity - 1);
    assert_eq!(arity_errors(arity), 0, "assign with {arity} arguments must be accepted");
}

/// The editor grammar (editors/vscode) highlights every keyword, function and
/// aggregate the parser knows, and is valid JSON.
#[test]
fn editor_grammar_knows_the_language() {
    use ccattler_parser::ast::{AggKind, Func, KEYWORDS};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../editors/vscode/syntaxes/ccattler-rules.tmLanguage.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let grammar: serde_json::Value = serde_json::from_str(&text).expect("the grammar is JSON");
    assert_eq!(grammar["scopeName"], "source.ccattler-rules");
    // Every word appears as an alternative of some pattern: `(a|b|c)`.
    let mut words = std::collections::BTreeSet::new();
    for pattern in text.split('"').filter(|s| s.contains('|')) {
        for w in pattern.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            words.insert(w.to_string());
        }
    }
    let wanted = KEYWORDS
        .iter()
        .map(|k| k.to_string())
        .chain(Func::ALL.iter().map(|f| f.name().to_string()))
        .chain(AggKind::ALL.iter().map(|k| k.keyword().to_string()));
    for w in wanted {
        assert!(words.contains(&w), "editors/vscode grammar does not highlight `{w}`");
    }
}
