//! Probes: `effective/node/N/instance/I/probe/P/method` (from
//! `desired/probe/S/P/method`) is `http:<path>` (healthy on a 2xx
//! answer), `tcp` (healthy when the port accepts a connection) or
//! `exec:<command>` (healthy when `sh -c <command>` exits 0). Each attempt
//! has a deadline of one second. An exec probe runs confined as its instance
//! is: as its user, in its cgroup and work directory, in a process group of
//! its own that is killed whole at the deadline, with nothing of the agent's
//! environment (only `PATH`, `HOME`, `PORT` and `HOST`).

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Http(String),
    Tcp,
    Exec(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("probe method {0:?} is not http:<path>, tcp or exec:<command>")]
pub struct BadMethod(pub String);

impl std::str::FromStr for Method {
    type Err = BadMethod;
    fn from_str(s: &str) -> Result<Self, BadMethod> {
        if s == "tcp" {
            return Ok(Method::Tcp);
        }
        if let Some(path) = s.strip_prefix("http:").filter(|p| p.starts_with('/')) {
            return Ok(Method::Http(path.into()));
        }
        if let Some(cmd) = s.strip_prefix("exec:").filter(|c| !c.trim().is_empty()) {
            return Ok(Method::Exec(cmd.into()));
        }
        Err(BadMethod(s.into()))
    }
}

pub const TIMEOUT: Duration = Duration::from_secs(1);

/// Where an exec probe runs: its instance's user, cgroup and directory.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub user: Option<(u32, u32)>,
    pub cgroup: Vec<std::path::PathBuf>,
    pub work: Option<std::path::PathBuf>,
}

/// One attempt: healthy or not.
pub async fn run(method: &Method, host: &str, port: u16, ctx: &Context) -> bool {
    match method {
        Method::Exec(cmd) => exec(cmd, host, port, ctx).await,
        _ => tokio::time::timeout(TIMEOUT, attempt(method, host, port)).await.unwrap_or(false),
    }
}

async fn attempt(method: &Method, host: &str, port: u16) -> bool {
    match method {
        Method::Tcp => tokio::net::TcpStream::connect((host, port)).await.is_ok(),
        // A real HTTP/1.1 GET (hyper, via the store's client).
        Method::Http(path) => ccattler_store::http::get(host, port, path).await.is_some_and(|(s, _)| s.is_success()),
        Method::Exec(_) => false,
    }
}

async fn exec(cmd: &str, host: &str, port: u16, ctx: &Context) -> bool {
    let mut c = tokio::process::Command::new("/bin/sh");
    c.args(["-c", cmd]).env_clear().env("PATH", crate::runtime::DEFAULT_PATH).env("PORT", port.to_string()).env("HOST", host);
    if let Some(w) = &ctx.work {
        c.current_dir(w).env("HOME", w);
    }
    let joiner = crate::confine::Joiner::new(&ctx.cgroup, ctx.user);
    // SAFETY: `in_child` makes only async-signal-safe calls and allocates nothing.
    unsafe {
        c.pre_exec(move || joiner.in_child());
    }
    c.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).process_group(0).kill_on_drop(true);
    let Ok(mut child) = c.spawn() else { return false };
    let pid = child.id();
    match tokio::time::timeout(TIMEOUT, child.wait()).await {
        Ok(status) => status.is_ok_and(|s| s.success()),
        Err(_) => {
            // Everything the probe started, not only `sh`.
            if let Some(pid) = pid {
                crate::runtime::signal_group(pid, libc::SIGKILL);
            }
            let _ = child.wait().await;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse() {
        assert_eq!("http:/healthz".parse(), Ok(Method::Http("/healthz".into())));
        assert_eq!("tcp".parse(), Ok(Method::Tcp));
        assert_eq!("exec:test -f /tmp/x".parse(), Ok(Method::Exec("test -f /tmp/x".into())));
        for bad in ["http:healthz", "udp", "exec:", ""] {
            assert_eq!(bad.parse::<Method>(), Err(BadMethod(bad.into())));
        }
    }

    #[tokio::test]
    async fn tcp_and_exec_probes_see_real_sockets_and_exit_codes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ctx = Context::default();
        assert!(run(&Method::Tcp, "127.0.0.1", port, &ctx).await);
        assert!(run(&Method::Exec("test \"$PORT\" = ".to_string() + &port.to_string()), "127.0.0.1", port, &ctx).await);
        assert!(!run(&Method::Exec("exit 3".into()), "127.0.0.1", port, &ctx).await);
        drop(listener);
        assert!(!run(&Method::Tcp, "127.0.0.1", port, &ctx).await);
        assert!(!run(&Method::Http("/".into()), "127.0.0.1", port, &ctx).await);
    }

    #[tokio::test]
    async fn an_exec_probe_sees_none_of_the_agents_environment() {
        // SAFETY: the test's own process; no other thread reads this variable.
        unsafe { std::env::set_var("CCATTLER_PROBE_CANARY", "leaked") };
        let ctx = Context::default();
        assert!(run(&Method::Exec("test -z \"$CCATTLER_PROBE_CANARY\" && test -n \"$PATH\"".into()), "127.0.0.1", 1, &ctx).await);
    }

    #[tokio::test]
    async fn a_timed_out_exec_probe_is_killed_with_its_children() {
        let dir = std::env::temp_dir().join(format!("ccattler-probe-kids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("child");
        let cmd = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let started = std::time::Instant::now();
        assert!(!run(&Method::Exec(cmd), "127.0.0.1", 1, &Context::default()).await);
        assert!(started.elapsed() < Duration::from_secs(5));
        let child: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // SAFETY: kill with signal 0 only checks the pid.
        while unsafe { libc::kill(child, 0) } == 0 && !std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default().contains(") Z ") {
            assert!(std::time::Instant::now() < deadline, "the probe's child {child} outlived its timeout");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
