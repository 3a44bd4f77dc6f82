//! The running service behind the server, the CLI's interactive chat and the desktop shell.
//!
//! Each loaded model lives on its own worker thread, which owns the [`Qwen35`] (MLX arrays are used
//! from one thread at a time) and runs one generation at a time from a FIFO queue. A request is
//! tokenized and checked when it is submitted, so that a bad request fails at once; its results
//! stream back as [`Event`]s on a tokio channel. A generation stops when its [`CancelHandle`] is
//! cancelled or its receiver is dropped. Live statistics are published as [`StatsSnapshot`]s.
//!
//! Nothing here knows about HTTP.

pub mod catalog;
pub mod conversations;
pub mod downloads;
pub mod faults;
pub mod images;
pub mod jobs;
pub mod live;
pub mod lockstep;
pub mod options;
pub mod prefix_cache;
pub mod remote;
pub mod stop;
mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use ts_rs::TS;

use crate::chat::{ChatOptions, ContentPart, Message, Tokenizer};
use crate::generate::{FinishReason, Prompt, Stats};
use crate::model::{LoadOptions, Qwen35};
use crate::registry::{ModelEntry, Registry, RegistryError, SettingsPatch};
use crate::sync::lock;

pub use catalog::{FolderInfo, QuantizationSummary};
pub use conversations::{ConversationCore, ConversationError, ConversationStore, ConversationSummary};
pub use images::ImageLimits;
pub use jobs::{Job, JobEvent, JobStatus, JobView, Jobs};
pub use live::{LastGeneration, LoadedModel, Memory, RunningGeneration, SeriesPoint, StatsSnapshot, Totals};
pub use options::{generate_options, MtpOverrides, Overrides, SamplingOverrides};

/// The cause of an [`EngineError`], shared so that an error can travel to every listener of a
/// generation.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A cause that is only a message (a panic, a thread that could not start).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ErrorMessage(pub String);

/// The cause of `e`, for the `#[source]` of an [`EngineError`].
pub fn cause(e: impl std::error::Error + Send + Sync + 'static) -> Cause {
    Arc::new(e)
}

/// Errors of the engine. Each names the model, value or limit involved; those with a cause keep it
/// as their `source` ([`EngineError::message`] is the error and its cause in one line).
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("no model named `{name}` (known: {})", known.join(", "))]
    UnknownModel { name: String, known: Vec<String> },
    #[error("model `{0}` is not loaded")]
    NotLoaded(String),
    #[error("model `{model}` is busy: {limit} requests are already waiting; try again later")]
    Busy { model: String, limit: usize },
    #[error("model `{model}` needs about {} of memory (its weights, and the caches of a context of up to {} tokens) but only {} is available; unload another model or use a smaller quantization", gib(*.need), catalog::PLANNED_CONTEXT, gib(*.available))]
    NotEnoughMemory { model: String, need: u64, available: u64 },
    #[error("cannot load model `{model}`")]
    Load {
        model: String,
        #[source]
        source: Cause,
    },
    /// Images sent to a model that cannot read them.
    #[error("{0}")]
    Images(String),
    /// An image that cannot be decoded or used (the message names it: `image #2: ...`).
    #[error("{0}")]
    InvalidImage(String),
    #[error("model `{model}` is busy: its waiting requests already hold {} of decoded images (limit {}), and this one adds {}; try again later", mib(*.held), mib(*.limit), mib(*.bytes))]
    ImagesBusy { model: String, bytes: u64, held: u64, limit: u64 },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the prompt has {prompt} tokens and {max_tokens} more were asked for, but model `{model}` has a context of {context} tokens")]
    ContextLength { model: String, prompt: usize, max_tokens: usize, context: usize },
    /// Refused before tokenizing: even at the vocabulary's longest token, this much text is more
    /// tokens than the context holds.
    #[error("the prompt is {bytes} bytes of text, more than model `{model}` can read: its context of {context} tokens holds at most {limit} bytes (its longest token is {token_bytes} bytes)")]
    PromptTooLarge { model: String, bytes: usize, limit: usize, context: usize, token_bytes: usize },
    #[error("too many conversions: {limit} (the most at once) are already queued or running; wait for one to end or cancel one")]
    ConversionsBusy { limit: usize },
    #[error("model `{0}` was unloaded before the request finished")]
    Unloaded(String),
    #[error("registry")]
    Registry(#[source] Cause),
    /// A settings change that models.toml's rules refuse (a value out of range).
    #[error("{0}")]
    InvalidSettings(String),
    #[error("generation failed")]
    Generate(#[source] Cause),
    /// The Hugging Face Hub refused or could not answer (the message names the repo and why).
    #[error("{0}")]
    Hub(Arc<crate::hub::HubError>),
    #[error("internal error: {0}")]
    Internal(String),
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    /// The error and its cause, as one line: `cannot load model `m`: config.json: ...`.
    pub fn message(&self) -> String {
        match std::error::Error::source(self) {
            Some(cause) => format!("{self}: {cause}"),
            None => self.to_string(),
        }
    }
}

impl From<RegistryError> for EngineError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::UnknownModel { name, known } => EngineError::UnknownModel { name, known },
            e @ (RegistryError::OutOfRange { .. }
            | RegistryError::InvalidModel { .. }
            | RegistryError::Setting { .. }
            | RegistryError::UnknownDefault { .. }
            | RegistryError::Folder { .. }) => EngineError::InvalidSettings(e.to_string()),
            other => EngineError::Registry(cause(other)),
        }
    }
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Requests that may wait behind the running one, per model; one more is refused with
    /// [`EngineError::Busy`].
    pub queue_limit: usize,
    /// Refuse to load a model that would not fit in the available memory.
    pub memory_check: bool,
    pub load_options: LoadOptions,
    /// How large, how many and how much memory the images of requests may be.
    pub images: ImageLimits,
    /// Overrides every model's `mtp.adaptive` (`tandem serve --adaptive on|off`).
    pub adaptive: Option<bool>,
    /// Conversion jobs queued or running at once; one more is refused with
    /// [`EngineError::ConversionsBusy`].
    pub max_conversions: usize,
    /// A load still running after this long is cancelled and reported (the service keeps
    /// answering; the load's thread stops at its next layer).
    pub load_timeout: std::time::Duration,
    /// Where downloads come from and go ([`Engine::pull`]); from the environment by default.
    pub hub: crate::hub::HubConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            queue_limit: 16,
            memory_check: true,
            load_options: LoadOptions::default(),
            images: ImageLimits::default(),
            adaptive: None,
            max_conversions: jobs::DEFAULT_MAX_CONVERSIONS,
            load_timeout: std::time::Duration::from_secs(600),
            hub: crate::hub::HubConfig::from_env(),
        }
    }
}

/// One part of a message: text, or an image's encoded bytes (PNG, JPEG, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Image(Image),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub bytes: Vec<u8>,
    /// The media type when the client stated one (`image/png`).
    pub media_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    pub parts: Vec<Part>,
    /// The calls an assistant turn made.
    pub tool_calls: Vec<crate::chat::tools::ToolCall>,
}

impl ChatMessage {
    pub fn text(role: impl Into<String>, text: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), parts: vec![Part::Text(text.into())], tool_calls: Vec::new() }
    }
}

/// What the model reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A conversation, rendered with the model's chat template (ending with an assistant header).
    Chat(Vec<ChatMessage>),
    /// Plain text fed as it is (completion), without the chat template.
    Raw(String),
    /// Token ids fed as they are.
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// A model name known to the registry (or loaded by [`Engine::load_entry`]).
    pub model: String,
    pub input: Input,
    pub sampling: SamplingOverrides,
    /// None: the model's `max_tokens` setting, shortened to fit the context.
    pub max_tokens: Option<usize>,
    /// Generation stops when the text contains one of these; it is cut from the output.
    pub stop: Vec<String>,
    pub mtp: MtpOverrides,
    /// Passed to the chat template when set (Qwen3 templates read `enable_thinking`).
    pub enable_thinking: Option<bool>,
    /// Keep generating past end-of-sequence tokens, up to `max_tokens` (benchmarks, tests).
    pub ignore_eos: bool,
    /// What the output must match (constrained decoding), if anything.
    pub grammar: Option<crate::generate::GrammarSpec>,
    /// The functions the model may call (rendered into the prompt; a required call is forced).
    pub tools: Option<crate::chat::tools::ToolUse>,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
}

/// A generated token's log-probability ([`crate::generate::TokenLogprob`]) with its text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Logprob {
    pub token: TokenText,
    pub logprob: f32,
    /// The most likely tokens at its position, most likely first.
    pub top: Vec<(TokenText, f32)>,
}

/// What a token spells: its bytes, and as text (lossy where the bytes are part of a character).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenText {
    pub text: String,
    pub bytes: Vec<u8>,
}

impl Request {
    pub fn new(model: impl Into<String>, input: Input) -> Self {
        Request {
            model: model.into(),
            input,
            sampling: SamplingOverrides::default(),
            max_tokens: None,
            stop: Vec::new(),
            mtp: MtpOverrides::default(),
            enable_thinking: None,
            ignore_eos: false,
            grammar: None,
            tools: None,
            logprobs: None,
        }
    }
}

/// What a generation sends back, in order: `Started`, any number of `Delta`s, then `Done` or `Failed`.
#[derive(Debug, Clone)]
// `Done` is the large one and comes once per generation; boxing it would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// The request left the queue and its prompt is being read.
    Started,
    /// New text (possibly empty while a character or a possible stop sequence is incomplete) and
    /// the token ids generated since the last delta; a few times a second, the running statistics.
    Delta {
        text: String,
        tokens: Vec<u32>,
        stats: Option<Stats>,
        /// One per token, when asked for.
        logprobs: Vec<Logprob>,
    },
    Done(Completion),
    Failed(EngineError),
}

/// The end of a generation.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// The whole text, without the stop sequence.
    pub text: String,
    /// Generated token ids (up to the one that completed a stop sequence).
    pub tokens: Vec<u32>,
    pub stats: Stats,
    pub finish: FinishReason,
    /// The stop sequence that ended the text, if one did.
    pub stop: Option<String>,
    /// One per token, when asked for.
    pub logprobs: Vec<Logprob>,
}

/// Cancels a queued or running generation.
#[derive(Debug, Clone, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A submitted request: its events, and a handle to cancel it. Dropping it cancels the generation.
pub struct Generation {
    pub id: u64,
    pub model: String,
    pub prompt_tokens: usize,
    /// The `max_tokens` in force after defaults.
    pub max_tokens: usize,
    pub events: mpsc::UnboundedReceiver<Event>,
    cancel: CancelHandle,
}

impl Generation {
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Waits for the end and returns the completion.
    pub async fn collect(mut self) -> Result<Completion> {
        while let Some(event) = self.events.recv().await {
            match event {
                Event::Done(c) => return Ok(c),
                Event::Failed(e) => return Err(e),
                Event::Started | Event::Delta { .. } => {}
            }
        }
        Err(EngineError::Internal(format!("the worker of model `{}` ended without an answer", self.model)))
    }

    /// [`Generation::collect`] for code outside an async runtime.
    pub fn blocking_collect(mut self) -> Result<Completion> {
        while let Some(event) = self.events.blocking_recv() {
            match event {
                Event::Done(c) => return Ok(c),
                Event::Failed(e) => return Err(e),
                Event::Started | Event::Delta { .. } => {}
            }
        }
        Err(EngineError::Internal(format!("the worker of model `{}` ended without an answer", self.model)))
    }
}

/// A model's state in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum LoadState {
    Unloaded,
    Loading,
    Loaded,
}

/// MTP as `/api/models` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct MtpStatusView {
    /// The files hold a complete MTP head (once loaded: the head loaded).
    pub available: bool,
    /// The setting (models.toml).
    pub enabled: bool,
    pub depth: u32,
    /// Why MTP cannot run, when it cannot.
    pub reason: Option<String>,
    /// Set when the loader repaired the head's norm convention.
    pub repaired: Option<String>,
    /// The setting (models.toml): whether the adaptive controller may park drafting.
    pub adaptive: bool,
    /// The head's health as measured: the load-time probe once loaded, else what the last
    /// conversion recorded in config.json (None: never measured).
    pub probe: Option<crate::model::mtp_head::probe::ProbeReport>,
}

/// A model as the admin API lists it (`GET /api/models/{id}`, and each of `GET /api/models`).
#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct ModelStatus {
    pub id: String,
    pub name: String,
    pub path: PathBuf,
    /// "configured" (models.toml), "scanned" (found in the models folder) or "path".
    pub source: crate::registry::ModelSource,
    /// "hf" or "mlx"; null when the folder could not be read (`error` says why).
    pub format: Option<crate::model::Layout>,
    /// Bytes of the weight files.
    pub size_bytes: u64,
    /// config.json's quantization, summarized; null for full-precision weights.
    pub quantization: Option<QuantizationSummary>,
    pub dtype: Option<String>,
    pub vision: bool,
    pub context_length: Option<u64>,
    /// The raw repo a conversion came from (its card's `base_model`, or the catalogue's): where a head it
    /// lacks can be grafted from.
    pub base_model: Option<String>,
    pub state: LoadState,
    pub loaded: bool,
    pub default: bool,
    pub mtp: MtpStatusView,
    pub sampling: crate::registry::SamplingSettings,
    /// The system prompt the web UI starts new chats with.
    pub system_prompt: Option<String>,
    /// Why the folder cannot be read, when it cannot.
    pub error: Option<String>,
}

/// Held while MLX computes (a generation, which yields it between tokens; a load; a unit of a
/// conversion): MLX is process-wide state, and two threads never drive it at once, whichever engine
/// they belong to. Fair: whoever lets go hands it to the thread that has waited longest, so a
/// conversion that takes it again after each tensor cannot keep a waiting chat out.
static COMPUTE: parking_lot::FairMutex<()> = parking_lot::const_fair_mutex(());

/// Takes the MLX lock.
pub(crate) fn compute_lock() -> parking_lot::FairMutexGuard<'static, ()> {
    COMPUTE.lock()
}

/// The MLX lock as a conversion's gate (see [`Engine::compute_gate`]).
fn compute_gate() -> crate::quant::ComputeGate {
    crate::quant::ComputeGate::new(|| Box::new(compute_lock()))
}

struct Inner {
    config: EngineConfig,
    registry: RwLock<Registry>,
    workers: Mutex<BTreeMap<String, Arc<worker::Worker>>>,
    /// Models being loaded now.
    /// Models being loaded, each with the flag that cancels its load.
    loading: Mutex<BTreeMap<String, Arc<AtomicBool>>>,
    /// Serializes loads, so that each memory check sees the previous load's result.
    load_lock: Mutex<()>,
    next_id: AtomicU64,
    live: live::Live,
    jobs: Jobs,
    /// Re-pointed when the Settings page changes the conversations folder.
    conversations: RwLock<Arc<ConversationStore>>,
    /// Folders outside the models folder that the person chose (a native dialog, a drop on the
    /// window, a confirmation in the UI) for this run: conversions may read them.
    chosen: Mutex<Vec<PathBuf>>,
    downloads: downloads::Downloads,
}

/// The engine: cheap to clone, shared by every caller.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    pub fn new(registry: Registry, config: EngineConfig) -> Engine {
        // A conversion killed before it finished leaves its temporary folder (and, mid-`force`, the
        // destination it had moved aside) in the models folder: cleaned, or put back, at the next start.
        crate::quant::writer::sweep(registry.models_dir());
        let jobs = Jobs::new(config.max_conversions);
        Engine {
            inner: Arc::new(Inner {
                config,
                conversations: RwLock::new(Arc::new(ConversationStore::new(
                    registry.conversations_dir().to_path_buf(),
                ))),
                registry: RwLock::new(registry),
                workers: Mutex::default(),
                loading: Mutex::default(),
                load_lock: Mutex::new(()),
                next_id: AtomicU64::new(1),
                live: live::Live::new(),
                jobs,
                chosen: Mutex::default(),
                downloads: downloads::Downloads::default(),
            }),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// A copy of the registry as it is now.
    pub fn registry(&self) -> Registry {
        self.inner.registry.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A model known to the registry, by name (never by path: names are what clients may send).
    pub fn entry(&self, name: &str) -> Result<ModelEntry> {
        if let Some(w) = lock(&self.inner.workers).get(name) {
            let entry = w.entry();
            if entry.source == crate::registry::ModelSource::Path {
                return Ok(entry);
            }
        }
        let registry = self.registry();
        registry.get(name).ok_or_else(|| EngineError::UnknownModel {
            name: name.to_owned(),
            known: registry.list().into_iter().map(|m| m.name).collect(),
        })
    }

    /// The registry's default model's name.
    pub fn default_model(&self) -> Result<String> {
        Ok(self.registry().default_model()?.name)
    }

    /// Names of the loaded models.
    pub fn loaded(&self) -> Vec<String> {
        lock(&self.inner.workers).keys().cloned().collect()
    }

    pub fn is_loaded(&self, name: &str) -> bool {
        lock(&self.inner.workers).contains_key(name)
    }

    /// Every model of the registry, plus loaded ones it does not list, with what their folders
    /// hold. Reads config.json and the safetensors headers: call from a blocking context.
    pub fn models(&self) -> Vec<ModelStatus> {
        let registry = self.registry();
        let default = registry.default_model().ok().map(|m| m.name);
        let mut entries = registry.list();
        for w in lock(&self.inner.workers).values() {
            let entry = w.entry();
            if !entries.iter().any(|e| e.name == entry.name) {
                entries.push(entry);
            }
        }
        entries.into_iter().map(|e| self.status_of(e, default.as_deref())).collect()
    }

    /// One model's status (blocking, like [`Engine::models`]).
    pub fn model_status(&self, name: &str) -> Result<ModelStatus> {
        let entry = self.entry(name)?;
        let default = self.registry().default_model().ok().map(|m| m.name);
        Ok(self.status_of(entry, default.as_deref()))
    }

    fn status_of(&self, entry: ModelEntry, default: Option<&str>) -> ModelStatus {
        let info = catalog::inspect_folder(&entry.path);
        let worker = lock(&self.inner.workers).get(&entry.name).cloned();
        let state = if worker.is_some() {
            LoadState::Loaded
        } else if lock(&self.inner.loading).contains_key(&entry.name) {
            LoadState::Loading
        } else {
            LoadState::Unloaded
        };
        let (available, reason, repaired, probe) = match &worker {
            Some(w) => {
                let m = &w.info.mtp;
                (m.loaded, m.reason.clone(), m.repaired.clone(), m.probe.clone())
            }
            None => (info.mtp_available, info.mtp_reason.clone(), None, info.mtp_probe.clone()),
        };
        ModelStatus {
            id: entry.name.clone(),
            name: entry.name.clone(),
            path: entry.path.clone(),
            source: entry.source,
            format: info.format,
            size_bytes: info.size_bytes,
            quantization: info.quantization,
            dtype: info.dtype,
            // Once loaded: whether the vision tower loaded (a text-only conversion keeps vision_config).
            vision: worker.as_ref().map_or(info.vision, |w| w.info.vision),
            context_length: info.context_length,
            base_model: self.base_of(&entry.path),
            state,
            loaded: worker.is_some(),
            default: default == Some(entry.name.as_str()),
            mtp: MtpStatusView {
                available,
                enabled: entry.mtp.enabled,
                depth: entry.mtp.depth,
                reason,
                repaired,
                adaptive: entry.mtp.adaptive,
                probe,
            },
            sampling: entry.sampling,
            system_prompt: entry.system_prompt,
            error: info.error,
        }
    }

    /// Loads a registry model by name (no-op when loaded). Blocks: use [`Engine::load`] from async code.
    pub fn load_blocking(&self, name: &str) -> Result<()> {
        let entry = self.entry(name)?;
        self.load_entry_blocking(entry)
    }

    /// Loads the model of an entry, e.g. one that [`Registry::resolve`] found by path (the CLI's
    /// `--model PATH`). It is known by `entry.name` from then on.
    pub fn load_entry_blocking(&self, entry: ModelEntry) -> Result<()> {
        let inner = &self.inner;
        let _serial = lock(&inner.load_lock);
        if self.is_loaded(&entry.name) {
            return Ok(());
        }
        if inner.config.memory_check {
            self.check_memory(&entry)?;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        lock(&inner.loading).insert(entry.name.clone(), cancel.clone());
        self.publish();
        let result = worker::Worker::spawn(entry.clone(), &inner.config, self.clone_weak(), cancel.clone());
        lock(&inner.loading).remove(&entry.name);
        let worker = result?;
        // Unloaded while it was loading (after the last point where the loader looks): freed at once.
        if cancel.load(Ordering::SeqCst) {
            worker.close();
            worker.join();
            self.publish();
            return Err(EngineError::Load {
                model: entry.name.clone(),
                source: cause(crate::model::LoadError::Cancelled),
            });
        }
        tracing::info!(model = %entry.name, path = %entry.path.display(), mtp = worker.info.mtp.loaded, "model loaded");
        lock(&inner.workers).insert(entry.name.clone(), Arc::new(worker));
        self.publish();
        Ok(())
    }

    fn check_memory(&self, entry: &ModelEntry) -> Result<()> {
        fits_in_memory(&entry.name, catalog::folder_need(&entry.path), self.inner.live.memory().system_available_bytes)
    }

    /// Loads a model on a blocking thread; the async runtime keeps running.
    pub async fn load(&self, name: &str) -> Result<()> {
        let (engine, name) = (self.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || engine.load_blocking(&name))
            .await
            .map_err(|e| EngineError::Internal(format!("the loading task failed: {e}")))?
    }

    /// Unloads a model: queued requests fail with [`EngineError::Unloaded`], the running one is
    /// cancelled, and the call returns once the worker has freed the model. False when it was not loaded.
    pub fn unload_blocking(&self, name: &str) -> bool {
        // A model still loading: its load is cancelled (it stops at its next layer and fails).
        if let Some(cancel) = lock(&self.inner.loading).get(name) {
            cancel.store(true, Ordering::SeqCst);
            tracing::info!(model = %name, "load cancelled");
            return true;
        }
        let Some(worker) = lock(&self.inner.workers).remove(name) else {
            return false;
        };
        worker.close();
        worker.join();
        {
            let _compute = compute_lock();
            mlx::device::clear_cache();
        }
        tracing::info!(model = %name, "model unloaded");
        self.publish();
        true
    }

    pub async fn unload(&self, name: &str) -> Result<bool> {
        let (engine, name) = (self.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || engine.unload_blocking(&name))
            .await
            .map_err(|e| EngineError::Internal(format!("the unloading task failed: {e}")))
    }

    /// Unloads every model, then waits for MLX's work still in flight (a worker's step started ahead of a
    /// cancelled request), so a process exiting next never runs MLX's static destructors beside it.
    pub fn shutdown(&self) {
        for name in self.loaded() {
            self.unload_blocking(&name);
        }
        if let Err(e) = mlx::device::synchronize() {
            tracing::warn!("waiting for MLX's work at shutdown: {e}");
        }
    }

    /// Changes a model's settings and persists them to models.toml (atomically, through the registry).
    pub fn update_settings_blocking(&self, name: &str, patch: &SettingsPatch) -> Result<ModelEntry> {
        patch.check().map_err(|e| EngineError::InvalidSettings(e.to_string()))?;
        if patch.mtp.enabled == Some(true) {
            // Switching MTP on for a model that cannot run it is refused, with the reason.
            let current = self.entry(name)?;
            if !current.mtp.enabled {
                let status = self.status_of(current, None);
                if !status.mtp.available {
                    let why = status.mtp.reason.unwrap_or_else(|| "its MTP head is not usable".into());
                    return Err(EngineError::InvalidSettings(format!("cannot enable MTP for model `{name}`: {why}")));
                }
            }
        }
        let mut registry = self.inner.registry.write().unwrap_or_else(|p| p.into_inner());
        let entry = registry.update_settings(name, patch)?;
        drop(registry);
        if let Some(w) = lock(&self.inner.workers).get(name) {
            w.set_entry(entry.clone());
        }
        Ok(entry)
    }

    /// Changes the app-wide settings (folders, default model, `[server]`, `[ui]`) and persists them.
    /// A new models folder is scanned at once; a new conversations folder holds the chats from now
    /// on (those saved in the old one stay there).
    pub fn update_app_settings_blocking(
        &self,
        patch: &crate::registry::AppPatch,
    ) -> Result<crate::registry::AppSettings> {
        let mut registry = self.inner.registry.write().unwrap_or_else(|p| p.into_inner());
        let before = registry.conversations_dir().to_path_buf();
        let settings = registry.update_app(patch)?;
        drop(registry);
        if settings.conversations_dir != before {
            let store = Arc::new(ConversationStore::new(settings.conversations_dir.clone()));
            *self.inner.conversations.write().unwrap_or_else(|p| p.into_inner()) = store;
        }
        tracing::info!("app settings saved");
        self.publish();
        Ok(settings)
    }

    pub async fn update_settings(&self, name: &str, patch: SettingsPatch) -> Result<ModelEntry> {
        let (engine, name) = (self.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || engine.update_settings_blocking(&name, &patch))
            .await
            .map_err(|e| EngineError::Internal(format!("the settings task failed: {e}")))?
    }

    /// Queues a request on its (loaded) model. Fails at once on a bad request, an image for a
    /// text-only model or one that cannot be decoded, a full queue or a prompt that does not fit
    /// the context. Does not block beyond decoding its images and tokenizing the prompt.
    pub fn submit(&self, request: Request) -> Result<Generation> {
        let worker = lock(&self.inner.workers)
            .get(&request.model)
            .cloned()
            .ok_or_else(|| EngineError::NotLoaded(request.model.clone()))?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let job = worker.prepare(id, request)?;
        let generation = worker.enqueue(job)?;
        self.publish();
        Ok(generation)
    }

    /// Loads the model when needed, then submits. Blocks while loading: use [`Engine::chat`] from
    /// async code.
    pub fn chat_blocking(&self, request: Request) -> Result<Generation> {
        if !self.is_loaded(&request.model) {
            let images = image_count(&request.input);
            if images > 0 {
                // Refuse before loading a model only to refuse.
                let entry = self.entry(&request.model)?;
                if !catalog::inspect_folder(&entry.path).vision {
                    return Err(text_only(&entry.name, images, None));
                }
            }
            self.load_blocking(&request.model)?;
        }
        self.submit(request)
    }

    /// [`Engine::chat_blocking`] on a blocking thread (loading and tokenizing stay off the runtime).
    pub async fn chat(&self, request: Request) -> Result<Generation> {
        let engine = self.clone();
        tokio::task::spawn_blocking(move || engine.chat_blocking(request))
            .await
            .map_err(|e| EngineError::Internal(format!("the request task failed: {e}")))?
    }

    /// Runs `f` while no model computes (MLX is driven by one thread at a time). Blocks until the
    /// running generation, if any, has finished; generations wait for all of `f`.
    pub fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        let _compute = compute_lock();
        f()
    }

    /// The gate a conversion beside this engine takes around each unit of its MLX work
    /// ([`ConvertOptions::gate`](crate::quant::ConvertOptions::gate)): the engine's MLX lock, so a
    /// generation waits for at most one tensor, not the whole conversion.
    pub fn compute_gate(&self) -> crate::quant::ComputeGate {
        compute_gate()
    }

    /// Records a folder the person chose, so that conversions may read it for the rest of this run:
    /// the desktop shell calls this for a folder picked in its dialog or dropped on the window (a
    /// channel no web page reaches), the server for one the person confirmed in the UI. Returns the
    /// folder resolved (symlinks followed).
    pub fn choose_folder(&self, path: &Path) -> Result<PathBuf> {
        let real = path
            .canonicalize()
            .map_err(|e| EngineError::InvalidRequest(format!("folder `{}`: {e}", path.display())))?;
        if !real.is_dir() {
            return Err(EngineError::InvalidRequest(format!("`{}` is not a folder", path.display())));
        }
        let mut chosen = lock(&self.inner.chosen);
        if !chosen.contains(&real) {
            tracing::info!(folder = %real.display(), "folder chosen");
            chosen.push(real.clone());
        }
        Ok(real)
    }

    /// The folders chosen so far ([`Engine::choose_folder`]).
    pub fn chosen_folders(&self) -> Vec<PathBuf> {
        lock(&self.inner.chosen).clone()
    }

    /// Registers an existing model folder (no conversion) in models.toml: see
    /// [`Registry::add_model`].
    pub fn add_model_blocking(&self, path: &Path, name: Option<&str>) -> Result<ModelEntry> {
        let mut registry = self.inner.registry.write().unwrap_or_else(|p| p.into_inner());
        let entry = registry.add_model(path, name)?;
        drop(registry);
        self.publish();
        Ok(entry)
    }

    /// Downloads from Hugging Face started by [`Engine::pull`].
    pub fn downloads(&self) -> &downloads::Downloads {
        &self.inner.downloads
    }

    /// Pulls `repo` into the Hub cache as a job (see [`downloads`]) and links the snapshot into the
    /// models folder, where the registry lists it.
    pub fn pull(&self, repo: crate::hub::RepoRef, include: Vec<String>) -> Result<downloads::DownloadView> {
        let models_dir = self.registry().models_dir().to_path_buf();
        let engine = self.clone_weak();
        self.inner.downloads.start(
            self.inner.config.hub.clone(),
            downloads::DownloadRequest { repo, include, graft_onto: None },
            self.inner.live.memory().system_total_bytes,
            move |pulled| {
                let link = crate::hub::link_into_models(&models_dir, pulled).map_err(|e| e.to_string())?;
                let name = link.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                Ok((name, link))
            },
            move || {
                engine.with(|e| e.publish());
            },
        )
    }

    /// The conversion jobs started by [`Engine::convert`].
    pub fn jobs(&self) -> &Jobs {
        &self.inner.jobs
    }

    /// Converts `src` into `dst` as a job of this engine (see [`jobs`]): the conversion takes the
    /// engine's MLX lock one tensor at a time, so chats go on while it runs. `pause` is a test hook.
    pub fn convert(
        &self,
        src: PathBuf,
        dst: PathBuf,
        mut options: crate::quant::ConvertOptions,
        pause: Option<std::time::Duration>,
    ) -> Result<JobView> {
        options.gate = self.compute_gate();
        let engine = self.clone_weak();
        self.inner.jobs.start(src, dst, options, pause, move || {
            engine.with(|e| e.publish());
        })
    }

    /// The UI's conversations, in the registry's conversations folder.
    pub fn conversations(&self) -> Arc<ConversationStore> {
        self.inner.conversations.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The live statistics now.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.live.snapshot(self.loaded_models())
    }

    /// Snapshots published on progress (a few per second while generating), on loads and unloads,
    /// and at the end of each generation.
    pub fn subscribe_stats(&self) -> broadcast::Receiver<Arc<StatsSnapshot>> {
        self.inner.live.subscribe()
    }

    /// Publishes a snapshot now (e.g. for a periodic memory update).
    pub fn publish(&self) {
        self.inner.live.publish(self.loaded_models());
    }

    fn loaded_models(&self) -> Vec<LoadedModel> {
        lock(&self.inner.workers).values().map(|w| w.loaded_model()).collect()
    }

    /// A handle for workers that does not keep the engine alive.
    fn clone_weak(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.inner))
    }
}

/// Refuses a model that needs more memory (`catalog::folder_need`: weights, the caches of the planned
/// context and a margin) than is available. Unknown (0) available memory is no reason to refuse.
fn fits_in_memory(model: &str, need: u64, available: u64) -> Result<()> {
    if available > 0 && need > available {
        return Err(EngineError::NotEnoughMemory { model: model.to_owned(), need, available });
    }
    Ok(())
}

/// The engine as its workers see it: used to publish statistics.
#[derive(Clone)]
struct WeakEngine(std::sync::Weak<Inner>);

impl WeakEngine {
    fn with<R>(&self, f: impl FnOnce(&Engine) -> R) -> Option<R> {
        self.0.upgrade().map(|inner| f(&Engine { inner }))
    }
}

/// What a worker knows of its model, fixed at load time.
#[derive(Debug, Clone)]
pub(crate) struct ModelFacts {
    pub mtp: crate::model::mtp_head::MtpStatus,
    /// The vision tower loaded.
    pub vision: bool,
    /// Why a vision tower that config.json declares did not load.
    pub vision_reason: Option<String>,
    /// `<|image_pad|>`: the chat template writes one per image; it is expanded to the image's tokens.
    pub image_token_id: Option<u32>,
    pub vocab_size: usize,
    pub context: Option<usize>,
    /// The most bytes of text one token of the vocabulary stands for (0: unknown): a prompt over
    /// `context` times this cannot fit, whatever it says, and is refused before tokenizing.
    pub max_token_bytes: usize,
    /// MLX computes on a GPU (else on the CPU).
    pub gpu: bool,
    /// The engine's override of `mtp.adaptive` (see [`EngineConfig::adaptive`]).
    pub adaptive: Option<bool>,
}

impl ModelFacts {
    /// Call with MLX held (it asks MLX for its device).
    fn of(model: &Qwen35) -> Self {
        ModelFacts {
            mtp: model.mtp_status.clone(),
            vision: model.has_vision(),
            vision_reason: model.vision_status.clone(),
            image_token_id: model.vision().and_then(|v| v.config.image_token_id),
            vocab_size: model.config.text.vocab_size.max(0) as usize,
            context: model.config.text.max_position_embeddings.map(|c| c.max(0) as usize),
            max_token_bytes: 0,
            gpu: mlx::device::default_device() == mlx::device::Device::Gpu,
            adaptive: None,
        }
    }
}

fn image_count(input: &Input) -> usize {
    match input {
        Input::Chat(messages) => messages.iter().flat_map(|m| &m.parts).filter(|p| matches!(p, Part::Image(_))).count(),
        Input::Raw(_) | Input::Tokens(_) => 0,
    }
}

/// The refusal of images sent to a model without a vision tower, naming the model (and why a
/// declared tower did not load).
fn text_only(model: &str, images: usize, why: Option<&str>) -> EngineError {
    EngineError::Images(match why {
        None => format!("model `{model}` is a text-only model and cannot read images; remove the {images} image(s) or pick a vision model"),
        Some(why) => format!(
            "model `{model}` cannot read images: its vision tower is not loaded ({why}); remove the {images} image(s) or pick a vision model"
        ),
    })
}

/// A request's input as the model reads it: prompt ids (each image's `<|image_pad|>` expanded to
/// its tokens, so that the length is the prompt's true length) and the decoded images, with their
/// bytes counted against the model's queue. Images are refused for a model without a vision tower.
fn prompt_of(
    model: &str,
    facts: &ModelFacts,
    tokenizer: &Tokenizer,
    reader: Option<&images::ImageReader>,
    request: &Request,
) -> Result<(Prompt, Option<images::Reservation>)> {
    let codec = |e: crate::chat::ChatError| EngineError::InvalidRequest(e.to_string());
    check_prompt_size(model, facts, &request.input)?;
    let mut decoded = Vec::new();
    let mut held = None;
    let ids = match &request.input {
        Input::Tokens(ids) => ids.clone(),
        Input::Raw(text) => tokenizer.encode(text, true).map_err(codec)?,
        Input::Chat(messages) => {
            if messages.is_empty() {
                return Err(EngineError::InvalidRequest("`messages` is empty".into()));
            }
            let images: Vec<&Image> = messages
                .iter()
                .flat_map(|m| &m.parts)
                .filter_map(|p| match p {
                    Part::Image(image) => Some(image),
                    Part::Text(_) => None,
                })
                .collect();
            if !images.is_empty() {
                let reader = reader
                    .filter(|_| facts.vision)
                    .ok_or_else(|| text_only(model, images.len(), facts.vision_reason.as_deref()))?;
                let (inputs, reservation) = reader.read(model, &images)?;
                decoded = inputs;
                held = Some(reservation);
            }
            // Each image stays in its place as a placeholder that the template renders as one pad.
            let messages: Vec<Message> = messages
                .iter()
                .map(|m| {
                    let content = m
                        .parts
                        .iter()
                        .map(|p| match p {
                            Part::Text(t) => ContentPart::Text(t.clone()),
                            Part::Image(_) => ContentPart::Image,
                        })
                        .collect();
                    Message { tool_calls: m.tool_calls.clone(), ..Message::new(m.role.clone(), content) }
                })
                .collect();
            let tools = request.tools.as_ref().map(|t| t.tools.clone());
            let options = ChatOptions { add_generation_prompt: true, enable_thinking: request.enable_thinking, tools };
            let ids = tokenizer.encode_chat_with(&messages, &options).map_err(codec)?;
            if decoded.is_empty() {
                ids
            } else {
                let pad = facts.image_token_id.ok_or_else(|| {
                    EngineError::Images(format!(
                        "model `{model}` cannot read images: its config.json has no image_token_id"
                    ))
                })?;
                // Fails when the text itself holds `<|image_pad|>` tokens.
                crate::model::vision_input::expand_image_pads(&ids, pad, &decoded)
                    .map_err(|e| EngineError::InvalidRequest(format!("{e}; the chat template writes one per image")))?
            }
        }
    };
    if ids.is_empty() {
        return Err(EngineError::InvalidRequest("the prompt is empty".into()));
    }
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= facts.vocab_size) {
        return Err(EngineError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary of {}",
            facts.vocab_size
        )));
    }
    Ok((Prompt { ids, images: decoded }, held))
}

/// Refuses text that cannot fit the context before it is rendered and tokenized, which costs time
/// and memory in proportion to its size (a 30 MB prompt took 12 s and 4.5 GB). Each token stands
/// for at most `max_token_bytes` bytes, so more than `context` times that is more tokens than the
/// context holds. (Normalizers shrink text little: NFC composes at most a few code points into
/// one, and the longest tokens are runs of ASCII it leaves alone.)
fn check_prompt_size(model: &str, facts: &ModelFacts, input: &Input) -> Result<()> {
    let (Some(context), token_bytes) = (facts.context, facts.max_token_bytes) else {
        return Ok(());
    };
    if token_bytes == 0 {
        return Ok(());
    }
    let bytes = match input {
        Input::Raw(text) => text.len(),
        Input::Chat(messages) => messages
            .iter()
            .flat_map(|m| &m.parts)
            .map(|p| match p {
                Part::Text(t) => t.len(),
                Part::Image(_) => 0,
            })
            .fold(0usize, usize::saturating_add),
        Input::Tokens(_) => return Ok(()),
    };
    let limit = context.saturating_mul(token_bytes);
    if bytes > limit {
        return Err(EngineError::PromptTooLarge { model: model.to_owned(), bytes, limit, context, token_bytes });
    }
    Ok(())
}

/// The most bytes one token of `tokenizer` decodes to (see [`ModelFacts::max_token_bytes`]).
pub(crate) fn max_token_bytes(tokenizer: &Tokenizer) -> usize {
    let vocab = u32::try_from(tokenizer.vocab_size()).unwrap_or(u32::MAX);
    (0..vocab).filter_map(|id| tokenizer.decode(&[id], false).ok()).map(|t| t.len()).max().unwrap_or(0)
}

/// The generation options of a request on its model (see [`generate_options`]).
fn resolve_options(
    entry: &ModelEntry,
    facts: &ModelFacts,
    tokenizer: &Tokenizer,
    request: &Request,
    prompt_len: usize,
) -> Result<crate::generate::GenerateOptions> {
    // `tandem serve --adaptive` overrides the models' setting; a request's own choice overrides both.
    let mut mtp = request.mtp.clone();
    mtp.adaptive = mtp.adaptive.or(facts.adaptive);
    let overrides = Overrides { sampling: request.sampling.clone(), mtp, max_tokens: request.max_tokens };
    let stop_ids = if request.ignore_eos { Vec::new() } else { tokenizer.stop_ids().to_vec() };
    let mut opts = generate_options(entry, &overrides, prompt_len, facts.context, stop_ids)?;
    opts.logprobs = request.logprobs;
    Ok(opts)
}

#[cfg(test)]
mod tests;
