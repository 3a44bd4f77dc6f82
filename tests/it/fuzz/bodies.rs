//! HTTP bodies as any client could send them, against a running server with the bundled model: mutated
//! chat requests, settings patches, conversion requests and conversations, and raw bytes. Every answer
//! must be a JSON reply below 500 (a 4xx naming the problem, or a 2xx), and the server must keep
//! answering afterwards.

use proptest::prelude::*;
use serde_json::{json, Value};
use tandem::engine::{Engine, EngineConfig};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, ServeConfig};

use super::inputs::{apply, json_edits};
use super::runner;
use crate::common::{self, http::send};

/// The requests mutated: each with the route it goes to.
fn seeds() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "POST",
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "seed": 1, "stop": ["\n"], "stream": false}),
        ),
        (
            "POST",
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "stream": true}),
        ),
        (
            "PATCH",
            "/api/models/tiny/settings",
            json!({"mtp": {"enabled": true, "depth": 2, "adaptive": true},
                "sampling": {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0, "max_tokens": 16}}),
        ),
        ("POST", "/api/convert", json!({"src": "tiny", "name": "fuzzed", "bits": 4, "group_size": 64, "mtp": "keep"})),
        (
            "PUT",
            "/api/conversations/c1",
            json!({"id": "c1", "title": "t", "messages": [{"role": "user", "content": "x"}]}),
        ),
    ]
}

#[test]
fn http_bodies() {
    let dir = common::tempdir();
    std::fs::create_dir_all(dir.path().join("models")).unwrap();
    let toml = format!(
        "models_dir = {:?}\ndefault = \"tiny\"\n\n[[model]]\nname = \"tiny\"\npath = {:?}\n\
         sampling = {{ temperature = 0.0, max_tokens = 4 }}\n",
        dir.path().join("models").to_str().unwrap(),
        common::tiny_model_dir().to_str().unwrap()
    );
    let registry_path = dir.path().join("models.toml");
    std::fs::write(&registry_path, toml).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = rt.block_on(async {
        let mut config = ServeConfig::new(registry_path.clone());
        config.port = 0;
        config.api_key = None;
        config.ui_dir = dir.path().join("ui-dist");
        let engine = Engine::new(Registry::load(&registry_path).unwrap(), EngineConfig::default());
        start_with_engine(config, engine).await.expect("server starts")
    });
    let addr = server.addr();
    let seeds = seeds();
    let json_ct = "Content-Type: application/json";
    runner(file!())
        .run(&(0..seeds.len() + 1, json_edits(3), prop::collection::vec(any::<u8>(), 0..256)), |(i, edits, raw)| {
            let (method, path, body) = match seeds.get(i) {
                Some((m, p, seed)) => {
                    let mut doc = seed.clone();
                    apply(&mut doc, &edits, 5);
                    // Keep generations short: a mutated request is not a benchmark.
                    if let Some(t) = doc.get_mut("max_tokens").filter(|t| t.as_u64().is_some_and(|t| t > 8)) {
                        *t = json!(8);
                    }
                    (*m, *p, serde_json::to_vec(&doc).unwrap())
                }
                // Raw bytes: not JSON at all.
                None => ("POST", "/v1/chat/completions", raw),
            };
            let reply = rt.block_on(send(addr, method, path, &[json_ct], &body));
            let text = reply.text();
            prop_assert!(
                reply.status < 500,
                "{method} {path} {} -> {}: {text}",
                String::from_utf8_lossy(&body),
                reply.status
            );
            if !text.starts_with("data:") && !body.is_empty() {
                prop_assert!(serde_json::from_str::<Value>(&text).is_ok(), "{} not JSON: {text}", reply.status);
            }
            Ok(())
        })
        .unwrap();
    // Still answering, and nothing left running.
    let health = rt.block_on(send(addr, "GET", "/api/health", &[], b""));
    assert_eq!(health.status, 200, "{}", health.text());
    rt.block_on(server.shutdown()).unwrap();
}
