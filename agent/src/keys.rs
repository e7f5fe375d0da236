//! The agent's write boundary. Everything the agent writes to etcd is an
//! [`ObservedKey`], and the only way to make one checks that it lies under
//! `observed/`: the agent cannot be told to write anywhere else. (etcd auth
//! enforces the same boundary at the server; this is the agent's own half.)

use std::fmt;

pub const OBSERVED: &str = "observed/";

/// A key under `observed/`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObservedKey(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the agent writes only under observed/, not {key:?}")]
pub struct OutsideObserved {
    pub key: String,
}

impl ObservedKey {
    /// `observed/<rest>`; refuses anything that would escape the prefix.
    pub fn new(key: impl Into<String>) -> Result<Self, OutsideObserved> {
        let key = key.into();
        let rest = key.strip_prefix(OBSERVED).unwrap_or("");
        // Segments come from names (node, instance, label, probe); an empty
        // or dot segment would make a key other readers cannot match.
        let clean = !rest.is_empty() && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
        if !clean {
            return Err(OutsideObserved { key });
        }
        Ok(ObservedKey(key))
    }

    /// `observed/node/<node>/<field>`
    pub fn node(node: &str, field: &str) -> Result<Self, OutsideObserved> {
        Self::new(format!("{OBSERVED}node/{node}/{field}"))
    }

    /// `observed/instance/<instance>/<field>`
    pub fn instance(instance: &str, field: &str) -> Result<Self, OutsideObserved> {
        Self::new(format!("{OBSERVED}instance/{instance}/{field}"))
    }

    /// `observed/probe_state/<instance>/<probe>`
    pub fn probe(instance: &str, probe: &str) -> Result<Self, OutsideObserved> {
        Self::new(format!("{OBSERVED}probe_state/{instance}/{probe}"))
    }

    /// `observed/volume/<volume>/<field>`
    pub fn volume(volume: &str, field: &str) -> Result<Self, OutsideObserved> {
        Self::new(format!("{OBSERVED}volume/{volume}/{field}"))
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
    fn only_observed_keys_can_be_made() {
        assert!(ObservedKey::new("observed/node/n1/cpu").is_ok());
        for bad in [
            "desired/service/web/image",
            "intent/user/service/web/instances",
            "placement/instance/web-0",
            "effective/node/n1/state",
            "observed/",
            "observed",
            "observed/../desired/x",
            "observed/node//cpu",
            "xobserved/node/n1/cpu",
        ] {
            assert_eq!(ObservedKey::new(bad), Err(OutsideObserved { key: bad.into() }), "{bad}");
        }
        // Names with a slash cannot smuggle a key out either.
        assert!(ObservedKey::node("../../desired", "cpu").is_err());
        assert!(ObservedKey::instance("web-0", "").is_err());
    }
}
