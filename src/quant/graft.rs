//! Grafting a raw checkpoint's MTP head onto an MLX conversion that dropped it (mlx-lm's converter drops
//! it): the head's tensors are copied as they are (raw `mtp.*` names, bf16, zero-centred norms) into an
//! `mtp.safetensors` beside links to the conversion's own files, config.json declares the head's layers,
//! and the loader's acceptance probe must pass before the folder appears. The conversion is never written
//! to; the result is a new folder whose weights are the conversion's files, linked.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::writer::{self, PartialDir};
use super::{ComputeGate, ConvertError};
use crate::model::mtp_head::probe::{self, ProbeReport};
use crate::model::qwen3_5::Config;
use crate::model::weights::{self, MTP_SIDECAR};

#[derive(Clone, Default)]
pub struct GraftOptions {
    /// Replace an existing destination.
    pub force: bool,
    /// How the probe's load shares MLX with the rest of the process (see [`ComputeGate`]).
    pub gate: ComputeGate,
}

/// What a graft wrote and measured.
#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct GraftReport {
    pub dst: PathBuf,
    /// The head's tensors copied.
    pub tensors: usize,
    pub head_bytes: u64,
    /// What the load-time probe measured of the grafted head.
    pub probe: Option<ProbeReport>,
    pub message: String,
}

/// The config fields a head must agree on with the body it is grafted onto.
const SHAPE: &[&str] = &[
    "hidden_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
];

/// Grafts the MTP head found in `head` (a raw checkpoint's folder: its config.json and at least the
/// weight files that hold `mtp.*`) onto the head-less conversion `body`, writing `dst`.
pub fn graft_head(body: &Path, head: &Path, dst: &Path, opts: &GraftOptions) -> Result<GraftReport, ConvertError> {
    let body_config = crate::model::read_config(body)?;
    let head_config = crate::model::read_config(head)?;
    let text = |c: &serde_json::Value| c.get("text_config").cloned().unwrap_or_else(|| c.clone());
    let (bt, ht) = (text(&body_config), text(&head_config));
    for field in SHAPE {
        if bt.get(field) != ht.get(field) {
            return Err(ConvertError::Mtp {
                path: head.to_path_buf(),
                message: format!(
                    "its model has {field} = {}, the model in {} has {}: not the checkpoint this conversion came from",
                    ht.get(field).map_or("nothing".into(), |v| v.to_string()),
                    body.display(),
                    bt.get(field).map_or("nothing".into(), |v| v.to_string())
                ),
            });
        }
    }
    let layers = ht.get("mtp_num_hidden_layers").and_then(|v| v.as_u64()).unwrap_or(0);
    if layers == 0 {
        return Err(ConvertError::Mtp {
            path: head.to_path_buf(),
            message: "config.json declares no MTP layers (mtp_num_hidden_layers): there is no head to graft".into(),
        });
    }
    let body_head = body_head_tensors(body)?;
    if body_head > 0 {
        return Err(ConvertError::Mtp {
            path: body.to_path_buf(),
            message: format!(
                "already carries {body_head} MTP tensors: nothing to graft (repair fixes a head that does not run)"
            ),
        });
    }

    let partial = PartialDir::create(dst)?;
    let (tensors, head_bytes) = copy_head(head, &partial.path.join(MTP_SIDECAR))?;
    link_files(body, &partial.path)?;
    let mut config = body_config;
    {
        let target = match config.get_mut("text_config") {
            Some(t) => t,
            None => &mut config,
        };
        if let Some(obj) = target.as_object_mut() {
            obj.insert("mtp_num_hidden_layers".into(), layers.into());
            if let Some(v) = ht.get("mtp_use_dedicated_embeddings") {
                obj.insert("mtp_use_dedicated_embeddings".into(), v.clone());
            }
        }
    }
    writer::write_json(&partial.path.join("config.json"), &config)?;
    // Config::from_json refuses what the loader would.
    Config::from_json(&config)?;

    let status = opts.gate.run(|| crate::model::load(&partial.path, &crate::model::LoadOptions::default()))?.mtp_status;
    if !status.loaded {
        return Err(ConvertError::Mtp {
            path: dst.to_path_buf(),
            message: format!(
                "the grafted head does not run: {}; nothing was kept",
                status.reason.unwrap_or_else(|| "the loader turned MTP off".into())
            ),
        });
    }
    if let Some(report) = &status.probe {
        probe::record(&mut config, report);
        writer::write_json(&partial.path.join("config.json"), &config)?;
    }
    partial.commit(opts.force)?;
    let measured = status.probe.as_ref().and_then(|p| p.acceptance.filter(|_| !p.inconclusive));
    let message = match measured {
        Some(a) => format!("MTP head grafted ({tensors} tensors); the probe measured {:.0}% acceptance", a * 100.0),
        None => format!("MTP head grafted ({tensors} tensors); the probe could not judge it on this model"),
    };
    Ok(GraftReport { dst: dst.to_path_buf(), tensors, head_bytes, probe: status.probe, message })
}

/// MTP tensors among the body's weights.
fn body_head_tensors(body: &Path) -> Result<usize, ConvertError> {
    let listing = weights::list_files(body)?;
    let mut n = 0;
    for file in &listing.files {
        let names = super::source::check_header(file)?;
        n += names.iter().filter(|k| weights::is_head_key(k)).count();
    }
    Ok(n)
}

/// The weight files of `head` that can hold its head: those its index maps `mtp.*` to (the others may
/// not have been downloaded), else every `*.safetensors` there.
fn head_files(head: &Path) -> Result<Vec<PathBuf>, ConvertError> {
    let index = head.join(weights::INDEX);
    if index.exists() {
        let text = crate::model::files::read_to_string(&index).map_err(|e| ConvertError::io(&index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ConvertError::Source { path: index.clone(), message: e.to_string() })?;
        let mut files: Vec<String> = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .into_iter()
            .flatten()
            .filter(|(t, _)| weights::is_head_key(t))
            .filter_map(|(_, f)| f.as_str().map(str::to_owned))
            .collect();
        files.sort();
        files.dedup();
        if files.iter().any(|f| Path::new(f).components().count() != 1 || f.contains("..")) {
            return Err(ConvertError::Source {
                path: index,
                message: "weight_map names a file outside the folder".into(),
            });
        }
        return Ok(files.into_iter().map(|f| head.join(f)).collect());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(head)
        .map_err(|e| ConvertError::io(head, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    Ok(found)
}

/// Copies every `mtp.*` tensor of `head`'s files into `out`, as stored; (tensors, bytes).
fn copy_head(head: &Path, out: &Path) -> Result<(usize, u64), ConvertError> {
    let files = head_files(head)?;
    let maps = files
        .iter()
        .map(|p| {
            super::source::check_header(p)?;
            let f = crate::model::files::open_regular(p).map_err(|e| ConvertError::io(p, e))?;
            // SAFETY: read-only map of a file we do not write; a file changed under us gives wrong
            // bytes, which the probe then refuses, never unsafety of our own.
            let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ConvertError::io(p, e))?;
            Ok((p.clone(), map))
        })
        .collect::<Result<Vec<_>, ConvertError>>()?;
    let mut views = Vec::new();
    for (path, map) in &maps {
        let st = safetensors::SafeTensors::deserialize(map)
            .map_err(|e| ConvertError::Source { path: path.clone(), message: e.to_string() })?;
        for (name, view) in st.tensors() {
            if !weights::is_head_key(&name) {
                continue;
            }
            if name.ends_with(".scales") || name.ends_with(".biases") {
                return Err(ConvertError::Tensor {
                    file: path.clone(),
                    tensor: name,
                    message: "the head is quantized: graft it from the raw (bf16) checkpoint".into(),
                });
            }
            views.push((name, view));
        }
    }
    if views.is_empty() {
        return Err(ConvertError::Mtp {
            path: head.to_path_buf(),
            message: format!("no `mtp.*` tensor in {} file(s): this checkpoint carries no MTP head", files.len()),
        });
    }
    views.sort_by(|a, b| a.0.cmp(&b.0));
    let bytes = views.iter().map(|(_, v)| v.data().len() as u64).sum();
    let n = views.len();
    safetensors::serialize_to_file(views, None, out).map_err(|e| ConvertError::Source {
        path: out.to_path_buf(),
        message: format!("cannot write the head: {e}"),
    })?;
    Ok((n, bytes))
}

/// Links each file of `body` (but its config.json and any head sidecar) into `dst`, by absolute path.
fn link_files(body: &Path, dst: &Path) -> Result<(), ConvertError> {
    for e in std::fs::read_dir(body).map_err(|e| ConvertError::io(body, e))?.flatten() {
        let name = e.file_name();
        if name == "config.json" || name == MTP_SIDECAR || !e.path().is_file() {
            continue;
        }
        let target = e.path().canonicalize().map_err(|err| ConvertError::io(&e.path(), err))?;
        let link = dst.join(&name);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&target, &link).map_err(|err| ConvertError::io(&link, err))?;
        #[cfg(not(unix))]
        std::fs::copy(&target, &link).map_err(|err| ConvertError::io(&link, err))?;
    }
    Ok(())
}
