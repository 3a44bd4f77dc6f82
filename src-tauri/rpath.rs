//! Where the desktop binary looks for the MLX library at run time: its rpath, always relative to
//! the binary, never the build tree's absolute path. Shared by `build.rs` (which links with it) and
//! the tests in `main.rs` (which check it against the bundle configuration).

/// The product name, as in tauri.conf.json: Tauri's Linux packages keep their resources in
/// `usr/lib/<productName>`.
pub const PRODUCT_NAME: &str = "Tandem";

/// The rpath entries of the app's binary on `target_os` ("linux", "macos"):
/// - `mlx/lib` beside it (the build tree, where crates/mlx's build script links the wheel's folder);
/// - the bundle's copy, in the resources Tauri bundles: on Linux (.deb, AppImage) the binary is
///   `usr/bin/Tandem` and the resources `usr/lib/Tandem/`; on macOS `Contents/MacOS/Tandem` and
///   `Contents/Resources/` (where `mlx.metallib` lies beside `libmlx.dylib`, where MLX looks first).
pub fn app(target_os: &str) -> Vec<String> {
    match target_os {
        "macos" => vec!["@executable_path/mlx/lib".into(), "@executable_path/../Resources/mlx/lib".into()],
        _ => vec!["$ORIGIN/mlx/lib".into(), format!("$ORIGIN/../lib/{PRODUCT_NAME}/mlx/lib")],
    }
}

/// The rpath entries of every target, for test binaries (in `deps/`, one folder below the build
/// tree's `mlx/lib`).
pub fn tests(target_os: &str) -> Vec<String> {
    let origin = if target_os == "macos" { "@loader_path" } else { "$ORIGIN" };
    vec![format!("{origin}/../mlx/lib")]
}
