//! The engine on a synthetic converged cluster (default 5,000 nodes, 1,000
//! services, 150,000 instances ≈ 1.4 M input facts) running the shipped rules.
//!
//! `cargo bench -p ccattler-engine --bench cluster [-- --nodes N --services N
//! --instances N --changes N --workers N --rules DIR --write-facts FILE]`
//!
//! `-- --unrelated 0,200,1000`: the cost of rules no change reaches — the
//! shipped rules plus N generated rules over an input no change writes, side
//! by side in one run (empty revision, intent change, clock tick).
//!
//! `-- --peer`: the engine side by side with a hand-written differential
//! dataflow of the controller's core (`peer/mod.rs`), on the same cluster
//! and the same changes, alternating; their outputs are checked equal.
//!
//! `-- --stream [--seconds 5]`: a second of the stream a live cluster makes
//! (`benches/sustained.rs`: every node beats every 10 s, usage every 30 s,
//! 25 readiness flips and 200 user changes a second) in one pass, as the
//! controller applies what its watch delivered at once: each kind alone, then
//! all together, a fresh second each time. `one user change`, a kind of
//! its own (not part of all together), is a single scale-up or -down.
//!
//! Reports cold load-and-evaluate time, per-change latency (p50/p99) for four
//! kinds of change, the from-scratch recomputation time and its ratio to an
//! incremental change, and peak RSS per fact.

mod peer;

use ccattler_engine::session::Write;
use ccattler_engine::synth::{self, Params};
use ccattler_engine::Session;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

struct Latency {
    first: Vec<Duration>,
    settled: Vec<Duration>,
}

fn measure(session: &mut Session, writes: &[Write], lat: &mut Latency) {
    let start = Instant::now();
    session.write(writes).expect("write");
    lat.settled.push(start.elapsed());
    lat.first.push(session.last_first_diff);
}

fn report(name: &str, lat: &mut Latency) -> Duration {
    lat.first.sort();
    lat.settled.sort();
    println!(
        "{name:<34} first diff p50 {:>10}  p99 {:>10} | settled p50 {:>10}  p99 {:>10}  (n={})",
        ms(pct(&lat.first, 0.5)),
        ms(pct(&lat.first, 0.99)),
        ms(pct(&lat.settled, 0.5)),
        ms(pct(&lat.settled, 0.99)),
        lat.first.len()
    );
    pct(&lat.first, 0.5)
}

/// The allocator the `ccattler` binary uses, so the numbers are its numbers,
/// counting the bytes allocated and not yet freed: the live heap, which RSS
/// overstates by what the allocator keeps after a load's transient peak.
#[global_allocator]
static ALLOCATOR: Counting = Counting;

struct Counting;

/// The count, in a slot per thread (up to 16; cache-line apart), so that
/// threads allocating at once do not contend for one counter.
#[repr(align(128))]
struct Slot(std::sync::atomic::AtomicIsize);
static LIVE: [Slot; 16] = [const { Slot(std::sync::atomic::AtomicIsize::new(0)) }; 16];
static NEXT_SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
thread_local! {
    static MY_SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

fn count(bytes: isize) {
    let slot = MY_SLOT
        .try_with(|s| {
            if s.get() == usize::MAX {
                s.set(NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % LIVE.len());
            }
            s.get()
        })
        .unwrap_or(0);
    LIVE[slot].0.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
}

// SAFETY: every call is mimalloc's; the counter only adds and subtracts.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as isize));
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Bytes allocated and not yet freed.
fn live_bytes() -> isize {
    LIVE.iter().map(|s| s.0.load(std::sync::atomic::Ordering::Relaxed)).sum()
}

fn main() {
    ccattler_engine::disable_huge_pages();
    let p = Params::from_args();
    let changes: usize = synth::arg("--changes").unwrap_or(100);
    let workers: usize = synth::arg("--workers").unwrap_or_else(ccattler_engine::default_workers);
    let rules: String = synth::arg("--rules").unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../rules").to_string());
    let checked = ccattler_parser::load(&[rules.clone().into()]).expect("rules load");
    assert_eq!(checked.errors(), 0, "{}", checked.render());
    let program = Arc::new(checked.program.expect("a checked program"));

    if let Some(list) = synth::arg::<String>("--unrelated") {
        let ns: Vec<usize> = list.split(',').map(|n| n.trim().parse().expect("--unrelated N,N,…")).collect();
        unrelated(&p, &rules, &ns, changes, workers);
        return;
    }
    if std::env::args().any(|a| a == "--stream") {
        stream(&p, program, workers, synth::arg("--seconds").unwrap_or(5));
        return;
    }
    if std::env::args().any(|a| a == "--peer") {
        versus_peer(p, program, changes, workers);
        return;
    }
    if std::env::args().any(|a| a == "--pending") {
        // Side by side in one run: the plain cluster, then the same with 10 %
        // of services spread by zone (max_skew 1) and 10 % of nodes tainted
        // (unless --spread-pct/--taint-pct say otherwise).
        let plain = placement(&Params { spread_pct: 0, taint_pct: 0, ..p }, program.clone(), workers);
        let c = p.constrained(synth::arg("--spread-pct").unwrap_or(10), synth::arg("--taint-pct").unwrap_or(10));
        let constrained = placement(&c, program, workers);
        println!("constrained / plain placement throughput: {:.2}", constrained / plain);
        return;
    }
    let t = Instant::now();
    let facts = synth::cluster(&p);
    let gen_time = t.elapsed();
    if let Some(path) = synth::arg::<String>("--write-facts") {
        let text: String = facts.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        std::fs::write(&path, text).expect("write facts file");
        println!("wrote {} facts to {path}", facts.len());
    }
    let writes: Vec<Write> = facts.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    drop(facts);
    println!("cluster: {p:?}, {} input facts (generated in {:.2} s), {workers} worker(s)", writes.len(), gen_time.as_secs_f64());
    let rss_before = rss_kib("VmRSS:");
    let live_before = live_bytes();

    // Cold start: every fact in one revision, then write-back to a fixed point.
    let t = Instant::now();
    let mut session = Session::new(program.clone(), workers).expect("engine");
    session.write(&writes).expect("cold load");
    let cold = t.elapsed();
    let derived = session.derived().len();
    let held = writes.len() + derived;
    println!(
        "cold load+evaluate: {:.2} s ({:.0} input facts/s), {} derived keys, {} write-back rounds, first diff after {:.2} s",
        cold.as_secs_f64(),
        writes.len() as f64 / cold.as_secs_f64(),
        derived,
        session.last_rounds,
        session.last_first_diff.as_secs_f64()
    );
    assert!(session.rejected().is_empty(), "rejected: {:?}", session.rejected().iter().next());
    assert_eq!(session.conflicts().count(), 0);
    let rss_loaded = rss_kib("VmRSS:");
    let live_loaded = live_bytes();

    // Per-change latency, each change undone right after so the cluster stays put.
    let svc = |i: usize| synth::service_name(i % p.services);
    let mut scale = Latency { first: vec![], settled: vec![] };
    let mut undo = Latency { first: vec![], settled: vec![] };
    for i in 0..changes {
        let s = svc(i * 7);
        let n = synth::instances_of(&p, i * 7 % p.services);
        let key = format!("intent/user/service/{s}/instances");
        measure(&mut session, &[(key.clone(), Some((n + 1).to_string()))], &mut scale);
        measure(&mut session, &[(key, Some(n.to_string()))], &mut undo);
    }
    let scale_p50 = report("service scaled up by one", &mut scale);
    report("service scaled down by one", &mut undo);

    let mut alive = Latency { first: vec![], settled: vec![] };
    let mut back = Latency { first: vec![], settled: vec![] };
    for i in 0..changes.min(50) {
        let key = format!("observed/node/{}/alive", synth::node_name(i * 13 % p.nodes));
        measure(&mut session, &[(key.clone(), None)], &mut alive);
        measure(&mut session, &[(key, Some("1".into()))], &mut back);
    }
    report("node lost its alive key", &mut alive);
    report("node alive again", &mut back);

    let mut new_node = Latency { first: vec![], settled: vec![] };
    for i in 0..changes {
        let facts: Vec<Write> = synth::node_facts(p.nodes + i, p.zones).into_iter().map(|(k, v)| (k, Some(v))).collect();
        measure(&mut session, &facts, &mut new_node);
    }
    report("new node (6 facts, one revision)", &mut new_node);

    let mut empty = Latency { first: vec![], settled: vec![] };
    for _ in 0..changes {
        measure(&mut session, &[], &mut empty);
    }
    report("empty revision (fixed overhead)", &mut empty);

    let mut intent = Latency { first: vec![], settled: vec![] };
    for i in 0..changes {
        let s = svc(i * 11);
        let n = synth::instances_of(&p, i * 11 % p.services);
        let key = format!("intent/autoscaler/service/{s}/instances");
        measure(&mut session, &[(key, Some((n / 2 + 1 + i % 2).to_string()))], &mut intent);
    }
    let intent_p50 = report("intent changed (below the max)", &mut intent);

    // The leader advances the cluster clock every second.
    let mut tick = Latency { first: vec![], settled: vec![] };
    for i in 0..changes {
        measure(&mut session, &[("status/clock".to_string(), Some((synth::SYNTH_CLOCK + 1 + i as i64).to_string()))], &mut tick);
    }
    report("cluster clock advanced (every second)", &mut tick);

    // A new image for a service: its rollout starts (one instance updated;
    // the next waits for its agent, which the bench does not simulate here).
    // Never the first service: `rollout` below rolls it from a complete state.
    let mut image = Latency { first: vec![], settled: vec![] };
    for i in 0..changes {
        let key = format!("desired/service/{}/image", synth::service_name(1 + (i * 7 + 2) % (p.services - 1).max(1)));
        measure(&mut session, &[(key, Some(format!("img-{i}")))], &mut image);
    }
    report("image changed (a rollout starts)", &mut image);

    rollout(&mut session, &p);
    drain(&mut session, &p);

    // From scratch: a fresh engine over the same facts.
    let t = Instant::now();
    let mut fresh = Session::new(program, workers).expect("engine");
    fresh.write(&writes).expect("recompute");
    let recompute = t.elapsed();
    drop(fresh);
    println!(
        "from-scratch recomputation: {:.2} s = {:.0}x an intent change (p50), {:.0}x a scale-up (p50)",
        recompute.as_secs_f64(),
        recompute.as_secs_f64() / intent_p50.as_secs_f64(),
        recompute.as_secs_f64() / scale_p50.as_secs_f64()
    );
    let peak = rss_kib("VmHWM:");
    println!(
        "memory: RSS {} MiB loaded ({} MiB before load); peak {} MiB over two engines; {:.0} bytes/fact held ({} facts: inputs + derived); live heap {:.0} bytes/fact",
        rss_loaded / 1024,
        rss_before / 1024,
        peak / 1024,
        (rss_loaded - rss_before) as f64 * 1024.0 / held as f64,
        held,
        (live_loaded - live_before) as f64 / held as f64
    );
}

/// Offline placement throughput: every instance pending at once, run to a
/// complete placement; then one node dies and its instances are re-placed.
/// Validates that no node is over its cpu or memory, no hard spread over its
/// skew and no instance on a taint it does not tolerate. Returns placements/s.
fn placement(p: &Params, program: Arc<ccattler_parser::Program>, workers: usize) -> f64 {
    let facts = synth::unplaced(p);
    let writes: Vec<Write> = facts.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    println!("placement: {p:?}, {} facts, every instance pending", writes.len());
    let t = Instant::now();
    let mut session = Session::new(program, workers).expect("engine");
    session.write(&writes).expect("place");
    let took = t.elapsed();
    let placed = validate(&session, p);
    let rate = placed as f64 / took.as_secs_f64();
    println!(
        "placed {placed} of {} instances in {:.2} s = {rate:.0} placements/s ({} write-back rounds)",
        p.instances,
        took.as_secs_f64(),
        session.last_rounds
    );
    // One node dies: its instances go elsewhere.
    let victim = synth::node_name(0);
    let on_victim =
        session.derived().range(format!("placement/node/{victim}/")..).take_while(|(k, _)| k.starts_with(&format!("placement/node/{victim}/"))).count();
    let t = Instant::now();
    session.write(&[(format!("observed/node/{victim}/alive"), None)]).expect("node death");
    let took = t.elapsed();
    let placed = validate(&session, p);
    println!("node with {on_victim} instances died: re-placed in {:.2} s; {placed} placed; no node over capacity", took.as_secs_f64());
    rate
}

/// Counts placements and checks every node's cpu and memory against what is placed on it.
fn validate(session: &Session, p: &Params) -> usize {
    let derived = session.derived();
    let mut used: std::collections::HashMap<&str, (i64, i64)> = std::collections::HashMap::new();
    let mut placed = 0;
    for (k, node) in derived.range("placement/instance/".to_string()..).take_while(|(k, _)| k.starts_with("placement/instance/")) {
        let inst = &k["placement/instance/".len()..];
        let svc = &inst[..inst.rfind('-').expect("instance ids are S-i")];
        let cpu: i64 = derived[&format!("effective/service/{svc}/cpu")].parse().unwrap();
        let mem: i64 = derived[&format!("effective/service/{svc}/memory")].parse().unwrap();
        let u = used.entry(node.as_str()).or_default();
        u.0 += cpu;
        u.1 += mem;
        placed += 1;
    }
    for (node, (c, m)) in &used {
        assert!(*c <= synth::NODE_CPU && *m <= synth::NODE_MEMORY, "{node} overcommitted: {c} m, {m} MiB");
    }
    assert!(placed <= p.instances);
    // Taints: an instance on a tainted node belongs to a tolerating service;
    // a hard spread's zones are within one of each other (every zone has
    // ready, untainted nodes here, so every zone is eligible).
    let mut per_zone: std::collections::HashMap<usize, Vec<i64>> = std::collections::HashMap::new();
    for (k, node) in derived.range("placement/instance/".to_string()..).take_while(|(k, _)| k.starts_with("placement/instance/")) {
        let inst = &k["placement/instance/".len()..];
        let s: usize = inst[4..inst.rfind('-').unwrap()].parse().unwrap();
        let n: usize = node["node-".len()..].parse().unwrap();
        assert!(!p.is_tainted(n) || p.tolerates(s), "{inst} on tainted {node}");
        if p.is_spread(s) {
            per_zone.entry(s).or_insert_with(|| vec![0; p.zones])[n % p.zones] += 1;
        }
    }
    for (s, zones) in per_zone {
        let (lo, hi) = (zones.iter().min().unwrap(), zones.iter().max().unwrap());
        assert!(hi - lo <= 1, "svc-{s} over its skew: {zones:?}");
    }
    placed
}

/// The agents, instantly: every instance of `instances` runs the version
/// pinned for it on the node it is placed on, ready; reports on a node it
/// left are gone. `reported` is what they said last (instance → node, version).
fn agents_catch_up(session: &Session, instances: &[String], reported: &mut std::collections::HashMap<String, (String, String)>) -> Vec<Write> {
    let mut w = Vec::new();
    for inst in instances {
        let derived = session.derived();
        let (Some(node), Some(version)) = (derived.get(&format!("placement/instance/{inst}")), derived.get(&format!("effective/instance/{inst}/version")))
        else {
            continue;
        };
        let now = (node.to_string(), version.to_string());
        if reported.get(inst) == Some(&now) {
            continue;
        }
        if let Some((old, _)) = reported.get(inst).filter(|(old, _)| old != node) {
            for f in ["service", "state", "health", "image", "ip", "port", "version"] {
                w.push((format!("observed/node/{old}/instance/{inst}/{f}"), None));
            }
            w.push((format!("observed/node/{old}/probe_state/{inst}/readiness"), None));
        }
        let o = |f: &str| format!("observed/node/{node}/instance/{inst}/{f}");
        w.push((o("state"), Some("running".into())));
        w.push((o("health"), Some("healthy".into())));
        // The agent reports its node's address for what it runs there.
        let address = node.strip_prefix("node-").and_then(|n| n.parse().ok()).map(synth::node_address);
        w.push((o("ip"), address));
        w.push((o("port"), Some("20000".into())));
        w.push((o("version"), Some(version.to_string())));
        w.push((format!("observed/node/{node}/probe_state/{inst}/readiness"), Some("healthy".into())));
        reported.insert(inst.clone(), now);
    }
    w
}

/// A rolling update of a 1,000-instance service, one instance at a time
/// (max_unavailable 1), its agents ready at once: time per step and keys
/// written back per step.
fn rollout(session: &mut Session, p: &Params) {
    let s = synth::service_name(0);
    let n = 1000;
    let instances: Vec<String> = (0..n).map(|i| format!("{s}-{i}")).collect();
    let mut reported = std::collections::HashMap::new();
    session.write(&[(format!("intent/user/service/{s}/instances"), Some(n.to_string()))]).expect("scale");
    // The synthetic cluster's instances already report version 1 where they are.
    for i in 0..synth::instances_of(p, 0) {
        if let Some(node) = session.derived().get(&format!("placement/instance/{s}-{i}")) {
            reported.insert(format!("{s}-{i}"), (node.to_string(), "1".to_string()));
        }
    }
    let w = agents_catch_up(session, &instances, &mut reported);
    session.write(&w).expect("reports");
    let state = |s2: &Session| s2.derived().get(&format!("status/rollout/{s}/state")).cloned().unwrap_or_default();
    assert_eq!(state(session), "complete", "before the rollout");
    let t = Instant::now();
    let mut steps: Vec<(Duration, usize)> = Vec::new();
    session.write(&[(format!("desired/service/{s}/image"), Some("builtin:http#v2".into()))]).expect("new image");
    steps.push((t.elapsed(), session.last_writes));
    while state(session) != "complete" {
        let w = agents_catch_up(session, &instances, &mut reported);
        assert!(!w.is_empty() && steps.len() <= 2 * n, "the rollout is stuck: {}", state(session));
        let t = Instant::now();
        session.write(&w).expect("step");
        steps.push((t.elapsed(), session.last_writes));
    }
    let total: Duration = steps.iter().map(|(d, _)| *d).sum();
    let mut times: Vec<Duration> = steps.iter().map(|(d, _)| *d).collect();
    times.sort();
    let mut keys: Vec<usize> = steps.iter().map(|(_, k)| *k).collect();
    keys.sort();
    let pct = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q) as usize];
    println!(
        "rollout of a new image to {n} instances (max_unavailable 1, instant readiness): {} steps, engine time {:.2} s; per step p50 {:.2} ms, p99 {:.2} ms; keys written back per step p50 {}, max {}",
        steps.len(),
        total.as_secs_f64(),
        pct(&times, 0.5).as_secs_f64() * 1e3,
        pct(&times, 0.99).as_secs_f64() * 1e3,
        keys[keys.len() / 2],
        keys[keys.len() - 1]
    );
}

/// Draining a node with its instances ready elsewhere at once: engine time
/// until the node is `drained`.
fn drain(session: &mut Session, p: &Params) {
    let node = synth::node_name(7 % p.nodes);
    let prefix = format!("placement/node/{node}/");
    let on: Vec<String> =
        session.derived().range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix)).map(|(k, _)| k[prefix.len()..].to_string()).collect();
    // Earlier changes moved some instances of these services without their
    // agents reporting them: first every instance of them serves where it is.
    let services: std::collections::BTreeSet<String> = on.iter().map(|i| i[..i.rfind('-').expect("S-i")].to_string()).collect();
    let all: Vec<String> = services
        .iter()
        .flat_map(|s| {
            (0..)
                .map(move |i| format!("{s}-{i}"))
                .take_while(|i| session.derived().contains_key(&format!("effective/instance/{i}/service")))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut reported = std::collections::HashMap::new();
    let w = agents_catch_up(session, &all, &mut reported);
    session.write(&w).expect("reports");
    let t = Instant::now();
    let mut steps = 0;
    let mut w = vec![(format!("desired/node/{node}/drain"), Some("true".to_string()))];
    let state = |s: &Session| s.derived().get(&format!("effective/node/{node}/state")).cloned().unwrap_or_default();
    let mut engine = Duration::ZERO;
    loop {
        let t = Instant::now();
        session.write(&w).expect("drain step");
        engine += t.elapsed();
        steps += 1;
        if state(session) == "drained" {
            break;
        }
        w = agents_catch_up(session, &all, &mut reported);
        if w.is_empty() || steps >= 1000 {
            let why: Vec<_> = session.derived().range(format!("status/drain/{node}/")..).take_while(|(k, _)| k.starts_with("status/drain/")).collect();
            panic!("the drain is stuck: {}: {why:?}", state(session));
        }
    }
    println!(
        "drain of {node} with {} instances (instant readiness): drained after {steps} steps, engine time {:.2} s ({:.2} s with the bench's own bookkeeping)",
        on.len(),
        engine.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

/// `n` generated rules over `unrelated_in`, an input no change writes: a
/// chain of relations, each joining the input again under a filter of its own.
fn unrelated_rules(n: usize) -> String {
    let mut out = String::from("/// An input no change in the bench writes.\ninput unrelated_in(a: name, v: int) from \"desired/unrelated/{a}\"\n");
    for i in 0..n {
        out += &format!("/// Generated rule {i}.\nrelation u{i}(a: name, v: int)\n");
        if i == 0 {
            out += "u0(a, v) :- unrelated_in(a, v), v > 0.\n";
        } else {
            out += &format!("u{i}(a, v) :- u{}(a, v), unrelated_in(a, w), w > {i}.\n", i - 1);
        }
    }
    if n > 0 {
        out += &format!("/// The chain's end, so nothing is unused.\noutput unrelated_out(a: name, v: int) to \"effective/unrelated/{{a}}\"\nunrelated_out(a, v) :- u{}(a, v).\n", n - 1);
    }
    out
}

/// The shipped rules with 0, 200, 1,000… unrelated rules beside them: what a
/// revision costs, side by side (the cost should follow the change).
fn unrelated(p: &Params, rules: &str, ns: &[usize], changes: usize, workers: usize) {
    let facts = synth::cluster(p);
    let writes: Vec<Write> = facts.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    println!("cluster: {p:?}, {} input facts, {workers} worker(s)", writes.len());
    let mut rows = Vec::new();
    for &n in ns {
        let dir = std::env::temp_dir().join(format!("ccattler-unrelated-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("unrelated.rules"), unrelated_rules(n)).unwrap();
        let mut paths: Vec<std::path::PathBuf> = vec![rules.into()];
        if n > 0 {
            paths.push(dir.clone());
        }
        let checked = ccattler_parser::load(&paths).expect("rules load");
        assert_eq!(checked.errors(), 0, "{}", checked.render());
        let program = Arc::new(checked.program.expect("a checked program"));
        let (nrules, nstrata) = (program.rules.len(), program.strata.len());
        let mut session = Session::new(program, workers).expect("engine");
        session.write(&writes).expect("cold load");
        let mut empty = Latency { first: vec![], settled: vec![] };
        let mut intent = Latency { first: vec![], settled: vec![] };
        let mut tick = Latency { first: vec![], settled: vec![] };
        for i in 0..changes {
            measure(&mut session, &[], &mut empty);
            let s = synth::service_name(i * 11 % p.services);
            let k = synth::instances_of(p, i * 11 % p.services);
            measure(&mut session, &[(format!("intent/autoscaler/service/{s}/instances"), Some((k / 2 + 1 + i % 2).to_string()))], &mut intent);
            measure(&mut session, &[("status/clock".to_string(), Some((synth::SYNTH_CLOCK + 1 + i as i64).to_string()))], &mut tick);
        }
        println!("--- shipped rules + {n} unrelated ({nrules} rules, {nstrata} strata)");
        let e = report("empty revision", &mut empty);
        let i = report("intent changed (below the max)", &mut intent);
        let t = report("cluster clock advanced", &mut tick);
        rows.push((n, e, i, t));
        drop(session);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (_, e0, i0, t0) = rows[0];
    for (n, e, i, t) in &rows[1..] {
        println!(
            "+{n} unrelated rules: empty revision {:.2}x, intent change {:.2}x, clock tick {:.2}x (first diff p50, against +{})",
            e.as_secs_f64() / e0.as_secs_f64(),
            i.as_secs_f64() / i0.as_secs_f64(),
            t.as_secs_f64() / t0.as_secs_f64(),
            rows[0].0
        );
    }
}

/// The placement keys the engine holds (what its write-back put in etcd).
fn placements(session: &Session) -> BTreeMap<String, String> {
    session
        .derived()
        .range::<str, _>((std::ops::Bound::Included("placement/instance/"), std::ops::Bound::Excluded("placement/instance0")))
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

/// What changed between two placement maps, as writes.
fn moved(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<Write> {
    let mut w: Vec<Write> = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    w.extend(before.keys().filter(|k| !after.contains_key(*k)).map(|k| (k.clone(), None)));
    w
}

/// The peer's outputs against the engine's: equal, or the bench stops.
fn check(session: &Session, peer: &peer::Peer, program: &ccattler_parser::Program, when: &str) -> usize {
    let ours = peer.derived();
    let theirs: BTreeMap<String, String> = session
        .derived()
        .iter()
        .filter(|(k, _)| (k.starts_with("effective/service/") && k.ends_with("/instances")) || k.starts_with("endpoint/service/"))
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    if ours != theirs {
        let only_peer: Vec<_> = ours.iter().filter(|(k, v)| theirs.get(*k) != Some(*v)).take(5).collect();
        let only_engine: Vec<_> = theirs.iter().filter(|(k, v)| ours.get(*k) != Some(*v)).take(5).collect();
        panic!("{when}: the peer's keys differ from the engine's ({} vs {}); peer only {only_peer:?}; engine only {only_engine:?}", ours.len(), theirs.len());
    }
    let used = program.relation("used").expect("the shipped rules define used");
    let engine_used: BTreeMap<(String, String), i64> = session
        .engine()
        .query(used)
        .expect("query used")
        .into_iter()
        .map(|row| ((row[0].text().into_owned(), row[1].text().into_owned()), row[2].as_int().expect("an amount")))
        .filter(|((_, r), _)| r == "cpu" || r == "memory")
        .collect();
    let peer_used = peer.used();
    if peer_used != engine_used {
        let diff: Vec<_> = peer_used.iter().filter(|(k, v)| engine_used.get(*k) != Some(*v)).take(5).collect();
        panic!("{when}: the peer's usage differs from the engine's ({} vs {} rows): {diff:?}", peer_used.len(), engine_used.len());
    }
    ours.len() + peer_used.len()
}

/// The engine and the hand-written peer on the same cluster and the same
/// changes, one after the other for each change; ratios of medians.
fn versus_peer(p: Params, program: Arc<ccattler_parser::Program>, changes: usize, workers: usize) {
    timely::execute_directly(move |worker| {
        let facts = synth::cluster(&p);
        let writes: Vec<Write> = facts.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
        println!("cluster: {p:?}, {} input facts; engine with {workers} worker(s), the peer with 1", writes.len());

        let (rss, live) = (rss_kib("VmRSS:"), live_bytes());
        let t = Instant::now();
        let mut peer = peer::Peer::new(worker);
        peer.write(worker, &writes);
        let peer_cold = t.elapsed();
        let peer_kib = rss_kib("VmRSS:") - rss;
        let peer_live = live_bytes() - live;

        let (rss, live) = (rss_kib("VmRSS:"), live_bytes());
        let t = Instant::now();
        let mut session = Session::new(program.clone(), workers).expect("engine");
        let engine_built = live_bytes() - live;
        session.write(&writes).expect("cold load");
        let engine_cold = t.elapsed();
        let engine_kib = rss_kib("VmRSS:") - rss;
        let engine_live = live_bytes() - live;
        // (Dropped only now: memory freed before a load would be reused by
        // it and hide part of its growth.)
        drop(facts);
        let engine_held = writes.len() + session.derived().len();
        // The engine placed nothing new (a converged cluster): the same
        // placements as the facts, so the peer needs none fed.
        let mut placed = placements(&session);
        let checked = check(&session, &peer, &program, "after the cold load");
        let peer_held = peer.facts() + checked;
        println!("outputs checked equal after the cold load: {checked} keys and usage rows");
        println!(
            "cold load+evaluate: engine {:.2} s, peer {:.2} s ({:.1}x)",
            engine_cold.as_secs_f64(),
            peer_cold.as_secs_f64(),
            engine_cold.as_secs_f64() / peer_cold.as_secs_f64()
        );
        let (engine_bpf, peer_bpf) = (engine_kib as f64 * 1024.0 / engine_held as f64, peer_kib as f64 * 1024.0 / peer_held as f64);
        println!(
            "memory: engine {} MiB for {engine_held} facts ({engine_bpf:.0} bytes/fact); peer {} MiB for {peer_held} ({peer_bpf:.0} bytes/fact); {:.1}x",
            engine_kib / 1024,
            peer_kib / 1024,
            engine_bpf / peer_bpf
        );
        let (engine_live_bpf, peer_live_bpf) = (engine_live as f64 / engine_held as f64, peer_live as f64 / peer_held as f64);
        println!(
            "live heap: engine {} MiB ({} MiB of it before any fact; {engine_live_bpf:.0} bytes/fact); peer {} MiB ({peer_live_bpf:.0} bytes/fact); {:.1}x",
            engine_live >> 20,
            engine_built >> 20,
            peer_live >> 20,
            engine_live_bpf / peer_live_bpf
        );

        let mut rows: Vec<(&str, Vec<Duration>, Vec<Duration>)> = Vec::new();
        let timed = |session: &mut Session, peer: &mut peer::Peer, worker: &mut timely::worker::Worker, w: &[Write]| {
            let t = Instant::now();
            session.write(w).expect("engine write");
            let e = t.elapsed();
            let t = Instant::now();
            peer.write(worker, w);
            (e, t.elapsed())
        };
        let svc = |i: usize| synth::service_name(i % p.services);
        let mut run = |name: &'static str, ws: Vec<Vec<Write>>, session: &mut Session, peer: &mut peer::Peer, worker: &mut timely::worker::Worker| {
            let (mut e, mut q) = (Vec::new(), Vec::new());
            for w in ws {
                let (a, b) = timed(session, peer, worker, &w);
                e.push(a);
                q.push(b);
            }
            rows.push((name, e, q));
        };
        run("empty revision", (0..changes).map(|_| vec![]).collect(), &mut session, &mut peer, worker);
        let intents = (0..changes)
            .map(|i| {
                let n = synth::instances_of(&p, i * 11 % p.services);
                vec![(format!("intent/autoscaler/service/{}/instances", svc(i * 11)), Some((n / 2 + 1 + i % 2).to_string()))]
            })
            .collect();
        run("intent changed (below the max)", intents, &mut session, &mut peer, worker);
        let ticks = (0..changes).map(|i| vec![("status/clock".to_string(), Some((synth::SYNTH_CLOCK + 1 + i as i64).to_string()))]).collect();
        run("cluster clock advanced", ticks, &mut session, &mut peer, worker);
        // Node death and return: the engine re-places the node's instances
        // (settled: its write-back too); the peer is fed where the engine
        // put them, outside the timing, as etcd would deliver them.
        let (mut death, mut back) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for i in 0..changes.min(30) {
            let key = format!("observed/node/{}/alive", synth::node_name(i * 13 % p.nodes));
            let (e, q) = timed(&mut session, &mut peer, worker, &[(key.clone(), None)]);
            death.0.push(e);
            death.1.push(q);
            let now = placements(&session);
            peer.write(worker, &moved(&placed, &now));
            placed = now;
            let (e, q) = timed(&mut session, &mut peer, worker, &[(key, Some(format!("{}", 7_000_000 + i * 13 % p.nodes)))]);
            back.0.push(e);
            back.1.push(q);
            let now = placements(&session);
            peer.write(worker, &moved(&placed, &now));
            placed = now;
        }
        rows.push(("node died (engine: re-placed)", death.0, death.1));
        rows.push(("node alive again", back.0, back.1));
        // Scale-up, settled: the engine places the new instance; the peer
        // only creates it (it does not place).
        let mut up = (Vec::new(), Vec::new());
        for i in 0..changes {
            let n = synth::instances_of(&p, i * 7 % p.services);
            let key = format!("intent/user/service/{}/instances", svc(i * 7));
            let (e, q) = timed(&mut session, &mut peer, worker, &[(key.clone(), Some((n + 1).to_string()))]);
            up.0.push(e);
            up.1.push(q);
            let now = placements(&session);
            peer.write(worker, &moved(&placed, &now));
            placed = now;
            session.write(&[(key.clone(), Some(n.to_string()))]).expect("undo");
            peer.write(worker, &[(key, Some(n.to_string()))]);
            let now = placements(&session);
            peer.write(worker, &moved(&placed, &now));
            placed = now;
        }
        rows.push(("service scaled up by one (engine: placed)", up.0, up.1));
        let checked = check(&session, &peer, &program, "after the changes");
        println!("outputs checked equal after the changes: {checked} keys and usage rows");

        println!("{:<42} {:>12} {:>12} {:>8}", "p50 (settled)", "engine", "peer", "ratio");
        let mut medians = BTreeMap::new();
        for (name, mut e, mut q) in rows {
            e.sort();
            q.sort();
            let (a, b) = (pct(&e, 0.5), pct(&q, 0.5));
            println!("{name:<42} {:>12} {:>12} {:>7.0}x", ms(a), ms(b), a.as_secs_f64() / b.as_secs_f64());
            medians.insert(name, (a, b));
        }
        let intent_peer = medians["intent changed (below the max)"].1;
        let node_peer = medians["node died (engine: re-placed)"].1;
        println!("targets (issue #23): empty revision / peer's intent change {:.0}x (≤ 10x); intent change {:.0}x (≤ 20x); node death {:.0}x and scale-up {:.0}x the peer's node death (≤ 20x); clock tick / empty revision {:.1}x (≤ 2x)",
            medians["empty revision"].0.as_secs_f64() / intent_peer.as_secs_f64(),
            medians["intent changed (below the max)"].0.as_secs_f64() / intent_peer.as_secs_f64(),
            medians["node died (engine: re-placed)"].0.as_secs_f64() / node_peer.as_secs_f64(),
            medians["service scaled up by one (engine: placed)"].0.as_secs_f64() / node_peer.as_secs_f64(),
            medians["cluster clock advanced"].0.as_secs_f64() / medians["empty revision"].0.as_secs_f64(),
        );
    });
}

/// A second of the sustained stream, by kind, one engine pass each (see the
/// module comment): where a loaded controller's time goes.
fn stream(p: &Params, program: Arc<ccattler_parser::Program>, workers: usize, seconds: usize) {
    assert!(seconds > 0, "--seconds {seconds}: at least one second of each kind");
    // A careless --kinds fails before the cold load, not after.
    let kinds = stream_kinds(synth::arg::<String>("--kinds").as_deref());
    let facts = synth::cluster(p);
    let mut agents = synth::Agents::new(synth::layout(p.nodes, &facts), 0x9e37_79b9_7f4a_7c15);
    let writes: Vec<Write> = facts.into_iter().map(|(k, v)| (k, Some(v))).collect();
    println!("cluster: {p:?}, {} input facts, {workers} worker(s)", writes.len());
    let t = Instant::now();
    let mut session = Session::new(program, workers).expect("engine");
    session.write(&writes).expect("cold load");
    println!("cold load+evaluate: {:.2} s", t.elapsed().as_secs_f64());
    drop(writes);
    ccattler_engine::arrangements::profile_from_now();
    let mut clock = synth::SYNTH_CLOCK;
    let (mut up, mut user) = (vec![false; p.services], 0usize);
    // One second's writes of one kind, as the sustained bench paces them.
    let mut second = |kind: &str, clock: i64| -> Vec<Write> {
        let put = |(k, v): (String, String)| (k, Some(v));
        match kind {
            "heartbeats" => (0..p.nodes / 10).map(|_| put(agents.beat(clock))).collect(),
            "usage" => (0..p.nodes / 30).filter_map(|_| agents.usage().map(put)).collect(),
            "readiness flips" => (0..25).flat_map(|_| agents.flip().map(put)).collect(),
            _ => (0..if kind == "one user change" { 1 } else { 200 })
                .map(|_| {
                    user = (user + 1) % p.services;
                    up[user] = !up[user];
                    let want = synth::instances_of(p, user) + usize::from(up[user]);
                    (format!("intent/user/service/{}/instances", synth::service_name(user)), Some(want.to_string()))
                })
                .collect(),
        }
    };
    println!("{:<26} {:>8} {:>12} {:>12} {:>14} {:>8}", "one second of", "writes", "pass p50", "pass max", "per write p50", "rounds");
    for kind in kinds {
        let (mut times, mut rounds) = (Vec::new(), Vec::new());
        let mut n = 0;
        for _ in 0..seconds {
            clock += 1;
            let mut w: Vec<Write> = vec![("status/clock".to_string(), Some(clock.to_string()))];
            let parts: &[&str] = match kind {
                "clock tick" => &[],
                "all together" => &["heartbeats", "usage", "readiness flips", "user changes"],
                one => &[one][..],
            };
            for part in parts {
                w.extend(second(part, clock));
            }
            n = w.len();
            let t = Instant::now();
            session.write(&w).expect("a second of the stream");
            times.push(t.elapsed());
            rounds.push(session.last_rounds);
        }
        times.sort();
        rounds.sort();
        println!(
            "{kind:<26} {n:>8} {:>12} {:>12} {:>14} {:>8}",
            ms(pct(&times, 0.5)),
            ms(*times.last().unwrap()),
            format!("{:.1} µs", pct(&times, 0.5).as_secs_f64() * 1e6 / n as f64),
            rounds[rounds.len() / 2]
        );
    }
}

/// The kinds `--kinds a,b` names (all when none is given); an unknown one
/// stops the bench naming the kinds there are.
fn stream_kinds(only: Option<&str>) -> Vec<&'static str> {
    const KINDS: [&str; 7] = ["clock tick", "heartbeats", "usage", "readiness flips", "user changes", "one user change", "all together"];
    let Some(only) = only else { return KINDS.to_vec() };
    for asked in only.split(',') {
        assert!(KINDS.contains(&asked), "--kinds: no kind {asked:?} (there are {})", KINDS.join(", "));
    }
    KINDS.into_iter().filter(|k| only.split(',').any(|o| o == *k)).collect()
}
