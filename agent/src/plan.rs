//! The agent's convergence step as a pure function: what is wanted on this
//! node, what runs, and the time → the actions that make them match. No
//! processes, no etcd: the loop in `agent.rs` executes the actions.

use crate::runtime::Launch;
use std::collections::BTreeMap;
use std::time::Instant;

/// What the node's view asks of one placed instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// Run this.
    Run(Launch),
    /// Not yet (no image; a secret not sealed to this node yet): why, if known.
    Wait(Option<String>),
    /// It cannot run here until its spec changes (an image the runtime does not know).
    Cannot(String),
}

/// Where an instance the agent knows stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// Exited; may start again from `retry_at`.
    Crashed {
        retry_at: Instant,
    },
    Failed,
    Waiting,
    Stopping,
}

/// What the agent knows of one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Have {
    pub phase: Phase,
    /// Whether its process lives.
    pub process: bool,
    /// What its process was (last) started with.
    pub launch: Option<Launch>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Start {
        instance: String,
        launch: Launch,
    },
    /// SIGTERM (SIGKILL after the grace period); restarted once it exited if still wanted.
    Stop {
        instance: String,
    },
    /// Drop an instance that is neither wanted nor running, with its directory.
    Forget {
        instance: String,
    },
    /// Say why a wanted instance does not run yet.
    Wait {
        instance: String,
        why: Option<String>,
    },
    /// Say why a wanted instance cannot run.
    Fail {
        instance: String,
        why: String,
    },
    /// Remove a leftover instance directory nobody knows of.
    RemoveDir {
        instance: String,
    },
}

/// The actions that make what runs match what is wanted. `leftover` lists
/// instance directories in the state dir (swept when neither wanted nor known).
pub fn plan(wanted: &BTreeMap<String, Wanted>, have: &BTreeMap<String, Have>, leftover: &[String], now: Instant) -> Vec<Action> {
    let mut out = Vec::new();
    // Stop what is no longer placed here; forget it once it has exited.
    for (name, h) in have.iter().filter(|(n, _)| !wanted.contains_key(*n)) {
        let instance = name.clone();
        match (h.process, h.phase) {
            (true, Phase::Stopping) => {}
            (true, _) => out.push(Action::Stop { instance }),
            (false, _) => out.push(Action::Forget { instance }),
        }
    }
    for dir in leftover.iter().filter(|d| !wanted.contains_key(*d) && !have.contains_key(*d)) {
        out.push(Action::RemoveDir { instance: dir.clone() });
    }
    for (name, w) in wanted {
        let instance = name.clone();
        let h = have.get(name);
        let process = h.is_some_and(|h| h.process);
        let launch = match w {
            Wanted::Wait(why) if !process => {
                out.push(Action::Wait { instance, why: why.clone() });
                continue;
            }
            Wanted::Cannot(why) if !process => {
                out.push(Action::Fail { instance, why: why.clone() });
                continue;
            }
            Wanted::Wait(_) | Wanted::Cannot(_) => continue, // runs on as it is
            Wanted::Run(l) => l,
        };
        let changed = h.and_then(|h| h.launch.as_ref()) != Some(launch);
        let phase = h.map_or(Phase::Waiting, |h| h.phase);
        match (phase, process) {
            (Phase::Stopping, _) => {}
            (Phase::Running, true) if changed => out.push(Action::Stop { instance }),
            (_, true) => {}
            (Phase::Crashed { retry_at }, false) if now < retry_at && !changed => {}
            (Phase::Failed, false) if !changed => {}
            (_, false) => out.push(Action::Start { instance, launch: launch.clone() }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn launch(image: &str) -> Launch {
        Launch { image: image.into(), config: Default::default(), secrets: Default::default(), volumes: Default::default(), limits: Default::default() }
    }

    fn known(phase: Phase, process: bool, image: &str) -> Have {
        Have { phase, process, launch: Some(launch(image)) }
    }

    fn names(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Start { instance, .. } => format!("start {instance}"),
                Action::Stop { instance } => format!("stop {instance}"),
                Action::Forget { instance } => format!("forget {instance}"),
                Action::Wait { instance, .. } => format!("wait {instance}"),
                Action::Fail { instance, .. } => format!("fail {instance}"),
                Action::RemoveDir { instance } => format!("rmdir {instance}"),
            })
            .collect()
    }

    #[test]
    fn new_instances_start_and_gone_ones_stop_then_are_forgotten() {
        let now = Instant::now();
        let wanted = BTreeMap::from([("a".to_string(), Wanted::Run(launch("x"))), ("b".to_string(), Wanted::Run(launch("x")))]);
        let have = BTreeMap::from([
            ("b".to_string(), known(Phase::Running, true, "x")),
            ("c".to_string(), known(Phase::Running, true, "x")),
            ("d".to_string(), known(Phase::Waiting, false, "x")),
            ("e".to_string(), known(Phase::Stopping, true, "x")),
        ]);
        let leftover = ["b".to_string(), "f".to_string(), "d".to_string()];
        assert_eq!(names(&plan(&wanted, &have, &leftover, now)), ["stop c", "forget d", "rmdir f", "start a"]);
    }

    #[test]
    fn a_changed_launch_restarts_and_nothing_else_does() {
        let now = Instant::now();
        let wanted = BTreeMap::from([("a".to_string(), Wanted::Run(launch("v2"))), ("b".to_string(), Wanted::Run(launch("v1")))]);
        let have = BTreeMap::from([("a".to_string(), known(Phase::Running, true, "v1")), ("b".to_string(), known(Phase::Running, true, "v1"))]);
        assert_eq!(names(&plan(&wanted, &have, &[], now)), ["stop a"]);
        // Stopped (exited): started with the new launch.
        let have = BTreeMap::from([("a".to_string(), known(Phase::Waiting, false, "v1"))]);
        assert_eq!(plan(&wanted, &have, &[], now)[0], Action::Start { instance: "a".into(), launch: launch("v2") });
    }

    #[test]
    fn a_crash_waits_for_its_backoff_and_a_failure_for_a_new_spec() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let wanted = BTreeMap::from([("a".to_string(), Wanted::Run(launch("x"))), ("b".to_string(), Wanted::Run(launch("x")))]);
        let have =
            BTreeMap::from([("a".to_string(), known(Phase::Crashed { retry_at: later }, false, "x")), ("b".to_string(), known(Phase::Failed, false, "x"))]);
        assert!(plan(&wanted, &have, &[], now).is_empty());
        assert_eq!(names(&plan(&wanted, &have, &[], later)), ["start a"]);
        let fixed = BTreeMap::from([("b".to_string(), Wanted::Run(launch("y")))]);
        assert_eq!(names(&plan(&fixed, &have, &[], now)), ["forget a", "start b"]);
    }

    #[test]
    fn waiting_and_unrunnable_instances_say_why_but_a_running_one_runs_on() {
        let now = Instant::now();
        let wanted = BTreeMap::from([
            ("a".to_string(), Wanted::Wait(Some("secret db is not sealed to this node yet".into()))),
            ("b".to_string(), Wanted::Cannot("image nginx is not supported".into())),
            ("c".to_string(), Wanted::Wait(None)),
        ]);
        let have = BTreeMap::from([("c".to_string(), known(Phase::Running, true, "x"))]);
        let actions = plan(&wanted, &have, &[], now);
        assert_eq!(names(&actions), ["wait a", "fail b"]);
        assert_eq!(actions[0], Action::Wait { instance: "a".into(), why: Some("secret db is not sealed to this node yet".into()) });
    }
}
