//! Hostile connections and requests (issue 17): idle and half-open sockets, a connection cap,
//! event streams that outlive the header timeout, prompts too large to tokenize, blank API keys,
//! absurd sampling settings and conversion options.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::http::{get, post_json, send};
use serde_json::json;
use tandem::engine::{Engine, EngineConfig};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, RunningServer, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "tiny";

/// models.toml with the bundled model as `tiny`, and an empty models folder.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = common::tempdir();
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        let toml = format!(
            "models_dir = \"{}\"\ndefault = \"{MODEL}\"\n\n[[model]]\nname = \"{MODEL}\"\npath = \"{}\"\n\
             sampling = {{ temperature = 0.0, max_tokens = 8 }}\n",
            dir.path().join("models").display(),
            common::tiny_model_dir().display()
        );
        std::fs::write(dir.path().join("models.toml"), toml).unwrap();
        Setup { dir }
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

    fn engine(&self) -> Engine {
        Engine::new(Registry::load(&self.registry_path()).unwrap(), EngineConfig::default())
    }

    async fn start(&self, config: ServeConfig) -> RunningServer {
        start_with_engine(config, self.engine()).await.expect("server starts")
    }
}

/// The soft limit on open files of this process (Linux), else a cautious guess.
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|soft| soft.parse().ok())
        .unwrap_or(256)
}

/// Reads until the server closes the connection; the time that took, or None if it stays open
/// for `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(t0.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t0.elapsed()),
            Ok(Ok(_)) => {} // a 408 before closing is fine
        }
    }
}

async fn health_within(addr: SocketAddr, limit: Duration) -> bool {
    tokio::time::timeout(limit, get(addr, "/api/health")).await.is_ok_and(|r| r.status == 200)
}

/// A thousand idle sockets (connected, never a byte sent) leave the server answering chats without
/// an error, and the server closes each once the header timeout has passed. Before the fix nothing
/// closed them, and about 1,020 of them exhausted the descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_closes_idle_and_half_open_connections() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.header_timeout = Duration::from_secs(3);
    // The server raises the descriptor limit of the process it runs in (this test's) as it starts.
    let server = setup.start(config).await;
    let a = server.addr();
    // Two descriptors per connection (both ends live in this process), and room for the rest.
    let n = 1000.min(open_files_limit().saturating_sub(400) / 2).max(8);
    if n < 1000 {
        eprintln!("only {n} idle connections: the hard limit on open files here is {}", open_files_limit());
    }
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        idle.push(TcpStream::connect(a).await.expect("connect"));
    }
    assert!(health_within(a, Duration::from_secs(2)).await, "health answers beside {n} idle connections");
    // A short soak beside them: eight chats at once, every one answered.
    let chats = (0..8).map(|i| {
        tokio::spawn(async move {
            let body = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": format!("Hello {i}")}]});
            post_json(a, "/v1/chat/completions", &body).await.status
        })
    });
    for (i, status) in futures::future::join_all(chats).await.into_iter().enumerate() {
        assert_eq!(status.unwrap(), 200, "chat #{i} beside {n} idle connections");
    }

    // Half-open: connected, the head started and never finished.
    let mut partial = TcpStream::connect(a).await.unwrap();
    partial.write_all(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    let t = closed_within(&mut partial, Duration::from_secs(10)).await;
    assert!(t.is_some_and(|t| t < Duration::from_secs(5)), "a half-sent head is dropped after the timeout: {t:?}");
    for (i, stream) in idle.iter_mut().enumerate() {
        assert!(closed_within(stream, Duration::from_secs(10)).await.is_some(), "idle connection #{i} still open");
    }

    // Keep-alive: after a response, an idle connection is closed after the same timeout.
    let mut kept = TcpStream::connect(a).await.unwrap();
    kept.write_all(format!("GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", a.port()).as_bytes())
        .await
        .unwrap();
    let mut head = vec![0u8; 4096];
    let got = tokio::time::timeout(Duration::from_secs(5), kept.read(&mut head)).await.unwrap().unwrap();
    assert!(head[..got].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..got]));
    let t = closed_within(&mut kept, Duration::from_secs(10)).await;
    assert!(t.is_some_and(|t| t < Duration::from_secs(5)), "an idle keep-alive connection is closed: {t:?}");
    server.shutdown().await.unwrap();
}

/// At the cap, a new connection waits (in the backlog) until an idle one is closed by the header
/// timeout, then is served: the cap holds and the server recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_caps_open_connections() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.max_connections = 8;
    config.header_timeout = Duration::from_secs(2);
    let server = setup.start(config).await;
    let a = server.addr();
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(a).await.unwrap());
    }
    // Give the server time to accept them all.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let waiting = tokio::spawn(async move { get(a, "/api/health").await.status });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a ninth connection is not served while eight are open");
    let status = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("served once slots free").unwrap();
    assert_eq!(status, 200);
    assert!(t0.elapsed() >= Duration::from_millis(1500), "served only after the idle ones timed out");
    drop(idle);
    server.shutdown().await.unwrap();
}

/// An event stream outlives the header timeout: the timeout bounds waiting for a request, never
/// a response being written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_streams_outlive_the_header_timeout() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.header_timeout = Duration::from_millis(500);
    let server = setup.start(config).await;
    let a = server.addr();
    let mut stream = TcpStream::connect(a).await.unwrap();
    let req = format!("GET /api/stats/stream HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", a.port());
    stream.write_all(req.as_bytes()).await.unwrap();
    // Snapshots come at once and then every 2 s: three need over 4 s, eight header timeouts.
    let mut raw = Vec::new();
    let t0 = Instant::now();
    let mut buf = [0u8; 8192];
    while String::from_utf8_lossy(&raw).matches("data:").count() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(15), "stream stalled: {}", String::from_utf8_lossy(&raw));
        let n =
            tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await.expect("more events").unwrap();
        assert!(n > 0, "the stream was closed after {:?}", t0.elapsed());
        raw.extend_from_slice(&buf[..n]);
    }
    assert!(t0.elapsed() > Duration::from_secs(3));
    drop(stream);
    server.shutdown().await.unwrap();
}

/// Text that cannot fit the context is refused before it is tokenized, naming the sizes: the
/// tiny model's 4,096 tokens of at most 17 bytes hold about 70 KB, and 8 MB used to be tokenized
/// whole (seconds and gigabytes for 30 MB) before the context check refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_refuses_an_oversized_prompt_before_tokenizing() {
    let setup = Setup::new();
    let server = setup.start(setup.config()).await;
    let a = server.addr();
    let text = "hello world ".repeat(700_000);
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4});
    let r = post_json(a, "/v1/chat/completions", &body).await;
    let message = r.error(400, "context_length_exceeded");
    assert!(message.contains(&format!("{} bytes", text.len())), "names the prompt's size: {message}");
    assert!(message.contains("4096 tokens") && message.contains("`tiny`"), "names the context: {message}");
    // A prompt that fits is still answered.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4});
    let r = post_json(a, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    server.shutdown().await.unwrap();
}

/// `tandem serve` with `env`, given 30 s to fail; its exit status and stderr (None while it
/// still serves, which is then stopped).
fn serve_cli(setup: &Setup, args: &[&str], env: &[(&str, &str)]) -> Option<(std::process::ExitStatus, String)> {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["serve", "--port", "0"])
        .args(args)
        .env("TANDEM_CONFIG", setup.registry_path())
        .env_remove("TANDEM_API_KEY")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tandem serve");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return Some((status, err));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A blank API key (or one a header cannot carry) used to let the server bind beyond loopback
/// with a key no client can send; it is refused, from the library's config, `--api-key` and
/// `TANDEM_API_KEY` alike, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refuses_api_keys_nobody_can_send() {
    let setup = Setup::new();
    for (host, key, why) in [
        ("0.0.0.0", "", "empty"),
        ("0.0.0.0", "   ", "empty"),
        ("127.0.0.1", " ", "empty"),
        ("0.0.0.0", " s3cret", "starts or ends with a space"),
        ("0.0.0.0", "cl\u{e9}", "visible ASCII"),
    ] {
        let mut config = setup.config();
        config.host = host.into();
        config.api_key = Some(key.into());
        let err = start_with_engine(config, setup.engine()).await.err().map(|e| e.to_string());
        let err = err.unwrap_or_else(|| panic!("key {key:?} on {host} was accepted"));
        assert!(err.contains("API key") && err.contains(why), "{key:?}: {err}");
    }
    let (status, err) = serve_cli(&setup, &["--host", "0.0.0.0", "--api-key", ""], &[]).expect("refused");
    assert!(!status.success() && err.contains("--api-key is empty"), "{status}: {err}");
    let (status, err) = serve_cli(&setup, &["--host", "0.0.0.0"], &[("TANDEM_API_KEY", " ")]).expect("refused");
    assert!(!status.success() && err.contains("TANDEM_API_KEY") && err.contains("empty"), "{status}: {err}");
}

/// PATCH used to accept `repetition_penalty` 1e-45 (logits divided by almost zero); settings and
/// a request's own values are held to the same ranges, and the error names the field and value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_refuses_sampling_values_out_of_range() {
    let setup = Setup::new();
    let server = setup.start(setup.config()).await;
    let a = server.addr();
    let json_ct = "Content-Type: application/json";
    let before = std::fs::read_to_string(setup.registry_path()).unwrap();
    for (body, expected) in [
        (r#"{"sampling": {"repetition_penalty": 1e-45}}"#, "sampling.repetition_penalty = 1e-45: must be in [0.1, 10]"),
        (r#"{"sampling": {"temperature": 1e30}}"#, "sampling.temperature = 1e30: must be in [0, 10]"),
    ] {
        let r = send(a, "PATCH", &format!("/api/models/{MODEL}/settings"), &[json_ct], body.as_bytes()).await;
        let message = r.error(400, "invalid_value");
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(std::fs::read_to_string(setup.registry_path()).unwrap(), before, "nothing written");
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1e-45});
    let message = post_json(a, "/v1/chat/completions", &body).await.error(400, "invalid_value");
    assert!(message.contains("repetition_penalty = 1e-45"), "{message}");
    server.shutdown().await.unwrap();
}

/// Invalid conversion options used to get 202 and fail inside the job; they are refused with 400
/// naming the option, before any job exists. Jobs beyond the cap (one here) get 429 until one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_checks_conversions_before_accepting_them() {
    let setup = Setup::new();
    let mut config = setup.config();
    config.convert_pause = Some(Duration::from_millis(100));
    let registry = Registry::load(&setup.registry_path()).unwrap();
    let engine = Engine::new(registry, EngineConfig { max_conversions: 1, ..EngineConfig::default() });
    let server = start_with_engine(config, engine).await.expect("server starts");
    let a = server.addr();
    for (body, option) in [
        (json!({"src": MODEL, "dst": "b7", "bits": 7}), "bits"),
        (json!({"src": MODEL, "dst": "g48", "bits": 4, "group_size": 48}), "group_size"),
        (json!({"src": MODEL, "dst": "t", "bits": 4, "target_bpw": 3.5}), "target_bpw"),
        (json!({"src": MODEL, "dst": "s0", "bits": 4, "shard_bytes": 0}), "shard_bytes"),
    ] {
        let message = post_json(a, "/api/convert", &body).await.error(400, "invalid_value");
        assert!(message.contains(&format!("invalid option {option}")), "{body}: {message}");
    }
    let jobs = get(a, "/api/convert").await.json();
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(0), "no job was made: {jobs}");

    let start = |dst: &str| {
        let body = json!({"src": MODEL, "dst": dst, "bits": 4});
        async move { post_json(a, "/api/convert", &body).await }
    };
    let r = start("slow").await;
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json()["job"].as_str().unwrap().to_owned();
    let message = start("second").await.error(429, "too_many_conversions");
    assert!(message.contains("1 (the most at once)"), "{message}");
    assert_eq!(send(a, "DELETE", &format!("/api/convert/{job}"), &[], b"").await.status / 100, 2);
    let end = tokio::time::timeout(Duration::from_secs(120), get(a, &format!("/api/convert/{job}/events")))
        .await
        .expect("the cancelled job ends");
    assert!(end.events().last().is_some_and(|e| e.contains("cancelled") || e.contains("finished")));
    // A slot is free again.
    let r = start("third").await;
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json()["job"].as_str().unwrap().to_owned();
    send(a, "DELETE", &format!("/api/convert/{job}"), &[], b"").await;
    let _ = tokio::time::timeout(Duration::from_secs(120), get(a, &format!("/api/convert/{job}/events"))).await;
    server.shutdown().await.unwrap();
}

/// A model whose folder is missing used to pass startup and fail its first load with a 500; the
/// server now refuses to start, naming models.toml's line and the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_start_names_a_missing_model_folder() {
    let dir = common::tempdir();
    let toml = dir.path().join("models.toml");
    std::fs::write(&toml, "models_dir = \"models\"\n\n[[model]]\nname = \"gone\"\npath = \"gone\"\n").unwrap();
    let mut config = ServeConfig::new(&toml);
    config.port = 0;
    config.api_key = None;
    let error = tandem::server::start(config).await.err().expect("refused");
    let chain = format!("{error:#}");
    let expected = format!("{}:5: model `gone`: {} does not exist", toml.display(), dir.path().join("gone").display());
    assert!(chain.contains(&expected), "{chain}");
}

/// A second server on a port a Tandem server holds says so and where to find it, instead of a bare
/// "address in use".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_on_a_busy_port_says_who_holds_it() {
    let setup = Setup::new();
    let first = setup.start(setup.config()).await;
    let mut config = setup.config();
    config.port = first.addr().port();
    let err = match start_with_engine(config, setup.engine()).await {
        Ok(_) => panic!("a second server started on a busy port"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("Tandem is already serving on") && err.contains(&first.addr().to_string()), "{err}");
    first.shutdown().await.unwrap();
}
