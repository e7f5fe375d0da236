//! What a relation or a key is, from the rules alone: `ccattler describe`
//! and the language server's hover.

use crate::ast::DeclKind;
use crate::program::{Lit, Program, RelId};
use serde::Serialize;

/// One relation, as a rule author wants to know it.
#[derive(Clone, Debug, Serialize)]
pub struct Description {
    pub relation: String,
    /// `input`, `output` or `relation`.
    pub kind: &'static str,
    /// `file:line` of the declaration.
    pub declared: String,
    pub doc: Option<String>,
    /// Its key pattern, for inputs and outputs.
    pub pattern: Option<String>,
    pub columns: Vec<ColumnInfo>,
    /// Rules that derive it (`file:line` and text).
    pub derived_by: Vec<RuleRef>,
    /// Rules that read it.
    pub read_by: Vec<RuleRef>,
    /// For a key asked about: each column's value in it (the value column
    /// shows as `=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_values: Option<Vec<(String, String)>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ColumnInfo {
    pub name: String,
    /// `int`, `string`, `name`, or a named type with what it admits.
    pub ty: String,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuleRef {
    pub location: String,
    pub text: String,
}

fn kind(k: DeclKind) -> &'static str {
    match k {
        DeclKind::Input => "input",
        DeclKind::Output => "output",
        DeclKind::Relation => "relation",
    }
}

/// Describes relation `rel`.
pub fn relation(program: &Program, rel: RelId) -> Description {
    let r = &program.relations[rel];
    let rule_ref = |id| RuleRef { location: program.rule_location(id), text: program.rule_text(id).split_whitespace().collect::<Vec<_>>().join(" ") };
    let mut derived_by: Vec<RuleRef> = program.rules.iter().filter(|x| x.head == rel).map(|x| rule_ref(x.id)).collect();
    let mut read_by: Vec<RuleRef> = program
        .rules
        .iter()
        .filter(|x| x.body.iter().any(|b| matches!(&b.lit, Lit::Pos { rel: r2, .. } | Lit::Neg { rel: r2, .. } if *r2 == rel)))
        .map(|x| rule_ref(x.id))
        .collect();
    derived_by.dedup();
    read_by.dedup();
    let columns = r
        .columns
        .iter()
        .map(|c| ColumnInfo {
            name: c.name.clone(),
            ty: match &c.constraint {
                Some(k) => format!("{} ({})", k.name, k.describe()),
                None => c.ty.keyword().to_string(),
            },
        })
        .collect();
    let (line, _) = program.sources.line_col(r.span.file, r.span.start);
    Description {
        relation: r.name.clone(),
        kind: kind(r.kind),
        declared: format!("{}:{line}", program.sources.name(r.span.file)),
        doc: r.doc.clone(),
        pattern: r.pattern.as_ref().map(|p| p.text.clone()),
        columns,
        derived_by,
        read_by,
        key_values: None,
    }
}

/// The relations whose key patterns match `key` (inputs first), each with
/// the key's values.
pub fn key(program: &Program, key: &str) -> Vec<Description> {
    let mut out = Vec::new();
    for rel in program.keys.relations_for(key) {
        let r = &program.relations[rel];
        let Some(p) = &r.pattern else { continue };
        let Some(parts) = p.match_key(key) else { continue };
        let mut d = relation(program, rel);
        d.key_values = Some(r.columns.iter().zip(parts).map(|(c, v)| (c.name.clone(), v.map_or("= (the value)".to_string(), str::to_string))).collect());
        out.push(d);
    }
    out.sort_by_key(|d| d.kind != "input");
    out
}

/// Every relation users declared (not the checker's hidden ones), by name.
pub fn all(program: &Program) -> Vec<Description> {
    let mut out: Vec<Description> = (0..program.relations.len()).filter(|r| !program.relations[*r].name.contains('#')).map(|r| relation(program, r)).collect();
    out.sort_by(|a, b| a.relation.cmp(&b.relation));
    out
}

/// Text for a terminal.
pub fn render(d: &Description) -> String {
    let mut s = format!("{} {} — {}\n", d.kind, d.relation, d.declared);
    if let Some(doc) = &d.doc {
        for l in doc.lines() {
            s += &format!("  {l}\n");
        }
    }
    if let Some(p) = &d.pattern {
        let dir = if d.kind == "input" { "read from" } else { "written to" };
        s += &format!("  {dir}: {p}\n");
    }
    let cols: Vec<String> = d.columns.iter().map(|c| format!("{}: {}", c.name, c.ty)).collect();
    s += &format!("  columns: {}\n", cols.join(", "));
    if let Some(vals) = &d.key_values {
        let v: Vec<String> = vals.iter().map(|(c, v)| format!("{c} {}", if v.starts_with('=') { v.clone() } else { format!("= {v:?}") })).collect();
        s += &format!("  this key: {}\n", v.join(", "));
    }
    for (what, rules) in [("derived by", &d.derived_by), ("read by", &d.read_by)] {
        if rules.is_empty() {
            continue;
        }
        s += &format!("  {what}:\n");
        for r in rules {
            s += &format!("    {}  {}\n", r.location, r.text);
        }
    }
    s
}
