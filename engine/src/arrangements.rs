//! What each arrangement holds, for finding where the engine's memory goes:
//! with `CCATTLER_ENGINE_ARRANGEMENTS=1` (no other value), every worker tallies the updates
//! each arrangement operator holds (batches in, merges and drops out, from
//! differential's own log) and prints them, largest first, when it stops.

use differential_dataflow::logging::{DifferentialEvent, DifferentialEventBuilder};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use timely::logging::{TimelyEvent, TimelyEventBuilder};

/// Operator names by id, and the updates each arrangement operator holds.
#[derive(Default)]
struct Counts {
    names: HashMap<usize, String>,
    held: HashMap<usize, i64>,
}

/// A worker's tally; prints on drop.
pub struct Tally {
    worker: usize,
    counts: Rc<RefCell<Counts>>,
}

/// Starts tallying on this worker if `CCATTLER_ENGINE_ARRANGEMENTS` is set.
/// Call before building dataflows: operators take their loggers when built.
pub fn track(worker: &mut timely::worker::Worker) -> Option<Tally> {
    if !wanted(std::env::var_os("CCATTLER_ENGINE_ARRANGEMENTS").as_deref()) {
        return None;
    }
    let counts: Rc<RefCell<Counts>> = Rc::default();
    let mut register = worker.log_register()?;
    let c = counts.clone();
    register.insert::<TimelyEventBuilder, _>("timely", move |_time, data: &mut Option<Vec<(std::time::Duration, TimelyEvent)>>| {
        for (_, event) in data.iter().flatten() {
            if let TimelyEvent::Operates(op) = event {
                c.borrow_mut().names.insert(op.id, op.name.clone());
            }
        }
    });
    let c = counts.clone();
    register.insert::<DifferentialEventBuilder, _>("differential/arrange", move |_time, data: &mut Option<Vec<(std::time::Duration, DifferentialEvent)>>| {
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

/// Whether the variable's value asks for the tally: `1`, nothing else.
fn wanted(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

impl Drop for Tally {
    fn drop(&mut self) {
        let c = self.counts.borrow();
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
        for (name, (n, ops)) in rows.iter().take(60) {
            eprintln!("  {n:>10} {ops:>4}× {name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wanted;

    #[test]
    fn only_1_asks_for_the_tally_not_0_or_an_empty_value() {
        assert!(wanted(Some("1".as_ref())));
        for careless in ["0", "", "false", "yes", " 1"] {
            assert!(!wanted(Some(careless.as_ref())), "{careless:?}");
        }
        assert!(!wanted(None));
    }
}
