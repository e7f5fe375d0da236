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
//! Once the agent has been silent for [`AGENT_SILENT`] and the lease deadline
//! is less than the grace period away, the supervisor stops the instance
//! (SIGTERM to the group, SIGKILL at the deadline, or after the grace period
//! without one) and exits. An agent
//! restarted within the TTL writes `agent.alive` again first: nothing is
//! fenced, and it adopts the supervisor as it was.

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

/// Whether to fence now: the agent has been silent long enough and the
/// lease deadline is within `grace` (a missing deadline: no lease to wait for).
pub fn should_fence(now: i64, alive: Option<i64>, deadline: Option<i64>, grace: Duration) -> bool {
    let silent = alive.is_none_or(|a| now - a > AGENT_SILENT.as_millis() as i64);
    let due = deadline.is_none_or(|d| now >= d - grace.as_millis() as i64);
    silent && due
}

/// Runs the instance; returns the exit code to exit with.
pub fn run(signals: &Signals, grace: Duration, program: &OsString, args: &[OsString]) -> i32 {
    // SIGTERM to the group reaches the instance too; the supervisor waits
    // for it to exit rather than leave it behind.
    // SAFETY: setting a signal disposition to SIG_IGN touches no memory.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let mut child = match std::process::Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ccattler supervise: cannot start {}: {e}", program.to_string_lossy());
            return 127;
        }
    };
    let mut fenced_at: Option<i64> = None;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                if fenced_at.is_some() {
                    return FENCED;
                }
                return status.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0));
            }
            Ok(None) => {}
            Err(_) => return 1,
        }
        let now = now_ms();
        match fenced_at {
            None if should_fence(now, read_ms(&signals.alive), read_ms(&signals.deadline), grace) => {
                eprintln!("ccattler supervise: the agent is gone and the node's lease is about to expire; stopping the instance");
                signal_own_group(libc::SIGTERM);
                fenced_at = Some(now);
            }
            Some(t) if now >= read_ms(&signals.deadline).unwrap_or(t + grace.as_millis() as i64) => signal_own_group(libc::SIGKILL),
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
    fn fencing_waits_for_a_silent_agent_and_the_lease_deadline() {
        let g = Duration::from_secs(2);
        let now = 100_000;
        // The agent lives: never, whatever the lease.
        assert!(!should_fence(now, Some(now - 500), Some(now - 1), g));
        assert!(!should_fence(now, Some(now - 900), Some(now + 1_000), g));
        // Silent, but the lease has long to go: not yet.
        assert!(!should_fence(now, Some(now - 5_000), Some(now + 10_000), g));
        // Silent, and the lease ends within the grace period: now.
        assert!(should_fence(now, Some(now - 5_000), Some(now + 1_500), g));
        // Silent and no lease at all.
        assert!(should_fence(now, None, None, g));
    }
}
