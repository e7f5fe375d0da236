//! The built-in `assign(pending, candidate, free)`: capacity-respecting greedy
//! assignment of instances to nodes. What is eligible and what is preferred
//! are rules; this only hands out capacity, lazily and deterministically.
//!
//! Semantics (also in docs/language.md):
//! * Pending instances are taken in order of (service, instance) by text.
//! * An instance may go to a node only if `candidate(service, node, spread,
//!   score)` holds and the node's remaining `free` cpu and memory both cover
//!   the instance's requests; the node is then charged.
//! * Among those nodes it takes the smallest (spread + instances of the same
//!   service assigned there earlier in this round, score + load this round,
//!   node name), where load this round is the permille of the node's initial
//!   free cpu plus the permille of its initial free memory that this round has
//!   handed out (so one big round spreads like many small ones).
//! * A node that cannot fit an instance of a service is not offered to that
//!   service's later instances in the round (instances of one service ask for
//!   the same resources, so it could not fit them either).
//! * An instance no node can take stays unassigned.
//!
//! Cost: O(candidates · log + pending · log candidates-per-service); nothing of
//! size pending × nodes is ever built.

use crate::value::{Row, Value};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One pending instance: (instance, service, cpu, memory).
pub type Pending = (Value, Value, i64, i64);
/// One candidate: (service, node, spread, score).
pub type Candidate = (Value, Value, i64, i64);
/// A node's free capacity: (node, cpu, memory).
pub type Free = (Value, i64, i64);

/// Orders text values by their text (interning order is not user-visible order).
#[derive(Clone, Copy, PartialEq, Eq)]
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

/// Runs the assignment; returns (instance, node) pairs sorted by instance.
pub fn assign(pending: &[Pending], candidates: &[Candidate], free: &[Free]) -> Vec<(Value, Value)> {
    // node → (initial free, still free)
    let mut room: HashMap<Value, ((i64, i64), (i64, i64))> = free.iter().map(|(n, c, m)| (*n, ((*c, *m), (*c, *m)))).collect();
    // What this round has added to a node's score.
    let load = |initial: (i64, i64), left: (i64, i64)| -> i64 {
        let permille = |total: i64, rest: i64| if total > 0 { (total - rest) * 1000 / total } else { 0 };
        permille(initial.0, left.0) + permille(initial.1, left.1)
    };
    // Per service: candidate nodes keyed (spread, score, node) as last computed,
    // with the node's base score kept beside. Keys only grow during a round, so
    // a popped entry whose key is still current is the true best ("lazy" keys).
    let mut offers: HashMap<Value, BTreeSet<(i64, i64, ByText)>> = HashMap::new();
    let mut base: HashMap<(Value, Value), i64> = HashMap::new();
    for (s, n, spread, score) in candidates {
        if room.contains_key(n) {
            offers.entry(*s).or_default().insert((*spread, *score, ByText(*n)));
            base.insert((*s, *n), *score);
        }
    }
    let mut order: Vec<&Pending> = pending.iter().collect();
    order.sort_by(|a, b| a.1.cmp_text(&b.1).then_with(|| a.0.cmp_text(&b.0)));
    let mut out = Vec::new();
    for &(instance, service, cpu, mem) in order {
        let Some(nodes) = offers.get_mut(&service) else { continue };
        while let Some(&(spread, score, ByText(node))) = nodes.iter().next() {
            let (initial, left) = room[&node];
            let current = base[&(service, node)] + load(initial, left);
            if current != score {
                // Stale: the node was charged since this key was computed.
                nodes.remove(&(spread, score, ByText(node)));
                nodes.insert((spread, current, ByText(node)));
                continue;
            }
            if left.0 < cpu || left.1 < mem {
                // Cannot fit this service's request now, nor later in this round.
                nodes.remove(&(spread, score, ByText(node)));
                continue;
            }
            let r = room.get_mut(&node).expect("offers only nodes with a free entry");
            r.1 = (left.0 - cpu, left.1 - mem);
            let charged = base[&(service, node)] + load(r.0, r.1);
            nodes.remove(&(spread, score, ByText(node)));
            nodes.insert((spread + 1, charged, ByText(node)));
            out.push((instance, node));
            break;
        }
    }
    out.sort_by(|a, b| a.0.cmp_text(&b.0));
    out
}

/// The reduce body: rows tagged 0 (pending), 1 (candidate), 2 (free).
pub fn assign_rows(input: &[(&Row, isize)]) -> Vec<Row> {
    // Nothing pending (the steady state): nothing to assign, skip the rest.
    if !input.iter().any(|(row, m)| *m > 0 && row.first() == Some(&Value::Int(0))) {
        return Vec::new();
    }
    let (mut p, mut c, mut f) = (Vec::new(), Vec::new(), Vec::new());
    let int = |v: &Value| v.as_int().unwrap_or(0);
    for (row, mult) in input {
        if *mult <= 0 {
            continue;
        }
        match row.first() {
            Some(Value::Int(0)) if row.len() == 5 => p.push((row[1], row[2], int(&row[3]), int(&row[4]))),
            Some(Value::Int(1)) if row.len() == 5 => c.push((row[1], row[2], int(&row[3]), int(&row[4]))),
            Some(Value::Int(2)) if row.len() == 4 => f.push((row[1], int(&row[2]), int(&row[3]))),
            _ => {}
        }
    }
    // A node listed twice in `free` is ambiguous: take its smallest room.
    let mut by_node: BTreeMap<ByText, (i64, i64)> = BTreeMap::new();
    for (n, cpu, mem) in f {
        let e = by_node.entry(ByText(n)).or_insert((cpu, mem));
        *e = (e.0.min(cpu), e.1.min(mem));
    }
    let free: Vec<Free> = by_node.into_iter().map(|(ByText(n), (c, m))| (n, c, m)).collect();
    assign(&p, &c, &free).into_iter().map(|(i, n)| vec![i, n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Value {
        Value::str(s)
    }

    /// Checks what must hold of any result: only candidates, never over
    /// capacity, each instance at most once, and no unassigned instance that
    /// some candidate node still had room for at the end.
    fn check(pending: &[Pending], cands: &[Candidate], free: &[Free], out: &[(Value, Value)]) {
        let mut used: HashMap<Value, (i64, i64)> = HashMap::new();
        let mut seen = BTreeSet::new();
        for (i, n) in out {
            assert!(seen.insert(ByText(*i)), "{i:?} assigned twice");
            let p = pending.iter().find(|p| p.0 == *i).expect("assigned instances are pending");
            assert!(cands.iter().any(|c| c.0 == p.1 && c.1 == *n), "{i:?} on non-candidate {n:?}");
            let u = used.entry(*n).or_default();
            u.0 += p.2;
            u.1 += p.3;
        }
        for (n, c, m) in free {
            let u = used.get(n).copied().unwrap_or_default();
            assert!(u.0 <= *c && u.1 <= *m, "{n:?} overcommitted: {u:?} > ({c}, {m})");
        }
        for p in pending.iter().filter(|p| !seen.contains(&ByText(p.0))) {
            for c in cands.iter().filter(|c| c.0 == p.1) {
                let Some((_, fc, fm)) = free.iter().find(|f| f.0 == c.1) else { continue };
                let u = used.get(&c.1).copied().unwrap_or_default();
                assert!(fc - u.0 < p.2 || fm - u.1 < p.3, "{:?} left pending though {:?} has room", p.0, c.1);
            }
        }
    }

    #[test]
    fn two_hundred_pending_on_ten_nodes_that_hold_exactly_two_hundred() {
        let pending: Vec<Pending> = (0..200).map(|i| (v(&format!("web-{i}")), v("web"), 100, 64)).collect();
        let nodes: Vec<Value> = (0..10).map(|n| v(&format!("node-{n}"))).collect();
        let cands: Vec<Candidate> = nodes.iter().map(|n| (v("web"), *n, 0, 0)).collect();
        let free: Vec<Free> = nodes.iter().map(|n| (*n, 2000, 20 * 64)).collect();
        let out = assign(&pending, &cands, &free);
        check(&pending, &cands, &free, &out);
        assert_eq!(out.len(), 200);
        // Spread: exactly 20 per node.
        for n in &nodes {
            assert_eq!(out.iter().filter(|(_, x)| x == n).count(), 20);
        }
        // One more does not fit anywhere.
        let mut more = pending.clone();
        more.push((v("web-200"), v("web"), 100, 64));
        let out2 = assign(&more, &cands, &free);
        check(&more, &cands, &free, &out2);
        assert_eq!(out2.len(), 200);
    }

    #[test]
    fn prefers_spread_then_score_then_name_and_is_deterministic() {
        let pending: Vec<Pending> = (0..3).map(|i| (v(&format!("a-{i}")), v("a"), 1, 1)).collect();
        let cands = vec![(v("a"), v("n2"), 0, 5), (v("a"), v("n1"), 0, 5), (v("a"), v("n3"), 1, 0)];
        let free = vec![(v("n1"), 10, 10), (v("n2"), 10, 10), (v("n3"), 10, 10)];
        let out = assign(&pending, &cands, &free);
        assert_eq!(out, vec![(v("a-0"), v("n1")), (v("a-1"), v("n2")), (v("a-2"), v("n3"))]);
        let mut reversed = cands.clone();
        reversed.reverse();
        assert_eq!(assign(&pending, &reversed, &free), out, "input order does not matter");
    }

    #[test]
    fn one_big_round_balances_load_across_services() {
        // 10 services × 10 instances on 20 equal nodes: 5 per node, not 10 on the first 10.
        let mut pending = Vec::new();
        let mut cands = Vec::new();
        for s in 0..10 {
            for i in 0..10 {
                pending.push((v(&format!("s{s}-{i}")), v(&format!("s{s}")), 100, 100));
            }
            for n in 0..20 {
                cands.push((v(&format!("s{s}")), v(&format!("n{n:02}")), 0, 0));
            }
        }
        let free: Vec<Free> = (0..20).map(|n| (v(&format!("n{n:02}")), 10_000, 10_000)).collect();
        let out = assign(&pending, &cands, &free);
        check(&pending, &cands, &free, &out);
        for n in 0..20 {
            let on = out.iter().filter(|(_, x)| *x == v(&format!("n{n:02}"))).count();
            assert_eq!(on, 5, "n{n:02} got {on}");
        }
    }

    #[test]
    fn random_cases_keep_the_invariants() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..300 {
            let services = 1 + next(4);
            let nodes = 1 + next(6);
            let pending: Vec<Pending> = (0..next(30))
                .map(|i| {
                    let s = next(services);
                    (v(&format!("s{s}-{i}")), v(&format!("s{s}")), 10 * (1 + s as i64), 5 * (1 + (s as i64 % 2)))
                })
                .collect();
            let mut cands = Vec::new();
            for s in 0..services {
                for n in 0..nodes {
                    if next(3) > 0 {
                        cands.push((v(&format!("s{s}")), v(&format!("n{n}")), next(3) as i64, next(5) as i64));
                    }
                }
            }
            let free: Vec<Free> = (0..nodes).map(|n| (v(&format!("n{n}")), next(100) as i64, next(60) as i64)).collect();
            let out = assign(&pending, &cands, &free);
            check(&pending, &cands, &free, &out);
            assert_eq!(assign(&pending, &cands, &free), out);
        }
    }
}
