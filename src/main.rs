//! `ccattler`: argument parsing and wiring over the library crates.

mod cli;
mod commands;
mod common;
mod etcd_args;
mod prelude;
mod rules_io;

/// mimalloc instead of glibc's malloc: with millions of small rows, glibc
/// spends much of `explain`'s and the engine's time consolidating free
/// chunks (README, Benchmarks).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    ccattler_engine::disable_huge_pages();
    cli::main()
}
