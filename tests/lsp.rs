//! `ccattler lsp` driven by a client that speaks the protocol over the
//! child's stdin and stdout, as an editor does.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

struct Client {
    child: Child,
    stdin: ChildStdin,
    incoming: Receiver<Value>,
    next_id: i64,
    /// Server notifications seen while waiting for something else.
    notifications: Vec<Value>,
}

impl Client {
    fn start() -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ccattler"))
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ccattler lsp");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, incoming) = channel();
        std::thread::spawn(move || loop {
            // `Content-Length: N\r\n\r\n` then N bytes of JSON.
            let mut length = None;
            loop {
                let mut line = String::new();
                if stdout.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some(n) = line.strip_prefix("Content-Length: ") {
                    length = n.parse::<usize>().ok();
                }
            }
            let mut body = vec![0; length.expect("a Content-Length header")];
            if stdout.read_exact(&mut body).is_err() {
                return;
            }
            if tx.send(serde_json::from_slice::<Value>(&body).expect("JSON from the server")).is_err() {
                return;
            }
        });
        let mut c = Client { child, stdin, incoming, next_id: 0, notifications: vec![] };
        let init = c.request("initialize", json!({ "processId": null, "rootUri": null, "capabilities": {} }));
        let caps = &init["capabilities"];
        for cap in ["definitionProvider", "referencesProvider", "hoverProvider", "completionProvider"] {
            assert!(!caps[cap].is_null(), "the server announces {cap}: {init}");
        }
        c.notify("initialized", json!({}));
        c
    }

    fn send(&mut self, msg: Value) {
        let body = msg.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// Sends a request and waits for its response's `result`.
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        let msg = self.wait(|m| m["id"] == json!(id));
        assert!(msg["error"].is_null(), "{method} failed: {msg}");
        msg["result"].clone()
    }

    /// The next message that satisfies `pred` (earlier notifications kept).
    fn wait(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.notifications.iter().position(&pred) {
            return self.notifications.remove(i);
        }
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let msg = self.incoming.recv_timeout(left).expect("the server answers within the deadline");
            if pred(&msg) {
                return msg;
            }
            if msg.get("id").is_none() {
                self.notifications.push(msg);
            }
        }
    }

    /// The next diagnostics published for `path`.
    fn diagnostics(&mut self, path: &Path) -> Vec<Value> {
        let uri = uri(path);
        let msg = self.wait(|m| m["method"] == "textDocument/publishDiagnostics" && m["params"]["uri"] == json!(uri));
        msg["params"]["diagnostics"].as_array().unwrap().clone()
    }

    fn open(&mut self, path: &Path, text: &str) {
        self.notify("textDocument/didOpen", json!({ "textDocument": { "uri": uri(path), "languageId": "ccattler-rules", "version": 1, "text": text } }));
    }

    fn change(&mut self, path: &Path, version: i64, text: &str) {
        self.notify("textDocument/didChange", json!({ "textDocument": { "uri": uri(path), "version": version }, "contentChanges": [{ "text": text }] }));
    }

    fn at(&mut self, method: &str, path: &Path, (line, character): (usize, usize), extra: Value) -> Value {
        let mut params = json!({ "textDocument": { "uri": uri(path) }, "position": { "line": line, "character": character } });
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        self.request(method, params)
    }

    /// `shutdown` then `exit`: the server ends with status 0.
    fn shut_down(mut self) {
        self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "ccattler lsp exited with {status}");
                return;
            }
            assert!(Instant::now() < until, "ccattler lsp did not exit after `exit`");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn uri(path: &Path) -> String {
    let mut s = String::from("file://");
    for b in path.to_str().unwrap().bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            s.push(b as char);
        } else {
            s += &format!("%{b:02X}");
        }
    }
    s
}

fn tempdir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// (line, UTF-16 column) of the first `needle` in `text`, plus `skip` characters.
fn pos(text: &str, needle: &str, skip: usize) -> (usize, usize) {
    let at = text.find(needle).unwrap_or_else(|| panic!("{needle:?} not in the text"));
    let line = text[..at].matches('\n').count();
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    (line, text[line_start..at].encode_utf16().count() + skip)
}

const NODES: &str = "/// A node that reports in.\ninput node(n: name) from \"observed/node/{n}/cpu\"\n";
const BROKEN: &str = "// é — a comment with wide characters before the error\noutput up(n: name) to \"status/up/{n}\"\nup(n) :- nod(n).\n";
const FIXED: &str = "// é — a comment with wide characters before the error\noutput up(n: name) to \"status/up/{n}\"\nup(n) :- node(n).\n";

#[test]
fn diagnostics_follow_the_buffer_as_the_author_types() {
    let dir = tempdir("lsp-diagnostics");
    std::fs::write(dir.join("nodes.rules"), NODES).unwrap();
    let up = dir.join("up.rules");
    let mut client = Client::start();
    client.open(&up, BROKEN);
    // The unsaved buffer is checked with its directory's other files.
    let diags = client.diagnostics(&up);
    assert_eq!(diags.len(), 1, "{diags:?}");
    let d = &diags[0];
    assert_eq!(d["code"], "unknown-relation");
    assert_eq!(d["severity"], 1);
    assert!(d["message"].as_str().unwrap().contains("did you mean `node`"), "the checker's help comes along: {d}");
    let (line, col) = pos(BROKEN, "nod(", 0);
    assert_eq!(d["range"]["start"], json!({ "line": line, "character": col }));
    assert_eq!(d["range"]["end"], json!({ "line": line, "character": col + 3 }));
    // The other file of the program is clean (and says so).
    assert!(client.diagnostics(&dir.join("nodes.rules")).is_empty());

    client.change(&up, 2, FIXED);
    assert!(client.diagnostics(&up).is_empty(), "fixing the typo clears the error");
    client.shut_down();
}

#[test]
fn definition_references_hover_and_completion_across_files() {
    let dir = tempdir("lsp-navigation");
    let nodes = dir.join("nodes.rules");
    std::fs::write(&nodes, NODES).unwrap();
    let up = dir.join("up.rules");
    std::fs::write(&up, FIXED).unwrap();
    let mut client = Client::start();
    client.open(&up, FIXED);
    client.diagnostics(&up);

    // Go to definition: from the use in up.rules to the declaration in nodes.rules.
    let use_at = pos(FIXED, "node(n).", 1);
    let defs = client.at("textDocument/definition", &up, use_at, json!({}));
    let defs = defs.as_array().unwrap();
    assert_eq!(defs.len(), 1, "{defs:?}");
    assert_eq!(defs[0]["uri"], json!(uri(&nodes)));
    let (line, col) = pos(NODES, "node(", 0);
    assert_eq!(defs[0]["range"]["start"], json!({ "line": line, "character": col }));

    // References: the declaration and the use, or the use alone.
    let refs = client.at("textDocument/references", &up, use_at, json!({ "context": { "includeDeclaration": true } }));
    assert_eq!(refs.as_array().unwrap().len(), 2, "{refs}");
    let refs = client.at("textDocument/references", &up, use_at, json!({ "context": { "includeDeclaration": false } }));
    assert_eq!(refs.as_array().unwrap().len(), 1, "{refs}");
    assert_eq!(refs[0]["uri"], json!(uri(&up)));

    // Hover: columns, key pattern, doc and the rules that read it.
    let hover = client.at("textDocument/hover", &up, use_at, json!({}));
    let text = hover["contents"]["value"].as_str().unwrap();
    for want in ["input node", "A node that reports in.", "observed/node/{n}/cpu", "n: name", "read by", "up(n) :- node(n)."] {
        assert!(text.contains(want), "hover lacks {want:?}:\n{text}");
    }

    // A variable: its type and the atom column that binds it.
    let hover = client.at("textDocument/hover", &up, pos(FIXED, "(n) :-", 1), json!({}));
    let text = hover["contents"]["value"].as_str().unwrap_or_default();
    assert!(text.contains("n: name") && text.contains("node(…) column `n`"), "{hover}");

    // Completion: relation names with their signature, and the functions.
    let items = client.at("textDocument/completion", &up, pos(FIXED, "node(n).", 0), json!({}));
    let items = items.as_array().unwrap();
    let node = items.iter().find(|i| i["label"] == "node").expect("`node` offered");
    assert!(node["detail"].as_str().unwrap().contains("observed/node/{n}/cpu"), "{node}");
    assert!(items.iter().any(|i| i["label"] == "up"));
    assert!(items.iter().any(|i| i["label"] == "starts_with"));
    client.shut_down();
}

#[test]
fn the_shipped_rules_navigate_without_errors() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let placement = rules.join("placement.rules");
    let text = std::fs::read_to_string(&placement).unwrap();
    let mut client = Client::start();
    client.open(&placement, &text);
    let diags = client.diagnostics(&placement);
    assert!(diags.iter().all(|d| d["severity"] != 1), "the shipped rules check clean: {diags:?}");
    // `ready` is used in placement.rules and declared in nodes.rules.
    let use_at = pos(&text, "per ready(", 5);
    let defs = client.at("textDocument/definition", &placement, use_at, json!({}));
    assert_eq!(defs[0]["uri"], json!(uri(&rules.join("nodes.rules"))), "{defs}");
    let hover = client.at("textDocument/hover", &placement, use_at, json!({}));
    assert!(hover["contents"]["value"].as_str().unwrap().contains("derived by"), "{hover}");
    client.shut_down();
}

#[test]
fn a_request_for_a_file_outside_any_program_is_an_error_not_a_crash() {
    let mut client = Client::start();
    client.send(json!({ "jsonrpc": "2.0", "id": 99, "method": "textDocument/hover",
        "params": { "textDocument": { "uri": "untitled:Untitled-1" }, "position": { "line": 0, "character": 0 } } }));
    let msg = client.wait(|m| m["id"] == json!(99));
    assert!(msg["error"]["message"].as_str().unwrap().contains("untitled:Untitled-1"), "{msg}");
    // Garbage params too.
    client.send(json!({ "jsonrpc": "2.0", "id": 100, "method": "textDocument/definition", "params": { "nonsense": true } }));
    let msg = client.wait(|m| m["id"] == json!(100));
    assert!(!msg["error"].is_null(), "{msg}");
    // A file that is neither open nor on disk.
    client.send(json!({ "jsonrpc": "2.0", "id": 101, "method": "textDocument/completion",
        "params": { "textDocument": { "uri": "file:///nonexistent/x.rules" }, "position": { "line": 0, "character": 0 } } }));
    let msg = client.wait(|m| m["id"] == json!(101));
    assert!(msg["error"]["message"].as_str().unwrap().contains("/nonexistent/x.rules"), "{msg}");
    // An unknown method is refused by name.
    client.send(json!({ "jsonrpc": "2.0", "id": 102, "method": "textDocument/rename", "params": {} }));
    let msg = client.wait(|m| m["id"] == json!(102));
    assert_eq!(msg["error"]["code"], -32601, "{msg}");
    // And the server still shuts down cleanly.
    client.shut_down();
}

#[test]
fn twenty_thousand_nested_parentheses_are_a_diagnostic_and_the_server_lives_on() {
    let dir = tempdir("lsp-deep");
    let deep = dir.join("deep.rules");
    let n = 20_000;
    let text = format!("output up(n: int) to \"status/up/{{n}}\"\nup(n) :- n = {}1{}.\n", "(".repeat(n), ")".repeat(n));
    let mut client = Client::start();
    client.open(&deep, &text);
    let diags = client.diagnostics(&deep);
    assert!(diags.iter().any(|d| d["code"] == "syntax" && d["message"].as_str().unwrap().contains("nested at most")), "{diags:?}");
    // Still serving: the fixed buffer checks clean.
    client.change(&deep, 2, "output up(n: int) to \"status/up/{n}\"\nup(n) :- n = (1).\n");
    assert!(client.diagnostics(&deep).is_empty());
    client.shut_down();
}
