//! No overcommit by any input: random small clusters on the shipped rules,
//! fed careless and hostile values (negative, zero, huge, not numbers, long
//! or odd names, NUL bytes), then hostile changes; after every step no
//! placement made in that step puts a node over its capacity. (A node whose
//! capacity is lowered under instances already there keeps them — placed
//! instances move only when their node fails — and is reported as over
//! capacity.) The checker here shares no code with the rules: it reads the
//! facts as text, with its own idea of a valid amount.

use ccattler_engine::facts::Derived;
use ccattler_engine::Session;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

fn program() -> Arc<ccattler_parser::Program> {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[std::path::PathBuf::from(rules)]).unwrap();
    assert_eq!(checked.errors(), 0, "{}", checked.render());
    Arc::new(checked.program.unwrap())
}

/// Amounts: mostly sensible, sometimes hostile.
fn amount() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (1i64..3000).prop_map(|n| n.to_string()),
        1 => Just("0".to_string()),
        1 => Just("-500".to_string()),
        1 => Just("9223372036854775807".to_string()),
        1 => Just("-9223372036854775808".to_string()),
        1 => Just("1e3".to_string()),
        1 => Just("three".to_string()),
        1 => Just(String::new()),
        1 => Just("12\u{0}34".to_string()),
        1 => Just("4000000000000".to_string()),
    ]
}

fn count() -> impl Strategy<Value = String> {
    prop_oneof![6 => (0u32..6).prop_map(|n| n.to_string()), 1 => Just("-1".to_string()), 1 => Just("1000000000".to_string()), 1 => Just("2.5".to_string())]
}

/// Service names, some of which are not names.
fn service() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-c]".prop_map(|s| format!("svc-{s}")),
        1 => Just("Web_1".to_string()),
        1 => Just("x".repeat(62)),
        1 => Just("a\u{7f}b".to_string()),
    ]
}

#[derive(Clone, Debug)]
struct Cluster {
    nodes: Vec<(String, String)>,
    services: Vec<(String, String, String, String)>,
}

fn cluster() -> impl Strategy<Value = Cluster> {
    (proptest::collection::vec((amount(), amount()), 1..5), proptest::collection::vec((service(), amount(), amount(), count()), 1..5))
        .prop_map(|(nodes, services)| Cluster { nodes, services })
}

fn facts(c: &Cluster) -> Vec<(String, Option<String>)> {
    let mut f = Vec::new();
    for (i, (cpu, mem)) in c.nodes.iter().enumerate() {
        let n = format!("node-{i}");
        for (k, v) in [("cpu", cpu.as_str()), ("memory", mem.as_str()), ("alive", "1"), ("heartbeat", "0")] {
            f.push((format!("observed/node/{n}/{k}"), Some(v.to_string())));
        }
    }
    for (s, cpu, mem, n) in &c.services {
        f.push((format!("desired/service/{s}/cpu"), Some(cpu.clone())));
        f.push((format!("desired/service/{s}/memory"), Some(mem.clone())));
        f.push((format!("intent/user/service/{s}/instances"), Some(n.clone())));
    }
    f
}

/// The checker's own idea of a valid amount: a plain decimal in [lo, 1e9].
fn valid(v: &str, lo: i64) -> Option<i64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return None;
    }
    v.parse::<i64>().ok().filter(|n| (lo..=1_000_000_000).contains(n))
}

/// Tracks what the store holds and, per key, the last valid amount (what
/// a rejected request keeps), then checks every node's placed sums.
#[derive(Default)]
struct Checker {
    store: BTreeMap<String, String>,
    last_good: BTreeMap<String, i64>,
}

impl Checker {
    /// One step's writes, as the engine sees them: a key written twice in a
    /// step holds its last value (the first was never seen, so it is not a
    /// "last valid" one a rejected value keeps).
    fn write(&mut self, writes: &[(String, Option<String>)]) {
        let last: BTreeMap<&String, &Option<String>> = writes.iter().map(|(k, v)| (k, v)).collect();
        for (k, v) in last {
            match v {
                Some(v) => {
                    self.store.insert(k.clone(), v.clone());
                    if let Some(n) = valid(v, 0) {
                        self.last_good.insert(k.clone(), n);
                    }
                }
                None => {
                    self.store.remove(k);
                    self.last_good.remove(k);
                }
            }
        }
    }

    /// A service's request of `field`: the value if valid, else the last
    /// valid one (a rejected edit keeps it), else 0 when absent.
    fn request(&self, service: &str, field: &str) -> i64 {
        let key = format!("desired/service/{service}/{field}");
        match self.store.get(&key) {
            None => 0,
            Some(v) => valid(v, 0).or_else(|| self.last_good.get(&key).copied()).unwrap_or(i64::MAX / 4),
        }
    }

    /// `before`: the placements of the previous step. A node that only holds
    /// instances it held before may be over a lowered capacity; one given a
    /// new instance may not.
    fn check(&self, derived: &BTreeMap<String, Derived>, before: &BTreeMap<String, Derived>) -> Result<(), String> {
        let mut used: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        let mut given: std::collections::BTreeSet<&str> = Default::default();
        for (k, node) in derived.range("placement/instance/".to_string()..).take_while(|(k, _)| k.starts_with("placement/instance/")) {
            if before.get(k) != Some(node) {
                given.insert(node.as_str());
            }
            let inst = &k["placement/instance/".len()..];
            let service = inst.rsplit_once('-').ok_or_else(|| format!("odd instance id {inst}"))?.0;
            let u = used.entry(node.as_str()).or_default();
            u.0 += self.request(service, "cpu");
            u.1 += self.request(service, "memory");
        }
        for (node, (cpu, mem)) in used.into_iter().filter(|(n, _)| given.contains(n)) {
            let cap = |f: &str| self.store.get(&format!("observed/node/{node}/{f}")).and_then(|v| valid(v, 1));
            match (cap("cpu"), cap("memory")) {
                (Some(c), Some(m)) if cpu <= c && mem <= m => {}
                (c, m) => return Err(format!("{node} holds cpu {cpu} of {c:?}, memory {mem} of {m:?}")),
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_input_makes_a_node_hold_more_than_its_capacity(first in cluster(), second in cluster()) {
        let program = program();
        let mut session = Session::new(program, 1).unwrap();
        let mut checker = Checker::default();
        let mut before = BTreeMap::new();
        for step in [facts(&first), facts(&second)] {
            checker.write(&step);
            session.write(&step).unwrap();
            if let Err(e) = checker.check(session.derived(), &before) {
                prop_assert!(false, "{e}\nfacts: {:?}\nderived: {:?}", checker.store, session.derived());
            }
            before = session.derived().clone();
        }
    }
}
