//! One loaded model: the thread that owns it, and the FIFO queue of its requests.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::images::{ImageReader, Reservation};
use super::live::LoadedModel;
use super::prefix_cache::{self, PrefixCache, PrefixCacheStats};
use super::stop::StopMatcher;
use super::{
    cause, lock, prompt_of, resolve_options, CancelHandle, Cause, Completion, EngineConfig, EngineError, ErrorMessage,
    Event, Generation, Logprob, ModelFacts, Request, Result, TokenText, WeakEngine,
};
use crate::chat::Tokenizer;
use crate::generate::{
    generate_resumed, Constraint, Control, FinishReason, GenerateError, GenerateOptions, GrammarSpec, Grammars,
    Progress, Prompt, TokenLogprob,
};
use crate::model::{LoadOptions, Qwen35};
use crate::registry::ModelEntry;

/// Running statistics ride along with text deltas at most this often.
const RUNNING_STATS_EVERY: Duration = Duration::from_millis(250);

/// State shared by the worker thread and the engine.
#[derive(Default)]
struct Shared {
    /// Requests queued or running; bounded by 1 + queue_limit.
    in_flight: AtomicUsize,
    busy: AtomicBool,
    /// Set by unload: queued requests fail, the running one is cancelled.
    closing: AtomicBool,
    current: Mutex<Option<CancelHandle>>,
    /// The prefix cache's figures (the cache itself lives on the worker thread, where MLX frees it).
    prefix: Mutex<PrefixCacheStats>,
}

/// Holds one place in the queue; gives it back when dropped.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request, checked and tokenized (its images decoded), ready for the queue.
pub(crate) struct Prepared {
    id: u64,
    prompt: Prompt,
    /// The decoded images' bytes, counted against the model's queue until they are freed.
    images_held: Option<Reservation>,
    opts: GenerateOptions,
    stop: Vec<String>,
}

impl Prepared {
    /// Frees the decoded images (once the prompt has been read) and gives their bytes back.
    fn free_images(&mut self) {
        self.prompt.images = Vec::new();
        self.images_held = None;
    }
}

struct Job {
    prepared: Prepared,
    events: mpsc::UnboundedSender<Event>,
    cancel: CancelHandle,
    slot: Slot,
}

pub(crate) struct Worker {
    entry: RwLock<ModelEntry>,
    pub info: ModelFacts,
    tokenizer: Arc<Tokenizer>,
    /// The image processor of a model with a vision tower.
    images: Option<ImageReader>,
    queue_limit: usize,
    shared: Arc<Shared>,
    jobs: Mutex<Option<std_mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The grammar compiler of this model's vocabulary, built by the first constrained request.
    grammars: std::sync::OnceLock<std::result::Result<Grammars, String>>,
}

/// What each token id spells, for log-probabilities (the tokenizer reads its table once).
fn spelling(tokenizer: &Tokenizer, width: usize) -> Vec<Vec<u8>> {
    let mut bytes = tokenizer.token_bytes(width).unwrap_or_default();
    for b in &mut bytes {
        // Special tokens carry llguidance's marker byte first.
        if b.first() == Some(&0xff) {
            b.remove(0);
        }
    }
    bytes
}

fn token_text(table: &[Vec<u8>], id: u32) -> TokenText {
    let bytes = table.get(id as usize).cloned().unwrap_or_default();
    TokenText { text: String::from_utf8_lossy(&bytes).into_owned(), bytes }
}

fn with_text(table: &[Vec<u8>], l: &TokenLogprob) -> Logprob {
    Logprob {
        token: token_text(table, l.token),
        logprob: l.logprob,
        top: l.top.iter().map(|&(t, lp)| (token_text(table, t), lp)).collect(),
    }
}

impl Worker {
    /// Loads the model on a new thread, which then serves the queue. Returns once loading is done,
    /// or fails once it has taken longer than the engine's `load_timeout` (then `cancel` is set, and
    /// the thread stops at the loader's next check and frees what it had loaded).
    pub fn spawn(
        entry: ModelEntry,
        config: &EngineConfig,
        engine: WeakEngine,
        cancel: Arc<AtomicBool>,
    ) -> Result<Worker> {
        let load_options = LoadOptions { cancel: Some(cancel.clone()), ..config.load_options.clone() };
        let adaptive = config.adaptive;
        let load_error = |source: Cause| EngineError::Load { model: entry.name.clone(), source };
        let tokenizer = Arc::new(Tokenizer::from_dir(&entry.path).map_err(|e| load_error(cause(e)))?);
        let max_token_bytes = super::max_token_bytes(&tokenizer);
        let shared = Arc::new(Shared::default());
        let (jobs_tx, jobs_rx) = std_mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel::<Result<ModelFacts, Cause>>(1);
        let thread = {
            let (entry, tokenizer, shared) = (entry.clone(), tokenizer.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("tandem-model-{}", entry.name))
                .spawn(move || {
                    let loaded = {
                        let _compute = super::compute_lock();
                        catch_unwind(AssertUnwindSafe(|| {
                            super::faults::on_load(&entry.name);
                            crate::model::load(&entry.path, &load_options).map(|model| {
                                let facts = ModelFacts { adaptive, max_token_bytes, ..ModelFacts::of(&model) };
                                (model, facts)
                            })
                        }))
                    };
                    let (model, facts) = match loaded {
                        Ok(Ok(loaded)) => loaded,
                        Ok(Err(e)) => {
                            let _ = ready_tx.send(Err(cause(e)));
                            return;
                        }
                        Err(panic) => {
                            let why = format!("the loader panicked: {}", panic_message(&panic));
                            let _ = ready_tx.send(Err(cause(ErrorMessage(why))));
                            return;
                        }
                    };
                    if ready_tx.send(Ok(facts)).is_err() {
                        return;
                    }
                    let cap = prefix_cache::cap(entry.prefix_cache_bytes);
                    serve(&entry.name, &model, &tokenizer, &jobs_rx, &shared, &engine, cap);
                    // Freeing MLX memory is MLX work too.
                    let _compute = super::compute_lock();
                    drop(model);
                })
                .map_err(|e| load_error(cause(ErrorMessage(format!("cannot start its thread: {e}")))))?
        };
        let info = match ready_rx.recv_timeout(config.load_timeout) {
            Ok(Ok(info)) => info,
            Ok(Err(message)) => {
                let _ = thread.join();
                return Err(load_error(message));
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {
                // Not joined: a load stuck inside one step must not hold this caller (and the load
                // lock) with it. The thread sees the closed channel or the flag and ends.
                cancel.store(true, Ordering::SeqCst);
                let why = format!(
                    "it did not finish loading within {} s; the load was cancelled",
                    config.load_timeout.as_secs_f64()
                );
                return Err(load_error(cause(ErrorMessage(why))));
            }
            Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                return Err(load_error(cause(ErrorMessage("the loading thread stopped".into()))));
            }
        };
        // Read once per loaded model: preprocessor_config.json, with the engine's pixel limit.
        let images = info.vision.then(|| ImageReader::new(&entry.name, &entry.path, &config.images, info.gpu));
        Ok(Worker {
            entry: RwLock::new(entry),
            info,
            tokenizer,
            images,
            queue_limit: config.queue_limit,
            shared,
            jobs: Mutex::new(Some(jobs_tx)),
            thread: Mutex::new(Some(thread)),
            grammars: std::sync::OnceLock::new(),
        })
    }

    pub fn entry(&self) -> ModelEntry {
        self.entry.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// New settings from models.toml, used by the requests submitted from now on.
    pub fn set_entry(&self, entry: ModelEntry) {
        *self.entry.write().unwrap_or_else(|p| p.into_inner()) = entry;
    }

    pub fn loaded_model(&self) -> LoadedModel {
        let busy = self.shared.busy.load(Ordering::SeqCst);
        let in_flight = self.shared.in_flight.load(Ordering::SeqCst);
        LoadedModel {
            id: self.entry().name,
            busy,
            queued: in_flight.saturating_sub(usize::from(busy)),
            mtp_loaded: self.info.mtp.loaded,
            mtp_reason: self.info.mtp.reason.clone(),
            prefix_cache: lock(&self.shared.prefix).clone(),
        }
    }

    /// Checks and tokenizes a request and decodes its images (on the caller's thread).
    pub fn prepare(&self, id: u64, request: Request) -> Result<Prepared> {
        let entry = self.entry();
        let (prompt, images_held) =
            prompt_of(&entry.name, &self.info, &self.tokenizer, self.images.as_ref(), &request)?;
        let mut opts = resolve_options(&entry, &self.info, &self.tokenizer, &request, prompt.ids.len())?;
        if let Some(spec) = &request.grammar {
            opts.constraint = Some(self.compile(spec)?);
        } else if let Some(uses) = &request.tools {
            // A required or named call: the answer is forced to be calls, in this model's format.
            let forced =
                crate::chat::tools::grammar(uses, self.tokenizer.call_format()).map_err(EngineError::InvalidRequest)?;
            if let Some(lark) = forced {
                opts.constraint = Some(self.compile(&GrammarSpec::Lark(lark))?);
            }
        }
        Ok(Prepared { id, prompt, images_held, opts, stop: request.stop })
    }

    /// Compiles a request's grammar against this model's vocabulary; one it cannot compile is an
    /// invalid request that says why.
    fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        let grammars = self.grammars.get_or_init(|| {
            let t = Instant::now();
            let end = self.tokenizer.stop_ids().first().copied().ok_or("the tokenizer has no end token")?;
            let grammars = Grammars::new(&self.tokenizer.token_bytes(self.info.vocab_size)?, end);
            tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "grammar compiler built");
            grammars
        });
        let grammars = grammars.as_ref().map_err(|e| {
            EngineError::InvalidRequest(format!("constrained output is not available for this model: {e}"))
        })?;
        grammars.compile(spec).map_err(|e| EngineError::InvalidRequest(format!("cannot compile the grammar: {e}")))
    }

    /// Puts a prepared request at the end of the queue, or refuses it when the queue is full.
    pub fn enqueue(&self, prepared: Prepared) -> Result<Generation> {
        let model = self.entry().name;
        let limit = 1 + self.queue_limit;
        self.shared
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1))
            .map_err(|_| EngineError::Busy { model: model.clone(), limit: self.queue_limit })?;
        let slot = Slot(self.shared.clone());
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let cancel = CancelHandle::default();
        let (id, prompt_tokens, max_tokens) = (prepared.id, prepared.prompt.ids.len(), prepared.opts.max_tokens);
        let job = Job { prepared, events: events_tx, cancel: cancel.clone(), slot };
        let jobs = lock(&self.jobs);
        let Some(sender) = jobs.as_ref() else {
            return Err(EngineError::Unloaded(model));
        };
        sender.send(job).map_err(|_| EngineError::Internal(format!("the worker of model `{model}` has stopped")))?;
        Ok(Generation { id, model, prompt_tokens, max_tokens, events: events_rx, cancel })
    }

    /// Starts unloading: queued requests will fail, the running one stops, the thread then ends.
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        if let Some(current) = lock(&self.shared.current).as_ref() {
            current.cancel();
        }
        lock(&self.jobs).take();
    }

    /// Waits for the thread to end (after [`Worker::close`]).
    pub fn join(&self) {
        if let Some(thread) = lock(&self.thread).take() {
            if thread.join().is_err() {
                tracing::error!("a model worker thread panicked");
            }
        }
    }
}

/// The worker's loop: one job at a time, in arrival order, until the queue is closed.
fn serve(
    name: &str,
    model: &Qwen35,
    tokenizer: &Tokenizer,
    jobs: &std_mpsc::Receiver<Job>,
    shared: &Shared,
    engine: &WeakEngine,
    prefix_cap: u64,
) {
    let mut prefix = PrefixCache::new(prefix_cap);
    *lock(&shared.prefix) = prefix.stats();
    while let Ok(job) = jobs.recv() {
        let Job { mut prepared, events, cancel, slot } = job;
        if shared.closing.load(Ordering::SeqCst) {
            prepared.free_images();
            drop(slot);
            let _ = events.send(Event::Failed(EngineError::Unloaded(name.to_owned())));
            continue;
        }
        if events.is_closed() {
            continue;
        }
        if cancel.is_cancelled() {
            prepared.free_images();
            drop(slot);
            let stats = crate::generate::Stats { prompt_tokens: prepared.prompt.ids.len(), ..Default::default() };
            let done = Completion {
                text: String::new(),
                tokens: Vec::new(),
                stats,
                finish: FinishReason::Cancelled,
                stop: None,
                logprobs: Vec::new(),
            };
            let _ = events.send(Event::Done(done));
            continue;
        }
        shared.busy.store(true, Ordering::SeqCst);
        *lock(&shared.current) = Some(cancel.clone());
        let _ = events.send(Event::Started);
        let outcome = {
            let mut compute = super::compute_lock();
            let caller = Caller { events: &events, cancel: &cancel };
            let prefix = &mut prefix;
            catch_unwind(AssertUnwindSafe(|| {
                run(Served { name, model, tokenizer }, &prepared, caller, engine, prefix, &mut compute)
            }))
        };
        *lock(&shared.prefix) = prefix.stats();
        let event = match outcome {
            Ok(Ok(done)) => {
                engine.with(|e| e.inner.live.finished(name, prepared.id, done.finish, &done.stats));
                Event::Done(done)
            }
            Ok(Err(e)) => {
                tracing::warn!(model = %name, request = prepared.id, "generation failed: {}", e.message());
                engine.with(|e| e.inner.live.abandoned(name));
                Event::Failed(e)
            }
            Err(panic) => {
                let message = panic_message(&panic);
                tracing::error!(model = %name, request = prepared.id, "generation panicked: {message}");
                engine.with(|e| e.inner.live.abandoned(name));
                Event::Failed(EngineError::Internal(format!("the generation panicked: {message}")))
            }
        };
        *lock(&shared.current) = None;
        shared.busy.store(false, Ordering::SeqCst);
        // The queue place (and the images' memory) is free before the caller hears the end.
        prepared.free_images();
        drop(slot);
        let _ = events.send(event);
        engine.with(|e| e.publish());
    }
    // Freeing the cache's arrays is MLX work too.
    let _compute = super::compute_lock();
    drop(prefix);
}

/// One generation: streams text deltas (stop sequences held back and cut) and returns the end.
/// Who waits for a generation: where its events go and the handle that cancels it.
#[derive(Clone, Copy)]
struct Caller<'a> {
    events: &'a mpsc::UnboundedSender<Event>,
    cancel: &'a CancelHandle,
}

/// The model a worker serves.
#[derive(Clone, Copy)]
struct Served<'a> {
    name: &'a str,
    model: &'a Qwen35,
    tokenizer: &'a Tokenizer,
}

fn run(
    served: Served<'_>,
    job: &Prepared,
    caller: Caller<'_>,
    engine: &WeakEngine,
    prefix: &mut PrefixCache,
    compute: &mut parking_lot::FairMutexGuard<'static, ()>,
) -> Result<Completion> {
    let Served { name, model, tokenizer } = served;
    let Caller { events, cancel } = caller;
    super::faults::on_generation(name);
    let mut decoder = tokenizer.stream_decoder(true);
    let mut stopper = StopMatcher::new(&job.stop);
    let mut text = String::new();
    let mut kept: Vec<u32> = Vec::new();
    let mut decode_error: Option<String> = None;
    let mut stats_sent: Option<Instant> = None;
    let table = if job.opts.logprobs.is_some() {
        spelling(tokenizer, model.config.text.vocab_size.max(0) as usize)
    } else {
        Vec::new()
    };
    let mut all_logprobs: Vec<Logprob> = Vec::new();
    let mut on_progress = |p: Progress<'_>| {
        let mut delta = String::new();
        let mut ids = Vec::new();
        for &t in p.new_tokens {
            if stopper.matched().is_some() || decode_error.is_some() {
                break;
            }
            ids.push(t);
            match decoder.step(t) {
                Ok(Some(piece)) => delta.push_str(&stopper.push(&piece)),
                Ok(None) => {}
                Err(e) => decode_error = Some(e.to_string()),
            }
        }
        kept.extend_from_slice(&ids);
        text.push_str(&delta);
        let logprobs: Vec<Logprob> = p.logprobs.iter().take(ids.len()).map(|l| with_text(&table, l)).collect();
        all_logprobs.extend(logprobs.iter().cloned());
        let stats = if stats_sent.is_none_or(|t| t.elapsed() >= RUNNING_STATS_EVERY) {
            stats_sent = Some(Instant::now());
            Some(p.stats.clone())
        } else {
            None
        };
        let gone = !ids.is_empty() && events.send(Event::Delta { text: delta, tokens: ids, stats, logprobs }).is_err();
        if engine.with(|e| e.inner.live.progress(name, job.id, p.stats)) == Some(true) {
            engine.with(|e| e.publish());
        }
        let stop = gone
            || events.is_closed()
            || cancel.is_cancelled()
            || stopper.matched().is_some()
            || decode_error.is_some();
        // Between tokens nothing of this generation is being computed: let another model's
        // generation or a conversion waiting for MLX take a turn (no cost when none waits).
        parking_lot::FairMutexGuard::bump(&mut *compute);
        if stop {
            Control::Stop
        } else {
            Control::Continue
        }
    };
    // The longest cached prefix of this prompt, and snapshots to keep for the next request.
    let (ids, resume) = prefix.resume(model, &job.prompt, &job.opts);
    if let Some(s) = &resume.restored {
        tracing::debug!(model = %name, request = job.id, cached = s.len, prompt = job.prompt.ids.len(), "prefix cache hit");
    }
    let out = generate_resumed(model, &job.prompt, &job.opts, resume, &mut on_progress);
    let mut out = out.map_err(|e| match e {
        GenerateError::Mlx(e) => EngineError::Generate(cause(e)),
        e @ GenerateError::NoVision { .. } => EngineError::Images(e.to_string()),
        GenerateError::Images(message) => EngineError::InvalidImage(message),
        other => EngineError::InvalidRequest(other.to_string()),
    })?;
    if let Some(ids) = &ids {
        prefix.keep(ids, std::mem::take(&mut out.kept));
    }
    if let Some(message) = decode_error {
        return Err(EngineError::Generate(cause(ErrorMessage(format!(
            "cannot decode the generated tokens: {message}"
        )))));
    }
    let mut tail = String::new();
    if stopper.matched().is_none() {
        let rest = decoder.flush().map_err(|e| {
            EngineError::Generate(cause(ErrorMessage(format!("cannot decode the generated tokens: {e}"))))
        })?;
        if let Some(rest) = rest {
            tail.push_str(&stopper.push(&rest));
        }
        tail.push_str(&stopper.finish());
    }
    if !tail.is_empty() {
        let _ = events.send(Event::Delta { text: tail.clone(), tokens: Vec::new(), stats: None, logprobs: Vec::new() });
        text.push_str(&tail);
    }
    let stop = stopper.matched().map(str::to_owned);
    let finish = if stop.is_some() { FinishReason::Stop } else { out.finish };
    let mut stats = out.stats;
    stats.completion_tokens = kept.len();
    Ok(Completion { text, tokens: kept, stats, finish, stop, logprobs: all_logprobs })
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
