//! The distributed bridge over MLX's ring backend, with processes on loopback: this test binary
//! starts copies of itself as the ranks (`rank_main`, selected by `MLX_BRIDGE_RANK_TEST`), and checks
//! what they computed together; bad hostfiles and a rank whose peer never comes are errors, not hangs.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mlx::{distributed, Array, Dtype};

/// Free loopback ports, one per rank (bound, read, let go).
fn ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn hostfile(dir: &Path, n: usize) -> std::path::PathBuf {
    let hosts: Vec<Vec<String>> = ports(n).into_iter().map(|p| vec![format!("127.0.0.1:{p}")]).collect();
    let path = dir.join("hosts.json");
    std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
    path
}

/// This binary again, running only `rank_main` as `rank` of the group `hosts` describes.
fn rank(hosts: &Path, rank: usize, what: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["distributed::rank_main", "--exact", "--nocapture", "--test-threads", "1"])
        .env("MLX_BRIDGE_RANK_TEST", what)
        .env("MLX_HOSTFILE", hosts)
        .env("MLX_RANK", rank.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for every child, at most `limit`; kills them all past it.
fn wait_all(children: Vec<std::process::Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    let mut children = children;
    loop {
        if children.iter_mut().all(|c| c.try_wait().unwrap().is_some()) {
            return children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        }
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            let outs: Vec<String> = children
                .into_iter()
                .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned())
                .collect();
            panic!("the ranks did not finish within {limit:?}:\n{}", outs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What one rank does (in a child process); prints `RESULT ...` lines for the parent to check.
#[test]
fn rank_main() {
    let Ok(what) = std::env::var("MLX_BRIDGE_RANK_TEST") else { return };
    let g = match distributed::init("ring") {
        Ok(g) => g,
        Err(e) => {
            println!("RESULT init-error {e}");
            return;
        }
    };
    let (r, n) = (g.rank(), g.size());
    match what.as_str() {
        "collectives" => {
            let mine = Array::from_slice(&[r as f32 + 1.0, 10.0 * r as f32], &[2]).unwrap();
            let sum = g.all_sum(&mine).unwrap().to_vec::<f32>().unwrap();
            let gathered = g.all_gather(&mine.reshape(&[1, 2]).unwrap()).unwrap();
            println!("RESULT sum {sum:?}");
            println!("RESULT gather {:?} {:?}", gathered.shape(), gathered.to_vec::<f32>().unwrap());
            // A ring of sends: each rank passes its rank to the next and hears the previous.
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            // Sends first everywhere (a small message is buffered), then receives.
            g.send(&Array::from_slice(&[r], &[1]).unwrap(), next).unwrap().eval().unwrap();
            let got = g.recv(&[1], Dtype::I32, prev).unwrap();
            println!("RESULT recv {:?}", got.to_vec::<i32>().unwrap());
            println!("RESULT bad-peer {}", g.send(&mine, r).is_err() && g.recv(&[1], Dtype::I32, n).is_err());
        }
        other => panic!("unknown rank test {other}"),
    }
}

fn results(out: &Output) -> Vec<String> {
    let text = String::from_utf8_lossy(&out.stdout);
    // libtest's "test ... " may precede the first line.
    text.lines().filter_map(|l| l.split_once("RESULT ")).map(|(_, r)| r.to_owned()).collect()
}

#[test]
fn two_and_four_ranks_sum_gather_send_and_receive() {
    for n in [2usize, 4] {
        let dir = tempfile_dir();
        let hosts = hostfile(dir.path(), n);
        let children = (0..n).map(|r| rank(&hosts, r, "collectives").spawn().unwrap()).collect();
        let outs = wait_all(children, Duration::from_secs(60));
        // Sum over ranks of [r + 1, 10 r]; the gather holds every rank's row in rank order.
        let sum = [(1..=n).sum::<usize>() as f32, 10.0 * (0..n).sum::<usize>() as f32];
        let rows: Vec<f32> = (0..n).flat_map(|r| [r as f32 + 1.0, 10.0 * r as f32]).collect();
        for (r, out) in outs.iter().enumerate() {
            let got = results(out);
            let expected = vec![
                format!("sum {sum:?}"),
                format!("gather {:?} {rows:?}", [n as i32, 2]),
                format!("recv {:?}", [((r + n - 1) % n) as i32]),
                "bad-peer true".to_owned(),
            ];
            assert_eq!(got, expected, "rank {r} of {n}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

#[test]
fn bad_hostfiles_are_errors_not_hangs() {
    let dir = tempfile_dir();
    let missing = dir.path().join("nowhere.json");
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "this is not json").unwrap();
    let two = hostfile(dir.path(), 2);
    for (hosts, rank_no, why) in
        [(&missing, 0, "a missing hostfile"), (&garbage, 0, "a malformed one"), (&two, 5, "a rank outside it")]
    {
        let out = wait_all(vec![rank(hosts, rank_no, "collectives").spawn().unwrap()], Duration::from_secs(30));
        let got = results(&out[0]);
        assert!(
            got.first().is_some_and(|l| l.starts_with("init-error ")),
            "{why}: {got:?} {}",
            String::from_utf8_lossy(&out[0].stderr)
        );
    }
}

fn tempfile_dir() -> TempDir {
    TempDir::new()
}

/// A temporary folder, removed on drop (this crate has no tempfile dependency).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("mlx-dist-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
