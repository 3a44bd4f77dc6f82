//! Tauri's build step (config, icons, the shell's page), and the rpath to the MLX library, always
//! relative to the binary (`rpath.rs`): `mlx/lib` beside it in the build tree, where crates/mlx's
//! build script links it, and in the bundles the copy `make package` puts in the app's resources
//! (`usr/lib/Tandem/mlx/lib` in the Linux packages, `Contents/Resources/mlx/lib` in the macOS app,
//! with `mlx.metallib` beside `libmlx.dylib`, where MLX looks for it).
#[path = "rpath.rs"]
mod rpath;

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    for path in rpath::app(&os) {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{path}");
    }
    // Every target: test binaries (the bin's own unit tests included) live in `deps/`.
    for path in rpath::tests(&os) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{path}");
    }
    println!("cargo:rerun-if-changed=rpath.rs");
    tauri_build::build();
}
