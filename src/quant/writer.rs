//! Writing a planned model into a folder: shard by shard, header first, then each tensor as it is
//! computed, so that only one tensor is in memory at a time. The folder is a temporary one beside the
//! destination (`.NAME.partial-PID-N`), renamed into place only when complete and removed on error or
//! cancellation.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::plan::{Plan, Unit};
use super::ConvertError;

/// A temporary output folder that removes itself unless committed.
pub struct PartialDir {
    pub path: PathBuf,
    dst: PathBuf,
    committed: bool,
}

/// What follows `.NAME` in a conversion's temporary folders: the folder being written, and an old
/// destination moved aside by a `force` commit (each then `-PID-N`).
const PARTIAL: &str = ".partial-";
const OLD: &str = ".old-";

impl PartialDir {
    /// Creates `.NAME.partial-PID-N` beside `dst`, after sweeping leftovers of dead conversions to
    /// the same destination (see [`sweep`]).
    pub fn create(dst: &Path) -> Result<PartialDir, ConvertError> {
        let name = dst.file_name().ok_or_else(|| ConvertError::Destination {
            path: dst.to_path_buf(),
            message: "has no folder name".into(),
        })?;
        let (parent, name) = (parent_of(dst), name.to_string_lossy().into_owned());
        sweep_matching(&parent, Some(&name), &pid_alive);
        let path = parent.join(format!(".{name}{PARTIAL}{}-{}", std::process::id(), next_nonce()));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| ConvertError::io(&path, e))?;
        }
        std::fs::create_dir_all(&path).map_err(|e| ConvertError::io(&path, e))?;
        Ok(PartialDir { path, dst: dst.to_path_buf(), committed: false })
    }

    /// Moves the finished folder to the destination, replacing an existing one when `force`. The
    /// old destination stays until the new one is in place: swapped in one step where the file
    /// system can (Linux `renameat2`, macOS `renamex_np`), else moved aside to `.NAME.old-PID-N`
    /// first, which [`sweep`] puts back if the process dies before the new folder is renamed in.
    pub fn commit(mut self, force: bool) -> Result<(), ConvertError> {
        if self.dst.exists() {
            if !force {
                return Err(ConvertError::DestinationExists(self.dst.clone()));
            }
            match exchange(&self.path, &self.dst) {
                // `self.path` now holds the old destination, which Drop removes.
                Ok(()) => return Ok(()),
                Err(e) if !exchange_unsupported(&e) => return Err(ConvertError::io(&self.dst, e)),
                Err(_) => {}
            }
            let old = parent_of(&self.dst).join(format!(
                ".{}{OLD}{}-{}",
                self.dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                std::process::id(),
                next_nonce()
            ));
            replace_in_two_steps(&self.path, &self.dst, &old, || Ok(()))?;
        } else {
            std::fs::rename(&self.path, &self.dst).map_err(|e| ConvertError::io(&self.dst, e))?;
        }
        self.committed = true;
        Ok(())
    }
}

/// Moves `dst` aside to `old`, `new` to `dst`, then removes `old`. `between` runs between the two
/// renames (a test's simulated crash); if it or the second rename fails, `old` is put back.
fn replace_in_two_steps(
    new: &Path,
    dst: &Path,
    old: &Path,
    between: impl FnOnce() -> std::io::Result<()>,
) -> Result<(), ConvertError> {
    std::fs::rename(dst, old).map_err(|e| ConvertError::io(dst, e))?;
    if let Err(e) = between().and_then(|()| std::fs::rename(new, dst)) {
        if let Err(back) = std::fs::rename(old, dst) {
            tracing::warn!("could not put {} back to {}: {back}", old.display(), dst.display());
        }
        return Err(ConvertError::io(dst, e));
    }
    let removed = if old.is_dir() { std::fs::remove_dir_all(old) } else { std::fs::remove_file(old) };
    removed.map_err(|e| ConvertError::io(old, e))
}

/// Swaps two paths atomically.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (cstring(a.as_os_str().as_bytes())?, cstring(b.as_os_str().as_bytes())?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(target_os = "macos")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (cstring(a.as_os_str().as_bytes())?, cstring(b.as_os_str().as_bytes())?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renamex_np(a.as_ptr(), b.as_ptr(), libc::RENAME_SWAP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

#[cfg(any(target_os = "linux", target_os = "macos"))]
fn cstring(bytes: &[u8]) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// A file system or kernel without atomic exchange (the two-step replacement is used instead).
fn exchange_unsupported(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported
        || matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::ENOTSUP | libc::EXDEV))
}

/// Whether a process with this id is running (signal 0 checks without sending anything).
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 sends nothing; it only reports whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Drop for PartialDir {
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!("could not remove {}: {e}", self.path.display());
            }
        }
    }
}

/// Cleans what killed conversions left in `dir`: every `.NAME.partial-PID-N` of a process that is
/// no longer running is removed, and a `.NAME.old-PID-N` (a destination that a `force` commit had
/// moved aside) is put back as `NAME` when `NAME` is missing, else removed. Folders of running
/// processes and anything else are left alone. Returns what it did, one line each.
pub fn sweep(dir: &Path) -> Vec<String> {
    sweep_matching(dir, None, &pid_alive)
}

/// [`sweep`] limited to leftovers of destination `only` (when given), with `alive` deciding
/// which processes still run.
fn sweep_matching(dir: &Path, only: Option<&str>, alive: &dyn Fn(u32) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut leftovers: Vec<(String, String, bool)> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_str()?.to_string();
            let (name, old, tail) = parse_leftover(&file)?;
            let pid: u32 = tail.split_once('-')?.0.parse().ok()?;
            (only.is_none_or(|o| o == name) && !alive(pid)).then(|| (file.clone(), name.to_string(), old))
        })
        .collect();
    // Old destinations first, so that one is put back before its sibling partial is removed.
    leftovers.sort_by_key(|(_, _, old)| !old);
    let mut done = Vec::new();
    for (file, name, old) in leftovers {
        let (path, dst) = (dir.join(&file), dir.join(&name));
        let result = if old && !dst.exists() {
            std::fs::rename(&path, &dst).map(|()| format!("restored {} from {}", dst.display(), path.display()))
        } else {
            std::fs::remove_dir_all(&path).map(|()| format!("removed {}", path.display()))
        };
        match result {
            Ok(line) => {
                tracing::warn!("leftover of an interrupted conversion: {line}");
                done.push(line);
            }
            Err(e) => tracing::warn!("could not clean {}: {e}", path.display()),
        }
    }
    done
}

/// `.NAME.partial-REST` or `.NAME.old-REST` as (NAME, is old, REST).
fn parse_leftover(file: &str) -> Option<(&str, bool, &str)> {
    let rest = file.strip_prefix('.')?;
    for (mark, old) in [(PARTIAL, false), (OLD, true)] {
        if let Some(i) = rest.rfind(mark) {
            let (name, tail) = (&rest[..i], &rest[i + mark.len()..]);
            if !name.is_empty() && tail.split('-').count() == 2 && tail.split('-').all(|p| p.parse::<u64>().is_ok()) {
                return Some((name, old, tail));
            }
        }
    }
    None
}

/// Distinguishes temporary folders of conversions running at once in one process (server jobs).
fn next_nonce() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The folder `path` is in (`.` for a bare name).
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// What the writer asks for each unit, and tells after it.
pub trait UnitSource {
    /// The bytes of each of the unit's parts, in order.
    fn compute(&mut self, unit: &Unit) -> Result<Vec<Vec<u8>>, ConvertError>;
    /// Called after each unit; returning false cancels.
    fn written(&mut self, unit: &Unit, index: usize, bytes_done: u64) -> bool;
}

/// Writes every shard of `plan` into `dir`, then the index.
pub fn write(plan: &Plan, dir: &Path, src: &mut dyn UnitSource) -> Result<(), ConvertError> {
    let mut done = 0u64;
    let mut index = 0usize;
    for shard in &plan.shards {
        let path = dir.join(&shard.file);
        let file = File::create(&path).map_err(|e| ConvertError::io(&path, e))?;
        let mut w = BufWriter::with_capacity(8 << 20, file);
        w.write_all(&shard.header).map_err(|e| ConvertError::io(&path, e))?;
        for &u in &shard.units {
            let unit = &plan.units[u];
            let data = src.compute(unit)?;
            if data.len() != unit.parts.len() {
                return Err(ConvertError::Internal(format!(
                    "`{}`: {} arrays for {} planned tensors",
                    unit.name,
                    data.len(),
                    unit.parts.len()
                )));
            }
            for (bytes, part) in data.iter().zip(&unit.parts) {
                if bytes.len() as u64 != part.nbytes() {
                    return Err(ConvertError::Internal(format!(
                        "`{}`: {} bytes computed, {} planned ({:?} {})",
                        part.key,
                        bytes.len(),
                        part.nbytes(),
                        part.shape,
                        part.dtype
                    )));
                }
                w.write_all(bytes).map_err(|e| ConvertError::io(&path, e))?;
            }
            drop(data);
            done += unit.nbytes();
            index += 1;
            if !src.written(unit, index, done) {
                return Err(ConvertError::Cancelled);
            }
        }
        let file = w.into_inner().map_err(|e| ConvertError::io(&path, e.into_error()))?;
        file.sync_all().map_err(|e| ConvertError::io(&path, e))?;
    }
    let index_json = serde_json::json!({
        "metadata": { "total_size": plan.tensor_bytes(), "total_parameters": plan.params() },
        "weight_map": plan.weight_map(),
    });
    write_json(&dir.join("model.safetensors.index.json"), &index_json)
}

/// Writes pretty JSON (4-space indent, as mlx-lm does) with a trailing newline.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), ConvertError> {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    serde::Serialize::serialize(value, &mut ser)
        .map_err(|e| ConvertError::Internal(format!("{}: {e}", path.display())))?;
    buf.push(b'\n');
    std::fs::write(path, buf).map_err(|e| ConvertError::io(path, e))
}

#[cfg(test)]
mod tests;
