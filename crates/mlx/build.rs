//! Finds the MLX library unpacked from the official PyPI wheel (by `make setup`) or at `MLX_DIR`,
//! compiles the cxx bridge against its headers and links it with an rpath, so that nothing at run
//! time needs Python or LD_LIBRARY_PATH.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-changed=cxx/bridge.h");
    println!("cargo:rerun-if-changed=cxx/bridge.cc");
    println!("cargo:rerun-if-changed=cxx/host_kernels.cc");
    println!("cargo:rerun-if-changed=src/ffi.rs");

    let mlx = find_mlx().unwrap_or_else(|| {
        panic!(
            "MLX not found. Run `make setup` (it unpacks the pinned MLX wheel into .mlx/), \
             or point MLX_DIR at a folder holding include/mlx and lib/libmlx.*"
        )
    });
    let include = mlx.join("include");
    let lib = mlx.join("lib");

    cxx_build::CFG.include_prefix = "mlx-bridge";
    let mut build = cxx_build::bridge("src/ffi.rs");
    build
        .file("cxx/bridge.cc")
        .file("cxx/host_kernels.cc")
        .include(&include)
        // host_kernels.cc includes kernels/cpu/*.h from the repository root.
        .include(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .std("c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        // from_dtype's switch must name every MLX type (see bridge.cc).
        .flag_if_supported("-Werror=switch");
    build.compile("mlx-bridge");

    // Host kernels (the repository's kernels/cpu/, plain C++ linked into the bridge): always optimised, since
    // an unoptimised build of a hot loop would be slower than the MLX op it replaces, debug builds included.
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/cpu");
    let mut host = cc::Build::new();
    host.cpp(true)
        .std("c++20")
        .include(&include)
        .opt_level(3)
        .debug(false)
        // No fused multiply-adds the compiler chooses itself: it fuses some products and not others, and
        // a row's bits would then depend on which code path (one row of x or two) computed it.
        .flag("-ffp-contract=off")
        // Lets GCC select between two computed values in a vector (the elementwise chains' selects); no value
        // changes (Clang's default).
        .flag_if_supported("-fno-trapping-math")
        .flag_if_supported("-Wno-unused-parameter")
        // GCC notes that 32-byte vector values change the ABI without AVX; they never cross a call boundary
        // (every function passing them is inlined) or leave this library.
        .flag_if_supported("-Wno-psabi");
    for entry in std::fs::read_dir(&kernels).expect("kernels/cpu").flatten() {
        let path = entry.path();
        println!("cargo:rerun-if-changed={}", path.display());
        if path.extension().is_some_and(|e| e == "cc") {
            host.file(path);
        }
    }
    host.compile("tandem-host-kernels");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // Binaries find MLX relative to themselves, never through the build tree's absolute path, so a
    // built program can be moved: the library sits beside it as `mlx/lib` (with the wheel's sibling
    // folders, which libmlx's own relative rpath reaches). In the build tree that layout is made of
    // links in the profile folder; `make package` copies it into the bundle. This crate's own tests
    // live in `deps/`, one folder down.
    link_beside_binaries(&mlx);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", rpath_origin("../mlx/lib"));
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:include_dir={}", include.display());
}

/// `$ORIGIN/<rel>` on Linux, `@loader_path/<rel>` on macOS: the linker resolves it at run time
/// against the folder of the binary.
fn rpath_origin(rel: &str) -> String {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        format!("@loader_path/{rel}")
    } else {
        format!("$ORIGIN/{rel}")
    }
}

/// Links `<profile>/mlx` to the MLX folder and its sibling `*.libs` folders (the wheel's bundled
/// BLAS), so binaries in `<profile>` and `<profile>/deps` find MLX through their relative rpaths.
fn link_beside_binaries(mlx: &Path) {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else { return };
    // OUT_DIR is <profile>/build/<crate>-<hash>/out.
    let Some(profile) = out.ancestors().nth(3) else { return };
    let Some(wheel) = mlx.parent() else { return };
    let mut names = vec![std::ffi::OsString::from("mlx")];
    if let Ok(entries) = std::fs::read_dir(wheel) {
        names.extend(entries.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().ends_with(".libs")));
    }
    for name in names {
        let from = if name == "mlx" { mlx.to_path_buf() } else { wheel.join(&name) };
        let at = profile.join(&name);
        if std::fs::read_link(&at).ok().as_deref() == Some(from.as_path()) {
            continue;
        }
        let _ = std::fs::remove_file(&at);
        #[cfg(unix)]
        if let Err(e) = std::os::unix::fs::symlink(&from, &at) {
            println!("cargo:warning=could not link {} -> {}: {e}", at.display(), from.display());
        }
    }
}

fn find_mlx() -> Option<PathBuf> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").ok()?);
    let root = manifest.parent()?.parent()?.to_path_buf();
    if let Ok(dir) = std::env::var("MLX_DIR") {
        // A relative MLX_DIR is the workspace root's (the Makefile's `.mlx/wheel/mlx`, which make passes on
        // where the shell exported MLX_DIR): this script runs in crates/mlx.
        let p = root.join(dir);
        return has_mlx(&p).then_some(p);
    }
    let candidate = root.join(".mlx").join("wheel").join("mlx");
    println!("cargo:rerun-if-changed={}", candidate.display());
    has_mlx(&candidate).then_some(candidate)
}

fn has_mlx(p: &Path) -> bool {
    p.join("include/mlx/mlx.h").exists() && (p.join("lib/libmlx.so").exists() || p.join("lib/libmlx.dylib").exists())
}
