//! The `ccattler` binary as users run it: exit codes, output formats, and
//! `eval` on the shipped rules.

use std::path::Path;
use std::process::{Command, Output};

fn ccattler(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccattler")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("run ccattler")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_accepts_the_shipped_rules() {
    let out = ccattler(&["check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("ok: "), "{}", text(&out.stdout));
}

#[test]
fn check_reports_errors_with_location_and_exit_1() {
    let dir = tempdir("check-errors");
    let file = dir.join("bad.rules");
    std::fs::write(&file, "input a(x: int) from \"a/{x}\"\noutput b(x: int) to \"effective/b/{x}\"\nb(y) :- a(x).\n").unwrap();
    let out = ccattler(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("bad.rules:3:3"), "{err}");
    assert!(err.contains("^"), "{err}");
    assert!(err.contains("help:"), "{err}");

    let out = ccattler(&["check", "--format", "json", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["diagnostics"][0]["code"], "unsafe-variable");
    assert_eq!(v["diagnostics"][0]["line"], 3);
}

#[test]
fn check_refuses_twenty_thousand_nested_parentheses_with_a_diagnostic_not_a_crash() {
    let dir = tempdir("check-deep");
    let file = dir.join("deep.rules");
    let n = 20_000;
    std::fs::write(&file, format!("output b(x: int) to \"effective/b/{{x}}\"\nb(x) :- x = {}1{}.\n", "(".repeat(n), ")".repeat(n))).unwrap();
    let facts = dir.join("facts");
    std::fs::write(&facts, "").unwrap();
    let (file, facts) = (file.to_str().unwrap(), facts.to_str().unwrap());
    for args in [vec!["check", file], vec!["eval", "--rules", file, "--facts", facts], vec!["test", "--rules", file, facts]] {
        let out = ccattler(&args);
        let err = text(&out.stderr);
        assert!(err.contains("deep.rules:2:") && err.contains("nested at most"), "{args:?}: {err}");
        assert!(!out.status.success(), "{args:?}");
    }
}

#[test]
fn an_expression_as_deep_as_allowed_checks_and_evaluates() {
    let dir = tempdir("eval-deep");
    let file = dir.join("deep.rules");
    // `(1 + (1 + … (1 + 0)))`: each level is a parenthesis and a `+`.
    let levels = ccattler_parser::syntax::MAX_NESTING / 2 - 1;
    std::fs::write(&file, format!("output b(x: int) to \"effective/b/{{x}}\"\nb(x) :- x = {}0{}.\n", "(1 + ".repeat(levels), ")".repeat(levels))).unwrap();
    let facts = dir.join("facts");
    std::fs::write(&facts, "").unwrap();
    let out = ccattler(&["eval", "--rules", file.to_str().unwrap(), "--facts", facts.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("effective/b/{levels}")), "{}", text(&out.stdout));
}

#[test]
fn check_names_a_missing_path_and_exits_2() {
    let out = ccattler(&["check", "no/such/dir"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no/such/dir"), "{}", text(&out.stderr));
}

#[test]
fn eval_resolves_the_seed_intent_example() {
    let dir = tempdir("eval-intent");
    let facts = dir.join("intent.facts");
    std::fs::write(&facts, "intent/user/service/web/instances = 3\nintent/autoscaler/service/web/instances = 5\n").unwrap();
    let out = ccattler(&["eval", "--facts", facts.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.lines().any(|l| l == "effective/service/web/instances = 5"), "{stdout}");
    assert!(stdout.lines().any(|l| l == "effective/instance/web-4/service = web"), "{stdout}");

    // The autoscaler's intent removed: the user's 3 remains.
    std::fs::write(&facts, "intent/user/service/web/instances = 3\n").unwrap();
    let out = ccattler(&["eval", "--facts", facts.to_str().unwrap(), "--workers", "2"]);
    let stdout = text(&out.stdout);
    assert!(stdout.lines().any(|l| l == "effective/service/web/instances = 3"), "{stdout}");
    assert!(!stdout.contains("web-3"), "{stdout}");
}

#[test]
fn eval_rejects_bad_values_by_line_and_keeps_the_rest() {
    let out = ccattler(&["eval", "--facts", "examples/intent.facts"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).lines().any(|l| l == "effective/service/web/instances = 5"));
    assert!(!text(&out.stdout).contains("service/api"), "the rejected fact changes nothing");
    let err = text(&out.stderr);
    assert!(err.contains("examples/intent.facts:4: rejected intent/user/service/api/instances"), "{err}");
    assert!(err.contains("`three` is not an int"), "{err}");

    let out = ccattler(&["eval", "--facts", "examples/intent.facts", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["derived"]["effective/service/web/instances"], "5");
    assert_eq!(v["rejected"][0]["line"], 4);
}

#[test]
fn eval_reports_conflicts_and_exits_1() {
    let dir = tempdir("eval-conflict");
    std::fs::write(
        dir.join("c.rules"),
        "input v(s: name, n: int) from \"v/{s}\"\noutput o(s: name, n: int) to \"o/{s}\"\no(s, n) :- v(s, n).\no(s, m) :- v(s, n), m = n + 1.\n",
    )
    .unwrap();
    std::fs::write(dir.join("f.facts"), "v/web = 1\n").unwrap();
    let out = ccattler(&["eval", "--rules", dir.to_str().unwrap(), "--facts", dir.join("f.facts").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("conflict: o/web has 2 values"), "{err}");
    assert!(err.contains("\"1\" (from ") && err.contains("c.rules:3"), "{err}");
    assert!(err.contains("\"2\" (from ") && err.contains("c.rules:4"), "{err}");
    assert_eq!(text(&out.stdout), "", "a conflicted key that never had a value is not written");
}

#[test]
fn eval_names_a_broken_facts_file_line() {
    let dir = tempdir("eval-broken");
    let facts = dir.join("broken.facts");
    std::fs::write(&facts, "# ok\nthis line has no equals sign\n").unwrap();
    let out = ccattler(&["eval", "--facts", facts.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("broken.facts:2"), "{}", text(&out.stderr));
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn shipped_rule_tests_pass() {
    let out = ccattler(&["test"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    // The autoscaler's rules are a program of their own, with their tests.
    let out = ccattler(&["test", "rules/autoscaler/tests", "--rules", "rules/autoscaler"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("3 passed, 0 failed"), "{stdout}");
    // The example exec policy, a team's rule file beside the shipped rules.
    let out = ccattler(&["test", "examples/policy/tests", "--rules", "rules", "--rules", "examples/policy"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("4 passed, 0 failed"), "{stdout}");
    // And neither `check rules` nor `test` descends into it.
    let out = ccattler(&["check", "rules", "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("autoscaler.rules"), "{}", text(&out.stdout));
}

#[test]
fn a_failing_rule_test_shows_the_difference_and_exits_1() {
    let dir = tempdir("ruletest-fail");
    let file = dir.join("bad.test");
    std::fs::write(
        &file,
        "case wrong count\ngiven\n  intent/user/service/web/instances = 2\nexpect contains\n  effective/service/web/instances = 3\n  effective/instance/web-9/service = web\n",
    )
    .unwrap();
    let out = ccattler(&["test", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("bad.test:4: wrong count"), "{stdout}");
    assert!(stdout.contains("different  effective/service/web/instances: expected 3, got 2"), "{stdout}");
    assert!(stdout.contains("missing    effective/instance/web-9/service = web"), "{stdout}");

    let out = ccattler(&["test", "--format", "json", file.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed"], 1);
    assert_eq!(v["cases"][0]["failures"][0]["line"], 4);

    let out = ccattler(&["test", "--run", "no such case", file.to_str().unwrap()]);
    assert!(text(&out.stdout).contains("0 passed, 0 failed"), "{}", text(&out.stdout));
}

#[test]
fn check_with_facts_names_rejected_values_and_suggests_the_key_meant() {
    let dir = tempdir("check-facts");
    let facts = dir.join("f.facts");
    std::fs::write(&facts, "desired/service/web/image = nginx\ndesired/service/web/cpu = lots\ndesired/service/web/imag = nginx\nfoo/bar = 1\n").unwrap();
    let out = ccattler(&["check", "--facts", facts.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("f.facts:2: desired/service/web/cpu: value of `desired_cpu`: `lots` is not an int"), "{err}");
    assert!(err.contains("warning: ") && err.contains("f.facts:3: no rule reads desired/service/web/imag; did you mean desired/service/web/image?"), "{err}");
    assert!(!err.contains("foo/bar"), "keys outside every prefix the rules read are none of check's business: {err}");
}

#[test]
fn a_rule_file_that_is_not_utf8_exits_1_at_its_first_bad_byte() {
    let dir = tempdir("not-utf8");
    let file = dir.join("bad.rules");
    std::fs::write(&file, b"input a(x: int) from \"a/{x}\"\n// caf\xe9 au lait\n").unwrap();
    let out = ccattler(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("bad.rules:2:7") && err.contains("byte 0xe9 is not UTF-8"), "{err}");
}

/// Every ```test block of docs/testing.md passes against the shipped rules;
/// every ```test-fails block fails with the text of the block after it.
#[test]
fn docs_testing_examples_run_as_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
    let dir = tempdir("docs-testing");
    std::fs::create_dir_all(dir.join("fixtures")).unwrap();
    for f in std::fs::read_dir(root.join("rules/tests/fixtures")).unwrap().flatten() {
        std::fs::copy(f.path(), dir.join("fixtures").join(f.file_name())).unwrap();
    }
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(kind) = line.strip_prefix("```").filter(|k| !k.is_empty()) {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((kind.to_string(), body.join("\n") + "\n"));
        } else if line == "```" {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((String::new(), body.join("\n")));
        }
    }
    let mut ran = 0;
    for (i, (kind, body)) in blocks.iter().enumerate() {
        if kind != "test" && kind != "test-fails" {
            continue;
        }
        let file = dir.join(format!("example-{i}.test"));
        std::fs::write(&file, body).unwrap();
        let out = ccattler(&["test", file.to_str().unwrap(), "--rules", root.join("rules").to_str().unwrap()]);
        let printed = text(&out.stdout);
        if kind == "test" {
            assert!(out.status.success(), "docs/testing.md example {i} fails:\n{body}\n{printed}{}", text(&out.stderr));
        } else {
            assert_eq!(out.status.code(), Some(1), "docs/testing.md example {i} should fail:\n{printed}");
            let expected = &blocks[i + 1].1;
            assert!(printed.contains(expected.trim()), "example {i} fails otherwise than documented:\n{printed}\nexpected:\n{expected}");
        }
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} examples");
}

#[test]
fn describe_names_a_keys_relations_their_columns_docs_and_rules() {
    let out = ccattler(&["describe", "effective/service/web/cpu"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for needle in
        ["input held_cpu", "output effective_cpu", "service = \"web\"", "derived by:", "rules/intent.rules:", "request(s, \"cpu\", c) :- effective_cpu(s, c)."]
    {
        assert!(t.contains(needle), "{needle}: {t}");
    }
    let out = ccattler(&["describe", "node_state", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["kind"], "output");
    assert_eq!(v[0]["columns"][1]["ty"], "node_state (\"ready\" | \"unreachable\" | \"cordoned\" | \"draining\" | \"drained\" | \"impaired\")");
    assert!(v[0]["doc"].as_str().unwrap().contains("Whether a node can run instances"));
    let out = ccattler(&["describe", "efective_cpu"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("did you mean effective_cpu?"));
}

/// Rule files are the product's face: every relation the shipped rules
/// declare says what it is.
#[test]
fn every_shipped_relation_has_a_doc_comment() {
    let out = ccattler(&["describe", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let missing: Vec<&str> = v.as_array().unwrap().iter().filter(|d| d["doc"].is_null()).map(|d| d["relation"].as_str().unwrap()).collect();
    assert!(missing.is_empty(), "relations without a /// doc: {missing:?}");
}

/// docs/placement.md's worked example: its rule file checks with the shipped
/// rules, its test passes, and explain prints what the page says.
#[test]
fn docs_placement_example_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/placement.md")).unwrap();
    let dir = tempdir("docs-placement");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    for e in std::fs::read_dir(root.join("rules")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "rules") {
            std::fs::copy(e.path(), rules.join(e.file_name())).unwrap();
        }
    }
    let tests = rules.join("tests");
    std::fs::create_dir_all(tests.join("fixtures")).unwrap();
    for e in std::fs::read_dir(root.join("rules/tests/fixtures")).unwrap().flatten() {
        std::fs::copy(e.path(), tests.join("fixtures").join(e.file_name())).unwrap();
    }
    // Fenced blocks: (info string, body).
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
            blocks.push((info.to_string(), body.join("\n") + "\n"));
        }
    }
    let attr = |info: &str, key: &str| info.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).map(str::to_string);
    let mut ran = 0;
    for (i, (info, body)) in blocks.iter().enumerate() {
        let Some(file) = attr(info, "file") else { continue };
        if info.starts_with("rules") {
            std::fs::write(rules.join(&file), body).unwrap();
            let out = ccattler(&["check", rules.to_str().unwrap()]);
            assert!(out.status.success(), "{file} does not check:\n{}", text(&out.stderr));
        } else if info.starts_with("test") {
            std::fs::write(tests.join(&file), body).unwrap();
            let out = ccattler(&["test", tests.join(&file).to_str().unwrap(), "--rules", rules.to_str().unwrap()]);
            assert!(out.status.success(), "{file} fails:\n{}{}", text(&out.stdout), text(&out.stderr));
        } else if info.starts_with("explain") {
            let facts = rules.join(&file);
            std::fs::write(&facts, body).unwrap();
            let question = attr(info, "question").expect("an explain block names its question");
            // From the directory above, so rule locations read `rules/…` as users see them.
            let out = Command::new(env!("CARGO_BIN_EXE_ccattler"))
                .args(["explain", &question, "--why-not", "--facts", facts.to_str().unwrap(), "--rules", "rules"])
                .current_dir(&dir)
                .output()
                .unwrap();
            let printed = text(&out.stdout);
            let expected = blocks[i + 1].1.trim();
            assert!(printed.contains(expected), "explain prints otherwise than docs/placement.md says:\n{printed}\nexpected:\n{expected}");
        } else {
            continue;
        }
        ran += 1;
    }
    assert_eq!(ran, 3, "the rule file, its test and the explanation");
}

/// `plan --with`: what would change if a node were drained and an image
/// changed, from a facts file; nothing is written, a bad value is named.
#[test]
fn plan_with_shows_what_a_change_would_do() {
    let dir = tempdir("plan-with");
    let base = dir.join("base.facts");
    std::fs::write(
        &base,
        "observed/node/node-1/cpu = 1000\nobserved/node/node-1/memory = 1000\nobserved/node/node-1/alive = 1\nobserved/node/node-1/heartbeat = 1\n\
         observed/node/node-2/cpu = 1000\nobserved/node/node-2/memory = 1000\nobserved/node/node-2/alive = 2\nobserved/node/node-2/heartbeat = 1\n\
         desired/service/web/image = nginx:1\nintent/user/service/web/instances = 2\n",
    )
    .unwrap();
    let with = dir.join("with.facts");
    std::fs::write(&with, "# drain node-1, web gets v2, a typo'd count\ndesired/node/node-1/cordon = true\ndesired/service/web/image = nginx:2\n- intent/user/service/web/instances\nintent/user/service/api/instances = many\n").unwrap();
    let before = std::fs::read_to_string(&base).unwrap();
    let out = ccattler(&["plan", "--with", with.to_str().unwrap(), "--facts", base.to_str().unwrap()]);
    let printed = text(&out.stdout);
    assert!(out.status.success(), "{printed}{}", text(&out.stderr));
    for want in
        ["(4 change(s), 1 rejected)", "~ effective/node/node-1/state = cordoned (was ready)", "- effective/service/web/instances", "- placement/instance/web-0"]
    {
        assert!(printed.contains(want), "{want}:\n{printed}");
    }
    assert!(text(&out.stderr).contains("with.facts:5: intent/user/service/api/instances = \"many\" would be rejected"), "{}", text(&out.stderr));
    // Above the key diff, what it does to each service, as `nomad job plan` says it.
    let summary = printed.lines().find(|l| l.starts_with("# web:")).unwrap_or_else(|| panic!("no summary for web:\n{printed}"));
    assert!(summary.contains("instances 2 → 0") && summary.contains("2 to stop (web-0 on node-1, web-1 on node-2)"), "{summary}");
    let grow = dir.join("grow.facts");
    std::fs::write(&grow, "intent/user/service/web/instances = 3\n").unwrap();
    let out = ccattler(&["plan", "--with", grow.to_str().unwrap(), "--facts", base.to_str().unwrap()]);
    let printed = text(&out.stdout);
    let summary = printed.lines().find(|l| l.starts_with("# web:")).unwrap_or_else(|| panic!("no summary for web:\n{printed}"));
    assert!(summary.contains("instances 2 → 3") && summary.contains("1 to create (web-2 on node-"), "{summary}");
    assert_eq!(std::fs::read_to_string(&base).unwrap(), before, "nothing written");
}

/// Leadership timing a standby's takeover rests on: a TTL of 0, a negative
/// one or one past an hour (and an autoscaler period whose three-fold TTL
/// would overflow) is refused by name before anything connects.
#[test]
fn leader_ttl_and_autoscaler_period_refuse_zero_negative_and_huge_values_by_name() {
    for (args, value) in [
        (vec!["controller", "--etcd", "http://127.0.0.1:1"], "--leader-ttl=0"),
        (vec!["controller", "--etcd", "http://127.0.0.1:1"], "--leader-ttl=-5"),
        (vec!["controller", "--etcd", "http://127.0.0.1:1"], "--leader-ttl=9223372036854775807"),
        (vec!["autoscaler", "--etcd", "http://127.0.0.1:1"], "--period=0"),
        (vec!["autoscaler", "--etcd", "http://127.0.0.1:1"], "--period=18446744073709551615"),
    ] {
        let mut args = args;
        args.push(value);
        let out = ccattler(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        let flag = value.split('=').next().unwrap();
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(err.contains(flag) && err.contains("1..=3600"), "{value}: {err}");
    }
}

#[test]
fn agent_confinement_flags_refuse_root_reversed_and_non_positive_values_by_name() {
    let base = ["agent", "--node", "n1", "--cpu", "1000", "--memory", "1000", "--address", "127.0.0.1", "--etcd", "http://127.0.0.1:1"];
    for (flag, value, says) in [
        ("--instance-uids", "0-10", "uid 0 is root"),
        ("--instance-uids", "300-200", "START <= END"),
        ("--instance-uids", "lots", "START-END"),
        ("--instance-pids-max", "0", "--instance-pids-max must be a positive"),
        ("--instance-pids-max", "-5", "--instance-pids-max must be a positive"),
    ] {
        let mut args = base.to_vec();
        // `--flag=value`: a value that starts with `-` is a value, not a flag.
        let arg = format!("{flag}={value}");
        args.push(&arg);
        let out = ccattler(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

/// A team restricts `exec:` with a rule file of its own; `check --facts`
/// names each denied key with the reason, and allows the rest.
#[test]
fn check_with_facts_refuses_what_a_teams_exec_policy_denies() {
    let dir = tempdir("policy-check");
    let file = dir.join("services.facts");
    std::fs::write(
        &file,
        "desired/service/web/image = exec:/bin/sh -c 'curl x | sh'\ndesired/probe/web/readiness/method = exec:/bin/true\n\
         desired/service/batch/image = exec:/bin/sleep 5\ndesired/service/api/image = builtin:http\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let out = ccattler(&["check", "rules", "examples/policy", "--facts", f]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("services.facts:1: desired/service/web/image: denied by policy: exec: images are restricted"), "{err}");
    assert!(err.contains("services.facts:2: desired/probe/web/readiness/method: denied by policy: exec: probes are restricted"), "{err}");
    assert!(!err.contains("services.facts:3") && !err.contains("services.facts:4"), "batch is allowed, api runs no command: {err}");
    // The shipped rules alone are open: the same file passes.
    let out = ccattler(&["check", "rules", "--facts", f]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The why-not once said only "reserved, not admitted": it names the taint
/// (key, value, effect) that the service's toleration does not match.
#[test]
fn why_not_names_the_taint_a_toleration_does_not_match() {
    let dir = tempdir("whynot-taint");
    let file = dir.join("cluster.facts");
    let mut facts = std::fs::read_to_string("rules/tests/fixtures/two-nodes.facts").unwrap();
    facts.push_str(
        "desired/node/node-1/taint/foo = bar:NoSchedule\ndesired/node/node-2/taint/foo = bar:NoExecute\n\
         desired/service/web/toleration/foo = bar:PreferNoSchedule\ndesired/service/web/cpu = 100\nintent/user/service/web/instances = 1\n",
    );
    std::fs::write(&file, facts).unwrap();
    let out = ccattler(&["explain", "placement/instance/web-0", "--why-not", "--facts", file.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("0/2 nodes can take web-0"), "{stdout}");
    assert!(stdout.contains("reserved (taint foo=bar:NoSchedule), not admitted") && stdout.contains("node-1"), "{stdout}");
    assert!(stdout.contains("reserved (taint foo=bar:NoExecute), not admitted") && stdout.contains("node-2"), "{stdout}");
}

/// `explain status/preempted/V --why-not` once said nothing; a strict
/// budget that holds a victim back is named, with what it spares.
#[test]
fn why_not_of_a_preemption_names_the_budget_that_holds_it_back() {
    let dir = tempdir("whynot-budget");
    let file = dir.join("cluster.facts");
    std::fs::write(
        &file,
        "observed/node/node-1/cpu = 1000\nobserved/node/node-1/memory = 1000\nobserved/node/node-1/alive = 1\nobserved/node/node-1/heartbeat = 1\n\
         desired/service/low/cpu = 400\ndesired/service/low/min_available = 2\ndesired/service/low/strict_budget = true\n\
         intent/user/service/low/instances = 2\nplacement/instance/low-0 = node-1\nplacement/instance/low-1 = node-1\n\
         desired/service/high/cpu = 600\ndesired/service/high/priority = 10\nintent/user/service/high/instances = 1\n",
    )
    .unwrap();
    let out = ccattler(&["explain", "status/preempted/low-0", "--why-not", "--facts", file.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("the strict disruption budget of low spares none (0 to spare): it is never broken"), "{stdout}");
}

/// The same-round extension point is needed: with the `apart` rules
/// mutated to derive nothing for two services, the rule test of two
/// services that avoid each other in one round fails (they share a zone).
#[test]
fn mutation_without_the_apart_rule_breaks_same_round_anti_affinity() {
    let dir = tempdir("mutation-apart");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    for e in std::fs::read_dir("rules").unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "rules") {
            std::fs::copy(e.path(), rules.join(e.file_name())).unwrap();
        }
    }
    let spread = std::fs::read_to_string(rules.join("spread.rules")).unwrap();
    let mutated = spread
        .replace("apart(s, t, k) :- pending_service(s), avoid(s, t, k).", "apart(s, t, k) :- pending_service(s), avoid(s, t, k), s = t.")
        .replace("apart(s, t, k) :- pending_service(t), avoid(s, t, k).", "apart(s, t, k) :- pending_service(t), avoid(s, t, k), s = t.");
    assert_ne!(mutated, spread, "the apart rules are where the mutation expects them");
    std::fs::write(rules.join("spread.rules"), mutated).unwrap();
    let case = ["test", "rules/tests/spread.test", "--rules", rules.to_str().unwrap(), "--run", "placed in one round"];
    let out = ccattler(&case);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "the mutant must fail: {stdout}{}", text(&out.stderr));
    assert!(stdout.contains("count      placement/instance/db-: expected 0, got 2"), "{stdout}");
    // The shipped rules pass the same case.
    let out = ccattler(&["test", "rules/tests/spread.test", "--run", "placed in one round"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let out = ccattler(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains("ccattler") && script.contains("explain") && script.contains("why-not"), "{shell}: {script}");
    }
    // The bash script parses.
    let dir = tempdir("completions");
    let bash = dir.join("ccattler.bash");
    std::fs::write(&bash, ccattler(&["completions", "bash"]).stdout).unwrap();
    assert!(std::process::Command::new("bash").arg("-n").arg(&bash).status().unwrap().success());
    let man = dir.join("man");
    let out = ccattler(&["man", "--dir", man.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let drain = std::fs::read_to_string(man.join("ccattler-node-drain.1")).expect("a page per nested command");
    assert!(drain.contains("ccattler node drain") && drain.contains("\\-\\-wait"), "{drain}");
    assert!(man.join("ccattler.1").exists() && man.join("ccattler-apply.1").exists());
    assert!(!man.join("ccattler-supervise.1").exists(), "internal commands have no page");
}

/// `ccattler get nodes` once read a prefix named `nodes` and answered
/// "permission denied": a prefix outside every namespace is named, with the
/// table meant (no etcd is asked).
#[test]
fn get_of_a_word_that_is_no_key_prefix_points_at_status() {
    let out = ccattler(&["get", "nodes", "--etcd", "http://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("\"nodes\" is not a key prefix") && err.contains("ccattler status nodes"), "{err}");
}

#[test]
fn controller_ui_with_etcd_auth_and_no_console_credential_is_a_usage_error() {
    // (Judged from the flags, before etcd is contacted: nothing listens here.)
    let etcd = ["--etcd", "http://127.0.0.1:1", "--etcd-user", "controller", "--etcd-password", "x"];
    let out = ccattler(&[&["controller", "--ui"][..], &etcd].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--ui with etcd's auth on needs --ui-credentials FILE"), "{}", text(&out.stderr));
    // A credential file with no NAME:PASSWORD line is named, not taken as "no auth".
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-credentials");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("empty");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = ccattler(&[&["controller", "--ui", "--ui-credentials", file.to_str().unwrap()][..], &etcd].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no NAME:PASSWORD line") && text(&out.stderr).contains(file.to_str().unwrap()), "{}", text(&out.stderr));
}

/// `eval --processes 2` runs the engine as a timely cluster of two local
/// processes over loopback TCP: every facts file the tests and examples
/// ship gives byte-identical output (text and JSON, exit code) to one
/// process.
#[test]
fn eval_on_two_processes_prints_what_one_process_prints() {
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    for dir in ["tests/explain", "examples"] {
        for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "facts") {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 5, "{files:?}");
    for file in &files {
        let facts = file.to_str().unwrap();
        for format in ["text", "json"] {
            let one = ccattler(&["eval", "--facts", facts, "--format", format, "--workers", "1"]);
            let two = ccattler(&["eval", "--facts", facts, "--format", format, "--workers", "1", "--processes", "2"]);
            assert_eq!(one.status.code(), two.status.code(), "{facts} {format}: {}", text(&two.stderr));
            assert!(!one.stdout.is_empty(), "{facts}");
            assert!(one.stdout == two.stdout, "{facts} {format}: two processes printed\n{}\nagainst\n{}", text(&two.stdout), text(&one.stdout));
            assert_eq!(text(&one.stderr), text(&two.stderr), "{facts} {format}");
        }
    }
    // Three processes of two workers each, once.
    let facts = files[0].to_str().unwrap();
    let one = ccattler(&["eval", "--facts", facts]);
    let three = ccattler(&["eval", "--facts", facts, "--workers", "2", "--processes", "3"]);
    assert!(one.stdout == three.stdout, "{facts}: {}", text(&three.stderr));
}

#[test]
fn eval_refuses_a_number_of_processes_it_cannot_run() {
    for careless in ["0", "-2", "65", "two", "99999999999"] {
        let out = ccattler(&["eval", "--facts", "examples/intent.facts", &format!("--processes={careless}")]);
        assert_eq!(out.status.code(), Some(2), "{careless}");
        assert!(text(&out.stderr).contains("--processes"), "{careless}: {}", text(&out.stderr));
    }
}

/// The flags `--processes` gives the processes it starts name a bad hosts
/// file clearly, with the file and line, instead of waiting for peers.
#[test]
fn a_serving_eval_process_names_a_bad_hosts_file() {
    let dir = tempdir("eval-hosts");
    let hosts = dir.join("hosts");
    for (content, says) in [
        ("127.0.0.1:4000\n127.0.0.1:4000\n", "listed twice"),
        ("127.0.0.1:4000\nlocalhost\n", "line 2: \"localhost\" is not host:port"),
        ("127.0.0.1:4000\n:4001\n", "is not host:port"),
        ("127.0.0.1:0\n127.0.0.1:4001\n", "is not host:port"),
        ("# only a comment\n", "no process addresses"),
        ("127.0.0.1:4000\n", "process 1 is not below the 1 processes listed"),
    ] {
        std::fs::write(&hosts, content).unwrap();
        let out = ccattler(&["eval", "--facts", "examples/intent.facts", "--hosts", hosts.to_str().unwrap(), "--process", "1"]);
        assert_eq!(out.status.code(), Some(2), "{content:?}");
        let err = text(&out.stderr);
        assert!(err.contains(says) && err.contains(hosts.to_str().unwrap()), "{content:?}: {err}");
    }
}
