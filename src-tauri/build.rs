//! Tauri's build step (config, icons, the shell's page), and the rpath to the MLX library, always
//! relative to the binary: `mlx/lib` beside it (the build tree, where crates/mlx's build script links
//! it, and the Linux package), and in the macOS bundle the copy in `Contents/Resources/mlx/lib`
//! (with `mlx.metallib` beside it, where MLX looks for it).
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,@executable_path/../Resources/mlx/lib");
    }
    // Beside the binary, or one folder up for test binaries in `deps/`.
    let origin =
        if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") { "@loader_path" } else { "$ORIGIN" };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{origin}/mlx/lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{origin}/../mlx/lib");
    tauri_build::build();
}
