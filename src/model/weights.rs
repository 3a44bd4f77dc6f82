//! Reading checkpoint tensors: memory-mapped safetensors files (single, sharded with an index, and an
//! `mtp.safetensors` sidecar), with the layout (raw Hugging Face or MLX conversion) they came in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use mlx::{Array, Dtype};

use super::LoadError;

/// Where a checkpoint came from, which decides its naming and norm conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, ts_rs::TS)]
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
    /// The safetensors metadata `format` (`"mlx"` from mlx-lm/mlx-vlm/Tandem, `"pt"` from PyTorch
    /// and transformers; absent from `mx.save_safetensors`).
    pub format: Option<String>,
}

impl Shard {
    /// The file name (for messages).
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// Whether this is an `mtp.safetensors` sidecar: a file of MTP tensors kept beside the model,
    /// outside its index (official releases put a raw head there; people re-attach heads that way).
    pub fn is_mtp_sidecar(&self) -> bool {
        self.path.file_name().is_some_and(|n| n == MTP_SIDECAR)
    }
}

/// The MTP sidecar's file name.
pub const MTP_SIDECAR: &str = "mtp.safetensors";

/// What decided a checkpoint's layout, for messages and `inspect`.
#[derive(Debug, Clone)]
pub struct LayoutEvidence {
    pub layout: Layout,
    /// One sentence naming the file and tensor (or metadata) that decided it.
    pub reason: String,
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
            .map_err(|e| LoadError::Mlx { context: format!("{}", self.file.path.display()), error: e })
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
    /// Opens the files [`list_files`] lists. With an index, every tensor it lists must be in the
    /// shard it names (an incomplete download fails here, naming the shard and the tensor).
    pub fn open(dir: &Path) -> Result<Checkpoint, LoadError> {
        let Listing { files, weight_map, sidecar_mtp } = list_files(dir)?;
        let index = dir.join(INDEX);
        let mut tensors = BTreeMap::new();
        for path in files {
            let shard = Arc::new(open_shard(&path)?);
            for (name, t) in read_header(&shard)? {
                if tensors.insert(name.clone(), t).is_some() {
                    return Err(LoadError::Duplicate { name, path: path.clone() });
                }
            }
        }
        for (tensor, file) in &weight_map {
            if tensors.get(tensor).is_none_or(|t: &TensorRef| t.file.path != dir.join(file)) {
                return Err(LoadError::MissingShard {
                    index: index.clone(),
                    shard: file.clone(),
                    message: format!("the index lists tensor `{tensor}` in it, but the file does not hold it (incomplete or mixed download?)"),
                });
            }
        }
        Ok(Checkpoint { dir: dir.to_path_buf(), tensors, sidecar_mtp })
    }

    /// The layout; see [`layout_evidence`](Self::layout_evidence).
    pub fn layout(&self) -> Result<Layout, LoadError> {
        self.layout_evidence().map(|e| e.layout)
    }

    /// Decides whether the body (the text model, without MTP head and vision tower) is a raw Hugging
    /// Face checkpoint (zero-centred norms) or an MLX conversion (norms shifted by +1), from facts
    /// that follow from how each was written, never from dtypes or weight statistics:
    /// 1. the Gated DeltaNet conv1d layout: PyTorch's `[C, 1, K]` in raw checkpoints, `[C, K, 1]`
    ///    after every MLX converter (mlx-lm and mlx-vlm decide their own +1 from exactly this);
    /// 2. the body's key prefixes (`model.language_model.*` raw, `language_model.model.*` MLX);
    ///    the flat `model.layers.*` of a text-only checkpoint says nothing by itself;
    /// 3. affine-quantized linears (`.scales` beside a packed `U32` weight): only MLX writes them;
    /// 4. the safetensors metadata `format` (`"mlx"` or `"pt"`).
    ///
    /// Facts 1 and 2 that contradict each other are an error naming both tensors.
    pub fn layout_evidence(&self) -> Result<LayoutEvidence, LoadError> {
        let at = |t: &TensorRef| t.file.name();
        let body = || self.tensors.iter().filter(|(k, _)| is_body_key(k));
        // 1. conv1d layout.
        let (mut conv_raw, mut conv_mlx) = (None, None);
        for (k, t) in body().filter(|(k, t)| k.ends_with("conv1d.weight") && t.shape.len() == 3) {
            if t.shape[1] == 1 && t.shape[2] != 1 {
                conv_raw.get_or_insert((k, t));
            } else if t.shape[2] == 1 && t.shape[1] != 1 {
                conv_mlx.get_or_insert((k, t));
            }
        }
        let conv = |(k, t): (&String, &TensorRef)| format!("{}: `{k}` has shape {:?}", at(t), t.shape);
        if let (Some(r), Some(m)) = (conv_raw, conv_mlx) {
            return Err(LoadError::Layout(format!(
                "{} (raw PyTorch layout [C, 1, K]) but {} (MLX layout [C, K, 1]): the files mix a raw checkpoint and an MLX conversion",
                conv(r),
                conv(m)
            )));
        }
        // 2. key prefixes.
        let raw_name = body().find(|(k, _)| k.starts_with("model.language_model."));
        let mlx_name = body().find(|(k, _)| k.starts_with("language_model."));
        if let (Some((a, ta)), Some((b, tb))) = (raw_name, mlx_name) {
            return Err(LoadError::Layout(format!(
                "{}: `{a}` is named as in a raw checkpoint but {}: `{b}` as in an MLX conversion",
                at(ta),
                at(tb)
            )));
        }
        let by_conv = conv_raw.map(|c| (Layout::Hf, c)).or(conv_mlx.map(|c| (Layout::Mlx, c)));
        if let Some((layout, c)) = by_conv {
            let contradiction = match layout {
                Layout::Hf => mlx_name,
                Layout::Mlx => raw_name,
            };
            if let Some((k, t)) = contradiction {
                return Err(LoadError::Layout(format!(
                    "{} ({} layout) but {}: `{k}` is named as in {}: a renamed file whose norm convention cannot be told",
                    conv(c),
                    if layout == Layout::Hf { "raw" } else { "MLX" },
                    at(t),
                    if layout == Layout::Hf { "an MLX conversion" } else { "a raw checkpoint" },
                )));
            }
            let what = if layout == Layout::Hf { "raw PyTorch layout [C, 1, K]" } else { "MLX layout [C, K, 1]" };
            return Ok(LayoutEvidence { layout, reason: format!("{} ({what})", conv(c)) });
        }
        if let Some((k, t)) = raw_name {
            return Ok(LayoutEvidence {
                layout: Layout::Hf,
                reason: format!("{}: `{k}` is named as in a raw checkpoint", at(t)),
            });
        }
        if let Some((k, t)) = mlx_name {
            return Ok(LayoutEvidence {
                layout: Layout::Mlx,
                reason: format!("{}: `{k}` is named as in an MLX conversion", at(t)),
            });
        }
        // 3. affine quantization.
        let quantized = body().find(|(k, t)| {
            k.ends_with(".weight")
                && t.dtype == Dtype::U32
                && self.tensors.contains_key(&format!("{}.scales", &k[..k.len() - ".weight".len()]))
        });
        if let Some((k, t)) = quantized {
            return Ok(LayoutEvidence {
                layout: Layout::Mlx,
                reason: format!("{}: `{k}` is affine-quantized (only MLX writes that)", at(t)),
            });
        }
        // 4. metadata.
        for (_, t) in body() {
            match t.file.format.as_deref() {
                Some("mlx") => {
                    return Ok(LayoutEvidence {
                        layout: Layout::Mlx,
                        reason: format!("{}: safetensors metadata format \"mlx\"", at(t)),
                    })
                }
                Some("pt") => {
                    return Ok(LayoutEvidence {
                        layout: Layout::Hf,
                        reason: format!("{}: safetensors metadata format \"pt\" (written by PyTorch)", at(t)),
                    })
                }
                _ => {}
            }
        }
        let example = body().next().map(|(k, t)| format!(" (e.g. {}: `{k}`)", at(t))).unwrap_or_default();
        Err(LoadError::Layout(format!(
            "{}: cannot tell a raw checkpoint from an MLX conversion{example}: no linear-attention conv1d weights, no \
             `model.language_model.*` or `language_model.*` names, no quantized tensors and no safetensors `format` metadata",
            self.dir.display()
        )))
    }
}

/// The index file of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// The files a checkpoint folder's tensors are read from, and what its index claims.
pub struct Listing {
    pub files: Vec<PathBuf>,
    /// The index's (tensor, file) pairs (empty without an index).
    pub weight_map: Vec<(String, String)>,
    /// An `mtp.safetensors` sidecar is among the files.
    pub sidecar_mtp: bool,
}

/// Lists `model.safetensors`, or the shards listed by `model.safetensors.index.json` (each a plain
/// file name that exists in the folder), or every `*.safetensors` in the folder; plus
/// `mtp.safetensors` when present. Opening them (`Checkpoint::open`, `source::check_header`)
/// refuses any that is not a regular file. The one listing of a checkpoint's files: the loader,
/// the converter and `inspect` read the same files.
pub fn list_files(dir: &Path) -> Result<Listing, LoadError> {
    let index = dir.join(INDEX);
    let mut weight_map: Vec<(String, String)> = Vec::new();
    let mut files: Vec<PathBuf> = if index.exists() {
        let text = super::files::read_to_string(&index).map_err(|e| LoadError::io(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| LoadError::Json { path: index.clone(), message: e.to_string() })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| LoadError::Json { path: index.clone(), message: "missing object `weight_map`".into() })?;
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| LoadError::Json {
                path: index.clone(),
                message: format!("weight_map: tensor `{tensor}` maps to {file}, not a file name"),
            })?;
            // Shards are plain file names inside the model folder.
            let plain = Path::new(file).components().count() == 1
                && matches!(Path::new(file).components().next(), Some(std::path::Component::Normal(_)));
            if !plain {
                return Err(LoadError::Json {
                    path: index.clone(),
                    message: format!(
                        "weight_map: tensor `{tensor}` maps to `{file}`, which is not a file in the model folder"
                    ),
                });
            }
            weight_map.push((tensor.clone(), file.to_string()));
        }
        let mut names: Vec<&str> = weight_map.iter().map(|(_, f)| f.as_str()).collect();
        names.sort();
        names.dedup();
        for name in &names {
            // Only absence is reported here; a listed name that is not a regular file (a FIFO, a
            // device) is refused by `open_shard`, naming what it is.
            if !dir.join(name).exists() {
                let example = weight_map.iter().find(|(_, f)| f == name).map(|(t, _)| t.as_str()).unwrap_or("?");
                let count = weight_map.iter().filter(|(_, f)| f == name).count();
                return Err(LoadError::MissingShard {
                    index: index.clone(),
                    shard: name.to_string(),
                    message: format!("the file is missing (it should hold {count} tensor(s), e.g. `{example}`)"),
                });
            }
        }
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
    let sidecar = dir.join(MTP_SIDECAR);
    let sidecar_mtp = sidecar.exists();
    if sidecar_mtp && !files.contains(&sidecar) {
        files.push(sidecar);
    }
    if files.is_empty() {
        return Err(LoadError::NoWeights(dir.to_path_buf()));
    }
    Ok(Listing { files, weight_map, sidecar_mtp })
}

/// The files of [`list_files`].
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    list_files(dir).map(|l| l.files)
}

/// A key of the MTP head (`mtp.*` under any of the prefixes `model.`, `language_model.` that
/// checkpoints put before it).
pub fn is_head_key(k: &str) -> bool {
    strip_prefixes(k).starts_with("mtp.")
}

fn strip_prefixes(k: &str) -> &str {
    let mut rest = k;
    while let Some(r) = rest.strip_prefix("model.").or_else(|| rest.strip_prefix("language_model.")) {
        rest = r;
    }
    rest
}

/// A key of the text body: not the MTP head, not the vision tower (under any of the prefixes
/// `model.`, `language_model.` that checkpoints put before them).
fn is_body_key(k: &str) -> bool {
    let rest = strip_prefixes(k);
    !(rest.starts_with("mtp.") || rest.starts_with("visual.") || rest.starts_with("vision_tower."))
}

fn open_shard(path: &Path) -> Result<Shard, LoadError> {
    // A FIFO named like a shard would block the open forever; a device has no end.
    let f = super::files::open_regular(path).map_err(|e| LoadError::io(path, e))?;
    // SAFETY: the file is mapped read-only; Tandem never writes model files in place (conversion
    // writes a new folder), so the mapping is not modified while it is used.
    let map = unsafe { Mmap::map(&f) }.map_err(|e| LoadError::io(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&map)
        .map_err(|e| LoadError::Safetensors { path: path.to_path_buf(), message: e.to_string() })?;
    let format = meta.metadata().as_ref().and_then(|m| m.get("format")).cloned();
    Ok(Shard { path: path.to_path_buf(), map, format })
}

fn read_header(shard: &Arc<Shard>) -> Result<Vec<(String, TensorRef)>, LoadError> {
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&shard.map)
        .map_err(|e| LoadError::Safetensors { path: shard.path.clone(), message: e.to_string() })?;
    let base = 8 + header_len;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let dtype =
            Dtype::from_safetensors_name(&format!("{:?}", info.dtype)).ok_or_else(|| LoadError::Safetensors {
                path: shard.path.clone(),
                message: format!("tensor `{name}` has unsupported dtype {:?}", info.dtype),
            })?;
        let bad = |message: String| LoadError::Safetensors {
            path: shard.path.clone(),
            message: format!("tensor `{name}` {message}"),
        };
        let shape: Vec<i32> = info
            .shape
            .iter()
            .map(|&d| i32::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| bad(format!("has shape {:?}, a dimension too large", info.shape)))?;
        let (Some(start), Some(end)) = (base.checked_add(info.data_offsets.0), base.checked_add(info.data_offsets.1))
        else {
            return Err(bad(format!("has data offsets {:?} past any file", info.data_offsets)));
        };
        let bytes = info.shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d));
        if end < start || bytes != Some(end - start) {
            return Err(bad(format!(
                "has data offsets {:?} that do not hold shape {:?} of {:?}",
                info.data_offsets, info.shape, info.dtype
            )));
        }
        if end > shard.map.len() {
            return Err(LoadError::Safetensors {
                path: shard.path.clone(),
                message: format!("tensor `{name}` runs past the end of the file (truncated?)"),
            });
        }
        out.push((name, TensorRef { file: shard.clone(), dtype, shape, start, end }));
    }
    Ok(out)
}
