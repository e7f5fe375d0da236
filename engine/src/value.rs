//! Values and rows as the dataflow holds them: 16-byte values; strings of up
//! to 14 bytes inline, longer ones interned once per process, counted, and
//! freed with the last value that holds them.

use ccattler_parser::ast::Type;
use ccattler_parser::program::Const;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// An interned string longer than [`Short::MAX`]: a counted pointer to its
/// text, stored once per process while any value holds it. Equality is by
/// identity (one `Sym` per text); hashing and `Ord` are by the text's hash,
/// computed once, then the text — the same in every process, so exchange
/// between timely processes routes by content. Use [`Value::cmp_text`] for
/// anything a user sees.
pub struct Sym(std::ptr::NonNull<intern::Header>);

// SAFETY: the text behind a `Sym` is written once, before the `Sym` exists,
// and never changed; its count is atomic, and it is freed only under its
// shard's lock once no `Sym` points to it (intern::release).
unsafe impl Send for Sym {}
unsafe impl Sync for Sym {}

impl Sym {
    fn new(s: &str) -> Sym {
        intern::get_or_intern(s)
    }
    pub fn as_str(&self) -> &str {
        // SAFETY: `intern` wrote the header, then `len` bytes of UTF-8, and
        // the text lives while this `Sym` counts in its header.
        unsafe {
            let h = self.0.as_ptr();
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(h.add(1).cast::<u8>(), (*h).len))
        }
    }
    fn hash_code(&self) -> u64 {
        // SAFETY: as in `as_str`.
        unsafe { (*self.0.as_ptr()).hash }
    }
}

impl Clone for Sym {
    fn clone(&self) -> Sym {
        // SAFETY: as in `as_str`. (Relaxed, as Arc: a new count is made
        // from an existing one, which keeps the text alive meanwhile.)
        unsafe { (*self.0.as_ptr()).count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
        Sym(self.0)
    }
}

impl Drop for Sym {
    fn drop(&mut self) {
        // SAFETY: as in `as_str`; after the decrement only `release` may
        // look at the header, under the shard's lock.
        let h = unsafe { &*self.0.as_ptr() };
        let hash = h.hash;
        if h.count.fetch_sub(1, std::sync::atomic::Ordering::Release) == 1 {
            intern::release(self.0, hash);
        }
    }
}

impl PartialEq for Sym {
    fn eq(&self, o: &Sym) -> bool {
        self.0 == o.0
    }
}
impl Eq for Sym {}
impl std::hash::Hash for Sym {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash_code())
    }
}
impl Ord for Sym {
    fn cmp(&self, o: &Sym) -> Ordering {
        if self.0 == o.0 {
            return Ordering::Equal;
        }
        self.hash_code().cmp(&o.hash_code()).then_with(|| self.as_str().cmp(o.as_str()))
    }
}
impl PartialOrd for Sym {
    fn partial_cmp(&self, o: &Sym) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The process's table of long strings: shards of counted texts, each text
/// allocated on its own (header, then bytes) and freed by the drop of the
/// last `Sym` that points to it.
mod intern {
    use super::Sym;
    use std::alloc::Layout;
    use std::hash::BuildHasher;
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};

    /// What precedes a text: the number of `Sym`s pointing to it, its hash
    /// (which also picks its shard), its length.
    #[repr(C)]
    pub struct Header {
        pub count: AtomicUsize,
        pub hash: u64,
        pub len: usize,
    }

    const SHARDS: usize = 64;

    /// A shard's texts, found by hash, then by text (an insert) or by
    /// address (a release, which must not read a text another thread may
    /// have freed).
    #[derive(Default)]
    struct Shard {
        table: hashbrown::HashTable<NonNull<Header>>,
        bytes: usize,
    }
    // SAFETY: the pointers are owned by the table, read under its lock.
    unsafe impl Send for Shard {}

    type Table = [Mutex<Shard>; SHARDS];
    fn table() -> &'static Table {
        static TABLE: OnceLock<Table> = OnceLock::new();
        TABLE.get_or_init(|| std::array::from_fn(|_| Mutex::default()))
    }

    fn lock(hash: u64) -> std::sync::MutexGuard<'static, Shard> {
        // A panic while holding the lock cannot leave a shard half-changed
        // (each change is one insert or one remove), so a poisoned lock is
        // still good.
        table()[(hash >> 58) as usize % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(std::mem::size_of::<Header>() + len, std::mem::align_of::<Header>()).expect("a text fits in memory")
    }

    /// The text's hash: the same in every process.
    pub fn hash_of(s: &str) -> u64 {
        foldhash::fast::FixedState::with_seed(0x5eed).hash_one(s)
    }

    fn text<'a>(h: NonNull<Header>) -> &'a str {
        // SAFETY: called under the shard's lock on a header the table holds.
        unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(h.as_ptr().add(1).cast::<u8>(), (*h.as_ptr()).len)) }
    }

    pub fn get_or_intern(s: &str) -> Sym {
        let hash = hash_of(s);
        let mut shard = lock(hash);
        if let Some(found) = shard.table.find(hash, |h| text(*h) == s) {
            // A count of 0 here is a text whose last `Sym` is being dropped
            // on another thread: it lives on (that thread's `release` sees
            // the count again under this lock).
            // SAFETY: the table holds it, so it is not freed.
            unsafe { (*found.as_ptr()).count.fetch_add(1, Ordering::Relaxed) };
            return Sym(*found);
        }
        let layout = layout(s.len());
        // SAFETY: the layout has a non-zero size (the header).
        let raw = unsafe { std::alloc::alloc(layout) }.cast::<Header>();
        let Some(h) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        // SAFETY: freshly allocated for a header and `s.len()` bytes.
        unsafe {
            h.as_ptr().write(Header { count: AtomicUsize::new(1), hash, len: s.len() });
            std::ptr::copy_nonoverlapping(s.as_ptr(), h.as_ptr().add(1).cast::<u8>(), s.len());
        }
        shard.table.insert_unique(hash, h, |h| unsafe { (*h.as_ptr()).hash });
        shard.bytes += layout.size();
        Sym(h)
    }

    /// The count of `h` reached 0 on this thread: frees it, unless it was
    /// taken again meanwhile (found by `get_or_intern`) or already freed by
    /// another thread that also saw 0 after it was taken and dropped again.
    pub fn release(h: NonNull<Header>, hash: u64) {
        let mut shard = lock(hash);
        let Ok(entry) = shard.table.find_entry(hash, |x| *x == h) else { return };
        // SAFETY: the table holds it, so it is not freed; the acquire pairs
        // with every drop's release.
        if unsafe { (*h.as_ptr()).count.load(Ordering::Acquire) } != 0 {
            return;
        }
        entry.remove();
        // SAFETY: no `Sym` points to it and the table no longer does.
        let len = unsafe { (*h.as_ptr()).len };
        shard.bytes -= layout(len).size();
        unsafe { std::alloc::dealloc(h.as_ptr().cast::<u8>(), layout(len)) };
    }

    /// Texts held, and their bytes (headers included), over every shard.
    pub fn stats() -> (usize, usize) {
        table().iter().fold((0, 0), |(n, b), s| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            (n + s.table.len(), b + s.bytes)
        })
    }
}

/// Long strings held by the process's table and their bytes: what the
/// interner costs now (it shrinks as values go).
pub fn interned() -> (usize, usize) {
    intern::stats()
}

impl std::fmt::Debug for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// A string of at most [`Short::MAX`] bytes, held in the value itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Short {
    len: u8,
    bytes: [u8; Short::MAX],
}

impl Short {
    pub const MAX: usize = 14;
    fn new(s: &str) -> Option<Short> {
        let mut bytes = [0; Short::MAX];
        bytes.get_mut(..s.len())?.copy_from_slice(s.as_bytes());
        Some(Short { len: s.len() as u8, bytes })
    }
    fn as_str(&self) -> &str {
        // SAFETY: `new` copied `len` bytes of a `str`.
        unsafe { std::str::from_utf8_unchecked(&self.bytes[..self.len as usize]) }
    }
}

/// An int or a string. A text has one representation (inline when it fits),
/// so equality and hashing of values is equality and hashing of texts.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Int(i64),
    Short(Short),
    Long(Sym),
}

const _: () = assert!(std::mem::size_of::<Value>() == 16);

impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Int(n) => s.serialize_newtype_variant("Value", 0, "Int", n),
            v => s.serialize_newtype_variant("Value", 1, "Str", v.as_text().expect("a string")),
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "Value")]
        enum Wire<'a> {
            Int(i64),
            Str(#[serde(borrow)] std::borrow::Cow<'a, str>),
        }
        Ok(match Wire::deserialize(d)? {
            Wire::Int(n) => Value::Int(n),
            Wire::Str(s) => Value::str(&s),
        })
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            v => write!(f, "{:?}", v.as_text().expect("a string")),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            v => f.write_str(v.as_text().expect("a string")),
        }
    }
}

impl Value {
    pub fn str(s: &str) -> Value {
        match Short::new(s) {
            Some(short) => Value::Short(short),
            None => Value::Long(Sym::new(s)),
        }
    }
    /// A string's text; None for an int.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Int(_) => None,
            Value::Short(s) => Some(s.as_str()),
            Value::Long(s) => Some(s.as_str()),
        }
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
            (Value::Long(a), Value::Long(b)) if a == b => Ordering::Equal,
            (Value::Int(_), _) => Ordering::Less,
            (_, Value::Int(_)) => Ordering::Greater,
            (a, b) => a.as_text().cmp(&b.as_text()),
        }
    }
    /// The text a key or value shows: an int's digits, a string itself.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Value::Int(n) => n.to_string().into(),
            v => v.as_text().expect("a string").into(),
        }
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }
    /// Parses the text of a key segment or value into a column: its type,
    /// then its named type's refinement (a range, a set of values), if any.
    pub fn parse_column(col: &ccattler_parser::program::ColumnDef, text: &str) -> Result<Value, String> {
        let v = Value::parse(col.ty, text)?;
        if let Some(c) = &col.constraint {
            match &v {
                Value::Int(n) => c.check_int(*n)?,
                v => c.check_text(v.as_text().expect("a string"))?,
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
pub type Row = smallvec::SmallVec<[Value; 1]>;

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
        for s in ["", "web", "ü-ñ ✓", "a-text-longer-than-fourteen", long.as_str()] {
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

    /// Whether a value other than this probe holds `text` now.
    fn held(text: &str) -> bool {
        let s = Sym::new(text);
        // SAFETY: `s` holds it; the count says who else does.
        unsafe { (*s.0.as_ptr()).count.load(std::sync::atomic::Ordering::Acquire) > 1 }
    }

    #[test]
    fn a_long_text_is_freed_with_its_last_value_and_a_short_one_is_never_interned() {
        let text = format!("released-when-the-last-value-goes-{}", std::process::id());
        let a = Value::str(&text);
        let b = a.clone();
        assert!(matches!(a, Value::Long(_)) && a == b && held(&text));
        drop(a);
        assert!(held(&text), "b still holds it");
        drop(b);
        assert!(!held(&text), "freed with the last value");
        // Interned again, it is the same text (a new allocation).
        assert_eq!(Value::str(&text).as_text(), Some(text.as_str()));
        let short = Value::str("fourteen-bytes");
        assert!(matches!(short, Value::Short(_)), "{short:?}");
        assert_eq!(short.as_text(), Some("fourteen-bytes"));
        assert!(matches!(Value::str("fifteen-bytes-x"), Value::Long(_)));
        // A multibyte text is cut by bytes, not characters.
        assert!(matches!(Value::str("ü-ñ-✓-ü-ñ"), Value::Long(_)));
        assert_eq!(Value::str("ü-ñ-✓-ü-ñ").as_text(), Some("ü-ñ-✓-ü-ñ"));
    }

    /// The race of a last drop (release) against a new intern of the same
    /// text, and against another thread's drop: every text stays readable
    /// while held, and nothing is left once all are dropped.
    #[test]
    fn interning_and_dropping_the_same_texts_on_many_threads_frees_each_once() {
        let tag = std::process::id();
        let texts: Vec<String> = (0..64).map(|i| format!("churned-value-number-{i}-{tag}")).collect();
        std::thread::scope(|t| {
            for w in 0..4 {
                let texts = &texts;
                t.spawn(move || {
                    for round in 0..2000 {
                        let text = &texts[(round * 7 + w * 13) % texts.len()];
                        let v = Value::str(text);
                        let c = v.clone();
                        assert_eq!(c.as_text(), Some(text.as_str()));
                        drop(v);
                        assert_eq!(c.text(), text.as_str());
                    }
                });
            }
        });
        assert!(texts.iter().all(|t| !held(t)), "every churned text freed");
    }

    #[test]
    fn a_value_is_sixteen_bytes_and_orders_and_hashes_by_text_across_interning() {
        use std::hash::BuildHasher;
        let h = |v: &Value| foldhash::fast::FixedState::with_seed(1).hash_one(v);
        let text = format!("hashed-by-its-text-not-its-address-{}", std::process::id());
        let first = h(&Value::str(&text));
        // Freed and interned again (at another address, likely): same hash.
        assert_eq!(h(&Value::str(&text)), first);
        let (a, b) = (Value::str(&format!("{text}-a")), Value::str(&format!("{text}-b")));
        assert_eq!(a.cmp(&b), a.clone().cmp(&b.clone()));
        assert_ne!(a.cmp(&b), Ordering::Equal);
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
