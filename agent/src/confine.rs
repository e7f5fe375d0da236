//! Confinement: each instance runs in a cgroup of its own, with its requests
//! enforced, as a user of its own. The agent creates the cgroup and writes
//! its limits; the supervisor's child joins it before it execs the workload
//! ([`Joiner`]), so every process the workload starts, `setsid` or not, is
//! in it and is stopped with it ([`InstanceCgroup::kill_all`]).
//!
//! | | cgroup v2 (`/sys/fs/cgroup/cgroup.controllers` exists) | cgroup v1 |
//! |---|---|---|
//! | memory (MiB requested) | `memory.max` | `memory/…/memory.limit_in_bytes` |
//! | cpu (millicores) | `cpu.weight` (Kubernetes' shares→weight) | `cpu/…/cpu.shares` (1024 a core) |
//! | pids | `pids.max` | `pids/…/pids.max` |
//! | OOM kills | `memory.events` `oom_kill` | `memory.oom_control` `oom_kill` |
//! | cpu used | `cpu.stat` `usage_usec` | `cpuacct/…/cpuacct.usage` (ns) |
//! | memory used (working set) | `memory.current` − `inactive_file` | `memory.usage_in_bytes` − `total_inactive_file` |
//!
//! cpu is a weight, not a quota: an instance may use idle cpu, and under
//! contention gets its share (a Kubernetes request, not a limit). A request of
//! 0 leaves that resource unlimited. Where no hierarchy is writable the agent
//! runs instances unconfined and says so once, loudly ([`Cgroups::detect`]).

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The cgroup hierarchies the agent can use, each with this agent's parent directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroups {
    /// The unified hierarchy: one directory holds every controller.
    V2 { parent: PathBuf },
    /// One directory per controller (those mounted and writable); cpuacct
    /// (cpu used) where it is a hierarchy of its own.
    V1 { memory: Option<PathBuf>, cpu: Option<PathBuf>, pids: Option<PathBuf>, cpuacct: Option<PathBuf> },
    /// None writable: instances run without a cgroup (the reason says why).
    Unavailable(String),
}

/// Limits for one instance (`None`: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub memory_mib: Option<i64>,
    pub cpu_millicores: Option<i64>,
    pub pids: Option<i64>,
}

/// One instance's cgroup: a directory per hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceCgroup {
    pub v2: bool,
    pub dirs: Vec<PathBuf>,
    memory: Option<PathBuf>,
    /// Where the cpu used is counted (`cpu.stat` in v2, `cpuacct.usage` in v1).
    cpu_usage: Option<PathBuf>,
}

const ROOT: &str = "/sys/fs/cgroup";

impl Cgroups {
    /// Finds the hierarchies under `/sys/fs/cgroup` and makes this agent's
    /// parent (`ccattler/<group>`) in each writable one.
    pub fn detect(group: &str) -> Cgroups {
        Cgroups::detect_at(Path::new(ROOT), group)
    }

    pub fn detect_at(root: &Path, group: &str) -> Cgroups {
        if root.join("cgroup.controllers").exists() {
            let parent = root.join("ccattler").join(group);
            // Controllers reach a child only if every ancestor delegates them.
            let enable = |dir: &Path| std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids +cpu");
            let made = std::fs::create_dir_all(&parent).and_then(|_| enable(root)).and_then(|_| enable(&root.join("ccattler"))).and_then(|_| enable(&parent));
            return match made {
                Ok(()) => Cgroups::V2 { parent },
                Err(e) => Cgroups::Unavailable(format!("cgroup v2 at {} is not writable: {e}", parent.display())),
            };
        }
        let mut problems = Vec::new();
        let mut usable = |controller: &str| {
            let mount = root.join(controller);
            if !mount.join("cgroup.procs").exists() {
                problems.push(format!("{controller}: not mounted at {}", mount.display()));
                return None;
            }
            let parent = mount.join("ccattler").join(group);
            match std::fs::create_dir_all(&parent) {
                Ok(()) => Some(parent),
                Err(e) => {
                    problems.push(format!("{controller}: {}: {e}", parent.display()));
                    None
                }
            }
        };
        let (memory, cpu, pids) = (usable("memory"), usable("cpu"), usable("pids"));
        if memory.is_none() && cpu.is_none() && pids.is_none() {
            return Cgroups::Unavailable(format!("no cgroup hierarchy is writable ({})", problems.join("; ")));
        }
        // cpuacct counts the cpu used; where it is mounted with cpu
        // (`cpu,cpuacct`) the cpu directory has it already.
        let comounted = cpu.as_ref().is_some_and(|c| c.parent().and_then(Path::parent).is_some_and(|m| m.join("cpuacct.usage").exists()));
        let cpuacct = if comounted { None } else { usable("cpuacct") };
        Cgroups::V1 { memory, cpu, pids, cpuacct }
    }

    /// Which controllers are missing, for a warning (empty when all are there).
    pub fn missing(&self) -> Vec<&'static str> {
        match self {
            Cgroups::V2 { .. } => vec![],
            Cgroups::V1 { memory, cpu, pids, .. } => {
                [("memory", memory), ("cpu", cpu), ("pids", pids)].into_iter().filter(|(_, d)| d.is_none()).map(|(n, _)| n).collect()
            }
            Cgroups::Unavailable(_) => vec!["memory", "cpu", "pids"],
        }
    }

    /// The cgroup of one instance (not created yet); `None` without cgroups.
    pub fn instance(&self, instance: &str) -> Option<InstanceCgroup> {
        match self {
            Cgroups::V2 { parent } => {
                let dir = parent.join(instance);
                Some(InstanceCgroup { v2: true, dirs: vec![dir.clone()], memory: Some(dir.clone()), cpu_usage: Some(dir) })
            }
            Cgroups::V1 { memory, cpu, pids, cpuacct } => {
                let memory = memory.as_ref().map(|p| p.join(instance));
                let cpu = cpu.as_ref().map(|p| p.join(instance));
                let cpuacct = cpuacct.as_ref().map(|p| p.join(instance));
                let cpu_usage = cpuacct.clone().or_else(|| cpu.clone());
                let dirs = [&memory, &cpu, &pids.as_ref().map(|p| p.join(instance)), &cpuacct].into_iter().flatten().cloned().collect();
                Some(InstanceCgroup { v2: false, dirs, memory, cpu_usage })
            }
            Cgroups::Unavailable(_) => None,
        }
    }
}

/// Kubernetes' cpu shares (1024 a core, between the kernel's 2 and 262144)
/// for a request in millicores.
pub fn shares(millicores: i64) -> u64 {
    ((millicores.max(0) as u64).saturating_mul(1024) / 1000).clamp(2, 262_144)
}

/// Kubernetes' shares → cgroup v2 weight (1..=10000).
pub fn weight(millicores: i64) -> u64 {
    let s = shares(millicores);
    1 + ((s - 2) * 9999) / 262_142
}

impl InstanceCgroup {
    /// The cgroup made of these directories (as the supervisor is told them):
    /// v2 if the one directory has `cgroup.controllers`.
    pub fn from_dirs(dirs: Vec<PathBuf>) -> InstanceCgroup {
        let v2 = dirs.len() == 1 && dirs[0].join("cgroup.controllers").exists();
        let memory = dirs.iter().find(|d| v2 || d.join("memory.oom_control").exists()).cloned();
        let cpu_usage = dirs.iter().find(|d| v2 || d.join("cpuacct.usage").exists()).cloned();
        InstanceCgroup { v2, dirs, memory, cpu_usage }
    }

    /// Creates the directories and writes the limits.
    pub fn create(&self, limits: &Limits) -> std::io::Result<()> {
        for d in &self.dirs {
            std::fs::create_dir_all(d)?;
        }
        let write = |file: &str, value: String| -> std::io::Result<()> {
            for d in &self.dirs {
                let path = d.join(file);
                if path.exists() {
                    std::fs::write(&path, &value).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
                }
            }
            Ok(())
        };
        // More than the kernel can count is no limit at all.
        let bytes = limits.memory_mib.filter(|m| *m > 0).and_then(|m| (m as u64).checked_mul(1 << 20)).filter(|b| *b <= i64::MAX as u64);
        let pids = limits.pids.filter(|p| *p > 0);
        let cpu = limits.cpu_millicores.filter(|c| *c > 0);
        if self.v2 {
            write("memory.max", bytes.map_or("max".into(), |b| b.to_string()))?;
            // Without swap a limit is a limit.
            let _ = write("memory.swap.max", bytes.map_or("max".into(), |_| "0".into()));
            write("pids.max", pids.map_or("max".into(), |p| p.to_string()))?;
            write("cpu.weight", weight(cpu.unwrap_or(0)).to_string())?;
        } else {
            write("memory.limit_in_bytes", bytes.map_or("-1".into(), |b| b.to_string()))?;
            write("pids.max", pids.map_or("max".into(), |p| p.to_string()))?;
            write("cpu.shares", shares(cpu.unwrap_or(0)).to_string())?;
        }
        Ok(())
    }

    /// Every process in the cgroup (any hierarchy).
    pub fn procs(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .dirs
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<u32>>())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Signals every process in the cgroup; returns how many were signalled.
    /// A process forking as it is signalled is caught by the next call:
    /// callers repeat until [`InstanceCgroup::procs`] is empty.
    pub fn kill_all(&self, signal: libc::c_int) -> usize {
        let procs = self.procs();
        for &pid in &procs {
            // SAFETY: kill(2) on a pid; no memory is shared.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
        procs.len()
    }

    /// SIGKILL until the cgroup is empty (at most `tries` rounds, 10 ms apart).
    pub fn kill_until_empty(&self, tries: usize) -> bool {
        for _ in 0..tries {
            if self.kill_all(libc::SIGKILL) == 0 {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.procs().is_empty()
    }

    /// How many processes the kernel killed for exceeding the memory limit.
    pub fn oom_kills(&self) -> u64 {
        let Some(dir) = &self.memory else { return 0 };
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok())))
            .unwrap_or(0)
    }

    /// What the instance's processes used, from the kernel's own counters:
    /// cpu time in nanoseconds since the cgroup was made, and the memory
    /// working set in bytes (usage without inactive page cache, as kubelet
    /// and metrics-server count it). `None` where a counter is missing.
    pub fn usage(&self) -> (Option<u64>, Option<u64>) {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let field = |text: &str, name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
        let cpu = self.cpu_usage.as_deref().and_then(|d| {
            if self.v2 {
                read(d, "cpu.stat").and_then(|t| field(&t, "usage_usec")).map(|us| us.saturating_mul(1000))
            } else {
                read(d, "cpuacct.usage").and_then(|t| t.trim().parse().ok())
            }
        });
        let memory = self.memory.as_deref().and_then(|d| {
            let (used, stat, inactive) =
                if self.v2 { ("memory.current", "memory.stat", "inactive_file") } else { ("memory.usage_in_bytes", "memory.stat", "total_inactive_file") };
            let used: u64 = read(d, used)?.trim().parse().ok()?;
            let inactive = read(d, stat).and_then(|t| field(&t, inactive)).unwrap_or(0);
            Some(used.saturating_sub(inactive))
        });
        (cpu, memory)
    }

    /// Removes the directories (only empty cgroups can be removed).
    pub fn remove(&self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// What the supervisor's child does between fork and exec, prepared before
/// the fork (nothing after it allocates): join the cgroup, take SIGTERM back
/// (the supervisor ignores it; an ignored signal stays ignored across exec,
/// and `sh` cannot even trap it then), drop to the instance's user.
pub struct Joiner {
    procs: Vec<CString>,
    user: Option<(libc::uid_t, libc::gid_t)>,
}

impl Joiner {
    pub fn new(cgroup_dirs: &[PathBuf], user: Option<(u32, u32)>) -> Joiner {
        use std::os::unix::ffi::OsStrExt;
        let procs = cgroup_dirs.iter().filter_map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_bytes()).ok()).collect();
        Joiner { procs, user }
    }

    /// Runs in the child after fork: only async-signal-safe calls.
    pub fn in_child(&self) -> std::io::Result<()> {
        // SAFETY: open/write/close/signal/setgroups/setgid/setuid are
        // async-signal-safe; the strings were built before the fork.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            for path in &self.procs {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process.
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if !ok {
                    return Err(err);
                }
            }
            if let Some((uid, gid)) = self.user {
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// Whether this process runs as root (and so may run instances as others).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The uids instances run as: `START-END`, one per live instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub start: u32,
    pub end: u32,
}

impl std::str::FromStr for UidRange {
    type Err = String;
    fn from_str(s: &str) -> Result<UidRange, String> {
        let (a, b) = s.split_once('-').ok_or_else(|| format!("{s:?} is not START-END (e.g. 200000-299999)"))?;
        let parse = |v: &str| v.trim().parse::<u32>().map_err(|_| format!("{v:?} in {s:?} is not a uid"));
        let (start, end) = (parse(a)?, parse(b)?);
        if start == 0 || start > end || end >= u32::MAX - 1 {
            return Err(format!("{s:?}: need 0 < START <= END < 4294967294 (uid 0 is root)"));
        }
        Ok(UidRange { start, end })
    }
}

impl UidRange {
    /// The lowest uid of the range none of `taken` holds.
    pub fn pick(&self, taken: &std::collections::BTreeSet<u32>) -> Option<u32> {
        (self.start..=self.end).find(|u| !taken.contains(u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_requests_become_kubernetes_shares_and_weights() {
        assert_eq!(shares(1000), 1024);
        assert_eq!(shares(0), 2);
        assert_eq!(shares(-5), 2);
        assert_eq!(weight(0), 1);
        assert_eq!(weight(1000), 39);
        assert_eq!(weight(i64::MAX), 10000);
    }

    #[test]
    fn uid_ranges_refuse_root_and_reversed_and_pick_the_lowest_free() {
        assert_eq!("200000-200002".parse(), Ok(UidRange { start: 200000, end: 200002 }));
        for bad in ["0-10", "10-5", "x-5", "5", "1-4294967295", "-1-5"] {
            assert!(bad.parse::<UidRange>().is_err(), "{bad}");
        }
        let r: UidRange = "10-12".parse().unwrap();
        let taken = [10, 11].into_iter().collect();
        assert_eq!(r.pick(&taken), Some(12));
        assert_eq!(r.pick(&[10, 11, 12].into_iter().collect()), None);
    }

    #[test]
    fn without_a_hierarchy_instances_run_unconfined_and_the_reason_names_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("ccattler-cgroup-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Cgroups::detect_at(&dir, "node-1");
        assert!(matches!(&c, Cgroups::Unavailable(why) if why.contains("memory: not mounted")), "{c:?}");
        assert_eq!(c.instance("web-0"), None);
        assert_eq!(c.missing(), ["memory", "cpu", "pids"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_v1_lookalike_gets_limits_in_each_hierarchy() {
        // Plain directories standing in for v1 mounts: the files the kernel
        // would offer are created first, as the kernel does in a new cgroup.
        let dir = std::env::temp_dir().join(format!("ccattler-cgroup-v1-{}", std::process::id()));
        for c in ["memory", "cpu", "pids"] {
            std::fs::create_dir_all(dir.join(c)).unwrap();
            std::fs::write(dir.join(c).join("cgroup.procs"), "").unwrap();
        }
        let c = Cgroups::detect_at(&dir, "node-1");
        let cg = c.instance("web-0").unwrap();
        assert_eq!(cg.dirs.len(), 3);
        for (c, f) in [("memory", "memory.limit_in_bytes"), ("cpu", "cpu.shares"), ("pids", "pids.max")] {
            std::fs::create_dir_all(dir.join(c).join("ccattler/node-1/web-0")).unwrap();
            std::fs::write(dir.join(c).join("ccattler/node-1/web-0").join(f), "").unwrap();
        }
        cg.create(&Limits { memory_mib: Some(64), cpu_millicores: Some(500), pids: Some(100) }).unwrap();
        let read = |c: &str, f: &str| std::fs::read_to_string(dir.join(c).join("ccattler/node-1/web-0").join(f)).unwrap();
        assert_eq!(read("memory", "memory.limit_in_bytes"), (64u64 << 20).to_string());
        assert_eq!(read("cpu", "cpu.shares"), "512");
        assert_eq!(read("pids", "pids.max"), "100");
        // A request too large to be a byte count is no limit, never a wrapped one.
        cg.create(&Limits { memory_mib: Some(i64::MAX), cpu_millicores: Some(i64::MAX), pids: Some(-3) }).unwrap();
        assert_eq!(read("memory", "memory.limit_in_bytes"), "-1");
        assert_eq!(read("pids", "pids.max"), "max");
        assert_eq!(read("cpu", "cpu.shares"), "262144", "the kernel's most");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn usage_is_read_from_the_kernels_counters_in_v1_and_v2_without_inactive_page_cache() {
        // v1 with cpuacct a hierarchy of its own (as on this host).
        let dir = std::env::temp_dir().join(format!("ccattler-cgroup-usage-v1-{}", std::process::id()));
        for c in ["memory", "cpu", "pids", "cpuacct"] {
            std::fs::create_dir_all(dir.join(c).join("ccattler/node-1/web-0")).unwrap();
            std::fs::write(dir.join(c).join("cgroup.procs"), "").unwrap();
        }
        let at = |c: &str, f: &str, v: &str| std::fs::write(dir.join(c).join("ccattler/node-1/web-0").join(f), v).unwrap();
        at("cpuacct", "cpuacct.usage", "2500000000\n");
        at("memory", "memory.usage_in_bytes", "104857600\n");
        at("memory", "memory.oom_control", "oom_kill 0\n");
        at("memory", "memory.stat", "inactive_file 1\ntotal_inactive_file 41943040\n");
        let cg = Cgroups::detect_at(&dir, "node-1").instance("web-0").unwrap();
        assert_eq!(cg.dirs.len(), 4, "memory, cpu, pids and cpuacct: {:?}", cg.dirs);
        assert_eq!(cg.usage(), (Some(2_500_000_000), Some(62_914_560)));
        // The supervisor names the cgroup by its directories: the same counters.
        assert_eq!(InstanceCgroup::from_dirs(cg.dirs.clone()).usage(), cg.usage());
        std::fs::remove_dir_all(&dir).unwrap();

        // v2: one directory.
        let dir = std::env::temp_dir().join(format!("ccattler-cgroup-usage-v2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids").unwrap();
        let cg = Cgroups::detect_at(&dir, "node-1").instance("web-0").unwrap();
        std::fs::create_dir_all(&cg.dirs[0]).unwrap();
        std::fs::write(cg.dirs[0].join("cpu.stat"), "usage_usec 1500000\nuser_usec 1000000\n").unwrap();
        std::fs::write(cg.dirs[0].join("memory.current"), "20971520\n").unwrap();
        std::fs::write(cg.dirs[0].join("memory.stat"), "anon 1\ninactive_file 4194304\n").unwrap();
        assert_eq!(cg.usage(), (Some(1_500_000_000), Some(16_777_216)));
        // A counter that is missing is unknown, not zero.
        std::fs::remove_file(cg.dirs[0].join("memory.current")).unwrap();
        assert_eq!(cg.usage(), (Some(1_500_000_000), None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
