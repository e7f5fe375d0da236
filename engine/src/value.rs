//! Values and rows as the dataflow holds them: 16-byte values, strings interned
//! once per process.

use ccattler_parser::ast::Type;
use ccattler_parser::program::Const;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// An interned string: a pointer to its text, stored once per process and
/// never freed. Equality and hashing are by identity; `Ord` is by address,
/// which is only good for the dataflow's own sorting — use
/// [`Value::cmp_text`] for anything a user can see. Reading the text is a
/// pointer dereference (the built-ins compare names by text in their inner
/// loops), and interning takes one lock of one of many shards.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(std::ptr::NonNull<u8>);

// SAFETY: a `Sym` points to bytes that are written once, before the `Sym`
// exists, and never changed or freed.
unsafe impl Send for Sym {}
unsafe impl Sync for Sym {}

impl Sym {
    pub fn new(s: &str) -> Sym {
        intern::get_or_intern(s)
    }
    pub fn as_str(self) -> &'static str {
        // SAFETY: `intern` wrote the length, then that many bytes of UTF-8,
        // at this address, and never frees or changes them.
        unsafe {
            let len = self.0.as_ptr().cast::<usize>().read_unaligned();
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(self.0.as_ptr().add(intern::HEADER), len))
        }
    }
}

impl Serialize for Sym {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Sym {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Sym, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Sym::new(&s))
    }
}

/// The process's string table: shards of (text → its `Sym`), each with an
/// arena its texts are copied into (length first, then the bytes).
mod intern {
    use super::Sym;
    use std::hash::{BuildHasher, Hash, Hasher};
    use std::ptr::NonNull;
    use std::sync::{Mutex, OnceLock};

    /// Bytes before a text: its length.
    pub const HEADER: usize = std::mem::size_of::<usize>();
    const SHARDS: usize = 64;
    /// Arena chunks (64 KiB a shard at least, once a shard is used: 4 MiB in
    /// all); a text too big for a tenth of one gets its own.
    const CHUNK: usize = 64 << 10;

    /// A `Sym` in the table, hashed and compared by its text.
    struct ByText(Sym);
    impl Hash for ByText {
        fn hash<H: Hasher>(&self, h: &mut H) {
            self.0.as_str().hash(h)
        }
    }
    impl PartialEq for ByText {
        fn eq(&self, o: &Self) -> bool {
            self.0 == o.0
        }
    }
    impl Eq for ByText {}
    impl std::borrow::Borrow<str> for ByText {
        fn borrow(&self) -> &str {
            self.0.as_str()
        }
    }

    #[derive(Default)]
    struct Shard {
        table: std::collections::HashSet<ByText, foldhash::fast::FixedState>,
        /// The unused tail of the current chunk.
        free: &'static mut [u8],
    }

    type Table = [Mutex<Shard>; SHARDS];
    fn table() -> &'static Table {
        static TABLE: OnceLock<Table> = OnceLock::new();
        TABLE.get_or_init(|| std::array::from_fn(|_| Mutex::default()))
    }

    pub fn get_or_intern(s: &str) -> Sym {
        let shard = foldhash::fast::FixedState::with_seed(0x5eed).hash_one(s) as usize % SHARDS;
        // A panic while holding the lock cannot leave the table half-changed
        // (an insert of a complete entry is the only change), so a poisoned
        // lock is still good.
        let mut shard = table()[shard].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = shard.table.get(s) {
            return found.0;
        }
        let need = HEADER + s.len();
        let place: &'static mut [u8] = if need > CHUNK / 10 {
            Box::leak(vec![0u8; need].into_boxed_slice())
        } else {
            if shard.free.len() < need {
                shard.free = Box::leak(vec![0u8; CHUNK].into_boxed_slice());
            }
            let free = std::mem::take(&mut shard.free);
            let (place, rest) = free.split_at_mut(need);
            shard.free = rest;
            place
        };
        place[..HEADER].copy_from_slice(&s.len().to_ne_bytes());
        place[HEADER..].copy_from_slice(s.as_bytes());
        let sym = Sym(NonNull::from(place).cast::<u8>());
        shard.table.insert(ByText(sym));
        sym
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
    fn interning_gives_one_sym_per_text_and_gives_the_text_back() {
        let long = "x".repeat(100_000);
        for s in ["", "web", "ü-ñ ✓", long.as_str()] {
            let a = Sym::new(s);
            assert_eq!(a.as_str(), s);
            assert_eq!(Sym::new(String::from(s).as_str()), a);
        }
        assert_ne!(Sym::new("web"), Sym::new("web-0"));
        // From many threads at once: still one Sym per text.
        let syms: Vec<Vec<Sym>> = std::thread::scope(|t| {
            let hs: Vec<_> = (0..4).map(|_| t.spawn(|| (0..2000).map(|i| Sym::new(&format!("concurrent-{i}"))).collect())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(syms.iter().all(|s| *s == syms[0]));
        assert!(syms[0].iter().enumerate().all(|(i, s)| s.as_str() == format!("concurrent-{i}")));
    }

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
