//! ccattler check: parse and check rule files (and a facts file against them).

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn check(paths: Vec<PathBuf>, facts: Option<&std::path::Path>, format: Format) -> anyhow::Result<ExitCode> {
    let checked = ccattler_parser::load(&default_rules(paths))?;
    let mut ok = checked.errors() == 0;
    if let (Some(file), Some(program)) = (facts, &checked.program) {
        let lines = read_facts(file)?;
        let (mut errors, warnings) = lint_facts(program, file, &lines);
        if errors.is_empty() && checked.errors() == 0 {
            errors = policy_denials(&std::sync::Arc::new(program.clone()), file, &lines)?;
        }
        for l in warnings.iter().chain(&errors) {
            eprintln!("{l}");
        }
        ok &= errors.is_empty();
    }
    match format {
        Format::Text => {
            eprint!("{}", checked.render());
            if let Some(p) = &checked.program {
                println!("{}", ccattler_parser::summary(p));
            } else {
                eprintln!("{} error(s)", checked.errors());
            }
        }
        Format::Json => {
            let diags: Vec<_> = checked.diagnostics.iter().map(|d| ccattler_parser::diag::to_json(&checked.sources, d)).collect();
            let summary = checked.program.as_ref().map(ccattler_parser::summary);
            println!("{}", serde_json::json!({ "ok": ok, "summary": summary, "diagnostics": diags }));
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
