//! ccattler describe: what a relation or key is, from the rules.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn describe(what: Option<&str>, rules: &[PathBuf], format: Format) -> anyhow::Result<ExitCode> {
    use ccattler_parser::describe;
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let found = match what {
        None => describe::all(&program),
        Some(w) => match program.relation(w) {
            Some(rel) => vec![describe::relation(&program, rel)],
            None => describe::key(&program, w),
        },
    };
    if found.is_empty() {
        let w = what.unwrap_or_default();
        let names: Vec<&str> = program.relations.iter().map(|r| r.name.as_str()).filter(|n| !n.contains('#')).collect();
        let near = names.iter().map(|n| (ccattler_parser::check::edit_distance(n, w), *n)).min().filter(|(d, n)| *d <= 2.max(n.len() / 4));
        let hint = near.map(|(_, n)| format!("; did you mean {n}?")).unwrap_or_default();
        eprintln!("error: {w:?} is neither a relation nor a key any relation reads or writes{hint}");
        return Ok(ExitCode::from(1));
    }
    match format {
        Format::Text => {
            let texts: Vec<String> = found.iter().map(describe::render).collect();
            print!("{}", texts.join("\n"));
        }
        Format::Json => println!("{}", serde_json::to_string(&found)?),
    }
    Ok(ExitCode::SUCCESS)
}
