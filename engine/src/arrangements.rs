//! What each arrangement holds, for finding where the engine's memory goes:
//! with `CCATTLER_ENGINE_ARRANGEMENTS=1` (no other value), every worker tallies the updates
//! each arrangement operator holds (batches in, merges and drops out, from
//! differential's own log) and prints them, largest first, when it stops.
//!
//! Where its time goes: with `CCATTLER_ENGINE_PROFILE=1`, every worker adds
//! up the time each operator runs (its own, not its children's), from when
//! [`profile_from_now`] is called, and prints the operators, longest first,
//! when it stops.

use differential_dataflow::logging::{DifferentialEvent, DifferentialEventBuilder};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use timely::logging::{StartStop, TimelyEvent, TimelyEventBuilder};

/// Whether workers add up operator time (set by [`profile_from_now`]).
static PROFILING: AtomicBool = AtomicBool::new(false);

/// Starts counting operator time (with `CCATTLER_ENGINE_PROFILE=1`): call
/// after what is not to be counted (a cold load) has run.
pub fn profile_from_now() {
    PROFILING.store(true, Ordering::Relaxed);
}

/// Operator names by id, the updates each arrangement operator holds, and
/// the time each operator ran (its own) and how often.
#[derive(Default)]
struct Counts {
    names: HashMap<usize, String>,
    held: HashMap<usize, i64>,
    ran: HashMap<usize, (Duration, u64)>,
    /// Operators running now, outermost first: (id, since, children's time).
    running: Vec<(usize, Duration, Duration)>,
}

/// A worker's tally; prints on drop.
pub struct Tally {
    worker: usize,
    counts: Rc<RefCell<Counts>>,
}

/// Starts tallying on this worker if `CCATTLER_ENGINE_ARRANGEMENTS` or
/// `CCATTLER_ENGINE_PROFILE` asks for it (differential's log is read for the first only).
/// Call before building dataflows: operators take their loggers when built.
pub fn track(worker: &mut timely::worker::Worker) -> Option<Tally> {
    let held = wanted(std::env::var_os("CCATTLER_ENGINE_ARRANGEMENTS").as_deref());
    let time = wanted(std::env::var_os("CCATTLER_ENGINE_PROFILE").as_deref());
    if !held && !time {
        return None;
    }
    let counts: Rc<RefCell<Counts>> = Rc::default();
    let mut register = worker.log_register()?;
    let c = counts.clone();
    register.insert::<TimelyEventBuilder, _>("timely", move |_time, data: &mut Option<Vec<(Duration, TimelyEvent)>>| {
        let mut c = c.borrow_mut();
        for (at, event) in data.iter().flatten() {
            match event {
                TimelyEvent::Operates(op) => {
                    c.names.insert(op.id, op.name.clone());
                }
                TimelyEvent::Schedule(s) if time => match s.start_stop {
                    StartStop::Start => c.running.push((s.id, *at, Duration::ZERO)),
                    StartStop::Stop => {
                        let Some((id, since, children)) = c.running.pop() else { continue };
                        let took = at.saturating_sub(since);
                        if let Some(parent) = c.running.last_mut() {
                            parent.2 += took;
                        }
                        if PROFILING.load(Ordering::Relaxed) {
                            let e = c.ran.entry(id).or_default();
                            e.0 += took.saturating_sub(children);
                            e.1 += 1;
                        }
                    }
                },
                _ => {}
            }
        }
    });
    let c = counts.clone();
    if !held {
        drop(register);
        return Some(Tally { worker: worker.index(), counts });
    }
    register.insert::<DifferentialEventBuilder, _>("differential/arrange", move |_time, data: &mut Option<Vec<(Duration, DifferentialEvent)>>| {
        let mut c = c.borrow_mut();
        for (_, event) in data.iter().flatten() {
            let (op, delta) = match event {
                DifferentialEvent::Batch(b) => (b.operator, b.length as i64),
                DifferentialEvent::Merge(m) => match m.complete {
                    Some(n) => (m.operator, n as i64 - m.length1 as i64 - m.length2 as i64),
                    None => continue,
                },
                DifferentialEvent::Drop(d) => (d.operator, -(d.length as i64)),
                _ => continue,
            };
            *c.held.entry(op).or_default() += delta;
        }
    });
    drop(register);
    Some(Tally { worker: worker.index(), counts })
}

impl Counts {
    /// An operator's name; one of differential's or timely's own (`Join`,
    /// `FlatMap`, …) with the name of the nearest operator built before it
    /// that has one of ours (`Bindings of rule N (file:line) into …`): the
    /// rule it was built for.
    fn described(&self, op: usize) -> String {
        let name = self.names.get(&op).map_or("?", String::as_str);
        if name.contains(' ') {
            return name.to_string();
        }
        let ours = (0..op).rev().find_map(|id| self.names.get(&id).filter(|n| n.contains("rule ")));
        match ours {
            Some(near) => format!("{name} after {near}"),
            None => name.to_string(),
        }
    }
}

/// What an arrangement is for, from the name `dataflow` gives it.
fn kind(name: &str) -> &'static str {
    match name {
        n if n.starts_with("Bindings of") && n.ends_with("(aggregated)") => "an aggregate's bindings, deduplicated",
        n if n.starts_with("Bindings of") && n.contains(" against ") => "bindings into an anti-join",
        n if n.starts_with("Bindings of") => "bindings into a join",
        n if n.starts_with("Arrange Bindings of") => "an aggregate's bindings, counted",
        n if n.starts_with("Arrange Distinct") => "a relation's rows, counted",
        n if n.starts_with("Distinct") => "a relation's rows, deduplicated",
        n if n.starts_with("Arrange Present") => "anti-join keys, counted",
        n if n.starts_with("Present") => "anti-join keys, deduplicated",
        n if n.starts_with("Arrange Aggregate") => "aggregate groups",
        n if n.starts_with("Aggregate") => "aggregate results",
        n if n.starts_with("Arrange ") && n.contains(" by ") => "a relation by join key",
        n if n.starts_with("Query ") => "a relation for queries",
        _ => "other",
    }
}

/// Whether the variable's value asks for the tally: `1`, nothing else.
fn wanted(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

impl Drop for Tally {
    fn drop(&mut self) {
        let c = self.counts.borrow();
        if !c.ran.is_empty() {
            let mut by_name: HashMap<String, (Duration, u64, usize)> = HashMap::new();
            for (op, (took, times)) in &c.ran {
                let e = by_name.entry(c.described(*op)).or_default();
                e.0 += *took;
                e.1 += times;
                e.2 += 1;
            }
            let mut rows: Vec<_> = by_name.into_iter().collect();
            rows.sort_by(|(a, (x, ..)), (b, (y, ..))| y.cmp(x).then_with(|| a.cmp(b)));
            let total: Duration = rows.iter().map(|(_, (took, ..))| *took).sum();
            eprintln!("operator time, worker {}: {:.3} s in {} operators", self.worker, total.as_secs_f64(), c.ran.len());
            for (name, (took, times, ops)) in rows.iter().take(60) {
                eprintln!("  {:>9.3} s {times:>9} runs {ops:>4}× {name}", took.as_secs_f64());
            }
        }
        if c.held.is_empty() {
            return;
        }
        let mut by_name: HashMap<&str, (i64, usize)> = HashMap::new();
        for (op, n) in &c.held {
            let name = c.names.get(op).map(String::as_str).unwrap_or("?");
            let e = by_name.entry(name).or_default();
            e.0 += n;
            e.1 += 1;
        }
        let mut rows: Vec<_> = by_name.into_iter().collect();
        rows.sort_by_key(|(name, (n, _))| (std::cmp::Reverse(*n), *name));
        let total: i64 = rows.iter().map(|(_, (n, _))| n).sum();
        eprintln!("arrangements, worker {}: {} updates held in {} operators", self.worker, total, c.held.len());
        let mut kinds: BTreeMap<&str, (i64, usize)> = BTreeMap::new();
        for (name, (n, ops)) in &rows {
            let e = kinds.entry(kind(name)).or_default();
            e.0 += n;
            e.1 += ops;
        }
        for (kind, (n, ops)) in &kinds {
            eprintln!("  {n:>10} {ops:>4}× ({kind})");
        }
        for (name, (n, ops)) in rows.iter().take(60) {
            eprintln!("  {n:>10} {ops:>4}× {name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wanted;

    #[test]
    fn each_arrangement_dataflow_names_is_summed_under_its_kind() {
        use super::kind;
        let r = "rule 3 (a.rules:7)";
        for (name, want) in [
            (format!("Bindings of {r} into placed"), "bindings into a join"),
            (format!("Bindings of {r} against kept"), "bindings into an anti-join"),
            (format!("Bindings of {r} (aggregated)"), "an aggregate's bindings, deduplicated"),
            (format!("Arrange Bindings of {r} (aggregated)"), "an aggregate's bindings, counted"),
            ("Arrange Distinct ready".into(), "a relation's rows, counted"),
            ("Distinct ready (recursive)".into(), "a relation's rows, deduplicated"),
            ("Arrange Present kept at [0]".into(), "anti-join keys, counted"),
            ("Present kept at [0]".into(), "anti-join keys, deduplicated"),
            (format!("Arrange Aggregate of {r}"), "aggregate groups"),
            (format!("Aggregate of {r}"), "aggregate results"),
            ("Arrange instance by [1]".into(), "a relation by join key"),
            ("Query endpoint".into(), "a relation for queries"),
            ("Import instance from its hub".into(), "other"),
        ] {
            assert_eq!(kind(&name), want, "{name}");
        }
    }

    #[test]
    fn only_1_asks_for_the_tally_not_0_or_an_empty_value() {
        assert!(wanted(Some("1".as_ref())));
        for careless in ["0", "", "false", "yes", " 1"] {
            assert!(!wanted(Some(careless.as_ref())), "{careless:?}");
        }
        assert!(!wanted(None));
    }
}
