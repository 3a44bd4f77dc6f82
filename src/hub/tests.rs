use super::*;

#[test]
fn repo_refs_parse_and_bad_ones_say_why() {
    let r: RepoRef = "Qwen/Qwen3.5-4B".parse().unwrap();
    assert_eq!((r.repo.as_str(), r.revision.as_str()), ("Qwen/Qwen3.5-4B", "main"));
    let r: RepoRef = "mlx-community/Qwen3.5-4B-4bit@refs/pr/3".parse().unwrap();
    assert_eq!(r.revision, "refs/pr/3");
    for bad in ["Qwen", "a/b/c", "../x/y", "a/..", "a/b@", "a b/c", "/a/b", "a/b@x y", "a/b@../../etc"] {
        let e = bad.parse::<RepoRef>().unwrap_err().to_string();
        assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
    }
}

#[test]
fn encoding_keeps_unreserved_bytes_only() {
    assert_eq!(encode("model-00001-of-00002.safetensors"), "model-00001-of-00002.safetensors");
    assert_eq!(encode("refs/pr/3"), "refs%2Fpr%2F3");
    assert_eq!(encode("a b"), "a%20b");
}

#[test]
fn links_are_relative_to_the_repo_folder() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("models--a--b");
    fs::create_dir_all(repo.join("blobs")).unwrap();
    fs::write(repo.join("blobs/abc"), b"x").unwrap();
    let snap = repo.join("snapshots/c0mmit");
    link(&snap, "sub/dir/f.json", &repo.join("blobs/abc")).unwrap();
    assert_eq!(fs::read(snap.join("sub/dir/f.json")).unwrap(), b"x");
    #[cfg(unix)]
    assert_eq!(fs::read_link(snap.join("sub/dir/f.json")).unwrap(), PathBuf::from("../../../../blobs/abc"));
}
