//! The web console (`ccattler controller --ui`) against a live cluster:
//! a real controller and three real agents, the console's own credential,
//! its JSON and its one event stream, and the page itself rendered by
//! headless Chromium (Debian's `chromium`, which `scripts/test` installs).

mod common;
use common::*;
#[path = "common/webdriver.rs"]
mod webdriver;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

const UI_USER: &str = "ops";
const UI_PASSWORD: &str = "console-password-5c1d";

fn basic() -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{UI_USER}:{UI_PASSWORD}")))
}

/// `GET path` with the console's credential (or none): status and body.
fn get_ui(port: u16, path: &str, auth: bool) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let header = if auth { format!("Authorization: {}\r\n", basic()) } else { String::new() };
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{header}\r\n").as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn start(root: &Path) -> (Controller, Vec<Agent>, u16) {
    let creds = root.join("ui-credentials");
    std::fs::write(&creds, format!("{UI_USER}:{UI_PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let c = Controller::start_with(
        &etcd_url(),
        &credentials(),
        &secret_key(),
        "console",
        &shipped_rules(),
        &["--ui", "--ui-credentials", creds.to_str().unwrap()],
        &[],
    );
    let agents: Vec<Agent> = (1..=3).map(|n| Agent::start(root, n, 4000, 8192, &[])).collect();
    let port = c.port;
    (c, agents, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_cluster_live_and_explains_with_its_own_credential() {
    let _serial = serial();
    let mut etcd = fresh_etcd().await;
    let root = scratch("console");
    let (_c, mut agents, port) = start(&root);
    ready_nodes(&etcd, 3).await;
    put_facts(&mut etcd, &[("desired/service/web/image", "builtin:http"), ("desired/service/web/cpu", "100"), ("intent/user/service/web/instances", "3")])
        .await;
    put_facts(&mut etcd, &[("desired/service/huge/cpu", "100000"), ("intent/user/service/huge/instances", "1")]).await;
    wait_for("three endpoints", T, || {
        let mut e = etcd.clone();
        async move { endpoints(&mut e, "web").await.len() == 3 }
    })
    .await;

    // Its own credential: nothing without it.
    assert_eq!(get_ui(port, "/ui", false).0, 401);
    assert_eq!(get_ui(port, "/api/state", false).0, 401);
    let (status, page) = get_ui(port, "/ui", true);
    assert_eq!(status, 200);
    assert!(page.contains("/ui/app.js") && !page.contains("http://") && !page.contains("https://"), "embedded, nothing fetched from elsewhere: {page}");

    // The tables, from the controller's warm state.
    wait_for("the console's state lists three ready nodes and the waiting huge-0", T, || async {
        let (_, body) = get_ui(port, "/api/state", true);
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else { return false };
        let rows = |t: &str| v["tables"].as_array().unwrap().iter().find(|x| x["table"] == t).map(|x| x["rows"].clone()).unwrap_or_default();
        rows("nodes").as_array().is_some_and(|n| n.len() == 3 && n.iter().all(|r| r["state"] == "ready"))
            && rows("pending").as_array().is_some_and(|p| p.iter().any(|r| r["instance"] == "huge-0"))
    })
    .await;
    let (_, rules) = get_ui(port, "/api/rules", true);
    let rules: serde_json::Value = serde_json::from_str(&rules).unwrap();
    assert!(rules["files"].as_array().unwrap().iter().any(|f| f[0].as_str().unwrap().ends_with("placement.rules")));
    assert!(rules["outputs"]["placement"].as_u64().unwrap() >= 3, "{}", rules["outputs"]);

    // One event stream: the current state first.
    let mut sse = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sse.write_all(format!("GET /api/events HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\r\n", basic()).as_bytes()).unwrap();
    sse.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut lines = BufReader::new(sse);
    let mut seen = String::new();
    let first = Instant::now() + Duration::from_secs(10);
    while !seen.contains("event: state") && Instant::now() < first {
        let mut l = String::new();
        if lines.read_line(&mut l).is_ok() {
            seen.push_str(&l);
        }
    }
    assert!(seen.contains("event: state"), "the current state first: {seen}");
    drop(lines);

    // The page in a real browser, driven over WebDriver (Debian's chromium
    // and chromedriver): it lists the nodes, turns a killed node unreachable
    // without a reload, shows a pending instance's why-not and renders an
    // explain tree.
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let browser = webdriver::Browser::start(&root);
    browser.open(&format!("http://127.0.0.1:{port}/ui#nodes"), Some(&basic()));
    let text = || browser.eval("return document.body.innerText");
    browser.wait_for("the nodes page lists three ready nodes", T, || {
        let t = text();
        t.matches("ready").count() >= 3 && t.contains("node-3") && t.contains("as of revision")
    });
    browser.screenshot(&shots.join("nodes.png"));
    let loads = browser.eval("return String(performance.getEntriesByType('navigation').length)");

    agents[2].kill_9();
    let killed = Instant::now();
    let row_state = "return document.querySelector('tr[data-node=\"node-3\"] td:nth-child(2)')?.textContent ?? ''";
    browser.wait_for("node-3 unreachable on the page", Duration::from_secs(TTL + 10), || browser.eval(row_state) == "unreachable");
    let took = killed.elapsed();
    eprintln!("the page showed node-3 unreachable {took:?} after kill -9 (TTL {TTL} s)");
    // TTL + 2 s, and the console's recount period on top.
    assert!(took <= Duration::from_secs(TTL + 2) + ccattler_bridge::console::EVERY, "node-3 unreachable after {took:?}");
    assert_eq!(browser.eval("return String(performance.getEntriesByType('navigation').length)"), loads, "without a reload");
    browser.screenshot(&shots.join("nodes-unreachable.png"));

    // A pending instance's why-not, kept while the tables change under it.
    browser.eval("location.hash = 'pending'; return ''");
    browser.wait_for("huge-0 on the pending page", T, || text().contains("huge-0"));
    browser.eval("document.querySelector('[data-explain^=\"placement/instance/huge-0\"]').click(); return ''");
    browser.wait_for("huge-0's why-not", T, || browser.eval("return document.querySelector('#whynot').innerText").contains("nodes can take huge-0"));
    let revision = browser.eval("return String(window.ccattlerTiming.revision)");
    browser.wait_for("a newer state applied", T, || browser.eval("return String(window.ccattlerTiming.revision)") != revision);
    let why = browser.eval("return document.querySelector('#whynot').innerText");
    assert!(why.contains("verdict: 0/3 nodes can take huge-0") && why.contains("big enough"), "the why-not says why first:\n{why}");
    browser.screenshot(&shots.join("pending-why-not.png"));

    // An explain tree for a placement, down to the stored keys.
    browser.eval("location.hash = 'explain'; return ''");
    browser.wait_for("the explain page", T, || browser.eval("return String(!!document.querySelector('#key'))") == "true");
    browser.eval("document.querySelector('#key').value = 'placement/instance/web-0'; document.querySelector('#ask').click(); return ''");
    browser.wait_for("web-0's proof", T, || browser.eval("return document.querySelector('#answer').innerText").contains("holds at revision"));
    let tree = browser.eval("return document.querySelector('#answer').innerText");
    assert!(
        tree.contains("placement/instance/web-0") && tree.contains("←") && tree.contains("← placement/instance/web-0 = ") && tree.contains("← observed/node/"),
        "the tree reaches the stored keys:\n{tree}"
    );
    browser.screenshot(&shots.join("explain.png"));
    eprintln!("screenshots in {}", shots.display());
}
