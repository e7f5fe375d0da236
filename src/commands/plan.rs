//! ccattler plan: what the controller would write, now or after changes.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn plan(etcd: &EtcdArgs, rules: &[PathBuf]) -> anyhow::Result<ExitCode> {
    use ccattler_bridge::{etcd as e, Op, Reconciler};
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let cfg = etcd.config()?;
    let (rev, snap) = runtime()?.block_on(async {
        let mut client = e::connect(&cfg).await?;
        e::snapshot(&mut client, &ccattler_bridge::controller::prefixes(&program), 5000).await
    })?;
    let mut r = Reconciler::new(program, 1)?;
    r.rebase(rev as u64, snap)?;
    let ops = r.full_plan();
    println!("# plan against etcd revision {rev}: {} write(s)", ops.len());
    for op in &ops {
        match op {
            Op::Create { key, value } => println!("+ {key} = {}", ccattler_engine::factfile::format_value(value)),
            Op::Update { key, value, .. } => {
                let old = r.held(key).map(|h| h.value.clone()).unwrap_or_default();
                println!("~ {key} = {} (was {})", ccattler_engine::factfile::format_value(value), ccattler_engine::factfile::format_value(&old));
            }
            Op::Delete { key, .. } => println!("- {key}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `plan --with FILE`: the derived keys at the fixed point of the current
/// state, against those at the fixed point with FILE's changes applied.
pub(crate) fn what_if(etcd: &EtcdArgs, rules: &[PathBuf], with: &std::path::Path, facts: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let changes = read_changes(with)?;
    // Hypothetical values the controller would reject are named first.
    let mut rejected = 0;
    for (line, key, value) in &changes {
        if let (Some(v), Some(ccattler_engine::facts::Lint::Rejected(why))) =
            (value, value.as_ref().and_then(|v| ccattler_engine::facts::lint(&program, key, v)))
        {
            eprintln!("warning: {}:{line}: {key} = {v:?} would be rejected: {why}", with.display());
            rejected += 1;
        }
    }
    let (mut session, source) = match facts {
        Some(path) => (session_from_facts(program.clone(), path, ccattler_engine::default_workers())?.0, format!("facts file {}", path.display())),
        None => {
            let cfg = etcd.config()?;
            let (mut s, rev, _) = runtime()?.block_on(ccattler_bridge::explain::snapshot_session(&cfg, program.clone(), None))?;
            s.write(&[])?; // to the fixed point the controller would reach
            (s, format!("etcd revision {rev}"))
        }
    };
    let before = session.derived().clone();
    let writes: Vec<(String, Option<String>)> = changes.iter().map(|(_, k, v)| (k.clone(), v.clone())).collect();
    session.write(&writes)?;
    let after = session.derived();
    let mut diff = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            None => diff.push(format!("+ {k} = {}", ccattler_engine::factfile::format_value(v))),
            Some(old) if old != v => {
                diff.push(format!("~ {k} = {} (was {})", ccattler_engine::factfile::format_value(v), ccattler_engine::factfile::format_value(old)))
            }
            Some(_) => {}
        }
    }
    for k in before.keys().filter(|k| !after.contains_key(*k)) {
        diff.push(format!("- {k}"));
    }
    diff.sort_by(|a, b| a[2..].cmp(&b[2..]));
    println!("# what if {} ({} change(s), {rejected} rejected) against {source}: {} derived key(s) change", with.display(), changes.len(), diff.len());
    for d in &diff {
        println!("{d}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A changes file: `KEY = VALUE` puts (facts-file rules) and `- KEY`
/// deletes, `#` comments; each with its line.
pub(crate) fn read_changes(path: &std::path::Path) -> anyhow::Result<Vec<(usize, String, Option<String>)>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut puts = String::new();
    for (i, raw) in text.lines().enumerate() {
        match raw.trim().strip_prefix("- ") {
            Some(key) if !key.contains(" = ") => {
                out.push((i + 1, key.trim().to_string(), None));
                puts.push('\n');
            }
            _ => {
                puts.push_str(raw);
                puts.push('\n');
            }
        }
    }
    for f in ccattler_engine::factfile::parse(&path.display().to_string(), &puts)? {
        out.push((f.line, f.key, Some(f.value)));
    }
    out.sort_by_key(|c| c.0);
    Ok(out)
}
