//! The built-in `assign(pending, offer, spread, restricted, allowed)`:
//! capacity-respecting greedy assignment of instances to nodes. What is
//! eligible and what is preferred are rules; this only hands out capacity,
//! lazily and deterministically.
//!
//! Semantics (also in docs/language.md):
//! * `offer(node, cpu, memory, score)`: the nodes that take instances, their
//!   room, and their preference (lower first).
//! * `spread(service, node, count)`: instances of the service already on the
//!   node (fewer first); a pair that is not listed counts 0.
//! * `restricted(service)`: the service may only use nodes `allowed(service,
//!   node)` lists; any other service may use every offered node.
//! * Pending instances are taken in order of (service, instance) by text.
//!   Each goes to the node, among those its service may use that still have
//!   room for both its cpu and memory, with the smallest (spread + instances
//!   of the service assigned there earlier in this round, score + load this
//!   round, node name), where load this round is the permille of the node's
//!   offered cpu plus the permille of its offered memory that this round has
//!   handed out (so one big round spreads like many small ones). The node is
//!   charged.
//! * A node that cannot fit an instance of a service is not offered to that
//!   service's later instances in the round (instances of one service ask for
//!   the same resources, so it could not fit them either).
//! * An instance no node can take stays unassigned.
//!
//! Cost: services are done one after another; a service's instances take the
//! best nodes of one ranking shared by all services, walked from where the
//! service's previous instance stopped, and its few listed nodes (spread,
//! allowed) beside it. So a round costs O((pending + offers + spread +
//! allowed) · log) when nodes have room; (service, node) pairs are never built
//! for services that may use every node.

use crate::value::{Row, Value};
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Bound;

/// One pending instance: (instance, service, cpu, memory).
pub type Pending = (Value, Value, i64, i64);
/// A node's offer: (node, cpu, memory, score).
pub type Offer = (Value, i64, i64, i64);
/// Instances of a service on a node: (service, node, count).
pub type Spread = (Value, Value, i64);

/// Orders text values by their text (interning order is not user-visible order).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct ByText(Value);
impl Ord for ByText {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.cmp_text(&o.0)
    }
}
impl PartialOrd for ByText {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Everything one round of `assign` reads.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub pending: Vec<Pending>,
    pub offers: Vec<Offer>,
    pub spread: Vec<Spread>,
    pub restricted: Vec<Value>,
    pub allowed: Vec<(Value, Value)>,
}

/// A node during a round: what it offered, what is left, its base score.
struct Room {
    offered: (i64, i64),
    left: (i64, i64),
    base: i64,
}

impl Room {
    /// The base score plus what this round handed out, in permille.
    fn score(&self) -> i64 {
        let permille = |total: i64, rest: i64| {
            if total > 0 {
                (total - rest) * 1000 / total
            } else {
                0
            }
        };
        self.base + permille(self.offered.0, self.left.0) + permille(self.offered.1, self.left.1)
    }
    fn fits(&self, cpu: i64, mem: i64) -> bool {
        self.left.0 >= cpu && self.left.1 >= mem
    }
}

impl Inputs {
    /// Reads the reduce's input: rows tagged 0 (pending) … 4 (allowed), in
    /// the order of the built-in's arguments; rows of the wrong shape are
    /// ignored (the checker rules them out).
    pub fn from_tagged(input: &[(&Row, isize)]) -> Inputs {
        let mut r = Inputs::default();
        let int = |v: &Value| v.as_int().unwrap_or(0);
        for (row, mult) in input {
            if *mult <= 0 {
                continue;
            }
            match (row.first(), row.len()) {
                (Some(Value::Int(0)), 5) => r.pending.push((row[1], row[2], int(&row[3]), int(&row[4]))),
                (Some(Value::Int(1)), 5) => r.offers.push((row[1], int(&row[2]), int(&row[3]), int(&row[4]))),
                (Some(Value::Int(2)), 4) => r.spread.push((row[1], row[2], int(&row[3]))),
                (Some(Value::Int(3)), 2) => r.restricted.push(row[1]),
                (Some(Value::Int(4)), 3) => r.allowed.push((row[1], row[2])),
                _ => {}
            }
        }
        r
    }

    /// Runs the round; returns (instance, node) pairs sorted by instance.
    pub fn assign(&self) -> Vec<(Value, Value)> {
        // A node offered twice is ambiguous: take its smallest room and score.
        let mut rooms: HashMap<Value, Room> = HashMap::new();
        for &(n, cpu, mem, score) in &self.offers {
            let r = rooms.entry(n).or_insert(Room { offered: (cpu, mem), left: (cpu, mem), base: score });
            r.offered = (r.offered.0.min(cpu), r.offered.1.min(mem));
            r.left = r.offered;
            r.base = r.base.min(score);
        }
        // Every offered node by (score, name): the ranking services share.
        let mut ranked: BTreeSet<(i64, ByText)> = rooms.iter().map(|(n, r)| (r.score(), ByText(*n))).collect();
        // A pair listed twice counts with its largest count.
        let mut spread: HashMap<Value, HashMap<Value, i64>> = HashMap::new();
        for &(s, n, k) in &self.spread {
            let e = spread.entry(s).or_default().entry(n).or_insert(k);
            *e = (*e).max(k);
        }
        let restricted: HashSet<Value> = self.restricted.iter().copied().collect();
        let mut allowed: HashMap<Value, Vec<Value>> = HashMap::new();
        for &(s, n) in &self.allowed {
            allowed.entry(s).or_default().push(n);
        }
        let mut order: Vec<&Pending> = self.pending.iter().collect();
        order.sort_by(|a, b| a.1.cmp_text(&b.1).then_with(|| a.0.cmp_text(&b.0)));
        let no_spread = HashMap::new();
        let mut out = Vec::new();
        for group in order.chunk_by(|a, b| a.1 == b.1) {
            let service = group[0].1;
            let is_restricted = restricted.contains(&service);
            let counts = spread.get(&service).unwrap_or(&no_spread);
            // The service's own nodes, keyed (spread, score, name): those it is
            // restricted to, or those it already has instances on.
            let own_nodes: Vec<Value> =
                if is_restricted { allowed.get(&service).map(|a| a.to_vec()).unwrap_or_default() } else { counts.keys().copied().collect() };
            let mut own: BTreeSet<(i64, i64, ByText)> = BTreeSet::new();
            let mut own_spread: HashMap<Value, i64> = HashMap::new();
            for n in own_nodes {
                if let Some(room) = rooms.get(&n) {
                    let k = counts.get(&n).copied().unwrap_or(0);
                    if own_spread.insert(n, k).is_none() {
                        own.insert((k, room.score(), ByText(n)));
                    }
                }
            }
            // Where the walk over the shared ranking resumes: every node ranked
            // before it is one of the service's own or could not fit it.
            let mut resume: Option<(i64, ByText)> = None;
            let mut others_left = !is_restricted;
            let mut cannot_fit: HashSet<Value> = HashSet::new();
            for &&(instance, _, cpu, mem) in group {
                let best_own = loop {
                    let Some(&first) = own.first() else { break None };
                    if rooms[&first.2 .0].fits(cpu, mem) {
                        break Some(first);
                    }
                    own.remove(&first);
                };
                let best_other = if !others_left {
                    None
                } else {
                    let from = resume.map_or(Bound::Unbounded, Bound::Included);
                    let mut found = None;
                    for &(score, ByText(n)) in ranked.range((from, Bound::Unbounded)) {
                        if own_spread.contains_key(&n) || cannot_fit.contains(&n) {
                            continue;
                        }
                        if !rooms[&n].fits(cpu, mem) {
                            cannot_fit.insert(n);
                            continue;
                        }
                        found = Some((score, ByText(n)));
                        break;
                    }
                    // Nodes only leave the others (charged, they become the
                    // service's own), so once none is left none comes back.
                    others_left = found.is_some();
                    resume = found;
                    found.map(|(score, n)| (0, score, n))
                };
                let chosen = match (best_own, best_other) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => match a.or(b) {
                        Some(c) => c,
                        None => continue,
                    },
                };
                let (k, score, ByText(node)) = chosen;
                let room = rooms.get_mut(&node).expect("only offered nodes are chosen");
                room.left = (room.left.0 - cpu, room.left.1 - mem);
                let charged = room.score();
                ranked.remove(&(score, ByText(node)));
                ranked.insert((charged, ByText(node)));
                own.remove(&chosen);
                own.insert((k + 1, charged, ByText(node)));
                own_spread.insert(node, k + 1);
                out.push((instance, node));
            }
        }
        out.sort_by(|a, b| a.0.cmp_text(&b.0));
        out
    }
}

/// The reduce body: rows tagged by argument position.
pub fn assign_rows(input: &[(&Row, isize)]) -> Vec<Row> {
    // Nothing pending (the steady state): nothing to assign, skip the rest.
    if !input.iter().any(|(row, m)| *m > 0 && row.first() == Some(&Value::Int(0))) {
        return Vec::new();
    }
    Inputs::from_tagged(input).assign().into_iter().map(|(i, n)| vec![i, n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn v(s: &str) -> Value {
        Value::str(s)
    }

    fn offers(nodes: &[Value], cpu: i64, mem: i64) -> Vec<Offer> {
        nodes.iter().map(|n| (*n, cpu, mem, 0)).collect()
    }

    /// The semantics, written the slow way: every instance looks at every node
    /// its service may use, in the documented order.
    fn reference(x: &Inputs) -> Vec<(Value, Value)> {
        let mut rooms: BTreeMap<ByText, Room> = BTreeMap::new();
        for &(n, c, m, s) in &x.offers {
            rooms.insert(ByText(n), Room { offered: (c, m), left: (c, m), base: s });
        }
        let mut order: Vec<&Pending> = x.pending.iter().collect();
        order.sort_by(|a, b| a.1.cmp_text(&b.1).then_with(|| a.0.cmp_text(&b.0)));
        let mut added: BTreeMap<(ByText, ByText), i64> = BTreeMap::new();
        let mut dropped: BTreeSet<(ByText, ByText)> = BTreeSet::new();
        let mut out = Vec::new();
        for &&(i, s, cpu, mem) in &order {
            let may_use = |n: &ByText| !x.restricted.contains(&s) || x.allowed.contains(&(s, n.0));
            let mut keyed: Vec<(i64, i64, ByText)> = rooms
                .iter()
                .filter(|(n, _)| may_use(n) && !dropped.contains(&(ByText(s), **n)))
                .map(|(n, r)| {
                    let base = x.spread.iter().filter(|p| p.0 == s && p.1 == n.0).map(|p| p.2).max().unwrap_or(0);
                    (base + added.get(&(ByText(s), *n)).copied().unwrap_or(0), r.score(), *n)
                })
                .collect();
            keyed.sort();
            for (_, _, n) in keyed {
                let room = rooms.get_mut(&n).unwrap();
                if !room.fits(cpu, mem) {
                    dropped.insert((ByText(s), n));
                    continue;
                }
                room.left = (room.left.0 - cpu, room.left.1 - mem);
                *added.entry((ByText(s), n)).or_default() += 1;
                out.push((i, n.0));
                break;
            }
        }
        out.sort_by(|a, b| a.0.cmp_text(&b.0));
        out
    }

    /// Checks what must hold of any result: only usable nodes, never over
    /// capacity, each instance at most once, and no unassigned instance that
    /// some usable node still had room for at the end.
    fn check(x: &Inputs, out: &[(Value, Value)]) {
        let mut used: HashMap<Value, (i64, i64)> = HashMap::new();
        let mut seen = BTreeSet::new();
        let may_use = |s: Value, n: Value| !x.restricted.contains(&s) || x.allowed.contains(&(s, n));
        for (i, n) in out {
            assert!(seen.insert(ByText(*i)), "{i:?} assigned twice");
            let p = x.pending.iter().find(|p| p.0 == *i).expect("assigned instances are pending");
            assert!(may_use(p.1, *n), "{i:?} on {n:?}, which its service may not use");
            let u = used.entry(*n).or_default();
            u.0 += p.2;
            u.1 += p.3;
        }
        for (n, c, m, _) in &x.offers {
            let u = used.get(n).copied().unwrap_or_default();
            assert!(u.0 <= *c && u.1 <= *m, "{n:?} overcommitted: {u:?} > ({c}, {m})");
        }
        for p in x.pending.iter().filter(|p| !seen.contains(&ByText(p.0))) {
            for (n, fc, fm, _) in x.offers.iter().filter(|o| may_use(p.1, o.0)) {
                let u = used.get(n).copied().unwrap_or_default();
                assert!(fc - u.0 < p.2 || fm - u.1 < p.3, "{:?} left pending though {n:?} has room", p.0);
            }
        }
    }

    #[test]
    fn two_hundred_pending_on_ten_nodes_that_hold_exactly_two_hundred() {
        let nodes: Vec<Value> = (0..10).map(|n| v(&format!("node-{n}"))).collect();
        let mut x = Inputs {
            pending: (0..200).map(|i| (v(&format!("web-{i}")), v("web"), 100, 64)).collect(),
            offers: offers(&nodes, 2000, 20 * 64),
            ..Inputs::default()
        };
        let out = x.assign();
        check(&x, &out);
        assert_eq!(out.len(), 200);
        // Spread: exactly 20 per node.
        for n in &nodes {
            assert_eq!(out.iter().filter(|(_, x)| x == n).count(), 20);
        }
        // One more does not fit anywhere.
        x.pending.push((v("web-200"), v("web"), 100, 64));
        let out2 = x.assign();
        check(&x, &out2);
        assert_eq!(out2.len(), 200);
    }

    #[test]
    fn prefers_spread_then_score_then_name_and_is_deterministic() {
        let x = Inputs {
            pending: (0..3).map(|i| (v(&format!("a-{i}")), v("a"), 1, 1)).collect(),
            offers: vec![(v("n2"), 10, 10, 5), (v("n1"), 10, 10, 5), (v("n3"), 10, 10, 0)],
            spread: vec![(v("a"), v("n3"), 1)],
            ..Inputs::default()
        };
        let out = x.assign();
        assert_eq!(out, vec![(v("a-0"), v("n1")), (v("a-1"), v("n2")), (v("a-2"), v("n3"))]);
        let mut reversed = x.clone();
        reversed.offers.reverse();
        assert_eq!(reversed.assign(), out, "input order does not matter");
    }

    #[test]
    fn a_restricted_service_uses_only_allowed_nodes() {
        let nodes: Vec<Value> = (0..4).map(|n| v(&format!("n{n}"))).collect();
        let mut x = Inputs {
            pending: vec![(v("db-0"), v("db"), 1, 1), (v("db-1"), v("db"), 1, 1), (v("web-0"), v("web"), 1, 1)],
            offers: offers(&nodes, 10, 10),
            restricted: vec![v("db")],
            allowed: vec![(v("db"), v("n3"))],
            ..Inputs::default()
        };
        let out = x.assign();
        check(&x, &out);
        assert_eq!(out, vec![(v("db-0"), v("n3")), (v("db-1"), v("n3")), (v("web-0"), v("n0"))]);
        // Restricted with nothing allowed (a bound volume's node is down): nowhere.
        x.allowed.clear();
        assert_eq!(x.assign(), vec![(v("web-0"), v("n0"))]);
        // Allowed a node that offers nothing: nowhere either.
        x.allowed.push((v("db"), v("n9")));
        assert_eq!(x.assign(), vec![(v("web-0"), v("n0"))]);
    }

    #[test]
    fn one_big_round_balances_load_across_services() {
        // 10 services × 10 instances on 20 equal nodes: 5 per node, not 10 on the first 10.
        let nodes: Vec<Value> = (0..20).map(|n| v(&format!("n{n:02}"))).collect();
        let x = Inputs {
            pending: (0..100).map(|i| (v(&format!("s{}-{}", i / 10, i % 10)), v(&format!("s{}", i / 10)), 100, 100)).collect(),
            offers: offers(&nodes, 10_000, 10_000),
            ..Inputs::default()
        };
        let out = x.assign();
        check(&x, &out);
        for n in &nodes {
            let on = out.iter().filter(|(_, x)| x == n).count();
            assert_eq!(on, 5, "{n:?} got {on}");
        }
    }

    #[test]
    fn random_cases_match_the_reference_and_keep_the_invariants() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..500 {
            let services = 1 + next(4);
            let nodes = 1 + next(8);
            let mut x = Inputs::default();
            for i in 0..next(40) {
                // Instances of one service ask for the same (as the rules make them).
                let s = next(services);
                x.pending.push((v(&format!("s{s}-{i}")), v(&format!("s{s}")), 10 * (1 + s as i64), 5 * (1 + (s as i64 % 2))));
            }
            for n in 0..nodes {
                if next(5) > 0 {
                    x.offers.push((v(&format!("n{n}")), next(100) as i64, next(60) as i64, next(5) as i64));
                }
            }
            for s in 0..services {
                if next(3) == 0 {
                    x.restricted.push(v(&format!("s{s}")));
                }
                for n in 0..nodes {
                    if next(3) == 0 {
                        x.allowed.push((v(&format!("s{s}")), v(&format!("n{n}"))));
                    }
                    if next(4) == 0 {
                        x.spread.push((v(&format!("s{s}")), v(&format!("n{n}")), next(3) as i64));
                    }
                }
            }
            let out = x.assign();
            check(&x, &out);
            assert_eq!(out, reference(&x), "differs from the reference on {x:?}");
        }
    }
}
