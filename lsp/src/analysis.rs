//! What the server knows about one program (the rule files of a directory):
//! the checker's verdict and every place a relation or a type is named.
//! Pure: text in, answers out; the protocol lives in `server.rs`.

use ccattler_parser::ast::{self, AggKind, Func, Item, KEYWORDS};
use ccattler_parser::{describe, syntax, Checked, Sources, Span};

/// Whether a name is a relation or a declared type (they live apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    Relation,
    Type,
}

/// One place a relation or a type is named.
#[derive(Clone, Debug)]
pub struct Occurrence {
    pub name: String,
    pub namespace: Namespace,
    pub span: Span,
    /// Its declaration (as opposed to a use).
    pub declaration: bool,
}

/// One completion offered to the editor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub label: String,
    pub kind: CompletionKind,
    /// One line: a relation's signature, a function's use.
    pub detail: String,
    pub doc: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    Relation,
    Type,
    Function,
    Keyword,
}

pub struct Analysis {
    pub checked: Checked,
    files: Vec<ast::File>,
    occurrences: Vec<Occurrence>,
}

impl Analysis {
    /// Parses and checks `sources` (one program) and indexes its names. A
    /// file with syntax errors still contributes what parsed.
    pub fn new(sources: Sources) -> Analysis {
        let files: Vec<ast::File> = sources.ids().map(|id| syntax::parse_file(id, sources.text(id)).0).collect();
        let mut occurrences = Vec::new();
        for file in &files {
            index(file, &mut occurrences);
        }
        let checked = ccattler_parser::check_sources(sources);
        Analysis { checked, files, occurrences }
    }

    pub fn sources(&self) -> &Sources {
        &self.checked.sources
    }

    /// The name under byte `offset` of `file`, if a relation or a type is
    /// named there (the end of a name counts, as editors place the cursor
    /// after the word).
    pub fn occurrence_at(&self, file: usize, offset: usize) -> Option<&Occurrence> {
        self.occurrences.iter().find(|o| o.span.file == file && o.span.start <= offset && offset <= o.span.end)
    }

    /// Where the name under the cursor is declared.
    pub fn definition(&self, file: usize, offset: usize) -> Vec<Span> {
        let Some(at) = self.occurrence_at(file, offset) else { return vec![] };
        self.same(at).filter(|o| o.declaration).map(|o| o.span).collect()
    }

    /// Every place the name under the cursor is named, its declaration
    /// included or not.
    pub fn references(&self, file: usize, offset: usize, include_declaration: bool) -> Vec<Span> {
        let Some(at) = self.occurrence_at(file, offset) else { return vec![] };
        self.same(at).filter(|o| include_declaration || !o.declaration).map(|o| o.span).collect()
    }

    fn same<'a>(&'a self, at: &'a Occurrence) -> impl Iterator<Item = &'a Occurrence> + 'a {
        self.occurrences.iter().filter(move |o| o.name == at.name && o.namespace == at.namespace)
    }

    /// Markdown for the name under the cursor: a relation's kind, key
    /// pattern, columns with their types, doc comment and the rules that
    /// derive and read it (`ccattler describe`'s text); a type's definition
    /// and doc. Also the built-in functions and aggregates.
    pub fn hover(&self, file: usize, offset: usize) -> Option<(String, Span)> {
        if let Some(at) = self.occurrence_at(file, offset) {
            let text = match at.namespace {
                Namespace::Relation => self.relation_hover(&at.name)?,
                Namespace::Type => self.type_hover(&at.name)?,
            };
            return Some((text, at.span));
        }
        let (word, span) = word_at(self.sources().text(file), offset)?;
        let span = Span::new(file, span.0, span.1);
        if let Some(text) = self.variable_hover(file, span, word) {
            return Some((text, span));
        }
        if let Some(f) = Func::from_name(word) {
            return Some((format!("```\n{}\n```\n{}", function_signature(f), function_doc(f)), span));
        }
        AggKind::ALL
            .into_iter()
            .find(|k| k.keyword() == word)
            .map(|k| (format!("```\n{}\n```\nAn aggregate over the rule body's matches (see docs/language.md).", aggregate_signature(k)), span))
    }

    /// A variable of the rule under the cursor: its type and every atom
    /// column that binds it (`n: name — node(n) column n`).
    fn variable_hover(&self, file: usize, span: Span, word: &str) -> Option<String> {
        let rule = self.files.get(file)?.items.iter().find_map(|i| match i {
            Item::Rule(r) if r.span.start <= span.start && span.end <= r.span.end => Some(r),
            _ => None,
        })?;
        let is_var = |e: &ast::Expr| matches!(&e.kind, ast::ExprKind::Var(v) if v == word);
        let mut bound = Vec::new();
        let atoms = rule.body.iter().filter_map(|b| match b {
            ast::BodyItem::Pos(a) => Some((a, "")),
            ast::BodyItem::Neg(a) => Some((a, "not ")),
            _ => None,
        });
        for (atom, not) in atoms.chain(rule.per.iter().map(|a| (a, "per "))) {
            for (pos, arg) in atom.args.iter().enumerate() {
                if !is_var(arg) {
                    continue;
                }
                let column = self.column(&atom.relation.name, pos);
                let (col, ty) = column.map_or(("?".to_string(), "?".to_string()), |(c, t)| (c, t));
                bound.push((ty, format!("{not}{}(…) column `{col}`", atom.relation.name)));
            }
        }
        let ranged = rule.body.iter().any(|b| matches!(b, ast::BodyItem::Range(v, ..) if v.name == word));
        if bound.is_empty() && !ranged {
            let assigned = rule.body.iter().any(|b| matches!(b, ast::BodyItem::Cmp(ast::CmpOp::Eq, l, _, _) if is_var(l)));
            if !assigned {
                return None;
            }
            return Some(format!(
                "```
{word}
```
A variable of this rule, bound by `{word} = …`."
            ));
        }
        let ty = if ranged { "int".to_string() } else { bound[0].0.clone() };
        let mut text = format!(
            "```
{word}: {ty}
```
A variable of this rule"
        );
        if ranged {
            text += ", bound by a range (`in lo..hi`)";
        }
        if !bound.is_empty() {
            text += &format!(": {}", bound.iter().map(|(_, b)| b.as_str()).collect::<Vec<_>>().join(", "));
        }
        Some(text + ".")
    }

    /// The name and type of column `pos` of relation `name` (a named type by its name).
    fn column(&self, name: &str, pos: usize) -> Option<(String, String)> {
        self.files.iter().flat_map(|f| &f.items).find_map(|i| match i {
            Item::Decl(d) if d.name.name == name => {
                let c = d.columns.get(pos)?;
                Some((c.name.name.clone(), c.ty_name.clone().unwrap_or_else(|| format!("{:?}", c.ty).to_lowercase())))
            }
            _ => None,
        })
    }

    fn relation_hover(&self, name: &str) -> Option<String> {
        // From the checked program when there is one (it knows the rules and
        // the named types); from the declaration as written otherwise.
        if let Some(program) = &self.checked.program {
            if let Some(rel) = program.relation(name) {
                return Some(format!("```text\n{}```", describe::render(&describe::relation(program, rel))));
            }
        }
        let decl = self.files.iter().flat_map(|f| &f.items).find_map(|i| match i {
            Item::Decl(d) if d.name.name == name => Some(d),
            _ => None,
        })?;
        Some(self.declaration_hover(decl.span, decl.doc.as_deref()))
    }

    /// A declaration as written, then its `///` doc.
    fn declaration_hover(&self, span: Span, doc: Option<&str>) -> String {
        let mut s = format!("```rules\n{}\n```", self.sources().slice(span));
        if let Some(doc) = doc {
            s += &format!("\n{doc}");
        }
        s
    }

    fn type_hover(&self, name: &str) -> Option<String> {
        let builtin = match name {
            "string" => Some("any text"),
            "name" => Some("text that satisfies `[a-z0-9]([a-z0-9._-]*[a-z0-9])?`, at most 63 characters"),
            "int" => Some("a 64-bit signed integer"),
            "bool" => Some("`true` or `false`"),
            _ => None,
        };
        if let Some(what) = builtin {
            return Some(format!("```rules\n{name}\n```\n{what}"));
        }
        let decl = self.files.iter().flat_map(|f| &f.items).find_map(|i| match i {
            Item::Type(t) if t.name.name == name => Some(t),
            _ => None,
        })?;
        Some(self.declaration_hover(decl.span, decl.doc.as_deref()))
    }

    /// What may be typed at `offset`: types after a column's `:`, otherwise
    /// the program's relations, the functions, aggregates and keywords.
    pub fn completions(&self, file: usize, offset: usize) -> Vec<Completion> {
        let text = self.sources().text(file);
        let mut start = offset.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let before = text[..start].trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let in_type_position = before.trim_end().ends_with(':') && !before.trim_end().ends_with(":-");
        let mut out = Vec::new();
        let types = ["string", "name", "int", "bool"].map(|t| (t.to_string(), None));
        let declared = self.files.iter().flat_map(|f| &f.items).filter_map(|i| match i {
            Item::Type(t) => Some((t.name.name.clone(), t.doc.clone())),
            _ => None,
        });
        for (label, doc) in types.into_iter().chain(declared) {
            let detail = self.type_hover(&label).unwrap_or_default().lines().nth(1).unwrap_or_default().to_string();
            out.push(Completion { label, kind: CompletionKind::Type, detail, doc });
        }
        if in_type_position {
            let typed = &text[before.len()..start];
            out.retain(|c| c.label.starts_with(typed));
            return out;
        }
        out.clear();
        let mut seen = std::collections::HashSet::new();
        for item in self.files.iter().flat_map(|f| &f.items) {
            if let Item::Decl(d) = item {
                if seen.insert(d.name.name.clone()) {
                    let detail = self.sources().slice(d.span).split_whitespace().collect::<Vec<_>>().join(" ");
                    out.push(Completion { label: d.name.name.clone(), kind: CompletionKind::Relation, detail, doc: d.doc.clone() });
                }
            }
        }
        for f in Func::ALL {
            out.push(Completion {
                label: f.name().to_string(),
                kind: CompletionKind::Function,
                detail: function_signature(f),
                doc: Some(function_doc(f).to_string()),
            });
        }
        for k in AggKind::ALL {
            if Func::from_name(k.keyword()).is_none() {
                out.push(Completion { label: k.keyword().to_string(), kind: CompletionKind::Function, detail: aggregate_signature(k), doc: None });
            }
        }
        for k in KEYWORDS {
            out.push(Completion { label: k.to_string(), kind: CompletionKind::Keyword, detail: String::new(), doc: None });
        }
        // Only what continues the word being typed.
        let typed = &text[before.len()..start];
        out.retain(|c| c.label.starts_with(typed));
        out
    }
}

/// Records every relation and type named in `file`.
fn index(file: &ast::File, out: &mut Vec<Occurrence>) {
    let mut add = |ident: &ast::Ident, namespace, declaration| {
        out.push(Occurrence { name: ident.name.clone(), namespace, span: ident.span, declaration });
    };
    for item in &file.items {
        match item {
            Item::Decl(d) => {
                add(&d.name, Namespace::Relation, true);
                for c in &d.columns {
                    let name = c.ty_name.clone().unwrap_or_else(|| c.ty.keyword().to_string());
                    add(&ast::Ident { name, span: c.ty_span }, Namespace::Type, false);
                }
                for a in d.builtin.iter().flat_map(|b| &b.args) {
                    add(a, Namespace::Relation, false);
                }
            }
            Item::Type(t) => add(&t.name, Namespace::Type, true),
            Item::Rule(r) => {
                add(&r.head, Namespace::Relation, false);
                for b in &r.body {
                    if let ast::BodyItem::Pos(a) | ast::BodyItem::Neg(a) = b {
                        add(&a.relation, Namespace::Relation, false);
                    }
                }
                if let Some(p) = &r.per {
                    add(&p.relation, Namespace::Relation, false);
                }
            }
        }
    }
}

/// The identifier-like word around byte `offset`, with its byte range.
fn word_at(text: &str, offset: usize) -> Option<(&str, (usize, usize))> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let start = text[..offset].rfind(|c: char| !is_word(c)).map_or(0, |i| i + 1);
    let end = text[offset..].find(|c: char| !is_word(c)).map_or(text.len(), |i| offset + i);
    (start < end).then(|| (&text[start..end], (start, end)))
}

fn function_signature(f: Func) -> String {
    match f {
        Func::Len => "len(text) -> int",
        Func::Bytes => "bytes(text) -> int",
        Func::Min => "min(a, b) -> the smaller (ints or texts)",
        Func::Max => "max(a, b) -> the larger (ints or texts)",
        Func::StartsWith => "starts_with(text, prefix) -> bool",
        Func::InNetwork => "in_network(address, networks) -> bool",
        Func::Contains => "contains(text, part) -> bool",
        Func::ToString => "to_string(int) -> string",
        Func::Before => "before(text, separator) -> string",
        Func::After => "after(text, separator) -> string",
    }
    .to_string()
}

fn function_doc(f: Func) -> &'static str {
    match f {
        Func::Len => "The number of characters of the text.",
        Func::Bytes => "The number of bytes of the text in UTF-8 (what an environment or etcd counts).",
        Func::Min => "With two arguments, the smaller one; with one, in a head, the aggregate.",
        Func::Max => "With two arguments, the larger one; with one, in a head, the aggregate.",
        Func::StartsWith => "`true` if the text starts with the prefix; usable alone as a body literal.",
        Func::InNetwork => "`true` if the IP address lies in one of the comma-separated CIDR networks; usable alone as a body literal.",
        Func::Contains => "`true` if the part occurs in the text; usable alone as a body literal.",
        Func::ToString => "The decimal text of an int.",
        Func::Before => "The text before the first separator (all of it if there is none).",
        Func::After => "The text after the first separator (\"\" if there is none).",
    }
}

fn aggregate_signature(k: AggKind) -> String {
    match k {
        AggKind::Count => "count() — the number of body matches".into(),
        AggKind::Sum => "sum(e) — the sum of e over the body matches".into(),
        AggKind::Min => "min(e) — the smallest e".into(),
        AggKind::Max => "max(e) — the largest e".into(),
        AggKind::ArgMax => "arg_max(v, k) — the v of the match with the largest k".into(),
        AggKind::ArgMin => "arg_min(v, k) — the v of the match with the smallest k".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "/// Nodes that exist.\ninput node(n: name) from \"n/{n}\"\ntype port = int in 1..=65535\noutput open(n: name, p: port) to \"o/{n}\"\nopen(n, 80) :- node(n).\n";

    fn analysis(text: &str) -> Analysis {
        let mut s = Sources::new();
        s.add("a.rules", text);
        Analysis::new(s)
    }

    #[test]
    fn definition_and_references_of_a_relation_from_its_use() {
        let a = analysis(RULES);
        let use_at = RULES.rfind("node(n)").unwrap() + 2;
        let def = a.definition(0, use_at);
        assert_eq!(def.len(), 1);
        assert_eq!(a.sources().slice(def[0]), "node");
        assert_eq!(def[0].start, RULES.find("node(").unwrap());
        assert_eq!(a.references(0, use_at, true).len(), 2);
        assert_eq!(a.references(0, use_at, false).len(), 1);
    }

    #[test]
    fn a_type_goes_to_its_type_declaration() {
        let a = analysis(RULES);
        let def = a.definition(0, RULES.find("p: port").unwrap() + 4);
        assert_eq!(def.len(), 1);
        assert_eq!(def[0].start, RULES.find("port =").unwrap());
    }

    #[test]
    fn hover_shows_pattern_columns_and_doc() {
        let a = analysis(RULES);
        let (text, _) = a.hover(0, RULES.rfind("node(n)").unwrap()).unwrap();
        assert!(text.contains("Nodes that exist."), "{text}");
        assert!(text.contains("n/{n}"), "{text}");
        assert!(text.contains("read by"), "{text}");
        let (text, _) = a.hover(0, RULES.find("port =").unwrap()).unwrap();
        assert!(text.contains("1..=65535"), "{text}");
    }

    #[test]
    fn hover_works_while_the_program_has_errors() {
        let broken = format!("{RULES}open(n, 1) :- nod(n).\nbroken(");
        let a = analysis(&broken);
        assert!(a.checked.program.is_none());
        let (text, _) = a.hover(0, broken.find("node(").unwrap()).unwrap();
        assert!(text.contains("Nodes that exist."), "{text}");
    }

    #[test]
    fn completion_offers_types_after_a_colon_and_relations_elsewhere() {
        let text = "input node(n: na";
        let a = analysis(text);
        let c = a.completions(0, text.len());
        assert!(c.iter().all(|c| c.kind == CompletionKind::Type), "{c:?}");
        assert!(c.iter().any(|c| c.label == "name"));
        let c = analysis(RULES).completions(0, RULES.len());
        assert!(c.iter().any(|c| c.label == "node" && c.kind == CompletionKind::Relation && c.doc.as_deref() == Some("Nodes that exist.")));
        assert!(c.iter().any(|c| c.label == "starts_with"));
        assert!(c.iter().any(|c| c.label == "count"));
    }

    #[test]
    fn nothing_under_a_variable() {
        let a = analysis(RULES);
        assert!(a.definition(0, RULES.rfind("(n)").unwrap() + 1).is_empty());
    }

    #[test]
    fn completion_keeps_only_what_continues_the_word_typed() {
        let text = format!("{RULES}open(n, 1) :- no");
        let c = analysis(&text).completions(0, text.len());
        assert!(!c.is_empty() && c.iter().all(|c| c.label.starts_with("no")), "{c:?}");
        assert!(c.iter().any(|c| c.label == "node"), "{c:?}");
        let text = "input node(n: na";
        let c = analysis(text).completions(0, text.len());
        assert_eq!(c.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(), ["name"]);
    }

    #[test]
    fn hover_on_a_variable_shows_its_type_and_what_binds_it() {
        let a = analysis(RULES);
        let at = RULES.rfind("(n)").unwrap() + 1;
        let (text, _) = a.hover(0, at).expect("a variable hovers");
        assert!(text.contains("n: name"), "{text}");
        assert!(text.contains("node(…) column `n`"), "{text}");
    }
}
