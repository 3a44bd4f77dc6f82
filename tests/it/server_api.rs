//! `tandem serve` end to end, on loopback ephemeral ports, with the bundled model
//! (assets/models/tandem-tiny): the official `openai` Python client, concurrent clients with
//! cancellations and the queue limit, the admin API, and each kind of bad request.
//!
//! HTTP is spoken by hand over a TcpStream (`Connection: close`), so that the tests can send what
//! no client library would: a bad Host, broken JSON, oversized bodies.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::http::{get, parse_reply, post_json, send, Reply};
use serde_json::{json, Value};
use tandem::engine::{Engine, EngineConfig, Event, Input, Request};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, FolderPicker, RunningServer, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "tiny";

fn tiny_dir() -> PathBuf {
    common::repo().join("assets/models/tandem-tiny")
}

/// A models.toml in a fresh folder: `tiny` (the bundled model, greedy by default) and an empty
/// models folder beside it.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = common::tempdir();
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        let toml = format!(
            "# test registry\nmodels_dir = \"{}\"\ndefault = \"{MODEL}\"\n\n[[model]]\nname = \"{MODEL}\"\npath = \"{}\"\n\
             mtp = {{ enabled = true, depth = 3 }}   # keep this comment\n\
             sampling = {{ temperature = 0.0, top_p = 1.0, max_tokens = 32 }}\n",
            dir.path().join("models").display(),
            tiny_dir().display()
        );
        std::fs::write(dir.path().join("models.toml"), toml).unwrap();
        Setup { dir }
    }

    /// The model decodes one request at a time (its batch holds one): the rest wait in the queue.
    fn one_at_a_time(self) -> Setup {
        let path = self.registry_path();
        let mut toml = std::fs::read_to_string(&path).unwrap();
        toml.push_str("batch = { max_streams = 1 }\n");
        std::fs::write(&path, toml).unwrap();
        self
    }

    fn registry_path(&self) -> PathBuf {
        self.dir.path().join("models.toml")
    }

    fn config(&self) -> ServeConfig {
        let mut config = ServeConfig::new(self.registry_path());
        config.port = 0;
        config.api_key = None;
        config.ui_dir = self.dir.path().join("ui-dist");
        config
    }

    fn engine(&self, queue_limit: usize) -> Engine {
        let registry = Registry::load(&self.registry_path()).unwrap();
        Engine::new(registry, EngineConfig { queue_limit, ..EngineConfig::default() })
    }

    async fn start(&self, config: ServeConfig, queue_limit: usize) -> RunningServer {
        start_with_engine(config, self.engine(queue_limit)).await.expect("server starts")
    }
}

fn chat_body(content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// Waits until the engine is idle: nothing running, nothing queued on any model.
async fn wait_idle(engine: &Engine) {
    let t0 = Instant::now();
    loop {
        let stats = engine.stats();
        if stats.running.is_empty() && stats.models.iter().all(|m| !m.busy && m.queued == 0) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "engine not idle after 60 s: {:?}", stats.models);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------

/// Runs one of tests/server/*_client.py (an official client library against this server) with
/// `--<url_flag> <url> --model tiny --model-dir <tandem-tiny>`; fails with its output unless every check
/// passed. The model's folder is the token-count oracle's (transformers) input.
async fn python_client(script: &str, url_flag: &str, url: String) {
    let script = common::repo().join("tests/server").join(script);
    let (python, model_dir, flag) = (common::python(), tiny_dir(), url_flag.to_owned());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(&script)
            .args([flag.as_str(), &url, "--model", MODEL, "--model-dir"])
            .arg(model_dir)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_VERBOSITY", "error")
            .output()
            .expect("run python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "client checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("all checks passed"), "{stdout}");
    eprintln!("{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openai_python_client() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    python_client("openai_client.py", "--base-url", format!("{}/v1", server.url())).await;
    wait_idle(server.engine()).await;
    server.shutdown().await.unwrap();
}

/// `POST /v1/messages` with the official `anthropic` Python client (tests/server/anthropic_client.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anthropic_python_client() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    python_client("anthropic_client.py", "--base-url", server.url()).await;
    server.shutdown().await.unwrap();
}

/// Tandem's Ollama-compatible routes with the official `ollama` Python client (tests/server/ollama_client.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ollama_python_client() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    python_client("ollama_client.py", "--host", server.url()).await;
    server.shutdown().await.unwrap();
}

/// The prefix cache's count in each API's usage: each chat sent twice, the second restores the
/// first's prompt. OpenAI: `usage.prompt_tokens_details.cached_tokens`; Anthropic:
/// `usage.cache_read_input_tokens`, `input_tokens` the rest (their sum the prompt), streamed in
/// `message_delta`; Ollama has no such field: its last object's `stats.cached_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cached_tokens_in_every_api() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();
    let content = "Tell me a story about a lighthouse keeper and the ships that pass by at night.";
    let twice = |path: &'static str, body: Value| async move {
        let first = post_json(a, path, &body).await;
        assert_eq!(first.status, 200, "{path}: {}", first.text());
        let second = post_json(a, path, &body).await;
        assert_eq!(second.status, 200, "{path}: {}", second.text());
        (first.json(), second.json())
    };

    let (cold, warm) = twice("/v1/chat/completions", chat_body(content, 4, false)).await;
    let prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{cold}");
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached <= prompt, "{warm}");

    let body = json!({"model": MODEL, "max_tokens": 4, "system": "Be brief.",
        "messages": [{"role": "user", "content": content}]});
    let (cold, warm) = twice("/v1/messages", body.clone()).await;
    let (c, w) = (&cold["usage"], &warm["usage"]);
    assert_eq!(
        (c["cache_read_input_tokens"].as_u64(), c["cache_creation_input_tokens"].as_u64()),
        (Some(0), Some(0)),
        "{c}"
    );
    let read = w["cache_read_input_tokens"].as_u64().unwrap();
    assert!(read > 0, "{w}");
    assert_eq!(w["input_tokens"].as_u64().unwrap() + read, c["input_tokens"].as_u64().unwrap(), "{w} against {c}");
    assert_eq!(warm["stats"]["cached_tokens"].as_u64(), Some(read));
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = post_json(a, "/v1/messages", &streamed).await;
    let delta = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "message_delta")
        .unwrap_or_else(|| panic!("no message_delta in {}", r.text()));
    assert!(delta["usage"]["cache_read_input_tokens"].as_u64().is_some_and(|n| n > 0), "{delta}");

    // Another message: the OpenAI chat's entries would serve this one's first request.
    let other = "Write a poem about the tide coming in over the sand.";
    let body = json!({"model": MODEL, "stream": false, "messages": [{"role": "user", "content": other}],
        "options": {"num_predict": 4}});
    let (cold, warm) = twice("/api/chat", body).await;
    assert_eq!(cold["stats"]["cached_tokens"], 0, "{cold}");
    let cached = warm["stats"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached <= warm["prompt_eval_count"].as_u64().unwrap(), "{warm}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_json_errors() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.max_body_bytes = 1 << 20;
    let server = setup.start(config, 16).await;
    let a = server.addr();
    let json_ct = "Content-Type: application/json";

    send(a, "POST", "/v1/chat/completions", &[json_ct], b"{\"model\": \"tiny\", \"messages\": [")
        .await
        .error(400, "invalid_json");
    send(a, "POST", "/v1/chat/completions", &[json_ct], br#"{"model": "tiny", "messages": []} trailing"#)
        .await
        .error(400, "invalid_json");
    let r = post_json(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": "hello"})).await;
    r.error(400, "invalid_value");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("messages"), "names the field: {}", r.text());
    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
    )
    .await;
    r.error(400, "invalid_value");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("temperature"), "{}", r.text());
    post_json(a, "/v1/chat/completions", &json!({"messages": []})).await.error(400, "invalid_value");
    post_json(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}))
        .await
        .error(400, "invalid_value");
    post_json(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}),
    )
    .await
    .error(400, "invalid_value");
    send(
        a,
        "POST",
        "/v1/chat/completions",
        &["Content-Type: text/plain"],
        chat_body("hi", 4, false).to_string().as_bytes(),
    )
    .await
    .error(415, "unsupported_media_type");
    post_json(
        a,
        "/v1/chat/completions",
        &json!({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
    .error(404, "model_not_found");
    // A body over the limit (1 MiB here; 32 MiB by default).
    let big = json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(2 << 20)}]});
    post_json(a, "/v1/chat/completions", &big).await.error(413, "body_too_large");

    // Images: a broken data URL, a remote URL, and a valid PNG for a text-only model.
    let image = |url: &str| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]})
    };
    post_json(a, "/v1/chat/completions", &image("data:image/png;base64,@@@")).await.error(400, "invalid_image");
    post_json(a, "/v1/chat/completions", &image("https://example.com/cat.png")).await.error(400, "invalid_image");
    let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let r = post_json(a, "/v1/chat/completions", &image(png)).await;
    r.error(400, "model_not_multimodal");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("text-only"), "{}", r.text());
    let png_file = setup.dir.path().join("pixel.png");
    std::fs::write(&png_file, base64_decode(png.split_once(',').unwrap().1)).unwrap();
    post_json(a, "/v1/chat/completions", &image(&format!("file://{}", png_file.display())))
        .await
        .error(400, "model_not_multimodal");
    assert!(!server.engine().is_loaded(MODEL), "an image request does not load a text-only model to refuse it");

    // Host and Origin.
    send(a, "GET", "/v1/models", &["Host: evil.example:11435"], b"").await.error(403, "forbidden_host");
    send(a, "GET", "/api/health", &["Host: 192.168.1.20"], b"").await.error(403, "forbidden_host");
    assert_eq!(send(a, "GET", "/api/health", &["Host: localhost"], b"").await.status, 200);
    send(a, "POST", "/api/models/tiny/load", &["Origin: https://evil.example"], b"")
        .await
        .error(403, "forbidden_origin");
    let own = format!("Origin: http://127.0.0.1:{}", a.port());
    let r = send(a, "GET", "/api/health", &[&own], b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some(own.trim_start_matches("Origin: ")));
    let r = send(a, "GET", "/api/health", &["Origin: tauri://localhost"], b"").await;
    assert_eq!(r.header("access-control-allow-origin"), Some("tauri://localhost"));

    // Paths outside the models folder.
    let outside = common::tempdir();
    post_json(a, "/api/convert", &json!({"src": "/etc", "bits": 4})).await.error(403, "folder_not_chosen");
    post_json(a, "/api/convert", &json!({"src": MODEL, "dst": outside.path().join("x"), "bits": 4}))
        .await
        .error(403, "path_forbidden");
    post_json(a, "/api/convert", &json!({"src": MODEL, "dst": "../escape", "bits": 4}))
        .await
        .error(403, "path_forbidden");
    post_json(a, "/api/convert", &json!({"src": MODEL, "calibration": "/etc/passwd", "bits": 4}))
        .await
        .error(403, "folder_not_chosen");
    post_json(a, "/api/convert", &json!({"src": MODEL, "bits": "four"})).await.error(400, "invalid_value");

    // Unknown routes and methods, unknown models and jobs.
    get(a, "/api/nope").await.error(404, "not_found");
    get(a, "/v1/chat/completions").await.error(405, "method_not_allowed");
    send(a, "POST", "/api/models/nope/load", &[], b"").await.error(404, "model_not_found");
    send(a, "POST", "/api/models/nope/unload", &[], b"").await.error(404, "model_not_found");
    get(a, "/api/convert/12345").await.error(404, "job_not_found");
    send(a, "PATCH", "/api/models/tiny/settings", &[json_ct], br#"{"mtp": {"depth": 99}}"#)
        .await
        .error(400, "invalid_value");
    send(a, "PATCH", "/api/models/tiny/settings", &[json_ct], br#"{"mtp": {"colour": 1}}"#)
        .await
        .error(400, "invalid_value");
    send(a, "PATCH", "/api/models/tiny/settings", &[json_ct], br#"{"sampling": {"top_p": 0}}"#)
        .await
        .error(400, "invalid_value");

    // The UI: a short page while it is not built, then the files and index.html for app routes.
    let r = get(a, "/").await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("not built"), "{}", r.text());
    let ui = setup.dir.path().join("ui-dist");
    std::fs::create_dir_all(ui.join("assets")).unwrap();
    std::fs::write(ui.join("index.html"), "<html>tandem ui</html>").unwrap();
    std::fs::write(ui.join("assets/app.js"), "console.log(1)").unwrap();
    assert!(get(a, "/").await.text().contains("tandem ui"));
    assert_eq!(get(a, "/assets/app.js").await.text(), "console.log(1)");
    assert!(get(a, "/settings/models").await.text().contains("tandem ui"));
    assert_eq!(get(a, "/../../etc/passwd").await.status / 100, 4, "no way out of ui/dist");
    server.shutdown().await.unwrap();
}

/// Tandem's own objects in a generation request (`mtp`, `chat_template_kwargs`) refuse a key they do
/// not read, naming it, as the top level does: a typo must not run the model's default silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extension_objects_refuse_keys_they_do_not_read() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();
    let with = |route: &str, extra: Value| {
        let mut body = match route {
            "/v1/completions" => json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
            _ => chat_body("Hi", 2, false),
        };
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    for route in ["/v1/chat/completions", "/v1/completions"] {
        let m = post_json(a, route, &with(route, json!({"mtp": {"dept": 2}}))).await.error(400, "invalid_value");
        assert!(m.contains("mtp") && m.contains("dept"), "{route}: names the key: {m}");
        let ok = post_json(a, route, &with(route, json!({"mtp": {"enabled": true, "depth": 2}}))).await;
        assert_eq!(ok.status, 200, "{route}: {}", ok.text());
    }
    let m = post_json(
        a,
        "/v1/chat/completions",
        &with("", json!({"chat_template_kwargs": {"add_generation_prompt": false}})),
    )
    .await
    .error(400, "invalid_value");
    assert!(m.contains("add_generation_prompt"), "names the key: {m}");
    let ok =
        post_json(a, "/v1/chat/completions", &with("", json!({"chat_template_kwargs": {"enable_thinking": false}})))
            .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    server.shutdown().await.unwrap();
}

/// A field that may take one of several shapes (content, image_url, stop, tool_choice, prompt) says, when
/// it has none of them, which part is wrong and what it takes, not serde's "data did not match any
/// variant of untagged enum ...".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_value_of_no_accepted_shape_says_what_is_taken() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();
    let content = |c: Value| json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": c}]});
    let with = |extra: Value| {
        let mut body = chat_body("hi", 2, false);
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let chat = "/v1/chat/completions";
    let cases = [
        (
            chat,
            content(json!([{"type": "input_audio", "input_audio": {}}])),
            vec!["part 0", "input_audio", "image_url"],
        ),
        (chat, content(json!([{"type": "text", "text": "a"}, {"type": "text"}])), vec!["part 1", "`text`"]),
        (chat, content(json!(["hi"])), vec!["part 0 is a string"]),
        (chat, content(json!(5)), vec!["content", "a number"]),
        (chat, content(json!([{"type": "image_url", "image_url": {}}])), vec!["part 0", "`url`"]),
        (chat, content(json!([{"type": "image_url", "image_url": {"url": 5}}])), vec!["image_url.url", "a number"]),
        (chat, with(json!({"stop": 5})), vec!["`stop`", "a string or a list of strings"]),
        (chat, with(json!({"stop": ["\n", 5]})), vec!["`stop`", "item 1"]),
        (chat, with(json!({"tool_choice": 5})), vec!["`tool_choice`", "auto"]),
        ("/v1/completions", json!({"model": MODEL, "prompt": [1, 2, 3]}), vec!["`prompt`", "token ids"]),
        ("/v1/completions", json!({"model": MODEL, "prompt": {"text": "hi"}}), vec!["`prompt`", "an object"]),
    ];
    for (route, body, says) in cases {
        let m = post_json(a, route, &body).await.error(400, "invalid_value");
        assert!(!m.contains("untagged") && !m.contains("variant of"), "{body}: {m}");
        for s in says {
            assert!(m.contains(s), "{body}: the message says {s:?}: {m}");
        }
    }
    // The shapes that are taken still are, `image_url`'s `detail` included.
    let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let image =
        json!([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": png, "detail": "low"}}]);
    post_json(a, chat, &content(image)).await.error(400, "model_not_multimodal");
    for body in [content(json!([{"type": "text", "text": "hi"}])), with(json!({"stop": ["\n"], "tool_choice": "none"}))]
    {
        let r = post_json(a, chat, &body).await;
        assert_eq!(r.status, 200, "{body}: {}", r.text());
    }
    server.shutdown().await.unwrap();
}

/// `/v1/completions` takes OpenAI's defaults as clients write them out (`best_of: 1`, `echo: false`,
/// `n: 1`), and refuses by name what it does not do (`best_of` above 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_takes_the_defaults_clients_send() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();
    let body = |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "Once", "max_tokens": 2});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let r = post_json(a, "/v1/completions", &body(json!({"best_of": 1, "echo": false, "n": 1, "suffix": null}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 2);
    let m = post_json(a, "/v1/completions", &body(json!({"best_of": 3}))).await.error(400, "unsupported_parameter");
    assert!(m.contains("best_of"), "{m}");
    server.shutdown().await.unwrap();
}

/// OpenAI's "retrieve model" (`client.models.retrieve`): the list's entry for a known name, 404
/// `model_not_found` naming an unknown one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_is_retrieved_by_name() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();
    let listed = get(a, "/v1/models").await.json()["data"][0].clone();
    let r = get(a, &format!("/v1/models/{MODEL}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), listed, "the same object as in the list");
    let m = get(a, "/v1/models/no-such-model").await.error(404, "model_not_found");
    assert!(m.contains("no-such-model") && m.contains(MODEL), "names it and the known ones: {m}");
    // An `ORG/NAME`, percent-encoded as the clients send it, or not.
    get(a, "/v1/models/org%2Fname").await.error(404, "model_not_found");
    assert!(get(a, "/v1/models/org/name").await.error(404, "model_not_found").contains("org/name"));
    server.shutdown().await.unwrap();
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_key_and_binding() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.api_key = Some("s3cret".into());
    let server = setup.start(config, 16).await;
    let a = server.addr();
    get(a, "/v1/models").await.error(401, "invalid_api_key");
    send(a, "GET", "/api/models", &["Authorization: Bearer wrong"], b"").await.error(401, "invalid_api_key");
    assert_eq!(send(a, "GET", "/v1/models", &["Authorization: Bearer s3cret"], b"").await.status, 200);
    // Anthropic's clients send the key as `x-api-key`.
    assert_eq!(send(a, "GET", "/v1/models", &["x-api-key: s3cret"], b"").await.status, 200);
    send(a, "GET", "/v1/models", &["x-api-key: wrong"], b"").await.error(401, "invalid_api_key");
    let health = get(a, "/api/health").await;
    assert_eq!(health.status, 200, "health stays open");
    let backend = format!("{:?}", mlx::device::backend()).to_lowercase();
    assert_eq!(health.json()["backend"], backend.as_str(), "health names where MLX computes");
    server.shutdown().await.unwrap();

    // Beyond loopback without a key: refused before binding anything.
    let mut config = setup.config();
    config.host = "0.0.0.0".into();
    let err = start_with_engine(config, setup.engine(16)).await.err().expect("refused");
    assert!(err.to_string().contains("TANDEM_API_KEY"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_models_settings_and_stats() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();

    let health = get(a, "/api/health").await.json();
    assert_eq!(health["status"], "ok");

    let models = get(a, "/api/models").await.json();
    assert_eq!(models["default"], MODEL);
    let m = &models["models"][0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["format"], "hf");
    assert_eq!(m["loaded"], false);
    assert_eq!(m["state"], "unloaded");
    assert_eq!(m["size_bytes"].as_u64(), Some(std::fs::metadata(tiny_dir().join("model.safetensors")).unwrap().len()));
    assert_eq!(m["quantization"], Value::Null);
    assert_eq!(m["vision"], false);
    assert_eq!(m["mtp"]["available"], true, "{m}");
    assert_eq!(m["mtp"]["enabled"], true);
    assert_eq!(m["mtp"]["depth"], 3);
    assert_eq!(m["mtp"]["reason"], Value::Null);

    let v1 = get(a, "/v1/models").await.json();
    assert_eq!(v1["object"], "list");
    assert_eq!(v1["data"][0]["id"], MODEL);
    assert_eq!(v1["data"][0]["object"], "model");

    let r = send(a, "POST", "/api/models/tiny/load", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["loaded"], true);
    assert_eq!(r.json()["state"], "loaded");
    // The head's health as the load-time probe measured it.
    let p = &r.json()["mtp"]["probe"];
    assert!(p["acceptance"].as_f64().is_some_and(|a| a > 0.3), "{p}");
    assert_eq!(p["chosen"], "zero_centred", "{p}");
    assert!(p["tokens"].as_u64().is_some_and(|t| t > 100) && p["inconclusive"] == false, "{p}");

    // Settings persist to models.toml, comments kept.
    let r = send(
        a,
        "PATCH",
        "/api/models/tiny/settings",
        &["Content-Type: application/json"],
        br#"{"mtp": {"depth": 2}, "sampling": {"temperature": 0.5}}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["mtp"]["depth"], 2);
    let toml = std::fs::read_to_string(setup.registry_path()).unwrap();
    assert!(
        toml.contains("depth = 2") && toml.contains("temperature = 0.5") && toml.contains("# keep this comment"),
        "{toml}"
    );
    assert_eq!(Registry::load(&setup.registry_path()).unwrap().get(MODEL).unwrap().mtp.depth, 2);

    // A generation with the new depth shows in the stats.
    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["stats"]["spec"]["depth"], 2, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 12);

    let stats = get(a, "/api/stats").await.json();
    assert_eq!(stats["last"]["model"], MODEL);
    assert_eq!(stats["last"]["stats"]["completion_tokens"], 12);
    assert_eq!(stats["totals"]["generations"], 1);
    assert!(stats["memory"]["rss_bytes"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["memory"]["system_total_bytes"].as_u64().unwrap() > 0);
    assert_eq!(stats["generating"], false);
    assert_eq!(stats["model"], MODEL);
    assert_eq!(stats["stats"]["completion_tokens"], 12);
    assert_eq!(stats["loaded_models"], json!([MODEL]));
    assert!(stats["acceptance"].as_f64().is_some_and(|a| (0.0..=1.0).contains(&a)), "{stats}");
    assert!(stats["tok_per_cycle"].as_f64().is_some_and(|t| t >= 1.0), "{stats}");
    assert!(stats["series"].as_array().is_some_and(|s| !s.is_empty()), "{stats}");
    assert_eq!(stats["models"][0]["id"], MODEL);
    assert_eq!(stats["models"][0]["mtp_loaded"], true);

    // The stats stream: a snapshot at once (read one event, then hang up).
    let mut stream = TcpStream::connect(a).await.unwrap();
    stream
        .write_all(
            format!(
                "GET /api/stats/stream HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAccept: text/event-stream\r\n\r\n",
                a.port()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&got).contains("\n\n") || !String::from_utf8_lossy(&got).contains("data:") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an event in time")
            .unwrap();
        assert!(n > 0 && t0.elapsed() < Duration::from_secs(10), "stream closed early");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.to_ascii_lowercase().contains("content-type: text/event-stream"), "{text}");
    let data = text.lines().find_map(|l| l.strip_prefix("data: ")).expect("a data line");
    let snapshot: Value = serde_json::from_str(data).expect("snapshot JSON");
    assert!(snapshot["memory"].is_object() && snapshot["last"].is_object(), "{snapshot}");

    // mtp.adaptive off: the controller never parks drafting, and the setting is kept.
    let body = br#"{"mtp": {"adaptive": false}}"#;
    let r = send(a, "PATCH", "/api/models/tiny/settings", &["Content-Type: application/json"], body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["mtp"]["adaptive"], false, "{}", r.text());
    assert!(!Registry::load(&setup.registry_path()).unwrap().get(MODEL).unwrap().mtp.adaptive);
    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 24, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    let spec = &r.json()["stats"]["spec"];
    // Never parked: only the last token, when no draft fits, is a plain step.
    assert!(spec["parked_cycles"].as_u64().is_some_and(|p| p <= 1), "{spec}");
    assert!(spec["cycles"].as_u64().is_some_and(|c| c > 0), "{spec}");

    let r = send(a, "POST", "/api/models/tiny/unload", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["loaded"], false);
    assert!(server.engine().loaded().is_empty());

    // Shutting down ends the open stats stream instead of waiting for it.
    let t0 = Instant::now();
    server.shutdown().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(4), "shutdown took {:?}", t0.elapsed());
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(end.is_ok(), "the stats stream was closed by the shutdown");
}

/// Streams a chat request and returns the reply; with `hang_up_after` chunks, drops the connection
/// after that many `data:` events have arrived (a client cancelling).
async fn stream_chat(addr: std::net::SocketAddr, body: &Value, hang_up_after: Option<usize>) -> Result<Reply, usize> {
    let body = body.to_string();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        addr.port(),
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(k) = hang_up_after {
            let seen = String::from_utf8_lossy(&raw).matches("data: ").count();
            if seen >= k {
                return Err(seen);
            }
        }
    }
    Ok(parse_reply(&raw))
}

/// A streamed reply is complete: role first, a finish chunk, `[DONE]` last.
fn assert_complete_stream(reply: &Reply) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    let events = reply.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let finishes: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter(|v| !v["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1, "{events:?}");
    assert!(finishes[0]["stats"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_limit_and_cancellation() {
    let setup = Setup::new().one_at_a_time();
    // One running and one waiting; a third is refused.
    let server = setup.start(setup.config(), 1).await;
    let a = server.addr();
    assert_eq!(send(a, "POST", "/api/models/tiny/load", &[], b"").await.status, 200);

    let long = json!({"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}],
        "max_tokens": 3000, "stream": true, "ignore_eos": true});
    let short = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8, "stream": true, "ignore_eos": true});

    // A: runs; its first content chunk proves it is on the worker.
    let (a_tx, a_rx) = tokio::sync::oneshot::channel::<()>();
    let long_task = tokio::spawn(async move {
        let mut stream = TcpStream::connect(a).await.unwrap();
        let body = long.to_string();
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            a.port(),
            body.len()
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        while String::from_utf8_lossy(&raw).matches("data: ").count() < 3 {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "A ended early: {}", String::from_utf8_lossy(&raw));
            raw.extend_from_slice(&buf[..n]);
        }
        let _ = a_tx.send(());
        // Hold the connection until told to hang up.
        stream
    });
    a_rx.await.expect("A started");
    // B: waits behind A.
    let b_task = tokio::spawn(async move { stream_chat(a, &short, None).await });
    let t0 = Instant::now();
    while server.engine().stats().models[0].queued < 1 {
        assert!(t0.elapsed() < Duration::from_secs(20), "B never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // C: over the limit.
    let r = post_json(a, "/v1/chat/completions", &chat_body("Hello", 4, false)).await;
    r.error(429, "queue_full");
    // A hangs up: its generation stops, B runs to completion.
    let a_stream = long_task.await.unwrap();
    drop(a_stream);
    let b =
        tokio::time::timeout(Duration::from_secs(60), b_task).await.expect("B finishes").unwrap().expect("B complete");
    assert_complete_stream(&b);
    wait_idle(server.engine()).await;
    let stats = server.engine().stats();
    let last = stats.last.expect("a last generation");
    assert_eq!(last.stats.completion_tokens, 8, "B was the last to finish");
    assert_eq!(stats.totals.generations, 2, "A (cancelled) and B");
    assert!(stats.totals.completion_tokens < 3000, "A stopped when its client hung up: {:?}", stats.totals);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_with_cancellations() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 4).await;
    let a = server.addr();
    const CLIENTS: usize = 12;
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": format!("Story number {i}.")}],
                "max_tokens": 16 + i, "stream": i % 3 != 2, "ignore_eos": true});
            match i % 3 {
                // Hang up after the first content chunk.
                0 => match stream_chat(a, &body, Some(2)).await {
                    Err(_) => "cancelled",
                    Ok(r) if r.status == 429 => "busy",
                    Ok(r) => panic!("client {i}: {} {}", r.status, r.text()),
                },
                1 => match stream_chat(a, &body, None).await {
                    Ok(r) if r.status == 429 => {
                        r.error(429, "queue_full");
                        "busy"
                    }
                    Ok(r) => {
                        assert_complete_stream(&r);
                        "complete"
                    }
                    Err(_) => unreachable!(),
                },
                _ => {
                    let r = post_json(a, "/v1/chat/completions", &body).await;
                    if r.status == 429 {
                        r.error(429, "queue_full");
                        return "busy";
                    }
                    assert_eq!(r.status, 200, "client {i}: {}", r.text());
                    let v = r.json();
                    assert_eq!(v["usage"]["completion_tokens"], 16 + i, "{v}");
                    "complete"
                }
            }
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(
            tokio::time::timeout(Duration::from_secs(240), t).await.expect("no client hangs").expect("client ok"),
        );
    }
    let complete = outcomes.iter().filter(|o| **o == "complete").count();
    assert!(complete >= 1, "{outcomes:?}");
    // Nothing leaked: the queue drains and the worker still answers.
    wait_idle(server.engine()).await;
    let r = post_json(a, "/v1/chat/completions", &json!({"model": MODEL, "messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 4, "ignore_eos": true})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 4);
    eprintln!("outcomes: {outcomes:?}");
    server.shutdown().await.unwrap();
}

/// The engine without HTTP: FIFO order, cancellation by handle while queued and while running,
/// a dropped receiver, and the queue count back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_queue_and_cancel() {
    let setup = Setup::new().one_at_a_time();
    let engine = setup.engine(8);
    engine.load(MODEL).await.unwrap();
    let request = |n: usize| {
        let mut r = Request::new(MODEL, Input::Raw(format!("Once upon a time {n}")));
        r.max_tokens = Some(n);
        r.ignore_eos = true;
        r
    };
    let mut running = engine.submit(request(2000)).unwrap();
    // Wait until it runs.
    loop {
        match running.events.recv().await.unwrap() {
            Event::Delta { .. } => break,
            Event::Started => {}
            other => panic!("{other:?}"),
        }
    }
    let queued_cancelled = engine.submit(request(5)).unwrap();
    let dropped = engine.submit(request(6)).unwrap();
    let last = engine.submit(request(7)).unwrap();
    assert_eq!(engine.stats().models[0].queued, 3);
    queued_cancelled.cancel_handle().cancel();
    drop(dropped);
    running.cancel_handle().cancel();
    let done = running.collect().await.unwrap();
    assert_eq!(done.finish, tandem::generate::FinishReason::Cancelled);
    assert!(done.tokens.len() < 2000);
    let c = queued_cancelled.collect().await.unwrap();
    assert_eq!(c.finish, tandem::generate::FinishReason::Cancelled);
    assert!(c.tokens.is_empty());
    let l = last.collect().await.unwrap();
    assert_eq!(l.tokens.len(), 7);
    assert_eq!(l.finish, tandem::generate::FinishReason::Length);
    wait_idle(&engine).await;
    // Unloading fails what waits and frees the worker.
    let mut long = engine.submit(request(3000)).unwrap();
    let waiting = engine.submit(request(3)).unwrap();
    while !matches!(long.events.recv().await, Some(Event::Delta { .. })) {}
    assert!(engine.unload(MODEL).await.unwrap());
    assert!(matches!(waiting.collect().await, Err(tandem::engine::EngineError::Unloaded(_))));
    let mut finished = None;
    while let Some(e) = long.events.recv().await {
        if let Event::Done(c) = e {
            finished = Some(c.finish);
        }
    }
    assert_eq!(finished, Some(tandem::generate::FinishReason::Cancelled));
    assert!(matches!(engine.submit(request(3)), Err(tandem::engine::EngineError::NotLoaded(_))));
}

/// Two loaded models generate side by side: a short answer from one does not wait for a long
/// generation of the other to finish (the MLX lock changes hands between tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_models_take_turns_between_tokens() {
    let setup = Setup::new();
    let mut toml = std::fs::read_to_string(setup.registry_path()).unwrap();
    toml.push_str(&format!(
        "\n[[model]]\nname = \"second\"\npath = \"{}\"\nmtp = {{ enabled = false }}\n",
        tiny_dir().display()
    ));
    std::fs::write(setup.registry_path(), toml).unwrap();
    let engine = setup.engine(8);
    engine.load(MODEL).await.unwrap();
    engine.load("second").await.unwrap();
    let request = |model: &str, n: usize| {
        let mut r = Request::new(model, Input::Raw("Once upon a time".into()));
        r.max_tokens = Some(n);
        r.ignore_eos = true;
        r
    };
    let mut long = engine.submit(request(MODEL, 3000)).unwrap();
    while !matches!(long.events.recv().await, Some(Event::Delta { .. })) {}
    let short = engine.submit(request("second", 16)).unwrap();
    let short =
        tokio::time::timeout(Duration::from_secs(120), short.collect()).await.expect("the short answer came").unwrap();
    assert_eq!(short.tokens.len(), 16);
    // The long generation was still running when the short one finished: cancelling it now stops it.
    long.cancel_handle().cancel();
    let mut finished = None;
    let mut tokens = 0;
    while let Some(e) = long.events.recv().await {
        match e {
            Event::Delta { tokens: t, .. } => tokens += t.len(),
            Event::Done(c) => finished = Some(c.finish),
            _ => {}
        }
    }
    assert_eq!(finished, Some(tandem::generate::FinishReason::Cancelled), "after {tokens} more tokens");
    wait_idle(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversion_job() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 16).await;
    let a = server.addr();
    let r = post_json(a, "/api/convert", &json!({"src": MODEL, "dst": "tiny-4bit", "bits": 4, "group_size": 64})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json()["job"].as_str().expect("job id").to_owned();
    // The event stream replays and then follows the job until its end.
    let events = tokio::time::timeout(Duration::from_secs(300), get(a, &format!("/api/convert/{job}/events")))
        .await
        .expect("job ends");
    assert_eq!(events.status, 200);
    let events: Vec<Value> = events.events().iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(kinds.last(), Some(&"finished"), "{events:?}");
    assert_eq!(kinds.first(), Some(&"validated"), "{kinds:?}");
    assert!(kinds.contains(&"planned"), "{kinds:?}");
    let last = events.last().unwrap();
    assert!(last["bytes"].as_u64().unwrap() > 0 && last["bpw"].as_f64().unwrap() > 4.0, "{last}");
    let status = get(a, &format!("/api/convert/{job}")).await.json();
    assert_eq!(status["state"], "finished", "{status}");
    assert!(status["report"]["bytes"].as_u64().unwrap() > 0);
    assert!(status["done"].as_u64().unwrap() > 0 && status["done"] == status["total"], "{status}");
    let dst = setup.dir.path().join("models/tiny-4bit");
    assert_eq!(status["path"].as_str().map(PathBuf::from), Some(dst.clone()));
    // The same name again is a conflict; the UI's spelling (`name`, recipe, mtp_bits null) is understood.
    post_json(a, "/api/convert", &json!({"src": MODEL, "name": "tiny-4bit", "bits": 4}))
        .await
        .error(409, "already_exists");
    post_json(a, "/api/convert", &json!({"src": MODEL, "name": "x", "recipe": "mixed_9_9"}))
        .await
        .error(400, "invalid_value");
    let r = post_json(
        a,
        "/api/convert",
        &json!({"src": MODEL, "name": "tiny-mixed", "bits": 3, "group_size": 64,
        "recipe": "mixed_3_6", "mtp": "keep", "mtp_bits": null}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["options"]["recipe"], "mixed36");
    assert_eq!(r.json()["options"]["mtp_bits"], "dense");
    let mixed = r.json()["job"].as_str().unwrap().to_owned();
    // Cancel it (it may already be done on a fast machine).
    let d = send(a, "DELETE", &format!("/api/convert/{mixed}"), &[], b"").await;
    assert!(d.status == 202 || d.status == 200, "{}", d.text());
    if d.status == 202 {
        let end = tokio::time::timeout(Duration::from_secs(300), get(a, &format!("/api/convert/{mixed}/events")))
            .await
            .expect("ends");
        let last: Value = serde_json::from_str(end.events().last().expect("an event")).unwrap();
        assert!(last["event"] == "cancelled" || last["event"] == "finished", "{last}");
        if last["event"] == "cancelled" {
            assert!(!setup.dir.path().join("models/tiny-mixed").exists(), "a cancelled job writes nothing");
        }
    }
    assert!(dst.join("config.json").is_file());
    // The new model is listed (found in the models folder) as an MLX 4-bit model with its MTP head.
    let models = get(a, "/api/models").await.json();
    let m = models["models"].as_array().unwrap().iter().find(|m| m["id"] == "tiny-4bit").expect("listed").clone();
    assert_eq!(m["format"], "mlx");
    assert_eq!(m["quantization"]["bits"], 4);
    assert_eq!(m["mtp"]["available"], true, "{m}");
    // Not loaded yet: the probe the conversion recorded in its config.json.
    assert!(m["mtp"]["probe"]["acceptance"].as_f64().is_some_and(|a| a > 0.3), "{m}");
    // A model converted without its head: MTP unavailable, with the reason; switching it on is refused.
    let r = post_json(a, "/api/convert", &json!({"src": MODEL, "name": "tiny-nomtp", "mtp": "drop"})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let nomtp = r.json()["job"].as_str().unwrap().to_owned();
    let end = tokio::time::timeout(Duration::from_secs(300), get(a, &format!("/api/convert/{nomtp}/events")))
        .await
        .expect("ends");
    assert!(end.events().last().is_some_and(|e| e.contains("\"finished\"")), "{:?}", end.events());
    let m = get(a, "/api/models/tiny-nomtp").await.json();
    assert_eq!(m["mtp"]["available"], false, "{m}");
    assert!(m["mtp"]["reason"].as_str().is_some_and(|r| r.contains("no MTP head")), "{m}");
    let patch = |enabled: bool| format!(r#"{{"mtp": {{"enabled": {enabled}, "depth": 2}}}}"#);
    let r = send(
        a,
        "PATCH",
        "/api/models/tiny-nomtp/settings",
        &["Content-Type: application/json"],
        patch(false).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        a,
        "PATCH",
        "/api/models/tiny-nomtp/settings",
        &["Content-Type: application/json"],
        patch(true).as_bytes(),
    )
    .await;
    r.error(400, "invalid_value");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("no MTP head"), "{}", r.text());
    // Forgetting a finished job.
    assert_eq!(send(a, "DELETE", &format!("/api/convert/{job}"), &[], b"").await.status, 200);
    get(a, &format!("/api/convert/{job}")).await.error(404, "job_not_found");
    let _ = Path::new(&dst);
    server.shutdown().await.unwrap();
}

/// A conversion takes the MLX lock per tensor, not for its whole run. Each tensor it writes is
/// followed by a pause (the `convert_pause` test hook, with the lock let go), so the job lasts
/// about 124 × 150 ms; a chat sent once it is writing must answer while it still runs. Were the lock
/// held for the whole conversion (as `Engine::exclusive` did), the chat would answer only after
/// the job had finished, and the state read after the answer would be `finished`. Cancelling the
/// job afterwards still works and leaves nothing behind.
/// A folder outside the models folder: refused until chosen (by the person through the UI's
/// confirmation, or the desktop app's dialog, whose route only the app's token opens), then converted
/// where it lies with nothing written beside it; an existing model folder is added without converting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn folders_the_person_chose_convert_where_they_lie_and_add_as_they_are() {
    let setup = Setup::new();
    let outside = common::tempdir();
    let src = outside.path().join("my checkpoint");
    common::copy_dir(&tiny_dir(), &src);
    let before: Vec<_> = std::fs::read_dir(&src).unwrap().map(|e| e.unwrap().file_name()).collect();
    let picked = common::tempdir();
    let picked_dir = picked.path().join("picked");
    common::copy_dir(&tiny_dir(), &picked_dir);
    let mut config = setup.config();
    let answer = picked_dir.clone();
    config.folder_picker =
        Some(FolderPicker { token: "secret-token".into(), pick: std::sync::Arc::new(move |_| Some(answer.clone())) });
    let server = setup.start(config, 16).await;
    let a = server.addr();
    let src_s = src.to_str().unwrap();

    let refused = post_json(a, "/api/convert", &json!({"src": src_s, "dst": "mine-8bit", "bits": 8})).await;
    let message = refused.error(403, "folder_not_chosen");
    assert!(message.contains(src_s), "{message}");
    // Choosing: relative paths, missing folders and unknown fields are refused, naming them.
    post_json(a, "/api/folders", &json!({"path": "relative/dir"})).await.error(400, "invalid_path");
    let missing = post_json(a, "/api/folders", &json!({"path": "/no/such/folder"})).await.error(400, "invalid_path");
    assert!(missing.contains("/no/such/folder"), "{missing}");
    post_json(a, "/api/folders", &json!({"path": src_s, "why": 1})).await.error(400, "invalid_value");
    let chosen = post_json(a, "/api/folders", &json!({"path": src_s})).await;
    assert_eq!(chosen.status, 200, "{}", chosen.text());
    assert_eq!(chosen.json()["model_folder"], true);
    assert_eq!(get(a, "/api/folders").await.json()["folders"][0], src.canonicalize().unwrap().to_str().unwrap());
    // A chosen folder is read, never written: outputs stay inside the models folder.
    post_json(a, "/api/convert", &json!({"src": src_s, "dst": outside.path().join("out"), "bits": 8}))
        .await
        .error(403, "path_forbidden");
    let r = post_json(a, "/api/convert", &json!({"src": src_s, "dst": "mine-8bit", "bits": 8})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json()["job"].as_str().unwrap().to_owned();
    let events = tokio::time::timeout(Duration::from_secs(300), get(a, &format!("/api/convert/{job}/events")))
        .await
        .expect("conversion ends");
    assert!(events.text().contains("\"finished\""), "{}", events.text());
    assert!(setup.dir.path().join("models/mine-8bit/config.json").is_file());
    let after: Vec<_> = std::fs::read_dir(&src).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after, "nothing written beside the source");

    // The desktop app's dialog: 403 without the window's token, the picked folder chosen with it.
    post_json(a, "/api/folders/pick", &json!({})).await.error(403, "not_the_app");
    let json_ct = "Content-Type: application/json";
    send(a, "POST", "/api/folders/pick", &[json_ct, "X-Tandem-Shell: guess"], b"{}").await.error(403, "not_the_app");
    let r = send(a, "POST", "/api/folders/pick", &[json_ct, "X-Tandem-Shell: secret-token"], b"{}").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["path"], picked_dir.canonicalize().unwrap().to_str().unwrap());

    // Adding a model folder as it is: only a chosen (or models-folder) one, only a model folder.
    let stranger = common::tempdir();
    common::copy_dir(&tiny_dir(), &stranger.path().join("m"));
    let m = stranger.path().join("m");
    post_json(a, "/api/models", &json!({"path": m})).await.error(403, "folder_not_chosen");
    let r = post_json(a, "/api/models", &json!({"path": picked_dir, "name": "picked-tiny"})).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["name"], "picked-tiny");
    let listed = get(a, "/api/models").await.json();
    assert!(listed["models"].as_array().unwrap().iter().any(|m| m["name"] == "picked-tiny"), "{listed}");
    let toml = std::fs::read_to_string(setup.registry_path()).unwrap();
    assert!(toml.contains("# keep this comment") && toml.contains("name = \"picked-tiny\""), "{toml}");
    // The same folder again is the same model; a taken name is refused and nothing is written.
    let again = post_json(a, "/api/models", &json!({"path": picked_dir, "name": "other"})).await;
    assert_eq!(again.json()["name"], "picked-tiny");
    post_json(a, "/api/folders", &json!({"path": stranger.path()})).await;
    let taken =
        post_json(a, "/api/models", &json!({"path": m, "name": "picked-tiny"})).await.error(400, "invalid_value");
    assert!(taken.contains("picked-tiny"), "{taken}");
    let not_model = post_json(a, "/api/models", &json!({"path": stranger.path()})).await.error(400, "invalid_path");
    assert!(not_model.contains("not a model folder"), "{not_model}");
    assert_eq!(std::fs::read_to_string(setup.registry_path()).unwrap(), toml, "refusals write nothing");
    // The registered model loads and answers.
    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"model": "picked-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_answers_while_a_conversion_runs() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.convert_pause = Some(Duration::from_millis(150));
    let server = setup.start(config, 16).await;
    let a = server.addr();
    // Loaded first, so that the chat below waits for nothing but the conversion.
    let r = send(a, "POST", &format!("/api/models/{MODEL}/load"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post_json(a, "/api/convert", &json!({"src": MODEL, "dst": "tiny-slow", "bits": 4})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json()["job"].as_str().expect("job id").to_owned();
    let status = || async { get(a, &format!("/api/convert/{job}")).await.json() };
    let t0 = Instant::now();
    loop {
        let s = status().await;
        if s["state"] == "running" && s["done"].as_u64().unwrap_or(0) >= 2 {
            break;
        }
        assert!(s["state"] == "queued" || s["state"] == "running", "{s}");
        assert!(t0.elapsed() < Duration::from_secs(120), "the conversion wrote nothing in 120 s: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(300),
        post_json(a, "/v1/chat/completions", &chat_body("Hello there", 8, false)),
    )
    .await
    .expect("the chat answers");
    let waited = sent.elapsed();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.json()["choices"][0]["message"]["content"].is_string(), "{}", reply.text());
    let s = status().await;
    let (done, total) = (s["done"].as_u64().unwrap(), s["total"].as_u64().unwrap());
    assert_eq!(
        s["state"], "running",
        "the chat answered after {waited:?}, with the conversion at tensor {done} of {total}"
    );
    assert!(done < total, "tensor {done} of {total}");
    eprintln!("the chat answered in {waited:?}, the conversion at tensor {done} of {total}");

    let d = send(a, "DELETE", &format!("/api/convert/{job}"), &[], b"").await;
    assert_eq!(d.status, 202, "{}", d.text());
    let end = tokio::time::timeout(Duration::from_secs(120), get(a, &format!("/api/convert/{job}/events")))
        .await
        .expect("the job ends");
    let last: Value = serde_json::from_str(end.events().last().expect("an event")).unwrap();
    assert_eq!(last["event"], "cancelled", "{last}");
    assert_eq!(status().await["state"], "cancelled");
    let models = setup.dir.path().join("models");
    let left: Vec<String> =
        std::fs::read_dir(&models).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(left.is_empty(), "a cancelled conversion left {left:?} in {}", models.display());
    wait_idle(server.engine()).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_are_batched_and_each_matches_alone() {
    let setup = Setup::new();
    let server = setup.start(setup.config(), 4).await;
    let a = server.addr();
    assert_eq!(send(a, "POST", "/api/models/tiny/load", &[], b"").await.status, 200);
    let body = |content: &str, n: u32, mtp: bool| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": n,
            "ignore_eos": true, "temperature": 0.0, "mtp": {"enabled": mtp}})
    };
    let asks = [
        body("Tell me a long story about a cat.", 160, true),
        body("Hi", 120, false),
        body("Once upon a time there was a very small town by the sea, and", 140, true),
    ];
    let text = |r: &Reply| r.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    let mut alone = Vec::new();
    for ask in &asks {
        let r = post_json(a, "/v1/chat/completions", ask).await;
        assert_eq!(r.status, 200, "{}", r.text());
        alone.push(text(&r));
    }
    // All three at once, while the engine is watched for a batch of more than one.
    let engine = server.engine().clone();
    let watch = tokio::spawn(async move {
        let mut most = 0;
        for _ in 0..3000 {
            most = most.max(engine.stats().models[0].running);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        most
    });
    let (r0, r1, r2) = tokio::join!(
        post_json(a, "/v1/chat/completions", &asks[0]),
        post_json(a, "/v1/chat/completions", &asks[1]),
        post_json(a, "/v1/chat/completions", &asks[2])
    );
    for (i, r) in [r0, r1, r2].iter().enumerate() {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(text(r), alone[i], "request {i}: its text beside the others differs from its text alone");
    }
    let most = watch.await.unwrap();
    assert!(most >= 2, "the requests never ran together (at most {most} at once)");
    server.shutdown().await.unwrap();
}
