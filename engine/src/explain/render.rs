//! The text form of an explanation: an indented tree, one fact a line.

use super::whynot::{names, AssignWhyNot, WhyNot};
use super::{Explanation, How, Node, Premise};
use std::fmt::Write;

/// The one-line verdict of a why-not, when it has one: the first built-in
/// summary in the tree (`0/3 nodes can take huge-0 — fits nowhere`), or the
/// preemption's first reason. Shown first, before the derivation.
pub fn verdict(e: &Explanation) -> Option<String> {
    fn find(w: &WhyNot) -> Option<String> {
        if let Some(a) = &w.assign {
            if a.reasons.iter().all(|r| r.count > 0) && a.nodes > 0 {
                let verdict = if a.verdict.is_empty() { String::new() } else { format!(" — {}", a.verdict) };
                return Some(format!("{}/{} nodes can take {}{verdict}", a.fit, a.nodes, a.instance));
            }
            return Some(a.summary.clone());
        }
        if let Some(p) = w.preempt.first() {
            return Some(p.clone());
        }
        w.rules.iter().flat_map(|r| &r.failures).flat_map(|f| &f.failed).find_map(|l| l.because.as_deref().and_then(find))
    }
    e.why_not.as_ref().and_then(find).filter(|v| !v.is_empty())
}

pub fn text(e: &Explanation) -> String {
    let mut out = String::new();
    if let Some(v) = verdict(e).filter(|_| !e.holds) {
        let _ = writeln!(out, "# verdict: {v}");
    }
    // What the key is, in the rules' own words.
    if let Some(doc) = &e.doc {
        for l in doc.lines() {
            let _ = writeln!(out, "# {}: {l}", e.relation);
        }
    }
    let asked = match &e.value {
        Some(v) => format!("{} = {v}", e.key),
        None => e.key.clone(),
    };
    if e.holds {
        let _ = writeln!(out, "{asked} holds at revision {}", e.revision);
        for p in &e.proofs {
            node(&mut out, p, 1);
        }
    } else {
        let _ = writeln!(out, "{asked} does not hold at revision {}", e.revision);
        if !e.proofs.is_empty() {
            let _ = writeln!(out, "  the key holds other values:");
            for p in &e.proofs {
                node(&mut out, p, 2);
            }
        }
        match &e.why_not {
            Some(w) => why_not(&mut out, w, 1),
            None => {
                let _ = writeln!(out, "  (--why-not shows why)");
            }
        }
    }
    out
}

fn pad(out: &mut String, depth: usize) {
    out.push_str(&"  ".repeat(depth));
}

fn node(out: &mut String, n: &Node, depth: usize) {
    pad(out, depth);
    let fact = &n.fact;
    match &n.how {
        How::Input { key, value, mod_revision, writer, .. } => {
            let by = writer.as_ref().map(|w| format!(", writer {w}")).unwrap_or_default();
            let _ = writeln!(out, "{fact}  ← key {key} = {value:?} (mod_revision {mod_revision}{by})");
        }
        How::Rule { rule, bindings, premises, other_derivations } => {
            let more = if *other_derivations > 0 { format!(" [+{other_derivations} other derivation(s)]") } else { String::new() };
            let _ = writeln!(out, "{fact}  ← rule {}{more}", rule.location);
            pad(out, depth + 2);
            let _ = writeln!(out, "{}", rule.text);
            if !bindings.is_empty() {
                pad(out, depth + 2);
                let b: Vec<String> = shown(bindings);
                let _ = writeln!(out, "with {}", b.join(", "));
            }
            for p in premises {
                premise(out, p, depth + 1);
            }
        }
        How::Aggregate { rule, aggregate, contributions } => {
            let _ = writeln!(out, "{fact}  ← {aggregate} over {} contribution(s), rule {}", contributions.len(), rule.location);
            pad(out, depth + 2);
            let _ = writeln!(out, "{}", rule.text);
            for c in contributions {
                pad(out, depth + 1);
                let mark = if c.decides { "→" } else { "·" };
                let b: Vec<String> = shown(&c.bindings);
                let _ = writeln!(out, "{mark} {}  (with {})", c.value, b.join(", "));
                for p in &c.premises {
                    premise(out, p, depth + 2);
                }
            }
        }
        How::Assigned { premises, note, .. } => {
            let _ = writeln!(out, "{fact}  ← built-in assign");
            pad(out, depth + 2);
            let _ = writeln!(out, "{note}");
            for p in premises {
                node(out, p, depth + 1);
            }
        }
        How::Seen => {
            let _ = writeln!(out, "{fact}  (shown above)");
        }
        How::Cut => {
            let _ = writeln!(out, "{fact}  … (--depth reached)");
        }
    }
}

fn premise(out: &mut String, p: &Premise, depth: usize) {
    match p {
        Premise::Fact { proof, .. } => node(out, proof, depth),
        Premise::Absent { literal, fact, key } => {
            pad(out, depth);
            let k = key.as_ref().map(|k| format!(", no key {k}")).unwrap_or_default();
            let _ = writeln!(out, "{fact} is absent  ({literal}{k})");
        }
        Premise::Condition { literal } => {
            pad(out, depth);
            let _ = writeln!(out, "{literal}: holds");
        }
    }
}

fn why_not(out: &mut String, w: &WhyNot, depth: usize) {
    if let Some(i) = &w.input {
        pad(out, depth);
        let _ = match (&i.stored, &i.rejected) {
            (_, Some(r)) => writeln!(out, "{}: key {} was rejected: {r}", w.fact, i.key),
            (Some(v), None) => writeln!(out, "{}: key {} holds {v:?}", w.fact, i.key),
            (None, None) => writeln!(out, "{}: no key {}", w.fact, i.key),
        };
    }
    if !w.nearest.is_empty() && w.input.is_none() {
        pad(out, depth);
        let _ = writeln!(out, "nearest facts: {}", w.nearest.join(", "));
    }
    if let Some(a) = &w.assign {
        assign(out, a, depth);
    }
    for p in &w.preempt {
        pad(out, depth);
        let _ = writeln!(out, "preempt: {p}");
    }
    for r in &w.rules {
        pad(out, depth);
        let _ = writeln!(out, "rule {}: {}", r.rule.location, r.rule.text);
        if let Some(m) = &r.head_mismatch {
            pad(out, depth + 1);
            let _ = writeln!(out, "{m}");
            continue;
        }
        for f in &r.failures {
            pad(out, depth + 1);
            let b: Vec<String> = shown(&f.bindings);
            let with = if b.is_empty() { String::new() } else { format!("with {}: ", b.join(", ")) };
            let _ = writeln!(out, "{with}{} of {} literal(s) matched, then:", f.matched, r.literals);
            for l in &f.failed {
                pad(out, depth + 2);
                let _ = writeln!(out, "✗ {}  — {}", l.instance, l.reason);
                if !l.nearest.is_empty() {
                    pad(out, depth + 3);
                    let _ = writeln!(out, "nearest: {}", l.nearest.join(", "));
                }
                if let Some(p) = &l.proof {
                    node(out, p, depth + 3);
                }
                if let Some(b) = &l.because {
                    why_not(out, b, depth + 3);
                }
            }
        }
        if r.more_failures > 0 {
            pad(out, depth + 1);
            let _ = writeln!(out, "… and {} more failing binding(s)", r.more_failures);
        }
    }
}

fn assign(out: &mut String, a: &AssignWhyNot, depth: usize) {
    pad(out, depth);
    if a.reasons.iter().all(|r| r.count > 0) && a.nodes > 0 {
        let verdict = if a.verdict.is_empty() { String::new() } else { format!(" — {}", a.verdict) };
        let _ = writeln!(out, "{}/{} nodes can take {}{verdict}:", a.fit, a.nodes, a.instance);
    } else {
        let _ = writeln!(out, "{}", a.summary);
    }
    if let Some(p) = &a.pending {
        pad(out, depth + 1);
        let _ = writeln!(out, "pending: {p}");
    }
    for r in a.reasons.iter().filter(|r| r.count > 0) {
        pad(out, depth + 1);
        let _ = writeln!(out, "{} × {}: {}", r.count, r.reason, names(&r.nodes, 20));
    }
    for l in a.lacking.iter().take(20) {
        pad(out, depth + 2);
        let _ = writeln!(out, "{}: {} {} free of {} (needs {})", l.node, l.resource, l.free, l.total, l.needs);
    }
    if a.lacking.len() > 20 {
        pad(out, depth + 2);
        let _ = writeln!(out, "… {} more (the JSON lists every one)", a.lacking.len() - 20);
    }
}

/// `name = value` for each binding a user wrote (not the hidden `_#N` a `_`
/// binds in an aggregate rule; the JSON has them).
fn shown(b: &super::Bindings) -> Vec<String> {
    b.iter().filter(|(k, _)| !k.starts_with("_#")).map(|(k, v)| format!("{k} = {v}")).collect()
}
