//! What a repo holds, read before downloading it: the listing (sizes, the commit), config.json, and the
//! tensor names (from `model.safetensors.index.json`, or a lone weight file's safetensors header, read
//! with two Range requests). Enough to say whether it fits this machine, whether it carries an MTP head,
//! and which files hold that head — without fetching a byte of weights.

use std::io::Read;

use serde::Serialize;

use super::{agent, check_status, listing, request_range, resolve_url, HubConfig, HubError, RemoteFile, RepoRef};

/// A repo at a commit, as far as it can be known without its weights.
#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct Preview {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<RemoteFile>,
    pub total_bytes: u64,
    /// Bytes of the `*.safetensors` files.
    pub weight_bytes: u64,
    /// config.json declares a quantization (an MLX conversion, or another quantized format).
    pub quantized: bool,
    /// `hf` (raw names, `model.language_model.*`) or `mlx` (`language_model.model.*`); None when the
    /// names were not readable.
    pub format: Option<String>,
    /// config.json declares a vision tower.
    pub vision: bool,
    /// MTP layers config.json declares (`mtp_num_hidden_layers`).
    pub mtp_declared: u64,
    /// Tensors of an MTP head among the weights (None: the names were not readable).
    pub mtp_tensors: Option<usize>,
    /// The weight files that hold the head's tensors (what grafting it onto a conversion fetches).
    pub head_files: Vec<String>,
    /// The model card's `base_model`: for a conversion, the repo it came from.
    pub base_model: Option<String>,
    /// config.json as the repo has it (None when it has none, or it is not JSON).
    #[serde(skip)]
    #[ts(skip)]
    pub config: Option<serde_json::Value>,
}

impl Preview {
    /// What grafting the head fetches: config.json, the index if there is one, and the weight files that
    /// hold `mtp.*` (empty when no file holds the head).
    pub fn head_download(&self) -> Vec<String> {
        if self.head_files.is_empty() {
            return Vec::new();
        }
        let mut files = vec!["config.json".to_owned()];
        if self.files.iter().any(|f| f.path == crate::model::weights::INDEX) {
            files.push(crate::model::weights::INDEX.to_owned());
        }
        files.extend(self.head_files.iter().cloned());
        files
    }
}

/// The headers of at most this many weight files are read when a repo has no index.
const MAX_HEADERS: usize = 8;

pub fn preview(cfg: &HubConfig, r: &RepoRef) -> Result<Preview, HubError> {
    if cfg.offline {
        return Err(HubError::Offline { repo: r.repo.clone(), revision: r.revision.clone(), cache: cfg.cache.clone() });
    }
    let agent = agent();
    let l = listing(cfg, &agent, r)?;
    let has = |name: &str| l.files.iter().any(|f| f.path == name);
    let config = if has("config.json") {
        serde_json::from_slice::<serde_json::Value>(&small_file(cfg, &agent, r, &l.commit, "config.json")?).ok()
    } else {
        None
    };
    let weights: Vec<&RemoteFile> = l.files.iter().filter(|f| f.path.ends_with(".safetensors")).collect();
    // (tensor, file) pairs.
    let mut names: Option<Vec<(String, String)>> = None;
    if has(crate::model::weights::INDEX) {
        let bytes = small_file(cfg, &agent, r, &l.commit, crate::model::weights::INDEX)?;
        names = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| {
            let map = v.get("weight_map")?.as_object()?;
            Some(map.iter().filter_map(|(t, f)| Some((t.clone(), f.as_str()?.to_owned()))).collect())
        });
    } else if !weights.is_empty() && weights.len() <= MAX_HEADERS {
        let mut all = Vec::new();
        for f in &weights {
            let Some(keys) = header_names(cfg, &agent, r, &l.commit, f)? else {
                all.clear();
                break;
            };
            all.extend(keys.into_iter().map(|k| (k, f.path.clone())));
        }
        names = (!all.is_empty()).then_some(all);
    }
    let text = config.as_ref().map(|c| c.get("text_config").unwrap_or(c));
    let field = |k: &str| text.and_then(|t| t.get(k)).or_else(|| config.as_ref().and_then(|c| c.get(k)));
    let quantized =
        config.as_ref().is_some_and(|c| c.get("quantization").is_some() || c.get("quantization_config").is_some());
    let format = names.as_ref().and_then(|n| {
        if n.iter().any(|(t, _)| t.starts_with("language_model.")) {
            Some("mlx".to_owned())
        } else if n.iter().any(|(t, _)| t.starts_with("model.language_model.") || t.starts_with("model.layers.")) {
            Some("hf".to_owned())
        } else {
            None
        }
    });
    let head: Vec<&(String, String)> =
        names.iter().flatten().filter(|(t, _)| crate::model::weights::is_head_key(t)).collect();
    let mut head_files: Vec<String> = head.iter().map(|(_, f)| f.clone()).collect();
    head_files.sort();
    head_files.dedup();
    Ok(Preview {
        repo: r.repo.clone(),
        revision: r.revision.clone(),
        commit: l.commit.clone(),
        total_bytes: l.files.iter().map(|f| f.size).sum(),
        weight_bytes: weights.iter().map(|f| f.size).sum(),
        quantized,
        format,
        vision: config.as_ref().is_some_and(|c| c.get("vision_config").is_some()),
        mtp_declared: field("mtp_num_hidden_layers").and_then(|v| v.as_u64()).unwrap_or(0),
        mtp_tensors: names.as_ref().map(|_| head.len()),
        head_files,
        base_model: l.base_model,
        files: l.files,
        config,
    })
}

/// A small file of the repo (config, index) read into memory, within the cap a model folder allows it.
fn small_file(
    cfg: &HubConfig,
    agent: &ureq::Agent,
    r: &RepoRef,
    commit: &str,
    path: &str,
) -> Result<Vec<u8>, HubError> {
    let url = resolve_url(cfg, &r.repo, commit, path);
    let mut res = request_range(cfg, agent, &url, 0, None)?;
    check_status(cfg, r, &url, res.status().as_u16())?;
    let cap = crate::model::files::size_cap(std::path::Path::new(path));
    res.body_mut()
        .with_config()
        .limit(cap)
        .read_to_vec()
        .map_err(|e| HubError::Network { url: url.clone(), message: e.to_string() })
}

/// The tensor names of a safetensors file on the Hub, from its header alone (8 bytes of length, then
/// the JSON header). None when the server does not answer ranges or the header is not one.
fn header_names(
    cfg: &HubConfig,
    agent: &ureq::Agent,
    r: &RepoRef,
    commit: &str,
    f: &RemoteFile,
) -> Result<Option<Vec<String>>, HubError> {
    const MAX_HEADER: u64 = 16 << 20;
    let url = resolve_url(cfg, &r.repo, commit, &f.path);
    let read = |from: u64, len: u64| -> Result<Option<Vec<u8>>, HubError> {
        let mut res = request_range(cfg, agent, &url, from, Some(from + len - 1))?;
        check_status(cfg, r, &url, res.status().as_u16())?;
        if res.status().as_u16() != 206 {
            return Ok(None);
        }
        let mut buf = Vec::new();
        res.body_mut()
            .as_reader()
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|e| HubError::Network { url: url.clone(), message: e.to_string() })?;
        Ok((buf.len() as u64 == len).then_some(buf))
    };
    let Some(head) = read(0, 8)? else { return Ok(None) };
    let n = u64::from_le_bytes(head.try_into().unwrap_or([0; 8]));
    if n == 0 || n > MAX_HEADER || 8 + n > f.size {
        return Ok(None);
    }
    let Some(json) = read(8, n)? else { return Ok(None) };
    let v: serde_json::Value = match serde_json::from_slice(&json) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    Ok(v.as_object().map(|m| m.keys().filter(|k| *k != "__metadata__").cloned().collect()))
}
