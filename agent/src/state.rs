//! The agent's state directory: what survives the agent process.
//!
//! ```text
//! <state-dir>/lock                      flock: one agent per state dir
//! <state-dir>/lease                     the etcd lease id, reused while it lives
//! <state-dir>/node.key                  the node's X25519 secret key (0600)
//! <state-dir>/instances/<I>/record.json pid, start time, port, launch spec
//!                                       (secret names and versions, never values)
//! <state-dir>/instances/<I>/log         the instance's stdout and stderr
//! <state-dir>/instances/<I>/volumes/<V> non-persistent volumes (removed with I)
//! <state-dir>/volumes/<V>               persistent volumes (outlive instances)
//! ```

use crate::runtime::Launch;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state dir {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("state dir {0} is in use by another agent")]
    Locked(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io { path: path.to_path_buf(), source }
}

/// A started instance as the state dir remembers it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub service: String,
    pub pid: u32,
    pub start_time: u64,
    pub port: u16,
    pub launch: Launch,
    /// The user it runs as (`None`: the agent's own).
    #[serde(default)]
    pub uid: Option<u32>,
    /// Its cgroup's directories (empty: none).
    #[serde(default)]
    pub cgroup: Vec<PathBuf>,
}

pub struct StateDir {
    root: PathBuf,
    _lock: std::fs::File,
}

impl StateDir {
    /// Opens (creating) the dir and takes its lock.
    pub fn open(root: &Path) -> Result<Self, StateError> {
        std::fs::create_dir_all(root.join("instances")).map_err(io_err(root))?;
        std::fs::create_dir_all(root.join("volumes")).map_err(io_err(root))?;
        let lock_path = root.join("lock");
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io_err(&lock_path))?;
        // SAFETY: flock on a descriptor we own; released when the file closes.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(StateError::Locked(root.to_path_buf()));
        }
        Ok(StateDir { root: root.to_path_buf(), _lock: lock })
    }

    pub fn lease(&self) -> Option<i64> {
        std::fs::read_to_string(self.root.join("lease")).ok()?.trim().parse().ok()
    }

    pub fn set_lease(&self, id: Option<i64>) -> Result<(), StateError> {
        let path = self.root.join("lease");
        match id {
            Some(id) => write_atomic(&path, id.to_string().as_bytes()),
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&path)(e)),
                _ => Ok(()),
            },
        }
    }

    /// The node's key pair ([`ccattler_store::seal::NodeKey`]).
    pub fn node_key(&self) -> PathBuf {
        self.root.join("node.key")
    }

    pub fn instance_dir(&self, instance: &str) -> PathBuf {
        self.root.join("instances").join(instance)
    }

    /// The instance's own directory (its cwd and `HOME`, owned by its user);
    /// its record and log stay beside it, the agent's.
    pub fn work_dir(&self, instance: &str) -> PathBuf {
        self.instance_dir(instance).join("work")
    }

    pub fn log(&self, instance: &str) -> PathBuf {
        self.instance_dir(instance).join("log")
    }

    /// Every record, by instance; unreadable ones are logged and skipped.
    pub fn records(&self) -> BTreeMap<String, Record> {
        let mut out = BTreeMap::new();
        let Ok(dirs) = std::fs::read_dir(self.root.join("instances")) else { return out };
        for d in dirs.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let path = d.path().join("record.json");
            match std::fs::read(&path) {
                Ok(bytes) => match serde_json::from_slice(&bytes) {
                    Ok(r) => {
                        out.insert(name, r);
                    }
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "unreadable instance record, ignored"),
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "unreadable instance record, ignored"),
            }
        }
        out
    }

    /// Instances that have a directory (a record, a log or volumes).
    pub fn instance_dirs(&self) -> Vec<String> {
        let Ok(dirs) = std::fs::read_dir(self.root.join("instances")) else { return vec![] };
        dirs.flatten().map(|d| d.file_name().to_string_lossy().into_owned()).collect()
    }

    pub fn save(&self, instance: &str, record: &Record) -> Result<(), StateError> {
        let dir = self.instance_dir(instance);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let bytes = serde_json::to_vec_pretty(record).expect("records serialize");
        write_atomic(&dir.join("record.json"), &bytes)
    }

    /// Forgets a stopped instance's process (its dir stays while it is placed here).
    pub fn forget(&self, instance: &str) -> Result<(), StateError> {
        let path = self.instance_dir(instance).join("record.json");
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        }
    }

    /// Removes an instance's dir with its log and non-persistent volumes.
    pub fn remove_instance(&self, instance: &str) -> Result<(), StateError> {
        let dir = self.instance_dir(instance);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&dir)(e)),
            _ => Ok(()),
        }
    }

    /// Where a volume lives: persistent ones beside the instances, the
    /// others inside their instance's dir. (Created when the instance starts.)
    pub fn volume(&self, instance: &str, volume: &str, persistent: bool) -> PathBuf {
        if persistent {
            self.root.join("volumes").join(volume)
        } else {
            self.instance_dir(instance).join("volumes").join(volume)
        }
    }

    /// Creates a directory the state dir hands out (a volume).
    pub fn create(&self, dir: &Path) -> Result<(), StateError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))
    }

    /// Persistent volumes on this node.
    pub fn persistent_volumes(&self) -> Vec<String> {
        let Ok(dirs) = std::fs::read_dir(self.root.join("volumes")) else { return vec![] };
        dirs.flatten().map(|d| d.file_name().to_string_lossy().into_owned()).collect()
    }
}

/// Write-then-rename, so a crash never leaves half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    // The agent's alone (records name a launch's config values).
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ccattler-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Opens again after a drop. A child forked by another test thread holds a
    /// copy of the lock's descriptor until it execs, so the lock may outlive
    /// the drop by that moment: wait for it with a deadline.
    fn reopen(root: &Path) -> StateDir {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match StateDir::open(root) {
                Ok(s) => return s,
                Err(StateError::Locked(_)) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
                Err(e) => panic!("reopen {}: {e}", root.display()),
            }
        }
    }

    #[test]
    fn one_agent_per_state_dir_and_records_round_trip() {
        let root = tmp("lock");
        let s = StateDir::open(&root).unwrap();
        assert!(matches!(StateDir::open(&root), Err(StateError::Locked(_))));
        let launch = Launch {
            image: "builtin:http".into(),
            config: Default::default(),
            secrets: Default::default(),
            volumes: Default::default(),
            limits: Default::default(),
        };
        s.save("web-0", &Record { service: "web".into(), pid: 42, start_time: 7, port: 8080, launch, uid: Some(200_000), cgroup: vec![] }).unwrap();
        s.set_lease(Some(99)).unwrap();
        drop(s);
        let s = reopen(&root);
        assert_eq!(s.lease(), Some(99));
        let r = s.records();
        assert_eq!(r["web-0"].pid, 42);
        s.forget("web-0").unwrap();
        assert!(s.records().is_empty());
        assert_eq!(s.instance_dirs(), ["web-0"]);
        let v = s.volume("web-0", "scratch", false);
        s.create(&v).unwrap();
        assert!(v.is_dir());
        s.remove_instance("web-0").unwrap();
        assert!(!v.exists());
        let p = s.volume("web-0", "data", true);
        s.create(&p).unwrap();
        assert!(p.is_dir());
        assert_eq!(s.persistent_volumes(), ["data"]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
