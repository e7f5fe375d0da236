//! Explanations of the built-in `assign` on the shipped rules, read before
//! anything is written back (as `explain --etcd` sees a round in flight):
//! the proof of a new placement names the facts the built-in read, and the
//! why-not of an instance that fits nowhere names every node's reason.

use ccattler_engine::explain::{self, How, Node};
use ccattler_engine::Session;
use std::sync::Arc;

fn session(facts: &[(&str, &str)]) -> Session {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[std::path::PathBuf::from(rules)]).unwrap();
    assert_eq!(checked.errors(), 0, "shipped rules: {}", checked.render());
    let program = checked.program.unwrap();
    let mut s = Session::new(Arc::new(program), 1).unwrap();
    let facts: Vec<(String, String, u64)> = facts.iter().map(|(k, v)| (k.to_string(), v.to_string(), 1)).collect();
    s.load(1, &facts).unwrap();
    s
}

fn node_facts(n: &str, cpu: &str, zone: &str) -> Vec<(String, String)> {
    let k = |f: &str| format!("observed/node/{n}/{f}");
    vec![
        (k("cpu"), cpu.into()),
        (k("memory"), "1024".into()),
        (k("alive"), "1".into()),
        (k("heartbeat"), "0".into()),
        (format!("desired/node/{n}/label/zone"), zone.into()),
    ]
}

fn facts() -> Vec<(String, String)> {
    let mut f: Vec<(String, String)> = Vec::new();
    f.extend(node_facts("node-1", "400", "a"));
    f.extend(node_facts("node-2", "4000", "b"));
    f.extend(node_facts("node-3", "4000", "a"));
    for (k, v) in [
        ("desired/service/web/image", "builtin:http"),
        ("desired/service/web/cpu", "500"),
        ("desired/service/web/memory", "64"),
        ("desired/service/web/selector/zone", "a"),
        ("intent/user/service/web/instances", "1"),
        ("desired/service/big/image", "builtin:http"),
        ("desired/service/big/cpu", "8000"),
        ("intent/user/service/big/instances", "1"),
    ] {
        f.push((k.into(), v.into()));
    }
    f
}

fn premises(n: &Node) -> Vec<String> {
    match &n.how {
        How::Assigned { premises, .. } => premises.iter().map(|p| p.fact.clone()).collect(),
        other => panic!("{} is not assigned: {other:?}", n.fact),
    }
}

#[test]
fn a_new_placement_names_what_assign_read() {
    let f = facts();
    let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = session(&pairs);
    assert_eq!(s.derived().get("placement/instance/web-0").map(|v| v.as_str()), Some("node-3"));
    let db = explain::Db::of_session(&s);
    let e = explain::explain(&db, "placement/instance/web-0", None, false, explain::Options::default()).unwrap();
    assert!(e.holds);
    let How::Rule { premises: p, .. } = &e.proofs[0].how else { panic!("{:?}", e.proofs[0]) };
    let explain::Premise::Fact { proof, .. } = &p[0] else { panic!("{p:?}") };
    assert_eq!(
        premises(proof),
        vec![
            r#"pending("web-0", "web", 0)"#.to_string(),
            r#"need("web", "cpu", 500)"#.to_string(),
            r#"need("web", "memory", 64)"#.to_string(),
            r#"offer("node-3", 0)"#.to_string(),
            r#"room("node-3", "cpu", 4000, 4000)"#.to_string(),
            r#"room("node-3", "memory", 1024, 1024)"#.to_string(),
            r#"restricted("web")"#.to_string(),
            r#"allowed("web", "node-3")"#.to_string(),
        ]
    );
}

#[test]
fn an_instance_that_fits_nowhere_has_every_nodes_reason() {
    let f = facts();
    let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = session(&pairs);
    let db = explain::Db::of_session(&s);
    let e = explain::explain(&db, "placement/instance/big-0", None, true, explain::Options::default()).unwrap();
    assert!(!e.holds);
    let text = explain::render::text(&e);
    assert!(text.contains("0/3 nodes can take big-0 — fits nowhere, ever: no node it may use is big enough"), "{text}");
    assert!(text.contains("3 × insufficient cpu (needs 8000): node-1, node-2, node-3"), "{text}");
    assert!(text.contains("node-2: cpu 4000 free of 4000 (needs 8000)"), "free and total per node: {text}");
    // An instance that does not exist: one line and the one meant, not every other instance.
    let e = explain::explain(&db, "placement/instance/wbe-0", None, true, explain::Options::default()).unwrap();
    let text = explain::render::text(&e);
    assert!(
        text.contains("no such fact: the rule gives 2 other fact(s), none instance(\"wbe-0\", _, _); did you mean instance(\"web-0\", \"web\", 0)?"),
        "{text}"
    );
    assert!(!text.contains("big-0"), "no list of every other instance: {text}");
    // Room that is only taken waits for room, and says so.
    let mut f = facts();
    f.push(("desired/service/mid/cpu".into(), "3000".into()));
    f.push(("intent/user/service/mid/instances".into(), "3".into()));
    let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s2 = session(&pairs);
    let db2 = explain::Db::of_session(&s2);
    let e = explain::explain(&db2, "placement/instance/mid-2", None, true, explain::Options::default()).unwrap();
    let text = explain::render::text(&e);
    assert!(text.contains("0/3 nodes can take mid-2 — waits for room"), "{text}");
    // web is restricted to zone a: node-2 is not allowed, node-1 lacks room.
    let e = explain::explain(&db, "placement/instance/web-0", Some("node-2"), true, explain::Options::default()).unwrap();
    let text = explain::render::text(&e);
    let rules = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../rules/placement.rules")).unwrap();
    let line = 1 + rules.lines().position(|l| l.starts_with("excluded(s, n, \"lacks label \"")).expect("the selector rule");
    let want = format!(
        "not allowed: is_excluded(\"web\", node) holds (excluded(\"web\", node, \"lacks label zone=a\") by {}/../rules/placement.rules:{line})",
        env!("CARGO_MANIFEST_DIR")
    );
    assert!(text.contains(&want), "{text}");
}
