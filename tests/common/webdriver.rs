#![allow(dead_code)] // each user takes what it needs
//! Just enough of the W3C WebDriver protocol to drive one headless Chromium
//! (Debian's `chromium` and `chromium-driver`): the console's browser test
//! and its 5,000-node measurement (`bridge/benches/bridge.rs -- --console`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    pub fn start(root: &Path) -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/test installs Debian's chromium-driver)");
        let mut b = Browser { driver, port, session: String::new() };
        let deadline = Instant::now() + T;
        while request(port, "GET", "/status", None).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = root.join("chromium-profile");
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--window-size=1400,1000", format!("--user-data-dir={}", profile.display())]
        }}}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_string();
        b
    }

    /// Opens `url`, with an `Authorization` header on every request if given.
    pub fn open(&self, url: &str, authorization: Option<&str>) {
        if let Some(authorization) = authorization {
            let s = format!("/session/{}/goog/cdp/execute", self.session);
            self.call("POST", &s, Some(serde_json::json!({"cmd": "Network.enable", "params": {}})));
            self.call("POST", &s, Some(serde_json::json!({"cmd": "Network.setExtraHTTPHeaders", "params": {"headers": {"Authorization": authorization}}})));
        }
        self.call("POST", &format!("/session/{}/url", self.session), Some(serde_json::json!({ "url": url })));
    }

    /// Runs a script in the page; what it returns, as text.
    pub fn eval(&self, script: &str) -> String {
        let v = self.call("POST", &format!("/session/{}/execute/sync", self.session), Some(serde_json::json!({"script": script, "args": []})));
        match v {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        }
    }

    pub fn wait_for(&self, what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !cond() {
            assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}; the page:\n{}", self.eval("return document.body.innerText"));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn screenshot(&self, to: &Path) {
        use base64::Engine as _;
        let v = self.call("GET", &format!("/session/{}/screenshot", self.session), None);
        let png = base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
        std::fs::write(to, png).unwrap();
    }

    fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
        let resp = request(self.port, method, path, body.as_ref()).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let v: serde_json::Value = serde_json::from_str(&resp).unwrap_or_else(|e| panic!("{method} {path}: {e}: {resp}"));
        if v["value"]["error"].is_string() {
            panic!("{method} {path}: {}", v["value"]);
        }
        v["value"].clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = request(self.port, "DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One HTTP/1.1 exchange (chromedriver refuses HTTP/1.0), read by its
/// Content-Length.
fn request(port: u16, method: &str, path: &str, body: Option<&serde_json::Value>) -> std::io::Result<String> {
    let s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    (&s).write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )?;
    let mut r = BufReader::new(s);
    let mut length = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = vec![0; length.unwrap_or(0)];
    r.read_exact(&mut body)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}
