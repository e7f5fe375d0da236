//! The `process` runtime: how an image becomes a child process.
//!
//! | image | runs |
//! |---|---|
//! | `builtin:http` | `ccattler serve-http --instance I`: a tiny HTTP server built into the binary |
//! | `builtin:http#TAG` | the same server; the tag only tells versions apart (a rollout in a test or the demo) |
//! | `exec:<command>` | `sh -c <command>` |
//!
//! Any other image is refused (the instance's state says why). Each instance
//! runs in its own process group and cgroup ([`crate::confine`]), as a user
//! of its own, in its work directory (`<state-dir>/instances/I/work`, 0700,
//! its `HOME`), with a clean environment: `PATH`, `HOME`,
//! `PORT` (a free port on the node's address), `HOST` (that address),
//! `CCATTLER_INSTANCE`, `CCATTLER_SERVICE`, `CCATTLER_NODE`, one variable per
//! config entry (`KEY=value`), one per granted secret
//! (`SECRET_<NAME>=value`), and one per volume
//! (`VOLUME_<NAME>=<directory>`, with the service's mount path in
//! `VOLUME_<NAME>_MOUNT`). Output goes to `<state-dir>/instances/I/log` (0600,
//! the agent's: the instance writes it through the descriptor it is given).

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What to run for one instance: everything that, when it changes, restarts
/// it. It is recorded in the state dir, so it names secrets and their
/// versions, never their values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    pub image: String,
    pub config: BTreeMap<String, String>,
    /// secret → the version of its value the instance's template pins (a
    /// new version restarts the instance: it rolls with its template)
    #[serde(deserialize_with = "versions")]
    pub secrets: BTreeMap<String, String>,
    /// volume → (host directory, mount path)
    pub volumes: BTreeMap<String, (PathBuf, String)>,
    /// The cgroup limits it runs under (its requests).
    #[serde(default)]
    pub limits: crate::confine::Limits,
}

/// Secret versions as recorded: strings, or the numbers an agent before
/// pinned versions recorded (so its instances are adopted, not restarted).
fn versions<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Version {
        Text(String),
        Number(i64),
    }
    let raw: BTreeMap<String, Version> = serde::Deserialize::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Version::Text(s) => s,
                Version::Number(n) => n.to_string(),
            };
            (k, v)
        })
        .collect())
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("image {0:?} is not supported by the process runtime (use builtin:http or exec:<command>)")]
    Image(String),
    #[error("cannot start {instance}: {source}")]
    Spawn { instance: String, source: std::io::Error },
}

/// The program and arguments for an image.
pub fn command_for(image: &str, instance: &str) -> Result<(PathBuf, Vec<String>), RuntimeError> {
    if image == "builtin:http" || image.strip_prefix("builtin:http#").is_some_and(|tag| !tag.is_empty()) {
        let exe = std::env::current_exe().map_err(|source| RuntimeError::Spawn { instance: instance.into(), source })?;
        return Ok((exe, vec!["serve-http".into(), "--instance".into(), instance.into()]));
    }
    if let Some(cmd) = image.strip_prefix("exec:").filter(|c| !c.trim().is_empty()) {
        return Ok((PathBuf::from("/bin/sh"), vec!["-c".into(), cmd.into()]));
    }
    Err(RuntimeError::Image(image.into()))
}

/// An environment variable name for a config key, secret or volume name.
pub fn env_name(prefix: &str, name: &str) -> String {
    let upper: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("{prefix}{upper}")
}

pub struct Identity<'a> {
    pub instance: &'a str,
    pub service: &'a str,
    pub node: &'a str,
    pub host: &'a str,
    pub port: u16,
}

/// The `PATH` instances and exec probes get (never the agent's own).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How an instance (and its exec probes) is confined.
pub struct Confine<'a> {
    pub cgroup: Option<&'a crate::confine::InstanceCgroup>,
    /// (uid, gid) to run as; `None`: the agent's own user.
    pub user: Option<(u32, u32)>,
    /// Its working directory and `HOME`.
    pub work: &'a Path,
    /// SIGTERM → SIGKILL when the supervisor fences it.
    pub fence_grace: std::time::Duration,
}

/// Starts an instance in its own process group, under a supervisor that
/// fences it if the node's lease is about to lapse ([`crate::supervise`]);
/// its secrets' values come from `secrets` (opened in memory), and go only
/// into its environment. The process returned is the supervisor's: it exits
/// with the instance.
pub fn spawn(
    id: &Identity,
    launch: &Launch,
    secrets: &crate::spec::Secrets,
    log: &Path,
    signals: &crate::supervise::Signals,
    confine: &Confine,
) -> Result<tokio::process::Child, RuntimeError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| RuntimeError::Spawn { instance: id.instance.into(), source };
    let (program, args) = command_for(&launch.image, id.instance)?;
    let out = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(log).map_err(err)?;
    // An older log (or one made before logs were private) becomes private too.
    std::fs::set_permissions(log, std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(err)?;
    let errout = out.try_clone().map_err(err)?;
    let exe = std::env::current_exe().map_err(err)?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("supervise").arg("--alive").arg(&signals.alive).arg("--deadline").arg(&signals.deadline);
    cmd.arg("--fence-grace-ms").arg(confine.fence_grace.as_millis().to_string());
    for dir in confine.cgroup.iter().flat_map(|c| &c.dirs) {
        cmd.arg("--cgroup").arg(dir);
    }
    if let Some((uid, gid)) = confine.user {
        cmd.arg("--uid").arg(uid.to_string()).arg("--gid").arg(gid.to_string());
    }
    cmd.arg("--").arg(program);
    cmd.args(args).env_clear().current_dir(confine.work).env("HOME", confine.work);
    cmd.env("PATH", DEFAULT_PATH);
    if let Ok(v) = std::env::var("CCATTLER_LOG") {
        cmd.env("CCATTLER_LOG", v);
    }
    for (k, v) in &launch.config {
        cmd.env(k, v);
    }
    for k in launch.secrets.keys() {
        let value = secrets.get(k).map(|(_, v)| v.as_slice()).unwrap_or_default();
        cmd.env(env_name("SECRET_", k), std::ffi::OsStr::from_bytes(value));
    }
    for (v, (dir, mount)) in &launch.volumes {
        cmd.env(env_name("VOLUME_", v), dir);
        cmd.env(format!("{}_MOUNT", env_name("VOLUME_", v)), mount);
    }
    cmd.env("PORT", id.port.to_string())
        .env("HOST", id.host)
        .env("CCATTLER_INSTANCE", id.instance)
        .env("CCATTLER_SERVICE", id.service)
        .env("CCATTLER_NODE", id.node)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(errout)
        .process_group(0)
        .kill_on_drop(false);
    cmd.spawn().map_err(err)
}

/// Gives `dir` to the instance's user, private (0700); without a user of
/// its own, only the mode changes.
pub fn hand_over(dir: &Path, user: Option<(u32, u32)>) -> std::io::Result<()> {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    }
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// A free TCP port on `host` (the instance binds it right after).
pub fn free_port(host: &str) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((host, 0))?.local_addr()?.port())
}

/// The kernel's start time of a process (clock ticks since boot), which
/// tells a live process from a later one that reused its pid.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields resume after ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    if fields.first() == Some(&"Z") {
        return None; // exited, not yet reaped
    }
    fields.get(19)?.parse().ok()
}

/// Whether `pid` is still the process that started at `started`.
pub fn alive(pid: u32, started: u64) -> bool {
    start_time(pid) == Some(started)
}

/// CPU time (clock ticks, user + system, children that exited included) and
/// resident memory (bytes) of every process, summed per process group: an
/// instance is the group its supervisor leads.
pub fn usage_by_group() -> std::collections::HashMap<u32, (u64, u64)> {
    let mut out: std::collections::HashMap<u32, (u64, u64)> = std::collections::HashMap::new();
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        // After the command: state, ppid, pgrp, …, utime (11), stime (12),
        // cutime (13), cstime (14), …, rss in pages (21).
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let Some(pgrp) = f.get(2).and_then(|v| v.parse::<u32>().ok()) else { continue };
        let u = out.entry(pgrp).or_default();
        u.0 += num(11) + num(12) + num(13) + num(14);
        u.1 += num(21) * page;
    }
    out
}

/// Clock ticks per second (`/proc` CPU times are in these).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as u64
}

/// Signals an instance's whole process group, and every process of its
/// cgroup (those that left the group with `setsid` too).
pub fn signal_instance(pid: u32, cgroup: Option<&crate::confine::InstanceCgroup>, signal: libc::c_int) {
    if let Some(c) = cgroup {
        c.kill_all(signal);
    }
    signal_group(pid, signal);
}

/// Signals a process group.
pub fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is shared.
    unsafe {
        libc::kill(-(pid as libc::pid_t), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_map_to_commands() {
        let (exe, args) = command_for("builtin:http", "web-0").unwrap();
        assert!(exe.is_absolute());
        assert_eq!(args, ["serve-http", "--instance", "web-0"]);
        assert_eq!(command_for("exec:sleep 5", "x").unwrap(), (PathBuf::from("/bin/sh"), vec!["-c".into(), "sleep 5".into()]));
        assert!(matches!(command_for("nginx:1.28", "x"), Err(RuntimeError::Image(i)) if i == "nginx:1.28"));
        assert!(command_for("exec: ", "x").is_err());
        assert_eq!(command_for("builtin:http#v2", "web-0").unwrap().1, ["serve-http", "--instance", "web-0"]);
        assert!(command_for("builtin:http#", "x").is_err());
        assert!(command_for("builtin:https", "x").is_err());
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("SECRET_", "db-pass"), "SECRET_DB_PASS");
        assert_eq!(env_name("VOLUME_", "data.v1"), "VOLUME_DATA_V1");
    }

    #[test]
    fn start_time_of_self_and_of_nothing() {
        let me = std::process::id();
        let t = start_time(me).expect("own start time");
        assert!(alive(me, t));
        assert!(!alive(me, t + 1));
        assert_eq!(start_time(u32::MAX - 1), None);
    }

    #[test]
    fn usage_of_own_process_group_counts_cpu_burnt_and_memory_held() {
        // SAFETY: getpgrp has no preconditions.
        let group = unsafe { libc::getpgrp() } as u32;
        let (ticks_before, _) = usage_by_group()[&group];
        let held = vec![1u8; 64 << 20];
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_add(std::hint::black_box(held[x as usize % held.len()]) as u64);
        }
        let (ticks_after, rss) = usage_by_group()[&group];
        assert!(ticks_after > ticks_before, "{ticks_before} → {ticks_after} ticks after 300 ms of cpu");
        assert!(rss >= 64 << 20, "{rss} bytes resident while holding 64 MiB");
        assert!(clock_ticks() >= 1);
    }
}
