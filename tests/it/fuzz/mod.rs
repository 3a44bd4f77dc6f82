//! The hostile-input harness: property tests over generated inputs for everything a downloaded model
//! folder or a client controls (safetensors headers, index files, config.json, tokenizer.json and chat
//! templates, images, HTTP bodies). Each case must end in `Ok` or a clear `Err` within a deadline:
//! never a panic, an abort, a hang, or a read outside the model folder.
//!
//! Inputs start from the seed corpus (`tests/fuzz/corpus/`: real files of the bundled and fixture
//! models, and the hostile inputs a robustness campaign found) and are mutated by proptest, which
//! shrinks a failing case to a minimal one and records its seed in `proptest-regressions/` beside
//! this file (commit those: they run first from then on).
//!
//! `make test` runs a short pass (`FUZZ_CASES`, default 24 per target); the long run is documented in
//! docs/ARCHITECTURE.md §6: `FUZZ_CASES=5000 cargo test --test it fuzz:: -- --test-threads 1`.

mod bodies;
mod folders;
mod inputs;

use std::path::PathBuf;

use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};

use crate::common;
pub use crate::common::{copy_dir, within};

/// Cases per target.
pub fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24)
}

/// A runner with [`cases`] cases; failures are recorded beside `source` (the target's `file!()`).
pub fn runner(source: &'static str) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        source_file: Some(source),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        // Each case touches files and MLX: shrinking a failure is worth a few hundred tries only.
        max_shrink_iters: 256,
        ..Config::default()
    })
}

/// The seed corpus folder of a target.
pub fn corpus(target: &str) -> PathBuf {
    common::repo().join("tests/fuzz/corpus").join(target)
}

/// The text of `/etc/passwd`'s first line, which no error may echo (an index naming it must be refused
/// before anything is read).
pub fn passwd_marker() -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().next().map(|l| l.chars().take(12).collect())
}
