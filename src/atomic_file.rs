//! Replacing a file in one step, so that a crash never leaves half of it: models.toml and the
//! conversation files are written this way.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a temporary file in the target's folder (so that the rename stays on one file
/// system), flushes it to disk, then renames it over `path`. A symlink is written through to its
/// target rather than replaced; an existing file keeps its permissions, a new one is readable by its
/// owner only. On failure the old file is untouched and the temporary file (`.NAME.XXXX.tmp`) removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut file = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(dir)?;
    file.write_all(bytes)?;
    if let Ok(meta) = std::fs::metadata(&target) {
        file.as_file().set_permissions(meta.permissions())?;
    }
    file.as_file().sync_all()?;
    file.persist(&target).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_in_one_step_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.json")]);
    }

    #[test]
    fn a_missing_folder_is_an_error_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("a.json");
        assert!(write_atomic(&path, b"x").is_err());
        assert!(!path.exists());
    }

    #[cfg(unix)]
    #[test]
    fn a_new_file_is_private_and_an_old_one_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new");
        write_atomic(&new, b"x").unwrap();
        assert_eq!(std::fs::metadata(&new).unwrap().permissions().mode() & 0o777, 0o600);
        let old = dir.path().join("old");
        std::fs::write(&old, b"x").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&old, b"y").unwrap();
        assert_eq!(std::fs::metadata(&old).unwrap().permissions().mode() & 0o777, 0o644);
    }
}
