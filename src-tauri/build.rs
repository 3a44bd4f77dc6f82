//! Tauri's build step (config, icons, the shell's page), and the rpath to the MLX library: the
//! checkout's `.mlx` folder for development runs, and in the macOS bundle the copy in
//! `Contents/Resources/mlx/lib` (with `mlx.metallib` beside it, where MLX looks for it).
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,@executable_path/../Resources/mlx/lib");
    }
    tauri_build::build();
}
