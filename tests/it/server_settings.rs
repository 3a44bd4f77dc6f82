//! The Settings page's API: app-wide settings saved to models.toml (`GET`/`PATCH /api/settings`), the
//! server's state (`GET /api/server`) and its request log (`GET /api/server/requests`); `tandem serve`
//! listening as models.toml's `[server]` says.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tandem::engine::{Engine, EngineConfig};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, RunningServer, ServeConfig};

use crate::common;
use crate::common::http::{get, send, Reply};

const JSON: &str = "Content-Type: application/json";

/// models.toml naming the bundled model `tiny`, in a fresh folder, with `extra` appended.
fn registry(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("models.toml");
    let tiny = common::repo().join("assets/models/tandem-tiny");
    let text = format!(
        "# settings test\nmodels_dir = \"models\"\ndefault = \"tiny\"\n{extra}\n[[model]]\nname = \"tiny\"\npath = {:?}\n",
        tiny.display().to_string()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn start(path: &Path, api_key: Option<&str>) -> RunningServer {
    let mut config = ServeConfig::new(path);
    config.port = 0;
    config.api_key = api_key.map(str::to_owned);
    config.ui_dir = path.with_file_name("ui-dist");
    let engine = Engine::new(Registry::load(path).unwrap(), EngineConfig::default());
    start_with_engine(config, engine).await.expect("server starts")
}

async fn patch(a: std::net::SocketAddr, body: &str) -> Reply {
    send(a, "PATCH", "/api/settings", &[JSON], body.as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_shown_saved_refused_and_applied() {
    let dir = common::tempdir();
    let path = registry(dir.path(), "");
    let server = start(&path, None).await;
    let a = server.addr();

    let v = get(a, "/api/settings").await.json();
    let s = &v["settings"];
    assert_eq!(s["config_path"], path.display().to_string());
    assert_eq!(s["models_dir"], dir.path().join("models").display().to_string());
    assert_eq!(s["default_model"], "tiny");
    assert_eq!(s["server"], serde_json::json!({"port": 11435, "expose": false, "api_key_set": false}));
    assert_eq!(s["ui"], serde_json::json!({"theme": "system", "context_policy": "rolling"}));
    assert_eq!(v["restart_needed"], false);

    // The UI's settings apply at once; the file keeps its comments.
    let r = patch(a, r#"{"ui": {"theme": "dark", "context_policy": "stop"}}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["settings"]["ui"]["theme"], "dark");
    assert_eq!(r.json()["restart_needed"], false);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("theme = \"dark\"") && text.contains("# settings test"), "{text}");

    // The server's own settings wait for the next start, and say so.
    let r = patch(a, r#"{"server": {"port": 9123}}"#).await;
    assert_eq!(r.json()["settings"]["server"]["port"], 9123);
    assert_eq!(r.json()["restart_needed"], true);
    let info = get(a, "/api/server").await.json();
    assert_eq!(info["url"], format!("http://127.0.0.1:{}", a.port()));
    assert_eq!(info["exposed"], false);
    assert_eq!(info["api_key_required"], false);
    assert_eq!(info["restart_needed"], true);

    // Refused changes name the setting and leave the file as it was.
    let before = std::fs::read_to_string(&path).unwrap();
    let msg = patch(a, r#"{"server": {"expose": true}}"#).await.error(400, "invalid_value");
    assert!(msg.contains("server.expose") && msg.contains("api_key"), "{msg}");
    let msg = patch(a, r#"{"default_model": "nope"}"#).await.error(400, "invalid_value");
    assert!(msg.contains("nope") && msg.contains("tiny"), "{msg}");
    let r = patch(a, r#"{"ui": {"theme": "blue"}}"#).await;
    assert!(r.status == 400 || r.status == 422, "{}", r.text());
    assert!(r.text().contains("blue"), "{}", r.text());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);

    // A new conversations folder holds the chats saved from now on.
    let chats = dir.path().join("chats-elsewhere");
    let body = serde_json::json!({ "conversations_dir": chats }).to_string();
    let r = patch(a, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(chats.is_dir());
    let chat = serde_json::json!({"id": "c1", "title": "moved", "updated": 1, "messages": []}).to_string();
    let r = send(a, "PUT", "/api/conversations/c1", &[JSON], chat.as_bytes()).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let saved: Vec<_> = std::fs::read_dir(&chats).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!saved.is_empty(), "nothing saved in {}", chats.display());

    // The log: newest first, the refused ones too, never its own polling.
    let log = get(a, "/api/server/requests").await.json();
    let entries = log["requests"].as_array().unwrap();
    let seen: Vec<(String, String, u64)> = entries
        .iter()
        .map(|e| {
            (e["method"].as_str().unwrap().into(), e["path"].as_str().unwrap().into(), e["status"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(seen[0], ("PUT".into(), "/api/conversations/c1".into(), 201), "{seen:?}");
    assert!(seen.contains(&("PATCH".into(), "/api/settings".into(), 400)), "{seen:?}");
    assert!(seen.iter().all(|(_, p, _)| !p.starts_with("/api/server")), "{seen:?}");
    let stamps: Vec<u64> = entries.iter().map(|e| e["at_ms"].as_u64().unwrap()).collect();
    assert!(stamps.windows(2).all(|w| w[0] >= w[1]), "{stamps:?}");
    let info = get(a, "/api/server").await.json();
    assert_eq!(info["requests_served"].as_u64(), Some(entries.len() as u64));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_keeps_refusals_but_never_keys_or_queries() {
    let dir = common::tempdir();
    let path = registry(dir.path(), "");
    let server = start(&path, Some("sesame-42")).await;
    let a = server.addr();
    let r = send(a, "GET", "/api/models?token=hidden-query", &[], b"").await;
    assert_eq!(r.status, 401);
    let r = send(a, "GET", "/api/server/requests", &["Authorization: Bearer sesame-42"], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let entry = &r.json()["requests"][0];
    assert_eq!((entry["path"].as_str(), entry["status"].as_u64()), (Some("/api/models"), Some(401)), "{entry}");
    assert!(!r.text().contains("sesame") && !r.text().contains("hidden-query"), "{}", r.text());
    // The settings never show the key either.
    let s = send(a, "GET", "/api/settings", &["Authorization: Bearer sesame-42"], b"").await;
    assert!(!s.text().contains("sesame"), "{}", s.text());
    server.shutdown().await.unwrap();
}

/// `tandem serve` with no --port listens where models.toml's `[server]` says, and requires its key.
#[test]
fn tandem_serve_listens_as_models_toml_says() {
    let dir = common::tempdir();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let path = registry(dir.path(), &format!("[server]\nport = {port}\napi_key = \"k-from-file\"\n"));
    /// Kills the server when the test ends, passed or not.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Kill(
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("serve")
            .env("TANDEM_CONFIG", &path)
            .env_remove("TANDEM_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "tandem serve did not listen on models.toml's port {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let refused = rt.block_on(get(addr, "/api/models"));
    assert_eq!(refused.status, 401, "the file's key is required: {}", refused.text());
    let ok = rt.block_on(send(addr, "GET", "/api/server", &["Authorization: Bearer k-from-file"], b""));
    let info: Value = ok.json();
    assert_eq!(info["api_key_required"], true);
    assert_eq!(info["url"], format!("http://127.0.0.1:{port}"));
}
