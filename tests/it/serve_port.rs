//! `tandem serve` on a port that is already taken says who holds it: a Tandem by its URL and pid
//! (what answers `GET /api/health` there is one), anything else by the port, the OS's error and the
//! program holding it, with `--port` suggested. Both run the real binary, as a person would.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common;

fn serve(config: &Path, port: u16) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.args(["serve", "--port", &port.to_string()])
        .env("TANDEM_CONFIG", config)
        .env_remove("TANDEM_API_KEY")
        .env_remove("RUST_LOG");
    c
}

fn registry(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("models.toml");
    std::fs::write(&path, format!("models_dir = \"{}\"\n", dir.join("models").display())).unwrap();
    path
}

/// Runs a `tandem serve` that must give up at once; at most 30 s.
fn refused(mut command: Command) -> (Output, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tandem serve on a busy port was still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "tandem serve on a busy port succeeded: {stderr}");
    (out, stderr)
}

/// Kills the server when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_port_held_by_another_program_is_named_with_the_os_error_and_port_is_suggested() {
    // Something that answers HTTP, but not as Tandem does.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let _ = BufReader::new(stream.try_clone().unwrap()).read_line(&mut line);
            let _ = seen_tx.send(line);
            let body = r#"{"status":"ok"}"#;
            let _ =
                write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    let dir = common::tempdir();
    let (_, stderr) = refused(serve(&registry(dir.path()), port));
    assert!(!stderr.contains("Tandem is already serving"), "a server that is not Tandem was taken for one: {stderr}");
    assert!(stderr.contains(&format!("cannot listen on 127.0.0.1:{port}: ")), "the port is not named: {stderr}");
    assert!(stderr.to_lowercase().contains("address already in use"), "the OS's error is not said: {stderr}");
    assert!(stderr.contains("choose another port with --port"), "--port is not suggested: {stderr}");
    if cfg!(target_os = "linux") {
        // This test process holds the socket.
        assert!(stderr.contains(&format!("(pid {})", std::process::id())), "the holder's pid is not said: {stderr}");
    }
    let probe = seen.recv_timeout(Duration::from_secs(5)).expect("tandem did not ask what holds the port");
    assert!(probe.starts_with("GET /api/health "), "{probe}");
}

#[test]
fn a_port_held_by_a_tandem_says_tandem_is_already_serving_there() {
    let dir = common::tempdir();
    let config = registry(dir.path());
    let mut first = serve(&config, 0).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = first.id();
    let stderr = first.stderr.take().unwrap();
    let first = Running(first);
    // Its stderr is read to the end in the background (the pipe must not fill), and the line with
    // its URL handed over.
    let (url_tx, url_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("Tandem is serving on ") {
                let _ = url_tx.send(url.split_whitespace().next().unwrap_or_default().to_string());
            }
        }
    });
    let url = url_rx.recv_timeout(Duration::from_secs(60)).expect("the first tandem serve did not start within 60 s");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();

    let (_, stderr) = refused(serve(&config, port));
    assert!(
        stderr.contains(&format!("Tandem is already serving on http://127.0.0.1:{port}")),
        "the holder is not named as a Tandem at its URL: {stderr}"
    );
    assert!(stderr.contains("--port"), "--port is not suggested: {stderr}");
    if cfg!(target_os = "linux") {
        assert!(stderr.contains(&format!("(pid {pid})")), "the first server's pid is not said: {stderr}");
    }
    drop(first);
}
