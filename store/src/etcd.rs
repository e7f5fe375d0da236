//! etcd access: connect (with user and password or TLS), a paginated
//! snapshot at one revision, watches that take etcd's large catch-up
//! responses, and fenced compare-and-swap transactions.

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, Txn, TxnOp, WatchOptions, WatchStream, Watcher};

pub use etcd_client::Error as EtcdError;

/// A key as etcd holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub value: String,
    pub mod_revision: i64,
    pub create_revision: i64,
}

/// One write, guarded by what etcd held when it was planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// The key must not exist (`create_revision == 0`): never overwrites.
    Create { key: String, value: String },
    /// The key must still be at `mod_revision`.
    Update { key: String, value: String, mod_revision: i64 },
    /// The key must still be at `mod_revision`.
    Delete { key: String, mod_revision: i64 },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
        }
    }
}

/// How to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    pub user: Option<(String, String)>,
    /// Built from [`TlsFiles`] once, so a file problem is reported up front.
    pub tls: Option<etcd_client::TlsOptions>,
}

/// PEM files for TLS: the CA that signed etcd's certificate, and optionally a
/// client certificate and key.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

/// A TLS file that cannot be read (named).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct TlsFileError {
    pub path: std::path::PathBuf,
    pub source: std::io::Error,
}

impl TlsFiles {
    pub fn options(&self) -> Result<etcd_client::TlsOptions, TlsFileError> {
        let read = |p: &std::path::PathBuf| std::fs::read(p).map_err(|source| TlsFileError { path: p.clone(), source });
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(tls)
    }
}

/// Connects to one member that answers with a quorum behind it, trying the
/// endpoints in turn (starting one further each call, so clients spread over
/// the members). A client is pinned to its member: when that member dies its
/// requests fail, and whoever holds it connects again — to a live member.
/// (etcd-client's own balancing over several endpoints kept sending requests
/// to a killed member.)
pub async fn connect(cfg: &EtcdConfig) -> Result<Client, EtcdError> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = cfg.endpoints.len().max(1);
    let first = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n;
    let mut last = None;
    for k in 0..n {
        let Some(endpoint) = cfg.endpoints.get((first + k) % n) else { break };
        match connect_one(cfg, endpoint).await {
            Ok(c) => return Ok(c),
            Err(e) => {
                tracing::debug!(%endpoint, error = %e, "etcd member unusable; trying the next");
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| EtcdError::InvalidArgs("no etcd endpoint given".into())))
}

/// A client of one member, if it answers a linearizable read (which needs a
/// quorum) within a few seconds; "permission denied" is an answer too.
async fn connect_one(cfg: &EtcdConfig, endpoint: &str) -> Result<Client, EtcdError> {
    let timeout = std::time::Duration::from_secs(3);
    let mut opts = ConnectOptions::new().with_connect_timeout(timeout).with_keep_alive(std::time::Duration::from_secs(5), timeout);
    if let Some((u, p)) = &cfg.user {
        opts = opts.with_user(u.clone(), p.clone());
    }
    if let Some(tls) = &cfg.tls {
        opts = opts.with_tls(tls.clone());
    }
    let mut client = tokio::time::timeout(timeout, Client::connect([endpoint], Some(opts)))
        .await
        .map_err(|_| EtcdError::InvalidArgs(format!("{endpoint}: no answer within {timeout:?}")))??;
    match tokio::time::timeout(timeout, client.get("status/derived_revision", None)).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) if crate::auth::is_permission_denied(&e) => Ok(client),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(EtcdError::InvalidArgs(format!("{endpoint}: no quorum answer within {timeout:?}"))),
    }
}

/// The largest watch response accepted: etcd's own client accepts up to
/// `i32::MAX` bytes. A watcher catching up gets up to 1,000 revisions in one
/// response (128-operation transactions make that ~8 MB), over tonic's 4 MiB
/// default, which would break the watch.
pub const MAX_WATCH_RESPONSE: usize = i32::MAX as usize;

/// Starts a watch that accepts responses up to [`MAX_WATCH_RESPONSE`].
pub async fn watch(client: &Client, key: impl Into<Vec<u8>>, options: WatchOptions) -> Result<(Watcher, WatchStream), EtcdError> {
    client.watch_client().max_decoding_message_size(MAX_WATCH_RESPONSE).watch(key, Some(options)).await
}

/// Keys and values are UTF-8 text. A key that is not starts with this
/// character and goes on with its bytes in hex; a value that is not becomes
/// this character and what it was. Nothing lossy: the rules never see such a
/// value as text (it is rejected, and recorded).
pub const NOT_UTF8: char = '\u{0}';

/// A key etcd holds, as text ([`NOT_UTF8`] and hex when it is not UTF-8).
pub fn key_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| format!("{NOT_UTF8}{}", e.as_bytes().iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// A value etcd holds, as text (marked with [`NOT_UTF8`] when it is not UTF-8).
pub fn value_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| format!("{NOT_UTF8}not UTF-8 ({} bytes)", e.as_bytes().len()))
}

pub fn held(kv: &KeyValue) -> Option<(String, Held)> {
    let key = key_text(kv.key().to_vec());
    let value = value_text(kv.value().to_vec());
    Some((key, Held { value, mod_revision: kv.mod_revision(), create_revision: kv.create_revision() }))
}

/// [`held`] without copying the key and value out of a key/value etcd sent.
fn into_held(kv: KeyValue) -> Option<(String, Held)> {
    let (mod_revision, create_revision) = (kv.mod_revision(), kv.create_revision());
    let (key, value) = kv.into_key_value();
    Some((key_text(key), Held { value: value_text(value), mod_revision, create_revision }))
}

/// Every key under `prefixes` at one revision (the current one), paginated.
pub async fn snapshot(client: &mut Client, prefixes: &[String], page: i64) -> Result<(i64, Vec<(String, Held)>), EtcdError> {
    snapshot_at(client, prefixes, page, None).await
}

/// [`snapshot`] at a past revision (None: the current one). A compacted
/// revision is an error from etcd that names it.
pub async fn snapshot_at(client: &mut Client, prefixes: &[String], page: i64, at: Option<i64>) -> Result<(i64, Vec<(String, Held)>), EtcdError> {
    let rev = match at {
        Some(r) => r,
        // A get of the first prefix as a key: one the reader may read.
        None => revision_reading(client, prefixes.first().filter(|p| !p.is_empty()).map_or("status/derived_revision", String::as_str)).await?,
    };
    let mut out = Vec::new();
    read_pages(client, prefixes, page, rev, |kvs| {
        out.extend(kvs);
        true
    })
    .await?;
    Ok((rev, out))
}

/// etcd's current revision (a cheap read), to fix the revision a snapshot's
/// pages are all read at.
pub async fn current_revision(client: &mut Client) -> Result<i64, EtcdError> {
    revision_reading(client, "status/derived_revision").await
}

/// etcd's current revision, from a get of `key` (it need not exist, but the
/// user must be allowed to read it: the autoscaler may not read `status/`).
pub async fn revision_reading(client: &mut Client, key: &str) -> Result<i64, EtcdError> {
    Ok(client.get(key, None).await?.header().map_or(0, |h| h.revision()))
}

/// Reads every key under `prefixes` at revision `rev`, a page at a time,
/// handing each page to `sink` as it arrives (in key order within a prefix);
/// stops early, without error, when `sink` returns false.
///
/// etcd 3.4 walks the rest of the range for every limited read, so many small
/// pages cost O(keys²): after the first page (at most `page` keys), pages are
/// sized from the bytes per key seen so far to about 3 MiB, under the 4 MiB
/// gRPC message limit, and halve if one is still too large.
pub async fn read_pages(
    client: &mut Client,
    prefixes: &[String],
    page: i64,
    rev: i64,
    mut sink: impl FnMut(Vec<(String, Held)>) -> bool,
) -> Result<(), EtcdError> {
    let mut page = page.max(1);
    for prefix in prefixes {
        let end = prefix_end(prefix);
        // The whole keyspace is ["\0", "\0"): etcd refuses an empty key.
        let mut start = if prefix.is_empty() { vec![0] } else { prefix.clone().into_bytes() };
        loop {
            let opts = GetOptions::new().with_range(end.clone()).with_revision(rev).with_limit(page);
            let mut resp = match client.get(start.clone(), Some(opts)).await {
                Ok(r) => r,
                Err(e) if page > 1 && is_too_large(&e) => {
                    page /= 2;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let kvs = resp.take_kvs();
            let bytes: usize = kvs.iter().map(|kv| kv.key().len() + kv.value().len() + 32).sum();
            if !kvs.is_empty() {
                let per_key = (bytes / kvs.len()).max(1);
                page = ((3 << 20) / per_key).max(1) as i64;
            }
            let more = resp.more() && !kvs.is_empty();
            if let Some(last) = kvs.last() {
                start = last.key().to_vec();
                start.push(0);
            }
            if !sink(kvs.into_iter().filter_map(into_held).collect()) {
                return Ok(());
            }
            if !more {
                break;
            }
        }
    }
    Ok(())
}

/// Why etcd refused a request for good: retrying it as it is can never
/// succeed (no permission, too large, too many operations). Everything else
/// (connection loss, a leader election, a timeout) may pass.
pub fn permanent_refusal(e: &EtcdError) -> Option<String> {
    let EtcdError::GRpcStatus(s) = e else { return None };
    use tonic::Code;
    let m = s.message();
    match s.code() {
        Code::PermissionDenied => Some(format!("permission denied ({m})")),
        Code::InvalidArgument if m.contains("too large") || m.contains("too many operations") || m.contains("duplicate key") => Some(m.to_string()),
        Code::ResourceExhausted if m.contains("message length too large") || m.contains("too large") => Some(m.to_string()),
        _ => None,
    }
}

/// Whether etcd refused a request because its client's auth token predates
/// a change to users or roles (`auth add-node`, `rotate`): a new connection
/// (a new token) is all it takes.
pub fn is_stale_auth(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s) if s.message().contains("revision of auth store is old") || s.message().contains("invalid auth token"))
}

/// Whether etcd refused a write because it is out of space (its NOSPACE
/// alarm is raised): reads and deletes still work; puts wait until an
/// administrator compacts, defragments and disarms it.
pub fn is_nospace(e: &EtcdError) -> bool {
    let text = e.to_string();
    text.contains("database space exceeded") || text.contains("etcdserver: no space")
}

/// What went wrong with etcd, for a person: which endpoint, which user, and
/// what to do about it (the raw error after it).
pub fn describe_error(e: &EtcdError, cfg: &EtcdConfig) -> String {
    let url = cfg.endpoints.join(",");
    let user = cfg.user.as_ref().map(|(u, _)| u.as_str());
    let who = user.map_or("no user".to_string(), |u| format!("user {u}"));
    let text = e.to_string();
    let has = |s: &str| text.contains(s);
    let hint = if has("authentication failed") || has("invalid user ID or password") {
        format!("etcd at {url} refused the password of {who}: check --credentials FILE and --as NAME (or --etcd-user/--etcd-password); as root, `ccattler auth rotate {}` gives it a new one", user.unwrap_or("NAME"))
    } else if has("authentication is not enabled") {
        format!("etcd at {url} has auth off, but {who} was given: drop the user, or turn auth on with `ccattler auth bootstrap`")
    } else if has("user name is empty") {
        format!("etcd at {url} has auth on and no user was given: pass --credentials FILE --as NAME (or --etcd-user and --etcd-password)")
    } else if is_stale_auth(e) {
        format!("etcd at {url}: the auth token of {who} is stale (users or roles changed): try again")
    } else if permanent_refusal(e).is_some_and(|w| w.starts_with("permission denied")) {
        format!("etcd at {url} denied {who}: each role reads and writes only its own prefixes (DESIGN §6; `ccattler auth` made them)")
    } else if has("tls handshake eof") || has("InvalidContentType") || has("corrupt message") {
        format!("TLS with etcd at {url} failed: it does not seem to speak TLS (use http://), or the port is not etcd's")
    } else if has("certificate") || has("UnknownIssuer") || has("tls") {
        format!("TLS with etcd at {url} failed: pass --etcd-ca with the CA that signed its certificate (and --etcd-cert/--etcd-key if it asks for a client certificate)")
    } else if has("tcp connect error")
        || has("Connection refused")
        || has("transport error")
        || has("dns error")
        || has("timed out")
        || has("deadline has elapsed")
    {
        format!("cannot reach etcd at {url} (as {who}): is it running, and is --etcd (env CCATTLER_ETCD) right?")
    } else {
        format!("etcd at {url} (as {who})")
    };
    format!("{hint}\n  ({text})")
}

/// Whether an error says the credentials are wrong (not that etcd is away):
/// retrying them cannot help.
pub fn is_denied_credentials(e: &EtcdError) -> bool {
    let text = e.to_string();
    text.contains("authentication failed")
        || text.contains("invalid user ID or password")
        || text.contains("user name is empty")
        || text.contains("authentication is not enabled")
}

/// Whether a response was over the gRPC message size limit.
fn is_too_large(e: &EtcdError) -> bool {
    let text = e.to_string();
    text.contains("message length too large") || text.contains("ResourceExhausted")
}

/// The end of the range of keys starting with `prefix`.
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The leadership a write is fenced by: the leader key as this controller created it.
#[derive(Clone, Debug)]
pub struct Fence {
    pub key: String,
    pub create_revision: i64,
}

/// The outcome of one transaction.
pub enum Written {
    /// Committed at this revision.
    Committed(i64),
    /// A compare failed (a key moved, or leadership was lost); etcd was at this revision.
    Refused(i64),
}

/// What a transaction's compares hold its ops to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// Each op's own compare (see [`Op`]).
    EachKey,
    /// One compare for the lot: no key in `[from, to)` was modified after
    /// `revision`. For ops planned from a view of etcd exact at `revision`,
    /// over a range only this writer writes, it refuses whenever the
    /// compares of [`Guard::EachKey`] would, but for a key deleted since
    /// (written as planned: a derived key deleted by hand comes back).
    /// Never weaker on what matters: a key created, changed or re-created
    /// since the plan is not overwritten. etcd reads the range's keys to
    /// judge it, so a writer keeps it to ranges that hold few.
    Unchanged { from: String, to: Vec<u8>, revision: i64 },
}

/// Writes `ops` in one transaction, fenced by leadership, each op guarded
/// by its own compare, with the `stamp` key put beside them (the
/// controller's `status/derived_revision`); at most max_txn_ops − 1 ops
/// with a stamp.
pub async fn write(client: &mut Client, fence: &Fence, ops: &[Op], stamp: Option<(&str, String)>) -> Result<Written, EtcdError> {
    write_guarded(client, fence, ops, &Guard::EachKey, stamp).await
}

/// [`write`] with the ops held by `guard`.
pub async fn write_guarded(client: &mut Client, fence: &Fence, ops: &[Op], guard: &Guard, stamp: Option<(&str, String)>) -> Result<Written, EtcdError> {
    let mut compares = vec![Compare::create_revision(fence.key.clone(), CompareOp::Equal, fence.create_revision)];
    if let Guard::Unchanged { from, to, revision } = guard {
        compares.push(Compare::mod_revision(from.clone(), CompareOp::Less, revision + 1).with_range(to.clone()));
    }
    let each = *guard == Guard::EachKey;
    let mut then = Vec::new();
    for op in ops {
        match op {
            Op::Create { key, value } => {
                if each {
                    compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
                }
                then.push(TxnOp::put(key.clone(), value.clone(), None));
            }
            Op::Update { key, value, mod_revision } => {
                if each {
                    compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *mod_revision));
                }
                then.push(TxnOp::put(key.clone(), value.clone(), None));
            }
            Op::Delete { key, mod_revision } => {
                if each {
                    compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *mod_revision));
                }
                then.push(TxnOp::delete(key.clone(), None));
            }
        }
    }
    if let Some((key, value)) = stamp {
        then.push(TxnOp::put(key, value, None));
    }
    let resp = client.txn(Txn::new().when(compares).and_then(then)).await?;
    let rev = resp.header().map_or(0, |h| h.revision());
    Ok(if resp.succeeded() { Written::Committed(rev) } else { Written::Refused(rev) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(super::prefix_end("a/"), b"a0".to_vec());
        assert_eq!(super::prefix_end(""), vec![0]);
    }
}
