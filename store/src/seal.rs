//! Secret values, never plain in etcd, in a log or on an agent's disk.
//!
//! * `secret/value/NAME` holds the value sealed with the cluster's secret key
//!   (XSalsa20-Poly1305, a random 24-byte nonce): `ccattler-secret-v1 KID B64`,
//!   where KID names the key of the [`ClusterKeys`] file that sealed it, so
//!   the key can be rotated (a new key first in the file; `secret reseal`).
//! * `secret/node/N/NAME` holds the same value sealed to node N's X25519
//!   public key (a libsodium-style sealed box: an ephemeral key pair per
//!   message): `ccattler-node-v1 VERSION PUBKEY B64`. VERSION is the
//!   mod_revision of `secret/value/NAME` it was made from and PUBKEY the key
//!   it was sealed to, so the controller re-seals exactly when either moves
//!   and the agent restarts an instance exactly when VERSION does.
//!
//! Every plaintext is `NAME \0 VALUE`: a sealed value copied under another
//! name does not open. All of it is RustCrypto's (`crypto_secretbox`,
//! `crypto_box`); nothing here is hand-made cryptography.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use crypto_box::aead::{Aead, AeadCore, KeyInit, OsRng};

use crypto_secretbox::XSalsa20Poly1305;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The largest secret value accepted (an environment variable must fit).
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

const VALUE_TAG: &str = "ccattler-secret-v1";
const NODE_TAG: &str = "ccattler-node-v1";

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {why}")]
    KeyFile { path: PathBuf, why: String },
    #[error("{path} is readable by group or others (mode {mode:o}); a key file must be 0600")]
    Mode { path: PathBuf, mode: u32 },
    #[error("secret {name:?}: {why}")]
    Value { name: String, why: String },
    #[error("secret {name:?} is sealed with key {kid}, which the key file does not hold")]
    UnknownKey { name: String, kid: String },
    #[error("secret {name:?} does not open: not sealed for {what}, or corrupted")]
    Open { name: String, what: &'static str },
    #[error("node public key {0:?} is not 32 bytes of base64")]
    PublicKey(String),
}

/// A secret value held in memory, wiped when dropped.
pub type Plain = Zeroizing<Vec<u8>>;

/// Checks a value a user wants to store: not empty, no NUL (it becomes an
/// environment variable), at most [`MAX_SECRET_BYTES`].
pub fn check_value(name: &str, value: &[u8]) -> Result<(), SealError> {
    let why = if value.is_empty() {
        "the value is empty".to_string()
    } else if value.len() > MAX_SECRET_BYTES {
        format!("the value is {} bytes, over the {MAX_SECRET_BYTES} byte limit", value.len())
    } else if value.contains(&0) {
        "the value contains a NUL byte (it is handed to instances as an environment variable)".to_string()
    } else {
        return Ok(());
    };
    Err(SealError::Value { name: name.into(), why })
}

fn plaintext(name: &str, value: &[u8]) -> Plain {
    let mut p = Zeroizing::new(Vec::with_capacity(name.len() + 1 + value.len()));
    p.extend_from_slice(name.as_bytes());
    p.push(0);
    p.extend_from_slice(value);
    p
}

/// The value of a plaintext made for `name`, if it was made for `name`.
fn value_of(name: &str, plain: Plain) -> Option<Plain> {
    let rest = plain.strip_prefix(name.as_bytes())?.strip_prefix(&[0])?;
    Some(Zeroizing::new(rest.to_vec()))
}

/// Reads a file that holds key material: it must not be readable by group or others.
fn read_private(path: &Path) -> Result<Zeroizing<String>, SealError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| SealError::Io { path: path.to_path_buf(), source };
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(SealError::Mode { path: path.to_path_buf(), mode: mode & 0o777 });
    }
    Ok(Zeroizing::new(std::fs::read_to_string(path).map_err(io)?))
}

/// Creates `path` with mode 0600 holding `text`; refuses to overwrite.
pub(crate) fn create_private(path: &Path, text: &str) -> Result<(), SealError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| SealError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

/// The cluster's secret keys: the file given as `--secret-key`, one base64
/// key (32 bytes) a line, `#` comments; the first key seals, every key opens.
pub struct ClusterKeys {
    keys: Vec<(String, XSalsa20Poly1305)>,
}

/// A key's id: the first 8 hex digits of a BLAKE2s hash of it (names the
/// key in sealed values; says nothing about it).
fn key_id(key: &[u8]) -> String {
    use blake2::Digest;
    let mut h = blake2::Blake2s256::new();
    h.update(b"ccattler cluster key id\0");
    h.update(key);
    h.finalize()[..4].iter().map(|b| format!("{b:02x}")).collect()
}

impl ClusterKeys {
    /// Reads a key file (mode 0600, at least one key).
    pub fn load(path: &Path) -> Result<ClusterKeys, SealError> {
        let text = read_private(path)?;
        let bad = |line: usize, why: &str| SealError::KeyFile { path: path.to_path_buf(), why: format!("line {line}: {why}") };
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = Zeroizing::new(B64.decode(line).map_err(|_| bad(i + 1, "not base64"))?);
            if bytes.len() != 32 {
                return Err(bad(i + 1, "a key is 32 bytes"));
            }
            keys.push((key_id(&bytes), XSalsa20Poly1305::new_from_slice(&bytes).expect("32 bytes")));
        }
        if keys.is_empty() {
            return Err(SealError::KeyFile { path: path.to_path_buf(), why: "holds no key".into() });
        }
        Ok(ClusterKeys { keys })
    }

    /// Creates a key file with one new random key (mode 0600; never overwrites).
    pub fn create(path: &Path) -> Result<ClusterKeys, SealError> {
        let key = XSalsa20Poly1305::generate_key(&mut OsRng);
        let line = Zeroizing::new(format!("# ccattler cluster secret key (first line seals; every line opens)\n{}\n", B64.encode(key)));
        create_private(path, &line)?;
        Self::load(path)
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> &str {
        &self.keys[0].0
    }

    /// `secret/value/NAME`'s value for `value`.
    pub fn seal(&self, name: &str, value: &[u8]) -> Result<String, SealError> {
        check_value(name, value)?;
        let (kid, cipher) = &self.keys[0];
        let nonce = XSalsa20Poly1305::generate_nonce(&mut OsRng);
        let sealed = cipher.encrypt(&nonce, plaintext(name, value).as_slice()).expect("sealing in memory does not fail");
        let mut out = nonce.to_vec();
        out.extend(sealed);
        Ok(format!("{VALUE_TAG} {kid} {}", B64.encode(out)))
    }

    /// Opens a `secret/value/NAME` value.
    pub fn open(&self, name: &str, sealed: &str) -> Result<Plain, SealError> {
        let broken = || SealError::Open { name: name.into(), what: "this cluster's key" };
        let mut parts = sealed.split(' ');
        let (Some(VALUE_TAG), Some(kid), Some(body), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else { return Err(broken()) };
        let cipher = &self.keys.iter().find(|(id, _)| id == kid).ok_or_else(|| SealError::UnknownKey { name: name.into(), kid: kid.into() })?.1;
        let bytes = B64.decode(body).map_err(|_| broken())?;
        if bytes.len() < 24 {
            return Err(broken());
        }
        let (nonce, ct) = bytes.split_at(24);
        let plain = Zeroizing::new(cipher.decrypt(nonce.into(), ct).map_err(|_| broken())?);
        value_of(name, plain).ok_or_else(broken)
    }

    /// The id of the key a sealed value names, if it is one.
    pub fn sealed_with(sealed: &str) -> Option<&str> {
        let mut parts = sealed.split(' ');
        (parts.next() == Some(VALUE_TAG)).then(|| parts.next()).flatten()
    }
}

/// A node's key pair: made by its agent in its state dir (mode 0600); the
/// public half is published at `observed/node/N/pubkey`.
pub struct NodeKey {
    secret: crypto_box::SecretKey,
}

impl NodeKey {
    /// Reads the key at `path`, or makes one there if there is none.
    pub fn load_or_create(path: &Path) -> Result<NodeKey, SealError> {
        if !path.exists() {
            let secret = crypto_box::SecretKey::generate(&mut OsRng);
            let text = Zeroizing::new(format!("{}\n", B64.encode(secret.to_bytes())));
            match create_private(path, &text) {
                Ok(()) => return Ok(NodeKey { secret }),
                // Made by someone else meanwhile: read theirs.
                Err(SealError::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let text = read_private(path)?;
        let bytes = Zeroizing::new(B64.decode(text.trim()).map_err(|_| SealError::KeyFile { path: path.into(), why: "not base64".into() })?);
        let bytes: [u8; 32] = bytes.as_slice().try_into().map_err(|_| SealError::KeyFile { path: path.into(), why: "a key is 32 bytes".into() })?;
        Ok(NodeKey { secret: crypto_box::SecretKey::from_bytes(bytes) })
    }

    /// The public half, base64 (the value of `observed/node/N/pubkey`).
    pub fn public(&self) -> String {
        B64.encode(self.secret.public_key().as_bytes())
    }

    /// Opens a `secret/node/N/NAME` value: its version and the value.
    pub fn open(&self, name: &str, sealed: &str) -> Result<(i64, Plain), SealError> {
        let broken = || SealError::Open { name: name.into(), what: "this node's key" };
        let s = NodeSealed::parse(sealed).ok_or_else(broken)?;
        if s.pubkey != self.public() {
            return Err(broken());
        }
        let bytes = B64.decode(s.body).map_err(|_| broken())?;
        let plain = Zeroizing::new(self.secret.unseal(&bytes).map_err(|_| broken())?);
        Ok((s.version, value_of(name, plain).ok_or_else(broken)?))
    }
}

/// The parts of a `secret/node/N/NAME` value (only the body is secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSealed<'a> {
    pub version: i64,
    pub pubkey: &'a str,
    body: &'a str,
}

impl<'a> NodeSealed<'a> {
    pub fn parse(text: &'a str) -> Option<NodeSealed<'a>> {
        let mut parts = text.split(' ');
        let (Some(NODE_TAG), Some(version), Some(pubkey), Some(body), None) = (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        Some(NodeSealed { version: version.parse().ok()?, pubkey, body })
    }
}

/// Seals `value` (the secret `name` at `version`) to a node's public key.
pub fn seal_to_node(pubkey: &str, name: &str, value: &[u8], version: i64) -> Result<String, SealError> {
    let bytes: [u8; 32] = B64.decode(pubkey).ok().and_then(|b| b.try_into().ok()).ok_or_else(|| SealError::PublicKey(pubkey.into()))?;
    let public = crypto_box::PublicKey::from_bytes(bytes);
    let sealed = public.seal(&mut OsRng, &plaintext(name, value)).expect("sealing in memory does not fail");
    Ok(format!("{NODE_TAG} {version} {pubkey} {}", B64.encode(sealed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ccattler-seal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_value_sealed_with_the_cluster_key_opens_only_under_its_name() {
        let dir = tmp("cluster");
        let keys = ClusterKeys::create(&dir.join("key")).unwrap();
        let sealed = keys.seal("db-pass", b"hunter2").unwrap();
        assert!(!sealed.contains("hunter2"));
        assert_eq!(keys.open("db-pass", &sealed).unwrap().as_slice(), b"hunter2");
        assert!(matches!(keys.open("other", &sealed), Err(SealError::Open { .. })), "moved to another name");
        // Two seals of one value differ (random nonce).
        assert_ne!(keys.seal("db-pass", b"hunter2").unwrap(), sealed);
        // Another cluster's key does not open it.
        let other = ClusterKeys::create(&dir.join("other")).unwrap();
        assert!(matches!(other.open("db-pass", &sealed), Err(SealError::UnknownKey { .. })));
        assert!(ClusterKeys::create(&dir.join("key")).is_err(), "never overwrites a key file");
    }

    #[test]
    fn a_rotated_key_file_opens_old_values_and_seals_with_the_new_key() {
        let dir = tmp("rotate");
        let old = ClusterKeys::create(&dir.join("old")).unwrap();
        let sealed_old = old.seal("a", b"1").unwrap();
        let new = ClusterKeys::create(&dir.join("new")).unwrap();
        let old_line = std::fs::read_to_string(dir.join("old")).unwrap();
        let new_line = std::fs::read_to_string(dir.join("new")).unwrap();
        create_private(&dir.join("both"), &format!("{new_line}{old_line}")).unwrap();
        let both = ClusterKeys::load(&dir.join("both")).unwrap();
        assert_eq!(both.open("a", &sealed_old).unwrap().as_slice(), b"1");
        assert_eq!(both.current_id(), new.current_id());
        assert_eq!(ClusterKeys::sealed_with(&both.seal("a", b"1").unwrap()), Some(new.current_id()));
    }

    #[test]
    fn key_files_readable_by_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("mode");
        ClusterKeys::create(&dir.join("key")).unwrap();
        std::fs::set_permissions(dir.join("key"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(ClusterKeys::load(&dir.join("key")), Err(SealError::Mode { mode: 0o644, .. })));
        std::fs::write(dir.join("empty"), "# nothing\n").unwrap();
        std::fs::set_permissions(dir.join("empty"), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(ClusterKeys::load(&dir.join("empty")), Err(SealError::KeyFile { .. })));
    }

    #[test]
    fn a_value_sealed_to_a_node_opens_only_with_that_node_key() {
        let dir = tmp("node");
        let n1 = NodeKey::load_or_create(&dir.join("n1.key")).unwrap();
        let n2 = NodeKey::load_or_create(&dir.join("n2.key")).unwrap();
        assert_eq!(NodeKey::load_or_create(&dir.join("n1.key")).unwrap().public(), n1.public(), "kept across restarts");
        let sealed = seal_to_node(&n1.public(), "db-pass", b"hunter2", 42).unwrap();
        assert!(!sealed.contains("hunter2"));
        let (version, value) = n1.open("db-pass", &sealed).unwrap();
        assert_eq!((version, value.as_slice()), (42, &b"hunter2"[..]));
        assert!(n2.open("db-pass", &sealed).is_err());
        assert!(n1.open("api-key", &sealed).is_err());
        assert_eq!(NodeSealed::parse(&sealed).unwrap().pubkey, n1.public());
        assert!(seal_to_node("not a key", "x", b"v", 1).is_err());
    }

    #[test]
    fn values_that_cannot_be_an_environment_variable_are_refused() {
        assert!(check_value("a", b"").is_err());
        assert!(check_value("a", b"x\0y").is_err());
        assert!(check_value("a", &vec![b'x'; MAX_SECRET_BYTES + 1]).is_err());
        assert!(check_value("a", "p\u{e4}ss\n".as_bytes()).is_ok());
    }
}
