//! The syntax tree of rule files, exactly as written. Every node has a span.

use crate::source::Span;
use std::net::IpAddr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Type {
    /// Any UTF-8 text.
    String,
    /// Text that must satisfy the name rule `[a-z0-9]([a-z0-9._-]*[a-z0-9])?`, ≤ 63 chars.
    Name,
    /// A signed 64-bit integer.
    Int,
}

impl Type {
    pub fn keyword(self) -> &'static str {
        match self {
            Type::String => "string",
            Type::Name => "name",
            Type::Int => "int",
        }
    }
    /// `name` is a `string` with a stricter input check; they mix freely in rules.
    pub fn compatible(self, other: Type) -> bool {
        self.is_text() == other.is_text()
    }
    pub fn is_text(self) -> bool {
        matches!(self, Type::String | Type::Name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeclKind {
    /// Read from etcd keys matching the pattern.
    Input,
    /// Written to etcd keys built from the pattern.
    Output,
    /// Internal: neither read nor written.
    Relation,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: Ident,
    /// The base type; for a named type (`bool`, or one declared with
    /// `type`), what the checker resolves it to (`string` until then).
    pub ty: Type,
    pub ty_span: Span,
    /// `bool` or a declared type's name, when the column is not a plain
    /// `string`, `name` or `int`.
    pub ty_name: Option<String>,
}

/// `type NAME = int in LO..=HI`, `type NAME = int in LO..`, or
/// `type NAME = "a" | "b" | …`: a refinement of `int` or of `string` that
/// inputs are checked against and constants must fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeDecl {
    pub name: Ident,
    pub def: TypeDef,
    pub doc: Option<String>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TypeDef {
    /// An int in `lo..=hi` (or `lo..`: no upper bound).
    IntRange { lo: i64, hi: Option<i64> },
    /// One of these strings.
    Enum(Vec<(String, Span)>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decl {
    pub kind: DeclKind,
    pub name: Ident,
    pub columns: Vec<Column>,
    /// The key pattern (`from` for inputs, `to` for outputs), without quotes.
    pub pattern: Option<(String, Span)>,
    /// `relation r(…) = assign(a, b, c, d, e)`: computed by a built-in, not by rules.
    pub builtin: Option<BuiltinCall>,
    /// The `///` comment lines right above the declaration, joined.
    pub doc: Option<String>,
    pub span: Span,
}

/// A built-in applied to relations: `assign(pending, need, …)` (program::ASSIGN).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltinCall {
    pub name: Ident,
    pub args: Vec<Ident>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Literal {
    Int(i64),
    Str(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    /// `++`: string concatenation; int operands are written in decimal.
    Concat,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Concat => "++",
        }
    }
    /// Binding strength: higher binds tighter.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Concat => 1,
            BinOp::Add | BinOp::Sub => 2,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 3,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprKind {
    Lit(Literal),
    Var(String),
    /// `_` (only meaningful as an atom argument).
    Wildcard,
    Neg(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// A built-in function: `len(s)`, `min(a, b)`, `starts_with(s, p)`, ….
    Call(Func, Vec<Expr>),
}

/// The built-in functions expressions may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Func {
    /// `len(text)`: its length in characters.
    Len,
    /// `bytes(text)`: its length in bytes (UTF-8), where sizes matter.
    Bytes,
    /// `min(a, b)`, `max(a, b)`: the smaller or larger of two ints, or of two
    /// texts (by their text).
    Min,
    Max,
    /// `starts_with(text, prefix)`, `contains(text, part)`: `true` or `false`.
    StartsWith,
    Contains,
    /// `to_string(int)`: its decimal text.
    ToString,
    /// `before(text, sep)`: the text before the first `sep` (all of it if
    /// there is none); `after(text, sep)`: the text after it ("" if none).
    Before,
    After,
    /// `in_network(address, networks)`: `true` if the IP address lies in one
    /// of the comma-separated CIDR networks (`10.0.1.0/24,fd00::/64`).
    InNetwork,
}

impl Func {
    pub const ALL: [Func; 10] =
        [Func::Len, Func::Bytes, Func::Min, Func::Max, Func::StartsWith, Func::Contains, Func::ToString, Func::Before, Func::After, Func::InNetwork];

    pub fn name(self) -> &'static str {
        match self {
            Func::Len => "len",
            Func::Bytes => "bytes",
            Func::Min => "min",
            Func::Max => "max",
            Func::StartsWith => "starts_with",
            Func::Contains => "contains",
            Func::ToString => "to_string",
            Func::Before => "before",
            Func::After => "after",
            Func::InNetwork => "in_network",
        }
    }

    pub fn from_name(name: &str) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn arity(self) -> usize {
        match self {
            Func::Len | Func::Bytes | Func::ToString => 1,
            _ => 2,
        }
    }

    /// Whether it gives `true` or `false` (usable alone as a body literal).
    pub fn is_predicate(self) -> bool {
        matches!(self, Func::StartsWith | Func::Contains | Func::InNetwork)
    }
}

/// `in_network`'s meaning: `address` is an IPv4 or IPv6 address inside one
/// of the comma-separated CIDR `networks` (a bare address is a /32 or /128).
/// Anything unparsable is outside: a malformed range admits nothing.
pub fn in_network(address: &str, networks: &str) -> bool {
    let Ok(addr) = address.trim().parse::<IpAddr>() else { return false };
    networks.split(',').filter_map(|net| parse_network(net.trim()).ok()).any(|(base, bits)| match (addr, base) {
        (IpAddr::V4(a), IpAddr::V4(b)) => same_prefix(u32::from(a).into(), u32::from(b).into(), bits, 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => same_prefix(a.into(), b.into(), bits, 128),
        _ => false,
    })
}

/// Checks a comma-separated list of CIDR networks as `in_network` reads it;
/// the error names the first entry that is not one.
pub fn check_networks(networks: &str) -> Result<(), String> {
    networks.split(',').try_for_each(|net| parse_network(net.trim()).map(drop))
}

/// One network: `BASE/BITS`, or a bare address (all its bits).
fn parse_network(net: &str) -> Result<(IpAddr, u8), String> {
    let (base, bits) = net.split_once('/').map_or((net, None), |(b, bits)| (b, Some(bits)));
    let base: IpAddr = base.parse().map_err(|_| format!("{net:?} is not an IP address or CIDR network (10.0.1.0/24, fd00::/64)"))?;
    let width = if base.is_ipv4() { 32 } else { 128 };
    match bits.map(str::parse::<u8>) {
        None => Ok((base, width)),
        Some(Ok(b)) if b <= width => Ok((base, b)),
        Some(_) => Err(format!("{net:?}: the prefix length must be 0..={width}")),
    }
}

/// Whether `a` and `b` (`width` bits wide) agree on their first `bits`.
fn same_prefix(a: u128, b: u128, bits: u8, width: u8) -> bool {
    let shift = u32::from(width - bits);
    shift >= 128 || (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests {
    use super::in_network;

    #[test]
    fn in_network_matches_v4_and_v6_prefixes_and_refuses_junk() {
        assert!(in_network("10.0.1.7", "10.0.1.0/24"));
        assert!(!in_network("10.0.2.7", "10.0.1.0/24"));
        assert!(in_network("10.0.2.7", "10.0.1.0/24, 10.0.2.0/24"));
        assert!(in_network("192.168.0.1", "192.168.0.1"));
        assert!(!in_network("192.168.0.2", "192.168.0.1"));
        assert!(in_network("1.2.3.4", "0.0.0.0/0"));
        assert!(in_network("fd00::1", "fd00::/64"));
        assert!(!in_network("fd01::1", "fd00::/64"));
        assert!(in_network("::1", "::/0"));
        // Families never mix; junk admits nothing.
        assert!(!in_network("10.0.0.1", "::/0"));
        assert!(!in_network("10.0.0.1", "10.0.0.0/33"));
        assert!(!in_network("10.0.0.1", "10.0.0.0/-1"));
        assert!(!in_network("10.0.0.1", "10.0.0.0/"));
        assert!(!in_network("10.0.0.1", ""));
        assert!(!in_network("10.0.0.1/8", "10.0.0.0/8"));
        assert!(!in_network("not an ip", "0.0.0.0/0"));
        assert!(!in_network("10.0.0.1", "garbage/8"));
    }

    #[test]
    fn check_networks_names_the_bad_entry() {
        use super::check_networks;
        assert_eq!(check_networks("10.0.1.0/24, fd00::/64"), Ok(()));
        assert_eq!(check_networks("192.168.0.7"), Ok(()));
        assert!(check_networks("10.0.1.0/24,10.0.0.0/33").unwrap_err().contains("\"10.0.0.0/33\""));
        assert!(check_networks("10.0.0.0/").is_err());
        assert!(check_networks("").is_err());
        assert!(check_networks("10.0.0.0/24,").unwrap_err().contains("\"\""));
        assert!(check_networks("zone-a").unwrap_err().contains("zone-a"));
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Atom {
    pub relation: Ident,
    pub args: Vec<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyItem {
    Pos(Atom),
    /// `not p(..)`: holds when no matching fact exists.
    Neg(Atom),
    /// `lhs op rhs`; `x = e` with `x` unbound binds `x`.
    Cmp(CmpOp, Expr, Expr, Span),
    /// `v in lo..hi`: binds `v` to each integer in `[lo, hi)`.
    Range(Ident, Expr, Expr, Span),
}

impl BodyItem {
    pub fn span(&self) -> Span {
        match self {
            BodyItem::Pos(a) | BodyItem::Neg(a) => a.span,
            BodyItem::Cmp(_, _, _, s) | BodyItem::Range(_, _, _, s) => *s,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AggKind {
    /// `count()`: the number of distinct body matches in the group.
    Count,
    Sum,
    Min,
    Max,
    /// `arg_max(v, k)`: the `v` of the match with the largest `k`; ties → smallest `v`.
    ArgMax,
    /// `arg_min(v, k)`: the `v` of the match with the smallest `k`; ties → smallest `v`.
    ArgMin,
}

impl AggKind {
    pub fn keyword(self) -> &'static str {
        match self {
            AggKind::Count => "count",
            AggKind::Sum => "sum",
            AggKind::Min => "min",
            AggKind::Max => "max",
            AggKind::ArgMax => "arg_max",
            AggKind::ArgMin => "arg_min",
        }
    }
    pub fn arity(self) -> usize {
        match self {
            AggKind::Count => 0,
            AggKind::Sum | AggKind::Min | AggKind::Max => 1,
            AggKind::ArgMax | AggKind::ArgMin => 2,
        }
    }
    pub const ALL: [AggKind; 6] = [AggKind::Count, AggKind::Sum, AggKind::Min, AggKind::Max, AggKind::ArgMax, AggKind::ArgMin];
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadTerm {
    Expr(Expr),
    /// `sum(c)`, or `sum(c) default 0` (with a `per` atom on the rule: the
    /// value of a group the body does not match).
    Agg(AggKind, Vec<Expr>, Option<Box<Expr>>, Span),
}

impl HeadTerm {
    pub fn span(&self) -> Span {
        match self {
            HeadTerm::Expr(e) => e.span,
            HeadTerm::Agg(_, _, _, s) => *s,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub head: Ident,
    pub head_terms: Vec<HeadTerm>,
    pub head_span: Span,
    pub body: Vec<BodyItem>,
    /// `… per ready(n).`: the groups an aggregate rule has, matched or not
    /// (those the body does not match get the aggregates' defaults).
    pub per: Option<Atom>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Decl(Decl),
    Type(TypeDecl),
    Rule(Rule),
}

/// One parsed rule file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct File {
    pub items: Vec<Item>,
}

/// Words that cannot name a relation or a variable.
/// (Type names, `from`/`to` and aggregate names are recognised by position only,
/// so `count` or `name` can still name a column or a variable.)
pub const KEYWORDS: &[&str] = &["input", "output", "relation", "type", "not", "in", "true", "false", "per", "default"];
