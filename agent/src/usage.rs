//! What a node reports of its instances' use: per service, summed, and
//! written only when it is worth a write.
//!
//! Sampled every 5 s per instance, use is held back per node: the figures
//! `observed/node/N/usage/S/{cpu,memory}` change when any service's sum moved
//! by more than a tenth (or its rounding step) and [`MIN_PERIOD`] passed since
//! the last change, or when any differs at all after [`MAX_PERIOD`]. So a
//! node's usage costs at most one write per 30 s however many instances it
//! runs and however their use wanders, as metrics-server keeps kubelets'
//! samples out of etcd (docs/operations.md, "What a cluster writes"). A
//! service whose last instance left the node is dropped at once: that change
//! rides on the write that reports the instance gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The least time between two changes of a node's usage figures.
pub const MIN_PERIOD: Duration = Duration::from_secs(30);
/// The most time a changed figure waits, however little it moved.
pub const MAX_PERIOD: Duration = Duration::from_secs(300);
/// The rounding steps: 10 millicores, 4 MiB (the agent rounds samples to them).
const CPU_STEP: i64 = 10;
const MEMORY_STEP: i64 = 4;

/// Per service: (millicores, MiB).
pub type Sums = BTreeMap<String, (i64, i64)>;

/// The figures a node reports, and when they last changed.
#[derive(Debug, Default)]
pub struct Held {
    figures: Sums,
    changed_at: Option<Instant>,
}

impl Held {
    /// What is reported now.
    pub fn figures(&self) -> &Sums {
        &self.figures
    }

    /// Takes the latest sums; returns whether the reported figures changed.
    pub fn offer(&mut self, now_sums: Sums, now: Instant) -> bool {
        let gone = self.figures.keys().any(|s| !now_sums.contains_key(s));
        let since = self.changed_at.map(|t| now.saturating_duration_since(t));
        let due = since.is_none_or(|d| d >= MIN_PERIOD);
        let any_moved = now_sums.iter().any(|(s, &now)| self.figures.get(s).is_none_or(|&held| moved(held, now)));
        let stale = since.is_none_or(|d| d >= MAX_PERIOD) && now_sums != self.figures;
        // (Either implies the figures differ.)
        if due && (any_moved || stale) {
            self.figures = now_sums;
            self.changed_at = Some(now);
            return true;
        }
        if gone {
            // Only the departures, at once; the rest waits its turn.
            self.figures.retain(|s, _| now_sums.contains_key(s));
            return true;
        }
        false
    }
}

/// Whether a sum moved enough to be worth a write: by more than a tenth of
/// what is reported, and more than one rounding step.
fn moved((cpu, mem): (i64, i64), (now_cpu, now_mem): (i64, i64)) -> bool {
    let far = |held: i64, now: i64, step: i64| now.abs_diff(held) > (held.unsigned_abs() / 10).max(step as u64);
    far(cpu, now_cpu, CPU_STEP) || far(mem, now_mem, MEMORY_STEP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(list: &[(&str, i64, i64)]) -> Sums {
        list.iter().map(|(s, c, m)| (s.to_string(), (*c, *m))).collect()
    }

    #[test]
    fn the_first_sums_are_reported_at_once_then_held_for_the_min_period() {
        let t0 = Instant::now();
        let mut h = Held::default();
        assert!(h.offer(sums(&[("web", 500, 100)]), t0));
        // Doubled, but only 5 s later: held.
        assert!(!h.offer(sums(&[("web", 1000, 100)]), t0 + Duration::from_secs(5)));
        assert_eq!(h.figures()["web"], (500, 100));
        // Due now, and it moved: reported.
        assert!(h.offer(sums(&[("web", 1000, 100)]), t0 + MIN_PERIOD));
        assert_eq!(h.figures()["web"], (1000, 100));
    }

    #[test]
    fn a_move_within_the_dead_band_waits_for_the_max_period() {
        let t0 = Instant::now();
        let mut h = Held::default();
        h.offer(sums(&[("web", 1000, 400)]), t0);
        // 9 % more cpu, 1 step more memory: not worth a write...
        assert!(!h.offer(sums(&[("web", 1090, 404)]), t0 + MIN_PERIOD * 2));
        // ... until the max period, when any difference is.
        assert!(h.offer(sums(&[("web", 1090, 404)]), t0 + MAX_PERIOD));
        assert_eq!(h.figures()["web"], (1090, 404));
        // Unchanged after that: nothing to write, ever.
        assert!(!h.offer(sums(&[("web", 1090, 404)]), t0 + MAX_PERIOD * 3));
    }

    #[test]
    fn small_sums_move_by_more_than_a_step_before_they_count() {
        let t0 = Instant::now();
        let mut h = Held::default();
        h.offer(sums(&[("idle", 0, 0)]), t0);
        // 10 millicores and 4 MiB are one rounding step: noise.
        assert!(!h.offer(sums(&[("idle", 10, 4)]), t0 + MIN_PERIOD));
        assert!(h.offer(sums(&[("idle", 20, 0)]), t0 + MIN_PERIOD));
    }

    #[test]
    fn a_service_that_left_is_dropped_at_once_and_a_new_one_waits_its_turn() {
        let t0 = Instant::now();
        let mut h = Held::default();
        h.offer(sums(&[("web", 500, 100), ("api", 200, 50)]), t0);
        // api's last instance left and db's first came, 1 s later.
        assert!(h.offer(sums(&[("web", 500, 100), ("db", 300, 60)]), t0 + Duration::from_secs(1)));
        assert_eq!(h.figures(), &sums(&[("web", 500, 100)]));
        // db is reported when the period allows.
        assert!(h.offer(sums(&[("web", 500, 100), ("db", 300, 60)]), t0 + MIN_PERIOD));
        assert_eq!(h.figures(), &sums(&[("web", 500, 100), ("db", 300, 60)]));
    }

    #[test]
    fn use_that_wanders_by_a_fifth_every_sample_changes_the_figures_once_per_min_period() {
        let t0 = Instant::now();
        let mut h = Held::default();
        let mut changes = 0;
        // Ten instances' worth of web and api, each sample ±20 %, for an hour of 5 s samples.
        for k in 0..720u32 {
            let f = if k % 2 == 0 { 12 } else { 8 };
            let now = sums(&[("web", 100 * f, 40 * f), ("api", 50 * f, 20 * f)]);
            changes += usize::from(h.offer(now, t0 + Duration::from_secs(5 * u64::from(k))));
        }
        // One change per 30 s at most: 120 in an hour.
        assert!(changes <= 120, "{changes} changes");
        assert!(changes >= 100, "{changes} changes: it stopped reporting");
    }

    #[test]
    fn huge_and_negative_sums_never_overflow_the_dead_band() {
        let t0 = Instant::now();
        let mut h = Held::default();
        h.offer(sums(&[("x", i64::MAX, i64::MIN)]), t0);
        assert!(h.offer(sums(&[("x", i64::MIN, i64::MAX)]), t0 + MIN_PERIOD));
    }
}
