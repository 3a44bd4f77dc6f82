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

impl PartialDir {
    /// Creates `.NAME.partial-PID` beside `dst`.
    pub fn create(dst: &Path) -> Result<PartialDir, ConvertError> {
        let name = dst.file_name().ok_or_else(|| ConvertError::Destination {
            path: dst.to_path_buf(),
            message: "has no folder name".into(),
        })?;
        let parent = parent_of(dst);
        let path = parent.join(format!(".{}.partial-{}-{}", name.to_string_lossy(), std::process::id(), next_nonce()));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| ConvertError::io(&path, e))?;
        }
        std::fs::create_dir_all(&path).map_err(|e| ConvertError::io(&path, e))?;
        Ok(PartialDir { path, dst: dst.to_path_buf(), committed: false })
    }

    /// Moves the finished folder to the destination, replacing an existing one when `force`.
    pub fn commit(mut self, force: bool) -> Result<(), ConvertError> {
        if self.dst.exists() {
            if !force {
                return Err(ConvertError::DestinationExists(self.dst.clone()));
            }
            // Move the old folder aside first so that the destination is never half-replaced.
            let old = parent_of(&self.dst).join(format!(
                ".{}.old-{}-{}",
                self.dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                std::process::id(),
                next_nonce()
            ));
            std::fs::rename(&self.dst, &old).map_err(|e| ConvertError::io(&self.dst, e))?;
            std::fs::rename(&self.path, &self.dst).map_err(|e| ConvertError::io(&self.dst, e))?;
            let removed = if old.is_dir() { std::fs::remove_dir_all(&old) } else { std::fs::remove_file(&old) };
            removed.map_err(|e| ConvertError::io(&old, e))?;
        } else {
            std::fs::rename(&self.path, &self.dst).map_err(|e| ConvertError::io(&self.dst, e))?;
        }
        self.committed = true;
        Ok(())
    }
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
