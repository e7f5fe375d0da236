//! ccattler eval: evaluate a facts file offline.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn eval(facts: &std::path::Path, rules: &[PathBuf], format: Format, workers: usize) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let (session, lines) = session_from_facts(program, facts, workers)?;
    let line_of = |key: &str| lines.iter().find(|f| f.key == key).map_or(0, |f| f.line);
    for (key, reason) in session.rejected() {
        eprintln!("{}:{}: rejected {key}: {reason}", facts.display(), line_of(key));
    }
    for c in session.conflicts() {
        let vals: Vec<String> = c.values.iter().map(|(v, rules)| format!("{v:?} (from {})", rules.join(", "))).collect();
        eprintln!("conflict: {} has {} values: {}", c.key, vals.len(), vals.join(", "));
    }
    match format {
        Format::Text => {
            for (k, v) in session.derived() {
                println!("{k} = {}", ccattler_engine::factfile::format_value(v));
            }
        }
        Format::Json => {
            let derived: serde_json::Map<String, serde_json::Value> =
                session.derived().iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
            let rejected: Vec<_> = session.rejected().iter().map(|(k, r)| serde_json::json!({"key": k, "line": line_of(k), "reason": r})).collect();
            let conflicts: Vec<_> = session.conflicts().map(|c| serde_json::json!({"key": c.key, "values": c.values.iter().map(|(v, r)| serde_json::json!({"value": v, "rules": r})).collect::<Vec<_>>()})).collect();
            println!("{}", serde_json::json!({"derived": derived, "rejected": rejected, "conflicts": conflicts}));
        }
    }
    let clean = session.rejected().is_empty() && session.conflicts().next().is_none();
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
