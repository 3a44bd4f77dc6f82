//! Opening a model folder to convert, inspect or repair: its config, every tensor under its canonical
//! name with its provenance, and up-front validation (headers, truncation, the loader's strict check)
//! so that a bad input fails before anything is written, with the file and tensor named.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use mlx::Dtype;

use super::ConvertError;
use crate::model::qwen3_5::{self, Config};
use crate::model::store::Provenance;
use crate::model::weights::{self, Checkpoint, TensorRef};
use crate::model::{self, Layout, LoadOptions};

/// One stored tensor.
pub struct SourceTensor {
    /// The key in the file.
    pub key: String,
    /// The loader's canonical name.
    pub name: String,
    pub provenance: Provenance,
    pub tensor: TensorRef,
}

impl SourceTensor {
    pub fn file(&self) -> &Path {
        &self.tensor.file.path
    }
    pub fn nbytes(&self) -> u64 {
        self.tensor.bytes().len() as u64
    }
}

pub struct Source {
    pub dir: PathBuf,
    pub config: serde_json::Value,
    pub model: Config,
    pub layout: Layout,
    /// Sorted by canonical name.
    pub tensors: Vec<SourceTensor>,
    by_name: BTreeMap<String, usize>,
}

impl Source {
    /// Opens `dir` and checks its headers; `strict` also runs the model loader's check of the
    /// tensor set (every tensor present with its shape, nothing unexpected).
    pub fn open(dir: &Path, strict: bool) -> Result<Source, ConvertError> {
        if !dir.is_dir() {
            return Err(ConvertError::Source { path: dir.to_path_buf(), message: "not a folder".into() });
        }
        let config = model::read_config(dir)?;
        let model_type = config.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
        if !matches!(model_type, "qwen3_5" | "qwen3_5_text") {
            return Err(ConvertError::UnknownModelType {
                path: dir.join("config.json"),
                model_type: model_type.to_string(),
            });
        }
        let mut model = Config::from_json(&config)
            .map_err(|e| ConvertError::Source { path: dir.join("config.json"), message: e.to_string() })?;
        for file in weights::weight_files(dir)? {
            check_header(&file)?;
        }
        let ckpt = Checkpoint::open(dir)?;
        let layout = ckpt.layout()?;
        let mut tensors: Vec<SourceTensor> = ckpt
            .tensors
            .into_iter()
            .map(|(key, tensor)| {
                let (name, provenance) = qwen3_5::sanitize(&key, layout);
                SourceTensor { key, name, provenance, tensor }
            })
            .collect();
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        model.resolve_tie(tensors.iter().any(|t| t.name == "lm_head.weight"));
        let mut by_name = BTreeMap::new();
        for (i, t) in tensors.iter().enumerate() {
            if let Some(j) = by_name.insert(t.name.clone(), i) {
                return Err(ConvertError::Source {
                    path: dir.to_path_buf(),
                    message: format!("tensors `{}` and `{}` are the same parameter", tensors[j].key, t.key),
                });
            }
        }
        if strict {
            // The loader's strictness: a missing, unexpected or mis-shaped tensor names itself. Loading
            // is lazy (memory-mapped), so this reads little more than the headers.
            model::load(dir, &LoadOptions { probe: false, ..Default::default() })?;
        }
        Ok(Source { dir: dir.to_path_buf(), config, model, layout, tensors, by_name })
    }

    pub fn get(&self, name: &str) -> Option<&SourceTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Quantized modules (those with a `.scales` tensor), as canonical module names.
    pub fn quantized_modules(&self) -> Vec<String> {
        self.tensors.iter().filter_map(|t| t.name.strip_suffix(".scales").map(str::to_string)).collect()
    }

    /// Total bytes of tensor data.
    pub fn bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes()).sum()
    }

    /// The mean of a stored tensor, in f32.
    pub fn mean(&self, name: &str) -> Result<f32, ConvertError> {
        let t = self.get(name).ok_or_else(|| ConvertError::Source {
            path: self.dir.clone(),
            message: format!("missing tensor `{name}`"),
        })?;
        let a = t.tensor.to_array()?;
        a.as_dtype(Dtype::F32)
            .and_then(|a| a.mean(&[], false))
            .and_then(|m| m.item::<f32>())
            .map_err(|e| ConvertError::Mlx { context: format!("{}: tensor `{}`", t.file().display(), t.key), error: e })
    }
}

/// Checks a safetensors file's header against its length, naming the first tensor that does not fit
/// (a truncated download) or the field that is malformed; returns the tensors' names.
pub fn check_header(path: &Path) -> Result<Vec<String>, ConvertError> {
    let bad = |message: String| ConvertError::Source { path: path.to_path_buf(), message };
    let mut f = crate::model::files::open_regular(path).map_err(|e| ConvertError::io(path, e))?;
    let len = f.metadata().map_err(|e| ConvertError::io(path, e))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| bad(format!("not a safetensors file: only {len} bytes")))?;
    let header_len = u64::from_le_bytes(n);
    if header_len > 100 << 20 || 8 + header_len > len {
        return Err(bad(format!(
            "not a safetensors file: header of {header_len} bytes in a file of {len} bytes (truncated?)"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(|e| ConvertError::io(path, e))?;
    let v: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("safetensors header is not valid JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| bad("safetensors header is not a JSON object".into()))?;
    let data_len = len - 8 - header_len;
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    for (name, info) in obj {
        if name == "__metadata__" {
            continue;
        }
        let tensor_err =
            |message: String| ConvertError::Tensor { file: path.to_path_buf(), tensor: name.clone(), message };
        let dtype = info.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| tensor_err("no dtype".into()))?;
        let dt = Dtype::from_safetensors_name(dtype).ok_or_else(|| tensor_err(format!("unsupported dtype {dtype}")))?;
        let shape: Vec<u64> = info
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|s| s.iter().map(|d| d.as_u64()).collect())
            .ok_or_else(|| tensor_err("malformed shape".into()))?;
        let offsets: Vec<u64> = info
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|s| s.iter().map(|d| d.as_u64()).collect())
            .filter(|o: &Vec<u64>| o.len() == 2)
            .ok_or_else(|| tensor_err("malformed data_offsets".into()))?;
        let (start, end) = (offsets[0], offsets[1]);
        let want = shape.iter().try_fold(dt.size() as u64, |a, &d| a.checked_mul(d));
        if end < start || want != Some(end - start) {
            return Err(tensor_err(format!("data_offsets [{start}, {end}] do not hold shape {shape:?} of {dtype}")));
        }
        if end > data_len {
            return Err(tensor_err(format!(
                "runs past the end of the file: its data ends at byte {} but the file has {len} bytes (truncated?)",
                8 + header_len + end
            )));
        }
        spans.push((start, end, name));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(ConvertError::Tensor {
                file: path.to_path_buf(),
                tensor: w[1].2.to_string(),
                message: format!("overlaps tensor `{}`", w[0].2),
            });
        }
    }
    Ok(spans.into_iter().map(|(_, _, name)| name.to_owned()).collect())
}
