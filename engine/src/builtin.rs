//! The built-in `assign` (its arguments: `program::ASSIGN`):
//! capacity-respecting greedy assignment of instances to nodes. What is
//! eligible and what is preferred are rules; this only hands out capacity,
//! in one pass, lazily and deterministically.
//!
//! Semantics (also in docs/language.md):
//! * Pending instances are taken in order of (priority, highest first;
//!   service; instance) by text.
//! * A service may use an offered node unless it is restricted and the node
//!   is not allowed to it, or the node is reserved and the service not
//!   admitted to it; with a hard spread, only nodes that have a domain for
//!   its topology key.
//! * Each instance goes to the usable node that has room for every resource
//!   its service needs and has the smallest (domain count, for a hard
//!   spread; spread + instances of the service assigned there earlier in
//!   this round; score + load this round; node name). Load this round is
//!   the permille of each resource's total that this round has handed out
//!   on the node, summed. A packed service ignores spread and takes the
//!   largest score + load first (most allocated). The node is charged.
//! * A hard spread (key, max_skew) places an instance in domain d only if
//!   count(d) + 1 − min ≤ max_skew, where counts are the service's instances
//!   per domain (already there, and assigned this round) and min is over
//!   every domain of a usable node (with room or not). An instance that
//!   cannot be placed so stays pending, and so do the service's later ones.
//! * An instance no node can take stays unassigned.
//!
//! Cost: services are done one after another; a service's instances take the
//! best nodes of one ranking shared by all services, walked from where the
//! service's previous instance stopped, and its few listed nodes (spread,
//! allowed, admitted) beside it. A hard-spread service ranks its usable
//! nodes per domain (O(offers) for that service). So a round costs
//! O((pending + offers·resources + spread + allowed + admitted + offers ·
//! hard-spread services) · log); pending instances × nodes is never built.

use crate::value::{Row, Value};
use ccattler_parser::program::{assign_arg as arg, preempt_arg as parg, BuiltinArg, ASSIGN, PREEMPT};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

/// Orders text values by their text (interning order is not user-visible order).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ByText(pub Value);
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

/// Everything one round of `assign` reads: each argument's rows, in the
/// order of `program::ASSIGN`.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub args: Vec<Vec<Row>>,
}

/// A node during a round: its room and totals per resource, its base score.
#[derive(Clone, Debug)]
struct Room {
    total: Vec<i64>,
    left: Vec<i64>,
    handed: Vec<i64>,
    base: i64,
}

impl Room {
    /// The base score plus what this round handed out, in permille of each
    /// resource's total.
    fn score(&self) -> i64 {
        let load: i64 = self.total.iter().zip(&self.handed).map(|(&t, &h)| if t > 0 { h.saturating_mul(1000) / t } else { 0 }).sum();
        self.base.saturating_add(load)
    }
    fn fits(&self, need: &[i64]) -> bool {
        self.left.iter().zip(need).all(|(l, n)| l >= n)
    }
    fn charge(&mut self, need: &[i64]) {
        for (r, n) in need.iter().enumerate() {
            self.left[r] -= n;
            self.handed[r] += n;
        }
    }
}

fn int(v: &Value) -> i64 {
    v.as_int().unwrap_or(0)
}

/// One service's pass: which nodes it may use and how it ranks them.
struct Policy {
    packed: bool,
    /// Points this service adds to some nodes' scores (lower first).
    preference: HashMap<Value, i64>,
}

/// How a service ranks a node: (points, spread, score, name).
type Key = (i64, i64, i64, ByText);

impl Policy {
    /// The key nodes are ranked by (smaller first): the service's points
    /// for the node first (a node it is told to avoid is used only after
    /// every other usable one), then spread and score.
    fn key(&self, spread: i64, score: i64, node: Value) -> Key {
        let points = self.preference.get(&node).copied().unwrap_or(0);
        if self.packed {
            (points, 0, -score, ByText(node))
        } else {
            (points, spread, score, ByText(node))
        }
    }
}

/// Services kept apart within the round (required anti-affinity): an
/// instance of a service is not assigned to a node whose domain (by the
/// pair's topology key) got an instance of the other this round (either
/// way). Instances already placed are the rules' `excluded`.
struct Apart {
    /// For each service, the (other, key) pairs it is kept apart from.
    pairs: HashMap<Value, Vec<(Value, Value)>>,
    /// The domains (service, key) got instances in this round.
    taken: HashMap<(Value, Value), HashSet<Value>>,
}

impl Apart {
    fn blocked(&self, service: &Value, node: &Value, topology: &HashMap<(Value, Value), Value>) -> bool {
        self.pairs.get(service).is_some_and(|ps| {
            ps.iter().any(|(other, key)| {
                topology.get(&(node.clone(), key.clone())).is_some_and(|d| self.taken.get(&(other.clone(), key.clone())).is_some_and(|ds| ds.contains(d)))
            })
        })
    }
    fn record(&mut self, service: &Value, node: &Value, topology: &HashMap<(Value, Value), Value>) {
        let Some(ps) = self.pairs.get(service) else { return };
        for (_, key) in ps {
            if let Some(d) = topology.get(&(node.clone(), key.clone())) {
                self.taken.entry((service.clone(), key.clone())).or_default().insert(d.clone());
            }
        }
    }
}

/// The round's state shared by all services.
struct Round {
    resources: BTreeMap<ByText, usize>,
    rooms: HashMap<Value, Room>,
    reserved: HashSet<Value>,
    /// Unreserved nodes by (score, name) and by (−score, name): the rankings
    /// services share (least and most allocated first).
    ranked: BTreeSet<(i64, ByText)>,
    ranked_packed: BTreeSet<(i64, ByText)>,
}

impl Round {
    fn charge(&mut self, node: &Value, need: &[i64]) -> i64 {
        let room = self.rooms.get_mut(node).expect("only offered nodes are chosen");
        let before = room.score();
        room.charge(need);
        let after = room.score();
        if !self.reserved.contains(node) {
            let key = ByText(node.clone());
            self.ranked.remove(&(before, key.clone()));
            self.ranked_packed.remove(&(-before, key.clone()));
            self.ranked.insert((after, key.clone()));
            self.ranked_packed.insert((-after, key));
        }
        after
    }
}

impl Inputs {
    /// Reads the reduce's input: rows tagged with their argument's position
    /// in `signature`; rows of the wrong shape are ignored (the checker rules
    /// them out).
    pub fn from_tagged(signature: &[BuiltinArg], input: &[(&Row, isize)]) -> Inputs {
        let mut args = vec![Vec::new(); signature.len()];
        for (row, mult) in input {
            if *mult <= 0 {
                continue;
            }
            if let Some(Value::Int(tag)) = row.first() {
                let tag = *tag as usize;
                if tag < signature.len() && row.len() == signature[tag].columns.len() + 1 {
                    args[tag].push(Row::from(&row[1..]));
                }
            }
        }
        Inputs { args }
    }

    pub fn arg(&self, a: usize) -> &[Row] {
        self.args.get(a).map_or(&[], Vec::as_slice)
    }

    /// Resource names by index (sorted by text), from needs and rooms.
    fn resources(&self) -> BTreeMap<ByText, usize> {
        let names: BTreeSet<ByText> =
            self.arg(arg::NEED).iter().map(|r| ByText(r[1].clone())).chain(self.arg(arg::ROOM).iter().map(|r| ByText(r[1].clone()))).collect();
        names.into_iter().enumerate().map(|(i, n)| (n, i)).collect()
    }

    /// What each instance of a service needs, per resource index (a pair
    /// listed twice counts with its largest amount).
    pub fn needs(&self) -> HashMap<Value, Vec<i64>> {
        let resources = self.resources();
        let mut needs: HashMap<Value, Vec<i64>> = HashMap::new();
        for r in self.arg(arg::NEED) {
            let v = needs.entry(r[0].clone()).or_insert_with(|| vec![0; resources.len()]);
            let i = resources[&ByText(r[1].clone())];
            v[i] = v[i].max(int(&r[2]));
        }
        needs
    }

    /// Offered nodes with their room (a node or a resource listed twice
    /// counts with its smallest room and score).
    fn rooms(&self, resources: &BTreeMap<ByText, usize>) -> HashMap<Value, Room> {
        let n = resources.len();
        let mut rooms: HashMap<Value, Room> = HashMap::new();
        for r in self.arg(arg::OFFER) {
            let room = rooms.entry(r[0].clone()).or_insert(Room { total: vec![0; n], left: vec![0; n], handed: vec![0; n], base: int(&r[1]) });
            room.base = room.base.min(int(&r[1]));
        }
        let mut seen: HashSet<(Value, usize)> = HashSet::new();
        for r in self.arg(arg::ROOM) {
            let Some(room) = rooms.get_mut(&r[0]) else { continue };
            let i = resources[&ByText(r[1].clone())];
            let (free, total) = (int(&r[2]), int(&r[3]));
            if seen.insert((r[0].clone(), i)) {
                room.left[i] = free;
                room.total[i] = total;
            } else {
                room.left[i] = room.left[i].min(free);
                room.total[i] = room.total[i].min(total);
            }
        }
        rooms
    }

    /// Runs the round; returns (instance, node) pairs sorted by instance.
    pub fn assign(&self) -> Vec<(Value, Value)> {
        let resources = self.resources();
        let rooms = self.rooms(&resources);
        let reserved: HashSet<Value> = self.arg(arg::RESERVED).iter().map(|r| r[0].clone()).filter(|n| rooms.contains_key(n)).collect();
        let unreserved = rooms.iter().filter(|(n, _)| !reserved.contains(n));
        let ranked = unreserved.clone().map(|(n, r)| (r.score(), ByText(n.clone()))).collect();
        let ranked_packed = unreserved.map(|(n, r)| (-r.score(), ByText(n.clone()))).collect();
        let mut round = Round { resources, rooms, reserved, ranked, ranked_packed };
        let needs = self.needs();
        let no_need = vec![0; round.resources.len()];
        // A pair listed twice counts with its largest count.
        let mut spread: HashMap<Value, HashMap<Value, i64>> = HashMap::new();
        for r in self.arg(arg::SPREAD) {
            let e = spread.entry(r[0].clone()).or_default().entry(r[1].clone()).or_insert(int(&r[2]));
            *e = (*e).max(int(&r[2]));
        }
        let restricted: HashSet<Value> = self.arg(arg::RESTRICTED).iter().map(|r| r[0].clone()).collect();
        let mut allowed: HashMap<Value, Vec<Value>> = HashMap::new();
        for r in self.arg(arg::ALLOWED) {
            allowed.entry(r[0].clone()).or_default().push(r[1].clone());
        }
        let mut admitted: HashMap<Value, Vec<Value>> = HashMap::new();
        for r in self.arg(arg::ADMITTED) {
            admitted.entry(r[0].clone()).or_default().push(r[1].clone());
        }
        // A service spread by two keys keeps the smallest skew of the first key.
        let mut hard: HashMap<Value, (Value, i64)> = HashMap::new();
        for r in self.arg(arg::HARD_SPREAD) {
            let e = hard.entry(r[0].clone()).or_insert((r[1].clone(), int(&r[2])));
            if ByText(r[1].clone()) < ByText(e.0.clone()) || (r[1] == e.0 && int(&r[2]) < e.1) {
                *e = (r[1].clone(), int(&r[2]));
            }
        }
        let mut topology: HashMap<(Value, Value), Value> = HashMap::new();
        for r in self.arg(arg::TOPOLOGY) {
            let e = topology.entry((r[0].clone(), r[1].clone())).or_insert(r[2].clone());
            if ByText(r[2].clone()) < ByText(e.clone()) {
                *e = r[2].clone();
            }
        }
        let packed: HashSet<Value> = self.arg(arg::PACKED).iter().map(|r| r[0].clone()).collect();
        // A pair listed twice adds up.
        let mut preference: HashMap<Value, HashMap<Value, i64>> = HashMap::new();
        for r in self.arg(arg::PREFERENCE) {
            let e = preference.entry(r[0].clone()).or_default().entry(r[1].clone()).or_default();
            *e = e.saturating_add(int(&r[2]));
        }
        let mut apart = Apart { pairs: HashMap::new(), taken: HashMap::new() };
        for r in self.arg(arg::APART) {
            apart.pairs.entry(r[0].clone()).or_default().push((r[1].clone(), r[2].clone()));
            apart.pairs.entry(r[1].clone()).or_default().push((r[0].clone(), r[2].clone()));
        }
        let mut order: Vec<&Row> = self.arg(arg::PENDING).iter().collect();
        order.sort_by(|a, b| int(&b[2]).cmp(&int(&a[2])).then_with(|| a[1].cmp_text(&b[1])).then_with(|| a[0].cmp_text(&b[0])));
        let no_spread = HashMap::new();
        let no_nodes = Vec::new();
        let mut out = Vec::new();
        for group in order.chunk_by(|a, b| a[1] == b[1] && a[2] == b[2]) {
            let service = group[0][1].clone();
            let need = needs.get(&service).unwrap_or(&no_need);
            let counts = spread.get(&service).unwrap_or(&no_spread);
            let policy = Policy { packed: packed.contains(&service), preference: preference.remove(&service).unwrap_or_default() };
            let is_restricted = restricted.contains(&service);
            let usable = |n: &Value, round: &Round| {
                round.rooms.contains_key(n)
                    && (!is_restricted || allowed.get(&service).is_some_and(|a| a.contains(n)))
                    && (!round.reserved.contains(n) || admitted.get(&service).is_some_and(|a| a.contains(n)))
            };
            let instances: Vec<Value> = group.iter().map(|r| r[0].clone()).collect();
            if let Some((key, max_skew)) = hard.get(&service) {
                // Every usable node that has a domain for the key.
                let candidates: Vec<Value> = if is_restricted {
                    allowed.get(&service).unwrap_or(&no_nodes).clone()
                } else {
                    let mut c: Vec<Value> = round.rooms.keys().filter(|n| !round.reserved.contains(n)).cloned().collect();
                    c.extend(admitted.get(&service).unwrap_or(&no_nodes).iter().cloned());
                    c
                };
                let nodes: BTreeMap<ByText, Value> = candidates
                    .into_iter()
                    .filter(|n| usable(n, &round))
                    .filter_map(|n| topology.get(&(n.clone(), key.clone())).map(|d| (ByText(n), d.clone())))
                    .collect();
                let spread = Spread { counts, max_skew: *max_skew };
                assign_hard_spread(&mut round, &service, &instances, need, spread, &policy, &nodes, (&mut apart, &topology), &mut out);
                continue;
            }
            // The service's own nodes, keyed like the ranking: those it is
            // restricted to, those it already has instances on, reserved
            // nodes it is admitted to, and nodes it has points for.
            let mut own_nodes: Vec<Value> = if is_restricted { allowed.get(&service).unwrap_or(&no_nodes).clone() } else { counts.keys().cloned().collect() };
            own_nodes.extend(admitted.get(&service).unwrap_or(&no_nodes).iter().cloned());
            if !is_restricted {
                own_nodes.extend(policy.preference.keys().cloned());
            }
            let mut own: BTreeSet<Key> = BTreeSet::new();
            let mut own_spread: HashMap<Value, i64> = HashMap::new();
            for n in own_nodes {
                if usable(&n, &round) && !own_spread.contains_key(&n) {
                    let k = counts.get(&n).cloned().unwrap_or(0);
                    own_spread.insert(n.clone(), k);
                    own.insert(policy.key(k, round.rooms[&n].score(), n));
                }
            }
            // Where the walk over the shared ranking resumes: every node ranked
            // before it is one of the service's own or could not fit it.
            let mut resume: Option<(i64, ByText)> = None;
            let mut others_left = !is_restricted;
            let mut cannot_fit: HashSet<Value> = HashSet::new();
            for instance in instances {
                let best_own = loop {
                    let Some(first) = own.first() else { break None };
                    if round.rooms[&first.3 .0].fits(need) && !apart.blocked(&service, &first.3 .0, &topology) {
                        break Some(first.clone());
                    }
                    let first = first.clone();
                    own.remove(&first);
                };
                let best_other = if !others_left {
                    None
                } else {
                    let ranking = if policy.packed { &round.ranked_packed } else { &round.ranked };
                    let from = resume.as_ref().map_or(Bound::Unbounded, Bound::Included);
                    let mut found = None;
                    for (score, ByText(n)) in ranking.range((from, Bound::Unbounded)) {
                        if own_spread.contains_key(n) || cannot_fit.contains(n) {
                            continue;
                        }
                        if !round.rooms[n].fits(need) || apart.blocked(&service, n, &topology) {
                            cannot_fit.insert(n.clone());
                            continue;
                        }
                        found = Some((*score, ByText(n.clone())));
                        break;
                    }
                    // Nodes only leave the others (charged, they become the
                    // service's own), so once none is left none comes back.
                    others_left = found.is_some();
                    resume.clone_from(&found);
                    found.map(|(score, n)| (0, 0, score, n))
                };
                let chosen = match (best_own, best_other) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => match a.or(b) {
                        Some(c) => c,
                        None => continue,
                    },
                };
                own.remove(&chosen);
                let node = chosen.3 .0;
                let charged = round.charge(&node, need);
                let k = own_spread.get(&node).copied().unwrap_or(0) + 1;
                own.insert(policy.key(k, charged, node.clone()));
                own_spread.insert(node.clone(), k);
                apart.record(&service, &node, &topology);
                out.push((instance, node));
            }
        }
        out.sort_by(|a, b| a.0.cmp_text(&b.0));
        out
    }
}

/// A hard-spread service's instances: domains ranked by (count, their best
/// node), nodes within a domain by the service's key; a node that cannot fit
/// the service leaves its domain for the round.
/// A hard spread: the service's instances per node already there, and its max skew.
struct Spread<'a> {
    counts: &'a HashMap<Value, i64>,
    max_skew: i64,
}

#[allow(clippy::too_many_arguments)]
fn assign_hard_spread(
    round: &mut Round,
    service: &Value,
    instances: &[Value],
    need: &[i64],
    Spread { counts: spread, max_skew }: Spread,
    policy: &Policy,
    nodes: &BTreeMap<ByText, Value>,
    (apart, topology): (&mut Apart, &HashMap<(Value, Value), Value>),
    out: &mut Vec<(Value, Value)>,
) {
    let mut count: HashMap<Value, i64> = nodes.values().map(|d| (d.clone(), 0)).collect();
    for (n, k) in spread {
        if let Some(d) = nodes.get(&ByText(n.clone())) {
            *count.get_mut(d).expect("every domain counted") += k;
        }
    }
    let mut node_spread: HashMap<Value, i64> = HashMap::new();
    let mut in_domain: HashMap<Value, BTreeSet<Key>> = HashMap::new();
    for (ByText(n), d) in nodes {
        let k = spread.get(n).copied().unwrap_or(0);
        node_spread.insert(n.clone(), k);
        in_domain.entry(d.clone()).or_default().insert(policy.key(k, round.rooms[n].score(), n.clone()));
    }
    // Every domain by count (for the minimum), and the domains that still
    // have a node that may fit by (count, best node, domain).
    let mut by_count: BTreeSet<(i64, ByText)> = count.iter().map(|(d, c)| (*c, ByText(d.clone()))).collect();
    let mut ranked: BTreeSet<(i64, Key, ByText)> = in_domain.iter().filter_map(|(d, ns)| Some((count[d], ns.first()?.clone(), ByText(d.clone())))).collect();
    for instance in instances {
        let min = by_count.first().map_or(0, |(c, _)| *c);
        let chosen = loop {
            let Some((c, best, d)) = ranked.first() else { break None };
            if c + 1 - min > max_skew {
                break None; // the least-filled domain with a node would exceed the skew
            }
            if round.rooms[&best.3 .0].fits(need) && !apart.blocked(service, &best.3 .0, topology) {
                break Some((*c, best.clone(), d.clone()));
            }
            // It cannot fit this service (or is kept apart from it): out of
            // its domain for the round.
            let (c, best, d) = ranked.pop_first().expect("just looked");
            let set = in_domain.get_mut(&d.0).expect("ranked domains have nodes");
            set.remove(&best);
            if let Some(next) = set.first() {
                ranked.insert((c, next.clone(), d));
            }
        };
        let Some((c, best, d)) = chosen else { break };
        ranked.remove(&(c, best.clone(), d.clone()));
        let node = best.3 .0.clone();
        let charged = round.charge(&node, need);
        let k = node_spread[&node] + 1;
        node_spread.insert(node.clone(), k);
        let set = in_domain.get_mut(&d.0).expect("ranked domains have nodes");
        set.remove(&best);
        set.insert(policy.key(k, charged, node.clone()));
        ranked.insert((c + 1, set.first().expect("just inserted").clone(), d.clone()));
        by_count.remove(&(c, d.clone()));
        *count.get_mut(&d.0).expect("counted") += 1;
        by_count.insert((c + 1, d));
        apart.record(service, &node, topology);
        out.push((instance.clone(), node));
    }
}

/// The reduce body: rows tagged by argument position.
pub fn assign_rows(input: &[(&Row, isize)]) -> Vec<Row> {
    // Nothing pending (the steady state): nothing to assign, skip the rest.
    if !input.iter().any(|(row, m)| *m > 0 && row.first() == Some(&Value::Int(arg::PENDING as i64))) {
        return Vec::new();
    }
    Inputs::from_tagged(ASSIGN, input).assign().into_iter().map(|(i, n)| smallvec::smallvec![i, n]).collect()
}

/// `preempt`'s reduce body: rows tagged by argument position.
pub fn preempt_rows(input: &[(&Row, isize)]) -> Vec<Row> {
    // No preemptor (the steady state): nothing to evict.
    if !input.iter().any(|(row, m)| *m > 0 && row.first() == Some(&Value::Int(parg::PREEMPTOR as i64))) {
        return Vec::new();
    }
    Inputs::from_tagged(PREEMPT, input).preempt().into_iter().map(|(v, p, b)| smallvec::smallvec![v, p, b]).collect()
}

/// A victim as `preempt` weighs it.
#[derive(Clone)]
struct Victim {
    priority: i64,
    name: ByText,
    service: Value,
    need: Vec<i64>,
}

/// Combinations of size `k` of `n` items looked at, at most, per node and
/// size when `preempt` looks for fewer victims than its reprieve left.
const PREEMPT_SEARCH: u64 = 5_000;

impl Inputs {
    /// `preempt`: each preemptor (priority, highest first; service;
    /// instance) that fits on no node it may use as things are gets the node
    /// where evicting victims of lower priority makes room with the fewest
    /// disruption budgets broken, then the fewest victims, then the lowest
    /// top victim priority, the lowest sum of their priorities, and the
    /// node's name. On a node, every victim not needed is reprieved: all
    /// lower-priority instances are taken out, then put back, those that
    /// would break a budget first, highest priority first (smaller first
    /// within one), while the preemptor still fits (Kubernetes' reprieve);
    /// then a set of fewer victims is looked for (exhaustively while that is
    /// cheap). A budget (`spare`) is kept where any choice keeps it and
    /// broken only as a last resort, never for a `strict` service. The node
    /// is charged and the victims are taken. Returns (victim, preemptor,
    /// the budget broken or "") sorted by victim. Cost: O(preemptors ×
    /// victims · resources), plus the bounded search.
    pub fn preempt(&self) -> Vec<(Value, Value, Value)> {
        let a = |x: usize| self.arg(x);
        // Resources by index, needs, rooms (as assign reads them).
        let names: BTreeSet<ByText> = a(parg::NEED).iter().map(|r| ByText(r[1].clone())).chain(a(parg::ROOM).iter().map(|r| ByText(r[1].clone()))).collect();
        let index: BTreeMap<ByText, usize> = names.into_iter().enumerate().map(|(i, n)| (n, i)).collect();
        let zero = vec![0i64; index.len()];
        let mut needs: HashMap<Value, Vec<i64>> = HashMap::new();
        for r in a(parg::NEED) {
            let v = needs.entry(r[0].clone()).or_insert_with(|| zero.clone());
            let i = index[&ByText(r[1].clone())];
            v[i] = v[i].max(int(&r[2]));
        }
        let mut free: BTreeMap<ByText, Vec<i64>> = BTreeMap::new();
        let mut seen: HashSet<(Value, usize)> = HashSet::new();
        for r in a(parg::ROOM) {
            let f = free.entry(ByText(r[0].clone())).or_insert_with(|| zero.clone());
            let i = index[&ByText(r[1].clone())];
            f[i] = if seen.insert((r[0].clone(), i)) { int(&r[2]) } else { f[i].min(int(&r[2])) };
        }
        let has1 = |x: usize, v: &Value| a(x).iter().any(|r| r.first() == Some(v));
        let has2 = |x: usize, s: &Value, n: &Value| a(x).iter().any(|r| r.len() == 2 && r[0] == *s && r[1] == *n);
        let usable =
            |s: &Value, n: &Value| (!has1(parg::RESTRICTED, s) || has2(parg::ALLOWED, s, n)) && (!has1(parg::RESERVED, n) || has2(parg::ADMITTED, s, n));
        let mut spare: HashMap<Value, i64> = HashMap::new();
        for r in a(parg::BUDGET) {
            let e = spare.entry(r[0].clone()).or_insert(int(&r[1]));
            *e = (*e).min(int(&r[1]));
        }
        let strict: HashSet<Value> = a(parg::STRICT).iter().map(|r| r[0].clone()).collect();
        // Victims per node, by (priority, name); with what they hold.
        let mut victims: BTreeMap<ByText, Vec<Victim>> = BTreeMap::new();
        for r in a(parg::VICTIM) {
            let need = needs.get(&r[2]).cloned().unwrap_or_else(|| zero.clone());
            victims.entry(ByText(r[1].clone())).or_default().push(Victim { priority: int(&r[3]), name: ByText(r[0].clone()), service: r[2].clone(), need });
        }
        for v in victims.values_mut() {
            v.sort_by(|x, y| (x.priority, &x.name).cmp(&(y.priority, &y.name)));
            v.dedup_by(|x, y| x.name == y.name);
        }
        let mut taken: HashSet<Value> = HashSet::new();
        let mut order: Vec<&Row> = a(parg::PREEMPTOR).iter().collect();
        order.sort_by(|x, y| int(&y[2]).cmp(&int(&x[2])).then_with(|| x[1].cmp_text(&y[1])).then_with(|| x[0].cmp_text(&y[0])));
        let fits = |left: &[i64], need: &[i64]| left.iter().zip(need).all(|(l, n)| l >= n);
        let add = |left: &mut [i64], more: &[i64], sign: i64| left.iter_mut().zip(more).for_each(|(l, m)| *l += sign * m);
        let mut out = Vec::new();
        for p in order {
            let (instance, service, priority) = (p[0].clone(), p[1].clone(), int(&p[2]));
            let need = needs.get(&service).unwrap_or(&zero);
            if let Some(left) = free.iter_mut().find(|(n, left)| usable(&service, &n.0) && fits(left, need)).map(|(_, l)| l) {
                // Room without evicting anyone: the next round places it there.
                add(left, need, -1);
                continue;
            }
            // The budgets a set of victims breaks (a strict one: never).
            let broken = |set: &[&Victim]| -> Option<i64> {
                let mut per: HashMap<&Value, i64> = HashMap::new();
                for v in set {
                    *per.entry(&v.service).or_default() += 1;
                }
                let mut over = 0;
                for (s, k) in per {
                    let Some(sp) = spare.get(s) else { continue };
                    if k > (*sp).max(0) {
                        if strict.contains(s) {
                            return None;
                        }
                        over += k - (*sp).max(0);
                    }
                }
                Some(over)
            };
            type Rank = (i64, usize, i64, i64, ByText);
            let rank = |set: &[&Victim], over: i64, node: &ByText| -> Rank {
                (over, set.len(), set.iter().map(|v| v.priority).max().unwrap_or(i64::MIN), set.iter().map(|v| v.priority).sum(), node.clone())
            };
            let mut best: Option<(Rank, Vec<Victim>)> = None;
            for (node, on) in &victims {
                let Some(left) = free.get(node) else { continue };
                if !usable(&service, &node.0) {
                    continue;
                }
                let cands: Vec<&Victim> = on.iter().filter(|v| v.priority < priority && !taken.contains(&v.name.0)).collect();
                let mut room = left.clone();
                for v in &cands {
                    add(&mut room, &v.need, 1);
                }
                if !fits(&room, need) {
                    continue;
                }
                // Which would break a budget if evicted (highest priority
                // first claims the spare), then reprieve: those first,
                // highest priority first, smaller first within a priority.
                let mut left_spare: HashMap<&Value, i64> = HashMap::new();
                let mut by_priority = cands.clone();
                // (Among equals, the last by name is reprieved first: the
                // first by name is the one evicted.)
                by_priority.sort_by(|x, y| {
                    y.priority.cmp(&x.priority).then_with(|| x.need.iter().sum::<i64>().cmp(&y.need.iter().sum())).then_with(|| y.name.cmp(&x.name))
                });
                let (mut violating, mut fine) = (Vec::new(), Vec::new());
                for v in by_priority {
                    match spare.get(&v.service) {
                        Some(sp) => {
                            let l = left_spare.entry(&v.service).or_insert((*sp).max(0));
                            if *l > 0 {
                                *l -= 1;
                                fine.push(v);
                            } else {
                                violating.push(v);
                            }
                        }
                        None => fine.push(v),
                    }
                }
                let mut evicted: Vec<&Victim> = Vec::new();
                for v in violating.into_iter().chain(fine) {
                    let mut without = room.clone();
                    add(&mut without, &v.need, -1);
                    if fits(&without, need) {
                        room = without;
                    } else {
                        evicted.push(v);
                    }
                }
                let mut chosen = broken(&evicted).map(|over| (rank(&evicted, over, node), evicted.clone()));
                // Fewer victims, where looking costs little.
                let n = cands.len() as u64;
                for k in 1..evicted.len() {
                    if binomial(n, k as u64) > PREEMPT_SEARCH {
                        break;
                    }
                    let mut found: Option<(Rank, Vec<&Victim>)> = None;
                    for_each_combination(cands.len(), k, &mut |ix: &[usize]| {
                        let set: Vec<&Victim> = ix.iter().map(|&i| cands[i]).collect();
                        let mut r = left.clone();
                        for v in &set {
                            add(&mut r, &v.need, 1);
                        }
                        if fits(&r, need) {
                            if let Some(over) = broken(&set) {
                                let key = rank(&set, over, node);
                                if found.as_ref().is_none_or(|(f, _)| key < *f) {
                                    found = Some((key, set));
                                }
                            }
                        }
                    });
                    if let Some((key, set)) = found {
                        if chosen.as_ref().is_none_or(|(c, _)| key < *c) {
                            chosen = Some((key, set));
                        }
                        break;
                    }
                }
                let Some((key, set)) = chosen else { continue };
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, set.into_iter().cloned().collect()));
                }
            }
            let Some(((_, _, _, _, node), chosen)) = best else { continue };
            let left = free.get_mut(&node).expect("a node with room rows");
            for v in &chosen {
                taken.insert(v.name.0.clone());
                let note = match spare.get_mut(&v.service) {
                    Some(s) => {
                        *s -= 1;
                        if *s < 0 {
                            format!("the disruption budget of {} (no instance to spare) is broken: no node could make room without it", v.service)
                        } else {
                            String::new()
                        }
                    }
                    None => String::new(),
                };
                add(left, &v.need, 1);
                out.push((v.name.0.clone(), instance.clone(), Value::str(&note)));
            }
            add(left, need, -1);
        }
        out.sort_by(|x, y| x.0.cmp_text(&y.0));
        out
    }
}

/// n choose k, saturating.
fn binomial(n: u64, k: u64) -> u64 {
    (0..k.min(n)).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Calls `f` with every k-subset of 0..n, as sorted indices, in lexicographic order.
fn for_each_combination(n: usize, k: usize, f: &mut dyn FnMut(&[usize])) {
    if k > n {
        return;
    }
    let mut ix: Vec<usize> = (0..k).collect();
    loop {
        f(&ix);
        let Some(i) = (0..k).rev().find(|&i| ix[i] != i + n - k) else { return };
        ix[i] += 1;
        for j in i + 1..k {
            ix[j] = ix[j - 1] + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Value {
        Value::str(s)
    }

    /// A round built argument by argument.
    #[derive(Clone, Debug, Default)]
    struct Case(Inputs);

    impl Case {
        fn new() -> Case {
            Case(Inputs { args: vec![Vec::new(); ASSIGN.len()] })
        }
        fn row(mut self, a: usize, row: Vec<Value>) -> Case {
            self.0.args[a].push(Row::from_vec(row));
            self
        }
        fn pending(self, service: &str, from: usize, to: usize, priority: i64) -> Case {
            (from..to).fold(self, |c, i| c.row(arg::PENDING, vec![v(&format!("{service}-{i}")), v(service), Value::Int(priority)]))
        }
        fn need(self, service: &str, resource: &str, amount: i64) -> Case {
            self.row(arg::NEED, vec![v(service), v(resource), Value::Int(amount)])
        }
        /// A node with the same free and total of each (resource, amount).
        fn node(self, node: &str, score: i64, room: &[(&str, i64)]) -> Case {
            let c = self.row(arg::OFFER, vec![v(node), Value::Int(score)]);
            room.iter().fold(c, |c, (r, a)| c.row(arg::ROOM, vec![v(node), v(r), Value::Int(*a), Value::Int(*a)]))
        }
        fn pairs(self, a: usize, pairs: &[(&str, &str)]) -> Case {
            pairs.iter().fold(self, |c, (x, y)| c.row(a, vec![v(x), v(y)]))
        }
        fn one(self, a: usize, x: &str) -> Case {
            self.row(a, vec![v(x)])
        }
        fn reserve(self, node: &str) -> Case {
            self.row(arg::RESERVED, vec![v(node), v("taint dedicated=x:NoSchedule")])
        }
        fn zone(self, node: &str, zone: &str) -> Case {
            self.row(arg::TOPOLOGY, vec![v(node), v("zone"), v(zone)])
        }
        fn assign(&self) -> Vec<(Value, Value)> {
            let out = self.0.assign();
            check(&self.0, &out);
            assert_eq!(out, reference(&self.0), "differs from the reference on {:?}", self.0);
            out
        }
    }

    fn on(out: &[(Value, Value)], node: &str) -> usize {
        out.iter().filter(|(_, n)| *n == v(node)).count()
    }

    /// What one service may use, by the documented rules.
    fn usable(x: &Inputs, s: &Value, n: &Value) -> bool {
        let has = |a: usize, row: &[&Value]| x.arg(a).iter().any(|r| r.len() == row.len() && r.iter().zip(row).all(|(a, b)| a == *b));
        x.arg(arg::OFFER).iter().any(|r| r[0] == *n)
            && (!has(arg::RESTRICTED, &[s]) || has(arg::ALLOWED, &[s, n]))
            && (!x.arg(arg::RESERVED).iter().any(|r| r[0] == *n) || has(arg::ADMITTED, &[s, n]))
    }

    /// The semantics, written the slow way: every instance looks at every node
    /// its service may use, in the documented order.
    fn reference(x: &Inputs) -> Vec<(Value, Value)> {
        let resources = x.resources();
        let mut rooms = x.rooms(&resources);
        let needs = x.needs();
        let zero = vec![0; resources.len()];
        let mut order: Vec<&Row> = x.arg(arg::PENDING).iter().collect();
        order.sort_by(|a, b| int(&b[2]).cmp(&int(&a[2])).then_with(|| a[1].cmp_text(&b[1])).then_with(|| a[0].cmp_text(&b[0])));
        let mut added: HashMap<(Value, Value), i64> = HashMap::new();
        let mut out = Vec::new();
        for p in order {
            let (i, s) = (&p[0], &p[1]);
            let need = needs.get(s).unwrap_or(&zero);
            let packed = x.arg(arg::PACKED).iter().any(|r| r[0] == *s);
            let spread = |n: &Value| x.arg(arg::SPREAD).iter().filter(|r| r[0] == *s && r[1] == *n).map(|r| int(&r[2])).max().unwrap_or(0);
            let hard = x.arg(arg::HARD_SPREAD).iter().filter(|r| r[0] == *s).map(|r| (ByText(r[1].clone()), int(&r[2]))).min().map(|(k, m)| (k.0, m));
            let domain = |n: &Value| -> Option<Value> {
                let (key, _) = hard.as_ref()?;
                x.arg(arg::TOPOLOGY).iter().filter(|r| r[0] == *n && r[1] == *key).map(|r| ByText(r[2].clone())).min().map(|d| d.0)
            };
            // Kept apart: a node in a domain where the other service got an
            // instance earlier in this round.
            let dom = |n: &Value, k: &Value| x.arg(arg::TOPOLOGY).iter().filter(|r| r[0] == *n && r[1] == *k).map(|r| ByText(r[2].clone())).min().map(|d| d.0);
            let service_of = |i: &Value| x.arg(arg::PENDING).iter().find(|p| p[0] == *i).map(|p| p[1].clone());
            let apart = |n: &Value| {
                x.arg(arg::APART).iter().any(|r| {
                    let other = if r[0] == *s {
                        &r[1]
                    } else if r[1] == *s {
                        &r[0]
                    } else {
                        return false;
                    };
                    let Some(d) = dom(n, &r[2]) else { return false };
                    out.iter().any(|(i2, n2): &(Value, Value)| service_of(i2).as_ref() == Some(other) && dom(n2, &r[2]) == Some(d.clone()))
                })
            };
            // (A node kept apart counts for the skew's minimum, as one without room does.)
            let nodes: Vec<Value> = rooms.keys().filter(|n| usable(x, s, n) && (hard.is_none() || domain(n).is_some())).cloned().collect();
            let added_on = |n: &Value| added.get(&(s.clone(), n.clone())).copied().unwrap_or(0);
            let count = |d: Value| nodes.iter().filter(|n| domain(n) == Some(d.clone())).map(|n| spread(n) + added_on(n)).sum::<i64>();
            let min = nodes.iter().filter_map(|n| domain(n)).map(count).min().unwrap_or(0);
            let mut keyed: Vec<((i64, i64, i64, i64, ByText), Value)> = nodes
                .iter()
                .filter(|n| rooms[*n].fits(need) && !apart(n))
                .filter(|n| hard.as_ref().is_none_or(|(_, m)| count(domain(n).unwrap()) + 1 - min <= *m))
                .map(|n| {
                    let c = domain(n).map_or(0, count);
                    let k = spread(n) + added_on(n);
                    let score = rooms[n].score();
                    let points: i64 = x.arg(arg::PREFERENCE).iter().filter(|r| r[0] == *s && r[1] == *n).map(|r| int(&r[2])).sum();
                    let key = if packed { (c, points, 0, -score, ByText(n.clone())) } else { (c, points, k, score, ByText(n.clone())) };
                    (key, n.clone())
                })
                .collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some((_, n)) = keyed.first() {
                rooms.get_mut(n).unwrap().charge(need);
                *added.entry((s.clone(), n.clone())).or_default() += 1;
                out.push((i.clone(), n.clone()));
            }
        }
        out.sort_by(|a, b| a.0.cmp_text(&b.0));
        out
    }

    /// What must hold of any result: only usable nodes, never over any
    /// resource, each instance at most once, no hard spread over its skew,
    /// and no unassigned instance (of a service without a hard spread) that
    /// some usable node still had room for at the end.
    fn check(x: &Inputs, out: &[(Value, Value)]) {
        let needs = x.needs();
        let resources = x.resources();
        let rooms = x.rooms(&resources);
        let zero = vec![0; resources.len()];
        let mut used: HashMap<Value, Vec<i64>> = HashMap::new();
        let mut seen = HashSet::new();
        let service_of = |i: Value| x.arg(arg::PENDING).iter().find(|p| p[0] == i).map(|p| p[1].clone()).expect("assigned instances are pending");
        for (i, n) in out {
            assert!(seen.insert(i.clone()), "{i:?} assigned twice");
            let s = service_of(i.clone());
            assert!(usable(x, &s, n), "{i:?} on {n:?}, which its service may not use");
            let u = used.entry(n.clone()).or_insert_with(|| zero.clone());
            for (r, a) in needs.get(&s).unwrap_or(&zero).iter().enumerate() {
                u[r] += a;
            }
        }
        for (n, room) in &rooms {
            let u = used.get(n).unwrap_or(&zero);
            assert!(room.left.iter().zip(u).all(|(l, u)| u <= l), "{n:?} overcommitted: {u:?} > {:?}", room.left);
        }
        // No two services kept apart share a domain among this round's assignments.
        let dom = |n: &Value, k: &Value| x.arg(arg::TOPOLOGY).iter().filter(|r| r[0] == *n && r[1] == *k).map(|r| ByText(r[2].clone())).min().map(|d| d.0);
        for r in x.arg(arg::APART) {
            for (i, n) in out.iter().filter(|(i, _)| service_of(i.clone()) == r[0]) {
                for (j, m) in out.iter().filter(|(j, _)| service_of(j.clone()) == r[1] && j != i) {
                    let (d, e) = (dom(n, &r[2]), dom(m, &r[2]));
                    assert!(d.is_none() || d != e, "{i:?} on {n:?} and {j:?} on {m:?} share {:?} {d:?}, kept apart", r[2]);
                }
            }
        }
        for p in x.arg(arg::PENDING).iter().filter(|p| !seen.contains(&p[0])) {
            if x.arg(arg::HARD_SPREAD).iter().any(|h| h[0] == p[1]) || x.arg(arg::APART).iter().any(|a| a[0] == p[1] || a[1] == p[1]) {
                continue;
            }
            let need = needs.get(&p[1]).unwrap_or(&zero);
            for (n, room) in rooms.iter().filter(|(n, _)| usable(x, &p[1], n)) {
                let u = used.get(n).unwrap_or(&zero);
                assert!(room.left.iter().zip(u).zip(need).any(|((l, u), nd)| l - u < *nd), "{:?} left pending though {n:?} has room", p[0]);
            }
        }
    }

    #[test]
    fn two_hundred_pending_on_ten_nodes_that_hold_exactly_two_hundred() {
        let mut c = Case::new().pending("web", 0, 200, 0).need("web", "cpu", 100).need("web", "memory", 64);
        for n in 0..10 {
            c = c.node(&format!("node-{n}"), 0, &[("cpu", 2000), ("memory", 20 * 64)]);
        }
        let out = c.assign();
        assert_eq!(out.len(), 200);
        for n in 0..10 {
            assert_eq!(on(&out, &format!("node-{n}")), 20, "spread evenly");
        }
        assert_eq!(c.pending("web", 200, 201, 0).assign().len(), 200, "one more fits nowhere");
    }

    #[test]
    fn prefers_spread_then_score_then_name_and_is_deterministic() {
        let c = Case::new()
            .pending("a", 0, 3, 0)
            .need("a", "cpu", 1)
            .node("n2", 5, &[("cpu", 10)])
            .node("n1", 5, &[("cpu", 10)])
            .node("n3", 0, &[("cpu", 10)])
            .row(arg::SPREAD, vec![v("a"), v("n3"), Value::Int(1)]);
        let out = c.assign();
        assert_eq!(out, vec![(v("a-0"), v("n1")), (v("a-1"), v("n2")), (v("a-2"), v("n3"))]);
        let mut reversed = c.clone();
        reversed.0.args.iter_mut().for_each(|a| a.reverse());
        assert_eq!(reversed.assign(), out, "input order does not matter");
    }

    #[test]
    fn a_restricted_service_uses_only_allowed_nodes() {
        let mut c = Case::new().pending("db", 0, 2, 0).pending("web", 0, 1, 0).one(arg::RESTRICTED, "db").pairs(arg::ALLOWED, &[("db", "n3")]);
        for n in 0..4 {
            c = c.node(&format!("n{n}"), 0, &[("cpu", 10)]);
        }
        assert_eq!(c.assign(), vec![(v("db-0"), v("n3")), (v("db-1"), v("n3")), (v("web-0"), v("n0"))]);
        // Restricted with nothing allowed (a bound volume's node is down): nowhere.
        c.0.args[arg::ALLOWED].clear();
        assert_eq!(c.assign(), vec![(v("web-0"), v("n0"))]);
        // Allowed a node that offers nothing: nowhere either.
        let c = c.pairs(arg::ALLOWED, &[("db", "n9")]);
        assert_eq!(c.assign(), vec![(v("web-0"), v("n0"))]);
    }

    #[test]
    fn one_big_round_balances_load_across_services() {
        // 10 services × 10 instances on 20 equal nodes: 5 per node, not 10 on the first 10.
        let mut c = Case::new();
        for s in 0..10 {
            c = c.pending(&format!("s{s}"), 0, 10, 0).need(&format!("s{s}"), "cpu", 100).need(&format!("s{s}"), "memory", 100);
        }
        for n in 0..20 {
            c = c.node(&format!("n{n:02}"), 0, &[("cpu", 10_000), ("memory", 10_000)]);
        }
        let out = c.assign();
        for n in 0..20 {
            assert_eq!(on(&out, &format!("n{n:02}")), 5, "n{n:02}");
        }
    }

    #[test]
    fn any_resource_counts_and_a_node_without_it_takes_nothing_that_needs_it() {
        let c = Case::new()
            .pending("train", 0, 3, 0)
            .need("train", "cpu", 100)
            .need("train", "gpu", 1)
            .pending("web", 0, 2, 0)
            .need("web", "cpu", 100)
            .node("cpu-only", 0, &[("cpu", 10_000)])
            .node("gpu-1", 0, &[("cpu", 10_000), ("gpu", 2)]);
        let out = c.assign();
        assert_eq!(on(&out, "gpu-1"), 2 + out.iter().filter(|(i, n)| i.to_string().starts_with("web") && *n == v("gpu-1")).count());
        assert!(out.iter().all(|(i, n)| !i.to_string().starts_with("train") || *n == v("gpu-1")), "{out:?}");
        assert_eq!(out.iter().filter(|(i, _)| i.to_string().starts_with("train")).count(), 2, "two GPUs, two trainers: {out:?}");
    }

    #[test]
    fn a_preference_steers_only_its_own_service() {
        // `soft` does not tolerate quiet's PreferNoSchedule taint: quiet
        // scores best, but only `soft` is told it is worse there.
        let c = Case::new()
            .pending("soft", 0, 2, 0)
            .need("soft", "cpu", 1)
            .pending("other", 0, 1, 0)
            .need("other", "cpu", 1)
            .node("quiet", -500, &[("cpu", 10)])
            .node("busy", 0, &[("cpu", 10)])
            .row(arg::PREFERENCE, vec![v("soft"), v("quiet"), Value::Int(2000)]);
        let out = c.assign();
        let of = |i: &str| out.iter().find(|(x, _)| *x == v(i)).map(|(_, n)| n.clone());
        assert_eq!(of("soft-0"), Some(v("busy")), "{out:?}");
        assert_eq!(of("soft-1"), Some(v("busy")), "{out:?}");
        assert_eq!(of("other-0"), Some(v("quiet")), "{out:?}");
        // … and where only the worse node has room, it is used (a preference, not a rule).
        let c = Case::new()
            .pending("soft", 0, 1, 0)
            .need("soft", "cpu", 1)
            .node("quiet", 0, &[("cpu", 10)])
            .row(arg::PREFERENCE, vec![v("soft"), v("quiet"), Value::Int(2000)]);
        assert_eq!(c.assign(), vec![(v("soft-0"), v("quiet"))]);
    }

    #[test]
    fn services_kept_apart_never_share_a_domain_within_the_round() {
        // Both pending at once, one zone each way: the old one-sided rule
        // could not see what the same round assigned.
        let mut c = Case::new().pending("cache", 0, 2, 0).need("cache", "cpu", 1).pending("db", 0, 2, 0).need("db", "cpu", 1);
        for (n, z) in [("n1", "a"), ("n2", "a"), ("n3", "b"), ("n4", "b")] {
            c = c.node(n, 0, &[("cpu", 10)]).zone(n, z);
        }
        let c = c.row(arg::APART, vec![v("db"), v("cache"), v("zone")]);
        let out = c.assign();
        assert_eq!(out.len(), 4, "{out:?}");
        let zone = |n: &Value| if ["n1", "n2"].contains(&n.to_string().as_str()) { "a" } else { "b" };
        let of = |s: &str| out.iter().filter(|(i, _)| i.to_string().starts_with(s)).map(|(_, n)| zone(n)).collect::<BTreeSet<&str>>();
        assert!(of("db").is_disjoint(&of("cache")), "{out:?}");
        // A service apart from itself: one instance per zone.
        let c = Case::new()
            .pending("solo", 0, 3, 0)
            .need("solo", "cpu", 1)
            .node("n1", 0, &[("cpu", 10)])
            .zone("n1", "a")
            .node("n2", 0, &[("cpu", 10)])
            .zone("n2", "b");
        let out = c.row(arg::APART, vec![v("solo"), v("solo"), v("zone")]).assign();
        assert_eq!(out.len(), 2, "{out:?}");
    }

    #[test]
    fn a_reserved_node_takes_only_admitted_services() {
        let c = Case::new()
            .pending("web", 0, 3, 0)
            .pending("ops", 0, 1, 0)
            .node("tainted", -100, &[("cpu", 10)])
            .node("plain", 0, &[("cpu", 10)])
            .reserve("tainted")
            .pairs(arg::ADMITTED, &[("ops", "tainted")]);
        let out = c.assign();
        assert_eq!(on(&out, "tainted"), 1, "only ops, though it scores best: {out:?}");
        assert!(out.contains(&(v("ops-0"), v("tainted"))));
    }

    #[test]
    fn a_hard_spread_never_exceeds_its_skew_however_many_are_pending() {
        // Three zones, one of them small: max_skew 1 keeps them within one.
        let mut c = Case::new().pending("web", 0, 9, 0).need("web", "cpu", 100).row(arg::HARD_SPREAD, vec![v("web"), v("zone"), Value::Int(1)]);
        for (n, z, cpu) in [("a1", "a", 1000), ("a2", "a", 1000), ("b1", "b", 1000), ("c1", "c", 200)] {
            c = c.node(n, 0, &[("cpu", cpu)]).zone(n, z);
        }
        let out = c.assign();
        let zone = |z: &str| out.iter().filter(|(_, n)| n.to_string().starts_with(z)).count();
        // Zone c fits 2: so a and b get at most 3 each, and the rest wait.
        assert_eq!((zone("a"), zone("b"), zone("c")), (3, 3, 2), "{out:?}");
        // Instances already there count.
        let c = c.row(arg::SPREAD, vec![v("web"), v("a1"), Value::Int(2)]);
        let out = c.assign();
        let zone = |z: &str| out.iter().filter(|(_, n)| n.to_string().starts_with(z)).count();
        assert_eq!((zone("a"), zone("b"), zone("c")), (1, 3, 2), "{out:?}");
    }

    #[test]
    fn a_packed_service_fills_the_most_allocated_node_first() {
        let c = Case::new().pending("batch", 0, 3, 0).need("batch", "cpu", 100).one(arg::PACKED, "batch").node("empty", 0, &[("cpu", 1000)]).node(
            "busy",
            500,
            &[("cpu", 1000)],
        );
        assert_eq!(c.assign().iter().map(|(_, n)| n.to_string()).collect::<Vec<_>>(), vec!["busy"; 3]);
    }

    #[test]
    fn higher_priority_takes_scarce_room_first() {
        let c = Case::new().pending("a-low", 0, 1, 0).need("a-low", "cpu", 100).pending("z-high", 0, 1, 10).need("z-high", "cpu", 100).node(
            "n",
            0,
            &[("cpu", 100)],
        );
        assert_eq!(c.assign(), vec![(v("z-high-0"), v("n"))]);
    }

    /// A preemption round built argument by argument.
    fn preempt_case() -> Inputs {
        Inputs { args: vec![Vec::new(); PREEMPT.len()] }
    }
    fn push(x: &mut Inputs, a: usize, row: Vec<Value>) {
        x.args[a].push(Row::from_vec(row));
    }
    fn victim(x: &mut Inputs, i: &str, n: &str, s: &str, p: i64, cpu: i64) {
        push(x, parg::VICTIM, vec![v(i), v(n), v(s), Value::Int(p)]);
        if !x.args[parg::NEED].iter().any(|r| r[0] == v(s)) {
            push(x, parg::NEED, vec![v(s), v("cpu"), Value::Int(cpu)]);
        }
    }

    /// (victim, preemptor) pairs, and the budgets broken.
    fn preempted(x: &Inputs) -> Vec<(Value, Value)> {
        x.preempt().into_iter().map(|(v, p, _)| (v, p)).collect()
    }

    #[test]
    fn preemption_takes_the_fewest_lowest_priority_victims() {
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("big-0"), v("big"), Value::Int(10)]);
        push(&mut x, parg::NEED, vec![v("big"), v("cpu"), Value::Int(600)]);
        for n in ["n1", "n2"] {
            push(&mut x, parg::ROOM, vec![v(n), v("cpu"), Value::Int(100), Value::Int(1000)]);
        }
        // n1: three small victims would be needed; n2: one large one.
        victim(&mut x, "s-0", "n1", "s", 0, 200);
        victim(&mut x, "s-1", "n1", "s", 0, 200);
        victim(&mut x, "s-2", "n1", "s", 0, 200);
        victim(&mut x, "l-0", "n2", "l", 5, 500);
        assert_eq!(preempted(&x), vec![(v("l-0"), v("big-0"))]);
        // A budget that spares none of l: the three small ones (n2 would break it).
        push(&mut x, parg::BUDGET, vec![v("l"), Value::Int(0)]);
        assert_eq!(preempted(&x), vec![(v("s-0"), v("big-0")), (v("s-1"), v("big-0")), (v("s-2"), v("big-0"))]);
        // Room somewhere as it is: no one is evicted.
        push(&mut x, parg::ROOM, vec![v("n3"), v("cpu"), Value::Int(600), Value::Int(1000)]);
        assert_eq!(preempted(&x), vec![]);
    }

    /// From Kubernetes' default_preemption_test.go: victims are reprieved,
    /// highest priority first, while the preemptor still fits; the
    /// old lowest-priority-first walk evicted both.
    #[test]
    fn preemption_reprieves_every_victim_not_needed() {
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("p-0"), v("p"), Value::Int(10)]);
        push(&mut x, parg::NEED, vec![v("p"), v("cpu"), Value::Int(500)]);
        push(&mut x, parg::ROOM, vec![v("n1"), v("cpu"), Value::Int(100), Value::Int(1000)]);
        victim(&mut x, "a-0", "n1", "a", 1, 300);
        victim(&mut x, "b-0", "n1", "b", 2, 600);
        assert_eq!(preempted(&x), vec![(v("b-0"), v("p-0"))], "b alone makes room: a is reprieved");
    }

    #[test]
    fn preemption_takes_as_few_as_possible_then_the_lowest_priorities() {
        // Mixed priorities on one node: two small low ones or one big higher one.
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("p-0"), v("p"), Value::Int(10)]);
        push(&mut x, parg::NEED, vec![v("p"), v("cpu"), Value::Int(200)]);
        push(&mut x, parg::ROOM, vec![v("n1"), v("cpu"), Value::Int(0), Value::Int(400)]);
        victim(&mut x, "a-0", "n1", "a", 1, 100);
        victim(&mut x, "b-0", "n1", "b", 2, 100);
        victim(&mut x, "c-0", "n1", "c", 3, 200);
        assert_eq!(preempted(&x), vec![(v("c-0"), v("p-0"))], "one victim, not two");
        // Of equally few, the lowest priorities.
        victim(&mut x, "d-0", "n1", "d", 2, 200);
        assert_eq!(preempted(&x), vec![(v("d-0"), v("p-0"))]);
        // The search for fewer finds what the greedy reprieve misses:
        // reprieving the higher-priority 150s first leaves two 100s out.
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("p-0"), v("p"), Value::Int(10)]);
        push(&mut x, parg::NEED, vec![v("p"), v("cpu"), Value::Int(200)]);
        push(&mut x, parg::ROOM, vec![v("n1"), v("cpu"), Value::Int(0), Value::Int(500)]);
        victim(&mut x, "a-0", "n1", "a", 1, 100);
        victim(&mut x, "a-1", "n1", "a", 1, 100);
        victim(&mut x, "b-0", "n1", "b", 2, 150);
        victim(&mut x, "c-0", "n1", "c", 3, 150);
        let out = preempted(&x);
        assert_eq!(out.len(), 2, "{out:?}");
    }

    #[test]
    fn a_budget_is_broken_only_as_a_last_resort_and_a_strict_one_never() {
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("p-0"), v("p"), Value::Int(10)]);
        push(&mut x, parg::NEED, vec![v("p"), v("cpu"), Value::Int(500)]);
        push(&mut x, parg::ROOM, vec![v("n1"), v("cpu"), Value::Int(0), Value::Int(500)]);
        victim(&mut x, "db-0", "n1", "db", 0, 500);
        push(&mut x, parg::BUDGET, vec![v("db"), Value::Int(0)]);
        let out = x.preempt();
        assert_eq!(out.len(), 1, "no other choice: the budget is broken");
        assert!(out[0].2.to_string().contains("disruption budget of db"), "{out:?}");
        // Where another node makes room within budgets, that one.
        push(&mut x, parg::ROOM, vec![v("n2"), v("cpu"), Value::Int(0), Value::Int(500)]);
        victim(&mut x, "web-0", "n2", "web", 5, 500);
        assert_eq!(x.preempt(), vec![(v("web-0"), v("p-0"), v(""))]);
        // A strict budget is never broken.
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("p-0"), v("p"), Value::Int(10)]);
        push(&mut x, parg::NEED, vec![v("p"), v("cpu"), Value::Int(500)]);
        push(&mut x, parg::ROOM, vec![v("n1"), v("cpu"), Value::Int(0), Value::Int(500)]);
        victim(&mut x, "db-0", "n1", "db", 0, 500);
        push(&mut x, parg::BUDGET, vec![v("db"), Value::Int(0)]);
        push(&mut x, parg::STRICT, vec![v("db")]);
        assert_eq!(x.preempt(), vec![]);
    }

    #[test]
    fn combinations_are_every_k_subset_once() {
        let mut seen = Vec::new();
        for_each_combination(5, 3, &mut |ix: &[usize]| seen.push(ix.to_vec()));
        assert_eq!(seen.len() as u64, binomial(5, 3));
        assert_eq!(seen.first(), Some(&vec![0, 1, 2]));
        assert_eq!(seen.last(), Some(&vec![2, 3, 4]));
        let mut none = 0;
        for_each_combination(2, 3, &mut |_: &[usize]| none += 1);
        assert_eq!(none, 0);
    }

    #[test]
    fn preemption_never_takes_equal_priorities_and_keeps_to_usable_nodes() {
        let mut x = preempt_case();
        push(&mut x, parg::PREEMPTOR, vec![v("a-0"), v("a"), Value::Int(5)]);
        push(&mut x, parg::NEED, vec![v("a"), v("cpu"), Value::Int(500)]);
        push(&mut x, parg::ROOM, vec![v("n1"), v("cpu"), Value::Int(0), Value::Int(1000)]);
        push(&mut x, parg::ROOM, vec![v("n2"), v("cpu"), Value::Int(0), Value::Int(1000)]);
        victim(&mut x, "b-0", "n1", "b", 5, 1000);
        assert_eq!(preempted(&x), vec![], "same priority");
        victim(&mut x, "c-0", "n2", "c", 1, 1000);
        push(&mut x, parg::RESERVED, vec![v("n2"), v("taint t=1:NoSchedule")]);
        assert_eq!(preempted(&x), vec![], "n2 is reserved and a is not admitted");
        push(&mut x, parg::ADMITTED, vec![v("a"), v("n2")]);
        assert_eq!(preempted(&x), vec![(v("c-0"), v("a-0"))]);
        // Two preemptors: the room one frees is charged; the second needs another victim.
        push(&mut x, parg::PREEMPTOR, vec![v("a-1"), v("a"), Value::Int(5)]);
        assert_eq!(preempted(&x), vec![(v("c-0"), v("a-0"))], "c-0 frees 1000: both fit on n2");
        push(&mut x, parg::PREEMPTOR, vec![v("a-2"), v("a"), Value::Int(5)]);
        assert_eq!(preempted(&x), vec![(v("c-0"), v("a-0"))], "a third finds no other victim");
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
        for _ in 0..1500 {
            let services = 1 + next(4);
            let nodes = 1 + next(8);
            let resources = ["cpu", "memory", "gpu"];
            let mut c = Case::new();
            for s in 0..services {
                let name = format!("s{s}");
                c = c.pending(&name, 0, next(12) as usize, next(3) as i64);
                for r in resources.iter().take(1 + next(3) as usize) {
                    c = c.need(&name, r, next(30) as i64);
                }
                if next(3) == 0 {
                    c = c.one(arg::RESTRICTED, &name);
                }
                if next(4) == 0 {
                    c = c.one(arg::PACKED, &name);
                }
                if next(3) == 0 {
                    c = c.row(arg::HARD_SPREAD, vec![v(&name), v("zone"), Value::Int(1 + next(2) as i64)]);
                }
                for n in 0..nodes {
                    let node = format!("n{n}");
                    if next(3) == 0 {
                        c = c.pairs(arg::ALLOWED, &[(&name, &node)]);
                    }
                    if next(3) == 0 {
                        c = c.pairs(arg::ADMITTED, &[(&name, &node)]);
                    }
                    if next(4) == 0 {
                        c = c.row(arg::SPREAD, vec![v(&name), v(&node), Value::Int(next(3) as i64)]);
                    }
                    if next(4) == 0 {
                        c = c.row(arg::PREFERENCE, vec![v(&name), v(&node), Value::Int(next(3) as i64 * 300)]);
                    }
                }
                if next(4) == 0 {
                    let other = format!("s{}", next(services));
                    c = c.row(arg::APART, vec![v(&name), v(&other), v("zone")]);
                }
            }
            for n in 0..nodes {
                let node = format!("n{n}");
                if next(5) > 0 {
                    let mut room: Vec<(&str, i64)> = Vec::new();
                    for r in resources {
                        if next(4) > 0 {
                            room.push((r, next(120) as i64));
                        }
                    }
                    c = c.node(&node, next(5) as i64 * 100, &room);
                }
                if next(4) == 0 {
                    c = c.reserve(&node);
                }
                if next(5) > 0 {
                    c = c.zone(&node, ["a", "b", "c"][next(3) as usize]);
                }
            }
            c.assign();
        }
    }
}
