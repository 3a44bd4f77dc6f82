//! A model split over several processes (issue 23, `model::parallel`) on loopback (MLX's ring backend):
//! tandem-tiny split by heads over 2 processes, and by layers (a pipeline) over 2 and 4, gives the tokens
//! one process gives, plain and with MTP (drafts, verify and rollback identical on every rank); a split
//! that does not divide the model is refused naming the config field; a rank reads only its share of the
//! files (a NaN planted in another rank's share does not reach it). The ranks are copies of this test
//! binary (`rank_main`, selected by `TANDEM_TP_TEST`).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, SamplingParams};
use tandem::model::parallel::{Parallel, Split};
use tandem::model::{self, LoadOptions};

use crate::common::*;

fn opts(mtp: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false, ..Default::default() },
        ..Default::default()
    }
}

fn prompt() -> Vec<u32> {
    let tok = tandem::chat::Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    tok.encode("Call me Ishmael. Some years ago, never mind how long precisely", false).unwrap()
}

/// A tensor split loads in f32, so that the ranks' partial sums added in another order than one
/// matmul's stay far below what could change a greedy pick. A pipeline hands whole hidden states on
/// exactly, so it runs in the checkpoint's own dtype (bf16) and still must give one process's tokens.
fn load(dir: &Path, split: Split, tp: Option<Parallel>, probe: bool) -> Result<model::Qwen35, model::LoadError> {
    let dtype = (split == Split::Tensor).then_some(mlx::Dtype::F32);
    model::load(dir, &LoadOptions { dtype, parallel: tp, probe, ..Default::default() })
}

/// The split a rank uses: `TANDEM_TP_SPLIT`, else tensor.
fn split() -> Split {
    std::env::var("TANDEM_TP_SPLIT").ok().and_then(|s| s.parse().ok()).unwrap_or_default()
}

/// The model a rank loads: `TANDEM_TP_MODEL`, else tandem-tiny.
fn model_dir() -> std::path::PathBuf {
    std::env::var_os("TANDEM_TP_MODEL").map_or_else(tiny_model_dir, Into::into)
}

/// Greedy tokens (and MTP acceptance) of `m`, plain and with MTP, as the ranks print them.
fn answers(m: &model::Qwen35) -> Vec<String> {
    [false, true]
        .into_iter()
        .map(|mtp| {
            let out = generate(m, &prompt(), &opts(mtp), &mut |_| Control::Continue).unwrap();
            let accepted = out.stats.spec.as_ref().map_or(0, |s| s.accepted);
            format!("mtp={mtp} {:?} accepted={accepted}", out.tokens)
        })
        .collect()
}

/// What one rank does (in a child process): prints `RESULT` lines.
#[test]
fn rank_main() {
    let Ok(what) = std::env::var("TANDEM_TP_TEST") else { return };
    let group = Arc::new(mlx::distributed::init("ring").expect("the ring backend starts"));
    let tp = Parallel::new(group, split());
    // `load` alone: no forward pass, so no collective, and a rank that fails leaves the others be.
    match (what.as_str(), load(&model_dir(), split(), Some(tp), what == "generate")) {
        ("generate", Ok(m)) => {
            println!("HEAD {}", m.drafts_here());
            for line in answers(&m) {
                println!("RESULT {line}");
            }
        }
        ("load", Ok(_)) => println!("RESULT loaded"),
        (_, Err(e)) => println!("RESULT load-error {e}"),
        (other, Ok(_)) => panic!("unknown test {other}"),
    }
}

fn spawn_ranks(dir: &Path, n: usize, model: &Path, split: Split, what: &str) -> Vec<std::process::Child> {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<Vec<String>> =
        held.iter().map(|l| vec![format!("127.0.0.1:{}", l.local_addr().unwrap().port())]).collect();
    drop(held);
    let hostfile = dir.join("hosts.json");
    std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
    (0..n)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args(["parallel::rank_main", "--exact", "--nocapture", "--test-threads", "1"])
                .env("TANDEM_TP_TEST", what)
                .env("TANDEM_TP_SPLIT", split.to_string())
                .env("TANDEM_TP_MODEL", model)
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", r.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn wait_all(mut children: Vec<std::process::Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    while !children.iter_mut().all(|c| c.try_wait().unwrap().is_some()) {
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("the ranks did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

fn results(out: &Output) -> Vec<String> {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().filter_map(|l| l.split_once("RESULT ")).map(|(_, r)| r.to_owned()).collect()
}

/// `n` ranks give `model`'s tokens as one process does, split as `split` says.
fn split_matches_one(model: &Path, split: Split, n: usize) {
    let m = load(model, split, None, true).unwrap();
    let expected = answers(&m);
    eprintln!("one process: {expected:?}");
    assert!(!expected[1].ends_with("accepted=0"), "MTP drafted nothing: {expected:?}");
    drop(m);
    let dir = tempdir();
    let outs = wait_all(spawn_ranks(dir.path(), n, model, split, "generate"), Duration::from_secs(240));
    for (r, out) in outs.iter().enumerate() {
        assert_eq!(results(out), expected, "rank {r}: {}", String::from_utf8_lossy(&out.stderr));
        // Only rank 0 keeps the MTP head; the others verify its drafts.
        let head = String::from_utf8_lossy(&out.stdout).lines().any(|l| l.ends_with("HEAD true"));
        assert_eq!(head, r == 0, "rank {r} holds the MTP head: {head}");
    }
}

#[test]
fn two_ranks_generate_what_one_process_does() {
    split_matches_one(&tiny_model_dir(), Split::Tensor, 2);
}

/// tandem-tiny's 8 layers as 2 stages of 4, in bf16.
#[test]
fn a_pipeline_of_two_generates_what_one_process_does() {
    split_matches_one(&tiny_model_dir(), Split::Pipeline, 2);
}

/// 4 processes, 2 layers each: stages in the middle take their input from a rank and hand it on.
#[test]
fn a_pipeline_of_four_generates_what_one_process_does() {
    split_matches_one(&tiny_model_dir(), Split::Pipeline, 4);
}

/// A 4-bit conversion: its row-parallel layers are cut on quantization-group boundaries.
#[test]
fn two_ranks_of_a_4_bit_model_generate_what_one_process_does() {
    let dir = tempdir();
    let q4 = dir.path().join("tiny-4bit");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["convert", &tiny_model_dir().display().to_string(), "--out", &q4.display().to_string(), "--bits", "4"])
        .env("TANDEM_CONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    split_matches_one(&q4, Split::Tensor, 2);
}

/// Every one of `n` ranks (split as `split`, running `what`) fails its load with an error containing
/// `needle`.
fn every_rank_refuses(n: usize, split: Split, what: &str, needle: &str) {
    let dir = tempdir();
    let outs = wait_all(spawn_ranks(dir.path(), n, &tiny_model_dir(), split, what), Duration::from_secs(120));
    for (r, out) in outs.iter().enumerate() {
        let got = results(out);
        assert!(
            got.first().is_some_and(|l| l.starts_with("load-error") && l.contains(needle)),
            "rank {r}: {got:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_split_that_does_not_divide_the_heads_is_refused_naming_the_field() {
    // tandem-tiny's linear attention has 2 key heads (its first layer): 4 ranks cannot share them.
    every_rank_refuses(4, Split::Tensor, "generate", "linear_num_key_heads = 2 cannot be split evenly over 4");
}

/// The ranks' load outcomes when a NaN sits at element `at` of tensor `key` of a copy of tandem-tiny.
fn loads_with_nan_at(key: &str, at: usize, split: Split, n: usize) -> Vec<Vec<String>> {
    let dir = tempdir();
    let model = dir.path().join("tiny");
    copy_dir(&tiny_model_dir(), &model);
    poison(&model.join("model.safetensors"), &format!("model.language_model.{key}"), at, f32::NAN);
    let outs = wait_all(spawn_ranks(dir.path(), n, &model, split, "load"), Duration::from_secs(120));
    outs.iter().map(results).collect()
}

fn assert_loaded_and_refused(got: &[Vec<String>], key: &str) {
    assert_eq!(got[0], ["loaded"], "rank 0 never reads the poisoned share");
    assert!(
        got[1].first().is_some_and(|l| l.starts_with("load-error") && l.contains(key) && l.contains("NaN")),
        "rank 1 reads it and names it: {got:?}"
    );
}

/// A pipeline rank reads only its own layers: a NaN in layer 6 (rank 1's, of 2) stops rank 1 only.
#[test]
fn a_pipeline_rank_reads_only_its_own_layers() {
    let key = "layers.6.mlp.down_proj.weight";
    assert_loaded_and_refused(&loads_with_nan_at(key, 77, Split::Pipeline, 2), key);
}

/// A tensor-parallel rank reads only its rows and columns: a NaN in row 300 of gate_proj (384 rows,
/// rank 1 keeps 192..384) or in column 300 of down_proj (rank 1's input columns) stops rank 1 only.
#[test]
fn a_tensor_parallel_rank_reads_only_its_rows_and_columns() {
    let key = "layers.0.mlp.gate_proj.weight";
    assert_loaded_and_refused(&loads_with_nan_at(key, 300 * 256 + 5, Split::Tensor, 2), key);
    let key = "layers.2.mlp.down_proj.weight";
    assert_loaded_and_refused(&loads_with_nan_at(key, 10 * 384 + 300, Split::Tensor, 2), key);
}

/// Every pipeline rank needs a layer: 9 ranks over tandem-tiny's 8 are refused (the stages' split
/// itself is checked by the pipeline of 4 above).
#[test]
fn more_pipeline_ranks_than_layers_are_refused_naming_the_field() {
    every_rank_refuses(
        9,
        Split::Pipeline,
        "load",
        "num_hidden_layers = 8 cannot give each of 9 pipeline ranks a layer",
    );
}
