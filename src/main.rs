//! `ccattler`: argument parsing and wiring over the library crates.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
