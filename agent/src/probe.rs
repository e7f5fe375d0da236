//! Probes: `effective/node/N/instance/I/probe/P/method` (from
//! `desired/probe/S/P/method`) is `http:<path>` (healthy on a 2xx
//! answer), `tcp` (healthy when the port accepts a connection) or
//! `exec:<command>` (healthy when `sh -c <command>` exits 0, run with the
//! instance's `PORT` and `HOST`). Each attempt has a deadline of one second.

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

/// One attempt: healthy or not.
pub async fn run(method: &Method, host: &str, port: u16) -> bool {
    tokio::time::timeout(TIMEOUT, attempt(method, host, port)).await.unwrap_or(false)
}

async fn attempt(method: &Method, host: &str, port: u16) -> bool {
    match method {
        Method::Tcp => tokio::net::TcpStream::connect((host, port)).await.is_ok(),
        // A real HTTP/1.1 GET (hyper, via the store's client).
        Method::Http(path) => ccattler_store::http::get(host, port, path).await.is_some_and(|(s, _)| s.is_success()),
        Method::Exec(cmd) => tokio::process::Command::new("/bin/sh")
            .args(["-c", cmd])
            .env("PORT", port.to_string())
            .env("HOST", host)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .is_ok_and(|s| s.success()),
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
        assert!(run(&Method::Tcp, "127.0.0.1", port).await);
        assert!(run(&Method::Exec("test \"$PORT\" = ".to_string() + &port.to_string()), "127.0.0.1", port).await);
        assert!(!run(&Method::Exec("exit 3".into()), "127.0.0.1", port).await);
        drop(listener);
        assert!(!run(&Method::Tcp, "127.0.0.1", port).await);
        assert!(!run(&Method::Http("/".into()), "127.0.0.1", port).await);
    }
}
