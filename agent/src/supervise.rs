//! The supervisor between the agent and each instance: it fences an instance
//! whose agent died, so that it stops before its node's lease expires and
//! never runs beside the replacement the controller starts elsewhere.
//!
//! The agent starts `ccattler supervise … -- PROGRAM ARGS` in a new process
//! group; the supervisor starts the instance in that group, with the
//! environment it was given, and exits with the instance's status. Two files
//! in the agent's state dir say whether to go on:
//!
//! * `agent.alive` — the agent's clock in ms, rewritten every half second by
//!   a task of its own while the agent process lives;
//! * `lease.deadline` — when the node's lease expires at the earliest (ms),
//!   from the last keep-alive etcd answered.
//!
//! The supervisor fences by the lease deadline alone, whether the agent is
//! dead, hung or cut off from etcd (a partition): every process of the
//! instance gets SIGTERM at [`term_at`] and SIGKILL at [`kill_at`], which is
//! [`MARGIN`] before the lease can expire, so the controller (which waits for
//! the expiry) never sees the instance's replacement start while it still
//! runs. Only when no deadline was ever written does it fall back on the
//! agent being silent. An agent restarted within the TTL renews the lease
//! first: nothing is fenced, and it adopts the supervisor as it was.
//!
//! The instance runs in its own cgroup when the agent gives one
//! ([`crate::confine`]): it joins before it execs, so the processes it starts
//! (`setsid` or not) are stopped with it, and when its main process exits the
//! rest are killed; an OOM kill makes the supervisor exit with [`OOM_KILLED`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the agent may be silent before it counts as gone (it writes
/// `agent.alive` every half second; fencing also waits for the lease deadline).
pub const AGENT_SILENT: Duration = Duration::from_secs(1);

/// The exit status of a fenced instance's supervisor.
pub const FENCED: i32 = 75;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Reads a file of one integer (ms); None if missing or unreadable.
pub fn read_ms(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes a file of one integer (ms), atomically.
pub fn write_ms(path: &Path, ms: i64) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, ms.to_string())?;
    std::fs::rename(&tmp, path)
}

/// Where the two files are in a state dir.
pub struct Signals {
    pub alive: PathBuf,
    pub deadline: PathBuf,
}

impl Signals {
    pub fn in_dir(state_dir: &Path) -> Signals {
        Signals { alive: state_dir.join("agent.alive"), deadline: state_dir.join("lease.deadline") }
    }
}

/// How long before the lease can expire every process of a fenced instance is gone.
pub const MARGIN: Duration = Duration::from_millis(500);

/// The exit status of a supervisor whose instance the kernel killed for
/// exceeding its memory limit.
pub const OOM_KILLED: i32 = 76;

/// When a fenced instance is killed: [`MARGIN`] before the lease deadline.
pub fn kill_at(deadline: i64) -> i64 {
    deadline - MARGIN.as_millis() as i64
}

/// When fencing starts (SIGTERM): the fencing grace before [`kill_at`].
pub fn term_at(deadline: i64, fence_grace: Duration) -> i64 {
    kill_at(deadline) - fence_grace.as_millis() as i64
}

/// The SIGTERM → SIGKILL grace the supervisor can afford when fencing: the
/// stop grace, but no more than the slack a lease renewed every third of its
/// TTL leaves (else a healthy node would fence itself between renewals).
pub fn fence_grace(grace: Duration, ttl_secs: i64) -> Duration {
    let slack = Duration::from_millis((ttl_secs.max(1) as u64 * 1000 / 3).saturating_sub(MARGIN.as_millis() as u64));
    grace.min(slack)
}

/// Whether to fence now: the lease deadline is within the fencing grace (and
/// margin) — whatever the agent is doing — or no deadline was ever recorded
/// and the agent has been silent for [`AGENT_SILENT`].
pub fn should_fence(now: i64, alive: Option<i64>, deadline: Option<i64>, fence_grace: Duration) -> bool {
    match deadline {
        Some(d) => now >= term_at(d, fence_grace),
        None => alive.is_none_or(|a| now - a > AGENT_SILENT.as_millis() as i64),
    }
}

/// How the instance is confined (both parts optional).
#[derive(Default)]
pub struct Confinement {
    pub cgroup: Option<crate::confine::InstanceCgroup>,
    /// (uid, gid) to run as.
    pub user: Option<(u32, u32)>,
}

/// Runs the instance; returns the exit code to exit with.
pub fn run(signals: &Signals, fence_grace: Duration, confinement: &Confinement, program: &OsString, args: &[OsString]) -> i32 {
    // SIGTERM to the group reaches the instance too; the supervisor waits
    // for it to exit rather than leave it behind.
    // SAFETY: setting a signal disposition to SIG_IGN touches no memory.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let dirs = confinement.cgroup.as_ref().map(|c| c.dirs.clone()).unwrap_or_default();
    let joiner = crate::confine::Joiner::new(&dirs, confinement.user);
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    // SAFETY: `in_child` makes only async-signal-safe calls and allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || joiner.in_child());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ccattler supervise: cannot start {}: {e}", program.to_string_lossy());
            return 127;
        }
    };
    let cgroup = confinement.cgroup.as_ref();
    let signal_all = |sig| {
        if let Some(c) = cgroup {
            c.kill_all(sig);
        }
        signal_own_group(sig);
    };
    let mut fenced: Option<i64> = None;
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                break status.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0));
            }
            Ok(None) => {}
            Err(_) => break 1,
        }
        let now = now_ms();
        let deadline = read_ms(&signals.deadline);
        if fenced.is_none() && should_fence(now, read_ms(&signals.alive), deadline, fence_grace) {
            eprintln!("ccattler supervise: the node's lease is about to expire unrenewed; stopping the instance (fencing)");
            signal_all(libc::SIGTERM);
            fenced = Some(now);
        }
        if fenced.is_some_and(|at| now >= deadline.map_or(at + fence_grace.as_millis() as i64, kill_at)) {
            match cgroup {
                // Everything the instance started is in its cgroup: the
                // supervisor outlives it to clean up and say why.
                Some(c) => {
                    c.kill_until_empty(50);
                    let _ = child.kill();
                }
                // SIGKILL ends this process too, which is what fencing wants.
                None => signal_own_group(libc::SIGKILL),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The main process is gone: so is everything it left behind.
    let oom = cgroup.map_or(0, |c| {
        c.kill_until_empty(100);
        let oom = c.oom_kills();
        c.remove();
        oom
    });
    if fenced.is_some() {
        return FENCED;
    }
    if oom > 0 {
        eprintln!("ccattler supervise: the instance exceeded its memory limit and was killed (out of memory)");
        return OOM_KILLED;
    }
    code
}

fn signal_own_group(sig: libc::c_int) {
    // SAFETY: kill(2) on our own process group; SIGTERM is ignored here, and
    // SIGKILL ends this process too, which is what fencing wants.
    unsafe {
        libc::kill(0, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_follows_the_lease_deadline_whatever_the_agent_does() {
        let g = Duration::from_secs(2);
        let now = 100_000;
        // The lease has long to go: not yet, silent agent or not.
        assert!(!should_fence(now, Some(now - 5_000), Some(now + 10_000), g));
        assert!(!should_fence(now, Some(now - 100), Some(now + 10_000), g));
        // The deadline is within grace + margin: now, even with a live
        // agent (a partition: it lives but cannot renew).
        assert!(should_fence(now, Some(now - 100), Some(now + 2_400), g));
        assert!(should_fence(now, Some(now - 5_000), Some(now + 1_500), g));
        // Just outside grace + margin: not yet.
        assert!(!should_fence(now, Some(now - 100), Some(now + 2_600), g));
        // No deadline ever written: the agent's silence decides.
        assert!(!should_fence(now, Some(now - 500), None, g));
        assert!(should_fence(now, Some(now - 5_000), None, g));
        assert!(should_fence(now, None, None, g));
        assert_eq!(kill_at(10_000), 9_500);
    }

    #[test]
    fn the_fencing_grace_fits_between_renewals() {
        // TTL 30 s, renewed every 10 s: the whole stop grace fits.
        assert_eq!(fence_grace(Duration::from_secs(5), 30), Duration::from_secs(5));
        // TTL 3 s, renewed every second: 500 ms, so a healthy node never fences.
        assert_eq!(fence_grace(Duration::from_secs(2), 3), Duration::from_millis(500));
        // Renewed at time 0, deadline 3000: right before the next renewal (1000 later) no fence.
        assert!(!should_fence(1_000, None, Some(3_000), fence_grace(Duration::from_secs(2), 3)));
        assert_eq!(fence_grace(Duration::from_secs(9), 1), Duration::ZERO);
    }
}
