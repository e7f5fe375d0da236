//! The built-ins (`assign`, `preempt`) hold their inputs and their last
//! answer, and answer only the revisions their inputs changed at
//! (`dataflow::whole`). Checked against a from-scratch evaluation: after each
//! random change to a small synthetic cluster — a service scaled, a node's
//! lease gone or back, a node's capacity reported lower or higher, as the
//! user and the agents write them — a fresh engine loaded with what the store
//! then holds (inputs and written-back placements) derives exactly what the
//! incremental one does. Two workers on the incremental side, so rows reach
//! the built-in from a worker that does not run it.

use ccattler_engine::synth::{self, Params};
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

const NODES: usize = 5;
const SERVICES: usize = 4;

#[derive(Clone, Debug)]
enum Change {
    /// The user sets a service's instances.
    Scale(usize, u8),
    /// A node's lease expired: etcd deletes its `alive` and the instance
    /// reports on the lease.
    LeaseGone(usize),
    /// The node's agent is back with a new lease.
    LeaseBack(usize),
    /// The node's agent reports its cpu (millicores).
    Cpu(usize, i64),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => (0..SERVICES, 0u8..9).prop_map(|(s, k)| Change::Scale(s, k)),
        1 => (0..NODES).prop_map(Change::LeaseGone),
        1 => (0..NODES).prop_map(Change::LeaseBack),
        1 => (0..NODES, prop_oneof![Just(400i64), Just(1_500), Just(synth::NODE_CPU)]).prop_map(|(n, c)| Change::Cpu(n, c)),
    ]
}

/// The writes a change makes, given what the store holds of inputs.
fn writes(change: &Change, store: &BTreeMap<String, String>) -> Vec<(String, Option<String>)> {
    match change {
        Change::Scale(s, k) => vec![(format!("intent/user/service/{}/instances", synth::service_name(*s)), Some(k.to_string()))],
        Change::LeaseGone(n) => {
            let node = synth::node_name(*n);
            let on_lease = |k: &str| {
                k == format!("observed/node/{node}/alive")
                    || k.starts_with(&format!("observed/node/{node}/instance/"))
                    || k.starts_with(&format!("observed/node/{node}/probe_state/"))
            };
            store.keys().filter(|k| on_lease(k)).map(|k| (k.clone(), None)).collect()
        }
        Change::LeaseBack(n) => vec![(format!("observed/node/{}/alive", synth::node_name(*n)), Some(format!("{}", 8_000_000 + n)))],
        Change::Cpu(n, c) => vec![(format!("observed/node/{}/cpu", synth::node_name(*n)), Some(c.to_string()))],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn built_ins_answered_incrementally_derive_what_a_fresh_engine_derives(changes in proptest::collection::vec(change(), 1..5)) {
        let p = Params { nodes: NODES, services: SERVICES, instances: 10, zones: 2, spread_pct: 50, taint_pct: 0 };
        let mut inputs: BTreeMap<String, String> = synth::cluster(&p).into_iter().collect();
        let mut session = Session::new(program(), 2).unwrap();
        session.write(&inputs.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect::<Vec<_>>()).unwrap();
        for (step, change) in changes.iter().enumerate() {
            let w = writes(change, &inputs);
            for (k, v) in &w {
                match v {
                    Some(v) => inputs.insert(k.clone(), v.clone()),
                    None => inputs.remove(k),
                };
            }
            session.write(&w).unwrap();
            // What the store holds now: the inputs, and every derived key
            // written back (placements among them).
            let mut store = inputs.clone();
            store.extend(session.derived().iter().map(|(k, d)| (k.clone(), d.to_string())));
            let facts: Vec<(String, String, u64)> = store.into_iter().map(|(k, v)| (k, v, 1)).collect();
            let mut fresh = Session::new(program(), 1).unwrap();
            fresh.load(session.revision(), &facts).unwrap();
            let incremental: BTreeMap<&String, String> = session.derived().iter().map(|(k, d)| (k, d.to_string())).collect();
            let scratch: BTreeMap<&String, String> = fresh.derived().iter().map(|(k, d)| (k, d.to_string())).collect();
            let differ: Vec<_> = incremental.iter().filter(|(k, v)| scratch.get(*k) != Some(*v))
                .map(|(k, v)| format!("{k}: {v} incrementally, {:?} from scratch", scratch.get(*k)))
                .chain(scratch.iter().filter(|(k, _)| !incremental.contains_key(*k)).map(|(k, v)| format!("{k}: only from scratch ({v})")))
                .take(10)
                .collect();
            prop_assert!(differ.is_empty(), "after step {step} ({change:?}) of {changes:?}:\n{}", differ.join("\n"));
        }
    }
}
