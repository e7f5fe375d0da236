//! A worker that panics makes `apply` fail at once on every worker count —
//! never hang: the other workers wait at the barrier between strata, and
//! must learn that one of them is gone. (A process of its own: the panic
//! is injected through the environment.)

use ccattler_engine::{Engine, Value};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_panicking_worker_fails_apply_instead_of_hanging_the_others_at_a_barrier() {
    std::env::set_var("CCATTLER_INJECT_WORKER_PANIC", "3");
    // Two strata (b reads a), so every revision passes a barrier.
    let src = "input e(a: int, b: int) from \"e/{a}/{b}\"\nrelation a(x: int)\noutput b(x: int) to \"b/{x}\"\n\
               a(x) :- e(x, _).\nb(x) :- a(x), not e(_, x).\n";
    let program = Arc::new(ccattler_parser::check_str("t.rules", src).program.expect("checks"));
    let e = program.relation("e").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut engine = Engine::start(program, 2).unwrap();
        let first = engine.apply(1, vec![(e, [Value::Int(1), Value::Int(2)].into_iter().collect(), 1)]).map(|_| ());
        let second = engine.apply(2, vec![(e, [Value::Int(2), Value::Int(3)].into_iter().collect(), 1)]).map(|_| ());
        let third = engine.apply(3, vec![(e, [Value::Int(3), Value::Int(4)].into_iter().collect(), 1)]).map(|_| ());
        // Dropping it must not wait for the stopped workers either.
        drop(engine);
        tx.send((first, second, third)).unwrap();
    });
    let (first, second, third) = rx.recv_timeout(Duration::from_secs(30)).expect("apply hung after a worker panicked");
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
    assert!(third.is_err(), "the revision a worker panicked at must fail: {third:?}");
}
