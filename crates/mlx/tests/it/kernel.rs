//! Kernel headers kept in files (`mlx::kernel::header_file`): named by their contents, rewritten where the
//! file holds anything else, and included only through a path a quoted include can spell.

use std::path::Path;

use mlx::kernel::header_file::{include_line, place};

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx-header-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_header_file_holds_its_header_under_a_name_of_its_contents() {
    let dir = scratch("names");
    let a = place(&dir, "__device__ int a() { return 1; }\n").unwrap();
    let again = place(&dir, "__device__ int a() { return 1; }\n").unwrap();
    let b = place(&dir, "__device__ int a() { return 2; }\n").unwrap();
    assert_eq!(a, again);
    assert_ne!(a, b, "a header differing in one byte needs its own file");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "__device__ int a() { return 1; }\n");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "__device__ int a() { return 2; }\n");
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_header_file_that_was_changed_is_written_again() {
    let dir = scratch("changed");
    let header = "#define TANDEM_X 7\n";
    let path = place(&dir, header).unwrap();
    std::fs::write(&path, "#define TANDEM_X 8\n").unwrap();
    assert_eq!(place(&dir, header).unwrap(), path);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), header);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_include_line_needs_a_plain_absolute_path() {
    assert_eq!(include_line(Path::new("/tmp/h/abc.cuh")).as_deref(), Some("#include \"/tmp/h/abc.cuh\"\n"));
    assert_eq!(include_line(Path::new("h/abc.cuh")), None);
    assert_eq!(include_line(Path::new("/tmp/a\"b.cuh")), None);
    assert_eq!(include_line(Path::new("/tmp/a\\b.cuh")), None);
    assert_eq!(include_line(Path::new("/tmp/a\nb.cuh")), None);
}

#[test]
fn a_folder_that_cannot_be_made_is_an_error() {
    let dir = scratch("blocked");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    std::fs::write(&dir, "a file where the folder would go").unwrap();
    assert!(place(&dir.join("sub"), "#define Y 1\n").is_err());
    std::fs::remove_file(&dir).unwrap();
}
