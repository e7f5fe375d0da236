//! Leadership judged by a heartbeat only the leader's etcd role can write.
//!
//! etcd checks no role on `LeaseKeepAlive`: any authenticated user can keep
//! any lease alive, so a leader key under a lease proves nothing once its
//! holder is dead. Here the leader key (`status/leader`, the autoscaler's
//! `intent/autoscaler/leader`) holds the leader's name under no lease, and
//! the leader rewrites it every TTL/3 — a put that only its role may make,
//! fenced by the key's create revision so it never revives a successor's key.
//! A standby judges the key by its own monotonic clock ([`Judge`]): a key
//! whose mod revision has not moved for TTL since the standby first saw that
//! revision is stale, and the standby deletes it (compare-and-swap on that
//! revision) and creates its own. A takeover is therefore bounded by TTL plus
//! how late the standby learns of the last renewal.
//!
//! Invariant: a leader that has not renewed for TTL − [`margin`], counted
//! from before its last successful renewal was *sent*, stops writing; a
//! standby takes over no earlier than TTL after it *saw* that renewal. Every
//! write is fenced by the key's create revision besides, so a late write of a
//! deposed leader fails.

use crate::etcd::Fence;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use std::time::{Duration, Instant};

/// How long before the TTL a leader stops trusting its last renewal.
pub fn margin(ttl: Duration) -> Duration {
    (ttl / 4).min(Duration::from_secs(2))
}

/// What a standby knows of the leader key: the mod revision it last saw
/// (0: absent) and since when.
#[derive(Clone, Debug)]
pub struct Judge {
    ttl: Duration,
    seen: Option<(i64, Instant)>,
}

impl Judge {
    pub fn new(ttl: Duration) -> Judge {
        Judge { ttl, seen: None }
    }

    /// The key was seen at `mod_revision` (0: absent) at `now`; the clock
    /// restarts only when the revision moved.
    pub fn saw(&mut self, mod_revision: i64, now: Instant) {
        match self.seen {
            Some((rev, _)) if rev == mod_revision => {}
            _ => self.seen = Some((mod_revision, now)),
        }
    }

    /// Whether a campaign may take the key at `now`: it is absent, or was
    /// not renewed for the TTL (never judged stale before it was seen).
    pub fn may_take(&self, now: Instant) -> bool {
        match self.seen {
            None => false,
            Some((0, _)) => true,
            Some((_, since)) => now.duration_since(since) >= self.ttl,
        }
    }

    /// Whether it is worth asking etcd: never looked, or the key may be takeable.
    pub fn worth_a_look(&self, now: Instant) -> bool {
        self.seen.is_none() || self.may_take(now)
    }
}

/// Campaigns for `key`: reads it and, if it is absent or the judge finds
/// it stale, takes it for `id`; the fence its writes compare and when the
/// write that created the key was sent (the leader's heartbeat counts from
/// there: a standby starts its clock no earlier than it sees that write, and
/// the read and delete before it may have been slow), or None while another
/// holds it.
pub async fn campaign(client: &mut Client, key: &str, id: &str, judge: &mut Judge) -> Result<Option<(Fence, Instant)>, etcd_client::Error> {
    let resp = client.get(key, None).await?;
    let now = Instant::now();
    let held = resp.kvs().first().map(|kv| kv.mod_revision());
    judge.saw(held.unwrap_or(0), now);
    if !judge.may_take(now) {
        return Ok(None);
    }
    if let Some(rev) = held {
        // While etcd is out of space no leader can renew (a put) and no
        // standby could create its key: deleting it would leave none, and
        // the leader is still the one to delete what filled etcd.
        if nospace(client).await? {
            return Ok(None);
        }
        // Stale: delete it as it was seen; another standby may win the race.
        let txn = Txn::new().when([Compare::mod_revision(key, CompareOp::Equal, rev)]).and_then([TxnOp::delete(key, None)]);
        if !client.txn(txn).await?.succeeded() {
            return Ok(None);
        }
    }
    let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(key, id, None)]);
    let sent = Instant::now();
    let resp = client.txn(txn).await?;
    if !resp.succeeded() {
        return Ok(None);
    }
    let create_revision = resp.header().map_or(0, |h| h.revision());
    Ok(Some((Fence { key: key.into(), create_revision }, sent)))
}

/// Whether etcd's NOSPACE alarm is raised (any user may list alarms).
pub async fn nospace(client: &mut Client) -> Result<bool, etcd_client::Error> {
    let resp = client.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await?;
    Ok(resp.alarms().iter().any(|a| a.alarm() == etcd_client::AlarmType::Nospace))
}

/// Whether the leader key is still the one `fence` names (a read: it works
/// while etcd is out of space).
pub async fn still_ours(client: &mut Client, fence: &Fence) -> Result<bool, etcd_client::Error> {
    let resp = client.get(fence.key.clone(), None).await?;
    Ok(resp.kvs().first().is_some_and(|kv| kv.create_revision() == fence.create_revision))
}

/// What one renewal of the leader key found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The key was rewritten: still ours.
    Renewed,
    /// etcd is out of space and refused the put, but the key is still ours
    /// (no standby deposes a leader then: see [`campaign`]); counts as
    /// renewed. The leader learns of the alarm this way even when it has
    /// nothing else to write.
    OursOutOfSpace,
    /// The key is no longer ours.
    Lost,
}

impl Renewal {
    pub fn is_ours(self) -> bool {
        self != Renewal::Lost
    }
}

/// Rewrites the leader key (its heartbeat).
pub async fn renew(client: &mut Client, fence: &Fence, id: &str) -> Result<Renewal, etcd_client::Error> {
    let txn = Txn::new().when([Compare::create_revision(fence.key.clone(), CompareOp::Equal, fence.create_revision)]).and_then([TxnOp::put(
        fence.key.clone(),
        id,
        None,
    )]);
    match client.txn(txn).await {
        Ok(resp) if resp.succeeded() => Ok(Renewal::Renewed),
        Ok(_) => Ok(Renewal::Lost),
        Err(e) if crate::etcd::is_nospace(&e) => Ok(if still_ours(client, fence).await? { Renewal::OursOutOfSpace } else { Renewal::Lost }),
        Err(e) => Err(e),
    }
}

/// Deletes the leader key if it is still ours (a standby takes over at once).
pub async fn resign(client: &mut Client, fence: &Fence) -> Result<bool, etcd_client::Error> {
    let txn = Txn::new()
        .when([Compare::create_revision(fence.key.clone(), CompareOp::Equal, fence.create_revision)])
        .and_then([TxnOp::delete(fence.key.clone(), None)]);
    Ok(client.txn(txn).await?.succeeded())
}

/// A leader's own view of its heartbeat: when its last successful renewal
/// was sent, whether etcd said the key is no longer ours, and how many
/// renewals etcd refused for want of space.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    ttl: Duration,
    renewed: Instant,
    lost: bool,
    out_of_space: u64,
}

impl Heartbeat {
    /// Starts from a renewal (or the creation) sent at `sent`.
    pub fn new(ttl: Duration, sent: Instant) -> Heartbeat {
        Heartbeat { ttl, renewed: sent, lost: false, out_of_space: 0 }
    }

    /// A renewal sent at `sent` was answered.
    pub fn answered(&mut self, sent: Instant, renewal: Renewal) {
        match renewal {
            Renewal::Renewed => self.renewed = self.renewed.max(sent),
            Renewal::OursOutOfSpace => {
                self.renewed = self.renewed.max(sent);
                self.out_of_space += 1;
            }
            Renewal::Lost => self.lost = true,
        }
    }

    /// Renewals etcd refused for want of space so far (a count, so that the
    /// loop that reads it sees each new refusal, even after the alarm
    /// seemed gone).
    pub fn refused_for_space(&self) -> u64 {
        self.out_of_space
    }

    /// Whether etcd said the key is no longer ours (not merely unrenewed).
    pub fn is_taken(&self) -> bool {
        self.lost
    }

    /// Whether leadership is over at `now`: the key is someone else's, or
    /// no renewal succeeded for TTL − margin (a standby may take it soon).
    pub fn is_lost(&self, now: Instant) -> bool {
        self.lost || now.duration_since(self.renewed) + margin(self.ttl) >= self.ttl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_stale_only_a_whole_ttl_after_its_revision_was_first_seen() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut j = Judge::new(ttl);
        assert!(!j.may_take(t0) && j.worth_a_look(t0), "never seen: look first");
        j.saw(7, t0);
        assert!(!j.may_take(t0 + ttl - Duration::from_millis(1)));
        // Seeing the same revision again does not restart the clock.
        j.saw(7, t0 + Duration::from_secs(5));
        assert!(j.may_take(t0 + ttl));
        // A renewal does.
        j.saw(9, t0 + Duration::from_secs(9));
        assert!(!j.may_take(t0 + ttl) && !j.worth_a_look(t0 + ttl));
        assert!(j.may_take(t0 + Duration::from_secs(19)));
        // Absent: at once.
        j.saw(0, t0 + Duration::from_secs(10));
        assert!(j.may_take(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn a_leader_stops_trusting_its_heartbeat_before_a_standby_may_take_it() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(3);
        let mut h = Heartbeat::new(ttl, t0);
        assert!(!h.is_lost(t0 + ttl - margin(ttl) - Duration::from_millis(1)));
        assert!(h.is_lost(t0 + ttl - margin(ttl)));
        h.answered(t0 + Duration::from_secs(1), Renewal::Renewed);
        assert!(!h.is_lost(t0 + ttl));
        // An older renewal answered late moves nothing back.
        h.answered(t0, Renewal::Renewed);
        assert!(!h.is_lost(t0 + ttl));
        h.answered(t0 + Duration::from_secs(2), Renewal::Lost);
        assert!(h.is_lost(t0 + Duration::from_secs(2)), "the key is someone else's");
    }

    #[test]
    fn a_renewal_refused_for_space_keeps_the_lead_and_is_counted() {
        // A leader with nothing else to write learns of etcd's NOSPACE alarm
        // only from its renewals (the controller once stayed healthy and
        // silent under the alarm because its write-back was idle).
        let t0 = Instant::now();
        let ttl = Duration::from_secs(3);
        let mut h = Heartbeat::new(ttl, t0);
        h.answered(t0 + Duration::from_secs(1), Renewal::OursOutOfSpace);
        assert!(!h.is_lost(t0 + ttl), "the key is still ours: it counts as renewed");
        assert_eq!(h.refused_for_space(), 1);
        h.answered(t0 + Duration::from_secs(2), Renewal::Renewed);
        h.answered(t0 + Duration::from_secs(3), Renewal::OursOutOfSpace);
        assert_eq!(h.refused_for_space(), 2, "each refusal counts, after a renewal that got through too");
        assert!(Renewal::OursOutOfSpace.is_ours() && Renewal::Renewed.is_ours() && !Renewal::Lost.is_ours());
    }
}
