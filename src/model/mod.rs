//! Models: checkpoint reading, strict loading, and one file per architecture.

pub mod files;
pub mod launch;
pub mod layers;
pub mod mtp_head;
pub mod parallel;
pub mod qwen3_5;
pub mod store;
pub mod vision;
pub mod vision_input;
pub mod weights;

use std::path::{Path, PathBuf};

use mlx::Dtype;
use thiserror::Error;

pub use qwen3_5::Qwen35;
pub use weights::Layout;

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("the load was cancelled")]
    Cancelled,
    // The cause is part of the message and not also a `source`, or a chain printed whole (the CLI's
    // `{:#}`) would say it twice.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: invalid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("{}: lists shard `{shard}`: {message}", index.display())]
    MissingShard { index: PathBuf, shard: String, message: String },
    #[error("checkpoint layout: {0}")]
    Layout(String),
    #[error("{0}: no *.safetensors files found")]
    NoWeights(PathBuf),
    #[error("{}: missing config.json", .0.display())]
    NoConfig(PathBuf),
    #[error("config.json: {0}")]
    Config(String),
    #[error("unknown model_type `{0}` (supported: qwen3_5, qwen3_5_text)")]
    UnknownModelType(String),
    #[error("tensor `{name}` appears twice ({path})")]
    Duplicate { name: String, path: PathBuf },
    #[error("tensors `{a}` and `{b}` map to the same parameter")]
    Conflict { a: String, b: String },
    #[error("missing tensor `{0}`")]
    Missing(String),
    #[error("{}: tensor `{name}` has shape {actual:?}, expected {expected:?}", file.display())]
    Shape { name: String, file: PathBuf, actual: Vec<i32>, expected: Vec<i32> },
    #[error("unexpected tensors not used by the model: {}", .0.join(", "))]
    Unexpected(Vec<String>),
    #[error("tensor `{name}`: {message}")]
    Quantization { name: String, message: String },
    #[error("{context}: {error}")]
    Mlx { context: String, error: mlx::Error },
    #[error("{tensor} holds {what}: the file is corrupt or the weights diverged, and the model would answer nothing")]
    NotFinite { tensor: String, what: &'static str },
}

impl LoadError {
    pub(crate) fn io(path: &Path, error: std::io::Error) -> LoadError {
        LoadError::Io { path: path.to_path_buf(), error }
    }
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Cast floating weights to this dtype (None keeps the checkpoint's).
    pub dtype: Option<Dtype>,
    /// Measure the MTP head before trusting it (`mtp_head::probe`): on by default; off only where
    /// the head will not run (a strict check of a folder, calibration).
    pub probe: bool,
    /// Set from another thread to stop the load at its next layer (an unload of a model still
    /// loading, a load past its deadline): the load then fails with [`LoadError::Cancelled`].
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Load only this rank's share of the model (`model::parallel`: its heads of every layer, or its
    /// pipeline stage's layers); None: the whole model.
    pub parallel: Option<parallel::Parallel>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { dtype: None, probe: true, cancel: None, parallel: None }
    }
}

impl LoadOptions {
    /// `Err(Cancelled)` once [`LoadOptions::cancel`] is set.
    pub fn check_cancelled(&self) -> Result<(), LoadError> {
        match &self.cancel {
            Some(c) if c.load(std::sync::atomic::Ordering::SeqCst) => Err(LoadError::Cancelled),
            _ => Ok(()),
        }
    }
}

/// Reads `config.json` of a model folder.
pub fn read_config(dir: &Path) -> Result<serde_json::Value, LoadError> {
    let path = dir.join("config.json");
    if !dir.is_dir() {
        return Err(LoadError::io(dir, std::io::Error::new(std::io::ErrorKind::NotFound, "model folder not found")));
    }
    if !path.exists() {
        return Err(LoadError::NoConfig(dir.to_path_buf()));
    }
    let text = files::read_to_string(&path).map_err(|e| LoadError::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| LoadError::Json { path, message: e.to_string() })
}

/// What a rank of a split model loads, as a digest: its config.json, the dtype it casts to and the
/// split. Ranks that would build different graphs (another model, dtype or split) have different
/// identities, and are refused before they meet in the model's collectives (`engine::lockstep`).
pub fn identity(dir: &Path, opts: &LoadOptions) -> Result<String, LoadError> {
    use sha2::{Digest, Sha256};
    let config = read_config(dir)?;
    let split = opts.parallel.as_ref().map(|p| p.split().to_string()).unwrap_or_default();
    let digest = Sha256::digest(format!("{config}\n{:?}\n{split}", opts.dtype).as_bytes());
    Ok(digest.iter().take(12).map(|b| format!("{b:02x}")).collect())
}

/// Loads the model in `dir`, choosing the architecture from `model_type`.
pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Qwen35, LoadError> {
    let config = read_config(dir)?;
    let model_type = config.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
    match model_type {
        "qwen3_5" | "qwen3_5_text" => Qwen35::load(dir, &config, opts),
        other => Err(LoadError::UnknownModelType(other.to_string())),
    }
}
