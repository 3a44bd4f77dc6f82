//! The CLI as a person meets it: `tandem chat` without --prompt (the interactive conversation through
//! stdin, its slash commands, and Ctrl-C stopping a reply without ending the session or losing the
//! conversation), and `tandem models` with nothing to list.

use crate::common::*;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn chat(extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["chat", "--model", tiny_model_dir().to_str().unwrap(), "--temp", "0"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tandem chat")
}

#[test]
fn slash_commands_keep_save_and_clear_the_conversation() {
    let dir = tempdir();
    let (md, json, empty) = (dir.path().join("c.md"), dir.path().join("c.json"), dir.path().join("e.json"));
    let mut child = chat(&["--max-tokens", "8"]);
    let script = format!(
        "/help\nThe State of the Union\n/save {}\n/save {}\n/frobnicate\n/clear\n/save {}\n/exit\nnever read\n",
        md.display(),
        json.display(),
        empty.display()
    );
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("/clear") && err.contains("Ctrl-C stops a reply"), "/help lists the commands: {err}");
    assert!(err.contains("unknown command /frobnicate"), "{err}");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let turns = saved.as_array().unwrap();
    assert_eq!(turns.len(), 2, "{saved}");
    assert_eq!(
        (turns[0]["role"].as_str(), turns[0]["content"].as_str()),
        (Some("user"), Some("The State of the Union"))
    );
    let answer = turns[1]["content"].as_str().unwrap();
    assert!(turns[1]["role"] == "assistant" && !answer.is_empty(), "{saved}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(answer.trim()), "the reply was streamed to stdout");
    let markdown = std::fs::read_to_string(&md).unwrap();
    assert!(markdown.starts_with("**user**\n\nThe State of the Union\n") && markdown.contains("**assistant**"));
    assert_eq!(std::fs::read_to_string(&empty).unwrap().trim(), "[]", "/clear starts a new conversation");
}

/// SIGINT while a reply streams stops that reply; the session goes on, and the stopped reply stays
/// in the conversation.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_reply_and_the_session_goes_on() {
    let dir = tempdir();
    let saved = dir.path().join("c.json");
    let mut child = chat(&["--max-tokens", "1500", "--ignore-eos", "--mtp", "off"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Call me Ishmael. Some years ago\n").unwrap();
    // Wait for the reply to start streaming, then interrupt it.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    let t0 = Instant::now();
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    stdin.write_all(format!("/save {}\n/exit\n", saved.display()).as_bytes()).unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the session ended cleanly after Ctrl-C: {:?}\n{err}", out.status);
    assert!(err.contains("(stopped)"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let turns = v.as_array().unwrap();
    assert_eq!(turns.len(), 2, "the stopped reply stays in the conversation: {v}");
    let stats = err.lines().find(|l| l.starts_with('[')).unwrap_or_default().to_string();
    let generated: usize =
        stats.split(" + ").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap();
    assert!(generated < 1500, "the reply stopped early: {stats}");
}

#[test]
fn models_with_nothing_to_list_says_how_to_get_one() {
    let dir = tempdir();
    std::fs::create_dir_all(dir.path().join("models")).unwrap();
    let toml = dir.path().join("models.toml");
    std::fs::write(&toml, format!("models_dir = {:?}\n", dir.path().join("models").to_str().unwrap())).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).arg("models").env("TANDEM_CONFIG", &toml).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains("No models") && err.contains("tandem convert") && err.contains("models.toml"), "{err}");
}

/// A models.toml entry whose folder was moved or deleted is listed as missing (text and JSON), with a line on
/// stderr naming the file to fix; a present one is not.
#[test]
fn models_marks_an_entry_whose_folder_is_missing() {
    let dir = tempdir();
    std::fs::create_dir_all(dir.path().join("models")).unwrap();
    let toml = dir.path().join("models.toml");
    let gone = dir.path().join("gone-model");
    let entries = format!(
        "models_dir = {:?}\n[[model]]\nname = \"here\"\npath = {:?}\n[[model]]\nname = \"gone\"\npath = {:?}\n",
        dir.path().join("models").to_str().unwrap(),
        tiny_model_dir().to_str().unwrap(),
        gone.to_str().unwrap()
    );
    std::fs::write(&toml, entries).unwrap();
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
        cmd.arg("models").env("TANDEM_CONFIG", &toml);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (text, err) = run(false);
    let line =
        |name: &str| text.lines().find(|l| l.split_whitespace().any(|w| w == name)).unwrap_or_default().to_string();
    assert!(line("gone").contains("missing: no such folder"), "{text}");
    assert!(!line("here").contains("missing"), "{text}");
    assert!(err.contains("1 model folder(s) missing") && err.contains("models.toml"), "{err}");
    let (json, _) = run(true);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let present = |name: &str| rows.as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()["present"].clone();
    assert_eq!((present("here"), present("gone")), (serde_json::json!(true), serde_json::json!(false)), "{json}");
}

/// `tandem bench --prefix-cache --prefix-disk DIR` leaves nothing behind: a DIR it had to create is gone
/// afterwards, and a DIR that was there keeps what it held and gains nothing.
#[test]
fn bench_prefix_disk_leaves_nothing_behind() {
    let dir = tempdir();
    let made = dir.path().join("made-by-bench");
    let kept = dir.path().join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("mine.txt"), "mine").unwrap();
    for disk in [&made, &kept] {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args([
                "bench",
                "--model",
                tiny_model_dir().to_str().unwrap(),
                "--prompt-tokens",
                "16",
                "--gen-tokens",
                "4",
            ])
            .args(["--depths", "0", "--prefix-cache", "--prefix-disk", disk.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("TTFT") && err.contains("from the prefix cache"), "{err}");
    }
    assert!(!made.exists(), "the folder the bench created is left behind");
    let left: Vec<_> = std::fs::read_dir(&kept).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from("mine.txt")], "the existing folder changed");
}

/// An error of reading a model folder says its cause once: the CLI prints the whole chain of causes,
/// so an error whose message already holds its cause must not also hand it on as a `source`
/// (`...: No such file or directory (os error 2): No such file or directory (os error 2)`).
#[test]
fn a_failed_read_says_its_cause_once() {
    let dir = tempdir();
    let model = dir.path().join("m");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(tiny_model_dir().join("config.json"), model.join("config.json")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone"), model.join("model.safetensors")).unwrap();
    let model = model.to_str().unwrap();
    let missing = dir.path().join("no-such-folder");
    let out = dir.path().join("out");
    let runs: [&[&str]; 3] = [
        &["inspect", model],
        &["chat", "--model", model, "--prompt", "hi"],
        &["convert", missing.to_str().unwrap(), "--out", out.to_str().unwrap()],
    ];
    for args in runs {
        let run = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "tandem {args:?} fails: {err}");
        assert_eq!(err.matches("(os error 2)").count(), 1, "tandem {args:?} says the cause once: {err}");
    }
}

/// `-h` of every command: each option and argument says what it does (none is a bare flag).
#[test]
fn every_option_of_every_command_says_what_it_does() {
    for cmd in ["chat", "bench", "convert", "inspect", "serve", "models"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args([cmd, "-h"]).output().unwrap();
        assert!(out.status.success(), "tandem {cmd} -h");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        let mut seen = 0;
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let indent = line.len() - t.len();
            if indent == 0 || !(t.starts_with('-') || t.starts_with('<') || t.starts_with('[')) {
                continue;
            }
            seen += 1;
            // The help follows the flag on its line, or on the next, indented further.
            let same_line = t.split_once("  ").is_some_and(|(_, help)| !help.trim().is_empty());
            let next_line = lines.get(i + 1).is_some_and(|n| {
                let nt = n.trim_start();
                !nt.is_empty() && n.len() - nt.len() > indent && !nt.starts_with('-')
            });
            assert!(same_line || next_line, "tandem {cmd}: `{t}` has no help text\n{text}");
        }
        assert!(seen >= 2, "tandem {cmd} -h lists its options: {text}");
    }
}

/// `tandem inspect` without --json reads as sizes in units, the quantization per group and the
/// probe's figure, each agreeing with the --json report of the same folder.
#[test]
fn inspect_for_a_person_agrees_with_its_json() {
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
        cmd.arg("inspect").arg(tiny_model_dir());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let text = run(false);
    let params = v["params"].as_u64().unwrap() as f64 / 1e6;
    assert!(text.contains(&format!("{params:.2} M parameters")), "{text}");
    assert!(text.contains(&format!("{:.1} MB of weights", v["bytes"].as_u64().unwrap() as f64 / 1e6)), "{text}");
    assert!(v["quantization"].is_null() && text.contains("quantization: none"), "{text}");
    let probe = &v["mtp"]["probe"];
    let line = text.lines().find(|l| l.contains("MTP probe:")).unwrap_or_else(|| panic!("no probe line: {text}"));
    assert!(line.contains(&format!("{:.3} top-1 agreement", probe["acceptance"].as_f64().unwrap())), "{line}");
    assert!(
        line.contains(probe["chosen"].as_str().unwrap()) && line.contains(&format!("{} tokens", probe["tokens"])),
        "{line}"
    );
    assert!(!text.contains("null"), "no raw JSON in the text: {text}");
}
