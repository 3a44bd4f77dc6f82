//! Resolving `--model NAME|PATH` through models.toml, and loading a model with its tokenizer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tandem::chat::Tokenizer;
use tandem::model::{self, LoadOptions, Qwen35};
use tandem::registry::{ModelEntry, ModelSource, Registry};

/// models.toml: `$TANDEM_CONFIG`, else the user's `~/.tandem/models.toml`. Where the user has none yet,
/// it is written from the defaults (`./models.toml`, else the one beside the sources or the executable's
/// checkout), which are only read from then on; without a home folder, the defaults themselves.
pub fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TANDEM_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let user = std::env::var_os("HOME").map(|h| tandem::registry::user_config_path(Path::new(&h)));
    if let Some(user) = user.as_ref().filter(|u| u.is_file()) {
        return Some(user.clone());
    }
    let mut candidates =
        vec![PathBuf::from("models.toml"), PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models.toml")];
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).take(4).map(|d| d.join("models.toml")));
    }
    let defaults = candidates.into_iter().find(|p| p.is_file())?;
    let Some(user) = user else { return Some(defaults) };
    match tandem::registry::seed_user_config(&defaults, &user) {
        Ok(()) => {
            tracing::info!("wrote {} from {}", user.display(), defaults.display());
            Some(user)
        }
        Err(e) => {
            tracing::warn!("cannot write {} ({e}); using {} as it is", user.display(), defaults.display());
            Some(defaults)
        }
    }
}

pub fn registry() -> Result<Registry> {
    let path = config_path().context("models.toml not found (set TANDEM_CONFIG, or run from the Tandem folder)")?;
    Registry::load(&path).context("cannot load the models registry")
}

/// The registry entry for `--model` (a name or a folder), or the default model.
pub fn resolve(model: Option<&str>) -> Result<ModelEntry> {
    match (model, registry()) {
        (Some(m), Ok(reg)) => Ok(reg.resolve(m)?),
        (None, Ok(reg)) => Ok(reg.default_model()?),
        // Without models.toml a folder still works.
        (Some(m), Err(_)) if Path::new(m).join("config.json").exists() => Ok(ModelEntry::with_defaults(
            Path::new(m).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| m.to_string()),
            PathBuf::from(m),
            ModelSource::Path,
        )),
        (_, Err(e)) => Err(e),
    }
}

pub struct Loaded {
    pub entry: ModelEntry,
    pub model: Qwen35,
    pub tokenizer: Tokenizer,
}

pub fn load(model: Option<&str>) -> Result<Loaded> {
    let entry = resolve(model)?;
    let dir = &entry.path;
    let m = model::load(dir, &LoadOptions::default()).with_context(|| format!("loading {}", dir.display()))?;
    let tokenizer = Tokenizer::from_dir(dir).with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    Ok(Loaded { entry, model: m, tokenizer })
}
