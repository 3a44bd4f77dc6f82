//! A model load can never hold the service: one still loading is cancelled by its unload, and one
//! past its deadline is reported and abandoned while the engine keeps loading others; a worker that
//! panics is reported and contained.

use std::time::{Duration, Instant};

use tandem::engine::{Engine, EngineConfig};
use tandem::registry::Registry;

use crate::common::*;

fn engine(dir: &std::path::Path, config: EngineConfig) -> Engine {
    let toml = dir.join("models.toml");
    std::fs::write(
        &toml,
        format!(
            "models_dir = \"models\"\n[[model]]\nname = \"tiny\"\npath = {:?}\n",
            tiny_model_dir().to_str().unwrap()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("models")).unwrap();
    Engine::new(Registry::load(&toml).unwrap(), config)
}

fn state(e: &Engine) -> String {
    let m = e.models().into_iter().find(|m| m.name == "tiny").unwrap();
    serde_json::to_value(m.state).unwrap().as_str().unwrap_or_default().to_owned()
}

#[test]
fn unloading_a_model_while_it_loads_cancels_the_load() {
    let tmp = tempdir();
    let e = engine(tmp.path(), EngineConfig::default());
    let loader = {
        let e = e.clone();
        std::thread::spawn(move || e.load_blocking("tiny"))
    };
    let t0 = Instant::now();
    while state(&e) != "loading" {
        assert!(t0.elapsed() < Duration::from_secs(60), "never seen loading");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(e.unload_blocking("tiny"), "an unload of a loading model answers that it acted");
    let err = loader.join().unwrap().expect_err("the load was cancelled");
    assert!(err.message().contains("cancelled"), "{}", err.message());
    assert!(e.loaded().is_empty());
    assert_eq!(state(&e), "unloaded");
    // Nothing is left holding the engine: the same model loads again.
    e.load_blocking("tiny").unwrap();
    assert_eq!(e.loaded(), ["tiny"]);
}

#[test]
fn a_load_past_its_deadline_is_reported_and_the_engine_goes_on() {
    let tmp = tempdir();
    let e = engine(tmp.path(), EngineConfig { load_timeout: Duration::from_millis(1), ..EngineConfig::default() });
    let err = e.load_blocking("tiny").expect_err("1 ms is too short for any load");
    assert!(err.message().contains("did not finish loading within"), "{}", err.message());
    assert!(e.loaded().is_empty() && state(&e) == "unloaded");
    // The abandoned load stops at its next check; a new engine with a sane deadline loads the model.
    let e2 = engine(tmp.path(), EngineConfig::default());
    e2.load_blocking("tiny").unwrap();
    assert_eq!(e2.loaded(), ["tiny"]);
}

/// A panic inside a model's worker, while loading or while generating, is caught and reported to the
/// caller by name; the worker, the other model and the engine go on (tandem::engine::faults injects it).
#[test]
fn a_panicking_worker_is_reported_and_contained() {
    use tandem::engine::{faults, Input, Request};
    let tmp = tempdir();
    let toml = tmp.path().join("models.toml");
    let tiny = tiny_model_dir();
    std::fs::write(
        &toml,
        format!("models_dir = \"models\"\n[[model]]\nname = \"a\"\npath = {tiny:?}\n[[model]]\nname = \"b\"\npath = {tiny:?}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.path().join("models")).unwrap();
    let e = Engine::new(Registry::load(&toml).unwrap(), EngineConfig::default());
    let chat = |model: &str| {
        let mut r = Request::new(model, Input::Raw("Once upon a time".into()));
        r.max_tokens = Some(4);
        r.ignore_eos = true;
        e.chat_blocking(r).and_then(|g| g.blocking_collect())
    };

    faults::panic_next_load("a");
    let err = e.load_blocking("a").expect_err("the load panicked");
    assert!(
        err.message().contains("the loader panicked") && err.message().contains("fault injected"),
        "{}",
        err.message()
    );
    assert!(e.loaded().is_empty());
    e.load_blocking("b").unwrap();
    e.load_blocking("a").unwrap();

    faults::panic_next_generation("a");
    let err = chat("a").expect_err("the generation panicked");
    assert!(
        err.message().contains("the generation panicked") && err.message().contains("fault injected"),
        "{}",
        err.message()
    );
    // The same worker answers the next request, the other model never noticed.
    assert_eq!(chat("a").unwrap().tokens.len(), 4);
    assert_eq!(chat("b").unwrap().tokens.len(), 4);
    let mut loaded = e.loaded();
    loaded.sort();
    assert_eq!(loaded, ["a", "b"]);
}
