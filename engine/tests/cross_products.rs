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

/// The rules that only compare the cluster clock run as temporal filters
/// (`ccattler_engine::temporal`): a tick evaluates the few bindings whose
/// judgement it can change, not every node's or instance's. A rule edit
/// that uses the reading otherwise (or joins the clock first) shows here.
/// The rules that record the reading (`serving_since`, `updated_at`,
/// `taint_seen`) join it as usual: their bindings last until the reading
/// is written back.
#[test]
fn every_rule_that_only_compares_the_clock_runs_as_a_temporal_filter() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[rules.into()]).expect("rules load");
    let program = checked.program.expect("checked");
    let clock = program.relation("clock").expect("the clock");
    let mut temporal = Vec::new();
    let mut joined = Vec::new();
    for p in plan(&program) {
        if !p.steps.iter().any(|s| matches!(s, Step::Join { rel, .. } if *rel == clock)) {
            continue;
        }
        let head = program.relations[p.head].name.clone();
        match ccattler_engine::temporal::find(&p) {
            Some((_, t)) => {
                assert_eq!(t.rel, clock, "{}", p.label);
                temporal.push(head);
            }
            None => joined.push(head),
        }
    }
    temporal.sort();
    joined.sort();
    assert_eq!(temporal, ["available", "stale", "stall", "tolerance_over"]);
    assert_eq!(joined, ["serving_since", "taint_seen", "updated_at"]);
}
