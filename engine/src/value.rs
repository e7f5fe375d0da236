//! Values and rows as the dataflow holds them: 16-byte values, strings interned
//! once per process.

use ccattler_parser::ast::Type;
use ccattler_parser::program::Const;
use lasso::{Spur, ThreadedRodeo};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::sync::OnceLock;

fn interner() -> &'static ThreadedRodeo {
    static INTERNER: OnceLock<ThreadedRodeo> = OnceLock::new();
    INTERNER.get_or_init(ThreadedRodeo::new)
}

/// An interned string. Equality is identity; `Ord` is by interning order, which
/// is only good for the dataflow's own sorting — use [`Value::cmp_text`] for
/// anything a user can see.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Sym(Spur);

impl Sym {
    pub fn new(s: &str) -> Sym {
        Sym(interner().get_or_intern(s))
    }
    pub fn as_str(self) -> &'static str {
        interner().resolve(&self.0)
    }
}

impl std::fmt::Debug for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Value {
    Int(i64),
    Str(Sym),
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Str(s) => f.write_str(s.as_str()),
        }
    }
}

impl Value {
    pub fn str(s: &str) -> Value {
        Value::Str(Sym::new(s))
    }
    pub fn from_const(c: &Const) -> Value {
        match c {
            Const::Int(n) => Value::Int(*n),
            Const::Str(s) => Value::str(s),
        }
    }
    /// The order users see: ints numerically, strings by their text.
    pub fn cmp_text(&self, other: &Value) -> Ordering {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => a.cmp(b),
            (Value::Str(a), Value::Str(b)) if a == b => Ordering::Equal,
            (Value::Str(a), Value::Str(b)) => a.as_str().cmp(b.as_str()),
            (Value::Int(_), Value::Str(_)) => Ordering::Less,
            (Value::Str(_), Value::Int(_)) => Ordering::Greater,
        }
    }
    /// The text a key or value shows: an int's digits, a string itself.
    pub fn text(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Value::Int(n) => n.to_string().into(),
            Value::Str(s) => s.as_str().into(),
        }
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            Value::Str(_) => None,
        }
    }
    /// Parses the text of a key segment or value into a column: its type,
    /// then its named type's refinement (a range, a set of values), if any.
    pub fn parse_column(col: &ccattler_parser::program::ColumnDef, text: &str) -> Result<Value, String> {
        let v = Value::parse(col.ty, text)?;
        if let Some(c) = &col.constraint {
            match v {
                Value::Int(n) => c.check_int(n)?,
                Value::Str(s) => c.check_text(s.as_str())?,
            }
        }
        Ok(v)
    }

    /// Parses the text of a key segment or value into a column's type.
    pub fn parse(ty: Type, text: &str) -> Result<Value, String> {
        match ty {
            Type::Int => text.trim().parse::<i64>().map(Value::Int).map_err(|_| format!("`{text}` is not an int")),
            Type::Name if !ccattler_parser::pattern::is_valid_name(text) => {
                Err(format!("`{text}` is not a valid name: names are [a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters"))
            }
            Type::Name | Type::String => Ok(Value::str(text)),
        }
    }
}

/// A tuple of a relation, or a rule's variable bindings.
pub type Row = Vec<Value>;

/// Compares rows in user-visible order.
pub fn cmp_rows(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        match x.cmp_text(y) {
            Ordering::Equal => continue,
            o => return o,
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_order_is_by_content_not_interning() {
        let z = Value::str("zzz-interned-first");
        let a = Value::str("aaa-interned-second");
        assert_eq!(a.cmp_text(&z), Ordering::Less);
        assert_eq!(Value::Int(-3).cmp_text(&Value::Int(2)), Ordering::Less);
    }

    #[test]
    fn parse_by_type() {
        assert_eq!(Value::parse(Type::Int, "5"), Ok(Value::Int(5)));
        assert!(Value::parse(Type::Int, "three").is_err());
        assert!(Value::parse(Type::Name, "Web").is_err());
        assert_eq!(Value::parse(Type::String, "Web"), Ok(Value::str("Web")));
    }
}
