//! Golden tests: every `tests/diagnostics/*.rules` file is checked and its
//! rendered diagnostics compared with the `.expected` file beside it. A new
//! case is a new file. `UPDATE_GOLDEN=1` rewrites the expectations.

use std::path::Path;

#[test]
fn diagnostics_match_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut cases: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "rules")).collect();
    cases.sort();
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for case in cases {
        let name = format!("diagnostics/{}", case.file_name().unwrap().to_string_lossy());
        let checked = ccattler_parser::check_str(&name, &std::fs::read_to_string(&case).unwrap());
        let actual = checked.render();
        assert!(!checked.diagnostics.is_empty(), "{name}: a golden case must produce diagnostics");
        let expected_path = case.with_extension("expected");
        if update {
            std::fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            failures.push(format!("--- {name}: expected\n{expected}\n--- actual\n{actual}"));
        }
    }
    assert!(failures.is_empty(), "{}\n(rerun with UPDATE_GOLDEN=1 to accept)", failures.join("\n"));
}
