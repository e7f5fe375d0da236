use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "ccattler", version, about = "A declarative operator whose control logic is Datalog")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and check rule files (default `rules/`); exit 1 with diagnostics.
    Check {
        /// Rule files or directories of `*.rules`.
        paths: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Run rule tests (`*.test` files; default `rules/tests/`).
    Test {
        /// Test files or directories.
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "rules")]
        rules: PathBuf,
        /// Run only cases whose name contains this text.
        #[arg(long)]
        run: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Evaluate the rules offline over a facts file; print every derived fact.
    Eval {
        /// Facts file: one `KEY = VALUE` a line.
        #[arg(long)]
        facts: PathBuf,
        #[arg(long, default_value = "rules")]
        rules: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Timely worker threads.
        #[arg(long, default_value_t = 1)]
        workers: usize,
    },
}

/// Exit codes: 0 ok, 1 the input is wrong (diagnostics), 2 usage or I/O error.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let result = match cli.command {
        Command::Check { paths, format } => check(paths, format),
        Command::Eval { facts, rules, format, workers } => eval(&facts, &rules, format, workers),
        Command::Test { paths, rules, run, format } => test(paths, &rules, run.as_deref(), format),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn default_rules(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    if paths.is_empty() { vec![PathBuf::from("rules")] } else { paths }
}

fn check(paths: Vec<PathBuf>, format: Format) -> anyhow::Result<ExitCode> {
    let checked = ccattler_parser::load(&default_rules(paths))?;
    let ok = checked.errors() == 0;
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

/// Loads and checks rules; on errors prints the diagnostics and returns None.
fn load_program(rules: &std::path::Path) -> anyhow::Result<Option<std::sync::Arc<ccattler_parser::Program>>> {
    let checked = ccattler_parser::load(&[rules.to_path_buf()])?;
    if checked.errors() > 0 {
        eprint!("{}", checked.render());
        eprintln!("{}: {} error(s) in the rules", rules.display(), checked.errors());
        return Ok(None);
    }
    Ok(checked.program.map(std::sync::Arc::new))
}

fn read_facts(path: &std::path::Path) -> anyhow::Result<Vec<ccattler_engine::factfile::FactLine>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(ccattler_engine::factfile::parse(&path.display().to_string(), &text)?)
}

fn eval(facts: &std::path::Path, rules: &std::path::Path, format: Format, workers: usize) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let lines = read_facts(facts)?;
    let mut session = ccattler_engine::Session::new(program, workers)?;
    let writes: Vec<(String, Option<String>)> = lines.iter().map(|f| (f.key.clone(), Some(f.value.clone()))).collect();
    session.write(&writes)?;
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

/// `*.test` files under the given paths (default `<rules>/tests`), sorted.
fn test_files(paths: Vec<PathBuf>, rules: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let paths = if paths.is_empty() { vec![rules.join("tests")] } else { paths };
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&p)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "test"))
                .collect();
            found.sort();
            out.extend(found);
        } else {
            out.push(p);
        }
    }
    anyhow::ensure!(!out.is_empty(), "no .test files found");
    Ok(out)
}

fn test(paths: Vec<PathBuf>, rules: &std::path::Path, filter: Option<&str>, format: Format) -> anyhow::Result<ExitCode> {
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
