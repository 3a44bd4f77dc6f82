//! One loaded model: the thread that owns it, its running batch of generations, and the queue of
//! requests waiting for a place in it.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc;

use super::images::{ImageReader, Reservation};
use super::live::LoadedModel;
use super::prefix_cache::{self, PrefixCache, PrefixCacheStats};
use super::{
    cause, lock, prompt_of, resolve_options, CancelHandle, Cause, Completion, EngineConfig, EngineError, ErrorMessage,
    Event, Generation, ModelFacts, Request, Result, WeakEngine,
};
use crate::chat::Tokenizer;
use crate::generate::batch::step_batch;
use crate::generate::{
    Constraint, FinishReason, GenerateError, GenerateOptions, GrammarSpec, Grammars, Prompt, Sequence, Starting,
};
use crate::model::{LoadOptions, Qwen35};
use crate::registry::ModelEntry;

mod stream;
use stream::Stream;

/// State shared by the worker thread and the engine.
#[derive(Default)]
struct Shared {
    /// Requests queued or running; bounded by max_batch + queue_limit.
    in_flight: AtomicUsize,
    /// Generations running now (in the batch).
    running: AtomicUsize,
    /// Set by unload: queued requests fail, the running ones are cancelled.
    closing: AtomicBool,
    /// The running generations' requests and cancel handles.
    current: Mutex<Vec<(u64, CancelHandle)>>,
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
    /// Its share of a batch's token budget: the prompt and the most it may generate.
    fn budget(&self) -> usize {
        self.prompt.ids.len() + self.opts.max_tokens
    }

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
                            let loaded = match &load_options.parallel {
                                Some(tp) => super::lockstep::load(tp, &entry.name, &entry.path, &load_options),
                                None => crate::model::load(&entry.path, &load_options),
                            };
                            loaded.map(|model| {
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
                    let limits = Limits {
                        max_batch: entry.batch.max_streams.max(1) as usize,
                        max_tokens: entry.batch.max_tokens as usize,
                    };
                    let served = Served { name: &entry.name, model: &model, tokenizer: &tokenizer };
                    match &load_options.parallel {
                        Some(tp) => {
                            if serve_in_lockstep(served, &jobs_rx, &shared, &engine, tp) {
                                super::lockstep::unload(tp);
                            }
                        }
                        None => {
                            let prefix = prefix_cache::for_model(&entry, load_options.dtype);
                            serve(served, &jobs_rx, &shared, &engine, limits, prefix);
                        }
                    }
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
        let running = self.shared.running.load(Ordering::SeqCst);
        let in_flight = self.shared.in_flight.load(Ordering::SeqCst);
        LoadedModel {
            id: self.entry().name,
            busy: running > 0,
            running,
            queued: in_flight.saturating_sub(running),
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
        // The batch's places, then the queue's.
        let limit = self.entry().batch.max_streams.max(1) as usize + self.queue_limit;
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
        for (_, current) in lock(&self.shared.current).iter() {
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

/// The worker's loop: continuous batching. Requests join the running batch between steps, up to
/// the model's `max_batch` (and its token budget), in arrival order; each step advances every
/// running generation by one plain token or one MTP cycle in shared forwards
/// (`generate::batch`); a generation leaves as soon as it ends. Alone, a generation steps as it
/// always did (pipelined plain steps).
fn serve(
    served: Served<'_>,
    jobs: &std_mpsc::Receiver<Job>,
    shared: &Shared,
    engine: &WeakEngine,
    limits: Limits,
    mut prefix: PrefixCache,
) {
    let name = served.name;
    *lock(&shared.prefix) = prefix.stats();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    // Admitted, prefilling (oldest first), then decoding.
    let mut starting: VecDeque<Active<'_>> = VecDeque::new();
    let mut active: Vec<Active<'_>> = Vec::new();
    loop {
        if active.is_empty() && starting.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => break,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            waiting.push_back(job);
        }
        while let Some(job) = waiting.front() {
            let tokens = job.prepared.budget();
            let admitted = active.len() + starting.len();
            let in_flight: usize = active.iter().chain(&starting).map(|a| a.budget).sum();
            let room = admitted < limits.max_batch && (admitted == 0 || in_flight + tokens <= limits.max_tokens);
            if !room {
                break;
            }
            let Some(job) = waiting.pop_front() else { break };
            if let Some(admitted) = admit(served, job, shared, engine, &mut prefix) {
                starting.push_back(admitted);
            }
        }
        // The oldest newcomer's prefill, one chunk per turn: the others decode in between (a long
        // prompt never stalls them), and a cancel or an unload is heard between chunks.
        if let Some(mut a) = starting.pop_front() {
            match prefill_step(served, &mut a, engine) {
                Ok(Prefilled::Started) => {
                    a.prepared.free_images();
                    active.push(a);
                }
                Ok(Prefilled::More) => starting.push_front(a),
                // Unloading stopped it before its first token: it never ran, like those queued.
                Ok(Prefilled::Cancelled) if shared.closing.load(Ordering::SeqCst) => {
                    a.fail(EngineError::Unloaded(name.to_owned()), name, shared, engine)
                }
                Ok(Prefilled::Cancelled) => a.cancel(name, shared, engine),
                Err(e) => a.fail(e, name, shared, engine),
            }
            // That chunk's time is not the running generations' step cost.
            for seq in active.iter_mut().filter_map(|a| a.seq.as_mut()) {
                seq.interrupted();
            }
        }
        if !active.is_empty() && active.iter().any(|a| a.seq.as_ref().is_some_and(|s| !s.is_done())) {
            let outcome = {
                let _compute = super::compute_lock();
                // A step may run ahead only when nothing could join before the next one.
                let run_ahead = waiting.is_empty() && starting.is_empty();
                catch_unwind(AssertUnwindSafe(|| step(served, &mut active, run_ahead, engine)))
            };
            if let Err(e) = settled(outcome, name, &format!("{} streams", active.len())) {
                for a in active.drain(..) {
                    a.fail(e.clone(), name, shared, engine);
                }
            }
        }
        let (done, running): (Vec<_>, Vec<_>) =
            active.drain(..).partition(|a| a.seq.as_ref().is_none_or(|s| s.is_done()));
        active = running;
        for a in done {
            let _compute = super::compute_lock();
            a.retire(served, shared, engine, &mut prefix);
        }
        *lock(&shared.prefix) = prefix.stats();
    }
    // Freeing the cache's arrays is MLX work too.
    let _compute = super::compute_lock();
    drop(prefix);
}

/// The worker's loop for a model split over several processes (`engine::lockstep`): one request at
/// a time, each run on every rank in step. A lost rank fails the request and ends the loop (later
/// requests hear that the worker stopped). Returns whether the group is still whole (the model was
/// unloaded: the other ranks are then told to drop theirs).
fn serve_in_lockstep(
    served: Served<'_>,
    jobs: &std_mpsc::Receiver<Job>,
    shared: &Shared,
    engine: &WeakEngine,
    tp: &crate::model::parallel::Parallel,
) -> bool {
    use super::lockstep;
    let Served { name, model, .. } = served;
    while let Ok(Job { mut prepared, events, cancel, slot }) = jobs.recv() {
        prepared.free_images();
        if shared.closing.load(Ordering::SeqCst) {
            let _ = events.send(Event::Failed(EngineError::Unloaded(name.to_owned())));
            continue;
        }
        if events.is_closed() || cancel.is_cancelled() {
            let _ = events.send(Event::Done(cancelled(&prepared)));
            continue;
        }
        if prepared.opts.constraint.is_some() || !prepared.prompt.images.is_empty() {
            let why = "a model split over several machines takes text without a grammar for now";
            let _ = events.send(Event::Failed(EngineError::InvalidRequest(why.into())));
            continue;
        }
        let mut stream = Stream::running(served, &prepared, events, cancel, shared);
        let job = lockstep::LockstepJob::new(name, &prepared.prompt.ids, &prepared.opts);
        let outcome = {
            let _compute = super::compute_lock();
            let stream = &mut stream;
            catch_unwind(AssertUnwindSafe(|| {
                lockstep::send_job(tp, &job)?;
                lockstep::run(model, tp, &job, prepared.opts.logprobs, &mut |p| stream.progress(name, p, engine))
            }))
        };
        stream.leave(prepared.id, shared);
        let result = settled(outcome, name, &format!("request {} across {} ranks", prepared.id, tp.size()));
        // An MLX failure mid-generation (a lost peer above all) may leave the ranks out of step.
        let lost = matches!(result, Err(EngineError::Generate(_) | EngineError::Internal(_)));
        stream.end(name, result, slot, engine);
        if lost {
            tracing::error!(model = %name, "a rank of the group is lost: this model no longer answers");
            return false;
        }
    }
    true
}

/// A model's batching limits.
#[derive(Clone, Copy)]
struct Limits {
    /// Generations decoded together at most.
    max_batch: usize,
    /// The batch's token budget: the sum of its generations' prompt and `max_tokens`.
    max_tokens: usize,
}

/// One step of every running generation: alone, or batched.
fn step(
    served: Served<'_>,
    active: &mut [Active<'_>],
    run_ahead: bool,
    engine: &WeakEngine,
) -> Result<(), GenerateError> {
    if let [one] = active {
        let Active { seq, stream, .. } = one;
        if let Some(seq) = seq.as_mut().filter(|s| !s.is_done()) {
            seq.step(run_ahead, &mut |p| stream.progress(served.name, p, engine))?;
        }
        return Ok(());
    }
    {
        let mut seqs: Vec<&mut Sequence<'_>> =
            active.iter_mut().filter_map(|a| a.seq.as_mut()).filter(|s| !s.is_done()).collect();
        step_batch(&mut seqs, run_ahead)?;
    }
    for a in active.iter_mut() {
        let Active { seq, stream, .. } = a;
        if let Some(seq) = seq.as_mut() {
            seq.report(&mut |p| stream.progress(served.name, p, engine));
        }
    }
    Ok(())
}

fn engine_error(e: GenerateError) -> EngineError {
    match e {
        GenerateError::Mlx(e) => EngineError::Generate(cause(e)),
        e @ GenerateError::NoVision { .. } => EngineError::Images(e.to_string()),
        GenerateError::Images(message) => EngineError::InvalidImage(message),
        other => EngineError::InvalidRequest(other.to_string()),
    }
}

/// Takes a job from the queue: one that can no longer run is answered at once; else its prompt is
/// prefilled (from the longest cached prefix) and its first token reported.
fn admit<'m>(
    served: Served<'m>,
    job: Job,
    shared: &Shared,
    engine: &WeakEngine,
    prefix: &mut PrefixCache,
) -> Option<Active<'m>> {
    let Served { name, model, .. } = served;
    let Job { mut prepared, events, cancel, slot } = job;
    if shared.closing.load(Ordering::SeqCst) {
        prepared.free_images();
        drop(slot);
        let _ = events.send(Event::Failed(EngineError::Unloaded(name.to_owned())));
        return None;
    }
    if events.is_closed() {
        return None;
    }
    if cancel.is_cancelled() {
        prepared.free_images();
        drop(slot);
        let _ = events.send(Event::Done(cancelled(&prepared)));
        return None;
    }
    let stream = Stream::running(served, &prepared, events, cancel, shared);
    let budget = prepared.budget();
    let mut active = Active { prepared, stream, starting: None, seq: None, cached_ids: None, slot, budget };
    let begun = {
        let _compute = super::compute_lock();
        let a = &mut active;
        catch_unwind(AssertUnwindSafe(|| {
            super::faults::on_generation(name);
            // The longest cached prefix of this prompt, and snapshots to keep for the next request.
            let (ids, resume) = prefix.resume(model, &a.prepared.prompt, &a.prepared.opts);
            if let Some(s) = &resume.restored {
                tracing::debug!(model = %name, request = a.prepared.id, cached = s.len, prompt = a.prepared.prompt.ids.len(), "prefix cache hit");
            }
            a.cached_ids = ids;
            Sequence::begin_prompt(model, &a.prepared.prompt, a.prepared.opts.clone(), resume)
        }))
    };
    match settled(begun, name, &format!("request {}", active.prepared.id)) {
        Ok(starting) => {
            active.starting = Some(starting);
            Some(active)
        }
        Err(e) => {
            active.fail(e, name, shared, engine);
            None
        }
    }
}

/// The completion of a request cancelled before its first token.
fn cancelled(prepared: &Prepared) -> Completion {
    let stats = crate::generate::Stats { prompt_tokens: prepared.prompt.ids.len(), ..Default::default() };
    Completion {
        text: String::new(),
        tokens: Vec::new(),
        stats,
        finish: FinishReason::Cancelled,
        stop: None,
        logprobs: Vec::new(),
    }
}

/// Where a newcomer's prefill stands after [`prefill_step`].
enum Prefilled {
    /// Its first token is out: it decodes from now on.
    Started,
    More,
    /// Cancelled, or its caller left, before its first token.
    Cancelled,
}

/// Prefills the next chunk of a newcomer's prompt; once nothing is left, samples and reports its
/// first token. A request cancelled (or whose caller left) while it prefills stops between chunks.
fn prefill_step(served: Served<'_>, a: &mut Active<'_>, engine: &WeakEngine) -> Result<Prefilled> {
    let Served { name, .. } = served;
    let Some(mut starting) = a.starting.take() else { return Ok(Prefilled::Started) };
    let _compute = super::compute_lock();
    if a.stream.cancel.is_cancelled() || a.stream.events.is_closed() {
        // Its arrays are freed here, under the compute lock.
        drop(starting);
        return Ok(Prefilled::Cancelled);
    }
    let outcome = {
        let stream = &mut a.stream;
        catch_unwind(AssertUnwindSafe(|| {
            starting.advance()?;
            if starting.left() > 0 {
                return Ok(Err(starting));
            }
            starting.start(&mut |p| stream.progress(name, p, engine)).map(Ok)
        }))
    };
    match settled(outcome, name, &format!("request {}", a.prepared.id))? {
        Ok(seq) => {
            a.seq = Some(seq);
            Ok(Prefilled::Started)
        }
        Err(starting) => {
            a.starting = Some(starting);
            Ok(Prefilled::More)
        }
    }
}

/// A generation's work as `catch_unwind` returned it, its failure (an error or a panic) logged
/// and turned into what the caller hears; `who` says whose work it was.
fn settled<T>(outcome: std::thread::Result<Result<T, GenerateError>>, model: &str, who: &str) -> Result<T> {
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            let e = engine_error(e);
            tracing::warn!(model = %model, "generation failed ({who}): {}", e.message());
            Err(e)
        }
        Err(panic) => {
            let message = panic_message(&panic);
            tracing::error!(model = %model, "generation panicked ({who}): {message}");
            Err(EngineError::Internal(format!("the generation panicked: {message}")))
        }
    }
}

/// Frees a generation's arrays under the compute lock (freeing is MLX work).
fn release(starting: Option<Starting<'_>>, seq: Option<Sequence<'_>>) {
    if starting.is_some() || seq.is_some() {
        let _compute = super::compute_lock();
        drop((starting, seq));
    }
}

/// A running generation: its request, what streams its text, and its sequence.
struct Active<'m> {
    prepared: Prepared,
    stream: Stream<'m>,
    /// Its prompt's prefill, until the first token.
    starting: Option<Starting<'m>>,
    /// From the first token on.
    seq: Option<Sequence<'m>>,
    /// The tokens the prefix cache keys this generation's snapshots by.
    cached_ids: Option<Vec<u64>>,
    slot: Slot,
    /// Its share of the batch's token budget.
    budget: usize,
}

impl Active<'_> {
    /// Ends it with an error (it leaves the batch).
    fn fail(self, e: EngineError, model: &str, shared: &Shared, engine: &WeakEngine) {
        let Active { prepared, stream, slot, starting, seq, .. } = self;
        release(starting, seq);
        stream.leave(prepared.id, shared);
        engine.with(|en| en.inner.live.abandoned(model, prepared.id));
        drop(slot);
        let _ = stream.events.send(Event::Failed(e));
        engine.with(|e| e.publish());
    }

    /// Ends it before its first token, cancelled.
    fn cancel(self, model: &str, shared: &Shared, engine: &WeakEngine) {
        let Active { prepared, stream, slot, starting, seq, .. } = self;
        release(starting, seq);
        stream.leave(prepared.id, shared);
        engine.with(|en| en.inner.live.abandoned(model, prepared.id));
        drop(slot);
        let _ = stream.events.send(Event::Done(cancelled(&prepared)));
        engine.with(|e| e.publish());
    }

    /// Ends it after its last step: the rest of its text, the statistics, the prefix cache's snapshots.
    fn retire(self, served: Served<'_>, shared: &Shared, engine: &WeakEngine, prefix: &mut PrefixCache) {
        let Active { prepared, stream, seq, cached_ids, slot, .. } = self;
        let Some(seq) = seq else { return };
        let mut out = seq.finish();
        if let Some(ids) = &cached_ids {
            prefix.keep(ids, std::mem::take(&mut out.kept));
        }
        stream.leave(prepared.id, shared);
        stream.end(served.name, Ok(out), slot, engine);
    }
}

/// The model a worker serves.
#[derive(Clone, Copy)]
struct Served<'a> {
    name: &'a str,
    model: &'a Qwen35,
    tokenizer: &'a Tokenizer,
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
