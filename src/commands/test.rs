//! ccattler test: rule tests.

#[allow(unused_imports)]
use crate::prelude::*;

/// `*.test` files under the given paths (default `<rules>/tests`), sorted.
pub(crate) fn test_files(paths: Vec<PathBuf>, rules: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let paths = if paths.is_empty() { rules.iter().map(|r| r.join("tests")).filter(|t| t.is_dir()).collect() } else { paths };
    Ok(ccattler_parser::files_with_extension(&paths, "test")?)
}

pub(crate) fn test(paths: Vec<PathBuf>, rules: &[PathBuf], filter: Option<&str>, format: Format) -> anyhow::Result<ExitCode> {
    use ccattler_engine::ruletest;
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let mut results = Vec::new();
    for file in test_files(paths, rules)? {
        let text = std::fs::read_to_string(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let name = file.display().to_string();
        for case in ruletest::parse(&name, &text)? {
            if filter.is_some_and(|f| !case.name.contains(f)) {
                continue;
            }
            results.push(ruletest::run(&program, &case));
        }
    }
    let failed = results.iter().filter(|r| !r.passed()).count();
    match format {
        Format::Text => {
            for r in &results {
                if r.passed() {
                    println!("ok   {}:{}: {}", r.file, r.line, r.name);
                } else {
                    print!("{}", ruletest::render(r));
                }
            }
            println!("{} passed, {} failed", results.len() - failed, failed);
        }
        Format::Json => println!("{}", serde_json::json!({ "passed": results.len() - failed, "failed": failed, "cases": results })),
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
