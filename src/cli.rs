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
