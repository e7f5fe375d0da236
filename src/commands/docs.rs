//! ccattler completions and ccattler man: generated from the command
//! definitions (clap), so they never drift from the parser.

#[allow(unused_imports)]
use crate::prelude::*;
use clap::CommandFactory;

pub(crate) fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "ccattler", &mut out);
    // (A closed pipe — `| head` — is no error.)
    match std::io::Write::write_all(&mut std::io::stdout(), &out) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// `ccattler.1` and `ccattler-COMMAND.1` for every command (nested ones
/// too: `ccattler-node-drain.1`).
pub(crate) fn man(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let mut written = 0;
    // (page name, the command line that runs it, the command)
    let mut pages = vec![(String::from("ccattler"), String::from("ccattler"), Cli::command())];
    while let Some((name, line, cmd)) = pages.pop() {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone().display_name(name.clone()).bin_name(line.clone())).title(name.clone()).render(&mut out)?;
        std::fs::write(&path, out).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written += 1;
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            pages.push((format!("{name}-{}", sub.get_name()), format!("{line} {}", sub.get_name()), sub.clone()));
        }
    }
    eprintln!("wrote {written} man page(s) into {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
