//! CCattler's rule language, front to back: [`syntax`] (text → [`ast`]),
//! [`check`] (ast → [`program::Program`]), [`diag`] (what went wrong, rendered).
//! The engine compiles from [`program::Program`] and nothing else.

pub mod ast;
pub mod check;
pub mod describe;
pub mod diag;
pub mod pattern;
pub mod pretty;
pub mod program;
pub mod source;
pub mod syntax;

pub use diag::{Diagnostic, Severity};
pub use program::Program;
pub use source::{Sources, Span};

use std::path::{Path, PathBuf};

/// Reading rule files failed (as opposed to their contents being wrong).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: no such file or directory")]
    Missing { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: no .{ext} files found")]
    Empty { path: PathBuf, ext: &'static str },
}

/// The outcome of checking: the program if it is valid, and every diagnostic.
pub struct Checked {
    pub program: Option<Program>,
    pub diagnostics: Vec<Diagnostic>,
    pub sources: Sources,
}

impl Checked {
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
    pub fn render(&self) -> String {
        diag::render(&self.sources, &self.diagnostics)
    }
}

/// Expands files and directories (their `*.rules`, sorted) into rule file paths.
pub fn rule_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LoadError> {
    files_with_extension(paths, "rules")
}

/// Expands files and directories (their `*.<ext>` files, sorted); a missing
/// path or a directory without such files is an error naming it.
pub fn files_with_extension(paths: &[PathBuf], ext: &'static str) -> Result<Vec<PathBuf>, LoadError> {
    let mut out = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LoadError::Missing { path: path.clone() },
            _ => LoadError::Io { path: path.clone(), source: e },
        })?;
        if meta.is_dir() {
            let mut found = Vec::new();
            walk(path, ext, &mut found)?;
            if found.is_empty() {
                return Err(LoadError::Empty { path: path.clone(), ext });
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

/// A file that makes its directory a program of its own (as a nested
/// `Cargo.toml` makes a package): the parent's rules and tests do not
/// include what is below it (`rules/autoscaler/`).
pub const PROGRAM_MARKER: &str = "PROGRAM";

/// Every file below `dir` (recursively, as `cargo test` and `opa test`
/// find theirs) whose name ends in `.ext`, except below a subdirectory that
/// is a program of its own ([`PROGRAM_MARKER`]).
fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| LoadError::Io { path: dir.to_path_buf(), source: e })?;
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.join(PROGRAM_MARKER).is_file() {
                continue;
            }
            walk(&p, ext, out)?;
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads, parses and checks rule files and directories. A file that is not
/// UTF-8 is a diagnostic at its first bad byte, not an I/O error.
pub fn load(paths: &[PathBuf]) -> Result<Checked, LoadError> {
    let mut sources = Sources::new();
    let mut bad = Vec::new();
    for path in rule_files(paths)? {
        let bytes = std::fs::read(&path).map_err(|e| LoadError::Io { path: path.clone(), source: e })?;
        match String::from_utf8(bytes) {
            Ok(text) => {
                sources.add(display_path(&path), text);
            }
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                let byte = e.as_bytes()[at];
                // The text up to the bad byte, so the diagnostic shows its line.
                let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
                let shown = String::from_utf8_lossy(&e.as_bytes()[..at]).len();
                let id = sources.add(display_path(&path), text);
                bad.push(
                    Diagnostic::error("not-utf8", source::Span::new(id, shown, shown + '\u{fffd}'.len_utf8()), format!("byte 0x{byte:02x} is not UTF-8"))
                        .with_help("rule files are UTF-8 text: re-save the file as UTF-8"),
                );
            }
        }
    }
    let mut checked = check_sources(sources);
    if !bad.is_empty() {
        checked.program = None;
        checked.diagnostics.extend(bad);
        diag::sort(&mut checked.diagnostics);
    }
    Ok(checked)
}

fn display_path(p: &Path) -> String {
    p.to_string_lossy().trim_start_matches("./").to_string()
}

/// Parses and checks sources already in memory.
pub fn check_sources(sources: Sources) -> Checked {
    let mut diagnostics = Vec::new();
    let mut files = Vec::new();
    for id in sources.ids() {
        let (file, diags) = syntax::parse_file(id, sources.text(id));
        files.push(file);
        diagnostics.extend(diags);
    }
    // With syntax errors, still check what parsed so resolution errors show up
    // in the same run; but no program comes out.
    let parsed = !diagnostics.iter().any(Diagnostic::is_error);
    let (program, check_diags) = check::check(sources.clone(), &files, parsed);
    let program = program.filter(|_| parsed);
    diagnostics.extend(check_diags);
    diag::sort(&mut diagnostics);
    Checked { program, diagnostics, sources }
}

/// Convenience for tests and tools: check one in-memory file.
pub fn check_str(name: &str, text: &str) -> Checked {
    let mut s = Sources::new();
    s.add(name, text);
    check_sources(s)
}

/// One-line summary of a valid program, as `ccattler check` prints it.
pub fn summary(p: &Program) -> String {
    format!(
        "ok: {} file(s), {} relation(s) ({} input, {} output), {} rule(s), {} strata",
        p.sources.len(),
        p.relations.len(),
        p.inputs().count(),
        p.outputs().count(),
        p.rules.len(),
        p.strata.iter().filter(|s| !s.rules.is_empty()).count()
    )
}
