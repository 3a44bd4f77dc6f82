//! Model folders built to hang, exhaust or fool the engine (issue 17), made from the bundled model:
//! FIFOs and devices where files should be, oversized files, index entries naming files outside the
//! folder, NaN and infinite weights, a tokenizer that panics, client numbers near 2^64, and what a
//! killed or size-limited conversion leaves behind. Each must end in an error naming the file,
//! tensor or value, promptly: calls that could hang run under a deadline, so a regression fails
//! instead of blocking the test run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use tandem::chat::Tokenizer;
use tandem::engine::{catalog, Engine, EngineConfig};
use tandem::model::{self, LoadOptions};
use tandem::quant::{self, Control, ConvertOptions};
use tandem::registry::Registry;

/// [`crate::common::within`], a hang or a panic failing the test (a hung thread is left blocked: the
/// test process ends anyway).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    crate::common::within(secs, what, f).unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(dir: &Path) -> String {
    let dir = dir.to_path_buf();
    within(60, "model::load", move || match model::load(&dir, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e.to_string(),
    })
}

/// The bundled model's small files, and its weights as a symlink (nothing here writes them).
fn tiny_copy(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(tiny_model_dir()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap();
        if name == "model.safetensors" {
            std::os::unix::fs::symlink(&p, dst.join(name)).unwrap();
        } else {
            std::fs::copy(&p, dst.join(name)).unwrap();
        }
    }
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let st = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

fn replace_with_link(path: &Path, target: &str) {
    std::fs::remove_file(path).unwrap();
    std::os::unix::fs::symlink(target, path).unwrap();
}

#[test]
fn a_fifo_named_model_safetensors_is_refused_not_opened() {
    let tmp = tempdir();
    let dir = tmp.path().join("fifo");
    tiny_copy(&dir);
    mkfifo(&dir.join("model.safetensors"));
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors") && e.contains("FIFO") && e.contains("not a regular file"), "{e}");
    let d = dir.clone();
    let e = within(30, "quant::inspect", move || quant::inspect(&d).map(|_| ()).unwrap_err().to_string());
    assert!(e.contains("model.safetensors") && e.contains("FIFO"), "{e}");
    let d = dir.clone();
    let info = within(30, "catalog::inspect_folder", move || catalog::inspect_folder(&d));
    assert!(info.error.as_deref().is_some_and(|e| e.contains("FIFO")), "{info:?}");

    // The same as the sidecar, and as the index.
    let dir = tmp.path().join("fifo-sidecar");
    tiny_copy(&dir);
    mkfifo(&dir.join("mtp.safetensors"));
    let e = load_err(&dir);
    assert!(e.contains("mtp.safetensors") && e.contains("FIFO"), "{e}");
    let dir = tmp.path().join("fifo-index");
    tiny_copy(&dir);
    mkfifo(&dir.join("model.safetensors.index.json"));
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors.index.json") && e.contains("FIFO"), "{e}");
}

#[test]
fn config_and_tokenizer_files_linked_to_dev_zero_are_refused() {
    let tmp = tempdir();
    let dir = tmp.path().join("zero-config");
    tiny_copy(&dir);
    replace_with_link(&dir.join("config.json"), "/dev/zero");
    let e = load_err(&dir);
    assert!(e.contains("config.json") && e.contains("character device") && e.contains("/dev/zero"), "{e}");

    for name in ["tokenizer_config.json", "tokenizer.json", "generation_config.json"] {
        let dir = tmp.path().join(format!("zero-{name}"));
        tiny_copy(&dir);
        replace_with_link(&dir.join(name), "/dev/zero");
        let d = dir.clone();
        let e = within(30, name, move || Tokenizer::from_dir(&d).map(|_| ()).unwrap_err().to_string());
        assert!(e.contains(name), "{name}: {e}");
    }
    let dir = tmp.path().join("fifo-template");
    tiny_copy(&dir);
    mkfifo(&dir.join("chat_template.jinja"));
    let d = dir.clone();
    let e = within(30, "chat_template.jinja", move || Tokenizer::from_dir(&d).map(|_| ()).unwrap_err().to_string());
    assert!(e.contains("chat_template.jinja") && e.contains("FIFO"), "{e}");
}

#[test]
fn an_oversized_config_json_is_refused_naming_its_size() {
    let tmp = tempdir();
    let dir = tmp.path().join("big-config");
    tiny_copy(&dir);
    let size = 17u64 << 20;
    std::fs::OpenOptions::new().write(true).open(dir.join("config.json")).unwrap().set_len(size).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("config.json") && e.contains(&format!("{size} bytes")) && e.contains("16 MiB"), "{e}");
}

#[test]
fn absurd_config_sizes_are_refused_before_anything_is_built() {
    let tmp = tempdir();
    let dir = tmp.path().join("layers");
    tiny_copy(&dir);
    let path = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["text_config"]["num_hidden_layers"] = json!(i32::MAX);
    c["text_config"].as_object_mut().unwrap().remove("layer_types");
    std::fs::write(&path, c.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("config.json") && e.contains("`num_hidden_layers` is 2147483647"), "{e}");
    let info = catalog::inspect_folder(&dir);
    assert!(info.mtp_reason.is_some_and(|r| r.contains("num_hidden_layers")));
}

/// A sharded copy of the bundled model whose index maps `model.norm`'s tensor to `shard`.
fn escaping_index(dir: &Path, shard: &str) {
    tiny_copy(dir);
    let bytes = std::fs::read(tiny_model_dir().join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut map = serde_json::Map::new();
    for name in meta.tensors().keys() {
        map.insert(name.clone(), json!("model.safetensors"));
    }
    map.insert("model.language_model.norm.weight".into(), json!(shard));
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn index_entries_outside_the_folder_are_refused_by_load_inspect_and_convert() {
    let tmp = tempdir();
    // A tempting target beside the folder: a real shard, which must not be read either.
    std::os::unix::fs::symlink(tiny_model_dir().join("model.safetensors"), tmp.path().join("x.safetensors")).unwrap();
    for shard in ["/etc/passwd", "../x.safetensors"] {
        let dir = tmp.path().join(format!("index-{}", shard.len()));
        escaping_index(&dir, shard);
        let out = tmp.path().join(format!("out-{}", shard.len()));
        let errors = [
            load_err(&dir),
            quant::inspect(&dir).map(|_| ()).unwrap_err().to_string(),
            quant::convert(&dir, &out, &ConvertOptions::default(), &mut |_| Control::Continue)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
        ];
        for e in errors {
            assert!(
                e.contains("model.safetensors.index.json")
                    && e.contains(shard)
                    && e.contains("not a file in the model folder"),
                "{shard}: {e}"
            );
            assert!(!e.contains("root:"), "the foreign file's bytes are never echoed: {e}");
        }
        assert!(!out.exists());
    }
    // A shard that is a link to a foreign non-model file fails as a bad file, without its bytes.
    let dir = tmp.path().join("linked-passwd");
    tiny_copy(&dir);
    replace_with_link(&dir.join("model.safetensors"), "/etc/passwd");
    for e in [load_err(&dir), quant::inspect(&dir).map(|_| ()).unwrap_err().to_string()] {
        assert!(e.contains("model.safetensors") && !e.contains("root:"), "{e}");
    }
}

#[test]
fn nan_and_infinite_weights_are_reported_at_load_with_the_tensor() {
    let tmp = tempdir();
    let dir = tmp.path().join("nan");
    tiny_copy(&dir);
    let key = "model.language_model.layers.5.mlp.down_proj.weight";
    poison(&dir.join("model.safetensors"), key, 1234, f32::NAN);
    let e = load_err(&dir);
    assert!(e.contains(&format!("tensor `{key}`")) && e.contains("NaN") && e.contains("model.safetensors"), "{e}");

    let dir = tmp.path().join("inf");
    tiny_copy(&dir);
    let key = "model.language_model.norm.weight";
    poison(&dir.join("model.safetensors"), key, 3, f32::NEG_INFINITY);
    let e = load_err(&dir);
    assert!(e.contains(&format!("tensor `{key}`")) && e.contains("infinity"), "{e}");

    // A quantization scale of a converted model.
    let q = tmp.path().join("q4");
    let opts = ConvertOptions { bits: Some(4), ..Default::default() };
    quant::convert(&tiny_model_dir(), &q, &opts, &mut |_| Control::Continue).unwrap();
    let key = "language_model.model.layers.2.mlp.up_proj.scales";
    let shard: PathBuf = std::fs::read_dir(&q)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "safetensors") && {
                let b = std::fs::read(p).unwrap();
                safetensors::SafeTensors::read_metadata(&b).unwrap().1.info(key).is_some()
            }
        })
        .unwrap();
    poison(&shard, key, 0, f32::NAN);
    let e = load_err(&q);
    assert!(e.contains(&format!("tensor `{key}`")) && e.contains("NaN"), "{e}");
}

fn tandem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
}

/// Runs a command under a deadline, killing it past that.
fn run_within(mut cmd: Command, secs: u64) -> std::process::Output {
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{cmd:?}: no answer within {secs} s");
        }
    }
}

#[test]
fn a_post_processor_naming_an_unknown_special_token_is_an_error_not_a_panic() {
    let tmp = tempdir();
    let dir = tmp.path().join("tok");
    tiny_copy(&dir);
    let path = dir.join("tokenizer.json");
    let mut t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // `<bos>` is in the template but not among its special tokens: tokenizers indexes a map with it.
    t["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {}
    });
    std::fs::write(&path, t.to_string()).unwrap();
    let mut cmd = tandem();
    cmd.args(["chat", "--model", dir.to_str().unwrap(), "--raw", "--prompt", "hello", "--max-tokens", "2"]);
    let out = run_within(cmd, 120);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "an error, not a panic (101): {err}");
    // The panic hook still prints the caught panic; what matters is the error and the exit status.
    assert!(err.contains("error: ") && err.contains("tokenizer.json: cannot load the tokenizer"), "{err}");
}

#[test]
fn max_tokens_near_2_pow_64_from_the_cli_cannot_wrap_the_context_check() {
    let mut cmd = tandem();
    cmd.args(["chat", "--model", tiny_model_dir().to_str().unwrap(), "--prompt", "hi"]);
    cmd.args(["--max-tokens", "18446744073709551615", "--temp", "0"]);
    let out = run_within(cmd, 120);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("18446744073709551615") && err.contains("4096"), "{err}");
    assert!(out.stdout.iter().all(|b| b.is_ascii_whitespace()), "nothing generated");
}

/// A process id that is not running (a child that has exited and been reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn leftovers_of_killed_conversions_are_never_listed_and_swept_at_the_next_start() {
    let tmp = tempdir();
    let models = tmp.path().join("models");
    let dead = dead_pid();
    let (partial, old) = (models.join(format!(".m.partial-{dead}-0")), models.join(format!(".k.old-{dead}-1")));
    let mine = models.join(format!(".n.partial-{}-0", std::process::id()));
    for d in [&partial, &old, &mine] {
        tiny_copy(d);
    }
    let toml = tmp.path().join("models.toml");
    std::fs::write(&toml, "models_dir = \"models\"\n").unwrap();
    let registry = Registry::load(&toml).unwrap();
    let names: Vec<String> = registry.list().into_iter().map(|m| m.name).collect();
    assert!(names.is_empty(), "dot-folders are not models: {names:?}");

    // The next start: the dead partial is removed, the destination a kill left moved aside is put
    // back (and listed), this process's own folder is kept.
    let _engine = Engine::new(registry, EngineConfig::default());
    assert!(!partial.exists() && !old.exists() && mine.exists());
    let names: Vec<String> = Registry::load(&toml).unwrap().list().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["k"]);
}

/// Real conversions killed (SIGKILL) at different points, new destinations and `--force`
/// replacements alike: after the next start nothing is left but complete models, and the model a
/// killed `--force` was replacing is still there.
#[cfg(unix)]
#[test]
fn killed_conversions_leave_nothing_listed_or_behind_after_the_next_start() {
    let tmp = tempdir();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let toml = tmp.path().join("models.toml");
    std::fs::write(&toml, "models_dir = \"models\"\n").unwrap();
    let convert = |dst: &Path, force: bool| {
        let mut cmd = tandem();
        cmd.args(["convert", tiny_model_dir().to_str().unwrap(), "--out", dst.to_str().unwrap(), "--bits", "4"]);
        if force {
            cmd.arg("--force");
        }
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        cmd
    };
    let kept = models.join("kept");
    let t0 = std::time::Instant::now();
    assert!(convert(&kept, false).status().unwrap().success());
    let whole = t0.elapsed();
    // Kills spread over a whole conversion (loading, probing, writing, the renames). `make test` runs 6;
    // `TANDEM_KILLS=50` is the campaign (docs/PERF.md has its figures).
    let kills: u32 = std::env::var("TANDEM_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
    for i in 0..kills {
        let (dst, force) = if i % 3 == 0 { (kept.clone(), true) } else { (models.join(format!("m{i}")), false) };
        let mut child = convert(&dst, force).spawn().unwrap();
        std::thread::sleep(whole.mul_f64(1.1 * f64::from(i) / f64::from(kills)));
        let _ = child.kill();
        let _ = child.wait();
    }
    let _engine = Engine::new(Registry::load(&toml).unwrap(), EngineConfig::default());
    let left: Vec<String> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "leftovers after the next start: {left:?}");
    let listed = Registry::load(&toml).unwrap().list();
    assert!(listed.iter().any(|m| m.name == "kept"), "a killed --force lost the model it replaced");
    for m in &listed {
        quant::inspect(&m.path).unwrap_or_else(|e| panic!("{} is listed but incomplete: {e}", m.name));
    }
}

#[test]
fn a_conversion_past_the_file_size_limit_fails_clearly_and_leaves_nothing() {
    let tmp = tempdir();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let dst = out.join("tiny-bf16");
    let script = format!(
        "ulimit -f 2000; exec '{}' convert '{}' --out '{}'",
        env!("CARGO_BIN_EXE_tandem"),
        tiny_model_dir().display(),
        dst.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    let o = run_within(cmd, 300);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "an error, not a SIGXFSZ kill: {err}");
    assert!(err.contains("file-size limit") && err.contains(".safetensors"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");
}
