//! A synthetic, converged cluster for benchmarks: nodes with capacity, labels,
//! leases and fresh heartbeats; services with intents, requests, a probe and config; instances
//! placed within capacity, observed running and healthy.

/// Sizes of the generated cluster.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub nodes: usize,
    pub services: usize,
    pub instances: usize,
    /// Zones nodes are spread over (label `zone`).
    pub zones: usize,
    /// Percent of services spread by zone with max_skew 1 (`spread/by`).
    pub spread_pct: usize,
    /// Percent of nodes tainted `dedicated=batch` (NoSchedule), and of
    /// services that tolerate it.
    pub taint_pct: usize,
}

impl Default for Params {
    fn default() -> Self {
        Params { nodes: 5_000, services: 1_000, instances: 150_000, zones: 3, spread_pct: 0, taint_pct: 0 }
    }
}

impl Params {
    /// `--nodes --services --instances` from the command line, defaults otherwise.
    pub fn from_args() -> Params {
        let d = Params::default();
        Params {
            nodes: arg("--nodes").unwrap_or(d.nodes),
            services: arg("--services").unwrap_or(d.services),
            instances: arg("--instances").unwrap_or(d.instances),
            zones: d.zones,
            spread_pct: arg("--spread-pct").unwrap_or(d.spread_pct),
            taint_pct: arg("--taint-pct").unwrap_or(d.taint_pct),
        }
    }

    /// The same cluster with a share of services spread by zone and a share
    /// of nodes tainted (and services tolerating them).
    pub fn constrained(self, spread_pct: usize, taint_pct: usize) -> Params {
        Params { spread_pct, taint_pct, ..self }
    }

    pub fn is_tainted(&self, n: usize) -> bool {
        n % 100 < self.taint_pct
    }
    pub fn is_spread(&self, s: usize) -> bool {
        s % 100 < self.spread_pct
    }
    pub fn tolerates(&self, s: usize) -> bool {
        s % 100 >= 100 - self.taint_pct.min(100)
    }
}

/// The value after `name` on the command line, parsed (for the benchmarks).
pub fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

pub const NODE_CPU: i64 = 64_000;
pub const NODE_MEMORY: i64 = 131_072;

pub fn node_name(n: usize) -> String {
    format!("node-{n}")
}
pub fn service_name(s: usize) -> String {
    format!("svc-{s}")
}

/// Instances per service (the first `instances % services` get one more).
pub fn instances_of(p: &Params, s: usize) -> usize {
    p.instances / p.services + usize::from(s < p.instances % p.services)
}

/// The cluster clock (`status/clock`) of the synthetic cluster: every node's
/// agent last beat with this reading.
pub const SYNTH_CLOCK: i64 = 1_000_000;

/// Node `n`'s address, which its agent also reports for every instance there.
pub fn node_address(n: usize) -> String {
    format!("10.{}.{}.{}", n / 65536, (n / 256) % 256, n % 256)
}

pub fn node_facts(n: usize, zones: usize) -> Vec<(String, String)> {
    let k = |f: &str| format!("observed/node/{}/{f}", node_name(n));
    vec![
        (k("cpu"), NODE_CPU.to_string()),
        (k("memory"), NODE_MEMORY.to_string()),
        (k("address"), node_address(n)),
        (k("alive"), format!("{}", 7_000_000 + n)),
        (k("heartbeat"), SYNTH_CLOCK.to_string()),
        // The benches' simulated agents never beat again: a day's grace keeps
        // their nodes ready while a controller advances the cluster clock
        // (with 30 s, every node went unreachable half-way through the
        // bridge bench's write-back and everything was re-placed).
        (k("ttl"), "86400".into()),
        // The operator's labels: what selectors and spreads match.
        (format!("desired/node/{}/label/zone", node_name(n)), format!("z{}", n % zones.max(1))),
        (format!("desired/node/{}/label/rack", node_name(n)), format!("r{}", n / 40)),
    ]
}

/// Every fact of the converged cluster, as etcd would hold it.
pub fn cluster(p: &Params) -> Vec<(String, String)> {
    facts(p, true)
}

/// The same cluster before anything was placed: nodes and services only, so
/// every instance is pending at once.
pub fn unplaced(p: &Params) -> Vec<(String, String)> {
    facts(p, false)
}

fn facts(p: &Params, placed: bool) -> Vec<(String, String)> {
    let mut f = vec![("status/clock".to_string(), SYNTH_CLOCK.to_string())];
    for n in 0..p.nodes {
        f.extend(node_facts(n, p.zones));
        if p.is_tainted(n) {
            f.push((format!("desired/node/{}/taint/dedicated", node_name(n)), "batch".into()));
        }
    }
    let mut next_node = 0usize;
    for s in 0..p.services {
        let name = service_name(s);
        let count = instances_of(p, s);
        let d = |field: &str| format!("desired/service/{name}/{field}");
        f.push((d("image"), "builtin:http".into()));
        f.push((d("port"), "8080".into()));
        f.push((d("cpu"), (500 + 100 * (s % 5)).to_string()));
        f.push((d("memory"), (256 * (1 + s % 4)).to_string()));
        f.push((format!("desired/probe/{name}/readiness/method"), "http:/healthz".into()));
        f.push((format!("desired/config/{name}/LOG_LEVEL"), "info".into()));
        f.push((format!("intent/user/service/{name}/instances"), count.to_string()));
        f.push((format!("intent/autoscaler/service/{name}/instances"), (count / 2).to_string()));
        if p.is_spread(s) {
            f.push((d("spread/by"), "zone".into()));
            f.push((d("spread/max_skew"), "1".into()));
        }
        if p.tolerates(s) {
            f.push((d("toleration/dedicated"), "batch".into()));
        }
        for i in 0..count {
            if !placed {
                break;
            }
            let inst = format!("{name}-{i}");
            // Round-robin over nodes: at most ceil(instances/nodes) per node,
            // far inside capacity.
            let (node, address) = (node_name(next_node % p.nodes), node_address(next_node % p.nodes));
            next_node += 1;
            let o = |field: &str| format!("observed/node/{node}/instance/{inst}/{field}");
            f.push((o("service"), name.clone()));
            f.push((o("state"), "running".into()));
            f.push((o("health"), "healthy".into()));
            f.push((o("image"), "builtin:http".into()));
            f.push((o("ip"), address));
            f.push((o("port"), (20_000 + i % 40_000).to_string()));
            f.push((o("version"), "1".into()));
            f.push((format!("observed/node/{node}/probe_state/{inst}/readiness"), "healthy".into()));
            f.push((format!("placement/instance/{inst}"), node));
        }
    }
    f
}

/// What the synthetic cluster's simulated agents know: each node's services
/// (sorted) and every instance with its node.
#[derive(Clone, Debug)]
pub struct Layout {
    pub services_on: Vec<Vec<String>>,
    pub instances: Vec<(usize, String)>,
}

/// The layout of [`cluster`]'s facts over `nodes` nodes.
pub fn layout(nodes: usize, facts: &[(String, String)]) -> Layout {
    let mut services_on: Vec<std::collections::BTreeSet<String>> = vec![Default::default(); nodes];
    let mut instances = Vec::new();
    for (k, v) in facts {
        let Some((n, field)) = k.strip_prefix("observed/node/node-").and_then(|r| r.split_once('/')) else { continue };
        if let (Some(inst), Ok(n)) = (field.strip_prefix("instance/").and_then(|f| f.strip_suffix("/service")), n.parse::<usize>()) {
            services_on[n].insert(v.clone());
            instances.push((n, inst.to_string()));
        }
    }
    Layout { services_on: services_on.into_iter().map(|s| s.into_iter().collect()).collect(), instances }
}

/// The writes simulated agents make, one at a time, at whatever rate the
/// caller paces them (the rates of real agents: `benches/writes.rs`; the
/// stream of `benches/sustained.rs` and of the engine bench's `--stream`).
pub struct Agents {
    layout: Layout,
    /// A small xorshift: varied, not cryptographic.
    rng: u64,
    next_node: usize,
    unready: std::collections::BTreeSet<usize>,
}

impl Agents {
    pub fn new(layout: Layout, seed: u64) -> Agents {
        Agents { layout, rng: seed.max(1), next_node: 0, unready: Default::default() }
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n.max(1) as u64) as usize
    }

    /// The next node (round robin) beats with the cluster clock it read.
    pub fn beat(&mut self, clock: i64) -> (String, String) {
        self.next_node = (self.next_node + 1) % self.layout.services_on.len().max(1);
        (format!("observed/node/{}/heartbeat", node_name(self.next_node)), clock.to_string())
    }

    /// A random node's usage of one of its services (cpu or memory) past its
    /// dead band; none for a node that runs nothing.
    pub fn usage(&mut self) -> Option<(String, String)> {
        let n = self.below(self.layout.services_on.len());
        let at = self.below(self.layout.services_on.get(n)?.len());
        let s = self.layout.services_on[n].get(at)?.clone();
        let field = if self.below(2) == 0 { "cpu" } else { "memory" };
        Some((format!("observed/node/{}/usage/{s}/{field}", node_name(n)), (100 + self.below(400)).to_string()))
    }

    /// A random instance turns unhealthy, or healthy again: its health and
    /// its readiness probe's state (an agent writes both in one txn).
    pub fn flip(&mut self) -> [(String, String); 2] {
        let i = self.below(self.layout.instances.len());
        let state = if self.unready.remove(&i) {
            "healthy"
        } else {
            self.unready.insert(i);
            "unhealthy"
        };
        let (n, inst) = &self.layout.instances[i];
        let node = node_name(*n);
        [
            (format!("observed/node/{node}/instance/{inst}/health"), state.to_string()),
            (format!("observed/node/{node}/probe_state/{inst}/readiness"), state.to_string()),
        ]
    }
}

#[cfg(test)]
mod agents_tests {
    use super::*;

    #[test]
    fn agents_write_keys_of_the_cluster_and_a_flip_turns_back() {
        let p = Params { nodes: 4, services: 2, instances: 6, ..Params::default() };
        let facts = cluster(&p);
        let keys: std::collections::BTreeSet<&str> = facts.iter().map(|(k, _)| k.as_str()).collect();
        let lay = layout(p.nodes, &facts);
        assert_eq!(lay.instances.len(), 6);
        let mut a = Agents::new(lay, 7);
        let (beat, clock) = a.beat(42);
        assert!(keys.contains(beat.as_str()) && clock == "42", "{beat}");
        let (usage, _) = a.usage().expect("every node runs something here");
        assert!(usage.starts_with("observed/node/node-") && usage.contains("/usage/svc-"), "{usage}");
        // One instance, flipped twice: unhealthy, then healthy again.
        let mut one = Agents::new(Layout { services_on: vec![vec![]], instances: vec![(0, "svc-0-0".into())] }, 7);
        assert_eq!(one.flip()[0].1, "unhealthy");
        let [health, readiness] = one.flip();
        assert_eq!((health.1.as_str(), readiness.1.as_str()), ("healthy", "healthy"));
        assert_eq!(health.0, "observed/node/node-0/instance/svc-0-0/health");
        assert!(one.usage().is_none(), "a node that runs nothing has no usage");
    }
}
