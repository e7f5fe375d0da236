//! etcd keys and values ⇄ tuples. Inputs: a key enters every input relation
//! whose pattern it matches, or none if its value does not fit (rejected, with
//! the reason). Outputs: tuples become keys; two values for one key conflict.

use crate::runtime::Change;
use crate::value::{Row, Value};
use ccattler_parser::ast::DeclKind;
use ccattler_parser::program::{Program, RelId};
use std::collections::{BTreeMap, HashMap};

/// Values larger than this are rejected.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// How a key or value that is not UTF-8 reaches the engine (`ccattler_store`
/// marks it the same way): rejected, never read as text.
pub const NOT_UTF8: char = '\u{0}';

/// The key that records input key `key`'s rejection: `status/rejected/KEY`,
/// or `status/rejected/not-utf8/HEX` for a key that is not UTF-8.
pub fn rejection_record(key: &str) -> String {
    match key.strip_prefix(NOT_UTF8) {
        Some(hex) => format!("{REJECTED}not-utf8/{hex}"),
        None => format!("{REJECTED}{key}"),
    }
}

/// The input key a rejection record is about (the inverse of [`rejection_record`]).
pub fn rejected_key(record: &str) -> Option<String> {
    let rest = record.strip_prefix(REJECTED)?;
    Some(match rest.strip_prefix("not-utf8/") {
        Some(hex) => format!("{NOT_UTF8}{hex}"),
        None => rest.to_string(),
    })
}

/// A rejected input key `K` is recorded as `status/rejected/K` (its value:
/// why). Rules may read these records like any other input.
pub const REJECTED: &str = "status/rejected/";
/// Derived tuples of relation R that cannot become keys are recorded as
/// `status/rejected/derived/R` (how many, and why, with the rules).
pub const REJECTED_DERIVED: &str = "status/rejected/derived/";
/// Examples a `status/rejected/derived/R` record names.
const SHOWN_INVALID: usize = 3;

/// Why an input fact was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub key: String,
    pub reason: String,
}

/// Decodes a key/value into the tuples of every input relation it matches.
/// `Ok(vec![])` means no pattern matches (the key is not an input).
pub fn decode(program: &Program, key: &str, value: &str) -> Result<Vec<(RelId, Row)>, Rejection> {
    let reject = |reason: String| Rejection { key: key.to_string(), reason };
    if let Some(hex) = key.strip_prefix(NOT_UTF8) {
        return Err(reject(format!("the key is not UTF-8 (bytes {hex})")));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(reject(format!("value is {} bytes, over the {} byte limit", value.len(), MAX_VALUE_BYTES)));
    }
    let mut out = Vec::new();
    for rel in program.keys.relations_for(key) {
        let r = &program.relations[rel];
        let Some(pattern) = r.pattern.as_ref().filter(|_| r.kind == DeclKind::Input) else { continue };
        let Some(parts) = pattern.match_key(key) else {
            // `intent/user/service//instances`: the pattern's shape with a
            // placeholder left empty is a mistake to say, not a stranger.
            if let Some(col) = empty_placeholder(pattern, key) {
                return Err(reject(format!("key segment `{}` of `{}` is empty", r.columns[col].name, r.name)));
            }
            continue;
        };
        if pattern.value_column.is_some() && value.contains(NOT_UTF8) {
            let what = value.strip_prefix(NOT_UTF8).unwrap_or("holds a NUL character");
            return Err(reject(format!("value of `{}` is not UTF-8 text: {what}", r.name)));
        }
        let mut row = Row::with_capacity(r.arity());
        for (i, col) in r.columns.iter().enumerate() {
            let text = parts[i].unwrap_or(value);
            let v = Value::parse_column(col, text).map_err(|e| {
                let what = if Some(i) == pattern.value_column { "value".to_string() } else { format!("key segment `{}`", col.name) };
                reject(format!("{what} of `{}`: {e}", r.name))
            })?;
            row.push(v);
        }
        out.push((rel, row));
    }
    Ok(out)
}

/// What [`lint`] found about one fact of a facts file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lint {
    /// The value does not fit (or the key cannot be read): it would be rejected.
    Rejected(String),
    /// No input pattern matches the key although it lies under a prefix the
    /// rules read: most likely a typo; with the nearest key a pattern takes.
    Unread { near: Option<String> },
}

/// Checks one fact against the rules' inputs, as the controller would read
/// it: `None` when some input takes it.
pub fn lint(program: &Program, key: &str, value: &str) -> Option<Lint> {
    match decode(program, key, value) {
        Err(r) => Some(Lint::Rejected(r.reason)),
        Ok(tuples) if !tuples.is_empty() => None,
        Ok(_) => {
            let inputs = || program.relations.iter().filter(|r| r.kind == DeclKind::Input).filter_map(|r| r.pattern.as_ref());
            let prefix_of = |p: &ccattler_parser::pattern::KeyPattern| p.prefix().split_inclusive('/').next().unwrap_or_default().to_string();
            if !inputs().any(|p| key.starts_with(&prefix_of(p))) {
                return None; // not under any prefix the rules read
            }
            Some(Lint::Unread { near: nearest_input_key(program, key) })
        }
    }
}

/// The key an input pattern takes that is nearest to `key` (placeholders
/// filled with `key`'s segments at their places), if one is near.
fn nearest_input_key(program: &Program, key: &str) -> Option<String> {
    use ccattler_parser::pattern::Segment;
    let parts: Vec<&str> = key.split('/').collect();
    let mut best: Option<(usize, String)> = None;
    for r in program.relations.iter().filter(|r| r.kind == DeclKind::Input) {
        let Some(p) = &r.pattern else { continue };
        let candidate: Vec<String> = p
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Segment::Lit(l) => l.clone(),
                Segment::Col(c) => parts.get(i).filter(|s| !s.is_empty()).map_or_else(|| format!("{{{}}}", r.columns[*c].name), |s| s.to_string()),
            })
            .collect();
        let candidate = candidate.join("/");
        let d = ccattler_parser::check::edit_distance(key, &candidate);
        if best.as_ref().is_none_or(|(bd, bc)| d < *bd || (d == *bd && candidate < *bc)) {
            best = Some((d, candidate));
        }
    }
    best.filter(|(d, _)| *d > 0 && *d <= 3.max(key.len() / 10)).map(|(_, c)| c)
}

/// The column whose placeholder is the first empty segment of `key`, if the
/// key matches `pattern` in every literal and fills every other placeholder.
fn empty_placeholder(pattern: &ccattler_parser::pattern::KeyPattern, key: &str) -> Option<usize> {
    use ccattler_parser::pattern::Segment;
    let parts: Vec<&str> = key.split('/').collect();
    if parts.len() != pattern.segments.len() {
        return None;
    }
    let mut empty = None;
    for (seg, part) in pattern.segments.iter().zip(&parts) {
        match seg {
            Segment::Lit(l) if l != part => return None,
            Segment::Col(c) if part.is_empty() => {
                empty.get_or_insert(*c);
            }
            _ => {}
        }
    }
    empty
}

/// The tuple of one input relation a stored key/value gives, if its pattern
/// matches (a stored fact decoded when it was stored, so its values parse).
fn decode_one(program: &Program, rel: RelId, key: &str, value: &str) -> Option<Row> {
    let r = &program.relations[rel];
    let parts = r.pattern.as_ref()?.match_key(key)?;
    r.columns.iter().enumerate().map(|(i, col)| Value::parse_column(col, parts[i].unwrap_or(value)).ok()).collect()
}

/// One stored fact: its value and the revision it was last written at. (Its
/// tuples are not kept: decoding is deterministic, so a delete decodes again.)
#[derive(Clone, Debug)]
pub struct Fact {
    pub value: String,
    pub mod_revision: u64,
}

/// The input side's view of the store: every key an input pattern matches.
/// A clone is cheap and stays as it was while the original changes (a
/// consistent copy for a reader on another thread).
#[derive(Default, Clone)]
pub struct InputFacts {
    pub facts: crate::cowmap::CowMap<Fact>,
    /// Rejected keys and why (few: copied whole when shared and changed).
    pub rejected: std::sync::Arc<BTreeMap<String, String>>,
}

impl InputFacts {
    /// Records `key = value` at `rev`; returns the tuple changes it causes.
    ///
    /// A rejected key's record `status/rejected/KEY = reason` enters the
    /// input relations whose patterns match it in the same revision as the
    /// rejection (rules can act on a rejected value at once, e.g. keep the
    /// last good one), decoded from the rejection itself and kept among the
    /// facts (at the rejected put's revision): the record etcd holds (the
    /// controller writes it back) is not read again.
    pub fn put(&mut self, program: &Program, key: &str, value: &str, rev: u64, out: &mut Vec<Change>) {
        if key.starts_with(REJECTED) {
            return;
        }
        let decoded = decode(program, key, value);
        match decoded {
            // Not an input: never among the facts (the patterns do not
            // change), though it may have been rejected (too big a value).
            Ok(tuples) if tuples.is_empty() => self.remove_rejection(program, key, out),
            Ok(tuples) => {
                self.remove(program, key, out);
                out.extend(tuples.into_iter().map(|(rel, row)| (rel, row, 1)));
                self.facts.insert(key.to_string(), Fact { value: value.to_string(), mod_revision: rev });
            }
            Err(r) => {
                self.remove(program, key, out);
                let record = rejection_record(key);
                let tuples = decode(program, &record, &r.reason).unwrap_or_default();
                if !tuples.is_empty() {
                    out.extend(tuples.into_iter().map(|(rel, row)| (rel, row, 1)));
                    self.facts.insert(record, Fact { value: r.reason.clone(), mod_revision: rev });
                }
                std::sync::Arc::make_mut(&mut self.rejected).insert(r.key, r.reason);
            }
        }
    }

    pub fn delete(&mut self, program: &Program, key: &str, out: &mut Vec<Change>) {
        if key.starts_with(REJECTED) {
            return; // a record: it follows the rejection, not etcd
        }
        self.remove(program, key, out);
    }

    fn remove(&mut self, program: &Program, key: &str, out: &mut Vec<Change>) {
        self.remove_rejection(program, key, out);
        if let Some(old) = self.facts.remove(key) {
            // It decoded when it was stored, and decoding is deterministic.
            let tuples = decode(program, key, &old.value).unwrap_or_default();
            out.extend(tuples.into_iter().map(|(rel, row)| (rel, row, -1)));
        }
    }

    /// Forgets that `key` was rejected, if it was.
    fn remove_rejection(&mut self, program: &Program, key: &str, out: &mut Vec<Change>) {
        if self.rejected.contains_key(key) && std::sync::Arc::make_mut(&mut self.rejected).remove(key).is_some() {
            // Its record's tuples leave with it.
            let record = rejection_record(key);
            if let Some(old) = self.facts.remove(&record) {
                out.extend(decode(program, &record, &old.value).unwrap_or_default().into_iter().map(|(rel, row)| (rel, row, -1)));
            }
        }
    }

    /// The current tuples of an input relation, decoded from the stored facts.
    pub fn tuples(&self, program: &Program, rel: RelId) -> Vec<Row> {
        self.tuples_matching(program, rel, &[])
    }

    /// The tuples of an input relation with the given values at the given
    /// columns: a range of the stored keys, not a scan of the relation.
    pub fn tuples_matching(&self, program: &Program, rel: RelId, bound: &[(usize, Value)]) -> Vec<Row> {
        let Some(pattern) = &program.relations[rel].pattern else { return Vec::new() };
        let prefix = pattern.prefix_with(|c| bound.iter().find(|(p, _)| *p == c).map(|(_, v)| v.to_string()));
        self.facts
            .with_prefix(&prefix)
            .into_iter()
            .filter_map(|(k, f)| decode_one(program, rel, k, &f.value))
            .filter(|row| bound.iter().all(|(p, v)| row[*p] == *v))
            .collect()
    }
}

/// A derived key with more than one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub key: String,
    /// Each value with the rules that derived it (`file:line`).
    pub values: Vec<(String, Vec<String>)>,
}

/// The output side: every derived tuple, grouped by the key it renders to.
///
/// A key is almost always derived by one rule with one value: then its one
/// entry in `resolved` says all (value, rule, count), and the key is held
/// once. Only keys with more than one candidate (a conflict, two rules
/// agreeing) and keys being counted in a batch have `candidates` too.
#[derive(Default)]
pub struct OutputFacts {
    /// Derived tuples that cannot become keys, by relation name: (tuple
    /// text, rule) → (why, count). Never written; recorded instead.
    invalid: BTreeMap<String, BTreeMap<(String, usize), (String, isize)>>,
    /// key → what derives it, for the keys whose one candidate is not their
    /// `resolved` entry (invariant: a key in `resolved` and not here has
    /// exactly the candidate its entry names).
    candidates: HashMap<String, smallvec::SmallVec<[Candidate; 2]>, foldhash::fast::RandomState>,
    /// What the rules derive now, one value per key (conflicted keys keep their
    /// last unique value, or are absent if they never had one).
    pub resolved: BTreeMap<String, Derived>,
    pub conflicts: BTreeMap<String, Conflict>,
}

/// One value of a derived key, from one rule, with how many tuples give it.
struct Candidate {
    value: String,
    rule: usize,
    count: isize,
}

/// A derived key's value, and (while it is the key's only candidate) the
/// rule and tuple count behind it. Reads, compares and prints as its value
/// (`Deref<Target = String>`).
#[derive(Clone, Default)]
pub struct Derived {
    value: String,
    rule: u32,
    count: i32,
    /// The store's revision of this key (etcd's `mod_revision`) when the
    /// writer last saw it hold this value; 0: not seen holding it. The
    /// controller keeps etcd's copy of a key here rather than apart.
    stored_at: i64,
}

impl Derived {
    fn new(value: String) -> Derived {
        Derived { value, rule: 0, count: 0, stored_at: 0 }
    }

    /// The store's revision of this key when it was last seen holding this
    /// value (kept while the value stays), if it was.
    pub fn stored_at(&self) -> Option<i64> {
        (self.stored_at != 0).then_some(self.stored_at)
    }

    pub fn set_stored_at(&mut self, revision: Option<i64>) {
        self.stored_at = revision.unwrap_or(0);
    }

    /// The value, moved out.
    pub fn into_value(self) -> String {
        self.value
    }

    pub fn as_str(&self) -> &str {
        &self.value
    }

    /// The one candidate this entry stands for (not for a key that also
    /// has `candidates`).
    fn candidate(&self) -> Candidate {
        Candidate { value: self.value.clone(), rule: self.rule as usize, count: self.count as isize }
    }
}

impl std::ops::Deref for Derived {
    type Target = String;
    fn deref(&self) -> &String {
        &self.value
    }
}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

impl std::fmt::Display for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

impl PartialEq for Derived {
    fn eq(&self, other: &Derived) -> bool {
        self.value == other.value
    }
}

impl Eq for Derived {}

impl PartialEq<str> for Derived {
    fn eq(&self, other: &str) -> bool {
        self.value == other
    }
}

impl PartialEq<&str> for Derived {
    fn eq(&self, other: &&str) -> bool {
        self.value == *other
    }
}

impl PartialEq<String> for Derived {
    fn eq(&self, other: &String) -> bool {
        self.value == *other
    }
}

impl PartialEq<Derived> for String {
    fn eq(&self, other: &Derived) -> bool {
        *self == other.value
    }
}

impl PartialEq<Derived> for str {
    fn eq(&self, other: &Derived) -> bool {
        *self == other.value
    }
}

impl From<Derived> for String {
    fn from(d: Derived) -> String {
        d.value
    }
}

/// Whether some output pattern can produce `key` (so the controller manages it).
pub fn is_output_key(program: &Program, key: &str) -> bool {
    program.keys.relations_for(key).any(|rel| {
        let r = &program.relations[rel];
        r.kind == DeclKind::Output && r.pattern.as_ref().is_some_and(|p| p.match_key(key).is_some())
    })
}

/// Renders an output tuple as its key and value, or says why it cannot be
/// one: a placeholder's text that would make another key (a `/`, an empty
/// segment, a control character), a value that breaks its column's type
/// (a derived `name` that is not one, a state outside its set), or a value
/// over [`MAX_VALUE_BYTES`]. Keys it returns give back exactly the tuple.
pub fn encode(program: &Program, rel: RelId, row: &[Value]) -> Result<(String, String), String> {
    let r = &program.relations[rel];
    let Some(pattern) = r.pattern.as_ref() else { return Err(format!("`{}` has no key pattern", r.name)) };
    for (i, col) in r.columns.iter().enumerate() {
        let text = row[i].text();
        if col.ty == ccattler_parser::ast::Type::Name && !ccattler_parser::pattern::is_valid_name(&text) {
            let len = text.chars().count();
            let why = if len > 63 { format!("{len} characters, over 63") } else { "not [a-z0-9]([a-z0-9._-]*[a-z0-9])?".into() };
            return Err(format!("`{}` = {text:?} is not a name ({why})", col.name));
        }
        if let Some(c) = &col.constraint {
            let fits = match &row[i] {
                Value::Int(n) => c.check_int(*n),
                v => c.check_text(&v.text()),
            };
            fits.map_err(|why| format!("`{}`: {why}", col.name))?;
        }
    }
    let value = pattern.value_column.map(|c| row[c].text().into_owned()).unwrap_or_default();
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!("the value is {} bytes, over the {MAX_VALUE_BYTES} byte limit", value.len()));
    }
    let texts: Vec<String> = row.iter().map(|v| v.text().into_owned()).collect();
    let names: Vec<&str> = r.columns.iter().map(|c| c.name.as_str()).collect();
    Ok((pattern.render_checked(&texts, &names)?, value))
}

impl OutputFacts {
    /// Applies output tuple diffs (rows prefixed with their rule id, as
    /// [`crate::Engine::apply`] returns them); returns every key they touched
    /// (its resolved value or its conflict may have changed), once per diff.
    pub fn apply(&mut self, program: &Program, diffs: &[Change]) -> Vec<String> {
        let mut touched = Vec::with_capacity(diffs.len());
        self.count(program, diffs, &mut touched);
        self.resolve_all(program, &touched);
        touched
    }

    /// The first half of [`OutputFacts::apply`], for diffs that arrive in
    /// parts ([`crate::Engine::apply_streaming`]): counts them and adds the
    /// keys they touch to `touched`. Nothing is resolved until
    /// [`OutputFacts::resolve_all`] gets every part's keys.
    pub fn count(&mut self, program: &Program, diffs: &[Change], touched: &mut Vec<String>) {
        self.candidates.reserve(diffs.len());
        for (rel, tagged, d) in diffs {
            if program.relations[*rel].kind != DeclKind::Output {
                continue;
            }
            let Some((Value::Int(rule), row)) = tagged.split_first() else { continue };
            match encode(program, *rel, row) {
                Ok((key, value)) => {
                    self.count_one(key.clone(), value, *rule as usize, *d);
                    touched.push(key);
                }
                Err(why) => {
                    let name = &program.relations[*rel].name;
                    let tuple = format!("{name}({})", row.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", "));
                    let by_tuple = self.invalid.entry(name.clone()).or_default();
                    let entry = by_tuple.entry((tuple, *rule as usize)).or_insert((why, 0));
                    entry.1 += d;
                    if entry.1 == 0 {
                        by_tuple.retain(|_, (_, n)| *n != 0);
                    }
                    if by_tuple.is_empty() {
                        self.invalid.remove(name);
                    }
                    touched.push(format!("{REJECTED_DERIVED}{name}"));
                }
            }
        }
    }

    /// The record of relation `name`'s tuples that cannot become keys, if
    /// any: how many, and the first few with the rule behind each and why.
    pub fn invalid_record(&self, program: &Program, name: &str) -> Option<String> {
        let bad = self.invalid.get(name)?;
        let examples: Vec<String> =
            bad.iter().take(SHOWN_INVALID).map(|((tuple, rule), (why, _))| format!("rule {} derived {tuple}: {why}", program.rule_location(*rule))).collect();
        let more = bad.len().saturating_sub(SHOWN_INVALID);
        let tail = if more > 0 { format!("; and {more} more") } else { String::new() };
        Some(format!("{} derived tuple(s) cannot become keys and are not written: {}{tail}", bad.len(), examples.join("; ")))
    }

    /// Relations with derived tuples that cannot become keys.
    pub fn invalid_relations(&self) -> impl Iterator<Item = &String> {
        self.invalid.keys()
    }

    /// Resolves the keys counted diffs touched, once every diff is in: a
    /// state inside the batch (one value of a key that ends conflicted)
    /// never counts as the key's value.
    pub fn resolve_all(&mut self, program: &Program, touched: &[String]) {
        self.resolve_all_noting(program, touched, |_, _, _, _| {});
    }

    /// [`OutputFacts::resolve_all`], telling `changed` of each key whose
    /// resolved value changes, once: the key's index in `touched`, the key,
    /// its old entry (moved out; with where it was stored) and its new value
    /// (`None`: none). A key whose value stays keeps its `stored_at`. Costs
    /// no lookup beyond resolving's own.
    pub fn resolve_all_noting(&mut self, program: &Program, touched: &[String], mut changed: impl FnMut(usize, &str, Option<Derived>, Option<&str>)) {
        // Into an empty map (a cold start) the keys go in bulk, sorted.
        let mut fresh = self.resolved.is_empty().then(Vec::new);
        for (at, key) in touched.iter().enumerate() {
            self.resolve(program, key, &mut fresh, &mut |key, old, new| changed(at, key, old, new));
        }
        if let Some(fresh) = fresh {
            self.resolved = fresh.into_iter().collect();
        }
        // A batch's keys left `candidates` as they resolved: give back the
        // room a large batch (a cold start) made.
        let len = self.candidates.len();
        if self.candidates.capacity() > 64 && self.candidates.capacity() > 4 * len {
            self.candidates.shrink_to(2 * len);
        }
    }

    /// Adds `d` tuples of `rule` deriving `key = value`.
    fn count_one(&mut self, key: String, value: String, rule: usize, d: isize) {
        let cands = match self.candidates.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            // A key held only in `resolved`: its one candidate, counted here
            // until the batch is resolved.
            std::collections::hash_map::Entry::Vacant(e) => {
                let one = self.resolved.get(e.key()).map(Derived::candidate);
                e.insert(one.into_iter().collect())
            }
        };
        match cands.iter().position(|c| c.rule == rule && c.value == value) {
            Some(at) => {
                cands[at].count += d;
                if cands[at].count == 0 {
                    cands.swap_remove(at);
                }
            }
            None => cands.push(Candidate { value, rule, count: d }),
        }
    }

    /// Brings `resolved` and `conflicts` in line with a key's candidates,
    /// and leaves a key with one candidate in `resolved` alone. A key new to
    /// `resolved` goes to `fresh` instead, if given.
    fn resolve(
        &mut self,
        program: &Program,
        key: &str,
        fresh: &mut Option<Vec<(String, Derived)>>,
        changed: &mut impl FnMut(&str, Option<Derived>, Option<&str>),
    ) {
        // (Not counted since its last resolve: already resolved.)
        let Some(cands) = self.candidates.get(key) else { return };
        if cands.is_empty() {
            self.candidates.remove(key);
            if let Some(old) = self.resolved.remove(key) {
                changed(key, Some(old), None);
            }
            self.conflicts.remove(key);
            return;
        }
        if let [only] = cands.as_slice() {
            if let (Ok(rule), Ok(count)) = (u32::try_from(only.rule), i32::try_from(only.count)) {
                let (key, mut cands) = self.candidates.remove_entry(key).expect("just read");
                let value = cands.pop().expect("one").value;
                let mut derived = Derived { value, rule, count, stored_at: 0 };
                self.conflicts.remove(&key);
                match self.resolved.get_mut(&key) {
                    Some(held) => {
                        if held.value == derived.value {
                            derived.stored_at = held.stored_at;
                            *held = derived;
                        } else {
                            let old = std::mem::replace(held, derived);
                            changed(&key, Some(old), Some(&held.value));
                        }
                    }
                    None => {
                        changed(&key, None, Some(&derived.value));
                        match fresh {
                            Some(fresh) => fresh.push((key, derived)),
                            None => {
                                self.resolved.insert(key, derived);
                            }
                        }
                    }
                }
                return;
            }
        }
        let first = &cands[0].value;
        if cands.iter().all(|c| c.value == *first) {
            match self.resolved.get_mut(key) {
                Some(v) => {
                    if v.value != *first {
                        let old = Derived { value: std::mem::replace(&mut v.value, first.clone()), stored_at: std::mem::take(&mut v.stored_at), ..*v };
                        changed(key, Some(old), Some(first));
                    }
                }
                None => {
                    changed(key, None, Some(first));
                    match fresh {
                        Some(fresh) => fresh.push((key.to_string(), Derived::new(first.clone()))),
                        None => {
                            self.resolved.insert(key.to_string(), Derived::new(first.clone()));
                        }
                    }
                }
            }
            self.conflicts.remove(key);
            return;
        }
        // Each value, sorted, with the rules deriving it, sorted.
        let mut by_value: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for c in cands {
            by_value.entry(&c.value).or_default().push(c.rule);
        }
        let values = by_value
            .into_iter()
            .map(|(v, mut rules)| {
                rules.sort_unstable();
                (v.to_string(), rules.into_iter().map(|r| program.rule_location(r)).collect())
            })
            .collect();
        self.conflicts.insert(key.to_string(), Conflict { key: key.to_string(), values });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program() -> Program {
        let text = "input v(s: name, n: int) from \"v/{s}\"\noutput o(s: name, n: int) to \"o/{s}\"\no(s, n) :- v(s, n).\no(s, n) :- v(s, n), n > 0.\n";
        ccattler_parser::check_str("t.rules", text).program.expect("valid")
    }

    /// An output diff: rule id first, then the tuple.
    fn diff(rule: i64, s: &str, n: i64, d: isize) -> Change {
        (1, smallvec::smallvec![Value::Int(rule), Value::str(s), Value::Int(n)], d)
    }

    #[test]
    fn one_value_from_two_rules_resolves_and_two_values_conflict() {
        let p = program();
        let mut out = OutputFacts::default();
        // Two rules derive o/web = 1: one value, no conflict; it stays while either does.
        assert_eq!(out.apply(&p, &[diff(0, "web", 1, 1), diff(1, "web", 1, 1)]), ["o/web", "o/web"]);
        assert_eq!(out.resolved["o/web"], "1");
        out.apply(&p, &[diff(1, "web", 1, -1)]);
        assert_eq!(out.resolved["o/web"], "1");
        assert!(out.conflicts.is_empty());
        // A second value conflicts: values sorted, each with its rules; the key keeps its value.
        out.apply(&p, &[diff(1, "web", 2, 1)]);
        let c = &out.conflicts["o/web"];
        assert_eq!(c.values, [("1".to_string(), vec!["t.rules:3".to_string()]), ("2".to_string(), vec!["t.rules:4".to_string()])]);
        assert_eq!(out.resolved["o/web"], "1");
        // Back to one value: resolved to it, conflict gone; then nothing derives the key.
        out.apply(&p, &[diff(0, "web", 1, -1)]);
        assert_eq!(out.resolved["o/web"], "2");
        assert!(out.conflicts.is_empty());
        out.apply(&p, &[diff(1, "web", 2, -1)]);
        assert!(out.resolved.is_empty() && out.candidates.is_empty());
        // Two values arriving together: conflicted from the start, never a value.
        out.apply(&p, &[diff(0, "db", 1, 1), diff(1, "db", 2, 1)]);
        assert!(out.conflicts.contains_key("o/db") && !out.resolved.contains_key("o/db"));
    }

    #[test]
    fn a_key_with_one_candidate_is_held_once_and_others_keep_their_candidates() {
        let p = program();
        let mut out = OutputFacts::default();
        // A cold start's worth of keys, each from one rule: none stays in
        // `candidates`, and the room the batch made there is given back.
        let cold: Vec<Change> = (0..1000).map(|i| diff(0, &format!("s{i}"), i, 1)).collect();
        out.apply(&p, &cold);
        assert_eq!(out.resolved.len(), 1000);
        assert!(out.candidates.is_empty() && out.candidates.capacity() <= 64, "{} held", out.candidates.capacity());
        // A second rule agreeing: two candidates, kept; one gone: held once again.
        out.apply(&p, &[diff(1, "s7", 7, 1)]);
        assert_eq!(out.candidates["o/s7"].len(), 2);
        out.apply(&p, &[diff(0, "s7", 7, -1)]);
        assert!(out.candidates.is_empty());
        assert_eq!(out.resolved["o/s7"], "7");
        // The entry remembers its rule: a retraction by that rule removes it,
        // and the same tuple derived twice counts twice.
        out.apply(&p, &[diff(1, "s7", 7, 1)]);
        out.apply(&p, &[diff(1, "s7", 7, -1)]);
        assert_eq!(out.resolved["o/s7"], "7", "still derived once");
        out.apply(&p, &[diff(1, "s7", 7, -1)]);
        assert!(!out.resolved.contains_key("o/s7") && out.candidates.is_empty());
        // A key touched twice in a batch resolves once, the second time a no-op.
        out.apply(&p, &[diff(0, "s8", 9, 1), diff(0, "s8", 8, -1)]);
        assert_eq!(out.resolved["o/s8"], "9");
        assert!(out.candidates.is_empty());
    }

    #[test]
    fn a_derived_tuple_that_cannot_be_a_key_is_recorded_not_written() {
        let text = "input v(s: string, n: int) from \"v/{s}\"\noutput o(s: string, n: int) to \"o/{s}/x\"\noutput p(s: name) to \"p/{s}\"\n\
                    o(s, n) :- v(s, n).\np(s ++ \"-\" ++ n) :- v(s, n).\n";
        let p = ccattler_parser::check_str("t.rules", text).program.expect("valid");
        let row = |rule: i64, vals: &[Value]| std::iter::once(Value::Int(rule)).chain(vals.iter().cloned()).collect::<Row>();
        let mut out = OutputFacts::default();
        let touched = out.apply(
            &p,
            &[
                (1, row(0, &[Value::str("a/b"), Value::Int(1)]), 1),
                (1, row(0, &[Value::str("ok"), Value::Int(2)]), 1),
                (1, row(0, &[Value::str(""), Value::Int(3)]), 1),
                (2, row(1, &[Value::str(&"x".repeat(70))]), 1),
            ],
        );
        // The good key is resolved; the bad ones are not keys at all.
        assert_eq!(out.resolved.keys().collect::<Vec<_>>(), ["o/ok/x"]);
        assert!(touched.contains(&"status/rejected/derived/o".to_string()));
        let o = out.invalid_record(&p, "o").unwrap();
        assert!(o.starts_with("2 derived tuple(s)") && o.contains("t.rules:4") && o.contains("holds a `/`") && o.contains("is empty"), "{o}");
        let pr = out.invalid_record(&p, "p").unwrap();
        assert!(pr.contains("70 characters, over 63"), "{pr}");
        // Retracted: the record goes.
        out.apply(&p, &[(1, row(0, &[Value::str("a/b"), Value::Int(1)]), -1), (1, row(0, &[Value::str(""), Value::Int(3)]), -1)]);
        assert!(out.invalid_record(&p, "o").is_none());
        assert_eq!(out.invalid_relations().collect::<Vec<_>>(), ["p"]);
    }

    #[test]
    fn diffs_counted_in_parts_resolve_as_one_batch() {
        let p = program();
        let mut out = OutputFacts::default();
        out.apply(&p, &[diff(0, "web", 1, 1)]);
        // In parts, unconsolidated: a retraction may come before its insert,
        // and a value that ends replaced is never the key's value.
        let mut touched = Vec::new();
        out.count(&p, &[diff(0, "web", 1, -1), diff(0, "db", 5, -1)], &mut touched);
        out.count(&p, &[diff(0, "db", 5, 1), diff(0, "web", 2, 1), diff(0, "api", 7, 1)], &mut touched);
        out.resolve_all(&p, &touched);
        assert_eq!(out.resolved.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>(), [("o/api", "7"), ("o/web", "2")]);
        assert!(out.conflicts.is_empty() && !out.candidates.contains_key("o/db"));
    }
}
