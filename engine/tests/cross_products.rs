//! The shipped rules' join plans. An atom joined on no variable meets every
//! binding so far with every fact of its relation: cheap after a relation of
//! one row (`clock`) or a few (`selector`), ruinous between two populations.
//! Rules join in the order they are written, so that order is checked here.

use ccattler_engine::plan::{plan, Step};

/// Every cross product of the shipped rules: (rule label, the relations
/// joined before it, the relation joined on nothing).
fn cross_products() -> Vec<(String, Vec<String>, String)> {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[rules.into()]).expect("rules load");
    let program = checked.program.expect("checked");
    let mut found = Vec::new();
    for p in plan(&program) {
        let mut before: Vec<String> = Vec::new();
        for s in &p.steps {
            if let Step::Join { rel, key, .. } = s {
                let name = program.relations[*rel].name.clone();
                if key.is_empty() && !before.is_empty() {
                    found.push((p.label.to_string(), before.clone(), name.clone()));
                }
                before.push(name);
            }
        }
    }
    found
}

/// Every pending service by every ready node was 1 M bindings a pass for
/// 200 pending services on 5,000 nodes, made and dropped to find the few
/// tainted nodes (the PreferNoSchedule rule, written in that order): 80 %
/// of a loaded controller's time went there.
#[test]
fn no_rule_meets_every_pending_service_with_every_ready_node() {
    let populations = ["pending_service", "ready", "node", "instance", "kept", "placed"];
    let ruinous: Vec<_> = cross_products()
        .into_iter()
        .filter(|(_, before, joined)| populations.contains(&joined.as_str()) && before.iter().all(|b| populations.contains(&b.as_str())))
        .collect();
    assert!(ruinous.is_empty(), "cross products of two populations: {ruinous:#?}");
}

/// Every rule that joins the cluster clock does so as a temporal filter
/// (`ccattler_engine::temporal`), so a tick that changes nothing they
/// derive need not reach them. Those that only compare the reading index
/// their bindings by where the judgement flips: a tick evaluates the few it
/// crosses, not every node's or instance's. Those that record the reading
/// (`serving_since`, `updated_at`, `taint_seen`) judge every binding at
/// every tick: their bindings last only until the reading is written back.
/// A rule edit that uses the reading otherwise (or joins the clock first)
/// shows here.
#[test]
fn every_rule_that_joins_the_clock_runs_as_a_temporal_filter() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[rules.into()]).expect("rules load");
    let program = checked.program.expect("checked");
    let clock = program.relation("clock").expect("the clock");
    let mut indexed = Vec::new();
    let mut every_move = Vec::new();
    for p in plan(&program) {
        if !p.steps.iter().any(|s| matches!(s, Step::Join { rel, .. } if *rel == clock)) {
            continue;
        }
        let head = program.relations[p.head].name.clone();
        let (_, t) =
            ccattler_engine::temporal::find(&p, |rel| program.relations[rel].arity()).unwrap_or_else(|| panic!("{} joins the clock as usual", p.label));
        assert_eq!(t.rel, clock, "{}", p.label);
        if t.indexed() {
            indexed.push(head);
        } else {
            every_move.push(head);
        }
    }
    indexed.sort();
    every_move.sort();
    assert_eq!(indexed, ["available", "stale", "stall", "tolerance_over"]);
    assert_eq!(every_move, ["serving_since", "taint_seen", "updated_at"]);
}
