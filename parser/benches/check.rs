//! Parse and check a generated program of N rules (default 10,000).
//! `cargo bench -p ccattler-parser --bench check [-- RULES]`; prints the median of 7 runs.

use std::time::Instant;

fn program(rules: usize) -> String {
    let inputs = 100;
    let derived = rules / 5;
    let mut s = String::new();
    for i in 0..inputs {
        s += &format!("input in{i}(a: name, b: int) from \"in/{i}/{{a}}\"\n");
    }
    for d in 0..derived {
        s += &format!("output d{d}(a: name, b: int) to \"out/{d}/{{a}}\"\n");
    }
    for r in 0..rules {
        let d = r % derived;
        let (p, q) = (format!("in{}", r % inputs), format!("in{}", (r * 7 + 3) % inputs));
        // Rules may read earlier derived relations, so there are many strata.
        let lower = if d > 0 { format!("d{}", (r * 13) % d) } else { q.clone() };
        s += &match r % 5 {
            0 => format!("// rule {r}\nd{d}(a, max(b)) :- {p}(a, b), {q}(a, _).\n"),
            1 => format!("d{d}(a, b) :- {p}(a, b), not {lower}(a, _), b > 2.\n"),
            2 => format!("d{d}(a, c) :- {p}(a, b), {lower}(a, x), c = b + x * 2.\n"),
            3 => format!("d{d}(a, i) :- {p}(a, b), i in 0..b, i < 10.\n"),
            _ => format!("d{d}(n, b) :- {p}(a, b), n = a ++ \"-\" ++ b.\n"),
        };
    }
    s
}

fn main() {
    let rules: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(10_000);
    let text = program(rules);
    let mut times = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let checked = ccattler_parser::check_str("generated.rules", &text);
        times.push(start.elapsed());
        assert_eq!(checked.errors(), 0, "{}", checked.render());
        assert_eq!(checked.program.as_ref().map(|p| p.rules.len()), Some(rules));
    }
    times.sort();
    println!(
        "parse+check {rules} rules ({} KiB): median {:.1} ms (min {:.1}, max {:.1}) over {} runs",
        text.len() / 1024,
        times[3].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[6].as_secs_f64() * 1e3,
        times.len()
    );
}
