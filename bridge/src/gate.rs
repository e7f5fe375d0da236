//! When a leading controller may plan and write: the write gate. Pure (the
//! caller passes the clock), so its rules are unit-tested:
//!
//! * After a write-back, nothing is planned until the watch has delivered
//!   the last revision written: the states in between are partial.
//! * Nothing is planned while watch data already delivered waits to be
//!   applied — for at most [`MAX_DEFER`], so a steady stream cannot starve
//!   the write-back.
//! * Refusals in a row back off, 100 ms doubling to 2 s.
//! * A watch that has not even received a revision the controller wrote
//!   is stuck once it stays so for long ([`WriteGate::stuck`]).

use std::time::{Duration, Instant};

/// How long a write-back may wait for watch data already delivered.
pub const MAX_DEFER: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct WriteGate {
    /// Plan only once the engine has applied this revision.
    wait_until: u64,
    /// Transactions refused in a row.
    refusals: u32,
    /// Since when planning has waited for delivered watch data.
    deferred: Option<Instant>,
    /// Since when the watch has not received `wait_until`.
    unreceived: Option<Instant>,
}

impl WriteGate {
    /// Whether to plan now, with the engine at `applied` and delivered watch
    /// data waiting (`backlog`) or not.
    pub fn open(&mut self, applied: u64, backlog: bool, now: Instant) -> bool {
        let behind = backlog && now.duration_since(*self.deferred.get_or_insert(now)) < MAX_DEFER;
        if !behind {
            self.deferred = None;
        }
        applied >= self.wait_until && !behind
    }

    /// Transactions committed up to revision `at` (0: nothing was written).
    pub fn committed(&mut self, at: u64) {
        self.wait_until = self.wait_until.max(at);
        self.refusals = 0;
    }

    /// A transaction was refused (a compare failed) at revision `at`: wait
    /// for the watch to reach it, and for the returned back-off.
    pub fn refused(&mut self, at: u64) -> Duration {
        self.wait_until = self.wait_until.max(at);
        self.refusals += 1;
        Duration::from_millis(50 << self.refusals.min(6)).min(Duration::from_secs(2))
    }

    pub fn refusals(&self) -> u32 {
        self.refusals
    }

    /// The revision waited for and for how long, once the watch has gone
    /// `bound` or longer without receiving it (`received`: the newest
    /// revision it delivered, applied or not). A watch only behind the
    /// engine is not stuck: what it received is being applied.
    pub fn stuck(&mut self, applied: u64, received: u64, now: Instant, bound: Duration) -> Option<(u64, Duration)> {
        if applied >= self.wait_until || received >= self.wait_until {
            self.unreceived = None;
            return None;
        }
        let waited = now.duration_since(*self.unreceived.get_or_insert(now));
        (waited >= bound).then_some((self.wait_until, waited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_write_it_waits_for_the_watch_to_reach_it() {
        let (mut g, t) = (WriteGate::default(), Instant::now());
        assert!(g.open(5, false, t));
        g.committed(9);
        assert!(!g.open(8, false, t), "the watch has not delivered our own write yet");
        assert!(g.open(9, false, t));
    }

    #[test]
    fn delivered_watch_data_defers_planning_for_at_most_a_second() {
        let (mut g, t) = (WriteGate::default(), Instant::now());
        assert!(!g.open(1, true, t));
        assert!(!g.open(1, true, t + Duration::from_millis(900)));
        assert!(g.open(1, true, t + MAX_DEFER), "a steady stream must not starve the write-back");
        // Caught up: the next backlog is deferred afresh.
        assert!(g.open(1, false, t + MAX_DEFER));
        assert!(!g.open(1, true, t + MAX_DEFER + Duration::from_millis(1)));
    }

    #[test]
    fn a_watch_that_never_receives_our_own_write_is_stuck_after_the_bound() {
        let (mut g, t, bound) = (WriteGate::default(), Instant::now(), Duration::from_secs(30));
        g.committed(9);
        assert_eq!(g.stuck(5, 8, t, bound), None);
        assert_eq!(g.stuck(5, 8, t + Duration::from_secs(29), bound), None);
        assert_eq!(g.stuck(5, 8, t + bound, bound), Some((9, bound)));
        // Received, only not yet applied (a busy engine): not stuck, and the
        // wait counts afresh afterwards.
        assert_eq!(g.stuck(5, 9, t + Duration::from_secs(40), bound), None);
        g.committed(12);
        assert_eq!(g.stuck(9, 11, t + Duration::from_secs(41), bound), None);
        assert_eq!(g.stuck(9, 11, t + Duration::from_secs(70), bound), None);
        assert!(g.stuck(9, 11, t + Duration::from_secs(71), bound).is_some());
        assert_eq!(g.stuck(12, 11, t + Duration::from_secs(72), bound), None, "applied");
    }

    #[test]
    fn refusals_back_off_doubling_to_two_seconds_and_reset_on_a_commit() {
        let mut g = WriteGate::default();
        let waits: Vec<u64> = (0..8).map(|i| g.refused(i).as_millis() as u64).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(g.refusals(), 8);
        g.committed(3);
        assert_eq!(g.refusals(), 0);
        assert!(!g.open(6, false, Instant::now()), "still waits for the last refusal's revision");
        assert!(g.open(7, false, Instant::now()));
    }
}
