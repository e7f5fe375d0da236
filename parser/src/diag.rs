//! Diagnostics: what the parser and checker report, rendered with a caret under
//! the source (codespan-reporting) or as JSON for editors and CI.

use crate::source::{Sources, Span};
use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label, Severity as CsSeverity};
use codespan_reporting::files::SimpleFiles;
use codespan_reporting::term::{self, termcolor::NoColor, Chars, Config};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem found in the rule files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable identifier of the kind of problem, e.g. `unknown-relation`.
    pub code: &'static str,
    pub message: String,
    pub span: Span,
    /// Secondary places that explain the problem (e.g. the earlier declaration).
    pub notes: Vec<(Span, String)>,
    /// What to do about it.
    pub help: String,
}

impl Diagnostic {
    pub fn error(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic { severity: Severity::Error, code, message: message.into(), span, notes: vec![], help: String::new() }
    }
    pub fn warning(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        Diagnostic { severity: Severity::Warning, ..Self::error(code, span, message) }
    }
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = help.into();
        self
    }
    pub fn with_note(mut self, span: Span, note: impl Into<String>) -> Self {
        self.notes.push((span, note.into()));
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Sorts diagnostics by file, position, then message, so output is deterministic.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| (a.span.file, a.span.start, a.span.end, a.code, &a.message).cmp(&(b.span.file, b.span.start, b.span.end, b.code, &b.message)));
}

/// Renders diagnostics as text: `file:line:col`, the line, a caret, and help.
pub fn render(sources: &Sources, diags: &[Diagnostic]) -> String {
    let mut files = SimpleFiles::new();
    for id in sources.ids() {
        files.add(sources.name(id).to_string(), sources.text(id).to_string());
    }
    let config = Config { chars: Chars::ascii(), ..Config::default() };
    let mut out = NoColor::new(Vec::new());
    for d in diags {
        let severity = match d.severity {
            Severity::Error => CsSeverity::Error,
            Severity::Warning => CsSeverity::Warning,
        };
        let mut labels = vec![Label::primary(d.span.file, d.span.start..d.span.end)];
        for (span, note) in &d.notes {
            labels.push(Label::secondary(span.file, span.start..span.end).with_message(note.clone()));
        }
        let mut cs = CsDiagnostic::new(severity).with_code(d.code).with_message(d.message.clone()).with_labels(labels);
        if !d.help.is_empty() {
            cs = cs.with_notes(vec![format!("help: {}", d.help)]);
        }
        // Rendering only fails if a span is outside its file, which would be a bug
        // in the parser; fall back to a plain line rather than losing the message.
        if term::emit(&mut out, &config, &files, &cs).is_err() {
            let line = format!("{}: {}: {}\n", sources.location(d.span), d.code, d.message);
            out.get_mut().extend_from_slice(line.as_bytes());
        }
    }
    String::from_utf8_lossy(&out.into_inner()).into_owned()
}

/// One diagnostic as JSON for `--format json`.
#[derive(Serialize)]
pub struct JsonDiagnostic<'a> {
    pub severity: Severity,
    pub code: &'a str,
    pub message: &'a str,
    pub file: &'a str,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub help: &'a str,
}

pub fn to_json<'a>(sources: &'a Sources, d: &'a Diagnostic) -> JsonDiagnostic<'a> {
    let (line, column) = sources.line_col(d.span.file, d.span.start);
    let (end_line, end_column) = sources.line_col(d.span.file, d.span.end);
    JsonDiagnostic {
        severity: d.severity,
        code: d.code,
        message: &d.message,
        file: sources.name(d.span.file),
        line,
        column,
        end_line,
        end_column,
        help: &d.help,
    }
}
