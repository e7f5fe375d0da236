//! The credentials file: `NAME:PASSWORD` lines, mode 0600, appended to by
//! `ccattler auth …` and read by `--credentials FILE --as NAME`. A later
//! line for a name wins (a rotated password is appended). Passwords are
//! generated here and go nowhere else: never to stdout, stderr or a log.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is readable by group or others (mode {mode:o}); a credentials file must be 0600")]
    Mode { path: PathBuf, mode: u32 },
    #[error("{path}:{line}: not NAME:PASSWORD")]
    Line { path: PathBuf, line: usize },
    #[error("{path} has no credentials for {name:?} (it has: {have})")]
    Missing { path: PathBuf, name: String, have: String },
}

/// A password held in memory, wiped when dropped.
pub type Password = Zeroizing<String>;

/// A new random password: 24 bytes of the OS's randomness, base64url.
pub fn generate_password() -> Password {
    use crypto_box::aead::rand_core::RngCore;
    let mut bytes = Zeroizing::new([0u8; 24]);
    crypto_box::aead::OsRng.fill_bytes(bytes.as_mut());
    Zeroizing::new(B64.encode(bytes.as_ref()))
}

fn check_mode(path: &Path) -> Result<(), CredentialsError> {
    let meta = std::fs::metadata(path).map_err(|source| CredentialsError::Io { path: path.into(), source })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(CredentialsError::Mode { path: path.into(), mode });
    }
    Ok(())
}

/// Every `(name, password)` in the file, in order.
pub fn read_all(path: &Path) -> Result<Vec<(String, Password)>, CredentialsError> {
    check_mode(path)?;
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|source| CredentialsError::Io { path: path.into(), source })?);
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        match line.split_once(':') {
            Some((name, pw)) if !name.is_empty() && !pw.is_empty() => out.push((name.to_string(), Zeroizing::new(pw.to_string()))),
            _ => return Err(CredentialsError::Line { path: path.into(), line: i + 1 }),
        }
    }
    Ok(out)
}

/// The password for `name` (its last line).
pub fn password(path: &Path, name: &str) -> Result<Password, CredentialsError> {
    let all = read_all(path)?;
    if let Some((_, pw)) = all.iter().rev().find(|(n, _)| n == name) {
        return Ok(pw.clone());
    }
    let mut have: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    have.sort();
    have.dedup();
    Err(CredentialsError::Missing { path: path.into(), name: name.into(), have: if have.is_empty() { "none".into() } else { have.join(", ") } })
}

/// Appends `NAME:PASSWORD` lines, creating the file with mode 0600 (an
/// existing file must already be 0600), and syncs it to disk.
pub fn append(path: &Path, entries: &[(&str, &Password)]) -> Result<(), CredentialsError> {
    let io = |source| CredentialsError::Io { path: path.into(), source };
    if path.exists() {
        check_mode(path)?;
    }
    let mut f = std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(path).map_err(io)?;
    let mut text = Zeroizing::new(String::new());
    for (name, pw) in entries {
        text.push_str(name);
        text.push(':');
        text.push_str(pw);
        text.push('\n');
    }
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_credentials_are_0600_and_the_last_line_wins() {
        let dir = std::env::temp_dir().join(format!("ccattler-creds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("credentials");
        let (a, b) = (generate_password(), generate_password());
        assert_ne!(*a, *b);
        assert!(a.len() >= 32);
        append(&path, &[("root", &a), ("agent-n1", &a)]).unwrap();
        append(&path, &[("agent-n1", &b)]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(*password(&path, "agent-n1").unwrap(), *b);
        let missing = password(&path, "user").unwrap_err().to_string();
        assert!(missing.contains("agent-n1, root") && !missing.contains(a.as_str()), "{missing}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(password(&path, "root"), Err(CredentialsError::Mode { mode: 0o640, .. })));
        assert!(matches!(append(&path, &[("x", &a)]), Err(CredentialsError::Mode { .. })), "never appends to a readable file");
    }
}
