//! The engine against a from-scratch oracle: random stratified programs, random
//! facts, random insert/delete batches (some entered partly staged). After every batch, every relation the
//! engine holds must equal the oracle's full evaluation.
//!
//! Replay a failure: `ORACLE_SEED=<seed> [ORACLE_WORKERS=2] [ORACLE_PROCESSES=2] cargo test -p ccattler-engine --test oracle`.
//! More cases: `ORACLE_CASES=2000`.

mod common;
use ccattler_engine::{Cluster, Engine, EngineError, Row, Value};
use ccattler_parser::ast::DeclKind;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// An engine on `workers` threads, or (with `processes` above 1) a timely
/// cluster of that many over loopback TCP, each with `workers` threads: the
/// first runs the engine, the others serve it from threads of this test.
struct Running {
    engine: Option<Engine>,
    others: Vec<std::thread::JoinHandle<Result<(), EngineError>>>,
}

fn start(program: &Arc<ccattler_parser::Program>, workers: usize, processes: usize) -> Result<Running, String> {
    if processes <= 1 {
        return Ok(Running { engine: Some(Engine::start(program.clone(), workers).map_err(|e| e.to_string())?), others: Vec::new() });
    }
    let addresses = Cluster::loopback(processes).map_err(|e| e.to_string())?;
    let others = (1..processes)
        .map(|process| {
            let (program, cluster) = (program.clone(), Cluster { workers, process, addresses: addresses.clone() });
            std::thread::spawn(move || ccattler_engine::serve(program, &cluster))
        })
        .collect();
    let engine = Engine::start_cluster(program.clone(), &Cluster { workers, process: 0, addresses }).map_err(|e| e.to_string())?;
    Ok(Running { engine: Some(engine), others })
}

impl Running {
    fn engine(&mut self) -> &mut Engine {
        self.engine.as_mut().expect("running")
    }

    /// Stops the engine; the processes serving it must stop cleanly too.
    fn stop(mut self) -> Result<(), String> {
        drop(self.engine.take());
        for other in self.others.drain(..) {
            other.join().map_err(|_| "a serving process panicked".to_string())?.map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Runs one case; returns a description of the first difference.
fn run_case(seed: u64, workers: usize) -> Result<(), String> {
    run_case_on(seed, workers, 1)
}

fn run_case_on(seed: u64, workers: usize, processes: usize) -> Result<(), String> {
    let mut rng = Rng(seed.max(1));
    let src = random_program(&mut rng);
    let checked = ccattler_parser::check_str("random.rules", &src);
    let Some(program) = checked.program else {
        return Err(format!("generated program does not check:\n{src}\n{}", checked.render()));
    };
    let program = Arc::new(program);
    let mut running = start(&program, workers, processes)?;
    let engine = running.engine();
    let mut inputs: Db = BTreeMap::new();
    // Output diffs as released by `apply`, accumulated: (relation, [rule, row…]) → count
    // (a count above one: several bindings of one rule derive the row).
    let mut released: BTreeMap<(usize, Row), isize> = BTreeMap::new();
    let batches = 1 + rng.below(5);
    for batch in 0..batches {
        let mut changes: Vec<(usize, Row, isize)> = Vec::new();
        for _ in 0..rng.below(12) + 1 {
            let rel = rng.below(INPUTS.len());
            let row: Row = smallvec::smallvec![Value::Int(rng.below(DOMAIN) as i64), Value::Int(rng.below(DOMAIN) as i64)];
            if changes.iter().any(|(r, x, _)| *r == rel && *x == row) {
                continue;
            }
            // Inputs are sets: insert absent tuples, delete present ones.
            let set = inputs.entry(rel).or_default();
            if set.remove(&row) {
                changes.push((rel, row, -1));
            } else {
                set.insert(row.clone());
                changes.push((rel, row, 1));
            }
        }
        // Some batches enter partly staged first, as a snapshot loads page by page.
        let rev = batch as u64 + 1;
        for _ in 0..rng.below(3) {
            let part: Vec<_> = changes.drain(..rng.below(changes.len() + 1)).collect();
            engine.stage(rev, part).map_err(|e| e.to_string())?;
        }
        for (rel, tagged, d) in engine.apply(rev, changes).map_err(|e| e.to_string())? {
            *released.entry((rel, tagged)).or_default() += d;
        }
        released.retain(|_, d| *d != 0);
        let expected = oracle(&program, &inputs);
        if let Some(((rel, row), d)) = released.iter().find(|(_, d)| **d < 0) {
            return Err(format!("released output {row:?} of relation {rel} has count {d}\nprogram:\n{src}"));
        }
        for (rel, r) in program.relations.iter().enumerate() {
            if r.kind == DeclKind::Input {
                continue;
            }
            let got: BTreeSet<Row> = engine.query(rel).map_err(|e| e.to_string())?.into_iter().collect();
            let want = expected.get(&rel).cloned().unwrap_or_default();
            if r.kind == DeclKind::Output {
                let from_diffs: BTreeSet<Row> = released.keys().filter(|(x, _)| *x == rel).map(|(_, t)| Row::from(&t[1..])).collect();
                if from_diffs != want {
                    return Err(format!(
                        "batch {batch}, released diffs of {}:\n  diffs only: {:?}\n  oracle only: {:?}\nprogram:\n{src}",
                        r.name,
                        from_diffs.difference(&want).collect::<Vec<_>>(),
                        want.difference(&from_diffs).collect::<Vec<_>>()
                    ));
                }
            }
            if got != want {
                return Err(format!(
                    "batch {batch}, relation {}:\n  engine only: {:?}\n  oracle only: {:?}\nprogram:\n{src}\ninputs: {inputs:?}",
                    r.name,
                    got.difference(&want).collect::<Vec<_>>(),
                    want.difference(&got).collect::<Vec<_>>()
                ));
            }
        }
    }
    running.stop()
}

#[test]
fn engine_matches_oracle_on_random_programs() {
    if let Ok(seed) = std::env::var("ORACLE_SEED") {
        let seed: u64 = seed.parse().expect("ORACLE_SEED is a number");
        let workers = std::env::var("ORACLE_WORKERS").ok().and_then(|w| w.parse().ok()).unwrap_or(1);
        let processes = std::env::var("ORACLE_PROCESSES").ok().and_then(|w| w.parse().ok()).unwrap_or(1);
        run_case_on(seed, workers, processes).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        return;
    }
    let cases: u64 = std::env::var("ORACLE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    for i in 0..cases {
        let seed = 0x5eed_0000 + i;
        // Every fourth case runs on two workers: results must not depend on it.
        let workers = if i % 4 == 3 { 2 } else { 1 };
        if let Err(e) = run_case(seed, workers) {
            panic!("case failed; replay with ORACLE_SEED={seed} (workers {workers}):\n{e}");
        }
    }
}

/// The same cases on a timely cluster of two processes over loopback TCP
/// (one and two workers each): every row crosses a real connection, and
/// the results must not depend on it.
#[test]
fn engine_on_two_processes_matches_oracle() {
    let cases: u64 = std::env::var("ORACLE_CLUSTER_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for i in 0..cases {
        let seed = 0x5eed_0000 + i;
        let workers = if i % 2 == 1 { 2 } else { 1 };
        if let Err(e) = run_case_on(seed, workers, 2) {
            panic!("case failed; replay with ORACLE_SEED={seed} ORACLE_PROCESSES=2 ORACLE_WORKERS={workers}:\n{e}");
        }
    }
}

#[test]
fn one_and_two_workers_give_identical_outputs() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed * 7919);
        let src = random_program(&mut rng);
        let program = Arc::new(ccattler_parser::check_str("r.rules", &src).program.expect("checks"));
        let changes: Vec<(usize, Row, isize)> = (0..30)
            .map(|_| (rng.below(3), smallvec::smallvec![Value::Int(rng.below(5) as i64), Value::Int(rng.below(5) as i64)], 1))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut outs = Vec::new();
        for workers in [1, 2] {
            let mut e = Engine::start(program.clone(), workers).unwrap();
            outs.push(e.apply(1, changes.clone()).unwrap());
        }
        assert_eq!(outs[0], outs[1], "seed {seed}\n{src}");
    }
}

#[test]
fn many_revisions_at_once_equal_one_by_one() {
    for seed in 1..=30u64 {
        let mut rng = Rng(seed * 104729);
        let src = random_program(&mut rng);
        let program = Arc::new(ccattler_parser::check_str("r.rules", &src).program.expect("checks"));
        // Three revisions of changes; a later one may delete what an earlier inserted.
        let mut present: BTreeSet<(usize, Row)> = BTreeSet::new();
        let mut batches = Vec::new();
        for rev in 1..=3u64 {
            let mut changes = Vec::new();
            for _ in 0..10 {
                let t = (rng.below(3), smallvec::smallvec![Value::Int(rng.below(5) as i64), Value::Int(rng.below(5) as i64)]);
                if changes.iter().any(|(r, x, _): &(usize, Row, isize)| (*r, x) == (t.0, &t.1)) {
                    continue;
                }
                let d = if present.remove(&t) {
                    -1
                } else {
                    present.insert(t.clone());
                    1
                };
                changes.push((t.0, t.1, d));
            }
            batches.push((rev, changes));
        }
        let mut one = Engine::start(program.clone(), 1).unwrap();
        let mut net: BTreeMap<(usize, Row), isize> = BTreeMap::new();
        for (rev, changes) in batches.clone() {
            for (rel, row, d) in one.apply(rev, changes).unwrap() {
                *net.entry((rel, row)).or_default() += d;
            }
        }
        net.retain(|_, d| *d != 0);
        let mut many = Engine::start(program.clone(), 1).unwrap();
        let together: BTreeMap<(usize, Row), isize> = many.apply_many(batches).unwrap().into_iter().map(|(r, row, d)| ((r, row), d)).collect();
        assert_eq!(together, net, "seed {seed}\n{src}");
        for (rel, r) in program.relations.iter().enumerate() {
            if r.kind != DeclKind::Input {
                assert_eq!(one.query(rel).unwrap(), many.query(rel).unwrap(), "seed {seed}, {}", r.name);
            }
        }
    }
}

#[test]
fn staged_revisions_stay_in_order() {
    let program = Arc::new(
        ccattler_parser::check_str("r.rules", "input a(x: int) from \"a/{x}\"\noutput b(x: int) to \"b/{x}\"\nb(x) :- a(x).\n").program.expect("checks"),
    );
    let a = program.relations.iter().position(|r| r.name == "a").unwrap();
    let mut e = Engine::start(program, 1).unwrap();
    let row = |x: i64| smallvec::smallvec![Value::Int(x)];
    e.apply(5, vec![(a, row(1), 1)]).unwrap();
    assert!(e.stage(5, vec![(a, row(2), 1)]).is_err(), "a closed revision cannot be staged at");
    e.stage(7, vec![(a, row(2), 1)]).unwrap();
    e.stage(7, vec![(a, row(3), 1)]).unwrap();
    assert!(e.stage(6, vec![]).is_err() && e.apply(6, vec![]).is_err(), "nothing before the staged revision");
    // Closing it returns everything staged and applied.
    let out: Vec<i64> = e
        .apply(7, vec![(a, row(4), 1)])
        .unwrap()
        .into_iter()
        .map(|(_, r, _)| match r[1] {
            Value::Int(x) => x,
            _ => 0,
        })
        .collect();
    assert_eq!(out, [2, 3, 4]);
    assert!(e.apply(7, vec![]).is_err(), "closed now");
}

#[test]
fn streamed_parts_sum_to_the_whole() {
    // `c` follows `b` by at least one step: its rows come in a later part.
    let src = "input a(x: int, y: int) from \"a/{x}/{y}\"\noutput b(x: int, y: int) to \"b/{x}/{y}\"\noutput c(x: int, y: int) to \"c/{x}/{y}\"\nb(x, y) :- a(x, y), x < y.\nc(x, y) :- b(x, y), not a(y, x).\n";
    let program = Arc::new(ccattler_parser::check_str("r.rules", src).program.expect("checks"));
    let a = program.relations.iter().position(|r| r.name == "a").unwrap();
    let changes: Vec<(usize, Row, isize)> = (0..200i64)
        .flat_map(|x| (0..200i64).filter(move |y| (x + y) % 7 != 0).map(move |y| (a, smallvec::smallvec![Value::Int(x), Value::Int(y)], 1)))
        .collect();
    let whole = Engine::start(program.clone(), 1).unwrap().apply(1, changes.clone()).unwrap();
    for workers in [1, 2] {
        let mut e = Engine::start(program.clone(), workers).unwrap();
        let mut parts = Vec::new();
        e.apply_streaming(vec![(1, changes.clone())], |p| parts.push(p)).unwrap();
        assert!(parts.len() > 1, "big enough to come in parts");
        assert_eq!(ccattler_engine::runtime::consolidate(parts.concat()), whole);
    }
}
