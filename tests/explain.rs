//! Golden tests of `ccattler explain` on the shipped rules. Each
//! `tests/explain/NAME.facts` names the questions in `# explain: ARGS`
//! lines; `NAME.expected` holds the answers. `UPDATE_GOLDEN=1` rewrites them.

use std::path::Path;
use std::process::Command;

fn run(facts: &Path, args: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_ccattler"))
        .current_dir(root)
        .arg("explain")
        .args(args.split_whitespace())
        .args(["--facts", facts.strip_prefix(root).unwrap().to_str().unwrap(), "--rules", "rules"])
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "explain {args}: exit {code}\n{}", String::from_utf8_lossy(&out.stderr));
    let mut stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if args.contains("--format json") {
        // Pretty, so the golden file shows the schema readably.
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("explain {args}: not JSON ({e}):\n{stdout}"));
        assert_eq!(v["schema"], "ccattler.explain/v1");
        stdout = serde_json::to_string_pretty(&v).unwrap() + "\n";
    }
    format!("$ ccattler explain {args}   (exit {code})\n{stdout}")
}

#[test]
fn golden_explanations_of_the_shipped_rules() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/explain");
    let mut cases: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "facts")).collect();
    cases.sort();
    assert!(cases.len() >= 4, "cases in {}", dir.display());
    let mut failed = Vec::new();
    for facts in cases {
        let text = std::fs::read_to_string(&facts).unwrap();
        let asks: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# explain: ")).collect();
        assert!(!asks.is_empty(), "{} has no `# explain:` line", facts.display());
        let actual: String = asks.iter().map(|a| run(&facts, a)).collect::<Vec<_>>().join("\n");
        let expected_path = facts.with_extension("expected");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if actual != expected {
            failed.push(format!("{}: differs from {} (UPDATE_GOLDEN=1 to accept)\n--- actual\n{actual}", facts.display(), expected_path.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Every field name the golden JSON answers use is documented in docs/explain.md.
#[test]
fn the_json_schema_is_documented() {
    fn keys(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    out.insert(k.clone());
                    // Binding objects are keyed by the rules' variables.
                    if k != "bindings" {
                        keys(x, out);
                    }
                }
            }
            serde_json::Value::Array(xs) => xs.iter().for_each(|x| keys(x, out)),
            _ => {}
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/explain.md")).unwrap();
    let mut fields = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(root.join("tests/explain")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|x| x == "expected") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            // Each JSON answer is a pretty-printed object from a `{` line to a `}` line.
            let mut block = String::new();
            for line in text.lines() {
                if line == "{" || !block.is_empty() {
                    block.push_str(line);
                    block.push('\n');
                }
                if line == "}" {
                    // Clients read it back (explain --controller does).
                    let _: ccattler_engine::explain::Explanation = serde_json::from_str(&block).unwrap();
                    keys(&serde_json::from_str(&block).unwrap(), &mut fields);
                    block.clear();
                }
            }
        }
    }
    assert!(fields.len() > 20, "found {} fields", fields.len());
    let undocumented: Vec<&String> = fields.iter().filter(|f| !doc.contains(&format!("`{f}`"))).collect();
    assert!(undocumented.is_empty(), "fields missing from docs/explain.md: {undocumented:?}");
}
