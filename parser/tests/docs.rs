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
