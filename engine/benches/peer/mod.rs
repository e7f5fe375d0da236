//! The fair peer (issue #23): the controller's core written by hand as one
//! differential dataflow — intent max → instances → placement validity →
//! usage → endpoints — over the same facts the engine reads, with the
//! semantics of the shipped rules it stands for (each rule is written above
//! the operators that implement it, datafrog-style).
//!
//! What it leaves out, and why the engine's output still matches on the
//! benches' clusters: new placements (`assign`; the peer consumes
//! `placement/instance/I` as etcd holds it, as the engine does on its next
//! revision), evictions (none in a converged cluster), refused services
//! (names are short), rejected requests (values are valid), address ranges
//! (none registered: a node claims its own address) and extended resources
//! (cpu and memory only). The bench checks its outputs against the engine's
//! on the same facts (`check`).
//!
//! Names are interned to `u32` ids; an instance id is its service's id and
//! its ordinal packed in a `u64`, as a hand-written controller would hold it.

use differential_dataflow::input::{Input, InputSession};
use differential_dataflow::operators::threshold::ThresholdTotal;
use differential_dataflow::VecCollection;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use timely::dataflow::operators::probe::Handle as Probe;
use timely::worker::Worker;

type Id = u32;
/// A service's id in the high half, the ordinal in the low.
type Inst = u64;

fn inst(service: Id, ordinal: u32) -> Inst {
    (u64::from(service) << 32) | u64::from(ordinal)
}

fn service_of(i: Inst) -> Id {
    (i >> 32) as Id
}

/// The outputs the peer maintains, as accumulated diffs.
#[derive(Default)]
struct Outputs {
    effective: BTreeMap<(Id, i64), isize>,
    used: BTreeMap<(Id, u8, i64), isize>,
    endpoint: BTreeMap<(Id, Inst, Id, i64), isize>,
}

fn accumulate<K: Ord>(map: &mut BTreeMap<K, isize>, k: K, d: isize) {
    use std::collections::btree_map::Entry;
    match map.entry(k) {
        Entry::Occupied(mut e) => {
            *e.get_mut() += d;
            if *e.get() == 0 {
                e.remove();
            }
        }
        Entry::Vacant(e) => {
            e.insert(d);
        }
    }
}

const CPU: u8 = 0;
const MEMORY: u8 = 1;

struct Inputs {
    intent: InputSession<u64, (Id, i64), isize>,
    cpu: InputSession<u64, (Id, i64), isize>,
    memory: InputSession<u64, (Id, i64), isize>,
    readiness: InputSession<u64, Id, isize>,
    node_cpu: InputSession<u64, (Id, i64), isize>,
    node_memory: InputSession<u64, (Id, i64), isize>,
    node_address: InputSession<u64, (Id, Id), isize>,
    alive: InputSession<u64, Id, isize>,
    heartbeat: InputSession<u64, (Id, i64), isize>,
    ttl: InputSession<u64, (Id, i64), isize>,
    clock: InputSession<u64, i64, isize>,
    placed: InputSession<u64, (Inst, Id), isize>,
    running: InputSession<u64, (Id, Inst), isize>,
    ip: InputSession<u64, ((Id, Inst), Id), isize>,
    port: InputSession<u64, ((Id, Inst), i64), isize>,
    healthy: InputSession<u64, (Id, Inst), isize>,
}

/// The hand-written dataflow, its inputs and the key-value store behind them.
pub struct Peer {
    inputs: Inputs,
    probe: Probe<u64>,
    outputs: Rc<RefCell<Outputs>>,
    /// Every key the peer reads, with its value (for retractions).
    store: HashMap<String, String>,
    names: Vec<String>,
    ids: HashMap<String, Id>,
    time: u64,
}

type C<'s, D> = VecCollection<'s, u64, D, isize>;

/// A service's request: as desired, or 0 when not given.
fn request<'s>(services: &C<'s, (Id, ())>, desired: C<'s, (Id, i64)>) -> C<'s, (Id, i64)> {
    let given = services.clone().join_map(desired.clone(), |&s, &(), &a| (s, a));
    given.concat(services.clone().antijoin(desired.map(|(s, _)| s).distinct_total()).map(|(s, ())| (s, 0)))
}

/// One resource's `used(n, r, u)` rows: the kept instances' requests summed
/// per ready node with capacity (0 when none).
fn used<'s>(kept_service: &C<'s, (Id, (Id, Inst))>, ready: &C<'s, Id>, request: C<'s, (Id, i64)>, capacity: C<'s, (Id, i64)>, r: u8) -> C<'s, (Id, u8, i64)> {
    let per_node = capacity.map(|(n, _)| (n, ())).semijoin(ready.clone()).map(|(n, ())| n).distinct_total();
    // Each instance's amount, and a zero per node with capacity (the default).
    let parts = kept_service.clone().join_map(request, |_s, &(n, i), &a| (n, (i, a))).concat(per_node.clone().map(|n| (n, (u64::MAX, 0))));
    parts
        .reduce(|_n, amounts: &[(&(Inst, i64), isize)], out: &mut Vec<(i64, isize)>| out.push((amounts.iter().map(|((_, a), d)| *a * *d as i64).sum(), 1)))
        .semijoin(per_node)
        .map(move |(n, u)| (n, r, u))
}

impl Peer {
    pub fn new(worker: &mut Worker) -> Peer {
        let outputs: Rc<RefCell<Outputs>> = Rc::default();
        let probe = Probe::new();
        let (out, p) = (outputs.clone(), probe.clone());
        let inputs = worker.dataflow::<u64, _, _>(move |scope| {
            let (intent_in, intent) = scope.new_collection::<(Id, i64), isize>();
            let (cpu_in, cpu) = scope.new_collection::<(Id, i64), isize>();
            let (memory_in, memory) = scope.new_collection::<(Id, i64), isize>();
            let (readiness_in, readiness) = scope.new_collection::<Id, isize>();
            let (node_cpu_in, node_cpu) = scope.new_collection::<(Id, i64), isize>();
            let (node_memory_in, node_memory) = scope.new_collection::<(Id, i64), isize>();
            let (node_address_in, node_address) = scope.new_collection::<(Id, Id), isize>();
            let (alive_in, alive) = scope.new_collection::<Id, isize>();
            let (heartbeat_in, heartbeat) = scope.new_collection::<(Id, i64), isize>();
            let (ttl_in, ttl) = scope.new_collection::<(Id, i64), isize>();
            let (clock_in, clock) = scope.new_collection::<i64, isize>();
            let (placed_in, placed) = scope.new_collection::<(Inst, Id), isize>();
            let (running_in, running) = scope.new_collection::<(Id, Inst), isize>();
            let (ip_in, ip) = scope.new_collection::<((Id, Inst), Id), isize>();
            let (port_in, port) = scope.new_collection::<((Id, Inst), i64), isize>();
            let (healthy_in, healthy) = scope.new_collection::<(Id, Inst), isize>();

            // effective_instances(s, max(n)) :- intent_instances(_, s, n).
            let effective = intent.reduce(|_s, counts: &[(&i64, isize)], out: &mut Vec<(i64, isize)>| out.push((*counts.last().expect("a group").0, 1)));

            // instance(s ++ "-" ++ i, s, i) :- effective_instances(s, n), i in 0..n.
            let instance: VecCollection<'_, u64, (Inst, Id), isize> = effective.clone().flat_map(|(s, n)| (0..n.max(0) as u32).map(move |i| (inst(s, i), s)));

            // node(n) :- node_cpu(n, _).  node(n) :- node_memory(n, _).  node(n) :- node_address(n, _).
            let node =
                node_cpu.clone().map(|(n, _)| n).concat(node_memory.clone().map(|(n, _)| n)).concat(node_address.clone().map(|(n, _)| n)).distinct_total();

            // grace(n, t) :- node(n), node_ttl(n, t).  grace(n, 30) :- node(n), not node_ttl(n, _).
            let keyed_node = node.clone().map(|n| (n, ()));
            let grace = keyed_node
                .clone()
                .join_map(ttl.clone(), |&n, &(), &t| (n, t))
                .concat(keyed_node.clone().antijoin(ttl.map(|(n, _)| n).distinct_total()).map(|(n, ())| (n, 30)));

            // stale(n) :- heartbeat(n, b), grace(n, g), clock(c), max(c - b - g, b - c) > 0.
            let stale = heartbeat
                .clone()
                .join_map(grace, |&n, &b, &g| ((), (n, b, g)))
                .join_map(clock.map(|c| ((), c)), |&(), &(n, b, g), &c| (n, c - b > g || b > c))
                .filter(|(_, stale)| *stale)
                .map(|(n, _)| n)
                .distinct_total();

            // ready(n) :- node(n), node_alive(n, _), heartbeat(n, _), not stale(n).
            let ready = keyed_node.semijoin(alive.distinct_total()).semijoin(heartbeat.map(|(n, _)| n).distinct_total()).antijoin(stale).map(|(n, ())| n);

            // kept(i, n) :- placed(i, n), instance(i, _, _), ready(n), not is_evicted(i).
            // placement(i, n) :- kept(i, n).
            let kept = placed.semijoin(instance.clone().map(|(i, _)| i)).map(|(i, n)| (n, i)).semijoin(ready.clone()).map(|(n, i)| (i, n));

            // request(s, "cpu", c) :- effective_cpu(s, c), where
            // effective_cpu(s, c) :- effective_instances(s, _), desired_cpu(s, c).
            // effective_cpu(s, 0) :- effective_instances(s, _), not desired_cpu(s, _), …
            // (and the same for memory).
            let services = effective.clone().map(|(s, _)| (s, ()));
            let request_cpu = request(&services, cpu);
            let request_memory = request(&services, memory);

            // capacity(n, "cpu", c) :- ready(n), node_cpu(n, c).  (memory alike)
            // used(n, r, sum(a) default 0) :- kept(i, n), instance(i, s, _), request(s, r, a) per capacity(n, r, _).
            let kept_service = kept.clone().join_map(instance.clone(), |&i, &n, &s| (s, (n, i)));
            let used_rows = used(&kept_service, &ready, request_cpu, node_cpu, CPU).concat(used(&kept_service, &ready, request_memory, node_memory, MEMORY));

            // running(i, s) :- placement(i, n), instance(i, s, _), reported_state(n, i, "running").
            let placed_at = kept.map(|(i, n)| ((n, i), ()));
            let running = placed_at.clone().semijoin(running).map(|((n, i), ())| (n, i));
            // probe_ready(i) :- placement(i, n), reported_probe(n, i, "readiness", "healthy").
            // probe_ready(i) :- instance(i, s, _), not has_readiness(s).
            let probed = placed_at.clone().semijoin(healthy).map(|((_, i), ())| i);
            let unprobed = instance.map(|(i, s)| (s, i)).antijoin(readiness.distinct_total()).map(|(_, i)| i);
            let probe_ready = probed.concat(unprobed).distinct_total();
            // claimable(n, ip) :- reported_ip(n, _, ip), not has_address_range(n), node_address(n, ip).
            // endpoint(s, i, ip ++ ":" ++ port) :- running(i, s), probe_ready(i), placement(i, n),
            //     reported_ip(n, i, ip), claimable(n, ip), reported_port(n, i, port).
            let endpoint = running
                .map(|(n, i)| (i, n))
                .semijoin(probe_ready)
                .map(|(i, n)| ((n, i), ()))
                .join_map(ip, |&(n, i), &(), &a| ((n, a), i))
                .semijoin(node_address)
                .map(|((n, a), i)| ((n, i), a))
                .join_map(port, |&(_, i), &a, &p| (service_of(i), i, a, p));

            let o = out.clone();
            effective.inspect(move |((s, n), _t, d)| accumulate(&mut o.borrow_mut().effective, (*s, *n), *d)).probe_with(&p);
            let o = out.clone();
            used_rows.inspect(move |((n, r, u), _t, d)| accumulate(&mut o.borrow_mut().used, (*n, *r, *u), *d)).probe_with(&p);
            let o = out.clone();
            endpoint.inspect(move |((s, i, a, port), _t, d)| accumulate(&mut o.borrow_mut().endpoint, (*s, *i, *a, *port), *d)).probe_with(&p);
            Inputs {
                intent: intent_in,
                cpu: cpu_in,
                memory: memory_in,
                readiness: readiness_in,
                node_cpu: node_cpu_in,
                node_memory: node_memory_in,
                node_address: node_address_in,
                alive: alive_in,
                heartbeat: heartbeat_in,
                ttl: ttl_in,
                clock: clock_in,
                placed: placed_in,
                running: running_in,
                ip: ip_in,
                port: port_in,
                healthy: healthy_in,
            }
        });
        Peer { inputs, probe, outputs, store: HashMap::new(), names: Vec::new(), ids: HashMap::new(), time: 0 }
    }

    fn id(&mut self, name: &str) -> Id {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as Id;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    /// `svc-12` → the instance id (service `svc`, ordinal 12).
    fn instance(&mut self, name: &str) -> Option<Inst> {
        let (service, ordinal) = name.rsplit_once('-')?;
        Some(inst(self.id(service), ordinal.parse().ok()?))
    }

    /// Enters `value` (+1) or withdraws it (-1) for `key`, if the peer reads
    /// the key; false if it does not.
    fn enter(&mut self, key: &str, value: &str, d: isize) -> bool {
        let parts: Vec<&str> = key.split('/').collect();
        let int = |v: &str| v.parse::<i64>().ok();
        let t = self.time;
        match parts.as_slice() {
            ["intent", _writer, "service", s, "instances"] => {
                let (Some(n), s) = (int(value), self.id(s)) else { return false };
                self.inputs.intent.update_at((s, n), t, d);
            }
            ["desired", "service", s, field @ ("cpu" | "memory")] => {
                let (Some(a), s) = (int(value), self.id(s)) else { return false };
                let input = if *field == "cpu" { &mut self.inputs.cpu } else { &mut self.inputs.memory };
                input.update_at((s, a), t, d);
            }
            ["desired", "probe", s, "readiness", "method"] => {
                let s = self.id(s);
                self.inputs.readiness.update_at(s, t, d);
            }
            ["observed", "node", n, field] => {
                let n = self.id(n);
                match *field {
                    "cpu" | "memory" | "ttl" | "heartbeat" => {
                        let Some(a) = int(value) else { return false };
                        let input = match *field {
                            "cpu" => &mut self.inputs.node_cpu,
                            "memory" => &mut self.inputs.node_memory,
                            "ttl" => &mut self.inputs.ttl,
                            _ => &mut self.inputs.heartbeat,
                        };
                        input.update_at((n, a), t, d);
                    }
                    "address" => {
                        let a = self.id(value);
                        self.inputs.node_address.update_at((n, a), t, d);
                    }
                    "alive" => self.inputs.alive.update_at(n, t, d),
                    _ => return false,
                }
            }
            ["observed", "node", n, "instance", i, field @ ("state" | "ip" | "port")] => {
                let n = self.id(n);
                let Some(i) = self.instance(i) else { return false };
                match *field {
                    "state" if value == "running" => self.inputs.running.update_at((n, i), t, d),
                    "state" => {}
                    "ip" => {
                        let a = self.id(value);
                        self.inputs.ip.update_at(((n, i), a), t, d);
                    }
                    _ => {
                        let Some(p) = int(value) else { return false };
                        self.inputs.port.update_at(((n, i), p), t, d);
                    }
                }
            }
            ["observed", "node", n, "probe_state", i, "readiness"] => {
                let n = self.id(n);
                let Some(i) = self.instance(i) else { return false };
                if value == "healthy" {
                    self.inputs.healthy.update_at((n, i), t, d);
                }
            }
            ["status", "clock"] => {
                let Some(c) = int(value) else { return false };
                self.inputs.clock.update_at(c, t, d);
            }
            ["placement", "instance", i] => {
                let n = self.id(value);
                let Some(i) = self.instance(i) else { return false };
                self.inputs.placed.update_at((i, n), t, d);
            }
            _ => return false,
        }
        true
    }

    /// One revision: the writes (None deletes), then the dataflow run until
    /// every output is settled for it.
    pub fn write(&mut self, worker: &mut Worker, writes: &[(String, Option<String>)]) {
        for (key, value) in writes {
            if let Some(old) = self.store.get(key).cloned() {
                if value.as_ref() == Some(&old) {
                    continue;
                }
                self.enter(key, &old, -1);
                self.store.remove(key);
            }
            if let Some(v) = value {
                if self.enter(key, v, 1) {
                    self.store.insert(key.clone(), v.clone());
                }
            }
        }
        self.time += 1;
        let t = self.time;
        let i = &mut self.inputs;
        macro_rules! advance {
            ($($input:ident),*) => { $( i.$input.advance_to(t); i.$input.flush(); )* };
        }
        advance!(intent, cpu, memory, readiness, node_cpu, node_memory, node_address, alive, heartbeat, ttl, clock, placed, running, ip, port, healthy);
        let probe = self.probe.clone();
        worker.step_while(|| probe.less_than(&t));
    }

    /// The keys the peer derives, as the engine writes them:
    /// `effective/service/S/instances` and `endpoint/service/S/I`.
    pub fn derived(&self) -> BTreeMap<String, String> {
        let o = self.outputs.borrow();
        let name = |id: Id| self.names[id as usize].as_str();
        let instance = |i: Inst| format!("{}-{}", name(service_of(i)), i & 0xffff_ffff);
        let mut out = BTreeMap::new();
        for (&(s, n), _) in o.effective.iter().filter(|(_, d)| **d > 0) {
            out.insert(format!("effective/service/{}/instances", name(s)), n.to_string());
        }
        for (&(s, i, a, p), _) in o.endpoint.iter().filter(|(_, d)| **d > 0) {
            out.insert(format!("endpoint/service/{}/{}", name(s), instance(i)), format!("{}:{p}", name(a)));
        }
        out
    }

    /// `used(n, r, u)` rows: (node, resource, amount).
    pub fn used(&self) -> BTreeMap<(String, String), i64> {
        let o = self.outputs.borrow();
        o.used
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(&(n, r, u), _)| ((self.names[n as usize].clone(), if r == CPU { "cpu" } else { "memory" }.to_string()), u))
            .collect()
    }

    /// The input facts it holds.
    pub fn facts(&self) -> usize {
        self.store.len()
    }
}
