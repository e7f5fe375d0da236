//! The cluster's gauges — nodes, instances and rollouts by state, unplaced
//! services — kept as the derived keys change. A change costs the keys it
//! touches; nothing walks every derived key on the controller's loop (at
//! 2.4 M derived keys such a walk took 0.23–0.45 s, and a put that arrived
//! during it waited that long).

use std::collections::BTreeMap;

/// Counts by what the derived keys say; [`ClusterCounts::of`] walks them
/// all (a cold start, and the tests' oracle), [`ClusterCounts::apply`]
/// follows a resolve's changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    /// `effective/node/N/state`, by value.
    pub nodes: BTreeMap<String, i64>,
    /// Instances with an `effective/instance/I/service` key, by their
    /// `state` key (`pending` without one).
    pub instances: BTreeMap<String, i64>,
    /// `status/rollout/…/state`, by the value's part before a `:`.
    pub rollouts: BTreeMap<String, i64>,
    /// Keys under `status/unplaced/`.
    pub unplaced: i64,
}

/// What a derived key counts towards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counted<'k> {
    Node,
    /// An instance's `service` (true) or `state` (false) key.
    Instance(&'k str, bool),
    Rollout,
    Unplaced,
}

fn counted(key: &str) -> Option<Counted<'_>> {
    if let Some(rest) = key.strip_prefix("effective/node/") {
        return (rest.split('/').count() == 2 && rest.ends_with("/state")).then_some(Counted::Node);
    }
    if let Some(rest) = key.strip_prefix("effective/instance/") {
        return match rest.split_once('/')? {
            (i, "service") => Some(Counted::Instance(i, true)),
            (i, "state") => Some(Counted::Instance(i, false)),
            _ => None,
        };
    }
    if key.starts_with("status/rollout/") && key.ends_with("/state") {
        return Some(Counted::Rollout);
    }
    key.starts_with("status/unplaced/").then_some(Counted::Unplaced)
}

/// Whether a key's value matters to the counts (note its changes).
pub fn is_counted(key: &str) -> bool {
    counted(key).is_some()
}

fn add(map: &mut BTreeMap<String, i64>, state: &str, d: i64) {
    // (A state already counted costs no allocation.)
    match map.get_mut(state) {
        Some(n) => {
            *n += d;
            if *n == 0 {
                map.remove(state);
            }
        }
        None if d != 0 => {
            map.insert(state.to_string(), d);
        }
        None => {}
    }
}

fn rollout_state(value: &str) -> &str {
    value.split(':').next().unwrap_or_default()
}

/// An instance's contribution: its state if it has a service key.
fn instance_state<'v>(service: bool, state: Option<&'v str>) -> Option<&'v str> {
    service.then(|| state.unwrap_or("pending"))
}

impl ClusterCounts {
    /// Counts `resolved` from scratch, in one walk.
    pub fn of<'a>(resolved: impl IntoIterator<Item = (&'a str, &'a str)>) -> ClusterCounts {
        let mut counts = ClusterCounts::default();
        // An instance's keys lie together (no name holds a `/`): one walk,
        // no lookup per instance.
        let mut current: Option<(&str, bool, Option<&str>)> = None;
        let flush = |counts: &mut ClusterCounts, c: Option<(&str, bool, Option<&str>)>| {
            if let Some(state) = c.and_then(|(_, service, state)| instance_state(service, state)) {
                add(&mut counts.instances, state, 1);
            }
        };
        for (k, v) in resolved {
            match counted(k) {
                Some(Counted::Node) => add(&mut counts.nodes, v, 1),
                Some(Counted::Rollout) => add(&mut counts.rollouts, rollout_state(v), 1),
                Some(Counted::Unplaced) => counts.unplaced += 1,
                Some(Counted::Instance(i, service)) => {
                    if current.is_none_or(|(c, ..)| c != i) {
                        flush(&mut counts, current.take());
                        current = Some((i, false, None));
                    }
                    let c = current.as_mut().expect("just set");
                    if service {
                        c.1 = true;
                    } else {
                        c.2 = Some(v);
                    }
                }
                None => {}
            }
        }
        flush(&mut counts, current);
        counts
    }

    /// Follows one resolve: `noted` holds each counted key that changed,
    /// once, with its value before (`None`: absent); `now` reads any key's
    /// value after.
    pub fn apply<'r>(&mut self, noted: &[(String, Option<String>)], now: impl Fn(&str) -> Option<&'r str>) {
        // An instance's two keys may change together: its contribution
        // before is read from the noted old values where they changed and
        // from now where they did not.
        let mut instances: BTreeMap<&str, (Option<Option<&str>>, Option<Option<&str>>)> = BTreeMap::new();
        for (key, old) in noted {
            match counted(key) {
                Some(Counted::Node) => {
                    if let Some(old) = old {
                        add(&mut self.nodes, old, -1);
                    }
                    if let Some(new) = now(key) {
                        add(&mut self.nodes, new, 1);
                    }
                }
                Some(Counted::Rollout) => {
                    if let Some(old) = old {
                        add(&mut self.rollouts, rollout_state(old), -1);
                    }
                    if let Some(new) = now(key) {
                        add(&mut self.rollouts, rollout_state(new), 1);
                    }
                }
                Some(Counted::Unplaced) => self.unplaced += i64::from(now(key).is_some()) - i64::from(old.is_some()),
                Some(Counted::Instance(i, service)) => {
                    let before = instances.entry(i).or_default();
                    if service {
                        before.0 = Some(old.as_deref());
                    } else {
                        before.1 = Some(old.as_deref());
                    }
                }
                None => {}
            }
        }
        for (i, (service_before, state_before)) in instances {
            let service_key = format!("effective/instance/{i}/service");
            let state_key = format!("effective/instance/{i}/state");
            let (service_now, state_now) = (now(&service_key), now(&state_key));
            let old = instance_state(service_before.unwrap_or(service_now).is_some(), state_before.unwrap_or(state_now));
            let new = instance_state(service_now.is_some(), state_now);
            if let Some(old) = old {
                add(&mut self.instances, old, -1);
            }
            if let Some(new) = new {
                add(&mut self.instances, new, 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(m: &BTreeMap<String, String>) -> impl Iterator<Item = (&str, &str)> {
        m.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn instances_are_counted_by_state_in_one_walk_a_prefix_of_another_name_included() {
        let keys = map(&[
            ("effective/instance/a-1/service", "a"),
            ("effective/instance/a-1/state", "running"),
            ("effective/instance/a/service", "a"),
            ("effective/instance/a/node", "n1"),
            ("effective/instance/a/state", "crashed"),
            ("effective/instance/b/service", "b"),
            // No service: not an instance the rules made (counted by none).
            ("effective/instance/c/state", "running"),
            ("effective/instance/d/service", "d"),
            ("effective/instance/d/state", "running"),
        ]);
        let counted = ClusterCounts::of(strs(&keys)).instances;
        let want: Vec<(String, i64)> = vec![("crashed".into(), 1), ("pending".into(), 1), ("running".into(), 2)];
        assert_eq!(counted.into_iter().collect::<Vec<_>>(), want);
    }

    #[test]
    fn node_views_and_rollout_details_are_not_counted_as_states() {
        let keys = map(&[
            ("effective/node/n1/state", "ready"),
            ("effective/node/n1/view/cpu", "4"),
            ("effective/node/n2/state", "cordoned"),
            ("status/rollout/web/state", "progressing:3/10"),
            ("status/rollout/web/step", "3"),
            ("status/unplaced/api", "no node has room"),
        ]);
        let c = ClusterCounts::of(strs(&keys));
        assert_eq!(c.nodes.into_iter().collect::<Vec<_>>(), vec![("cordoned".to_string(), 1), ("ready".to_string(), 1)]);
        assert_eq!(c.rollouts.into_iter().collect::<Vec<_>>(), vec![("progressing".to_string(), 1)]);
        assert_eq!(c.unplaced, 1);
    }

    /// The incremental counts against a walk of every key, over random
    /// sequences of changes to the counted keys and their neighbours.
    #[test]
    fn counts_kept_as_keys_change_equal_a_walk_of_every_key() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let keys = [
            "effective/node/n1/state",
            "effective/node/n2/state",
            "effective/node/n1/view/state",
            "effective/instance/a/service",
            "effective/instance/a/state",
            "effective/instance/a/node",
            "effective/instance/a-1/service",
            "effective/instance/a-1/state",
            "status/rollout/web/state",
            "status/rollout/api/state",
            "status/unplaced/web",
            "status/unplaced/api",
            "placement/instance/a",
        ];
        let values = ["ready", "running", "crashed", "progressing:1", "complete", "x:y:z", ""];
        for _ in 0..200 {
            let mut resolved: BTreeMap<String, String> = BTreeMap::new();
            let mut counts = ClusterCounts::default();
            for _ in 0..30 {
                // One resolve: a few keys change, each noted once.
                let mut noted = Vec::new();
                let mut touched = std::collections::BTreeSet::new();
                for _ in 0..1 + next(4) {
                    let key = keys[next(keys.len() as u64) as usize];
                    if !touched.insert(key) {
                        continue;
                    }
                    let old = resolved.get(key).cloned();
                    let new = (next(3) > 0).then(|| values[next(values.len() as u64) as usize].to_string());
                    match &new {
                        Some(v) => resolved.insert(key.to_string(), v.clone()),
                        None => resolved.remove(key),
                    };
                    if old != new && is_counted(key) {
                        noted.push((key.to_string(), old));
                    }
                }
                counts.apply(&noted, |k| resolved.get(k).map(String::as_str));
                assert_eq!(counts, ClusterCounts::of(strs(&resolved)), "after {noted:?} on {resolved:?}");
            }
        }
    }
}
