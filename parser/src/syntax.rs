//! Text → [`ast::File`], with nom. Never panics; on a syntax error it records a
//! diagnostic, skips to the end of the statement and goes on, so one run reports
//! every broken statement.

use crate::ast::*;
use crate::diag::Diagnostic;
use crate::source::{FileId, Span};
use nom::bytes::complete::{tag, take_while, take_while1};
use nom::character::complete::{char, digit1, satisfy};
use nom::combinator::{opt, peek, recognize};
use nom::error::{ErrorKind, ParseError};
use nom::sequence::pair;
use nom::{IResult, Parser};

/// A parse failure: where (as remaining input length) and what was expected there.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    remaining: usize,
    expected: String,
}

impl<'a> ParseError<&'a str> for SyntaxError {
    fn from_error_kind(input: &'a str, kind: ErrorKind) -> Self {
        SyntaxError { remaining: input.len(), expected: format!("{kind:?}").to_lowercase() }
    }
    fn append(_: &'a str, _: ErrorKind, other: Self) -> Self {
        other
    }
    fn or(self, other: Self) -> Self {
        // Keep the error that got furthest; it says the most.
        if other.remaining <= self.remaining {
            other
        } else {
            self
        }
    }
}

type PResult<'a, O> = IResult<&'a str, O, SyntaxError>;

fn fail<'a, O>(input: &'a str, expected: impl Into<String>) -> PResult<'a, O> {
    Err(nom::Err::Error(SyntaxError { remaining: input.len(), expected: expected.into() }))
}

/// Turns a recoverable error into a committed one (nom's `cut`).
fn commit<O>(r: PResult<'_, O>) -> PResult<'_, O> {
    r.map_err(|e| match e {
        nom::Err::Error(e) => nom::Err::Failure(e),
        other => other,
    })
}

/// How deep an expression may nest: operators, `-`, parentheses and
/// function calls each count one level. Real rules stay in single digits;
/// the bound keeps a hostile or generated file from overflowing the stack
/// of `check`, the language server or the controller's reload.
pub const MAX_NESTING: usize = 64;

fn too_deep(at: &str) -> nom::Err<SyntaxError> {
    nom::Err::Failure(SyntaxError {
        remaining: at.len(),
        expected: format!("an expression nested at most {MAX_NESTING} levels deep (split it with intermediate variables)"),
    })
}

/// Parses one file. Syntax errors come back as diagnostics next to whatever parsed.
pub fn parse_file(file: FileId, text: &str) -> (File, Vec<Diagnostic>) {
    let p = P { file, len: text.len() };
    let mut items = Vec::new();
    let mut diags = Vec::new();
    let mut rest = text;
    loop {
        rest = match p.ws(rest) {
            Ok((r, _)) => r,
            Err(_) => rest,
        };
        if rest.is_empty() {
            break;
        }
        let doc = doc_above(text, text.len() - rest.len());
        // `relaton foo(…)`: a keyword mistyped is named with the keyword
        // meant, and the statement is read as that keyword's, so the names
        // it declares exist and nothing cascades from it.
        let parsed = match keyword_typo(rest) {
            Some((kw, word)) => {
                let at = text.len() - rest.len();
                diags.push(
                    Diagnostic::error("unknown-keyword", Span::new(file, at, at + word.len()), format!("unknown keyword `{word}`"))
                        .with_help(format!("did you mean `{kw}`?")),
                );
                p.item_as(rest, kw, &rest[word.len()..], doc)
            }
            None => p.item(rest, doc),
        };
        match parsed {
            Ok((r, item)) => {
                items.push(item);
                rest = r;
            }
            Err(nom::Err::Error(e) | nom::Err::Failure(e)) => {
                let mut at = p.len - e.remaining;
                let mut found = describe_found(&text[at..]);
                // A token missing at the end of a line is reported there, not
                // at whatever starts the next line.
                let prev_end = text[..at].trim_end().len();
                if text[prev_end..at].contains('\n') {
                    at = prev_end;
                    found = "end of line".into();
                }
                diags.push(
                    Diagnostic::error("syntax", Span::new(file, at, next_char_end(text, at)), format!("expected {}, found {}", e.expected, found)).with_help(
                        "a statement is a declaration (`input r(c: string) from \"k/{c}\"`) or a rule \
                         (`head(x) :- body(x).`) ending with `.`",
                    ),
                );
                rest = &text[skip_statement(text, p.len - rest.len(), at)..];
            }
            Err(nom::Err::Incomplete(_)) => break, // complete parsers never say this
        }
    }
    (File { items }, diags)
}

/// A statement that starts with two words where a keyword and a name go,
/// the first near a declaration keyword (`relaton foo(…)`): the keyword meant
/// and the word written. A rule never starts with two words.
fn keyword_typo(rest: &str) -> Option<(&'static str, &str)> {
    let word_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
    let word = &rest[..word_end];
    let after = rest[word_end..].trim_start_matches([' ', '\t']);
    if word.is_empty() || word_end == rest.len() || !rest[word_end..].starts_with([' ', '\t']) || !after.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    const KEYWORDS: [&str; 4] = ["input", "output", "relation", "type"];
    if KEYWORDS.contains(&word) {
        return None;
    }
    // Edits, with a swap of two neighbours counting as one (`tpye`).
    let distance = |w: &str, k: &str| {
        let (a, b): (Vec<char>, Vec<char>) = (w.chars().collect(), k.chars().collect());
        let swapped =
            a.len() == b.len() && (0..a.len().saturating_sub(1)).any(|i| a[i] == b[i + 1] && a[i + 1] == b[i] && a[..i] == b[..i] && a[i + 2..] == b[i + 2..]);
        if swapped {
            1
        } else {
            crate::check::edit_distance(w, k)
        }
    };
    KEYWORDS
        .into_iter()
        .map(|k| (distance(&word.to_ascii_lowercase(), k), k))
        .filter(|(d, k)| *d <= if k.len() <= 4 { 1 } else { 2 })
        .min()
        .map(|(_, k)| (k, word))
}

/// The doc of a statement starting at `at`: the `///` lines right above it
/// (a blank line or a plain `//` line ends them), joined with newlines.
fn doc_above(text: &str, at: usize) -> Option<String> {
    // The statement's own line up to it must be blank.
    let before = text[..at].trim_end_matches([' ', '\t']);
    let before = before.strip_suffix('\n')?;
    let before = before.strip_suffix('\r').unwrap_or(before);
    let mut lines: Vec<&str> = before
        .lines()
        .rev()
        .map_while(|l| {
            let body = l.trim_start().strip_prefix("///")?;
            Some(body.strip_prefix(' ').unwrap_or(body).trim_end())
        })
        .collect();
    if lines.is_empty() {
        return None;
    }
    lines.reverse();
    Some(lines.join("\n"))
}

/// The end of the character at `at`; a line break gets an empty span so the
/// caret stays on its line.
fn next_char_end(text: &str, at: usize) -> usize {
    match text[at..].chars().next() {
        None | Some('\n' | '\r') => at,
        Some(c) => at + c.len_utf8(),
    }
}

fn describe_found(rest: &str) -> String {
    match rest.chars().next() {
        None => "end of file".into(),
        Some('\n') => "end of line".into(),
        Some(c) => format!("`{}`", c.escape_debug()),
    }
}

/// Where to resume after a syntax error: just past the next `.` that ends a
/// statement (not inside a string or comment, not part of `..`), at or after
/// the error; or the next line that starts a declaration.
fn skip_statement(text: &str, stmt_start: usize, error_at: usize) -> usize {
    let bytes = text.as_bytes();
    let mut i = stmt_start;
    let mut in_str = false;
    while i < bytes.len() {
        let b = bytes[i];
        if in_str {
            if b == b'\\' {
                i += 1;
            } else if b == b'"' || b == b'\n' {
                in_str = false;
            }
        } else if b == b'"' {
            in_str = true;
        } else if b == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        } else if b == b'.' && i >= error_at {
            let double = bytes.get(i + 1) == Some(&b'.') || (i > 0 && bytes[i - 1] == b'.');
            if !double {
                return i + 1;
            }
        } else if b == b'\n' && i >= error_at {
            let line = &text[i + 1..];
            let starts_decl = ["input ", "output ", "relation ", "type ", "///"].iter().any(|k| line.starts_with(k));
            if starts_decl {
                return i + 1;
            }
        }
        i += 1;
    }
    text.len()
}

struct P {
    file: FileId,
    len: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}
fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

impl P {
    fn pos(&self, rest: &str) -> usize {
        self.len - rest.len()
    }
    fn span(&self, before: &str, after: &str) -> Span {
        Span::new(self.file, self.pos(before), self.pos(after))
    }

    /// Whitespace and `//` comments.
    fn ws<'a>(&self, mut i: &'a str) -> PResult<'a, ()> {
        loop {
            let t = i.trim_start();
            if let Some(c) = t.strip_prefix("//") {
                i = c.find('\n').map_or("", |n| &c[n..]);
            } else {
                return Ok((t, ()));
            }
        }
    }

    /// A token: the parser, then trailing whitespace.
    fn tok<'a>(&self, i: &'a str, t: &'static str) -> PResult<'a, &'a str> {
        let (r, s) = match tag::<_, _, SyntaxError>(t).parse(i) {
            Ok(x) => x,
            Err(_) => return fail(i, format!("`{t}`")),
        };
        let (r, _) = self.ws(r)?;
        Ok((r, s))
    }

    fn raw_ident<'a>(&self, i: &'a str) -> PResult<'a, &'a str> {
        recognize(pair(satisfy(is_ident_start), take_while(is_ident_char))).parse(i)
    }

    /// An identifier that is not followed by more identifier characters.
    fn keyword<'a>(&self, i: &'a str, kw: &'static str) -> PResult<'a, ()> {
        match self.raw_ident(i) {
            Ok((r, w)) if w == kw => {
                let (r, _) = self.ws(r)?;
                Ok((r, ()))
            }
            _ => fail(i, format!("`{kw}`")),
        }
    }

    fn ident<'a>(&self, i: &'a str, what: &str) -> PResult<'a, Ident> {
        let (r, name) = match self.raw_ident(i) {
            Ok(x) => x,
            Err(_) => return fail(i, what.to_string()),
        };
        if KEYWORDS.contains(&name) {
            return fail(i, format!("{what} (`{name}` is a keyword)"));
        }
        let span = self.span(i, r);
        let (r, _) = self.ws(r)?;
        Ok((r, Ident { name: name.to_string(), span }))
    }

    fn string_lit<'a>(&self, i: &'a str) -> PResult<'a, (String, Span)> {
        let Some(mut rest) = i.strip_prefix('"') else { return fail(i, "a string") };
        let mut out = String::new();
        loop {
            let mut chars = rest.chars();
            match chars.next() {
                None | Some('\n') => return Err(nom::Err::Failure(SyntaxError { remaining: rest.len(), expected: "a closing `\"`".into() })),
                Some('"') => {
                    rest = chars.as_str();
                    break;
                }
                Some('\\') => {
                    let esc = match chars.next() {
                        Some('"') => '"',
                        Some('\\') => '\\',
                        Some('n') => '\n',
                        Some('t') => '\t',
                        _ => return Err(nom::Err::Failure(SyntaxError { remaining: rest.len(), expected: "an escape: \\\" \\\\ \\n or \\t".into() })),
                    };
                    out.push(esc);
                    rest = chars.as_str();
                }
                Some(c) => {
                    out.push(c);
                    rest = chars.as_str();
                }
            }
        }
        let span = self.span(i, rest);
        let (rest, _) = self.ws(rest)?;
        Ok((rest, (out, span)))
    }

    /// A statement whose keyword was mistyped, read as keyword `kw`'s
    /// (`after`: the text after the mistyped word).
    fn item_as<'a>(&self, i: &'a str, kw: &str, after: &'a str, doc: Option<String>) -> PResult<'a, Item> {
        let (after, _) = self.ws(after)?;
        let kind = match kw {
            "input" => DeclKind::Input,
            "output" => DeclKind::Output,
            "relation" => DeclKind::Relation,
            _ => {
                return commit(self.type_decl(i, after)).map(|(r, mut t)| {
                    t.doc = doc;
                    (r, Item::Type(t))
                })
            }
        };
        commit(self.decl(i, after, kind)).map(|(r, mut d)| {
            d.doc = doc;
            (r, Item::Decl(d))
        })
    }

    fn item<'a>(&self, i: &'a str, doc: Option<String>) -> PResult<'a, Item> {
        for (kw, kind) in [("input", DeclKind::Input), ("output", DeclKind::Output), ("relation", DeclKind::Relation)] {
            if let Ok((r, ())) = self.keyword(i, kw) {
                return commit(self.decl(i, r, kind)).map(|(r, mut d)| {
                    d.doc = doc;
                    (r, Item::Decl(d))
                });
            }
        }
        if let Ok((r, ())) = self.keyword(i, "type") {
            return commit(self.type_decl(i, r)).map(|(r, mut t)| {
                t.doc = doc;
                (r, Item::Type(t))
            });
        }
        self.rule(i).map(|(r, x)| (r, Item::Rule(x)))
    }

    /// `type NAME = int in LO..=HI` | `type NAME = int in LO..` | `type NAME = "a" | "b" …`, optional `.`.
    fn type_decl<'a>(&self, start: &'a str, i: &'a str) -> PResult<'a, TypeDecl> {
        let (i, name) = self.ident(i, "a type name")?;
        let (i, _) = self.tok(i, "=")?;
        let (mut i, def) = if i.starts_with('"') {
            let mut values = Vec::new();
            let (mut r, first) = self.string_lit(i)?;
            values.push(first);
            while let Ok((r2, _)) = self.tok(r, "|") {
                let (r3, v) = self.string_lit(r2)?;
                values.push(v);
                r = r3;
            }
            (r, TypeDef::Enum(values))
        } else {
            let (r, ()) = self.keyword(i, "int").or_else(|_| fail(i, "`int in LO..=HI` or a list of strings `\"a\" | \"b\"`"))?;
            let (r, ()) = self.keyword(r, "in").or_else(|_| fail(r, "`in LO..=HI` (or `in LO..` for no upper bound)"))?;
            let (r, lo) = self.int_lit(r)?;
            let (r, _) = self.tok(r, "..")?;
            match self.tok(r, "=") {
                Ok((r, _)) => {
                    let (r, hi) = self.int_lit(r)?;
                    (r, TypeDef::IntRange { lo, hi: Some(hi) })
                }
                Err(_) if r.starts_with(|c: char| c.is_ascii_digit() || c == '-') => {
                    return fail(r, "`=` before the upper bound: ranges in a type are inclusive, `LO..=HI`");
                }
                Err(_) => (r, TypeDef::IntRange { lo, hi: None }),
            }
        };
        // The declaration ends at its last token, not the whitespace after it.
        let mut end = self.pos(start) + start[..self.pos(i) - self.pos(start)].trim_end().len();
        let dot_at = self.pos(i) + 1;
        if let Ok((r, ())) = self.tok_dot(i) {
            end = dot_at;
            i = r;
        }
        Ok((i, TypeDecl { name, def, doc: None, span: Span::new(self.file, self.pos(start), end) }))
    }

    /// An integer literal, optionally negative.
    fn int_lit<'a>(&self, i: &'a str) -> PResult<'a, i64> {
        let (r, neg) = match i.strip_prefix('-') {
            Some(r) => (r, true),
            None => (i, false),
        };
        let (r2, digits) = digit1::<_, SyntaxError>(r).or_else(|_| fail(i, "an integer"))?;
        let text = if neg { format!("-{digits}") } else { digits.to_string() };
        let n = text.parse::<i64>().map_err(|_| nom::Err::Failure(SyntaxError { remaining: i.len(), expected: "an integer that fits in 64 bits".into() }))?;
        let (r2, _) = self.ws(r2)?;
        Ok((r2, n))
    }

    /// `input NAME(COL: TYPE, …) from "PATTERN"` (and `output … to`, `relation …`), optional `.`.
    fn decl<'a>(&self, start: &'a str, i: &'a str, kind: DeclKind) -> PResult<'a, Decl> {
        let (i, name) = self.ident(i, "a relation name")?;
        let (i, _) = self.tok(i, "(")?;
        let mut columns = Vec::new();
        let mut i = i;
        if self.tok(i, ")").is_err() {
            loop {
                let (r, col) = self.ident(i, "a column name")?;
                let (r, _) = self.tok(r, ":")?;
                let ty_start = r;
                let (r, ty_word) = self.raw_ident(r).or_else(|_| fail(r, "a type: string, name, int, bool or a declared type"))?;
                let (ty, ty_name) = match ty_word {
                    "string" => (Type::String, None),
                    "name" => (Type::Name, None),
                    "int" => (Type::Int, None),
                    // `bool` and declared types: the checker resolves them.
                    other => (Type::String, Some(other.to_string())),
                };
                let ty_span = self.span(ty_start, r);
                let (r, _) = self.ws(r)?;
                columns.push(Column { name: col, ty, ty_span, ty_name });
                if let Ok((r, _)) = self.tok(r, ",") {
                    i = r;
                    continue;
                }
                i = r;
                break;
            }
        }
        let close = self.pos(i) + 1;
        let (i, _) = self.tok(i, ")").or_else(|_| fail(i, "`,` or `)`"))?;
        let mut end = close;
        let (i, pattern) = match kind {
            DeclKind::Relation => (i, None),
            DeclKind::Input | DeclKind::Output => {
                let word = if kind == DeclKind::Input { "from" } else { "to" };
                let (r, _) = self.keyword(i, word).or_else(|_| fail(i, format!("`{word}` and a key pattern, e.g. {word} \"prefix/{{column}}\"")))?;
                let (r, pat) = self.string_lit(r)?;
                end = pat.1.end;
                (r, Some(pat))
            }
        };
        let (i, builtin) = match (kind, self.tok(i, "=")) {
            (DeclKind::Relation, Ok((r, _))) => {
                let call_start = r;
                let (r, fname) = self.ident(r, "a built-in, e.g. assign(pending, need, offer, …)")?;
                let (r, _) = self.tok(r, "(")?;
                let (r, args) = self.list(r, |x| self.ident(x, "a relation name"))?;
                let close = self.pos(r) + 1;
                let (r, _) = self.tok(r, ")").or_else(|_| fail(r, "`,` or `)`"))?;
                end = close;
                (r, Some(BuiltinCall { name: fname, args, span: Span::new(self.file, self.pos(call_start), close) }))
            }
            _ => (i, None),
        };
        let dot_at = self.pos(i) + 1;
        let (i, dot) = opt(|x| self.tok_dot(x)).parse(i)?;
        if dot.is_some() {
            end = dot_at;
        }
        let span = Span::new(self.file, self.pos(start), end);
        Ok((i, Decl { kind, name, columns, pattern, builtin, doc: None, span }))
    }

    /// `head(t, …) :- item, … .` or a fact `head(c, …).`
    fn rule<'a>(&self, start: &'a str) -> PResult<'a, Rule> {
        let (i, head) = self.ident(start, "a declaration (`input`, `output`, `relation`) or a rule")?;
        let (i, _) = self.tok(i, "(")?;
        let (i, head_terms) = commit(self.list(i, |x| self.head_term(x)))?;
        let head_end = self.pos(i) + 1;
        let (i, _) = commit(self.tok(i, ")").or_else(|_| fail(i, "`,` or `)`")))?;
        let (i, body) = match self.tok(i, ":-") {
            Ok((r, _)) => {
                let (r, first) = commit(self.body_item(r))?;
                let mut body = vec![first];
                let mut r = r;
                while let Ok((r2, _)) = self.tok(r, ",") {
                    let (r3, item) = commit(self.body_item(r2))?;
                    body.push(item);
                    r = r3;
                }
                (r, body)
            }
            Err(_) => (i, vec![]),
        };
        let (i, per) = match self.keyword(i, "per") {
            Ok((r, ())) if !body.is_empty() => {
                let (r, a) = commit(self.atom(r))?;
                (r, Some(a))
            }
            _ => (i, None),
        };
        let expected_end = if body.is_empty() { "`:-` or `.`" } else { "`,`, `per` or `.` ending the rule" };
        let (end, _) = commit(self.tok_dot(i).or_else(|_| fail(i, expected_end)))?;
        let dot_end = self.pos(i) + 1;
        let span = Span::new(self.file, self.pos(start), dot_end);
        let head_span = Span::new(self.file, self.pos(start), head_end);
        Ok((end, Rule { head, head_terms, head_span, body, per, span }))
    }

    /// A `.` that is not the start of `..`.
    fn tok_dot<'a>(&self, i: &'a str) -> PResult<'a, ()> {
        if i.starts_with('.') && !i.starts_with("..") {
            let (r, _) = self.ws(&i[1..])?;
            Ok((r, ()))
        } else {
            fail(i, "`.`")
        }
    }

    /// Zero or more comma-separated items, stopping before `)`.
    fn list<'a, T>(&self, i: &'a str, mut item: impl FnMut(&'a str) -> PResult<'a, T>) -> PResult<'a, Vec<T>> {
        let mut out = Vec::new();
        if peek(char::<_, SyntaxError>(')')).parse(i).is_ok() {
            return Ok((i, out));
        }
        let (mut i, first) = item(i)?;
        out.push(first);
        while let Ok((r, _)) = self.tok(i, ",") {
            let (r, x) = item(r)?;
            out.push(x);
            i = r;
        }
        Ok((i, out))
    }

    fn head_term<'a>(&self, i: &'a str) -> PResult<'a, HeadTerm> {
        if let Ok((r, word)) = self.raw_ident(i) {
            let kind = AggKind::ALL.into_iter().find(|k| k.keyword() == word);
            if let (Some(kind), Ok((r, _))) = (kind, self.ws(r).and_then(|(r, _)| self.tok(r, "("))) {
                let (r, args) = self.list(r, |x| self.expr(x))?;
                // `min(a, b)` and `max(a, b)` are the two-argument functions.
                let function = matches!(kind, AggKind::Min | AggKind::Max) && args.len() == 2;
                if !function {
                    let (r2, _) = self.tok(r, ")").or_else(|_| fail(r, "`,` or `)`"))?;
                    let mut end = self.pos(r) + 1;
                    let (r2, default) = match self.keyword(r2, "default") {
                        Ok((r3, ())) => {
                            let (r4, e) = commit(self.expr(r3))?;
                            end = e.span.end;
                            (r4, Some(Box::new(e)))
                        }
                        Err(_) => (r2, None),
                    };
                    let span = Span::new(self.file, self.pos(i), end);
                    return Ok((r2, HeadTerm::Agg(kind, args, default, span)));
                }
            }
        }
        self.expr(i).map(|(r, e)| (r, HeadTerm::Expr(e)))
    }

    fn atom<'a>(&self, i: &'a str) -> PResult<'a, Atom> {
        let (r, relation) = self.ident(i, "a relation name")?;
        let (r, _) = self.tok(r, "(")?;
        let (r, args) = self.list(r, |x| self.expr(x))?;
        let (r2, _) = self.tok(r, ")").or_else(|_| fail(r, "`,` or `)`"))?;
        let span = Span::new(self.file, self.pos(i), self.pos(r) + 1);
        Ok((r2, Atom { relation, args, span }))
    }

    fn body_item<'a>(&self, i: &'a str) -> PResult<'a, BodyItem> {
        if let Ok((r, ())) = self.keyword(i, "not") {
            let (r, a) = commit(self.atom(r))?;
            return Ok((r, BodyItem::Neg(a)));
        }
        // `rel(` starts an atom — unless it is a function compared with
        // something (`len(s) > 3`).
        if let Ok((r, word)) = self.raw_ident(i) {
            if self.ws(r).map_or(false, |(r, _)| r.starts_with('(')) {
                let (r, a) = self.atom(i)?;
                let compared = Func::from_name(word).is_some() && (self.cmp_op(r).is_ok() || self.bin_op(r).is_some());
                if !compared {
                    return Ok((r, BodyItem::Pos(a)));
                }
            }
            // `v in lo..hi`
            if let Ok((r2, v)) = self.ident(i, "a variable") {
                if let Ok((r3, ())) = self.keyword(r2, "in") {
                    let (r4, lo) = commit(self.expr(r3))?;
                    let (r5, _) = commit(self.tok(r4, "..").or_else(|_| fail(r4, "`..` (a range is `lo..hi`)")))?;
                    let (r6, hi) = commit(self.expr(r5))?;
                    let span = Span::new(self.file, self.pos(i), hi.span.end);
                    return Ok((r6, BodyItem::Range(v, lo, hi, span)));
                }
            }
        }
        let (r, lhs) = self.expr(i).or_else(|e| match e {
            nom::Err::Error(_) => fail(i, "an atom, `not` atom, comparison or range"),
            failure => Err(failure),
        })?;
        let (r, op) = self.cmp_op(r)?;
        let (r, rhs) = commit(self.expr(r))?;
        let span = lhs.span.to(rhs.span);
        Ok((r, BodyItem::Cmp(op, lhs, rhs, span)))
    }

    fn cmp_op<'a>(&self, i: &'a str) -> PResult<'a, CmpOp> {
        let ops = [("!=", CmpOp::Ne), ("<=", CmpOp::Le), (">=", CmpOp::Ge), ("<", CmpOp::Lt), (">", CmpOp::Gt), ("=", CmpOp::Eq)];
        for (t, op) in ops {
            if let Ok((r, _)) = self.tok(i, t) {
                return Ok((r, op));
            }
        }
        fail(i, "a comparison (= != < <= > >=)")
    }

    /// Precedence climbing over `++` < `+ -` < `* / %`.
    fn expr<'a>(&self, i: &'a str) -> PResult<'a, Expr> {
        self.expr_at(i, 0).map(|(r, (e, _))| (r, e))
    }

    /// An expression `level` nestings below the statement's; comes back
    /// with its own height. Both are bounded by [`MAX_NESTING`], so neither
    /// this parser nor any later pass over the tree (checker, evaluator,
    /// drop) can recurse without bound.
    fn expr_at<'a>(&self, i: &'a str, level: usize) -> PResult<'a, (Expr, usize)> {
        self.expr_prec(i, 1, level)
    }

    fn expr_prec<'a>(&self, i: &'a str, min_prec: u8, level: usize) -> PResult<'a, (Expr, usize)> {
        let start = i;
        let (mut i, (mut lhs, mut height)) = self.unary(i, level)?;
        loop {
            let Some((r, op)) = self.bin_op(i) else { break };
            if op.precedence() < min_prec {
                break;
            }
            let (r, (rhs, rhs_height)) = commit(self.expr_prec(r, op.precedence() + 1, self.nest(r, level)?))?;
            height = self.grow(start, height.max(rhs_height))?;
            let span = lhs.span.to(rhs.span);
            lhs = Expr { kind: ExprKind::Bin(op, Box::new(lhs), Box::new(rhs)), span };
            i = r;
        }
        Ok((i, (lhs, height)))
    }

    /// One nesting level down from `level`, refused past [`MAX_NESTING`].
    fn nest(&self, at: &str, level: usize) -> Result<usize, nom::Err<SyntaxError>> {
        if level >= MAX_NESTING {
            return Err(too_deep(at));
        }
        Ok(level + 1)
    }

    /// The height of a node over children `height` high, refused past
    /// [`MAX_NESTING`] (a long chain `a + a + … + a` nests to the left).
    fn grow(&self, at: &str, height: usize) -> Result<usize, nom::Err<SyntaxError>> {
        if height >= MAX_NESTING {
            return Err(too_deep(at));
        }
        Ok(height + 1)
    }

    fn bin_op<'a>(&self, i: &'a str) -> Option<(&'a str, BinOp)> {
        let ops = [("++", BinOp::Concat), ("+", BinOp::Add), ("-", BinOp::Sub), ("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Rem)];
        for (t, op) in ops {
            if i.starts_with(t) {
                return self.tok(i, t).ok().map(|(r, _)| (r, op));
            }
        }
        None
    }

    fn unary<'a>(&self, i: &'a str, level: usize) -> PResult<'a, (Expr, usize)> {
        if let Ok((r, _)) = self.tok(i, "-") {
            // `-<digits>` is a negative literal (so i64::MIN is writable).
            if let Ok((r2, digits)) = digit1::<_, SyntaxError>(r) {
                if !r2.starts_with(is_ident_char) {
                    let n = format!("-{digits}")
                        .parse::<i64>()
                        .map_err(|_| nom::Err::Failure(SyntaxError { remaining: r.len(), expected: "an integer that fits in 64 bits".into() }))?;
                    let span = self.span(i, r2);
                    let (r2, _) = self.ws(r2)?;
                    return Ok((r2, (Expr { kind: ExprKind::Lit(Literal::Int(n)), span }, 1)));
                }
            }
            let (r, (inner, height)) = commit(self.unary(r, self.nest(i, level)?))?;
            let span = Span::new(self.file, self.pos(i), inner.span.end);
            return Ok((r, (Expr { kind: ExprKind::Neg(Box::new(inner)), span }, self.grow(i, height)?)));
        }
        self.primary(i, level)
    }

    /// A leaf, a parenthesised expression or a call; parentheses count as
    /// a nesting level of their own.
    fn primary<'a>(&self, i: &'a str, level: usize) -> PResult<'a, (Expr, usize)> {
        if i.starts_with('"') {
            let (r, (s, span)) = self.string_lit(i)?;
            return Ok((r, (Expr { kind: ExprKind::Lit(Literal::Str(s)), span }, 1)));
        }
        if let Ok((r, _)) = self.tok(i, "(") {
            let (r, (mut e, height)) = commit(self.expr_at(r, self.nest(i, level)?))?;
            let (r2, _) = commit(self.tok(r, ")"))?;
            e.span = Span::new(self.file, self.pos(i), self.pos(r) + 1);
            return Ok((r2, (e, self.grow(i, height)?)));
        }
        if let Ok((r, digits)) = digit1::<_, SyntaxError>(i) {
            if r.starts_with(is_ident_char) {
                return fail(r, "an operator or `,` after a number");
            }
            let span = self.span(i, r);
            // digits are ASCII 0-9; only overflow can fail.
            let n =
                digits.parse::<i64>().map_err(|_| nom::Err::Failure(SyntaxError { remaining: i.len(), expected: "an integer that fits in 64 bits".into() }))?;
            let (r, _) = self.ws(r)?;
            return Ok((r, (Expr { kind: ExprKind::Lit(Literal::Int(n)), span }, 1)));
        }
        if let Ok((r, name)) = take_while1::<_, _, SyntaxError>(is_ident_char).parse(i) {
            if name == "true" || name == "false" {
                let span = self.span(i, r);
                let (r, _) = self.ws(r)?;
                return Ok((r, (Expr { kind: ExprKind::Lit(Literal::Str(name.to_string())), span }, 1)));
            }
            if name.starts_with(is_ident_start) {
                if KEYWORDS.contains(&name) {
                    return fail(i, format!("an expression (`{name}` is a keyword)"));
                }
                let span = self.span(i, r);
                let (r2, _) = self.ws(r)?;
                if r2.starts_with('(') {
                    let Some(func) = Func::from_name(name) else {
                        let known = Func::ALL.map(Func::name).join(", ");
                        return fail(
                            r2,
                            format!("an operator (`{name}` is not a function; the functions are {known}; a relation is used as an atom in a rule body)"),
                        );
                    };
                    let (r3, _) = self.tok(r2, "(")?;
                    let inner = self.nest(r2, level)?;
                    let (r3, args) = commit(self.list(r3, |x| self.expr_at(x, inner)))?;
                    let height = self.grow(r2, args.iter().map(|(_, h)| *h).max().unwrap_or(0))?;
                    let args = args.into_iter().map(|(e, _)| e).collect();
                    let close = self.pos(r3) + 1;
                    let (r3, _) = commit(self.tok(r3, ")").or_else(|_| fail(r3, "`,` or `)`")))?;
                    return Ok((r3, (Expr { kind: ExprKind::Call(func, args), span: Span::new(self.file, self.pos(i), close) }, height)));
                }
                let kind = if name == "_" { ExprKind::Wildcard } else { ExprKind::Var(name.to_string()) };
                return Ok((r2, (Expr { kind, span }, 1)));
            }
        }
        fail(i, "a value: a variable, a number, a \"string\" or `(`")
    }
}
