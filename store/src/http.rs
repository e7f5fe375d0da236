//! A small HTTP/1.1 client (hyper): the agent's HTTP probe and `explain
//! --controller` use it.

use hyper::header;
use hyper::StatusCode;

/// `GET http://host:port{path}` over HTTP/1.1: the status and body, or None
/// when there is no answer. (The agent's HTTP probe and `explain
/// --controller` use it.)
pub async fn get(host: &str, port: u16, path: &str) -> Option<(StatusCode, bytes::Bytes)> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
    let driver = tokio::spawn(conn);
    let req = hyper::Request::get(path).header(header::HOST, format!("{host}:{port}")).body(http_body_util::Empty::<bytes::Bytes>::new()).ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let status = resp.status();
    let body = resp.into_body().collect().await.ok().map(|b| b.to_bytes());
    driver.abort();
    Some((status, body?))
}

/// Percent-encodes a query parameter value.
pub fn encode_query(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
