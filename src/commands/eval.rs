//! ccattler eval: evaluate a facts file offline.

#[allow(unused_imports)]
use crate::prelude::*;

pub(crate) fn eval(facts: &std::path::Path, rules: &[PathBuf], format: Format, workers: usize, processes: usize) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    if processes > 1 {
        let group = Group::start(facts, rules, workers, processes)?;
        let engine = ccattler_engine::Engine::start_cluster(program, &group.cluster)?;
        let (session, lines) = session_on_facts(engine, facts)?;
        let code = print(&session, &lines, facts, format);
        drop(session); // stops the engine, and with it the other processes
        group.wait()?;
        return Ok(code);
    }
    let (session, lines) = session_from_facts(program, facts, workers)?;
    Ok(print(&session, &lines, facts, format))
}

/// One process of `eval --processes N` other than the first: serves the
/// engine the first runs until it stops.
pub(crate) fn eval_serve(rules: &[PathBuf], hosts: &std::path::Path, process: usize, workers: usize) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let cluster = ccattler_engine::Cluster::from_hosts_file(hosts, process, workers)?;
    ccattler_engine::serve(program, &cluster)?;
    Ok(ExitCode::SUCCESS)
}

/// The processes `eval --processes N` starts besides itself, and the hosts
/// file they share (removed when done).
struct Group {
    cluster: ccattler_engine::Cluster,
    hosts: PathBuf,
    watcher: std::thread::JoinHandle<()>,
}

impl Group {
    fn start(facts: &std::path::Path, rules: &[PathBuf], workers: usize, processes: usize) -> anyhow::Result<Group> {
        let addresses = ccattler_engine::Cluster::loopback(processes)?;
        let hosts = std::env::temp_dir().join(format!("ccattler-eval-{}.hosts", std::process::id()));
        std::fs::write(&hosts, addresses.iter().map(|a| format!("{a}\n")).collect::<String>()).map_err(|e| anyhow::anyhow!("{}: {e}", hosts.display()))?;
        let exe = std::env::current_exe()?;
        let mut children = Vec::new();
        for process in 1..processes {
            let mut cmd = std::process::Command::new(&exe);
            cmd.arg("eval").arg("--facts").arg(facts);
            for r in rules {
                cmd.arg("--rules").arg(r);
            }
            cmd.arg("--workers").arg(workers.to_string()).arg("--hosts").arg(&hosts).arg("--process").arg(process.to_string());
            cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
            let child = cmd.spawn().map_err(|e| anyhow::anyhow!("starting eval process {process}: {e}"))?;
            children.push((process, child));
        }
        // The group is one failure domain: a process that fails fails the
        // evaluation at once (the engine would wait for it for ever).
        let watched = hosts.clone();
        let watcher = std::thread::spawn(move || {
            for (process, mut child) in children {
                match child.wait() {
                    Ok(status) if status.success() => {}
                    Ok(status) => {
                        let _ = std::fs::remove_file(&watched);
                        eprintln!("error: eval process {process} of the cluster stopped ({status}); the group stops with it");
                        std::process::exit(2);
                    }
                    Err(e) => eprintln!("warning: waiting for eval process {process}: {e}"),
                }
            }
        });
        let cluster = ccattler_engine::Cluster { workers, process: 0, addresses };
        Ok(Group { cluster, hosts, watcher })
    }

    /// Waits for the other processes to stop (after the engine stopped).
    fn wait(self) -> anyhow::Result<()> {
        let joined = self.watcher.join();
        let _ = std::fs::remove_file(&self.hosts);
        joined.map_err(|_| anyhow::anyhow!("watching the eval processes panicked"))
    }
}

fn print(session: &ccattler_engine::Session, lines: &[ccattler_engine::factfile::FactLine], facts: &std::path::Path, format: Format) -> ExitCode {
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
                session.derived().iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.to_string()))).collect();
            let rejected: Vec<_> = session.rejected().iter().map(|(k, r)| serde_json::json!({"key": k, "line": line_of(k), "reason": r})).collect();
            let conflicts: Vec<_> = session.conflicts().map(|c| serde_json::json!({"key": c.key, "values": c.values.iter().map(|(v, r)| serde_json::json!({"value": v, "rules": r})).collect::<Vec<_>>()})).collect();
            println!("{}", serde_json::json!({"derived": derived, "rejected": rejected, "conflicts": conflicts}));
        }
    }
    let clean = session.rejected().is_empty() && session.conflicts().next().is_none();
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
