//! The clock joined as a temporal filter (`ccattler_engine::temporal`)
//! against the from-scratch oracle, with readings and values a careless
//! writer or a hostile one could put in etcd: ints at the edges of i64 (where
//! `c - y` overflows and the comparison is false), next to the bound below
//! which sums cannot overflow, readings that jump back, two at once, none.
//!
//! Replay a failure: `TEMPORAL_SEED=<seed> cargo test -p ccattler-engine --test temporal`.

mod common;
use ccattler_engine::{Engine, Row, Value};
use ccattler_parser::ast::DeclKind;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const PROGRAM: &str = "input a(x: int, y: int) from \"a/{x}/{y}\"\n\
    input g(x: int, g: int) from \"g/{x}/{g}\"\n\
    input clock(c: int) from \"clock/{c}\"\n\
    output stale(x: int, y: int) to \"s/{x}/{y}\"\n\
    output apart(x: int, y: int) to \"p/{x}/{y}\"\n\
    output under(x: int, y: int) to \"u/{x}/{y}\"\n\
    output at(x: int, y: int) to \"e/{x}/{y}\"\n\
    output window(x: int, y: int) to \"w/{x}/{y}\"\n\
    output seen(x: int, c: int) to \"seen/{x}/{c}\"\n\
    stale(x, y) :- a(x, y), g(x, n), clock(c), max(c - y - n, y - c) > 0.\n\
    apart(x, y) :- a(x, y), clock(c), c + x != y.\n\
    under(x, y) :- a(x, y), g(x, n), clock(c), min(c, y) >= x - n.\n\
    at(x, y) :- a(x, y), clock(c), x - c = y.\n\
    window(x, y) :- a(x, y), clock(c), c - x < 2, y <= c + c, x != 3.\n\
    seen(x, c) :- a(x, y), clock(c), c > y.\n";

/// Values at the edges: i64's, the bound of 2^40 on either side, and a
/// few small ones the clock moves between.
const EDGES: [i64; 16] =
    [0, 1, 2, 3, 5, 7, 30, -4, (1 << 40) - 1, 1 << 40, (1 << 40) + 1, -(1 << 40), i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1];

fn run(seed: u64, workers: usize) -> Result<(), String> {
    let mut rng = Rng(seed.max(1));
    let checked = ccattler_parser::check_str("temporal.rules", PROGRAM);
    let program = Arc::new(checked.program.clone().ok_or_else(|| checked.render())?);
    let rel = |name: &str| program.relation(name).expect("declared");
    let (a, g, clock) = (rel("a"), rel("g"), rel("clock"));
    let mut engine = Engine::start(program.clone(), workers).map_err(|e| e.to_string())?;
    let mut inputs: Db = BTreeMap::new();
    let mut reading = 0i64;
    for rev in 1..=40u64 {
        let mut changes: Vec<(usize, Row, isize)> = Vec::new();
        let mut toggle = |inputs: &mut Db, rel: usize, row: Row| {
            if changes.iter().any(|(r, x, _)| *r == rel && *x == row) {
                return;
            }
            let set = inputs.entry(rel).or_default();
            let d = if set.remove(&row) {
                -1
            } else {
                set.insert(row.clone());
                1
            };
            changes.push((rel, row, d));
        };
        let value = |rng: &mut Rng| if rng.below(3) == 0 { *rng.pick(&EDGES) } else { rng.below(12) as i64 - 2 };
        for _ in 0..rng.below(4) {
            let row: Row = smallvec::smallvec![Value::Int(rng.below(6) as i64), Value::Int(value(&mut rng))];
            let which = if rng.below(3) == 0 { g } else { a };
            toggle(&mut inputs, which, row);
        }
        // The clock mostly ticks; sometimes jumps (back, or to an edge),
        // gains a second reading, or is gone.
        let old = inputs.get(&clock).cloned().unwrap_or_default();
        match rng.below(8) {
            0 => toggle(&mut inputs, clock, smallvec::smallvec![Value::Int(value(&mut rng))]),
            1 => {
                for row in old {
                    toggle(&mut inputs, clock, row);
                }
            }
            _ => {
                reading = if rng.below(4) == 0 { value(&mut rng) } else { reading.saturating_add(1 + rng.below(3) as i64) };
                for row in old {
                    toggle(&mut inputs, clock, row);
                }
                toggle(&mut inputs, clock, smallvec::smallvec![Value::Int(reading)]);
            }
        }
        engine.apply(rev, changes).map_err(|e| e.to_string())?;
        let expected = oracle(&program, &inputs);
        for (r, relation) in program.relations.iter().enumerate().filter(|(_, r)| r.kind != DeclKind::Input) {
            let got: BTreeSet<Row> = engine.query(r).map_err(|e| e.to_string())?.into_iter().collect();
            let want = expected.get(&r).cloned().unwrap_or_default();
            if got != want {
                return Err(format!(
                    "revision {rev}, {}:\n  engine only: {:?}\n  oracle only: {:?}\ninputs: {inputs:?}",
                    relation.name,
                    got.difference(&want).collect::<Vec<_>>(),
                    want.difference(&got).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn a_temporal_filter_matches_the_oracle_at_the_edges_of_i64() {
    if let Ok(seed) = std::env::var("TEMPORAL_SEED") {
        let seed: u64 = seed.parse().expect("TEMPORAL_SEED is a number");
        run(seed, 1).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        return;
    }
    for i in 0..80u64 {
        let seed = 0x7e3a_0000 + i;
        let workers = if i % 4 == 3 { 2 } else { 1 };
        if let Err(e) = run(seed, workers) {
            panic!("case failed; replay with TEMPORAL_SEED={seed} (workers {workers}):\n{e}");
        }
    }
}
