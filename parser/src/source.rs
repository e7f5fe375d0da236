//! Source files and byte spans into them.

use serde::Serialize;

/// Index of a file in a [`Sources`] set.
pub type FileId = usize;

/// A byte range in one source file. Every AST node carries one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
pub struct Span {
    pub file: FileId,
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Self {
        Span { file, start, end }
    }
    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span { file: self.file, start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// The rule files of one program, by name (usually a path) and text.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    files: Vec<(String, String)>,
}

impl Sources {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        self.files.push((name.into(), text.into()));
        self.files.len() - 1
    }
    pub fn name(&self, id: FileId) -> &str {
        &self.files[id].0
    }
    pub fn text(&self, id: FileId) -> &str {
        &self.files[id].1
    }
    pub fn len(&self) -> usize {
        self.files.len()
    }
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
    pub fn ids(&self) -> impl Iterator<Item = FileId> {
        0..self.files.len()
    }
    /// The text a span covers.
    pub fn slice(&self, span: Span) -> &str {
        &self.text(span.file)[span.start..span.end]
    }
    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, file: FileId, offset: usize) -> (usize, usize) {
        let text = self.text(file);
        let offset = offset.min(text.len());
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        (line, text[line_start..offset].chars().count() + 1)
    }
    /// `file:line:col` of a span's start.
    pub fn location(&self, span: Span) -> String {
        let (l, c) = self.line_col(span.file, span.start);
        format!("{}:{}:{}", self.name(span.file), l, c)
    }
}
