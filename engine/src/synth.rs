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
