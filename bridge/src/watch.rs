//! The controller's watch: a task that reads etcd's watch stream into plain
//! messages ([`WatchReader`]), and [`decode`], the pure step that turns the
//! messages delivered so far into revisions for the engine.

use crate::controller::{Shared, LEADER_KEY};
use crate::etcd::{self, Held};
use crate::reconcile::Event;
use etcd_client::EventType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One watch response, as the loop needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchMsg {
    /// etcd's revision when it sent the response, and its events in order.
    Events { head: u64, events: Vec<RawEvent> },
    /// etcd cancelled the watch (a compaction passed it, …).
    Cancelled(String),
    /// The stream failed or ended.
    Broken(String),
}

/// A put (with the value) or a delete of one key.
#[derive(Clone, Debug, PartialEq)]
pub struct RawEvent {
    /// The key as text (a key that is not UTF-8 is marked, never dropped:
    /// the engine records it as rejected).
    pub key: String,
    pub value: Option<Held>,
    pub mod_revision: u64,
}

impl WatchMsg {
    fn of(resp: etcd_client::WatchResponse) -> WatchMsg {
        if resp.canceled() {
            return WatchMsg::Cancelled(format!("watch cancelled (compact revision {}, {})", resp.compact_revision(), resp.cancel_reason()));
        }
        let head = resp.header().map_or(0, |h| h.revision()) as u64;
        let events = resp
            .events()
            .iter()
            .filter_map(|ev| {
                let kv = ev.kv()?;
                let (key, held) = etcd::held(kv)?;
                let value = match ev.event_type() {
                    EventType::Put => Some(held),
                    EventType::Delete => None,
                };
                Some(RawEvent { key, value, mod_revision: kv.mod_revision() as u64 })
            })
            .collect();
        WatchMsg::Events { head, events }
    }
}

/// What the messages delivered so far amount to.
#[derive(Debug, Default, PartialEq)]
pub struct Decoded {
    /// Events by revision, only revisions after the one already applied.
    pub batch: Vec<(u64, Vec<Event>)>,
    /// Every key event in order (the secret book sees them all).
    pub observed: Vec<(String, Option<Held>)>,
    /// The newest revision etcd reported.
    pub head: u64,
    /// The leader key's last event: its mod revision, 0 if deleted (a
    /// standby judges leadership by it, and campaigns at once on a delete).
    pub leader_seen: Option<i64>,
    /// The watch is over: take a new snapshot (why).
    pub broken: Option<String>,
}

/// Groups the delivered messages' events by revision, skipping revisions at
/// or before `applied` (already in the snapshot). A cancelled or broken
/// message ends the batch: what came before it is still applied.
pub fn decode(messages: Vec<WatchMsg>, applied: u64) -> Decoded {
    let mut by_rev: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    let mut out = Decoded::default();
    for msg in messages {
        match msg {
            WatchMsg::Events { head, events } => {
                out.head = out.head.max(head);
                for e in events {
                    if e.key == LEADER_KEY {
                        out.leader_seen = Some(if e.value.is_some() { e.mod_revision as i64 } else { 0 });
                    }
                    out.observed.push((e.key.clone(), e.value.clone()));
                    by_rev.entry(e.mod_revision).or_default().push(Event { key: e.key, value: e.value });
                }
            }
            WatchMsg::Cancelled(why) | WatchMsg::Broken(why) => {
                out.broken = Some(why);
                break;
            }
        }
    }
    out.batch = by_rev.into_iter().filter(|(rev, _)| *rev > applied).collect();
    out
}

/// Reads the watch stream on a task of its own, so a backlog never waits
/// behind a transaction; the loop takes everything delivered at once.
///
/// What waits to be taken is bounded by its size ([`BACKLOG_KIB`]), not by a
/// count of responses: a write-back of 19,000 transactions comes back as as
/// many responses while the loop is busy writing. Read on as they come,
/// etcd streams them from memory; left unread, etcd 3.4 takes the watcher
/// off its fast path and re-reads the rest of the backlog from disk for each
/// 1,000 revisions it sends (30 s of settling after a 2.4 M-key cold start,
/// etcd at 1.5 cores, against 11 s).
pub struct WatchReader {
    rx: tokio::sync::mpsc::UnboundedReceiver<(WatchMsg, u32)>,
    room: Arc<tokio::sync::Semaphore>,
    bound: u32,
    task: tokio::task::JoinHandle<()>,
    _watcher: etcd_client::Watcher,
}

/// How much delivered watch data may wait to be taken, in KiB (about 2.5 M
/// events of the synthetic cluster's keys).
pub const BACKLOG_KIB: u32 = 512 * 1024;

/// A message's share of the backlog bound, in KiB (at least 1).
fn kib(msg: &WatchMsg) -> u32 {
    let bytes = match msg {
        WatchMsg::Events { events, .. } => events.iter().map(|e| 96 + e.key.len() + e.value.as_ref().map_or(0, |h| h.value.len())).sum(),
        _ => 0,
    };
    u32::try_from(bytes / 1024 + 1).unwrap_or(u32::MAX)
}

impl WatchReader {
    pub fn spawn(watcher: etcd_client::Watcher, stream: etcd_client::WatchStream, shared: Arc<Shared>) -> WatchReader {
        WatchReader::spawn_bounded(watcher, stream, shared, BACKLOG_KIB)
    }

    /// [`WatchReader::spawn`] with at most `bound` KiB waiting to be taken.
    pub fn spawn_bounded(watcher: etcd_client::Watcher, mut stream: etcd_client::WatchStream, shared: Arc<Shared>, bound: u32) -> WatchReader {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let bound = bound.max(1);
        let room = Arc::new(tokio::sync::Semaphore::new(bound as usize));
        let reader_room = room.clone();
        let task = tokio::spawn(async move {
            loop {
                let msg = match stream.message().await {
                    Ok(Some(resp)) => {
                        shared.health.received(resp.header().map_or(0, |h| h.revision()) as u64);
                        WatchMsg::of(resp)
                    }
                    Ok(None) => WatchMsg::Broken("watch stream ended".into()),
                    Err(e) => WatchMsg::Broken(e.to_string()),
                };
                let stop = !matches!(msg, WatchMsg::Events { .. });
                // Full: wait for the loop to take some (etcd holds the rest).
                let size = kib(&msg).min(bound);
                let Ok(permit) = reader_room.acquire_many(size).await else { return };
                permit.forget();
                if tx.send((msg, size)).is_err() || stop {
                    return;
                }
            }
        });
        WatchReader { rx, room, bound, task, _watcher: watcher }
    }

    /// Everything delivered so far, waiting for the first message.
    pub async fn next_all(&mut self) -> Vec<WatchMsg> {
        let mut all = Vec::new();
        let mut taken = 0u32;
        match self.rx.recv().await {
            Some((first, size)) => {
                all.push(first);
                taken += size;
            }
            None => all.push(WatchMsg::Broken("watch stream ended".into())),
        }
        while let Ok((more, size)) = self.rx.try_recv() {
            all.push(more);
            taken = taken.saturating_add(size);
        }
        self.room.add_permits(taken as usize);
        all
    }

    /// Whether delivered messages wait to be read.
    pub fn backlog(&self) -> bool {
        !self.rx.is_empty()
    }

    /// How many delivered messages wait to be read.
    pub fn waiting(&self) -> usize {
        self.rx.len()
    }

    /// What they hold, in KiB as the bound counts it.
    pub fn waiting_kib(&self) -> u32 {
        self.bound - self.room.available_permits().min(self.bound as usize) as u32
    }
}

impl Drop for WatchReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, rev: u64) -> RawEvent {
        RawEvent { key: key.into(), value: Some(Held { value: value.into(), mod_revision: rev as i64, create_revision: rev as i64 }), mod_revision: rev }
    }

    fn del(key: &str, rev: u64) -> RawEvent {
        RawEvent { key: key.into(), value: None, mod_revision: rev }
    }

    #[test]
    fn events_group_by_revision_across_responses_in_order() {
        let d = decode(
            vec![
                WatchMsg::Events { head: 11, events: vec![put("a", "1", 10), put("b", "2", 10), put("a", "3", 11)] },
                WatchMsg::Events { head: 12, events: vec![del("b", 12)] },
            ],
            0,
        );
        let revs: Vec<(u64, Vec<&str>)> = d.batch.iter().map(|(r, es)| (*r, es.iter().map(|e| e.key.as_str()).collect())).collect();
        assert_eq!(revs, vec![(10, vec!["a", "b"]), (11, vec!["a"]), (12, vec!["b"])]);
        assert_eq!(d.head, 12);
        assert_eq!(d.observed.len(), 4);
        assert!(d.broken.is_none() && d.leader_seen.is_none());
    }

    #[test]
    fn revisions_already_applied_are_skipped() {
        let d = decode(vec![WatchMsg::Events { head: 12, events: vec![put("a", "1", 10), put("a", "2", 12)] }], 10);
        assert_eq!(d.batch.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![12]);
    }

    #[test]
    fn the_leader_keys_last_event_is_noticed() {
        let d = decode(vec![WatchMsg::Events { head: 5, events: vec![put(LEADER_KEY, "x", 4), del(LEADER_KEY, 5)] }], 0);
        assert_eq!(d.leader_seen, Some(0), "deleted");
        let d = decode(vec![WatchMsg::Events { head: 5, events: vec![put(LEADER_KEY, "x", 5)] }], 0);
        assert_eq!(d.leader_seen, Some(5), "renewed");
    }

    #[test]
    fn a_cancel_ends_the_batch_but_keeps_what_came_before() {
        let d = decode(
            vec![
                WatchMsg::Events { head: 7, events: vec![put("a", "1", 7)] },
                WatchMsg::Cancelled("compacted".into()),
                WatchMsg::Events { head: 9, events: vec![put("b", "1", 9)] },
            ],
            0,
        );
        assert_eq!(d.batch.len(), 1);
        assert_eq!(d.broken.as_deref(), Some("compacted"));
    }

    #[test]
    fn a_key_that_is_not_utf8_arrives_marked_not_dropped() {
        // The watch used to skip such events (`key_str()` failed), so a
        // non-UTF-8 key written after a start was never recorded.
        let kv_key = etcd::key_text(vec![b'd', b'/', 0xff]);
        assert!(kv_key.starts_with(etcd::NOT_UTF8), "{kv_key:?}");
        let d = decode(vec![WatchMsg::Events { head: 3, events: vec![put(&kv_key, "1", 3)] }], 0);
        assert_eq!(d.batch[0].1[0].key, kv_key);
    }
}
