//! models.toml and the models folder: which models exist, where they live, and their settings.
//!
//! ```toml
//! models_dir = "~/.tandem/models"   # scanned for model folders; converted models go here
//! conversations_dir = "~/.tandem/conversations"   # optional; default: `conversations` beside models_dir
//! default = "tandem-tiny"
//! [[model]]
//! name = "tandem-tiny"
//! path = "assets/models/tandem-tiny"   # relative to this file's folder
//! mtp = { enabled = true, depth = 3 }
//! sampling = { temperature = 0.7, top_p = 0.95, max_tokens = 512 }
//! ```
//! Settings changed through [`Registry::update_settings`] are written back in place with `toml_edit`,
//! so the user's comments and layout survive, and atomically, so a crash never leaves half a file.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml_edit::{DocumentMut, InlineTable, Item, Table, TableLike};
use ts_rs::TS;

/// Where models live when models.toml does not say.
pub const DEFAULT_MODELS_DIR: &str = "~/.tandem/models";

/// The conversations folder's name beside the models folder when models.toml does not say.
pub const DEFAULT_CONVERSATIONS_DIR: &str = "conversations";

pub use crate::generate::MTP_DEPTHS;

pub mod app;
pub mod catalog;
pub use app::{api_key_problem, AppPatch, AppSettings, ContextPolicy, ServerSettings, Theme, UiSettings};
pub use catalog::CatalogEntry;

/// A place in models.toml: `path:line`, or the path alone where no line applies.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    pub path: PathBuf,
    pub line: Option<usize>,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}", self.path.display()),
            None => write!(f, "{}", self.path.display()),
        }
    }
}

// The OS errors are part of the messages and deliberately not `source`s: callers print the chain
// (`{e:#}`), which would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("cannot write {}: {error}", path.display())]
    Write { path: PathBuf, error: io::Error },
    /// TOML syntax, an unknown key or a value of the wrong type; `message` names the line and key.
    #[error("{}:{message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("{at}: model `{model}`: {field} = {value}: must be {expected}")]
    OutOfRange { at: Place, model: String, field: &'static str, value: String, expected: &'static str },
    /// An app-wide setting (`[server]`, `[ui]`, the folders) out of its range.
    #[error("{at}: {error}")]
    Setting { at: Place, error: SettingError },
    #[error("{field}: cannot use {} as a folder: {error}", path.display())]
    Folder { field: &'static str, path: PathBuf, error: io::Error },
    #[error("{at}: model `{name}`: {message}")]
    InvalidModel { at: Place, name: String, message: String },
    #[error("{at}: model `{name}` is defined twice{}", first_line.map(|l| format!(" (first at line {l})")).unwrap_or_default())]
    DuplicateName { at: Place, name: String, first_line: Option<usize> },
    #[error("{at}: default = \"{name}\" names no model (known: {})", known.join(", "))]
    UnknownDefault { at: Place, name: String, known: Vec<String> },
    #[error("no model named `{name}` and no model folder at that path (known: {})", known.join(", "))]
    UnknownModel { name: String, known: Vec<String> },
    #[error("{}: not a model folder (it needs config.json and *.safetensors)", path.display())]
    NotAModelFolder { path: PathBuf },
    /// A configured model whose folder is missing or holds no model (`problem` says which).
    #[error("{at}: model `{name}`: {} {problem}", path.display())]
    ModelPath { at: Place, name: String, path: PathBuf, problem: &'static str },
    #[error("{}: [[catalog]] entry `{repo}`: {message}", path.display())]
    InvalidCatalog { path: PathBuf, repo: String, message: String },
    #[error("{}: no model configured and none found in {}", path.display(), models_dir.display())]
    NoModels { path: PathBuf, models_dir: PathBuf },
}

type Result<T, E = RegistryError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct MtpSettings {
    pub enabled: bool,
    /// Drafts per cycle, within [`MTP_DEPTHS`].
    pub depth: u32,
    /// Whether the adaptive controller may park drafting that does not pay (off: every cycle drafts
    /// `depth` tokens, so acceptance figures do not depend on timing).
    pub adaptive: bool,
}

impl Default for MtpSettings {
    fn default() -> Self {
        Self { enabled: true, depth: 3, adaptive: true }
    }
}

/// How many generations of a model are decoded together (continuous batching), models.toml's
/// `batch = { max_streams = 4, max_tokens = 65536 }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct BatchSettings {
    /// Generations in one batch at most; 1 decodes one request at a time, in arrival order.
    pub max_streams: u32,
    /// The batch's budget: the sum over its generations of the prompt's tokens and `max_tokens`
    /// (what their caches may grow to). A request is admitted alone even when it is larger.
    pub max_tokens: u32,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self { max_streams: 4, max_tokens: 65_536 }
    }
}

impl BatchSettings {
    pub fn check(&self) -> Result<(), SettingError> {
        if !(1..=64).contains(&self.max_streams) {
            return Err(SettingError {
                field: "batch.max_streams",
                value: self.max_streams.to_string(),
                expected: "in 1..=64",
            });
        }
        if self.max_tokens == 0 {
            return Err(SettingError { field: "batch.max_tokens", value: "0".into(), expected: "1 or more" });
        }
        Ok(())
    }
}

/// A setting outside its range: `mtp.depth = 9: must be in 1..=8`. The one place the ranges of
/// models.toml's settings are checked, for the file, a settings change and a request alike.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} = {value}: must be {expected}")]
pub struct SettingError {
    pub field: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// `Err` naming the field, the value and the range unless `ok`.
fn in_range(field: &'static str, value: f32, ok: bool, expected: &'static str) -> Result<(), SettingError> {
    if ok {
        Ok(())
    } else {
        Err(SettingError { field, value: show(value), expected })
    }
}

/// A float as a person reads it: `1.5`, `0`, `1e-45` (not 45 zeros), `NaN`.
fn show(value: f32) -> String {
    if value.fract() == 0.0 && value.abs() < 1e16 {
        format!("{value}")
    } else {
        format!("{value:?}")
    }
}

/// "in " and [`MTP_DEPTHS_TEXT`] (a test keeps them together).
const DEPTHS_EXPECTED: &str = "in 1..=8";

impl MtpSettings {
    /// `depth` within [`MTP_DEPTHS`].
    pub fn check_depth(depth: u32) -> Result<(), SettingError> {
        if usize::try_from(depth).is_ok_and(|d| MTP_DEPTHS.contains(&d)) {
            Ok(())
        } else {
            Err(SettingError { field: "mtp.depth", value: depth.to_string(), expected: DEPTHS_EXPECTED })
        }
    }

    pub fn check(&self) -> Result<(), SettingError> {
        Self::check_depth(self.depth)
    }
}

/// The ranges of the sampling settings: wide enough for any real use, narrow enough that no value
/// turns the logits into infinities (a repetition penalty of 1e-45 divides them by almost zero).
impl SamplingSettings {
    pub fn check_temperature(v: f32) -> Result<(), SettingError> {
        in_range("sampling.temperature", v, (0.0..=10.0).contains(&v), "in [0, 10]")
    }
    pub fn check_top_p(v: f32) -> Result<(), SettingError> {
        in_range("sampling.top_p", v, v > 0.0 && v <= 1.0, "in (0, 1]")
    }
    pub fn check_min_p(v: f32) -> Result<(), SettingError> {
        in_range("sampling.min_p", v, (0.0..=1.0).contains(&v), "in [0, 1]")
    }
    pub fn check_repetition_penalty(v: f32) -> Result<(), SettingError> {
        in_range("sampling.repetition_penalty", v, (0.1..=10.0).contains(&v), "in [0.1, 10]")
    }
    pub fn check_max_tokens(v: u32) -> Result<(), SettingError> {
        if v >= 1 {
            Ok(())
        } else {
            Err(SettingError { field: "sampling.max_tokens", value: v.to_string(), expected: "1 or more" })
        }
    }

    /// Every setting in its range; the first that is not is the error.
    pub fn check(&self) -> Result<(), SettingError> {
        Self::check_temperature(self.temperature)?;
        Self::check_top_p(self.top_p)?;
        Self::check_min_p(self.min_p)?;
        Self::check_repetition_penalty(self.repetition_penalty)?;
        Self::check_max_tokens(self.max_tokens)
    }
}

/// Sampling defaults of a model. The neutral values turn a filter off: `top_k` 0, `min_p` 0,
/// `repetition_penalty` 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingSettings {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub max_tokens: u32,
}

impl Default for SamplingSettings {
    fn default() -> Self {
        Self { temperature: 0.7, top_p: 0.95, top_k: 0, min_p: 0.0, repetition_penalty: 1.0, max_tokens: 512 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// A `[[model]]` entry of models.toml.
    Configured,
    /// A folder found in `models_dir`.
    Scanned,
    /// A folder given by path, known to neither.
    Path,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelEntry {
    pub name: String,
    /// The model folder, absolute unless models.toml's own path was relative.
    pub path: PathBuf,
    pub source: ModelSource,
    pub mtp: MtpSettings,
    pub sampling: SamplingSettings,
    /// The prefix cache's byte cap while the model is loaded (0: off); None: the engine's default.
    pub prefix_cache_bytes: Option<u64>,
    pub batch: BatchSettings,
    /// The prefix cache's SSD tier; None: memory only.
    pub prefix_cache_disk: Option<PrefixCacheDisk>,
    /// The system prompt new chats with this model start with (the web UI's; API requests send their own).
    pub system_prompt: Option<String>,
}

/// models.toml's `prefix_cache_disk = { dir, cap_bytes, write_bytes_per_minute }` of a `[[model]]`:
/// the prefix cache's SSD tier (src/engine/prefix_cache/disk.rs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixCacheDisk {
    /// The folder, `~` expanded, relative to models.toml's folder. Models may share one.
    pub dir: PathBuf,
    /// The folder's hard cap in bytes: every file in it counts, whichever model wrote it.
    pub cap_bytes: u64,
    /// Bytes the tier may write per minute (a budget refilled continuously).
    pub write_bytes_per_minute: u64,
}

impl PrefixCacheDisk {
    /// The write budget when none is set: 2 GiB per minute.
    pub const DEFAULT_WRITE_BYTES_PER_MINUTE: u64 = 2 << 30;
    /// The least cap accepted: a smaller one would hold no snapshot of a real model.
    pub const MIN_CAP_BYTES: u64 = 1 << 20;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskSpec {
    dir: String,
    cap_bytes: u64,
    write_bytes_per_minute: Option<u64>,
}

impl ModelEntry {
    /// An entry with every setting at its default.
    pub fn with_defaults(name: String, path: PathBuf, source: ModelSource) -> Self {
        Self {
            name,
            path,
            source,
            mtp: MtpSettings::default(),
            sampling: SamplingSettings::default(),
            prefix_cache_bytes: None,
            batch: BatchSettings::default(),
            prefix_cache_disk: None,
            system_prompt: None,
        }
    }
}

/// A change of settings: what is `None` stays as it is. Deserializes from the same shape as
/// models.toml's entries, e.g. the JSON `{"mtp": {"depth": 2}, "sampling": {"temperature": 0.2}}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct SettingsPatch {
    #[ts(as = "Option<MtpPatch>", optional)]
    pub mtp: MtpPatch,
    #[ts(as = "Option<SamplingPatch>", optional)]
    pub sampling: SamplingPatch,
    /// The model's system prompt for new chats; an empty string removes it.
    #[ts(optional)]
    pub system_prompt: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
#[ts(optional_fields)]
pub struct MtpPatch {
    pub enabled: Option<bool>,
    pub depth: Option<u32>,
    pub adaptive: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
#[ts(optional_fields)]
pub struct SamplingPatch {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_tokens: Option<u32>,
}

impl SettingsPatch {
    /// The patch's values that have ranges, checked alone (the whole entry is checked again once
    /// the patch is applied).
    pub fn check(&self) -> Result<(), SettingError> {
        let s = &self.sampling;
        self.mtp.depth.map_or(Ok(()), MtpSettings::check_depth)?;
        s.temperature.map_or(Ok(()), SamplingSettings::check_temperature)?;
        s.top_p.map_or(Ok(()), SamplingSettings::check_top_p)?;
        s.min_p.map_or(Ok(()), SamplingSettings::check_min_p)?;
        s.repetition_penalty.map_or(Ok(()), SamplingSettings::check_repetition_penalty)?;
        s.max_tokens.map_or(Ok(()), SamplingSettings::check_max_tokens)
    }

    /// The patch as (table, key, value) edits of a `[[model]]` entry.
    fn edits(&self) -> Vec<(&'static str, &'static str, toml_edit::Value)> {
        let (m, s) = (&self.mtp, &self.sampling);
        let int = |x: u32| toml_edit::Value::from(i64::from(x));
        [
            ("mtp", "enabled", m.enabled.map(toml_edit::Value::from)),
            ("mtp", "depth", m.depth.map(int)),
            ("mtp", "adaptive", m.adaptive.map(toml_edit::Value::from)),
            ("sampling", "temperature", s.temperature.map(float)),
            ("sampling", "top_p", s.top_p.map(float)),
            ("sampling", "top_k", s.top_k.map(int)),
            ("sampling", "min_p", s.min_p.map(float)),
            ("sampling", "repetition_penalty", s.repetition_penalty.map(float)),
            ("sampling", "max_tokens", s.max_tokens.map(int)),
        ]
        .into_iter()
        .filter_map(|(table, key, value)| Some((table, key, value?)))
        .collect()
    }
}

/// An f32 as the TOML float a person would write: 0.7, not 0.699999988079071.
fn float(x: f32) -> toml_edit::Value {
    toml_edit::Value::from(x.to_string().parse::<f64>().unwrap_or(f64::from(x)))
}

// The file as written; `deny_unknown_fields` makes a misspelt key an error instead of a silent default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    models_dir: Option<String>,
    conversations_dir: Option<String>,
    default: Option<String>,
    #[serde(default)]
    model: Vec<EntrySpec>,
    /// Repos for the Download page's catalogue, besides (or replacing) the built-in ones.
    #[serde(default)]
    catalog: Vec<CatalogEntry>,
    #[serde(default)]
    server: ServerSettings,
    #[serde(default)]
    ui: UiSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntrySpec {
    name: String,
    path: String,
    #[serde(default)]
    mtp: MtpSettings,
    #[serde(default)]
    sampling: SamplingSettings,
    prefix_cache_bytes: Option<u64>,
    #[serde(default)]
    batch: BatchSettings,
    prefix_cache_disk: Option<DiskSpec>,
    system_prompt: Option<String>,
}

/// models.toml, loaded and validated, and the models folder it names.
#[derive(Debug, Clone)]
pub struct Registry {
    path: PathBuf,
    /// `models_dir` as written (e.g. with `~`), used for the paths of entries added for scanned models.
    models_dir_setting: String,
    models_dir: PathBuf,
    conversations_dir: PathBuf,
    default: Option<String>,
    configured: Vec<ModelEntry>,
    /// The line of each configured entry's `path`, for [`Registry::check_model_paths`].
    path_lines: Vec<Option<usize>>,
    /// The built-in catalogue with models.toml's `[[catalog]]` entries.
    catalog: Vec<CatalogEntry>,
    server: ServerSettings,
    ui: UiSettings,
}

impl Registry {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|error| RegistryError::Io { path: path.to_owned(), error })?;
        Self::parse(path, &text)
    }

    /// The models.toml this registry was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The folder scanned for models, `~` expanded.
    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    /// The catalogue of known repos: the built-in one with models.toml's `[[catalog]]` entries.
    pub fn catalog(&self) -> &[CatalogEntry] {
        &self.catalog
    }

    /// The folder of the server's saved conversations (one JSON file each), `~` expanded:
    /// `conversations_dir`, else `conversations` beside the models folder.
    pub fn conversations_dir(&self) -> &Path {
        &self.conversations_dir
    }

    /// Configured models in file order, then the model folders of `models_dir` by name; a configured
    /// entry hides a folder of the same name.
    pub fn list(&self) -> Vec<ModelEntry> {
        let mut models = self.configured.clone();
        for found in scan(&self.models_dir) {
            if !models.iter().any(|m| m.name == found.name) {
                models.push(found);
            }
        }
        models
    }

    pub fn get(&self, name: &str) -> Option<ModelEntry> {
        self.list().into_iter().find(|m| m.name == name)
    }

    /// A model by name, or by the path of a model folder (a configured entry for that folder keeps
    /// its settings).
    pub fn resolve(&self, name_or_path: &str) -> Result<ModelEntry> {
        let models = self.list();
        if let Some(model) = models.iter().find(|m| m.name == name_or_path) {
            return Ok(model.clone());
        }
        let path = expand_home(name_or_path);
        if !path.is_dir() {
            let known = models.into_iter().map(|m| m.name).collect();
            return Err(RegistryError::UnknownModel { name: name_or_path.to_owned(), known });
        }
        if !is_model_folder(&path) {
            return Err(RegistryError::NotAModelFolder { path });
        }
        let canonical = path.canonicalize().ok();
        if let Some(model) = models.iter().find(|m| m.path.canonicalize().ok() == canonical) {
            return Ok(model.clone());
        }
        Ok(ModelEntry::with_defaults(folder_name(&path), path, ModelSource::Path))
    }

    /// The `default` model, or else the first one listed.
    pub fn default_model(&self) -> Result<ModelEntry> {
        let models = self.list();
        let found = match &self.default {
            Some(name) => models.iter().find(|m| &m.name == name),
            None => models.first(),
        };
        match (found, &self.default) {
            (Some(model), _) => Ok(model.clone()),
            (None, Some(name)) => Err(self.unknown_default(name, &models, None)),
            (None, None) => {
                Err(RegistryError::NoModels { path: self.path.clone(), models_dir: self.models_dir.clone() })
            }
        }
    }

    /// Changes a model's settings and writes them to models.toml. The file is read again first, so
    /// edits made by hand since loading are kept; a scanned model gets its own `[[model]]` entry.
    /// Nothing is written unless the result is valid.
    pub fn update_settings(&mut self, name: &str, patch: &SettingsPatch) -> Result<ModelEntry> {
        // The patch's own values first: their error then names no line of a file not yet written.
        patch.check().map_err(|e| out_of_range(Place { path: self.path.clone(), line: None }, name, e))?;
        let text = std::fs::read_to_string(&self.path)
            .map_err(|error| RegistryError::Io { path: self.path.clone(), error })?;
        let current = Self::parse(&self.path, &text)?;
        let mut doc: DocumentMut = text.parse().map_err(|e| parse_error(&self.path, &text, e))?;
        if model_entry(&mut doc, name).is_none() {
            let scanned = current.get(name).filter(|m| m.source == ModelSource::Scanned);
            let Some(model) = scanned else {
                let known = current.list().into_iter().map(|m| m.name).collect();
                return Err(RegistryError::UnknownModel { name: name.to_owned(), known });
            };
            add_model_entry(&mut doc, name, &current.scanned_path_setting(&model));
        }
        let Some(entry) = model_entry(&mut doc, name) else {
            return Err(RegistryError::InvalidModel {
                at: Place { path: self.path.clone(), line: None },
                name: name.to_owned(),
                message: "`model` must be an array of tables to add an entry".into(),
            });
        };
        for (table, key, value) in patch.edits() {
            set_value(entry, table, key, value);
        }
        if let Some(prompt) = &patch.system_prompt {
            set_key(entry, "system_prompt", Some(prompt).filter(|p| !p.trim().is_empty()).map(|p| p.as_str().into()));
        }
        let text = doc.to_string();
        let updated = Self::parse(&self.path, &text)?;
        write_atomic(&self.path, &text)?;
        *self = updated;
        self.get(name).ok_or_else(|| RegistryError::UnknownModel { name: name.to_owned(), known: Vec::new() })
    }

    /// `[server]`: how `tandem serve` and the desktop app listen.
    pub fn server(&self) -> &ServerSettings {
        &self.server
    }

    /// Registers an existing model folder under `name` (default: the folder's name) as a new
    /// `[[model]]` entry of models.toml, keeping the file's comments. A folder already listed (by a
    /// configured entry or the models-folder scan) is returned as it is; a name that is taken, a
    /// folder that is not a model folder or an unwritable file is an error and writes nothing.
    pub fn add_model(&mut self, path: &Path, name: Option<&str>) -> Result<ModelEntry> {
        if !is_model_folder(path) {
            return Err(RegistryError::NotAModelFolder { path: path.to_owned() });
        }
        let canonical = path.canonicalize().map_err(|error| RegistryError::Io { path: path.to_owned(), error })?;
        if let Some(known) = self.list().into_iter().find(|m| m.path.canonicalize().ok().as_ref() == Some(&canonical)) {
            return Ok(known);
        }
        let name = name.map(str::trim).filter(|n| !n.is_empty()).map_or_else(|| folder_name(&canonical), str::to_owned);
        let text = std::fs::read_to_string(&self.path)
            .map_err(|error| RegistryError::Io { path: self.path.clone(), error })?;
        let current = Self::parse(&self.path, &text)?;
        if current.get(&name).is_some() {
            return Err(RegistryError::InvalidModel {
                at: Place { path: self.path.clone(), line: None },
                name,
                message: "the name is taken by another model; pick another name".into(),
            });
        }
        let mut doc: DocumentMut = text.parse().map_err(|e| parse_error(&self.path, &text, e))?;
        add_model_entry(&mut doc, &name, &canonical.to_string_lossy());
        let text = doc.to_string();
        let updated = Self::parse(&self.path, &text)?;
        if updated.get(&name).is_none() {
            return Err(RegistryError::InvalidModel {
                at: Place { path: self.path.clone(), line: None },
                name,
                message: "`model` must be an array of tables to add an entry".into(),
            });
        }
        write_atomic(&self.path, &text)?;
        *self = updated;
        self.get(&name).ok_or_else(|| RegistryError::UnknownModel { name, known: Vec::new() })
    }

    fn parse(path: &Path, text: &str) -> Result<Self> {
        let deserializer = toml_edit::de::Deserializer::parse(text).map_err(|e| parse_error(path, text, e))?;
        let spec: FileSpec =
            serde_path_to_error::deserialize(deserializer).map_err(|e| deserialize_error(path, text, e))?;

        // Spans for the messages of the checks below (the text parsed already, so this does too).
        let doc = toml_edit::Document::parse(text).ok();
        let line = |index: usize, key: &str| doc.as_ref().and_then(|d| entry_line(d, text, index, key));
        let at = |line: Option<usize>| Place { path: path.to_owned(), line };
        let base = path.parent().unwrap_or(Path::new(""));
        let models_dir_setting = spec.models_dir.unwrap_or_else(|| DEFAULT_MODELS_DIR.to_owned());
        let mut configured: Vec<ModelEntry> = Vec::new();
        let mut path_lines = Vec::new();
        for (index, entry) in spec.model.into_iter().enumerate() {
            validate(&entry).map_err(|(key, e)| match e {
                Invalid::Message(message) => {
                    RegistryError::InvalidModel { at: at(line(index, key)), name: entry.name.clone(), message }
                }
                Invalid::Range(e) => out_of_range(at(line(index, e.field)), &entry.name, e),
            })?;
            if let Some(first) = configured.iter().position(|m| m.name == entry.name) {
                return Err(RegistryError::DuplicateName {
                    at: at(line(index, "name")),
                    name: entry.name,
                    first_line: line(first, "name"),
                });
            }
            let model_path = base.join(expand_home(&entry.path));
            path_lines.push(line(index, "path"));
            configured.push(ModelEntry {
                name: entry.name,
                path: model_path,
                source: ModelSource::Configured,
                mtp: entry.mtp,
                sampling: entry.sampling,
                prefix_cache_bytes: entry.prefix_cache_bytes,
                batch: entry.batch,
                system_prompt: entry.system_prompt.filter(|p| !p.trim().is_empty()),
                prefix_cache_disk: entry.prefix_cache_disk.as_ref().map(|d| PrefixCacheDisk {
                    dir: base.join(expand_home(&d.dir)),
                    cap_bytes: d.cap_bytes,
                    write_bytes_per_minute: d
                        .write_bytes_per_minute
                        .unwrap_or(PrefixCacheDisk::DEFAULT_WRITE_BYTES_PER_MINUTE),
                }),
            });
        }
        for e in &spec.catalog {
            e.check().map_err(|message| RegistryError::InvalidCatalog {
                path: path.to_owned(),
                repo: e.repo.clone(),
                message,
            })?;
        }
        let catalog = catalog::merged(&spec.catalog);
        spec.server.check().map_err(|error| {
            let key = error.field.strip_prefix("server.").unwrap_or(error.field);
            let item = doc.as_ref().and_then(|d| d.as_table().get("server")).and_then(|t| t.as_table_like()?.get(key));
            RegistryError::Setting { at: at(item.and_then(|i| line_of(text, i.span()))), error }
        })?;
        let models_dir = base.join(expand_home(&models_dir_setting));
        let conversations_dir = match &spec.conversations_dir {
            Some(dir) if dir.trim().is_empty() => {
                return Err(RegistryError::Parse {
                    path: path.to_owned(),
                    message: " conversations_dir: the path is empty".into(),
                })
            }
            Some(dir) => base.join(expand_home(dir)),
            None => models_dir.parent().unwrap_or(&models_dir).join(DEFAULT_CONVERSATIONS_DIR),
        };
        let registry = Self {
            path: path.to_owned(),
            models_dir,
            conversations_dir,
            models_dir_setting,
            default: spec.default,
            configured,
            path_lines,
            catalog,
            server: spec.server,
            ui: spec.ui,
        };
        if let Some(name) = &registry.default {
            let models = registry.list();
            if !models.iter().any(|m| &m.name == name) {
                let line = doc.as_ref().and_then(|d| d.as_table().get("default")).and_then(|i| line_of(text, i.span()));
                return Err(registry.unknown_default(name, &models, line));
            }
        }
        Ok(registry)
    }

    fn unknown_default(&self, name: &str, models: &[ModelEntry], line: Option<usize>) -> RegistryError {
        let known = models.iter().map(|m| m.name.clone()).collect();
        RegistryError::UnknownDefault { at: Place { path: self.path.clone(), line }, name: name.to_owned(), known }
    }

    /// Fails on the first configured model whose folder is missing or is not a model folder,
    /// naming the line of its `path`: a server checks this when it starts, rather than answer a
    /// load of that model with an error much later.
    pub fn check_model_paths(&self) -> Result<()> {
        for (entry, line) in self.configured.iter().zip(&self.path_lines) {
            let problem = if !entry.path.exists() {
                "does not exist"
            } else if !is_model_folder(&entry.path) {
                "is not a model folder (it needs config.json and *.safetensors)"
            } else {
                continue;
            };
            return Err(RegistryError::ModelPath {
                at: Place { path: self.path.clone(), line: *line },
                name: entry.name.clone(),
                path: entry.path.clone(),
                problem,
            });
        }
        Ok(())
    }

    /// The `path` to write for a scanned model: under `models_dir` as the user wrote it, so that a
    /// `~` stays a `~`.
    fn scanned_path_setting(&self, model: &ModelEntry) -> String {
        format!("{}/{}", self.models_dir_setting.trim_end_matches('/'), folder_name(&model.path))
    }
}

/// The line (from 1) where a byte span starts.
fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> Option<usize> {
    let start = span?.start.min(text.len());
    Some(text.as_bytes()[..start].iter().filter(|&&b| b == b'\n').count() + 1)
}

/// A TOML error as "LINE: message", from the byte span the parser reports.
fn at_line(text: &str, span: Option<std::ops::Range<usize>>, message: &str) -> String {
    match line_of(text, span) {
        Some(line) => format!("{line}: {message}"),
        None => format!(" {message}"),
    }
}

/// The line of `key` (dotted: `sampling.top_p`) in the `index`th model entry, else of the entry's
/// name (a key left out, so at its default).
fn entry_line(doc: &toml_edit::Document<&str>, text: &str, index: usize, key: &str) -> Option<usize> {
    let entry: &dyn TableLike = match doc.as_table().get("model")? {
        Item::ArrayOfTables(tables) => tables.get(index)?,
        Item::Value(toml_edit::Value::Array(array)) => array.get(index)?.as_inline_table()?,
        _ => return None,
    };
    let item = lookup(entry, key).or_else(|| entry.get("name"))?;
    line_of(text, item.span())
}

fn lookup<'a>(table: &'a dyn TableLike, dotted: &str) -> Option<&'a Item> {
    let mut parts = dotted.split('.');
    let mut item = table.get(parts.next()?)?;
    for part in parts {
        item = item.as_table_like()?.get(part)?;
    }
    Some(item)
}

/// A type or key error as "LINE: KEY: message", e.g. "4: model[0].mtp.depth: invalid type: ...".
fn deserialize_error(
    path: &Path,
    text: &str,
    error: serde_path_to_error::Error<toml_edit::de::Error>,
) -> RegistryError {
    let mut key = error.path().to_string();
    let inner = error.into_inner();
    // The path of an unknown key ends with that key, which the message names already.
    if inner.message().starts_with("unknown field") {
        key = key.rsplit_once('.').map_or(".".into(), |(parent, _)| parent.to_owned());
    }
    let message = match key.as_str() {
        "." => inner.message().to_owned(),
        key => format!("{key}: {}", inner.message()),
    };
    RegistryError::Parse { path: path.to_owned(), message: at_line(text, inner.span(), &message) }
}

fn parse_error(path: &Path, text: &str, error: impl Into<toml_edit::TomlError>) -> RegistryError {
    let error = error.into();
    RegistryError::Parse { path: path.to_owned(), message: at_line(text, error.span(), error.message()) }
}

/// Why an entry is invalid: a message about a key, or a setting out of its range.
enum Invalid {
    Message(String),
    Range(SettingError),
}

/// Checks an entry; on failure, the key to point at and what is wrong.
fn validate(entry: &EntrySpec) -> Result<(), (&'static str, Invalid)> {
    if entry.name.trim().is_empty() {
        return Err(("name", Invalid::Message("the name is empty".into())));
    }
    if entry.path.trim().is_empty() {
        return Err(("path", Invalid::Message("the path is empty".into())));
    }
    if let Some(disk) = &entry.prefix_cache_disk {
        if disk.dir.trim().is_empty() {
            return Err(("prefix_cache_disk.dir", Invalid::Message("prefix_cache_disk.dir: the path is empty".into())));
        }
        if disk.cap_bytes < PrefixCacheDisk::MIN_CAP_BYTES {
            let e = SettingError {
                field: "prefix_cache_disk.cap_bytes",
                value: disk.cap_bytes.to_string(),
                expected: "at least 1048576 (1 MiB)",
            };
            return Err((e.field, Invalid::Range(e)));
        }
        if disk.write_bytes_per_minute == Some(0) {
            let e = SettingError {
                field: "prefix_cache_disk.write_bytes_per_minute",
                value: "0".into(),
                expected: "at least 1 (leave out prefix_cache_disk to turn the tier off)",
            };
            return Err((e.field, Invalid::Range(e)));
        }
    }
    entry
        .mtp
        .check()
        .and_then(|()| entry.sampling.check())
        .and_then(|()| entry.batch.check())
        .map_err(|e| (e.field, Invalid::Range(e)))
}

fn out_of_range(at: Place, model: &str, e: SettingError) -> RegistryError {
    RegistryError::OutOfRange { at, model: model.to_owned(), field: e.field, value: e.value, expected: e.expected }
}

/// The user's models.toml, `<home>/.tandem/models.toml`: where settings changed in the app, converted
/// models and added folders are saved.
pub fn user_config_path(home: &Path) -> PathBuf {
    home.join(".tandem").join("models.toml")
}

/// Writes the user's models.toml `user` from a defaults file (a checkout's models.toml) when it does not
/// exist yet: the same settings and models, relative paths made absolute against the defaults' folder, and
/// a header saying where it came from. From then on changes are written to `user` and the defaults file is
/// only read. Nothing is written unless the result loads.
pub fn seed_user_config(defaults: &Path, user: &Path) -> Result<()> {
    if user.is_file() {
        return Ok(());
    }
    let text =
        std::fs::read_to_string(defaults).map_err(|error| RegistryError::Io { path: defaults.to_owned(), error })?;
    Registry::parse(defaults, &text)?;
    let mut doc: DocumentMut = text.parse().map_err(|e| parse_error(defaults, &text, e))?;
    let base = folder_of(defaults);
    let absolute = |v: &str| -> Option<String> {
        let p = Path::new(v);
        (!v.starts_with('~') && p.is_relative()).then(|| base.join(p).to_string_lossy().into_owned())
    };
    // The value replaced, its comments kept.
    let rewrite = |item: Option<&mut Item>| {
        if let Some(v) = item.and_then(|i| i.as_value_mut()) {
            if let Some(new) = v.as_str().and_then(absolute) {
                let decor = v.decor().clone();
                *v = new.into();
                *v.decor_mut() = decor;
            }
        }
    };
    for key in ["models_dir", "conversations_dir"] {
        rewrite(doc.get_mut(key));
    }
    if let Some(models) = doc.get_mut("model").and_then(|m| m.as_array_of_tables_mut()) {
        for entry in models.iter_mut() {
            rewrite(entry.get_mut("path"));
        }
    }
    let header = format!(
        "# Your Tandem settings, first written from {} (which stays as it is): settings changed in the app,\n\
         # converted and added models are saved here.\n",
        defaults.display()
    );
    // The defaults' own opening comment speaks of the defaults file: the header replaces it.
    let body = doc.to_string();
    let body = body.trim_start_matches('\n').to_owned();
    let rest: String = {
        let mut lines = body.split_inclusive('\n').peekable();
        while lines.peek().is_some_and(|l| l.starts_with('#')) {
            lines.next();
        }
        lines.collect()
    };
    let text = format!("{header}{rest}");
    Registry::parse(user, &text)?;
    if let Some(dir) = user.parent() {
        std::fs::create_dir_all(dir).map_err(|error| RegistryError::Write { path: dir.to_owned(), error })?;
    }
    write_atomic(user, &text)
}

/// The absolute folder holding `file`, for a bare file name too ("models.toml", whose parent is
/// the empty path: the current folder). Relative paths written into a seeded user config are
/// resolved against it.
fn folder_of(file: &Path) -> PathBuf {
    let absolute = std::path::absolute(file).unwrap_or_else(|_| file.to_owned());
    let folder = absolute.parent().map(Path::to_owned).unwrap_or_default();
    folder.canonicalize().unwrap_or(folder)
}

/// `~` and `~/...` name the home folder, as in a shell.
fn expand_home(path: &str) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    match (path.strip_prefix('~'), home) {
        (Some(""), Some(home)) => home,
        (Some(rest), Some(home)) if rest.starts_with('/') => home.join(&rest[1..]),
        _ => PathBuf::from(path),
    }
}

fn folder_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// A folder with config.json and at least one .safetensors file.
pub fn is_model_folder(dir: &Path) -> bool {
    let has_weights = || {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| e.path().extension().is_some_and(|ext| ext == "safetensors"))
        })
    };
    dir.join("config.json").is_file() && has_weights()
}

/// The model folders directly inside `models_dir`, by name. A missing folder holds no models.
fn scan(models_dir: &Path) -> Vec<ModelEntry> {
    let entries = match std::fs::read_dir(models_dir) {
        Ok(entries) => entries,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("cannot scan {}: {e}", models_dir.display());
            }
            return Vec::new();
        }
    };
    let mut models: Vec<ModelEntry> = entries
        .flatten()
        .map(|e| e.path())
        // Dot-folders are never models: a conversion writes `.NAME.partial-*` beside its destination.
        .filter(|p| p.is_dir() && !folder_name(p).starts_with('.') && is_model_folder(p))
        .map(|p| ModelEntry::with_defaults(folder_name(&p), p, ModelSource::Scanned))
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    models
}

/// The `[[model]]` entry with this name (also when written as an inline array of inline tables).
fn model_entry<'d>(doc: &'d mut DocumentMut, name: &str) -> Option<&'d mut dyn TableLike> {
    let named = |t: &dyn TableLike| t.get("name").and_then(Item::as_str) == Some(name);
    match doc.get_mut("model")? {
        Item::ArrayOfTables(tables) => tables.iter_mut().find(|t| named(*t)).map(|t| t as &mut dyn TableLike),
        Item::Value(toml_edit::Value::Array(array)) => array
            .iter_mut()
            .filter_map(toml_edit::Value::as_inline_table_mut)
            .find(|t| named(*t))
            .map(|t| t as &mut dyn TableLike),
        _ => None,
    }
}

/// Appends a model entry with a name and a path, in the style the file already uses.
fn add_model_entry(doc: &mut DocumentMut, name: &str, path: &str) {
    match doc.entry("model").or_insert(Item::ArrayOfTables(Default::default())) {
        Item::ArrayOfTables(tables) => {
            let mut table = Table::new();
            table.insert("name", toml_edit::value(name));
            table.insert("path", toml_edit::value(path));
            tables.push(table);
        }
        Item::Value(toml_edit::Value::Array(array)) => {
            let mut table = InlineTable::new();
            table.insert("name", name.into());
            table.insert("path", path.into());
            array.push(table);
        }
        _ => {} // not a list of models: the caller reports it
    }
}

/// Sets `table.key` in a model entry, creating `table` as an inline table (the style of docs/ARCHITECTURE.md §4.4)
/// if needed. A replaced value keeps its surrounding whitespace and trailing comment.
fn set_value(entry: &mut dyn TableLike, table: &str, key: &str, mut value: toml_edit::Value) {
    let section = entry.entry(table).or_insert(Item::Value(InlineTable::new().into()));
    match section {
        Item::Value(toml_edit::Value::InlineTable(inline)) if !inline.contains_key(key) => {
            // The space before `}` belongs to the last value: hand it on to the new last one.
            if let Some((_, last)) = inline.iter_mut().last() {
                if let Some(suffix) = last.decor().suffix().cloned() {
                    last.decor_mut().set_suffix("");
                    value.decor_mut().set_suffix(suffix);
                }
            }
            inline.insert(key, value);
        }
        // Anything but a table was rejected when the file was parsed.
        other => {
            if let Some(table) = other.as_table_like_mut() {
                set_key(table, key, Some(value));
            }
        }
    }
}

/// Sets (or, with None, removes) `key` of a table, keeping a replaced value's spacing and comment.
fn set_key(table: &mut dyn TableLike, key: &str, value: Option<toml_edit::Value>) {
    let Some(mut value) = value else {
        table.remove(key);
        return;
    };
    match table.get_mut(key) {
        Some(Item::Value(old)) => {
            *value.decor_mut() = old.decor().clone();
            *old = value;
        }
        _ => {
            table.insert(key, Item::Value(value));
        }
    }
}

/// Replaces models.toml in one step (see [`crate::atomic_file::write_atomic`]).
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    crate::atomic_file::write_atomic(path, text.as_bytes())
        .map_err(|error| RegistryError::Write { path: path.canonicalize().unwrap_or_else(|_| path.to_owned()), error })
}

#[cfg(test)]
mod tests;
