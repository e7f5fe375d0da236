//! Rule tests: data files of cases, each with facts in, a sequence of changes,
//! and expectations after each step. `ccattler test` runs them through the
//! same [`Session`] as `eval` (engine plus write-back to a fixed point). The
//! format is documented in docs/testing.md (its examples are run by the
//! tests).

use crate::factfile;
use crate::session::{Session, SessionError, Write};
use ccattler_parser::program::Program;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TestFileError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    Contains(Vec<(String, String)>),
    Exact(Vec<(String, String)>),
    Absent(Vec<String>),
    Count(String, usize),
    Rejected(Vec<String>),
    /// Output keys with two values (a conflict), expected.
    Conflict(Vec<String>),
}

#[derive(Clone, Debug)]
pub struct Check {
    pub line: usize,
    pub expect: Expect,
}

/// One step: writes applied in one revision, then checks.
#[derive(Clone, Debug, Default)]
pub struct Step {
    pub line: usize,
    pub writes: Vec<Write>,
    pub checks: Vec<Check>,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub file: String,
    pub line: usize,
    /// The first step is `given`.
    pub steps: Vec<Step>,
}

#[derive(Clone, Copy, PartialEq)]
enum Section {
    None,
    Writes,
    Contains,
    Exact,
    Absent,
    Rejected,
    Conflict,
}

/// Parses a test file into cases; `include PATH` lines read facts files
/// relative to the test file's directory.
pub fn parse(file: &str, text: &str) -> Result<Vec<Case>, TestFileError> {
    let dir = std::path::Path::new(file).parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    parse_with(file, text, &|path: &str| {
        let p = dir.join(path);
        std::fs::read_to_string(&p).map(|t| (p.display().to_string(), t)).map_err(|e| format!("include {}: {e}", p.display()))
    })
}

/// [`parse`] with `include PATH` resolved by `include` (to the included
/// file's name and text).
pub fn parse_with(file: &str, text: &str, include: &dyn Fn(&str) -> Result<(String, String), String>) -> Result<Vec<Case>, TestFileError> {
    let mut cases: Vec<Case> = Vec::new();
    let mut section = Section::None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| TestFileError { file: file.to_string(), line, message };
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some(name) = t.strip_prefix("case ") {
            cases.push(Case { name: name.trim().to_string(), file: file.to_string(), line, steps: Vec::new() });
            section = Section::None;
            continue;
        }
        let Some(case) = cases.last_mut() else {
            return Err(err(format!("expected `case NAME` before `{t}`")));
        };
        match t {
            "given" | "when" => {
                if (t == "given") != case.steps.is_empty() {
                    return Err(err("`given` comes once, first in a case; later steps are `when`".into()));
                }
                case.steps.push(Step { line, ..Step::default() });
                section = Section::Writes;
                continue;
            }
            "expect contains" | "expect exact" | "expect absent" | "expect rejected" | "expect conflict" => {
                let step = case.steps.last_mut().ok_or_else(|| err("`expect` needs a `given` before it".into()))?;
                let (s, e) = match t {
                    "expect contains" => (Section::Contains, Expect::Contains(vec![])),
                    "expect exact" => (Section::Exact, Expect::Exact(vec![])),
                    "expect absent" => (Section::Absent, Expect::Absent(vec![])),
                    "expect conflict" => (Section::Conflict, Expect::Conflict(vec![])),
                    _ => (Section::Rejected, Expect::Rejected(vec![])),
                };
                step.checks.push(Check { line, expect: e });
                section = s;
                continue;
            }
            _ => {}
        }
        if let Some(rest) = t.strip_prefix("expect count ") {
            let step = case.steps.last_mut().ok_or_else(|| err("`expect` needs a `given` before it".into()))?;
            let (prefix, n) = rest.split_once('=').ok_or_else(|| err("expected `expect count PREFIX = N`".into()))?;
            let n = n.trim().parse().map_err(|_| err(format!("`{}` is not a count", n.trim())))?;
            step.checks.push(Check { line, expect: Expect::Count(prefix.trim().to_string(), n) });
            section = Section::None;
            continue;
        }
        if t.starts_with("expect") {
            return Err(err(format!("unknown expectation `{t}`: use expect contains, exact, absent, rejected, conflict, or count PREFIX = N")));
        }
        let step = case.steps.last_mut();
        match (section, step) {
            (Section::Writes, Some(step)) => {
                if let Some(path) = t.strip_prefix("include ") {
                    let (name, facts) = include(path.trim()).map_err(err)?;
                    let lines = factfile::parse(&name, &facts).map_err(|e| err(format!("{name}:{}: {}", e.line, e.message)))?;
                    step.writes.extend(lines.into_iter().map(|f| (f.key, Some(f.value))));
                } else if let Some(key) = t.strip_prefix("- ") {
                    step.writes.push((key.trim().to_string(), None));
                } else {
                    let (k, v) = fact(file, line, t)?;
                    step.writes.push((k, Some(v)));
                }
            }
            (Section::Contains | Section::Exact, Some(step)) => {
                let (k, v) = fact(file, line, t)?;
                match &mut step.checks.last_mut().expect("section has a check").expect {
                    Expect::Contains(f) | Expect::Exact(f) => f.push((k, v)),
                    _ => unreachable!(),
                }
            }
            (Section::Absent | Section::Rejected | Section::Conflict, Some(step)) => match &mut step.checks.last_mut().expect("section has a check").expect {
                Expect::Absent(keys) | Expect::Rejected(keys) | Expect::Conflict(keys) => keys.push(t.to_string()),
                _ => unreachable!(),
            },
            _ => return Err(err(format!("`{t}` is outside a section: start one with given, when or expect"))),
        }
    }
    for c in &cases {
        if c.steps.is_empty() {
            return Err(TestFileError { file: file.to_string(), line: c.line, message: format!("case `{}` has no `given`", c.name) });
        }
    }
    Ok(cases)
}

fn fact(file: &str, line: usize, t: &str) -> Result<(String, String), TestFileError> {
    let f = factfile::parse(file, t).map_err(|e| TestFileError { file: file.to_string(), line, message: e.message })?;
    let f = f.into_iter().next().ok_or_else(|| TestFileError { file: file.to_string(), line, message: "expected `KEY = VALUE`".into() })?;
    Ok((f.key, f.value))
}

/// A failed expectation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    pub line: usize,
    /// One line per difference: `missing K = V`, `unexpected K = V`, `K: expected V, got W`.
    pub differences: Vec<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct CaseResult {
    pub name: String,
    pub file: String,
    pub line: usize,
    pub failures: Vec<Failure>,
    /// Set when the case could not run (e.g. no fixed point).
    pub error: Option<String>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.error.is_none()
    }
}

/// Runs one case on a fresh engine.
pub fn run(program: &Arc<Program>, case: &Case) -> CaseResult {
    let mut result = CaseResult { name: case.name.clone(), file: case.file.clone(), line: case.line, failures: vec![], error: None };
    let run = || -> Result<Vec<Failure>, SessionError> {
        let mut session = Session::new(program.clone(), 1)?;
        let mut failures = Vec::new();
        for step in &case.steps {
            let conflicts_before: std::collections::BTreeSet<String> = session.conflicts().map(|c| c.key.clone()).collect();
            session.write(&step.writes)?;
            for check in &step.checks {
                let diffs = evaluate(&session, &check.expect);
                if !diffs.is_empty() {
                    failures.push(Failure { line: check.line, differences: diffs });
                }
            }
            // What the step did and did not expect: a rejected write, a new
            // conflict, a key no rule reads — each a failure unless expected.
            let expected = |f: fn(&Expect) -> Option<&Vec<String>>| -> Vec<&String> { step.checks.iter().filter_map(|c| f(&c.expect)).flatten().collect() };
            let rejected_ok = expected(|e| if let Expect::Rejected(k) = e { Some(k) } else { None });
            let conflict_ok = expected(|e| if let Expect::Conflict(k) = e { Some(k) } else { None });
            let mut surprises = Vec::new();
            for (key, value) in step.writes.iter().filter_map(|(k, v)| Some((k, v.as_ref()?))) {
                if let Some(why) = session.rejected().get(key) {
                    if !rejected_ok.contains(&key) {
                        surprises.push(format!("rejected   {key}: {why} (if that is the point: expect rejected)"));
                    }
                } else if let Some(crate::facts::Lint::Unread { near }) = crate::facts::lint(program, key, value) {
                    if !crate::facts::is_output_key(program, key) {
                        let hint = near.map(|n| format!("; did you mean {n}?")).unwrap_or_default();
                        surprises.push(format!("unread     {key}: no rule reads it{hint}"));
                    }
                }
            }
            for c in session.conflicts().filter(|c| !conflicts_before.contains(&c.key) && !conflict_ok.contains(&&c.key)) {
                let values: Vec<String> = c.values.iter().map(|(v, rules)| format!("{v:?} from {}", rules.join(", "))).collect();
                surprises.push(format!("conflict   {}: {} (if that is the point: expect conflict)", c.key, values.join("; ")));
            }
            if !surprises.is_empty() {
                failures.push(Failure { line: step.line, differences: surprises });
            }
        }
        Ok(failures)
    };
    match run() {
        Ok(f) => result.failures = f,
        Err(e) => result.error = Some(e.to_string()),
    }
    result
}

fn evaluate(session: &Session, expect: &Expect) -> Vec<String> {
    let derived = session.derived();
    let mut diffs = Vec::new();
    match expect {
        Expect::Contains(facts) => {
            for (k, v) in facts {
                match derived.get(k) {
                    None => diffs.push(format!("missing    {k} = {v}")),
                    Some(got) if v != "*" && got != v => diffs.push(format!("different  {k}: expected {v}, got {got}")),
                    _ => {}
                }
            }
        }
        Expect::Exact(facts) => {
            let want: BTreeMap<&str, &str> = facts.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let prefixes: Vec<String> = facts.iter().map(|(k, _)| k.rsplit_once('/').map_or(k.clone(), |(p, _)| format!("{p}/"))).collect();
            for (k, v) in &want {
                match derived.get(*k) {
                    None => diffs.push(format!("missing    {k} = {v}")),
                    Some(got) if *v != "*" && got != v => diffs.push(format!("different  {k}: expected {v}, got {got}")),
                    _ => {}
                }
            }
            for (k, v) in derived {
                if prefixes.iter().any(|p| k.starts_with(p.as_str())) && !want.contains_key(k.as_str()) {
                    diffs.push(format!("unexpected {k} = {v}"));
                }
            }
        }
        Expect::Absent(keys) => {
            for k in keys {
                if let Some(v) = derived.get(k) {
                    diffs.push(format!("unexpected {k} = {v}"));
                }
            }
        }
        Expect::Count(prefix, n) => {
            let got = derived.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(prefix.as_str())).count();
            if got != *n {
                diffs.push(format!("count      {prefix}: expected {n}, got {got}"));
            }
        }
        Expect::Rejected(keys) => {
            for k in keys {
                let derived_record = k.starts_with(crate::facts::REJECTED_DERIVED) && session.record(k).is_some();
                if !session.rejected().contains_key(k) && !derived_record {
                    diffs.push(format!("accepted   {k} (expected it rejected)"));
                }
            }
        }
        Expect::Conflict(keys) => {
            for k in keys {
                if !session.conflicts().any(|c| c.key == *k) {
                    diffs.push(format!("no conflict {k} (expected two values)"));
                }
            }
        }
    }
    diffs
}

/// Renders a failed case for a terminal.
pub fn render(r: &CaseResult) -> String {
    let mut out = String::new();
    if let Some(e) = &r.error {
        out += &format!("FAIL {}:{}: {}\n  error: {e}\n", r.file, r.line, r.name);
    }
    for f in &r.failures {
        out += &format!("FAIL {}:{}: {}\n", r.file, f.line, r.name);
        for d in &f.differences {
            out += &format!("  {d}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cases_steps_and_expectations() {
        let text = "# c\ncase one\ngiven\n  a = 1\nexpect contains\n  b = *\nwhen\n  - a\n  c = \"x y\"\nexpect absent\n  b\nexpect count p/ = 2\ncase two\ngiven\nexpect exact\n  q/r = 1\n";
        let cases = parse("t.test", text).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].steps.len(), 2);
        assert_eq!(cases[0].steps[1].writes, vec![("a".to_string(), None), ("c".to_string(), Some("x y".to_string()))]);
        assert_eq!(cases[0].steps[1].checks[1].expect, Expect::Count("p/".into(), 2));
        assert_eq!(cases[1].steps[0].checks[0].line, 15);
    }

    #[test]
    fn rejects_malformed_files_with_a_line() {
        assert_eq!(parse("t", "given\n").unwrap_err().line, 1);
        assert_eq!(parse("t", "case x\nexpect contains\n").unwrap_err().line, 2);
        assert_eq!(parse("t", "case x\ngiven\nexpect maybe\n").unwrap_err().line, 3);
        assert_eq!(parse("t", "case x\ngiven\nexpect count p = many\n").unwrap_err().line, 3);
        assert_eq!(parse("t", "case x\n").unwrap_err().line, 1);
        assert_eq!(parse("t", "case x\ngiven\n  include no-such.facts\n").unwrap_err().line, 3);
    }

    #[test]
    fn an_included_facts_file_is_part_of_its_step() {
        let include =
            |p: &str| if p == "nodes.facts" { Ok(("nodes.facts".to_string(), "# n\nn/1 = a\nn/2 = \"b c\"\n".to_string())) } else { Err(format!("no {p}")) };
        let cases = parse_with("t.test", "case x\ngiven\n  include nodes.facts\n  m = 1\n", &include).unwrap();
        let writes: Vec<_> = cases[0].steps[0].writes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        assert_eq!(writes, [("n/1", Some("a")), ("n/2", Some("b c")), ("m", Some("1"))]);
    }
}
