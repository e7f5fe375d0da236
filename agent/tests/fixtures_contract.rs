//! Rule tests speak the agent's truth: every instance an agent reports on
//! in a shipped rule test (`rules/tests/*.test`, with their fixtures) carries
//! only the fields the agent writes in that state (`keys::reported_fields`),
//! with values it writes. A fixture the agent could never write hides bugs:
//! a crash loop that never stalled a rollout passed its rule test that way.
//! Facts a case feeds on purpose as a compromised or careless agent's are
//! those it lists under `expect rejected` (refused at the input), or values
//! outside what the agent writes that the case says it ignores.

use ccattler_agent::keys::{reported_fields, HEALTH};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// (node, instance) → field → value, as a case's steps leave them.
type Reports = BTreeMap<(String, String), BTreeMap<String, String>>;

fn instance_key(key: &str) -> Option<(String, String, String)> {
    let rest = key.strip_prefix("observed/node/")?;
    let (node, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("instance/")?;
    let (instance, field) = rest.split_once('/')?;
    Some((node.into(), instance.into(), field.into()))
}

fn apply(reports: &mut Reports, line: &str, dir: &Path) {
    let line = line.trim();
    if let Some(file) = line.strip_prefix("include ") {
        let text = std::fs::read_to_string(dir.join(file.trim())).expect("fixture");
        for l in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            apply(reports, l, dir);
        }
    } else if let Some(key) = line.strip_prefix("- ") {
        if let Some((n, i, f)) = instance_key(key.trim()) {
            reports.entry((n, i)).or_default().remove(&f);
        }
    } else if let Some((key, value)) = line.split_once(" = ") {
        if let Some((n, i, f)) = instance_key(key.trim()) {
            reports.entry((n, i)).or_default().insert(f, value.trim().to_string());
        }
    }
}

/// Where the agent's truth is broken after a step, skipping `refused` keys.
fn untrue(reports: &Reports, refused: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for ((node, instance), fields) in reports {
        let key = |f: &str| format!("observed/node/{node}/instance/{instance}/{f}");
        let Some(state) = fields.get("state").filter(|_| !refused.contains(&key("state"))) else {
            if !fields.is_empty() && fields.keys().any(|f| !refused.contains(&key(f))) {
                out.push(format!("{node}/{instance}: fields {:?} without a state (the agent always reports one)", fields.keys().collect::<Vec<_>>()));
            }
            continue;
        };
        let Some(allowed) = reported_fields(state) else {
            out.push(format!("{node}/{instance}: state {state:?} is none the agent writes"));
            continue;
        };
        for (f, v) in fields {
            if refused.contains(&key(f)) {
                continue;
            }
            if !allowed.contains(&f.as_str()) {
                out.push(format!("{node}/{instance}: {f} = {v} while {state} (the agent writes {allowed:?})"));
            }
            if f == "health" && !HEALTH.contains(&v.as_str()) {
                out.push(format!("{node}/{instance}: health {v:?}"));
            }
        }
    }
    out
}

fn test_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "test")).collect();
    out.sort();
    out
}

/// Checks one file; returns its untrue steps as `file:line: …`.
fn check(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut problems = Vec::new();
    let mut reports = Reports::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        if l.starts_with("case ") {
            reports.clear();
        }
        if l == "given" || l == "when" {
            let at = i + 1;
            i += 1;
            while i < lines.len() && (lines[i].starts_with("  ") || lines[i].trim().is_empty() || lines[i].trim_start().starts_with('#')) {
                if !lines[i].trim_start().starts_with('#') {
                    apply(&mut reports, lines[i], dir);
                }
                i += 1;
            }
            // The step's `expect rejected` keys (until the next step).
            let mut refused = BTreeSet::new();
            let mut j = i;
            while j < lines.len() && lines[j].trim() != "when" && !lines[j].starts_with("case ") {
                if lines[j].trim() == "expect rejected" {
                    let mut k = j + 1;
                    while k < lines.len() && lines[k].starts_with("  ") {
                        refused.insert(lines[k].trim().to_string());
                        k += 1;
                    }
                }
                j += 1;
            }
            for p in untrue(&reports, &refused) {
                problems.push(format!("{}:{at}: {p}", file.display()));
            }
            continue;
        }
        i += 1;
    }
    problems
}

#[test]
fn shipped_rule_tests_feed_only_what_the_agent_writes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut problems = Vec::new();
    for dir in [root.join("rules/tests"), root.join("rules/autoscaler/tests"), root.join("examples/policy/tests")] {
        for f in test_files(&dir) {
            problems.extend(check(&f));
        }
    }
    assert!(problems.is_empty(), "rule tests feed facts the agent never writes:\n{}", problems.join("\n"));
}

#[test]
fn the_contract_catches_a_crashed_instance_with_an_address() {
    // What the contract is for: a fixture the agent could not write is named.
    let dir = std::env::temp_dir().join(format!("ccattler-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.test");
    std::fs::write(
        &file,
        "case x\ngiven\n  observed/node/n1/instance/web-0/state = waiting\n  observed/node/n1/instance/web-0/version = 2\nwhen\n  observed/node/n1/instance/web-0/state = crashed\n  observed/node/n1/instance/web-0/ip = 10.0.0.1\nexpect contains\n  x = 1\n",
    )
    .unwrap();
    let problems = check(&file);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("version = 2 while waiting"), "{problems:?}");
    assert!(problems[1].contains("ip = 10.0.0.1 while crashed"), "{problems:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
