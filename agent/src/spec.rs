//! What the agent should run, read from its node's view and nothing else
//! (etcd holds it to these prefixes; `ccattler_store::layout`):
//! `placement/node/N/I = S` (what is placed here), `effective/node/N/…` (each
//! instance's image, port, config, granted secrets, volumes and probes) and
//! `secret/node/N/X` (secret values sealed to this node's key, opened here,
//! in memory only). All three are read at one revision.

use crate::probe::Method;
use ccattler_store::seal::{NodeKey, Plain};
use ccattler_store::{etcd, layout};
use etcd_client::Client;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    pub service: String,
    pub image: Option<String>,
    pub config: BTreeMap<String, String>,
    /// Granted secrets: name → (the tag of the value the instance's template
    /// pins — `ccattler secret set` tags a value with the revision it was
    /// stored at; a value without a tag goes by the version it was sealed at
    /// — and the version of the copy sealed to this node), None while the
    /// controller has not sealed it to this node yet, or it does not open.
    pub secrets: BTreeMap<String, Option<(String, i64)>>,
    pub volumes: BTreeMap<String, VolumeSpec>,
    pub probes: BTreeMap<String, ProbeSpec>,
    /// The version of the template pinned for it (rules/rollout.rules): the
    /// agent reports the version it runs, so a rollout knows when an
    /// instance runs its new template.
    pub version: Option<i64>,
    /// What it asks for (`request/cpu` in millicores, `request/memory` in
    /// MiB): the agent enforces them as its cgroup's limits.
    pub requests: crate::confine::Limits,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    pub mount: String,
    pub persistent: bool,
    pub size_gib: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The method, or why it is unusable.
    pub method: Result<Method, String>,
    pub interval: Duration,
}

/// The default probe interval (`desired/probe/S/P/interval`, seconds, overrides it).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Secret values opened with this node's key: name → (version, value).
pub type Secrets = BTreeMap<String, (i64, Plain)>;

/// Everything placed on the node: instance specs and the secrets they use.
#[derive(Default)]
pub struct Wanted {
    pub instances: BTreeMap<String, InstanceSpec>,
    pub secrets: Secrets,
}

/// Every key under `p` at `rev` (its prefix cut off), read in pages: a view
/// of any size is read, each response under etcd's message limit.
async fn prefix(client: &mut Client, p: &str, rev: i64) -> Result<Vec<(String, String)>, etcd_client::Error> {
    let mut out = Vec::new();
    etcd::read_pages(client, &[p.to_string()], VIEW_PAGE, rev, |kvs| {
        out.extend(kvs.into_iter().filter_map(|(k, h)| Some((k.strip_prefix(p)?.to_string(), h.value))));
        true
    })
    .await?;
    Ok(out)
}

/// Keys in the first page of a view prefix (later pages are sized by bytes).
const VIEW_PAGE: i64 = 500;

/// Reads the node's view at one revision (the revision of a first read of
/// its placements), each prefix in pages.
pub async fn read(client: &mut Client, node: &str, key: &NodeKey) -> Result<Wanted, etcd_client::Error> {
    let placed_prefix = layout::placement_prefix(node);
    let rev = etcd::revision_reading(client, &placed_prefix).await?;
    let placed = prefix(client, &placed_prefix, rev).await?;
    let view = prefix(client, &layout::view_prefix(node), rev).await?;
    let sealed = prefix(client, &layout::secret_prefix(node), rev).await?;
    Ok(assemble(placed, view, sealed, key))
}

/// Builds the specs from the three prefixes' keys (each with its prefix cut off).
pub fn assemble(placed: Vec<(String, String)>, view: Vec<(String, String)>, sealed: Vec<(String, String)>, key: &NodeKey) -> Wanted {
    let mut secrets = Secrets::new();
    for (name, value) in sealed {
        match key.open(&name, &value) {
            Ok(opened) => {
                secrets.insert(name, opened);
            }
            // Sealed to an old key of ours, or damaged: it is sealed again by
            // the controller once it sees our public key. Never logged whole.
            Err(e) => tracing::warn!(secret = %name, error = %e, "a sealed secret does not open; waiting for it to be sealed again"),
        }
    }
    let mut instances: BTreeMap<String, InstanceSpec> = BTreeMap::new();
    for (instance, service) in placed {
        if layout_name(&instance) {
            let spec = InstanceSpec {
                service,
                image: None,
                config: BTreeMap::new(),
                secrets: BTreeMap::new(),
                volumes: BTreeMap::new(),
                probes: BTreeMap::new(),
                version: None,
                requests: crate::confine::Limits::default(),
            };
            instances.insert(instance, spec);
        }
    }
    // Volume facts of the node: volume → (size, persistent).
    let mut volume_facts: BTreeMap<String, (Option<i64>, bool)> = BTreeMap::new();
    let mut probe_fields: BTreeMap<(String, String), (Option<String>, Option<String>)> = BTreeMap::new();
    for (k, v) in view {
        let parts: Vec<&str> = k.split('/').collect();
        match parts.as_slice() {
            ["volume", vol, "size"] => volume_facts.entry(vol.to_string()).or_default().0 = v.parse().ok(),
            ["volume", vol, "persistent"] => volume_facts.entry(vol.to_string()).or_default().1 = v == "true",
            ["instance", i, rest @ ..] => {
                let Some(spec) = instances.get_mut(*i) else { continue }; // not (or no longer) placed here
                match rest {
                    ["image"] => spec.image = Some(v),
                    ["version"] => spec.version = v.parse().ok(),
                    // A request that is not a positive number is no limit.
                    ["request", "cpu"] => spec.requests.cpu_millicores = v.parse().ok().filter(|n: &i64| *n > 0),
                    ["request", "memory"] => spec.requests.memory_mib = v.parse().ok().filter(|n: &i64| *n > 0),
                    ["config", key] => {
                        spec.config.insert(key.to_string(), v);
                    }
                    ["secret", name] => {
                        let pinned = secrets.get(*name).map(|(sealed_at, _)| (if v.is_empty() { sealed_at.to_string() } else { v.clone() }, *sealed_at));
                        spec.secrets.insert(name.to_string(), pinned);
                    }
                    ["volume", vol] => {
                        spec.volumes.insert(vol.to_string(), VolumeSpec { mount: v, persistent: false, size_gib: None });
                    }
                    ["probe", p, "method"] => probe_fields.entry((i.to_string(), p.to_string())).or_default().0 = Some(v),
                    ["probe", p, "interval"] => probe_fields.entry((i.to_string(), p.to_string())).or_default().1 = Some(v),
                    _ => {} // service, port, and fields a newer controller may add
                }
            }
            _ => {}
        }
    }
    for spec in instances.values_mut() {
        for (name, vs) in spec.volumes.iter_mut() {
            if let Some((size, persistent)) = volume_facts.get(name) {
                vs.size_gib = *size;
                vs.persistent = *persistent;
            }
        }
    }
    for ((i, p), (method, interval)) in probe_fields {
        let Some(method) = method else { continue };
        let interval = interval.and_then(|s| s.parse::<u64>().ok()).filter(|s| *s > 0).map_or(PROBE_INTERVAL, Duration::from_secs);
        let method = method.parse::<Method>().map_err(|e| e.to_string());
        if let Some(spec) = instances.get_mut(&i) {
            spec.probes.insert(p, ProbeSpec { method, interval });
        }
    }
    // Only the secrets some instance here is granted are kept in memory.
    secrets.retain(|name, _| instances.values().any(|s| s.secrets.contains_key(name)));
    Wanted { instances, secrets }
}

fn layout_name(s: &str) -> bool {
    ccattler_parser::pattern::is_valid_name(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_node_view_becomes_specs_with_opened_secrets() {
        let dir = std::env::temp_dir().join(format!("ccattler-spec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = NodeKey::load_or_create(&dir.join("node.key")).unwrap();
        let other = NodeKey::load_or_create(&dir.join("other.key")).unwrap();
        let sealed = ccattler_store::seal::seal_to_node(&key.public(), "db", b"hunter2", 7).unwrap();
        let stale = ccattler_store::seal::seal_to_node(&other.public(), "api", b"x", 3).unwrap();
        let w = assemble(
            kv(&[("web-0", "web"), ("Bad/x", "web")]),
            kv(&[
                ("instance/web-0/image", "builtin:http"),
                ("instance/web-0/config/LOG", "debug"),
                ("instance/web-0/secret/db", ""),
                ("instance/web-0/secret/api", ""),
                ("instance/web-0/volume/data", "/data"),
                ("instance/web-0/probe/readiness/method", "http:/healthz"),
                ("instance/web-0/probe/readiness/interval", "5"),
                ("instance/web-0/probe/liveness/method", "ping"),
                ("instance/web-0/request/cpu", "250"),
                ("instance/web-0/request/memory", "-5"),
                ("instance/web-9/image", "elsewhere"),
                ("volume/data/size", "10"),
                ("volume/data/persistent", "true"),
            ]),
            kv(&[("db", &sealed), ("api", &stale), ("unused", &sealed)]),
            &key,
        );
        assert_eq!(w.instances.keys().collect::<Vec<_>>(), ["web-0"]);
        let s = &w.instances["web-0"];
        assert_eq!(s.image.as_deref(), Some("builtin:http"));
        assert_eq!(s.config["LOG"], "debug");
        // An untagged value goes by the version it was sealed at.
        assert_eq!(s.secrets, BTreeMap::from([("api".to_string(), None), ("db".to_string(), Some(("7".to_string(), 7)))]));
        assert_eq!(s.volumes["data"], VolumeSpec { mount: "/data".into(), persistent: true, size_gib: Some(10) });
        assert_eq!(s.probes["readiness"], ProbeSpec { method: Ok(Method::Http("/healthz".into())), interval: Duration::from_secs(5) });
        assert_eq!(s.requests, crate::confine::Limits { cpu_millicores: Some(250), memory_mib: None, pids: None }, "a negative request is no limit");
        assert!(s.probes["liveness"].method.as_ref().unwrap_err().contains("\"ping\""));
        assert_eq!(w.secrets.keys().collect::<Vec<_>>(), ["db"], "only granted secrets that open are kept");
        assert_eq!(w.secrets["db"].1.as_slice(), b"hunter2");
        // A tagged value goes by the tag its instance's template pins.
        let w = assemble(
            kv(&[("web-0", "web")]),
            kv(&[("instance/web-0/image", "builtin:http"), ("instance/web-0/secret/db", "v-1a2b")]),
            kv(&[("db", &sealed)]),
            &key,
        );
        assert_eq!(w.instances["web-0"].secrets["db"], Some(("v-1a2b".to_string(), 7)));
    }

    #[test]
    fn a_record_of_an_agent_before_pinned_versions_is_still_read() {
        let old = r#"{"image":"builtin:http","config":{},"secrets":{"db":7},"volumes":{}}"#;
        let l: crate::runtime::Launch = serde_json::from_str(old).unwrap();
        assert_eq!(l.secrets["db"], "7");
    }
}
