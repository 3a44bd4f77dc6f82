//! Models on the Hugging Face Hub as this machine sees them: the catalogue with what fits here, a
//! repo's preview before it is downloaded (exact sizes, the head, the fit with the context's caches),
//! search, and grafting a raw checkpoint's MTP head onto a conversion that dropped it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use ts_rs::TS;

use super::catalog::{self, Fit};
use super::downloads::DownloadView;
use super::{Engine, EngineError, Result};
use crate::hub::{self, HubModel, Preview, RepoRef};
use crate::registry::CatalogEntry;

/// A catalogue entry as `GET /api/catalog` shows it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct CatalogView {
    #[serde(flatten)]
    #[ts(flatten)]
    pub entry: CatalogEntry,
    /// The weights' size estimated from the parameters (the preview gives the exact figure).
    pub estimated_bytes: u64,
    /// From the weights' estimate alone (the preview adds the context's caches).
    pub fit: Fit,
    /// The model of the models folder this repo was downloaded as, if it was.
    pub model: Option<String>,
}

/// `GET /api/hub/preview`: a repo before downloading it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct PreviewView {
    #[serde(flatten)]
    #[ts(flatten)]
    pub preview: Preview,
    /// Weights and the caches of the planned context, against this machine's memory.
    pub fit: Fit,
    pub memory_total: u64,
    /// What a person can do with it here, in a sentence.
    pub advice: String,
}

impl Engine {
    /// This machine's memory in bytes (0 when unknown).
    pub fn memory_total(&self) -> u64 {
        self.inner.live.memory().system_total_bytes
    }

    /// The catalogue, each entry with what fits this machine and whether it is here already.
    pub fn catalog(&self) -> Vec<CatalogView> {
        let registry = self.registry();
        let total = self.inner.live.memory().system_total_bytes;
        let models = registry.list();
        let cache = &self.inner.config.hub.cache;
        registry
            .catalog()
            .iter()
            .map(|e| {
                let estimated_bytes = e.estimated_bytes();
                let repo_dir = hub::repo_dir(cache, &e.repo).canonicalize().ok();
                let model = repo_dir.and_then(|dir| {
                    models
                        .iter()
                        .find(|m| m.path.canonicalize().is_ok_and(|p| p.starts_with(&dir)))
                        .map(|m| m.name.clone())
                });
                CatalogView {
                    entry: e.clone(),
                    estimated_bytes,
                    fit: catalog::fit(estimated_bytes, e.bits >= 16, total),
                    model,
                }
            })
            .collect()
    }

    /// What `r` holds and whether it fits this machine, read from the Hub without downloading weights.
    /// Blocking (network): call it off the async runtime.
    pub fn preview(&self, r: &RepoRef) -> Result<PreviewView> {
        let preview = hub::preview(&self.inner.config.hub, r).map_err(hub_error)?;
        let memory_total = self.inner.live.memory().system_total_bytes;
        let fit = match &preview.config {
            Some(config) => catalog::fit_for_config(preview.weight_bytes, config, memory_total),
            None => catalog::fit(preview.weight_bytes, !preview.quantized, memory_total),
        };
        let advice = advice(&preview, &fit, self.registry().catalog());
        Ok(PreviewView { preview, fit, memory_total, advice })
    }

    /// The Hub's repos whose names contain `query`. Blocking (network).
    pub fn search_hub(&self, query: &str) -> Result<Vec<HubModel>> {
        hub::search(&self.inner.config.hub, query, 30).map_err(hub_error)
    }

    /// The repo a head-less conversion came from: its card's `base_model`, else the catalogue's `base`
    /// of the repo it was downloaded from.
    pub fn base_of(&self, dir: &Path) -> Option<String> {
        base_of(dir, &self.inner.config.hub.cache, self.registry().catalog())
    }

    /// Fetches the MTP head of `from` (the raw checkpoint; default: [`Engine::base_of`] the model) and
    /// grafts it onto model `name`, a conversion without one, as a download job: only config.json and the
    /// weight files holding `mtp.*` are fetched; the result is the new model `<name>-mtp` in the models
    /// folder, probe-verified. Blocking (network): call it off the async runtime.
    pub fn graft(&self, name: &str, from: Option<RepoRef>) -> Result<DownloadView> {
        let registry = self.registry();
        let entry = registry.get(name).ok_or_else(|| EngineError::UnknownModel {
            name: name.to_owned(),
            known: registry.list().into_iter().map(|m| m.name).collect(),
        })?;
        let info = catalog::inspect_folder(&entry.path);
        if info.mtp_available {
            return Err(EngineError::InvalidRequest(format!("model `{name}` already has its MTP head")));
        }
        let from = match from {
            Some(r) => r,
            None => self
                .base_of(&entry.path)
                .and_then(|b| b.parse().ok())
                .ok_or_else(|| {
                    EngineError::InvalidRequest(format!(
                        "model `{name}` does not say which checkpoint it came from (no base_model in its README.md): name the raw repo to take the head from"
                    ))
                })?,
        };
        let preview = hub::preview(&self.inner.config.hub, &from).map_err(hub_error)?;
        if preview.head_files.is_empty() {
            let why = match preview.mtp_tensors {
                Some(_) => "its weights hold no `mtp.*` tensor".to_owned(),
                None => "its tensor names could not be read (no index, no readable header)".to_owned(),
            };
            return Err(EngineError::InvalidRequest(format!("{}: no MTP head to take: {why}", from.repo)));
        }
        let include = preview.head_download();
        let models_dir = registry.models_dir().to_path_buf();
        let dst = graft_destination(&models_dir, name)?;
        let body = entry.path.clone();
        let gate = self.compute_gate();
        let engine = self.clone_weak();
        let from_commit = RepoRef { repo: from.repo.clone(), revision: preview.commit.clone() };
        self.inner.downloads.start(
            self.inner.config.hub.clone(),
            super::downloads::DownloadRequest { repo: from_commit, include, graft_onto: Some(name.to_owned()) },
            self.inner.live.memory().system_total_bytes,
            move |pulled| {
                let opts = crate::quant::GraftOptions { force: false, gate };
                let report =
                    crate::quant::graft_head(&body, &pulled.snapshot, &dst, &opts).map_err(|e| e.to_string())?;
                tracing::info!(dst = %report.dst.display(), "{}", report.message);
                let model = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                Ok((model, dst))
            },
            move || {
                engine.with(|e| e.publish());
            },
        )
    }
}

/// The repo the conversion in `dir` came from: its card's `base_model`, else, for a folder of the Hub
/// cache (`models--ORG--NAME/snapshots/…`, where `tandem pull` puts it), the catalogue's `base` of that repo.
pub fn base_of(dir: &Path, hub_cache: &Path, catalogue: &[CatalogEntry]) -> Option<String> {
    if let Some(base) = catalog::card_base_model(dir) {
        return Some(base);
    }
    let cache = hub_cache.canonicalize().ok()?;
    let path = dir.canonicalize().ok()?;
    let folder = path.strip_prefix(&cache).ok()?.components().next()?.as_os_str().to_string_lossy().into_owned();
    let repo = folder.strip_prefix("models--")?.replacen("--", "/", 1);
    catalogue.iter().find(|e| e.repo.eq_ignore_ascii_case(&repo)).and_then(|e| e.base.clone())
}

/// `<models_dir>/<name>-mtp`, or `-mtp-2`, … when taken.
pub fn graft_destination(models_dir: &Path, name: &str) -> Result<PathBuf> {
    let base = format!("{name}-mtp");
    (1..100)
        .map(|i| models_dir.join(if i == 1 { base.clone() } else { format!("{base}-{i}") }))
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .ok_or_else(|| EngineError::InvalidRequest(format!("{}: every name {base}[-N] is taken", models_dir.display())))
}

/// A sentence on what `p` is and what to do with it here.
fn advice(p: &Preview, fit: &Fit, catalogue: &[CatalogEntry]) -> String {
    let fits = match (fit.fits, fit.recommended_bits) {
        (true, _) => "It runs on this machine as it is.".to_owned(),
        (false, Some(bits)) => {
            format!("Too large for this machine as it is: convert it to {bits} bits (or fewer) after the download.")
        }
        (false, None) => "Too large for this machine, even quantized.".to_owned(),
    };
    let base = p
        .base_model
        .clone()
        .or_else(|| catalogue.iter().find(|e| e.repo.eq_ignore_ascii_case(&p.repo)).and_then(|e| e.base.clone()));
    let head = match (p.mtp_tensors, p.format.as_deref()) {
        (Some(n), _) if n > 0 => "It carries its MTP head: MTP decoding works with it.".to_owned(),
        (Some(_), Some("mlx")) => match base {
            Some(b) => format!("It has no MTP head (its converter dropped it): after the download, get it from {b} (only the files that hold the head)."),
            None => "It has no MTP head (its converter dropped it): it decodes without MTP.".to_owned(),
        },
        (Some(_), _) => "It has no MTP head: it decodes without MTP.".to_owned(),
        (None, _) => "Whether it carries an MTP head is not known before the download.".to_owned(),
    };
    format!("{fits} {head}")
}

/// The Hub's errors as the engine's.
fn hub_error(e: hub::HubError) -> EngineError {
    EngineError::Hub(Arc::new(e))
}
