//! Resolving `--model NAME|PATH` to a model folder, and loading it with its tokenizer.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tandem::chat::Tokenizer;
use tandem::model::{self, LoadOptions, Qwen35};

/// The bundled model's folder: next to the executable's repository checkout, or the current folder.
fn bundled() -> Option<PathBuf> {
    let rel = Path::new("assets/models/tandem-tiny");
    let mut candidates = vec![];
    if let Some(home) = std::env::var_os("TANDEM_HOME") {
        candidates.push(PathBuf::from(home).join(rel));
    }
    candidates.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel));
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).take(4).map(|d| d.join(rel)));
    }
    candidates.push(rel.to_path_buf());
    candidates.into_iter().find(|p| p.join("config.json").exists())
}

/// A model folder from a path, or the bundled model when none is given.
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    match model {
        None => bundled().context("the bundled model assets/models/tandem-tiny was not found (set TANDEM_HOME)"),
        Some(m) if Path::new(m).join("config.json").exists() => Ok(PathBuf::from(m)),
        Some(m) if Path::new(m).exists() => bail!("{m}: not a model folder (no config.json)"),
        Some(m) => bail!("model `{m}` not found: give a path to a model folder"),
    }
}

pub struct Loaded {
    pub dir: PathBuf,
    pub model: Qwen35,
    pub tokenizer: Tokenizer,
}

pub fn load(model: Option<&str>) -> Result<Loaded> {
    let dir = resolve(model)?;
    let m = model::load(&dir, &LoadOptions::default()).with_context(|| format!("loading {}", dir.display()))?;
    let tokenizer = Tokenizer::from_dir(&dir).with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    Ok(Loaded { dir, model: m, tokenizer })
}

/// The name shown for a model folder.
pub fn display_name(dir: &Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string())
}
