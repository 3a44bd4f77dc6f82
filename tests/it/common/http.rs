//! A raw HTTP/1.1 client for the server tests: exact control over headers (Host, Origin, bodies
//! larger than the limit) that a full client would normalise away.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response read to the end.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(str::to_owned)
            .collect()
    }

    /// Asserts an error reply (this status, the JSON error shape, this code); returns its message.
    pub fn error(&self, status: u16, code: &str) -> String {
        assert_eq!(self.status, status, "body: {}", self.text());
        let v = self.json();
        let e = &v["error"];
        assert_eq!(e["code"], code, "error.code in {v}");
        assert!(e["type"].is_string(), "error.type in {v}");
        let message = e["message"].as_str().unwrap_or_default().to_owned();
        assert!(!message.is_empty(), "error.message in {v}");
        message
    }
}

/// Sends one request; `head` lines are added verbatim (a `Host` is added unless one is given).
pub async fn send(addr: SocketAddr, method: &str, path: &str, head: &[&str], body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !head.iter().any(|h| h.to_ascii_lowercase().starts_with("host:")) {
        req.push_str(&format!("Host: 127.0.0.1:{}\r\n", addr.port()));
    }
    for h in head {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()));
    let (mut rd, mut wr) = stream.split();
    let write = async {
        // The server may answer (413) before reading everything; a failed write is then expected.
        let _ = wr.write_all(req.as_bytes()).await;
        let _ = wr.write_all(body).await;
    };
    let mut raw = Vec::new();
    let (_, read) = tokio::join!(write, rd.read_to_end(&mut raw));
    if let Err(e) = read {
        assert!(!raw.is_empty(), "{method} {path}: connection failed before any response: {e}");
    }
    parse_reply(&raw)
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, &[], b"").await
}

pub async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    send(addr, "POST", path, &["Content-Type: application/json"], body.to_string().as_bytes()).await
}

/// Parses a complete response (head and body, chunked or not).
pub fn parse_reply(raw: &[u8]) -> Reply {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status line");
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())).collect();
    let mut body = raw[end + 4..].to_vec();
    if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Reply { status, headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&data[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let stop = (start + size).min(data.len());
        out.extend_from_slice(&data[start..stop]);
        data = &data[(stop + 2).min(data.len())..];
    }
    out
}
