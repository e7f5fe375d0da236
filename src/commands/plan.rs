//! ccattler plan: what the controller would write, now or after changes.

#[allow(unused_imports)]
use crate::prelude::*;
use ccattler_engine::facts::Derived;

pub(crate) fn plan(etcd: &EtcdArgs, rules: &[PathBuf]) -> anyhow::Result<ExitCode> {
    use ccattler_bridge::{etcd as e, Op, Reconciler};
    let Some(program) = load_program_for(rules, etcd)? else { return Ok(ExitCode::from(1)) };
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
                let old = r.held_value(key).map(str::to_string).unwrap_or_default();
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
    let Some(program) = load_program_for(rules, etcd)? else { return Ok(ExitCode::from(1)) };
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
    for line in service_summary(&before, after) {
        println!("{line}");
    }
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

/// What a change does to each service, as `nomad job plan` says it: its
/// instance count, instances to create, move and stop (with their nodes),
/// those that would wait (and why), and a rollout it starts.
pub(crate) fn service_summary(before: &std::collections::BTreeMap<String, Derived>, after: &std::collections::BTreeMap<String, Derived>) -> Vec<String> {
    use std::collections::BTreeMap;
    let service_of = |i: &str| {
        let k = format!("effective/instance/{i}/service");
        after.get(&k).or_else(|| before.get(&k)).map_or_else(|| "?".into(), |v| v.to_string())
    };
    let placements = |m: &BTreeMap<String, Derived>| -> BTreeMap<String, String> {
        m.range("placement/instance/".to_string()..)
            .take_while(|(k, _)| k.starts_with("placement/instance/"))
            .map(|(k, v)| (k["placement/instance/".len()..].to_string(), v.to_string()))
            .collect()
    };
    let (was, will) = (placements(before), placements(after));
    #[derive(Default)]
    struct Plan {
        count: Option<(String, String)>,
        create: Vec<String>,
        moves: Vec<String>,
        stop: Vec<String>,
        wait: Vec<String>,
        rollout: Option<String>,
    }
    let mut plans: BTreeMap<String, Plan> = BTreeMap::new();
    for (i, n) in &will {
        match was.get(i) {
            None => plans.entry(service_of(i)).or_default().create.push(format!("{i} on {n}")),
            Some(old) if old != n => plans.entry(service_of(i)).or_default().moves.push(format!("{i} {old} → {n}")),
            Some(_) => {}
        }
    }
    for (i, n) in &was {
        if !will.contains_key(i) {
            plans.entry(service_of(i)).or_default().stop.push(format!("{i} on {n}"));
        }
    }
    for (k, why) in after.range("status/unplaced/".to_string()..).take_while(|(k, _)| k.starts_with("status/unplaced/")) {
        let i = &k["status/unplaced/".len()..];
        if before.get(k) != Some(why) {
            plans.entry(service_of(i)).or_default().wait.push(format!("{i}: {why}"));
        }
    }
    let services: std::collections::BTreeSet<String> = [before, after]
        .iter()
        .flat_map(|m| m.keys())
        .filter_map(|k| k.strip_prefix("effective/service/")?.strip_suffix("/instances").filter(|s| !s.contains('/')).map(String::from))
        .collect();
    for s in services {
        let k = format!("effective/service/{s}/instances");
        let (b, a) = (before.get(&k), after.get(&k));
        if b != a {
            let show = |v: Option<&Derived>| v.map_or_else(|| "0".into(), |v| v.to_string());
            plans.entry(s.clone()).or_default().count = Some((show(b), show(a)));
        }
        let g = format!("status/rollout/{s}/generation");
        if before.get(&g) != after.get(&g) {
            if let Some(gen) = after.get(&g) {
                plans.entry(s.clone()).or_default().rollout = Some(format!("a rollout starts (generation {gen}; `ccattler rollout status {s}`)"));
            }
        }
    }
    let list = |v: &[String]| if v.len() > 5 { format!("{}, … ({} more)", v[..5].join(", "), v.len() - 5) } else { v.join(", ") };
    plans
        .into_iter()
        .map(|(s, p)| {
            let mut parts = Vec::new();
            if let Some((b, a)) = p.count {
                parts.push(format!("instances {b} → {a}"));
            }
            for (what, v) in [("create", &p.create), ("move", &p.moves), ("stop", &p.stop), ("wait", &p.wait)] {
                if !v.is_empty() {
                    parts.push(format!("{} to {what} ({})", v.len(), list(v)));
                }
            }
            if let Some(r) = p.rollout {
                parts.push(r);
            }
            format!("# {s}: {}", parts.join("; "))
        })
        .collect()
}
