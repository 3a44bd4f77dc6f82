//! Reading checkpoint tensors: memory-mapped safetensors files (single, sharded with an index, and an
//! `mtp.safetensors` sidecar), with the layout (raw Hugging Face or MLX conversion) they came in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use mlx::{Array, Dtype};

use super::LoadError;

/// Where a checkpoint came from, which decides its naming and norm conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Raw Hugging Face: `model.language_model.*`, zero-centred norms, conv1d `[C,1,K]`.
    Hf,
    /// Written by mlx-lm / mlx-vlm (or Tandem's converter): `language_model.model.*`, norms shifted by +1.
    Mlx,
}

/// One tensor in a file: where its bytes are, not yet an MLX array.
#[derive(Clone)]
pub struct TensorRef {
    pub file: Arc<Shard>,
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    start: usize,
    end: usize,
}

pub struct Shard {
    pub path: PathBuf,
    map: Mmap,
    pub mlx_format: bool,
}

impl TensorRef {
    pub fn bytes(&self) -> &[u8] {
        &self.file.map[self.start..self.end]
    }

    /// An MLX array over the mapped bytes (MLX copies where it cannot wrap external memory).
    pub fn to_array(&self) -> Result<Array, LoadError> {
        let bytes = self.bytes();
        let owner = self.file.clone();
        // SAFETY: the bytes live inside `owner`'s memory map, which is read-only and kept alive by
        // the owner until MLX releases it; the length was checked against shape and dtype on open.
        unsafe { Array::from_external(bytes.as_ptr(), bytes.len(), &self.shape, self.dtype, owner) }
            .map_err(|e| LoadError::Mlx { context: format!("{}", self.file.path.display()), source: e })
    }
}

/// Every tensor of a checkpoint folder, keyed by the name stored in the file.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub tensors: BTreeMap<String, TensorRef>,
    /// Which file each tensor came from (for messages).
    pub sidecar_mtp: bool,
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards listed by `model.safetensors.index.json`, or every
    /// `*.safetensors` in the folder, plus `mtp.safetensors` when present.
    pub fn open(dir: &Path) -> Result<Checkpoint, LoadError> {
        let index = dir.join("model.safetensors.index.json");
        let mut files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| LoadError::io(&index, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| LoadError::Json { path: index.clone(), message: e.to_string() })?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| LoadError::Json {
                path: index.clone(),
                message: "missing object `weight_map`".into(),
            })?;
            let mut names: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| LoadError::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            found
        };
        let sidecar = dir.join("mtp.safetensors");
        let sidecar_mtp = sidecar.exists();
        if sidecar_mtp && !files.contains(&sidecar) {
            files.push(sidecar);
        }
        if files.is_empty() {
            return Err(LoadError::NoWeights(dir.to_path_buf()));
        }
        let mut tensors = BTreeMap::new();
        for path in files {
            let shard = Arc::new(open_shard(&path)?);
            for (name, t) in read_header(&shard)? {
                if tensors.insert(name.clone(), t).is_some() {
                    return Err(LoadError::Duplicate { name, path: path.clone() });
                }
            }
        }
        Ok(Checkpoint { dir: dir.to_path_buf(), tensors, sidecar_mtp })
    }

    /// The layout, from the files' `format` metadata and the key names; never from dtypes.
    pub fn layout(&self) -> Layout {
        let any_mlx_meta = self.tensors.values().any(|t| t.file.mlx_format);
        let hf_keys = self.tensors.keys().any(|k| k.starts_with("model.language_model.") || k.starts_with("model.visual."));
        let conv_hf = self.tensors.iter().any(|(k, t)| k.ends_with("conv1d.weight") && t.shape.last() != Some(&1));
        if hf_keys || (conv_hf && !any_mlx_meta) {
            Layout::Hf
        } else {
            Layout::Mlx
        }
    }
}

fn open_shard(path: &Path) -> Result<Shard, LoadError> {
    let f = std::fs::File::open(path).map_err(|e| LoadError::io(path, e))?;
    // SAFETY: the file is mapped read-only; Tandem never writes model files in place (conversion
    // writes a new folder), so the mapping is not modified while it is used.
    let map = unsafe { Mmap::map(&f) }.map_err(|e| LoadError::io(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&map)
        .map_err(|e| LoadError::Safetensors { path: path.to_path_buf(), message: e.to_string() })?;
    let mlx_format = meta.metadata().as_ref().and_then(|m| m.get("format")).is_some_and(|f| f == "mlx");
    Ok(Shard { path: path.to_path_buf(), map, mlx_format })
}

fn read_header(shard: &Arc<Shard>) -> Result<Vec<(String, TensorRef)>, LoadError> {
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&shard.map)
        .map_err(|e| LoadError::Safetensors { path: shard.path.clone(), message: e.to_string() })?;
    let base = 8 + header_len;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let dtype = Dtype::from_safetensors_name(&format!("{:?}", info.dtype)).ok_or_else(|| LoadError::Safetensors {
            path: shard.path.clone(),
            message: format!("tensor `{name}` has unsupported dtype {:?}", info.dtype),
        })?;
        let shape: Vec<i32> = info.shape.iter().map(|&d| d as i32).collect();
        let (start, end) = (base + info.data_offsets.0, base + info.data_offsets.1);
        let n: usize = info.shape.iter().product();
        if end > shard.map.len() || end - start != n * dtype.size() {
            return Err(LoadError::Safetensors {
                path: shard.path.clone(),
                message: format!("tensor `{name}` runs past the end of the file (truncated?)"),
            });
        }
        out.push((name, TensorRef { file: shard.clone(), dtype, shape, start, end }));
    }
    Ok(out)
}
