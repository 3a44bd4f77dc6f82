//! Finds the MLX library unpacked from the official PyPI wheel (by `make setup`) or at `MLX_DIR`,
//! compiles the cxx bridge against its headers and links it with an rpath, so that nothing at run
//! time needs Python or LD_LIBRARY_PATH.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-changed=cxx/bridge.h");
    println!("cargo:rerun-if-changed=cxx/bridge.cc");
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
        .include(&include)
        .std("c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations");
    build.compile("mlx-bridge");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // Reaches this crate's own tests; dependants read DEP_MLX_LIB_DIR and set their own rpath.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:include_dir={}", include.display());
}

fn find_mlx() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("MLX_DIR") {
        let p = PathBuf::from(dir);
        return has_mlx(&p).then_some(p);
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").ok()?);
    let root = manifest.parent()?.parent()?.to_path_buf();
    let candidate = root.join(".mlx").join("wheel").join("mlx");
    println!("cargo:rerun-if-changed={}", candidate.display());
    has_mlx(&candidate).then_some(candidate)
}

fn has_mlx(p: &Path) -> bool {
    p.join("include/mlx/mlx.h").exists() && (p.join("lib/libmlx.so").exists() || p.join("lib/libmlx.dylib").exists())
}
