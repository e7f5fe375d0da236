//! Deeply nested expressions: a hostile or generated rule file must get a
//! located diagnostic, never a stack overflow of `check`, the language
//! server or the controller's reload (which all parse with this parser).

use ccattler_parser::syntax::MAX_NESTING;
use ccattler_parser::{check_str, pretty};

const DECL: &str = "input n(x: int) from \"desired/n/{x}\"\noutput o(x: int) to \"effective/o/{x}\"\n";

fn rule(expr: &str) -> String {
    format!("{DECL}o(y) :- n(x), y = {expr}.\no(x) :- n(x).\n")
}

/// Runs `f` on a thread with a stack as small as a tokio worker's, so a
/// test passes only if the bound really keeps recursion shallow.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new().stack_size(2 << 20).spawn(f).unwrap().join().unwrap()
}

fn assert_too_deep(text: String) {
    let checked = on_small_stack(move || check_str("deep.rules", &text));
    let rendered = checked.render();
    assert!(checked.program.is_none(), "a too-deep file must not produce a program");
    assert!(rendered.contains(&format!("nested at most {MAX_NESTING} levels")), "{rendered}");
    assert!(rendered.contains("deep.rules:3:"), "the diagnostic names the file and line: {rendered}");
}

#[test]
fn twenty_thousand_nested_parentheses_are_a_diagnostic_not_a_stack_overflow() {
    let n = 20_000;
    assert_too_deep(rule(&format!("{}x{}", "(".repeat(n), ")".repeat(n))));
}

#[test]
fn unclosed_parentheses_are_a_diagnostic_not_a_stack_overflow() {
    assert_too_deep(rule(&"(".repeat(100_000)));
}

#[test]
fn a_long_chain_of_additions_is_a_diagnostic_not_a_deep_tree() {
    // Left-nested: the parser loops, but the tree it would build is 50,000
    // deep, and every later pass (and drop) would recurse over it.
    assert_too_deep(rule(&vec!["x"; 50_000].join(" + ")));
}

#[test]
fn many_negations_are_a_diagnostic() {
    assert_too_deep(rule(&format!("{}x", "- ".repeat(50_000))));
}

#[test]
fn deeply_nested_calls_are_a_diagnostic() {
    let n = 10_000;
    assert_too_deep(rule(&format!("{}x{}", "max(1, ".repeat(n), ")".repeat(n))));
}

#[test]
fn deep_nesting_in_a_body_comparison_is_a_diagnostic() {
    let n = 20_000;
    let text = format!("{DECL}o(x) :- n(x), {}x{} > 1.\n", "(".repeat(n), ")".repeat(n));
    assert_too_deep(text);
}

#[test]
fn deep_nesting_in_an_atom_argument_is_a_diagnostic() {
    let n = 20_000;
    let text = format!("{DECL}o(x) :- n({}x{}).\n", "(".repeat(n), ")".repeat(n));
    assert_too_deep(text);
}

#[test]
fn statements_after_a_too_deep_one_are_still_checked() {
    let n = 20_000;
    let text = format!("{DECL}o(y) :- n(x), y = {}x{}.\no(x) :- m(x).\n", "(".repeat(n), ")".repeat(n));
    let rendered = on_small_stack(move || check_str("deep.rules", &text).render());
    assert!(rendered.contains("nested at most"), "{rendered}");
    assert!(rendered.contains("`m`"), "the unknown relation on the next line is still reported: {rendered}");
}

#[test]
fn nesting_just_under_the_bound_is_accepted_and_round_trips() {
    // Parentheses around an addition: each level is two (the parentheses
    // and the `+`), so this is as deep as the bound allows.
    let levels = MAX_NESTING / 2 - 1;
    let expr = format!("{}x{}", "(1 + ".repeat(levels), ")".repeat(levels));
    let text = rule(&expr);
    let (checked, printed) = on_small_stack(move || {
        let checked = check_str("deep.rules", &text);
        let printed = checked.program.as_ref().map(|_| {
            let (file, _) = ccattler_parser::syntax::parse_file(0, &text);
            pretty::file(&file)
        });
        (checked.render(), printed)
    });
    let printed = printed.unwrap_or_else(|| panic!("accepted: {checked}"));
    let again = on_small_stack(move || check_str("again.rules", &printed));
    assert!(again.program.is_some(), "the printed form parses again: {}", again.render());
}
