//! The agent's write boundary. Everything the agent writes to etcd is an
//! [`ObservedKey`], and the only way to make one puts it under its own
//! node's prefix `observed/node/N/`: the agent cannot be told to write
//! anywhere else. (etcd's auth enforces the same boundary at the server: the
//! role `agent-N` may write nothing else; this is the agent's own half.)
//!
//! ```text
//! observed/node/N/{cpu,memory,address,alive,heartbeat,ttl,pubkey,label/K}
//! observed/node/N/usage/S/{cpu,memory}
//! observed/node/N/instance/I/{service,state,image,ip,port,health,restarts,reason,version}
//! observed/node/N/probe_state/I/P
//! observed/node/N/volume/V/size
//! ```

use std::fmt;

/// What the agent reports of an instance in each state, under
/// `observed/node/N/instance/I/`: the agent writes nothing else, and rule
/// tests feed nothing else (`agent/tests/fixtures_contract.rs` holds the
/// shipped rule tests to it). A process (running, stopping) has an address
/// (its use is reported per service: crate::usage); a crash or failure has a reason and the version it last tried.
pub fn reported_fields(state: &str) -> Option<&'static [&'static str]> {
    const WITH_PROCESS: &[&str] = &["service", "state", "image", "restarts", "health", "ip", "port", "version"];
    const CRASHED: &[&str] = &["service", "state", "image", "restarts", "health", "reason", "version"];
    const WAITING: &[&str] = &["service", "state", "image", "restarts", "health", "reason"];
    match state {
        "running" | "stopping" => Some(WITH_PROCESS),
        "crashed" | "failed" => Some(CRASHED),
        "waiting" => Some(WAITING),
        _ => None,
    }
}

/// The health the agent reports of an instance (its readiness probe's).
pub const HEALTH: &[&str] = &["none", "unknown", "healthy", "unhealthy"];

/// A key under `observed/node/N/` for one node N.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObservedKey(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the agent of node {node:?} writes only under observed/node/{node}/, not {key:?}")]
pub struct OutsideObserved {
    pub node: String,
    pub key: String,
}

impl ObservedKey {
    /// `observed/node/<node>/<rest>`; refuses anything that would escape the
    /// prefix (empty, `.` or `..` segments) or a node that is not a name.
    pub fn new(node: &str, rest: &str) -> Result<Self, OutsideObserved> {
        let key = format!("{}{rest}", ccattler_store::layout::observed_prefix(node));
        let clean = ccattler_parser::pattern::is_valid_name(node) && !rest.is_empty() && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
        if !clean {
            return Err(OutsideObserved { node: node.into(), key });
        }
        Ok(ObservedKey(key))
    }

    /// A key of the form `observed/node/<node>/…` as etcd returned it.
    pub fn parse(node: &str, key: &str) -> Result<Self, OutsideObserved> {
        let rest = key.strip_prefix(&ccattler_store::layout::observed_prefix(node)).unwrap_or("");
        let k = Self::new(node, rest)?;
        if k.0 != key {
            return Err(OutsideObserved { node: node.into(), key: key.into() });
        }
        Ok(k)
    }

    /// `observed/node/<node>/instance/<instance>/<field>`
    pub fn instance(node: &str, instance: &str, field: &str) -> Result<Self, OutsideObserved> {
        Self::new(node, &format!("instance/{instance}/{field}"))
    }

    /// `observed/node/<node>/probe_state/<instance>/<probe>`
    pub fn probe(node: &str, instance: &str, probe: &str) -> Result<Self, OutsideObserved> {
        Self::new(node, &format!("probe_state/{instance}/{probe}"))
    }

    /// `observed/node/<node>/volume/<volume>/<field>`
    pub fn volume(node: &str, volume: &str, field: &str) -> Result<Self, OutsideObserved> {
        Self::new(node, &format!("volume/{volume}/{field}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObservedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_under_the_own_node_can_be_made() {
        assert_eq!(ObservedKey::new("n1", "cpu").unwrap().as_str(), "observed/node/n1/cpu");
        assert_eq!(ObservedKey::instance("n1", "web-0", "state").unwrap().as_str(), "observed/node/n1/instance/web-0/state");
        for rest in ["", "/", "../n2/cpu", "instance//state", "./x", "a/.."] {
            assert!(ObservedKey::new("n1", rest).is_err(), "{rest}");
        }
        // Names with a slash cannot smuggle a key out either.
        assert!(ObservedKey::new("../../desired", "cpu").is_err());
        assert!(ObservedKey::new("n1/../n2", "cpu").is_err());
        assert!(ObservedKey::instance("n1", "web-0", "").is_err());
        assert!(ObservedKey::instance("n1", "../../n2/instance/x", "state").is_err());
        assert!(ObservedKey::parse("n1", "observed/node/n1/instance/web-0/state").is_ok());
        for other in ["observed/node/n2/cpu", "desired/service/web/image", "observed/node/n10/cpu", "observed/instance/web-0/state"] {
            assert!(ObservedKey::parse("n1", other).is_err(), "{other}");
        }
    }
}
