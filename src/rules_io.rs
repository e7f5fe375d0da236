//! Rules and facts files as the commands read them.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn default_rules(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    if paths.is_empty() {
        vec![PathBuf::from("rules")]
    } else {
        paths
    }
}

/// Loads and checks rules; on errors prints the diagnostics and returns None.
/// The rules a command that talks to etcd runs against: `--rules` when given
/// (or `rules/` where it exists), else the program the cluster's controller
/// runs, which it publishes under `status/program/` — so `apply`, `plan` and
/// `explain` work outside a checkout.
pub(crate) fn load_program_for(rules: &[PathBuf], etcd: &EtcdArgs) -> anyhow::Result<Option<std::sync::Arc<ccattler_parser::Program>>> {
    let default = rules.len() == 1 && rules[0] == std::path::Path::new("rules");
    if !default || rules[0].exists() {
        return load_program(rules);
    }
    let cfg = etcd.config()?;
    let files = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let resp = client.get(ccattler_bridge::controller::PROGRAM_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await?;
        anyhow::Ok(
            resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), String::from_utf8_lossy(kv.value()).into_owned())).collect::<Vec<_>>(),
        )
    })?;
    if files.is_empty() {
        anyhow::bail!("no rules/ here and none published by a controller under {}: pass --rules DIR", ccattler_bridge::controller::PROGRAM_PREFIX);
    }
    eprintln!("# the rules the cluster runs ({} file(s) under {})", files.len(), ccattler_bridge::controller::PROGRAM_PREFIX);
    let mut sources = ccattler_parser::source::Sources::new();
    for (k, text) in files {
        sources.add(k, text);
    }
    let checked = ccattler_parser::check_sources(sources);
    if checked.errors() > 0 {
        eprint!("{}", checked.render());
        anyhow::bail!("the published rules do not check ({} error(s)); pass --rules DIR", checked.errors());
    }
    Ok(checked.program.map(std::sync::Arc::new))
}

pub(crate) fn load_program(rules: &[PathBuf]) -> anyhow::Result<Option<std::sync::Arc<ccattler_parser::Program>>> {
    let checked = ccattler_parser::load(rules)?;
    if checked.errors() > 0 {
        eprint!("{}", checked.render());
        eprintln!("{}: {} error(s) in the rules", rules.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", "), checked.errors());
        return Ok(None);
    }
    Ok(checked.program.map(std::sync::Arc::new))
}

pub(crate) fn read_facts(path: &std::path::Path) -> anyhow::Result<Vec<ccattler_engine::factfile::FactLine>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(ccattler_engine::factfile::parse(&path.display().to_string(), &text)?)
}

/// A facts file written into an offline session, run to a fixed point as
/// the controller would; with the file's lines (for line numbers).
pub(crate) fn session_from_facts(
    program: std::sync::Arc<ccattler_parser::Program>,
    path: &std::path::Path,
    workers: usize,
) -> anyhow::Result<(ccattler_engine::Session, Vec<ccattler_engine::factfile::FactLine>)> {
    session_on_facts(ccattler_engine::Engine::start(program, workers)?, path)
}

/// A session over `engine` with a facts file written into it.
pub(crate) fn session_on_facts(
    engine: ccattler_engine::Engine,
    path: &std::path::Path,
) -> anyhow::Result<(ccattler_engine::Session, Vec<ccattler_engine::factfile::FactLine>)> {
    let lines = read_facts(path)?;
    let mut session = ccattler_engine::Session::on(engine);
    let writes: Vec<(String, Option<String>)> = lines.iter().map(|f| (f.key.clone(), Some(f.value.clone()))).collect();
    session.write(&writes)?;
    Ok((session, lines))
}

/// Checks a facts file's keys and values against the rules' inputs:
/// (errors: values that would be rejected; warnings: keys no input reads).
pub(crate) fn lint_facts(
    program: &ccattler_parser::Program,
    file: &std::path::Path,
    facts: &[ccattler_engine::factfile::FactLine],
) -> (Vec<String>, Vec<String>) {
    use ccattler_engine::facts::{lint, Lint};
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for f in facts {
        match lint(program, &f.key, &f.value) {
            None => {}
            Some(Lint::Rejected(why)) => errors.push(format!("error: {}:{}: {}: {why}", file.display(), f.line, f.key)),
            Some(Lint::Unread { near }) => {
                let hint = near.map(|n| format!("; did you mean {n}?")).unwrap_or_default();
                warnings.push(format!("warning: {}:{}: no rule reads {}{hint}", file.display(), f.line, f.key));
            }
        }
    }
    (errors, warnings)
}

/// Keys of a facts file a policy of the rules denies: the rules run over the
/// file's facts alone, and a derived `status/denied/KEY` names a KEY of the
/// file and why (rules/policy.rules). Empty when no rule writes under
/// `status/denied/`.
pub(crate) fn policy_denials(
    program: &std::sync::Arc<ccattler_parser::Program>,
    file: &std::path::Path,
    facts: &[ccattler_engine::factfile::FactLine],
) -> anyhow::Result<Vec<String>> {
    const DENIED: &str = "status/denied/";
    let has_policy = program.outputs().any(|(_, r)| r.pattern.as_ref().is_some_and(|p| p.text.starts_with(DENIED)));
    if !has_policy || facts.is_empty() {
        return Ok(Vec::new());
    }
    let mut session = ccattler_engine::Session::new(program.clone(), 1)?;
    let writes: Vec<(String, Option<String>)> = facts.iter().map(|f| (f.key.clone(), Some(f.value.clone()))).collect();
    session.write(&writes)?;
    Ok(facts
        .iter()
        .filter_map(|f| {
            let why = session.derived().get(&format!("{DENIED}{}", f.key))?;
            Some(format!("error: {}:{}: {}: denied by policy: {why}", file.display(), f.line, f.key))
        })
        .collect())
}
