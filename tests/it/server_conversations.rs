//! The server's conversation store (`/api/conversations`): round trips, the list's order, updates
//! and deletes, the files on disk (one JSON each, written atomically, no temporary files left,
//! still there for the next server), the folder models.toml names, and every kind of bad request:
//! bad ids, path traversal, oversized and malformed bodies, other origins.
//!
//! HTTP is spoken by hand over a TcpStream, as in tests/it/server_api.rs, so that requests no client
//! library would send (raw `..` segments, broken JSON) can be sent.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::common::http::{get, send, Reply};
use serde_json::{json, Value};
use tandem::engine::{Engine, EngineConfig};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, RunningServer, ServeConfig};

/// A models.toml (the bundled model, a models folder) in a fresh folder; `extra` goes at its top.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(extra: &str) -> Setup {
        let dir = common::tempdir();
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        let toml = format!(
            "{extra}\nmodels_dir = \"models\"\ndefault = \"tiny\"\n\n[[model]]\nname = \"tiny\"\npath = \"{}\"\n",
            common::tiny_model_dir().display()
        );
        std::fs::write(dir.path().join("models.toml"), toml).unwrap();
        Setup { dir }
    }

    /// `conversations` beside the models folder, unless models.toml says otherwise.
    fn folder(&self) -> PathBuf {
        self.dir.path().join("conversations")
    }

    async fn start(&self, max_body_bytes: Option<usize>) -> RunningServer {
        let registry_path = self.dir.path().join("models.toml");
        let mut config = ServeConfig::new(&registry_path);
        config.port = 0;
        config.api_key = None;
        config.ui_dir = self.dir.path().join("ui-dist");
        if let Some(max) = max_body_bytes {
            config.max_body_bytes = max;
        }
        let engine = Engine::new(Registry::load(&registry_path).unwrap(), EngineConfig::default());
        start_with_engine(config, engine).await.expect("server starts")
    }
}

async fn put(addr: SocketAddr, id: &str, body: &Value) -> Reply {
    put_raw(addr, id, body.to_string().as_bytes()).await
}

async fn put_raw(addr: SocketAddr, id: &str, body: &[u8]) -> Reply {
    send(addr, "PUT", &format!("/api/conversations/{id}"), &["Content-Type: application/json"], body).await
}

/// A conversation as the UI writes it (storage.ts), with an image, statistics and fields the
/// server does not know, which it must keep.
fn conversation(id: &str, title: &str, updated: u64) -> Value {
    json!({
        "id": id,
        "title": title,
        "created": 1_700_000_000_000u64,
        "updated": updated,
        "model": "tiny",
        "sampling": { "temperature": 0.3, "seed": 1 },
        "system": "Be brief.",
        "messages": [
            { "id": "u1", "role": "user", "content": "What is this?", "images": ["data:image/png;base64,iVBORw0KGgo="], "created": 1 },
            { "id": "a1", "role": "assistant", "content": "<think>hm</think>A dot.", "model": "tiny",
              "stats": { "prompt_tokens": 42, "completion_tokens": 7, "spec": null }, "finish_reason": "stop", "created": 2 },
        ],
        "future_field": { "kept": true },
    })
}

/// The conversations listed, as (id, title).
async fn listed(addr: SocketAddr) -> Vec<(String, String)> {
    let r = get(addr, "/api/conversations").await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["conversations"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| (s["id"].as_str().unwrap().to_owned(), s["title"].as_str().unwrap().to_owned()))
        .collect()
}

/// The names in a folder, sorted (none when it does not exist).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_order_updates_deletes_and_files_on_disk() {
    let setup = Setup::new("");
    let folder = setup.folder();
    let server = setup.start(None).await;
    let a = server.addr();

    // Nothing yet; the folder is made by the first save, not by reading.
    assert_eq!(listed(a).await, vec![]);
    assert!(!folder.exists());

    let (one, two, three) = ("0f8c2a8e-4b1d-4e0b-9a51-3c1f2d9e8b7a", "lxk3z9ab12", "third_one");
    for (id, title, updated) in [(one, "First", 1000), (two, "Second", 3000), (three, "Third", 2000)] {
        let r = put(a, id, &conversation(id, title, updated)).await;
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json(), json!({ "id": id, "title": title, "updated": updated }));
    }
    let ids = |list: Vec<(String, String)>| list.into_iter().map(|(id, _)| id).collect::<Vec<_>>();
    assert_eq!(ids(listed(a).await), [two, three, one], "newest first");

    // What was saved comes back as it was sent, unknown fields included.
    let r = get(a, &format!("/api/conversations/{one}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("content-type").is_some_and(|t| t.starts_with("application/json")));
    assert_eq!(r.json(), conversation(one, "First", 1000));

    // A save replaces the whole conversation and moves it up the list.
    let mut changed = conversation(one, "First, renamed", 4000);
    changed["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "id": "u2", "role": "user", "content": "More?", "created": 3 }));
    let r = put(a, one, &changed).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(listed(a).await[0], (one.to_owned(), "First, renamed".to_owned()));
    assert_eq!(get(a, &format!("/api/conversations/{one}")).await.json(), changed);

    // On disk: one JSON file per conversation, nothing else (no temporary files left behind).
    assert_eq!(names(&folder), [format!("{one}.json"), format!("{two}.json"), format!("{three}.json")]);
    assert_eq!(read_json(&folder.join(format!("{one}.json"))), changed);
    assert_eq!(read_json(&folder.join(format!("{two}.json"))), conversation(two, "Second", 3000));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&folder), 0o700, "the folder is private");
        assert_eq!(mode(&folder.join(format!("{one}.json"))), 0o600, "the files are private");
    }

    // Delete: gone from the list, the folder and the API; twice is a 404.
    let r = send(a, "DELETE", &format!("/api/conversations/{two}"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({ "id": two, "deleted": true }));
    assert!(!folder.join(format!("{two}.json")).exists());
    assert_eq!(ids(listed(a).await), [one, three]);
    get(a, &format!("/api/conversations/{two}")).await.error(404, "conversation_not_found");
    send(a, "DELETE", &format!("/api/conversations/{two}"), &[], b"").await.error(404, "conversation_not_found");
    get(a, "/api/conversations/never-saved").await.error(404, "conversation_not_found");

    // Files that are not conversations (a note, a broken file, a folder) do not break the list.
    std::fs::write(folder.join("notes.txt"), "mine").unwrap();
    std::fs::write(folder.join("broken.json"), "{\"title\": ").unwrap();
    std::fs::create_dir(folder.join("sub.json")).unwrap();
    assert_eq!(ids(listed(a).await), [one, three]);
    // A file edited by hand is listed as it now is.
    std::fs::write(folder.join(format!("{three}.json")), conversation(three, "Edited by hand", 5000).to_string())
        .unwrap();
    assert_eq!(listed(a).await[0], (three.to_owned(), "Edited by hand".to_owned()));
    server.shutdown().await.unwrap();

    // The next server (a restart, the desktop app on another port) finds them all.
    let server = setup.start(None).await;
    assert_eq!(ids(listed(server.addr()).await), [three, one]);
    assert_eq!(get(server.addr(), &format!("/api/conversations/{one}")).await.json(), changed);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_folder_is_the_one_models_toml_names() {
    let setup = Setup::new("conversations_dir = \"saved/chats\"  # relative to this file");
    let server = setup.start(None).await;
    let r = put(server.addr(), "abc", &conversation("abc", "Here", 1)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(setup.dir.path().join("saved/chats/abc.json").is_file());
    assert!(!setup.folder().exists());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_and_path_traversal_are_refused() {
    let setup = Setup::new("");
    let folder = setup.folder();
    let server = setup.start(None).await;
    let a = server.addr();
    // Written once, so that the folder exists and a traversal would have somewhere to start from.
    assert_eq!(put(a, "good", &conversation("good", "Good", 1)).await.status, 201);

    // (as sent in the URL, as the message shows it)
    let long = "x".repeat(129);
    for (raw, shown) in [
        ("..", "`..`"),
        ("%2E%2E", "`..`"),
        ("..%2Fmodels", "`../models`"),
        ("..%2F..%2Fetc%2Fpasswd", "`../../etc/passwd`"),
        ("%2Fetc%2Fpasswd", "`/etc/passwd`"),
        ("a%5Cb", "`a\\\\b`"),
        (".hidden", "`.hidden`"),
        ("good.json", "`good.json`"),
        ("a%20b", "`a b`"),
        ("caf%C3%A9", "`café`"),
        ("nul%00", "`nul\\0`"),
        (long.as_str(), long.as_str()),
    ] {
        for method in ["GET", "PUT", "DELETE"] {
            let body = conversation("good", "Bad", 1).to_string();
            let r = send(
                a,
                method,
                &format!("/api/conversations/{raw}"),
                &["Content-Type: application/json"],
                body.as_bytes(),
            )
            .await;
            let message = r.error(400, "invalid_conversation_id");
            assert!(message.contains(shown), "{method} {raw}: the message names the id: {message}");
        }
    }
    // Not UTF-8 at all: still a JSON 400.
    get(a, "/api/conversations/%FF").await.error(400, "invalid_conversation_id");
    // Raw `..` segments never reach a file either.
    for path in [
        "/api/conversations/../../models.toml",
        "/api/conversations/%2E%2E/models.toml",
        "/api/conversations/good/../../models.toml",
    ] {
        let r = get(a, path).await;
        assert!(r.status == 400 || r.status == 404, "{path}: {} {}", r.status, r.text());
        assert!(!r.text().contains("[[model]]"), "{path} read models.toml");
        assert!(r.json()["error"]["code"].is_string(), "{path}: a JSON error");
    }
    assert_eq!(names(&folder), ["good.json"], "nothing else was written");
    assert_eq!(names(setup.dir.path()), ["conversations", "models", "models.toml"], "nothing was written beside it");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_bodies_are_refused() {
    let setup = Setup::new("");
    let folder = setup.folder();
    let server = setup.start(Some(64 << 10)).await;
    let a = server.addr();

    // Not JSON, not a conversation, or a field of the wrong type: 400, naming the field.
    put_raw(a, "c1", b"{\"id\": \"c1\", ").await.error(400, "invalid_json");
    put_raw(a, "c1", b"").await.error(400, "invalid_json");
    let m = put(a, "c1", &json!("a string")).await.error(400, "invalid_value");
    assert!(m.contains("a conversation"), "{m}");
    for (field, value, named) in [
        ("title", json!(3), "`title`"),
        ("updated", json!("yesterday"), "`updated`"),
        ("updated", json!(-5), "`updated`"),
        ("messages", json!({}), "`messages`"),
        ("id", json!(7), "`id`"),
        ("id", json!("other"), "`id`"),
    ] {
        let mut c = conversation("c1", "T", 1);
        c[field] = value.clone();
        let m = put(a, "c1", &c).await.error(400, "invalid_value");
        assert!(m.contains(named), "{field} = {value}: {m}");
    }
    for field in ["title", "updated", "messages", "id"] {
        let mut c = conversation("c1", "T", 1);
        c.as_object_mut().unwrap().remove(field);
        let m = put(a, "c1", &c).await.error(400, "invalid_value");
        assert!(m.contains(&format!("missing field `{field}`")), "{m}");
    }
    for (index, field, value, named) in [
        (1, "role", json!("robot"), "`messages[1].role`"),
        (0, "content", json!(null), "`messages[0].content`"),
        (0, "images", json!("data:image/png;base64,AA"), "`messages[0].images`"),
    ] {
        let mut c = conversation("c1", "T", 1);
        c["messages"][index][field] = value.clone();
        let m = put(a, "c1", &c).await.error(400, "invalid_value");
        assert!(m.contains(named), "messages[{index}].{field} = {value}: {m}");
    }
    // JSON only.
    let r = send(
        a,
        "PUT",
        "/api/conversations/c1",
        &["Content-Type: text/plain"],
        conversation("c1", "T", 1).to_string().as_bytes(),
    )
    .await;
    r.error(415, "unsupported_media_type");

    // Larger than the server's body limit (64 KiB here): 413, nothing written.
    let mut big = conversation("big", "Big", 1);
    big["messages"][0]["images"] = json!([format!("data:image/png;base64,{}", "A".repeat(100 << 10))]);
    put(a, "big", &big).await.error(413, "body_too_large");
    // Just under it is fine.
    let mut fits = conversation("fits", "Fits", 1);
    fits["messages"][0]["images"] = json!([format!("data:image/png;base64,{}", "A".repeat(60 << 10))]);
    assert_eq!(put(a, "fits", &fits).await.status, 201);

    assert_eq!(names(&folder), ["fits.json"], "only the valid conversation was written");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_may_call_and_other_pages_may_not() {
    let setup = Setup::new("");
    let server = setup.start(None).await;
    let a = server.addr();
    let body = conversation("x1", "T", 1).to_string();
    // Another web page: refused before anything is written.
    let r = send(
        a,
        "PUT",
        "/api/conversations/x1",
        &["Content-Type: application/json", "Origin: https://evil.example"],
        body.as_bytes(),
    )
    .await;
    r.error(403, "forbidden_origin");
    let r = send(a, "GET", "/api/conversations", &["Origin: https://evil.example"], b"").await;
    r.error(403, "forbidden_origin");
    assert!(!setup.folder().exists());
    // The desktop window (tauri://localhost) may PUT: the preflight allows it.
    let r = send(
        a,
        "OPTIONS",
        "/api/conversations/x1",
        &[
            "Origin: tauri://localhost",
            "Access-Control-Request-Method: PUT",
            "Access-Control-Request-Headers: content-type",
        ],
        b"",
    )
    .await;
    assert!(r.status < 300, "{} {}", r.status, r.text());
    assert!(r.header("access-control-allow-methods").is_some_and(|m| m.contains("PUT")), "{:?}", r.headers);
    let r = send(
        a,
        "PUT",
        "/api/conversations/x1",
        &["Content-Type: application/json", "Origin: tauri://localhost"],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // A Host that is not this server (DNS rebinding) is refused.
    let r = send(a, "GET", "/api/conversations", &["Host: evil.example"], b"").await;
    assert_eq!(r.status, 403, "{}", r.text());
    server.shutdown().await.unwrap();
}
