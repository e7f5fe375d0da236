//! The read-only web console (`ccattler controller --ui`): static assets
//! embedded in the binary (plain HTML, CSS and JavaScript modules — no build
//! step, nothing fetched at run time), the cluster's tables from the
//! controller's warm state (no second etcd reader), a server-sent-event
//! stream of them, the rules it runs, and `/explain` for any key.
//!
//! The loop ([`crate::controller`]) recounts the tables at most every
//! [`EVERY`] from the keys it holds (the same tables `ccattler status` reads
//! from etcd: [`crate::view`]) and publishes them through a watch channel;
//! every open page gets each new state once.

use crate::view::{Cluster, View};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How often the console's tables are recounted at most.
pub const EVERY: Duration = Duration::from_secs(1);

/// The loop spends at most this share of its time on what it recounts from
/// scratch (copying for the console, the cluster gauges: `Recount`): a count
/// that took 50 ms waits at least 50 ms × this before the next.
pub const LOOP_SHARE_INVERSE: u32 = 10;

/// What a page shows, at one revision.
#[derive(Debug, Default, serde::Serialize)]
pub struct State {
    pub revision: u64,
    /// summary, nodes (wide), services (wide), pending, rollouts.
    pub tables: Vec<serde_json::Value>,
    /// Blocked and rejected keys, and conflicts, with why.
    pub problems: Vec<(String, String, String)>,
}

/// The rule files the controller runs, for the rules page.
#[derive(Debug, Default, serde::Serialize)]
pub struct Rules {
    pub files: Vec<(String, String)>,
    /// Output keys each output relation holds now, by relation name.
    pub outputs: BTreeMap<String, usize>,
}

/// What the tables are counted from, copied out of the reconciler in the
/// loop (the copy is the loop's whole share; the counting runs beside it).
pub struct Copied {
    revision: u64,
    /// Unsorted: the map is built beside the loop, not in it.
    kv: Vec<(String, String)>,
    problems: Vec<(String, String, String)>,
}

/// Copies the keys the tables read, and the problems, out of the reconciler.
pub fn copy(r: &crate::Reconciler) -> Copied {
    let mut kv: Vec<(String, String)> = Vec::new();
    // Only what the console's tables read: not the per-instance reports
    // under observed/node/N/instance/, and of each instance's effective keys
    // only its service and state (the copy is the loop's cost).
    for prefix in ["desired/node/", "intent/", "observed/node/", "placement/instance/"] {
        for (k, f) in r.inputs.facts.with_prefix(prefix) {
            if prefix == "observed/node/" && k.split('/').nth(3) == Some("instance") {
                continue;
            }
            kv.push((k.clone(), f.value.clone()));
        }
    }
    let resolved = &r.outputs.resolved;
    for prefix in ["effective/service/", "effective/instance/", "placement/", "endpoint/", "status/unplaced/", "status/rollout/"] {
        for (k, v) in resolved.range(prefix.to_string()..).take_while(|(k, _)| k.starts_with(prefix)) {
            if prefix == "effective/instance/" && !(k.ends_with("/service") || k.ends_with("/state")) {
                continue;
            }
            kv.push((k.clone(), v.to_string()));
        }
    }
    // Node states only, not the node views under the same prefix.
    for (k, v) in resolved.range("effective/node/".to_string()..).take_while(|(k, _)| k.starts_with("effective/node/")) {
        if k.ends_with("/state") && k.matches('/').count() == 3 {
            kv.push((k.clone(), v.to_string()));
        }
    }
    let mut problems: Vec<(String, String, String)> = r.blocked().map(|(k, why)| ("blocked".into(), k.clone(), why.clone())).collect();
    problems.extend(r.inputs.rejected.iter().map(|(k, why)| ("rejected".into(), k.clone(), why.clone())));
    problems.extend(r.outputs.conflicts.keys().map(|k| ("conflict".into(), k.clone(), "two rules give it two values (ccattler explain)".into())));
    Copied { revision: r.revision(), kv, problems }
}

/// Counts the tables (off the loop: `spawn_blocking`).
pub fn count(c: Copied) -> State {
    let cluster = Cluster::of(c.kv.into_iter().collect());
    let mut tables = vec![cluster.summary().json()];
    for view in [View::Nodes, View::Services, View::Pending, View::Rollouts] {
        tables.extend(cluster.tables(Some(view), true).iter().map(|t| t.json()));
    }
    State { revision: c.revision, tables, problems: c.problems }
}

/// The rules page's content.
pub fn rules(r: &crate::Reconciler) -> Rules {
    let program = r.program();
    let files = program.sources.ids().map(|id| (program.sources.name(id).to_string(), program.sources.text(id).to_string())).collect();
    let mut outputs = BTreeMap::new();
    for (_, rel) in program.outputs() {
        let Some(p) = &rel.pattern else { continue };
        let prefix = p.prefix();
        let n = r
            .outputs
            .resolved
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix.as_str()))
            .filter(|(k, _)| p.match_key(k).is_some())
            .count();
        outputs.insert(rel.name.clone(), n);
    }
    Rules { files, outputs }
}

/// What the HTTP server reads: the newest state and rules, and who may look.
pub struct Console {
    pub state: tokio::sync::watch::Sender<Arc<State>>,
    pub rules: tokio::sync::watch::Sender<Arc<Rules>>,
    /// `NAME:PASSWORD` lines a browser must present (HTTP basic auth), if any.
    pub users: Vec<(String, String)>,
    /// A count is running beside the loop: the next waits for it.
    pub counting: std::sync::atomic::AtomicBool,
}

impl Console {
    pub fn new(users: Vec<(String, String)>) -> Console {
        Console {
            state: tokio::sync::watch::channel(Arc::new(State::default())).0,
            rules: tokio::sync::watch::channel(Arc::new(Rules::default())).0,
            users,
            counting: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether an `Authorization` header lets its bearer look.
    pub fn admits(&self, authorization: Option<&str>) -> bool {
        use base64::Engine as _;
        if self.users.is_empty() {
            return true;
        }
        let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else { return false };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else { return false };
        let Ok(text) = String::from_utf8(decoded) else { return false };
        let Some((user, password)) = text.split_once(':') else { return false };
        // Every entry is compared, so timing says nothing about which one.
        self.users.iter().fold(false, |ok, (u, p)| ok | (constant_eq(u, user) & constant_eq(p, password)))
    }
}

fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The page and its assets, embedded.
pub const INDEX_HTML: &str = include_str!("ui/index.html");
pub const APP_JS: &str = include_str!("ui/app.js");
pub const APP_CSS: &str = include_str!("ui/app.css");

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn basic(text: &[u8]) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(text))
    }

    #[test]
    fn the_gate_admits_only_a_listed_name_with_its_own_password() {
        let c = Console::new(vec![("ops".into(), "pw-1".into()), ("dev".into(), "pw-2".into())]);
        assert!(c.admits(Some(&basic(b"ops:pw-1"))));
        assert!(c.admits(Some(&basic(b"dev:pw-2"))));
        for refused in [
            None,
            Some(basic(b"ops:pw-2")),               // another user's password
            Some(basic(b"ops:pw-1x")),              // a longer one
            Some(basic(b"ops:")),                   // none
            Some(basic(b"ops")),                    // no colon
            Some(basic(b":pw-1")),                  // no name
            Some(basic(b"ops:pw-1\n")),             // a trailing newline
            Some(basic(&[0xff, 0xfe, b':', b'x'])), // not UTF-8
            Some("Basic !!!not-base64".into()),
            Some("Bearer pw-1".into()),
            Some(String::new()),
        ] {
            assert!(!c.admits(refused.as_deref()), "{refused:?}");
        }
    }

    #[test]
    fn without_users_the_console_is_open_as_on_a_cluster_without_auth() {
        assert!(Console::new(Vec::new()).admits(None));
    }
}
