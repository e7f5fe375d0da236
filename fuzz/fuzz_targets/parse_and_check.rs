//! Any bytes, as a rule file: parse and check must never panic or hang, and
//! whatever they report must render.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let checked = ccattler_parser::check_str("fuzz.rules", &text);
    let _ = checked.render();
    if let Some(p) = &checked.program {
        let _ = ccattler_parser::summary(p);
    }
});
