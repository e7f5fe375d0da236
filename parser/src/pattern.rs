//! Key patterns: `"intent/{writer}/service/{service}/instances"`. A placeholder
//! is a whole `/`-separated segment naming a column; the one column that is not in
//! the pattern, if any, holds the key's value.

/// One `/`-separated part of a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Lit(String),
    /// A placeholder: the column index it binds.
    Col(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPattern {
    pub text: String,
    pub segments: Vec<Segment>,
    /// The column that takes the key's value; `None` for a presence fact.
    pub value_column: Option<usize>,
}

/// Why a pattern text does not fit its relation's columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatternError {
    EmptySegment,
    UnknownColumn(String),
    RepeatedColumn(String),
    /// A placeholder mixed with text in one segment, or a stray brace.
    BadSegment(String),
    /// More than one column is not in the pattern.
    TooManyValueColumns(Vec<String>),
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatternError::EmptySegment => write!(f, "key pattern has an empty segment (`//`, or a leading or trailing `/`)"),
            PatternError::UnknownColumn(c) => write!(f, "placeholder `{{{c}}}` names no column"),
            PatternError::RepeatedColumn(c) => write!(f, "placeholder `{{{c}}}` appears twice"),
            PatternError::BadSegment(s) => write!(f, "segment `{s}` mixes a placeholder with text"),
            PatternError::TooManyValueColumns(cs) => {
                write!(f, "columns {} are not in the key pattern; at most one column can take the value", cs.join(", "))
            }
        }
    }
}

impl KeyPattern {
    /// Parses `text` against the relation's column names.
    pub fn parse(text: &str, columns: &[&str]) -> Result<KeyPattern, PatternError> {
        let mut segments = Vec::new();
        let mut seen = vec![false; columns.len()];
        for seg in text.split('/') {
            if seg.is_empty() {
                return Err(PatternError::EmptySegment);
            }
            if let Some(inner) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                if inner.contains(['{', '}']) {
                    return Err(PatternError::BadSegment(seg.to_string()));
                }
                let Some(col) = columns.iter().position(|c| *c == inner) else {
                    return Err(PatternError::UnknownColumn(inner.to_string()));
                };
                if std::mem::replace(&mut seen[col], true) {
                    return Err(PatternError::RepeatedColumn(inner.to_string()));
                }
                segments.push(Segment::Col(col));
            } else if seg.contains(['{', '}']) {
                return Err(PatternError::BadSegment(seg.to_string()));
            } else {
                segments.push(Segment::Lit(seg.to_string()));
            }
        }
        let missing: Vec<usize> = (0..columns.len()).filter(|c| !seen[*c]).collect();
        if missing.len() > 1 {
            return Err(PatternError::TooManyValueColumns(missing.iter().map(|c| columns[*c].to_string()).collect()));
        }
        Ok(KeyPattern { text: text.to_string(), segments, value_column: missing.first().copied() })
    }

    /// Matches a key; on success returns each placeholder's text by column
    /// (`None` at the value column).
    pub fn match_key<'k>(&self, key: &'k str) -> Option<Vec<Option<&'k str>>> {
        // Most keys fail on a literal: nothing is allocated until a placeholder binds.
        let columns = || vec![None; self.segments.iter().filter(|s| matches!(s, Segment::Col(_))).count() + usize::from(self.value_column.is_some())];
        let mut out = Vec::new();
        let mut parts = key.split('/');
        for seg in &self.segments {
            let part = parts.next()?;
            match seg {
                Segment::Lit(l) => {
                    if l != part {
                        return None;
                    }
                }
                Segment::Col(c) => {
                    if part.is_empty() {
                        return None;
                    }
                    if out.is_empty() {
                        out = columns();
                    }
                    out[*c] = Some(part);
                }
            }
        }
        if parts.next().is_some() {
            return None;
        }
        if out.is_empty() {
            out = columns();
        }
        Some(out)
    }

    /// Builds a key from each column's text (the value column's entry is ignored).
    pub fn render(&self, cols: &[String]) -> String {
        self.prefix_with(|c| Some(&cols[c]))
    }

    /// The literal text of every key whose leading placeholders have the
    /// given values: up to the first placeholder `bound` has no value for
    /// (ending in `/`), or the whole key when all are bound.
    pub fn prefix_with<S: AsRef<str>>(&self, bound: impl Fn(usize) -> Option<S>) -> String {
        let mut p = String::new();
        for (i, seg) in self.segments.iter().enumerate() {
            if i > 0 {
                p.push('/');
            }
            match seg {
                Segment::Lit(l) => p.push_str(l),
                Segment::Col(c) => match bound(*c) {
                    Some(v) => p.push_str(v.as_ref()),
                    None => return p,
                },
            }
        }
        p
    }

    /// The literal text before the first placeholder: what to read or watch
    /// in etcd (the whole key for a pattern without placeholders).
    pub fn prefix(&self) -> String {
        self.prefix_with(|_| None::<&str>)
    }

    /// Whether some key could match both patterns.
    pub fn overlaps(&self, other: &KeyPattern) -> bool {
        self.segments.len() == other.segments.len()
            && self.segments.iter().zip(&other.segments).all(|(a, b)| match (a, b) {
                (Segment::Lit(x), Segment::Lit(y)) => x == y,
                _ => true,
            })
    }
}

impl KeyPattern {
    /// Whether some key this pattern matches starts with the segments of
    /// `prefix` (`exact`: is exactly that key).
    pub fn may_write(&self, prefix: &str, exact: bool) -> bool {
        let want: Vec<&str> = prefix.split('/').collect();
        if self.segments.len() < want.len() || (exact && self.segments.len() != want.len()) {
            return false;
        }
        self.segments.iter().zip(&want).all(|(s, w)| match s {
            Segment::Lit(x) => x == w,
            Segment::Col(_) => true,
        })
    }
}

/// Why `text` cannot be one segment of a key, if it cannot: rendering is
/// injective only if no segment is empty or holds a `/` (`t("a", "b/c")` and
/// `t("a/b", "c")` would both be `t/a/b/c`), and keys hold no control
/// characters.
pub fn segment_problem(text: &str) -> Option<String> {
    if text.is_empty() {
        return Some("is empty".into());
    }
    if text.contains('/') {
        return Some(format!("{text:?} holds a `/`"));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Some(format!("{text:?} holds the control character {:?}", c));
    }
    if text == "." || text == ".." {
        return Some(format!("{text:?} is a path step"));
    }
    None
}

impl KeyPattern {
    /// The key for each column's text, or why a placeholder's text cannot be
    /// a segment (named by its column): every key this returns matches the
    /// pattern and gives back exactly these texts.
    pub fn render_checked(&self, cols: &[String], names: &[&str]) -> Result<String, String> {
        for seg in &self.segments {
            if let Segment::Col(c) = seg {
                if let Some(problem) = segment_problem(&cols[*c]) {
                    return Err(format!("key segment `{}` {problem}", names.get(*c).copied().unwrap_or("?")));
                }
            }
        }
        Ok(self.render(cols))
    }
}

/// DESIGN's name rule: `[a-z0-9]([a-z0-9._-]*[a-z0-9])?`, at most 63 characters.
pub fn is_valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && b.len() <= 63 && edge(b[0]) && edge(b[b.len() - 1]) && b.iter().all(|&c| edge(c) || matches!(c, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_match_render() {
        let p = KeyPattern::parse("intent/{writer}/service/{service}/instances", &["writer", "service", "count"]).unwrap();
        assert_eq!(p.value_column, Some(2));
        assert_eq!(p.prefix(), "intent/");
        let m = p.match_key("intent/user/service/web/instances").unwrap();
        assert_eq!(m, vec![Some("user"), Some("web"), None]);
        assert!(p.match_key("intent/user/service/web/instances/x").is_none());
        assert!(p.match_key("intent/user/service/web").is_none());
        assert!(p.match_key("intent//service/web/instances").is_none());
        assert_eq!(p.render(&["user".into(), "web".into(), String::new()]), "intent/user/service/web/instances");
        // No placeholder: the value column alone, or nothing at all.
        let v = KeyPattern::parse("status/mode", &["mode"]).unwrap();
        assert_eq!(v.match_key("status/mode"), Some(vec![None]));
        assert_eq!(v.match_key("status/other"), None);
        let flag = KeyPattern::parse("status/paused", &[]).unwrap();
        assert_eq!(flag.match_key("status/paused"), Some(vec![]));
    }

    #[test]
    fn may_write_sees_placeholders_as_any_segment() {
        // Every column in the pattern, and one for the value.
        let p = |t: &str| {
            let mut cols: Vec<&str> = ["a", "b", "c"].into_iter().filter(|c| t.contains(&format!("{{{c}}}"))).collect();
            cols.push("v");
            KeyPattern::parse(t, &cols).unwrap()
        };
        assert!(p("status/leader").may_write("status/leader", true));
        assert!(p("status/{a}").may_write("status/leader", true));
        assert!(p("{a}/{b}").may_write("status/leader", true));
        assert!(!p("status/{a}/{b}").may_write("status/leader", true));
        assert!(p("{a}/node/{b}/{c}").may_write("secret", false));
        assert!(p("secret/{a}").may_write("secret", false));
        assert!(!p("status/{a}").may_write("secret", false));
        assert!(!p("status/leaders").may_write("status/leader", true));
    }

    #[test]
    fn pattern_errors() {
        assert_eq!(KeyPattern::parse("a/{x}/{y}", &["x"]), Err(PatternError::UnknownColumn("y".into())));
        assert_eq!(KeyPattern::parse("a/{x}/{x}", &["x"]), Err(PatternError::RepeatedColumn("x".into())));
        assert_eq!(KeyPattern::parse("a//b", &[]), Err(PatternError::EmptySegment));
        assert_eq!(KeyPattern::parse("a/x{y}", &["y"]), Err(PatternError::BadSegment("x{y}".into())));
        assert!(matches!(KeyPattern::parse("a", &["x", "y"]), Err(PatternError::TooManyValueColumns(_))));
        assert_eq!(KeyPattern::parse("status/leader", &[]).unwrap().prefix(), "status/leader");
    }

    #[test]
    fn overlap() {
        let a = KeyPattern::parse("e/{s}/x", &["s"]).unwrap();
        let b = KeyPattern::parse("e/web/{f}", &["f"]).unwrap();
        let c = KeyPattern::parse("e/{s}/y", &["s"]).unwrap();
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&c));
    }

    #[test]
    fn names() {
        for ok in ["web", "a", "node-1", "web-0", "a.b_c", "0"] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "Web", "-a", "a-", "a/b", "LOG_LEVEL", &"a".repeat(64)] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }
}
