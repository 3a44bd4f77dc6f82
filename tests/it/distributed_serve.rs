//! `tandem serve --hostfile` and `tandem worker` (issue 23): tandem-tiny (converted to f32) split over
//! two processes on loopback, by heads or by layers, answers an API request as one process does; a
//! lost worker is answered with an error within seconds, and the server goes on answering; a worker
//! that would load the model another way is refused before the model runs; bad hostfiles and ranks
//! are named.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tandem::engine::{Engine, EngineConfig};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, ServeConfig};

use crate::common::http::post_json;
use crate::common::*;

/// Kills a child process when dropped.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn tandem(config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.env("TANDEM_CONFIG", config).env_remove("TANDEM_API_KEY").env_remove("RUST_LOG");
    c
}

/// tandem-tiny in f32 (the ranks' partial sums then differ from one matmul's only in the order of
/// additions) and a models.toml naming it `tiny`.
fn setup(dir: &Path) -> PathBuf {
    let f32_dir = dir.join("tiny-f32");
    let out = tandem(Path::new("/nonexistent"))
        .args([
            "convert",
            &tiny_model_dir().display().to_string(),
            "--out",
            &f32_dir.display().to_string(),
            "--dtype",
            "f32",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let toml = dir.join("models.toml");
    let text = format!(
        "models_dir = \"models\"\ndefault = \"tiny\"\n[[model]]\nname = \"tiny\"\npath = {:?}\nmtp = {{ enabled = true, depth = 3 }}\n",
        f32_dir.display().to_string()
    );
    std::fs::write(&toml, text).unwrap();
    toml
}

fn completion(a: SocketAddr) -> Value {
    let body =
        json!({"model": "tiny", "prompt": "Call me Ishmael. Some years ago", "max_tokens": 24, "temperature": 0});
    let r = tokio::runtime::Runtime::new().unwrap().block_on(post_json(a, "/v1/completions", &body));
    let mut v = r.json();
    v["status"] = json!(r.status);
    v
}

/// A worker (`--split worker_split`) and `tandem serve --hostfile` (`--split server_split`) over two
/// loopback ports; returns them once the server listens.
fn start_group(dir: &Path, toml: &Path, worker_split: &str, server_split: &str) -> (Kill, Kill, SocketAddr) {
    let [r0, r1, http]: [u16; 3] = free_ports(3).try_into().unwrap();
    let hosts = dir.join("hosts.json");
    std::fs::write(&hosts, json!([[format!("127.0.0.1:{r0}")], [format!("127.0.0.1:{r1}")]]).to_string()).unwrap();
    let hostfile = hosts.display().to_string();
    let worker = Kill(
        tandem(toml)
            .args(["worker", "--hostfile", &hostfile, "--rank", "1", "--model", "tiny", "--split", worker_split])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut server = Kill(
        tandem(toml)
            .args(["serve", "--hostfile", &hostfile, "--port", &http.to_string(), "--split", server_split])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // It listens once the group has formed.
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::net::TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(Instant::now() < deadline, "tandem serve --hostfile did not start listening");
        assert!(server.0.try_wait().unwrap().is_none(), "tandem serve --hostfile exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    (worker, server, format!("127.0.0.1:{http}").parse().unwrap())
}

/// The completion one process gives.
fn alone(toml: &Path) -> Value {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut config = ServeConfig::new(toml);
        config.port = 0;
        config.api_key = None;
        let engine = Engine::new(Registry::load(toml).unwrap(), EngineConfig::default());
        let one = start_with_engine(config, engine).await.unwrap();
        let body =
            json!({"model": "tiny", "prompt": "Call me Ishmael. Some years ago", "max_tokens": 24, "temperature": 0});
        let r = post_json(one.addr(), "/v1/completions", &body).await;
        one.shutdown().await.unwrap();
        r.json()
    })
}

fn assert_same_answer(split: &Value, alone: &Value, how: &str) {
    assert_eq!(split["status"], 200, "{split}");
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(!text(alone).is_empty(), "{alone}");
    assert_eq!(text(split), text(alone), "{how}: {split}\none process: {alone}");
    assert_eq!(split["usage"]["completion_tokens"], alone["usage"]["completion_tokens"]);
}

fn stderr_of(child: &mut Kill) -> String {
    let _ = child.0.kill();
    let _ = child.0.wait();
    let mut stderr = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    stderr
}

#[test]
fn two_processes_answer_as_one_and_a_lost_worker_is_an_error_not_a_hang() {
    let dir = tempdir();
    let toml = setup(dir.path());
    let (mut worker, _server, addr) = start_group(dir.path(), &toml, "tensor", "tensor");
    let split = completion(addr);
    assert_same_answer(&split, &alone(&toml), "split by heads over 2 processes");
    let rt = tokio::runtime::Runtime::new().unwrap();

    // The worker goes: the next request fails at once with an error, and the server still answers.
    let said = stderr_of(&mut worker);
    let t0 = Instant::now();
    let lost = completion(addr);
    assert!(lost["status"].as_u64().is_some_and(|s| s >= 400), "{lost}");
    assert!(t0.elapsed() < Duration::from_secs(30), "the lost rank took {:?} to notice", t0.elapsed());
    let health = rt.block_on(crate::common::http::get(addr, "/api/health"));
    assert_eq!(health.status, 200);
    eprintln!("worker said: {said}");
}

/// By layers: rank 0 runs layers 0-3, the worker 4-7.
#[test]
fn a_pipeline_of_two_processes_answers_as_one() {
    let dir = tempdir();
    let toml = setup(dir.path());
    let (_worker, _server, addr) = start_group(dir.path(), &toml, "pipeline", "pipeline");
    assert_same_answer(&completion(addr), &alone(&toml), "a pipeline of 2 processes");
}

/// A worker told another split than rank 0 would build another graph: it refuses the load before any
/// of the model's collectives, rank 0's request fails naming why, and both stay up.
#[test]
fn a_worker_that_would_load_the_model_otherwise_is_refused_before_it_runs() {
    let dir = tempdir();
    let toml = setup(dir.path());
    let (mut worker, mut server, addr) = start_group(dir.path(), &toml, "pipeline", "tensor");
    let t0 = Instant::now();
    let refused = completion(addr);
    assert!(refused["status"].as_u64().is_some_and(|s| s >= 400), "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("does not serve model `tiny` as this one loads it") && message.contains("--split tensor"),
        "{message}"
    );
    assert!(t0.elapsed() < Duration::from_secs(60), "the refusal took {:?}", t0.elapsed());
    assert!(worker.0.try_wait().unwrap().is_none() && server.0.try_wait().unwrap().is_none(), "both stay up");
    let said = stderr_of(&mut worker);
    assert!(said.contains("refused"), "the worker says why: {said}");
}

#[test]
fn bad_hostfiles_and_ranks_are_named() {
    let dir = tempdir();
    let toml = dir.path().join("models.toml");
    std::fs::write(&toml, format!("[[model]]\nname = \"tiny\"\npath = {:?}\n", tiny_model_dir().display().to_string()))
        .unwrap();
    let two = dir.path().join("two.json");
    std::fs::write(&two, json!([["127.0.0.1:1"], ["127.0.0.1:2"]]).to_string()).unwrap();
    let one = dir.path().join("one.json");
    std::fs::write(&one, json!([["127.0.0.1:1"]]).to_string()).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let missing = dir.path().join("missing.json");
    let cases: [(Vec<String>, String); 5] = [
        (
            vec!["serve".into(), "--hostfile".into(), missing.display().to_string()],
            format!("--hostfile {}", missing.display()),
        ),
        (vec!["serve".into(), "--hostfile".into(), bad.display().to_string()], "not a JSON list".into()),
        (vec!["serve".into(), "--hostfile".into(), one.display().to_string()], "a group needs two or more".into()),
        (
            vec!["worker".into(), "--hostfile".into(), two.display().to_string(), "--rank".into(), "5".into()],
            "--rank 5: ".into(),
        ),
        (
            vec!["worker".into(), "--hostfile".into(), two.display().to_string(), "--rank".into(), "0".into()],
            "--rank 0 is `tandem serve --hostfile`".into(),
        ),
    ];
    for (args, expected) in cases {
        let out = tandem(&toml).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(&expected), "{args:?}: {stderr}");
    }
}
