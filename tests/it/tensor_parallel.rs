//! Tensor parallelism (issue 23, `model::parallel`): tandem-tiny split over 2 processes on loopback
//! (MLX's ring backend) gives the tokens one process gives, plain and with MTP (drafts, verify and
//! rollback identical on every rank), and a split that does not divide the model is refused naming the
//! config field. The ranks are copies of this test binary (`rank_main`, selected by `TANDEM_TP_TEST`).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, SamplingParams};
use tandem::model::parallel::TensorParallel;
use tandem::model::{self, LoadOptions};

use crate::common::*;

fn opts(mtp: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false },
        ..Default::default()
    }
}

fn prompt() -> Vec<u32> {
    let tok = tandem::chat::Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    tok.encode("Call me Ishmael. Some years ago, never mind how long precisely", false).unwrap()
}

/// In f32, so that the ranks' partial sums added in another order than one matmul's stay far below
/// what could change a greedy pick.
fn load(dir: &Path, tp: Option<TensorParallel>) -> Result<model::Qwen35, model::LoadError> {
    model::load(dir, &LoadOptions { dtype: Some(mlx::Dtype::F32), tensor_parallel: tp, ..Default::default() })
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
    let tp = TensorParallel::new(group);
    match (what.as_str(), load(&model_dir(), Some(tp))) {
        ("generate", Ok(m)) => {
            for line in answers(&m) {
                println!("RESULT {line}");
            }
        }
        (_, Err(e)) => println!("RESULT load-error {e}"),
        (other, Ok(_)) => panic!("unknown test {other}"),
    }
}

fn spawn_ranks(dir: &Path, n: usize, model: &Path) -> Vec<std::process::Child> {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<Vec<String>> =
        held.iter().map(|l| vec![format!("127.0.0.1:{}", l.local_addr().unwrap().port())]).collect();
    drop(held);
    let hostfile = dir.join("hosts.json");
    std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
    (0..n)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args(["tensor_parallel::rank_main", "--exact", "--nocapture", "--test-threads", "1"])
                .env("TANDEM_TP_TEST", "generate")
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

/// 2 ranks give `model`'s tokens as one process does.
fn split_matches_one(model: &Path) {
    let m = load(model, None).unwrap();
    let expected = answers(&m);
    eprintln!("one process: {expected:?}");
    assert!(!expected[1].ends_with("accepted=0"), "MTP drafted nothing: {expected:?}");
    drop(m);
    let dir = tempdir();
    let outs = wait_all(spawn_ranks(dir.path(), 2, model), Duration::from_secs(180));
    for (r, out) in outs.iter().enumerate() {
        assert_eq!(results(out), expected, "rank {r}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn two_ranks_generate_what_one_process_does() {
    split_matches_one(&tiny_model_dir());
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
    split_matches_one(&q4);
}

#[test]
fn a_split_that_does_not_divide_the_heads_is_refused_naming_the_field() {
    let dir = tempdir();
    // tandem-tiny's linear attention has 2 key heads (its first layer): 4 ranks cannot share them.
    let outs = wait_all(spawn_ranks(dir.path(), 4, &tiny_model_dir()), Duration::from_secs(120));
    for (r, out) in outs.iter().enumerate() {
        let got = results(out);
        assert!(
            got.first()
                .is_some_and(|l| l.starts_with("load-error")
                    && l.contains("linear_num_key_heads = 2 cannot be split evenly over 4")),
            "rank {r}: {got:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
