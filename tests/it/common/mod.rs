//! Helpers shared by integration tests: the reference Python venv, temporary folders, fixtures.
#![allow(dead_code)]

pub mod http;

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test venv's Python (mlx, mlx-lm, openai), installed by `make setup`.
pub fn python() -> PathBuf {
    let p = std::env::var_os("TANDEM_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(p.exists(), "reference Python not found at {} (run `make setup`)", p.display());
    p
}

/// Runs `tests/reference/mlx_lm_ref.py` with `args`, failing the test with its stderr on error.
pub fn mlx_lm_ref(args: &[&str]) {
    let out = Command::new(python())
        .arg(repo().join("tests/reference/mlx_lm_ref.py"))
        .args(args)
        .output()
        .expect("run reference python");
    assert!(out.status.success(), "mlx_lm_ref {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("tandem-test-").tempdir().expect("tempdir")
}

/// Reads one tensor of a safetensors file as f32 with its shape.
pub fn read_f32(path: &Path, name: &str) -> (Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap_or_else(|_| panic!("{}: no tensor {name}", path.display()));
    let data = match t.dtype() {
        safetensors::Dtype::F32 => {
            t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        }
        d => panic!("{name}: expected F32, got {d:?}"),
    };
    (data, t.shape().to_vec())
}

/// Relative L2 error ||a - b|| / ||b||.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt() as f32
}

/// Makes a random tiny qwen3_5 checkpoint in raw HF layout (see mlx_lm_ref.py).
pub fn random_hf_model(dir: &Path, extra: &[&str]) {
    let mut args = vec!["make-hf", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    mlx_lm_ref(&args);
}

/// Reads an integer tensor (I64 or I32) as token ids.
pub fn read_ids(path: &Path, name: &str) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap_or_else(|_| panic!("{}: no tensor {name}", path.display()));
    match t.dtype() {
        safetensors::Dtype::I64 => {
            t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect()
        }
        safetensors::Dtype::I32 => {
            t.data().chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32).collect()
        }
        d => panic!("{name}: expected integer ids, got {d:?}"),
    }
}

/// Runs `f` on its own thread and waits at most `secs`: a hang fails the case (naming `what`)
/// instead of hanging the suite; a panic fails it with the panic's message.
pub fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("within".into())
        .spawn(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(out);
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(panic)) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("{what}: panicked: {msg}"))
        }
        Err(_) => Err(format!("{what}: still running after {secs} s (a hang)")),
    }
}

/// Copies the files (not the subfolders) of `src` into `dst`.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

pub fn tiny_model_dir() -> PathBuf {
    repo().join("assets/models/tandem-tiny")
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

/// Largest absolute difference.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Greedy generation of `n` tokens, with MTP when `mtp` is given; the tokens and the statistics.
pub fn greedy(
    m: &tandem::model::Qwen35,
    prompt: &[u32],
    n: usize,
    mtp: Option<tandem::generate::MtpOptions>,
) -> (Vec<u32>, tandem::generate::Stats) {
    use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, SamplingParams};
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        mtp: mtp.unwrap_or(MtpOptions { enabled: false, ..Default::default() }),
        ..Default::default()
    };
    let out = generate(m, prompt, &opts, &mut |_| Control::Continue).expect("greedy generation");
    (out.tokens, out.stats)
}

/// Writes `value` over element `at` of tensor `key` in the safetensors `file` (bf16, f16 or f32).
pub fn poison(file: &Path, key: &str, at: usize, value: f32) {
    let mut bytes = std::fs::read(file).unwrap();
    let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let info = meta.info(key).unwrap_or_else(|| panic!("{}: no tensor {key}", file.display()));
    let enc = match info.dtype {
        safetensors::Dtype::BF16 => ((value.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
        safetensors::Dtype::F16 => (if value.is_nan() { 0x7e00u16 } else { 0x7c00 }).to_le_bytes().to_vec(),
        safetensors::Dtype::F32 => value.to_le_bytes().to_vec(),
        d => panic!("{key}: {d:?} is not a float"),
    };
    let start = 8 + n + info.data_offsets.0 + at * enc.len();
    bytes[start..start + enc.len()].copy_from_slice(&enc);
    std::fs::remove_file(file).unwrap(); // a link to the bundled model is replaced, never written through
    std::fs::write(file, bytes).unwrap();
}

/// Compiles a CPU emulation of a CUDA kernel (`tests/it/emulate/<name>.cpp`, with `defines` naming the kernel
/// files under `kernels/cuda/` it includes) with the machine's C++ compiler (`CXX`, or `c++`) and runs it;
/// returns its output, or None (printing why) when there is no compiler. Panics when it does not compile
/// or reports a failure.
pub fn run_emulation(name: &str, defines: &[(&str, &str)]) -> Option<String> {
    let root = repo();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if std::process::Command::new(&cxx).arg("--version").output().is_err() {
        println!("{name} emulation: SKIPPED: no C++ compiler ({cxx}) here");
        return None;
    }
    let dir = tempdir();
    let exe = dir.path().join(name);
    let mut cmd = std::process::Command::new(&cxx);
    cmd.args(["-std=c++17", "-O1", "-pthread", "-w"]);
    for (macro_name, file) in defines {
        cmd.arg(format!("-D{macro_name}=\"{}\"", root.join("kernels/cuda").join(file).display()));
    }
    let built = cmd.arg(root.join(format!("tests/it/emulate/{name}.cpp"))).arg("-o").arg(&exe).output().unwrap();
    assert!(built.status.success(), "compiling the {name} emulation: {}", String::from_utf8_lossy(&built.stderr));
    let run = std::process::Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    println!("{out}");
    assert!(run.status.success(), "the emulated {name} kernel failed: {out}");
    Some(out)
}

/// `n` tokens of the probe text (assets/probe/mtp-probe.txt, tandem-tiny's tokenizer) from token `offset` on,
/// the text repeated where it runs out: a prompt whose greedy continuation varies, so that a wrong token
/// shows (a numeric prompt's continuation is one token repeated).
pub fn probe_tokens(n: usize, offset: usize) -> Vec<u32> {
    let tok = tandem::chat::Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let words = std::fs::read_to_string(repo().join("assets/probe/mtp-probe.txt")).unwrap();
    tok.encode(&words, false).unwrap().into_iter().cycle().skip(offset).take(n).collect()
}

/// Asserts that `tokens` vary (more than a quarter of them distinct): only then does a comparison of two
/// decodes show a wrong token.
pub fn assert_varies(tokens: &[u32], what: &str) {
    let distinct = tokens.iter().collect::<std::collections::HashSet<_>>().len();
    assert!(distinct > tokens.len() / 4, "{what}: a continuation that varies tells a wrong token: {tokens:?}");
}

/// tandem-tiny loaded in `dtype`, and its greedy MTP output at depths 1-3 against its plain greedy output
/// (48 tokens after 24 of the probe text, a continuation that varies): equal when `check` (each depth's
/// cycles and acceptance are printed either way). Returns the model for further checks.
pub fn tiny_mtp_matches_plain(dtype: mlx::Dtype, check: bool) -> tandem::model::Qwen35 {
    use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, SamplingParams};
    use tandem::model::{self, LoadOptions};
    let m = model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(dtype), probe: false, ..Default::default() })
        .unwrap();
    let prompt = probe_tokens(24, 0);
    let run = |mtp: MtpOptions| {
        let opts = GenerateOptions {
            max_tokens: 48,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            mtp,
            ..Default::default()
        };
        generate(&m, &prompt, &opts, &mut |_| Control::Continue).unwrap()
    };
    let plain = run(MtpOptions { enabled: false, ..Default::default() }).tokens;
    assert_varies(&plain, &format!("{dtype:?}"));
    for depth in 1..=3 {
        let out = run(MtpOptions { enabled: true, depth, adaptive: false, exact_verify: false, ..Default::default() });
        let s = out.stats.spec.expect("spec stats");
        println!("tandem-tiny {dtype:?} depth {depth}: {} cycles, acceptance {:.2}", s.cycles, s.acceptance);
        if check {
            assert_eq!(out.tokens, plain, "{dtype:?} depth {depth}: MTP output differs from plain greedy");
        }
    }
    m
}
