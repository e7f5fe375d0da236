//! Placement constraints hold on random clusters: nodes in zones with cpu,
//! memory and sometimes gpus, some tainted; services with requests, some
//! spread by zone with a max skew, some tolerating taints, some with
//! priorities, all pending at once. After the round, checked by a checker
//! that shares no code with the rules (it reads the facts as text):
//! no node holds more of any resource than it has, no instance sits on a
//! taint its service does not tolerate, and every hard spread's zones
//! differ by at most its max skew — counted over the zones of every node the
//! service may use.

use ccattler_engine::facts::Derived;
use ccattler_engine::Session;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn program() -> Arc<ccattler_parser::Program> {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[std::path::PathBuf::from(rules)]).unwrap();
    assert_eq!(checked.errors(), 0, "{}", checked.render());
    Arc::new(checked.program.unwrap())
}

#[derive(Clone, Debug)]
struct Node {
    cpu: i64,
    memory: i64,
    gpu: i64,
    zone: Option<u8>,
    /// A `dedicated=V` taint: (value, NoSchedule or NoExecute).
    taint: Option<(u8, bool)>,
}

#[derive(Clone, Debug)]
struct Service {
    cpu: i64,
    memory: i64,
    gpu: i64,
    count: u32,
    max_skew: Option<u8>,
    /// Tolerates `dedicated=V` (or any value).
    tolerates: Option<Option<u8>>,
    priority: i8,
}

fn node() -> impl Strategy<Value = Node> {
    (
        prop_oneof![Just(1000i64), Just(2000), 100i64..5000],
        prop_oneof![Just(1000i64), 100i64..5000],
        prop_oneof![4 => Just(0i64), 1 => 1i64..4],
        prop_oneof![5 => (0u8..3).prop_map(Some), 1 => Just(None)],
        prop_oneof![3 => Just(None), 1 => (0u8..2, any::<bool>()).prop_map(Some)],
    )
        .prop_map(|(cpu, memory, gpu, zone, taint)| Node { cpu, memory, gpu, zone, taint })
}

fn service() -> impl Strategy<Value = Service> {
    (
        0i64..800,
        0i64..800,
        prop_oneof![4 => Just(0i64), 1 => 1i64..3],
        0u32..8,
        prop_oneof![2 => Just(None), 1 => (1u8..3).prop_map(Some)],
        prop_oneof![2 => Just(None), 1 => prop_oneof![Just(None), (0u8..2).prop_map(Some)].prop_map(Some)],
        -2i8..3,
    )
        .prop_map(|(cpu, memory, gpu, count, max_skew, tolerates, priority)| Service { cpu, memory, gpu, count, max_skew, tolerates, priority })
}

fn facts(nodes: &[Node], services: &[Service]) -> Vec<(String, Option<String>)> {
    let mut f = Vec::new();
    let mut put = |k: String, v: String| f.push((k, Some(v)));
    for (i, n) in nodes.iter().enumerate() {
        let k = |x: &str| format!("observed/node/node-{i}/{x}");
        put(k("cpu"), n.cpu.to_string());
        put(k("memory"), n.memory.to_string());
        put(k("alive"), "1".into());
        put(k("heartbeat"), "0".into());
        if n.gpu > 0 {
            put(k("resource/gpu"), n.gpu.to_string());
        }
        if let Some(z) = n.zone {
            put(format!("desired/node/node-{i}/label/zone"), format!("z{z}"));
        }
        if let Some((v, execute)) = n.taint {
            put(format!("desired/node/node-{i}/taint/dedicated"), format!("v{v}{}", if execute { ":NoExecute" } else { "" }));
        }
    }
    for (i, s) in services.iter().enumerate() {
        let k = |x: &str| format!("desired/service/s{i}/{x}");
        put(k("cpu"), s.cpu.to_string());
        put(k("memory"), s.memory.to_string());
        if s.gpu > 0 {
            put(k("resource/gpu"), s.gpu.to_string());
        }
        if let Some(m) = s.max_skew {
            put(k("spread/by"), "zone".into());
            put(k("spread/max_skew"), m.to_string());
        }
        match s.tolerates {
            Some(Some(v)) => put(k("toleration/dedicated"), format!("v{v}")),
            Some(None) => put(k("toleration/dedicated"), "*".into()),
            None => {}
        }
        if s.priority != 0 {
            put(k("priority"), s.priority.to_string());
        }
        put(format!("intent/user/service/s{i}/instances"), s.count.to_string());
    }
    f
}

/// The checker: the placements as text, judged by the generated cluster.
fn check(nodes: &[Node], services: &[Service], derived: &BTreeMap<String, Derived>) -> Result<(), String> {
    let tolerated = |s: &Service, n: &Node| match (n.taint, s.tolerates) {
        (None, _) => true,
        (Some(_), Some(None)) => true,
        (Some((v, _)), Some(Some(t))) => v == t,
        (Some(_), None) => false,
    };
    let mut used = vec![(0i64, 0i64, 0i64); nodes.len()];
    let mut zones: BTreeMap<usize, BTreeMap<u8, i64>> = BTreeMap::new();
    for (k, node) in derived.range("placement/instance/".to_string()..).take_while(|(k, _)| k.starts_with("placement/instance/")) {
        let inst = &k["placement/instance/".len()..];
        let si: usize = inst[1..inst.rfind('-').ok_or("odd id")?].parse().map_err(|_| format!("odd id {inst}"))?;
        let ni: usize = node["node-".len()..].parse().map_err(|_| format!("odd node {node}"))?;
        let (s, n) = (&services[si], &nodes[ni]);
        if !tolerated(s, n) {
            return Err(format!("{inst} on {node}, whose taint {:?} s{si} does not tolerate", n.taint));
        }
        let u = &mut used[ni];
        *u = (u.0 + s.cpu, u.1 + s.memory, u.2 + s.gpu);
        if s.max_skew.is_some() {
            let z = n.zone.ok_or_else(|| format!("{inst} of a zone-spread service on {node}, which has no zone"))?;
            *zones.entry(si).or_default().entry(z).or_default() += 1;
        }
    }
    for (i, (n, u)) in nodes.iter().zip(&used).enumerate() {
        if u.0 > n.cpu || u.1 > n.memory || u.2 > n.gpu {
            return Err(format!("node-{i} holds {u:?} of ({}, {}, {})", n.cpu, n.memory, n.gpu));
        }
    }
    for (si, s) in services.iter().enumerate() {
        let Some(m) = s.max_skew else { continue };
        // Every zone of a node the service may use counts, full or not.
        let eligible: BTreeSet<u8> = nodes.iter().filter(|n| tolerated(s, n)).filter_map(|n| n.zone).collect();
        let counts = zones.remove(&si).unwrap_or_default();
        let per: Vec<i64> = eligible.iter().map(|z| counts.get(z).copied().unwrap_or(0)).collect();
        if let (Some(lo), Some(hi)) = (per.iter().min(), per.iter().max()) {
            if hi - lo > m as i64 {
                return Err(format!("s{si} spread over zones {eligible:?} as {per:?}, over max_skew {m}"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_constraints_never_overcommit_break_a_taint_or_a_skew(
        nodes in proptest::collection::vec(node(), 1..8),
        services in proptest::collection::vec(service(), 1..6),
    ) {
        let mut session = Session::new(program(), 1).unwrap();
        session.write(&facts(&nodes, &services)).unwrap();
        if let Err(e) = check(&nodes, &services, session.derived()) {
            prop_assert!(false, "{e}\nnodes: {nodes:?}\nservices: {services:?}");
        }
    }
}
