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
