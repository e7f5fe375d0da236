//! Loads the synthetic cluster and stops: run under heaptrack (the system
//! allocator, unlike the benches) to see where the engine's heap goes.
//! `cargo build --release -p ccattler-engine --example heap && heaptrack
//! target/release/examples/heap --nodes 200 --services 40 --instances 6000`
use ccattler_engine::synth;
use ccattler_engine::Session;
use std::sync::Arc;

fn main() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules");
    let checked = ccattler_parser::load(&[rules.into()]).expect("rules load");
    let program = Arc::new(checked.program.expect("a checked program"));
    let p = synth::Params::from_args();
    let writes: Vec<_> = synth::cluster(&p).into_iter().map(|(k, v)| (k, Some(v))).collect();
    let mut session = Session::new(program, 2).expect("engine");
    session.write(&writes).expect("load");
    drop(writes);
    eprintln!("loaded {p:?}");
    // What is live now shows as leaked: exit without dropping it.
    std::process::exit(0);
}
