//! A built `tandem` finds MLX relative to itself, so the program (and an app bundle) can be moved:
//! its RUNPATH names no absolute folder, and a copy elsewhere runs with `mlx/` beside it and fails
//! without it.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn tandem() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tandem"))
}

fn runpath(exe: &Path) -> Vec<String> {
    let out = Command::new("readelf").arg("-d").arg(exe).output().expect("readelf (binutils)");
    assert!(out.status.success(), "readelf failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)"))
        .filter_map(|l| l.split_once('[').and_then(|(_, r)| r.strip_suffix(']')))
        .flat_map(|p| p.split(':').map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// Copies a folder, following links (the build tree links `mlx/` to the unpacked wheel).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if std::fs::metadata(entry.path()).unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn runpath_is_relative_to_the_binary() {
    let paths = runpath(&tandem());
    assert!(!paths.is_empty(), "tandem has no RUNPATH: it could only find MLX through LD_LIBRARY_PATH");
    for p in &paths {
        assert!(p.starts_with("$ORIGIN"), "RUNPATH entry {p} is not relative to the binary ({paths:?})");
    }
}

#[test]
fn a_moved_binary_runs_with_mlx_beside_it_and_not_without() {
    let exe = tandem();
    let profile = exe.parent().unwrap();
    let dir = crate::common::tempdir();
    let moved = dir.path().join("tandem");
    std::fs::copy(&exe, &moved).unwrap();
    let run = || Command::new(&moved).arg("--version").env_remove("LD_LIBRARY_PATH").output().unwrap();

    let alone = run();
    assert!(!alone.status.success(), "a copy without mlx/ beside it still ran: MLX is found by an absolute path");
    assert!(String::from_utf8_lossy(&alone.stderr).contains("libmlx"), "{}", String::from_utf8_lossy(&alone.stderr));

    // `mlx/lib` and the wheel's sibling `*.libs` folders that libmlx reaches through its own rpath.
    for entry in std::fs::read_dir(profile).unwrap() {
        let name = entry.unwrap().file_name();
        let n = name.to_string_lossy();
        if n == "mlx" {
            copy_tree(&profile.join("mlx/lib"), &dir.path().join("mlx/lib"));
        } else if n.ends_with(".libs") {
            copy_tree(&profile.join(&name), &dir.path().join(&name));
        }
    }
    let beside = run();
    assert!(beside.status.success(), "moved tandem failed: {}", String::from_utf8_lossy(&beside.stderr));
    assert!(String::from_utf8_lossy(&beside.stdout).starts_with("tandem "));
}
