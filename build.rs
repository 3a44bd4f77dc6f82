//! Lets `tandem` find the MLX library relative to itself (`mlx/lib` beside the binary, or one folder
//! up for test binaries in `deps/`), never through the build tree's absolute path; crates/mlx's
//! build script lays that folder out in the build tree.
fn main() {
    let origin =
        if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") { "@loader_path" } else { "$ORIGIN" };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{origin}/mlx/lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{origin}/../mlx/lib");
}
