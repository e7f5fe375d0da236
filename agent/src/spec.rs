//! What the agent should run, read from etcd: the instances placed on its
//! node (`placement/node/N/`) and, for each, what the rules published for it
//! (`effective/service/S/…`, `effective/instance/I/…`, `effective/volume/V/…`)
//! and what users declared about it (`desired/probe/S/…`,
//! `desired/volume/V/persistent`, secret values under `secret/`).

use crate::probe::Method;
use etcd_client::{Client, GetOptions};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    pub service: String,
    pub image: Option<String>,
    pub config: BTreeMap<String, String>,
    /// secret name → value
    pub secrets: BTreeMap<String, String>,
    pub volumes: BTreeMap<String, VolumeSpec>,
    pub probes: BTreeMap<String, ProbeSpec>,
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

async fn prefix(client: &mut Client, p: &str) -> Result<Vec<(String, String)>, etcd_client::Error> {
    let resp = client.get(p, Some(GetOptions::new().with_prefix())).await?;
    Ok(resp.kvs().iter().filter_map(|kv| Some((kv.key_str().ok()?.strip_prefix(p)?.to_string(), kv.value_str().ok()?.to_string()))).collect())
}

async fn value(client: &mut Client, key: &str) -> Result<Option<String>, etcd_client::Error> {
    let resp = client.get(key, None).await?;
    Ok(resp.kvs().first().and_then(|kv| kv.value_str().ok()).map(str::to_string))
}

/// Every instance placed on `node`, with its spec.
pub async fn read(client: &mut Client, node: &str) -> Result<BTreeMap<String, InstanceSpec>, etcd_client::Error> {
    let placed = prefix(client, &format!("placement/node/{node}/")).await?;
    let mut services: BTreeMap<String, (Option<String>, BTreeMap<String, ProbeSpec>)> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (instance, service) in placed {
        if instance.contains('/') {
            continue;
        }
        if !services.contains_key(&service) {
            let fields = prefix(client, &format!("effective/service/{service}/")).await?;
            let image = fields.iter().find(|(k, _)| k == "image").map(|(_, v)| v.clone());
            let probes = probes(prefix(client, &format!("desired/probe/{service}/")).await?);
            services.insert(service.clone(), (image, probes));
        }
        let (image, probes) = services[&service].clone();
        let mut spec = InstanceSpec { service, image, config: BTreeMap::new(), secrets: BTreeMap::new(), volumes: BTreeMap::new(), probes };
        for (k, v) in prefix(client, &format!("effective/instance/{instance}/")).await? {
            if let Some(key) = k.strip_prefix("config/") {
                spec.config.insert(key.into(), v);
            } else if let Some(name) = k.strip_prefix("secret/") {
                let secret = value(client, &format!("secret/{name}")).await?.unwrap_or_default();
                spec.secrets.insert(name.into(), secret);
            } else if let Some(vol) = k.strip_prefix("volume/") {
                let persistent = value(client, &format!("desired/volume/{vol}/persistent")).await?.as_deref() == Some("true");
                let size_gib = value(client, &format!("effective/volume/{vol}/size")).await?.and_then(|s| s.parse().ok());
                spec.volumes.insert(vol.into(), VolumeSpec { mount: v, persistent, size_gib });
            }
        }
        out.insert(instance, spec);
    }
    Ok(out)
}

/// `P/method` and `P/interval` entries → probes by name.
fn probes(fields: Vec<(String, String)>) -> BTreeMap<String, ProbeSpec> {
    let mut out = BTreeMap::new();
    for (k, v) in &fields {
        let Some(name) = k.strip_suffix("/method") else { continue };
        let interval = fields
            .iter()
            .find(|(k, _)| k.strip_suffix("/interval") == Some(name))
            .and_then(|(_, v)| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map_or(PROBE_INTERVAL, Duration::from_secs);
        let method = v.parse::<Method>().map_err(|e| e.to_string());
        out.insert(name.to_string(), ProbeSpec { method, interval });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_with_intervals_and_bad_methods() {
        let p = probes(vec![
            ("readiness/method".into(), "http:/healthz".into()),
            ("readiness/interval".into(), "5".into()),
            ("liveness/method".into(), "ping".into()),
        ]);
        assert_eq!(p["readiness"], ProbeSpec { method: Ok(Method::Http("/healthz".into())), interval: Duration::from_secs(5) });
        assert_eq!(p["liveness"].interval, PROBE_INTERVAL);
        assert!(p["liveness"].method.as_ref().unwrap_err().contains("\"ping\""));
    }
}
