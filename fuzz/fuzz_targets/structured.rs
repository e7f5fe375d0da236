//! Structure-aware inputs for the parser and checker: what arbitrary bytes
//! rarely build — expressions nested past the limit, operator chains tens of
//! thousands long, huge literals, hundreds of strata, long negation and call
//! towers — spliced into a well-formed program, parsed and checked on a
//! thread with a 1 MiB stack (a budget far under the 8 MiB main thread's,
//! so recursion without a bound overflows here first).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::fmt::Write;

#[derive(Arbitrary, Debug)]
enum Piece {
    /// `((((x))))`
    Parens(u16),
    /// `not not … ` in a body, `- - - x` in an expression
    Negations(u16),
    /// `x + x + … + x`, mixed operators
    Chain(u16, u8),
    /// `len(len(len(x)))`
    Calls(u16),
    /// an integer literal of this many digits
    BigInt(u8),
    /// a string literal this long, with escapes
    LongString(u16),
    /// relations r0 … rN, each derived from the one before (many strata)
    Strata(u8),
    /// a rule body of this many atoms
    WideBody(u16),
    /// bytes as they come
    Raw(String),
}

fn expr(p: &Piece, out: &mut String) {
    match p {
        Piece::Parens(n) => {
            let n = *n as usize % 5_000;
            out.push_str(&"(".repeat(n));
            out.push('x');
            out.push_str(&")".repeat(n));
        }
        Piece::Negations(n) => {
            out.push_str(&"- ".repeat(*n as usize % 5_000));
            out.push('x');
        }
        Piece::Chain(n, seed) => {
            out.push('x');
            let ops = ["+", "-", "*", "/", "%", "++"];
            for i in 0..(*n as usize % 5_000) {
                let _ = write!(out, " {} x", ops[(i + *seed as usize) % ops.len()]);
            }
        }
        Piece::Calls(n) => {
            let n = *n as usize % 5_000;
            out.push_str(&"len(".repeat(n));
            out.push('x');
            out.push_str(&")".repeat(n));
        }
        Piece::BigInt(n) => out.push_str(&"9".repeat(1 + *n as usize * 4)),
        Piece::LongString(n) => {
            out.push('"');
            for i in 0..*n as usize {
                out.push_str(if i % 7 == 0 { "\\\"" } else { "ü" });
            }
            out.push('"');
        }
        Piece::Strata(_) | Piece::WideBody(_) => out.push('x'),
        Piece::Raw(s) => out.push_str(s),
    }
}

fn program(pieces: &[Piece]) -> String {
    let mut out = String::from("input a(x: int) from \"a/{x}\"\noutput b(x: int) to \"effective/b/{x}\"\n");
    for (i, p) in pieces.iter().enumerate().take(8) {
        match p {
            Piece::Strata(n) => {
                let n = (*n as usize % 64) * 4;
                for k in 0..n {
                    let _ = writeln!(out, "relation s{i}_{k}(x: int)\nrelation q{i}_{k}(x: int)\nq{i}_{k}(x) :- a(x), x > {k}.");
                    let prev = if k == 0 { "a(x)".to_string() } else { format!("s{i}_{}(x)", k - 1) };
                    let _ = writeln!(out, "s{i}_{k}(x) :- {prev}, not q{i}_{k}(x).");
                }
                if n > 0 {
                    let _ = writeln!(out, "b(x) :- s{i}_{}(x).", n - 1);
                }
            }
            Piece::WideBody(n) => {
                let atoms: Vec<String> = (0..(*n as usize % 1_000)).map(|_| "a(x)".to_string()).collect();
                let _ = writeln!(out, "b(x) :- {}.", if atoms.is_empty() { "a(x)".into() } else { atoms.join(", ") });
            }
            Piece::Negations(n) if i % 2 == 0 => {
                let _ = writeln!(out, "b(x) :- a(x), {}a(x).", "not ".repeat(*n as usize % 5_000));
            }
            p => {
                let mut e = String::new();
                expr(p, &mut e);
                let _ = writeln!(out, "b(y) :- a(x), y = {e}.");
            }
        }
    }
    out
}

fuzz_target!(|pieces: Vec<Piece>| {
    let text = program(&pieces);
    let run = move || {
        let checked = ccattler_parser::check_str("fuzz.rules", &text);
        let _ = checked.render();
        if let Some(p) = &checked.program {
            let _ = ccattler_parser::summary(p);
        }
    };
    std::thread::Builder::new().stack_size(1 << 20).spawn(run).expect("thread").join().expect("parse and check on a 1 MiB stack");
});
