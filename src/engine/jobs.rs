//! Conversion jobs: `quant::convert` on a background thread, its progress kept for polling and sent
//! to listeners as [`JobEvent`]s, cancellable. The server streams them as server-sent events; the
//! CLI and the tray can follow them the same way. Paths are the caller's to check.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::broadcast;
use ts_rs::TS;

use super::live::unix_ms;
use super::EngineError;
use crate::model::Layout;
use crate::quant::{Control, ConvertError, ConvertEvent, ConvertOptions, ConvertReport};
use crate::sync::lock;

/// Finished jobs kept for polling; older ones are forgotten first.
const KEEP_FINISHED: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Running,
    Finished,
    #[serde(rename = "error")]
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Finished | JobStatus::Failed | JobStatus::Cancelled)
    }
}

/// An error as the API writes errors (`{"message", "type", "code"}`), for the `error` event: a
/// failed conversion is the server's failure, not the request's.
#[derive(Debug, Clone, PartialEq, Serialize, TS)]
pub struct JobErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub code: String,
}

/// What a job reports, in order: `validated`, `calibrating`... (recipe `auto`), `planned`, one
/// `progress` per tensor, then one of `finished`, `error` or `cancelled`, which ends the stream.
// `Finished` carries the whole report: one such event per job, so its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, TS)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum JobEvent {
    /// The source was read and checked.
    Validated {
        format: Layout,
        tensors: usize,
        bytes: u64,
        mtp: String,
    },
    /// `auto`: one module's sensitivity measured, over `tokens` tokens of calibration text.
    Calibrating {
        module: String,
        done: usize,
        total: usize,
        tokens: usize,
    },
    /// What will be written, exactly: sizes include every header.
    Planned {
        tensors: usize,
        shards: usize,
        params: u64,
        predicted_bytes: u64,
        predicted_bpw: f64,
        quantized_modules: usize,
        dense_modules: usize,
    },
    /// One source tensor written: `done` of `total`.
    Progress {
        done: usize,
        total: usize,
        tensor: String,
        bytes_done: u64,
        bytes_total: u64,
    },
    /// The new model is in place.
    Finished {
        path: PathBuf,
        bytes: u64,
        bpw: f64,
        /// The converter's report, as `tandem convert --json` prints it.
        #[ts(type = "Record<string, unknown>")]
        report: ConvertReport,
    },
    Error {
        message: String,
        error: JobErrorDetail,
    },
    Cancelled,
}

impl JobEvent {
    /// `finished`, `error` and `cancelled` end a job.
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobEvent::Finished { .. } | JobEvent::Error { .. } | JobEvent::Cancelled)
    }
}

/// A job as `GET /api/convert/{job}` shows it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct JobView {
    pub job: String,
    pub state: JobStatus,
    pub src: PathBuf,
    pub dst: PathBuf,
    pub options: ConvertOptions,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
    /// Tensors written so far, of `total`.
    pub done: usize,
    pub total: usize,
    pub predicted_bytes: Option<u64>,
    pub predicted_bpw: Option<f64>,
    /// Once finished: the new model's folder, its size and bits per weight.
    pub path: Option<PathBuf>,
    pub bytes: Option<u64>,
    pub bpw: Option<f64>,
    /// The newest event.
    pub last_event: Option<JobEvent>,
    /// Every event except per-tensor progress (validated, planned, calibrating..., the end).
    pub events: Vec<JobEvent>,
    /// The converter's report once finished.
    #[ts(type = "Record<string, unknown> | null")]
    pub report: Option<ConvertReport>,
    pub error: Option<String>,
}

/// One conversion.
pub struct Job {
    cancel: AtomicBool,
    view: Mutex<JobView>,
    tx: broadcast::Sender<JobEvent>,
}

/// What a listener gets: the events so far (milestones and the newest), and the live ones unless
/// the job had already ended.
pub struct Subscription {
    pub past: Vec<JobEvent>,
    pub live: Option<broadcast::Receiver<JobEvent>>,
}

impl Job {
    pub fn view(&self) -> JobView {
        lock(&self.view).clone()
    }

    /// Asks a queued or running job to stop; it ends with `cancelled` at its next tensor.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    pub fn subscribe(&self) -> Subscription {
        // Subscribe before reading the past, so nothing falls between the two.
        let live = self.tx.subscribe();
        let view = lock(&self.view);
        let mut past = view.events.clone();
        // Milestones are in `events` already; only the newest progress is added.
        if let Some(last @ JobEvent::Progress { .. }) = &view.last_event {
            past.push(last.clone());
        }
        let live = (!view.state.is_final()).then_some(live);
        Subscription { past, live }
    }

    /// Records a converter event and sends it to the listeners.
    fn progress(&self, e: &ConvertEvent) {
        let event = match e.clone() {
            ConvertEvent::Tensor { name, index, total, bytes_done, bytes_total } => {
                let mut view = lock(&self.view);
                (view.done, view.total) = (index, total);
                drop(view);
                JobEvent::Progress { done: index, total, tensor: name, bytes_done, bytes_total }
            }
            // The end is announced once, with the report, when `convert` has returned.
            ConvertEvent::Finished { .. } => return,
            ConvertEvent::Validated { format, tensors, bytes, mtp } => {
                JobEvent::Validated { format, tensors, bytes, mtp }
            }
            ConvertEvent::Calibrating { module, done, total, tokens } => {
                JobEvent::Calibrating { module, done, total, tokens }
            }
            ConvertEvent::Planned {
                tensors,
                shards,
                params,
                predicted_bytes,
                predicted_bpw,
                quantized_modules,
                dense_modules,
            } => {
                let mut view = lock(&self.view);
                (view.predicted_bytes, view.predicted_bpw) = (Some(predicted_bytes), Some(predicted_bpw));
                drop(view);
                JobEvent::Planned {
                    tensors,
                    shards,
                    params,
                    predicted_bytes,
                    predicted_bpw,
                    quantized_modules,
                    dense_modules,
                }
            }
        };
        self.record(event);
    }

    fn record(&self, event: JobEvent) {
        let mut view = lock(&self.view);
        if !matches!(event, JobEvent::Progress { .. }) {
            view.events.push(event.clone());
        }
        view.last_event = Some(event.clone());
        drop(view);
        let _ = self.tx.send(event);
    }

    fn finish(&self, result: Result<ConvertReport, ConvertError>) {
        let mut view = lock(&self.view);
        let event = match result {
            Ok(report) => {
                view.state = JobStatus::Finished;
                (view.path, view.bytes, view.bpw) = (Some(report.dst.clone()), Some(report.bytes), Some(report.bpw));
                view.done = view.total;
                view.report = Some(report.clone());
                JobEvent::Finished { path: report.dst.clone(), bytes: report.bytes, bpw: report.bpw, report }
            }
            Err(ConvertError::Cancelled) => {
                view.state = JobStatus::Cancelled;
                JobEvent::Cancelled
            }
            Err(e) => {
                view.state = JobStatus::Failed;
                let message = e.to_string();
                view.error = Some(message.clone());
                let error = JobErrorDetail {
                    message: message.clone(),
                    kind: "server_error".into(),
                    code: "internal_error".into(),
                };
                JobEvent::Error { message, error }
            }
        };
        view.finished_ms = Some(unix_ms());
        drop(view);
        self.record(event);
    }
}

/// The engine's conversion jobs, by number.
pub struct Jobs {
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: AtomicU64,
    /// Jobs queued or running at once; each holds a thread, memory and disk bandwidth.
    limit: usize,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs::new(DEFAULT_MAX_CONVERSIONS)
    }
}

/// See [`Jobs::new`].
pub const DEFAULT_MAX_CONVERSIONS: usize = 2;

impl Jobs {
    /// At most `limit` jobs queued or running at once (at least one).
    pub fn new(limit: usize) -> Jobs {
        Jobs { jobs: Mutex::default(), next: AtomicU64::new(0), limit: limit.max(1) }
    }

    /// A job by its id (the number as text); None for an unknown or malformed id.
    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        id.parse::<u64>().ok().and_then(|n| lock(&self.jobs).get(&n).cloned())
    }

    /// Every job kept, oldest first.
    pub fn list(&self) -> Vec<JobView> {
        lock(&self.jobs).values().map(|j| j.view()).collect()
    }

    /// Forgets a finished job; false when it is unknown or still running.
    pub fn remove(&self, id: &str) -> bool {
        let Ok(n) = id.parse::<u64>() else { return false };
        let mut jobs = lock(&self.jobs);
        match jobs.get(&n) {
            Some(job) if lock(&job.view).state.is_final() => {
                jobs.remove(&n);
                true
            }
            _ => false,
        }
    }

    /// Adds a job unless `limit` are queued or running (counted under the same lock, so two
    /// requests at once cannot both pass).
    fn insert(&self, job: Arc<Job>) -> Result<u64, EngineError> {
        let mut jobs = lock(&self.jobs);
        let active = jobs.values().filter(|j| !lock(&j.view).state.is_final()).count();
        if active >= self.limit {
            return Err(EngineError::ConversionsBusy { limit: self.limit });
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        jobs.insert(id, job);
        let finished: Vec<u64> =
            jobs.iter().filter(|(_, j)| lock(&j.view).state.is_final()).map(|(id, _)| *id).collect();
        for old in finished.iter().take(finished.len().saturating_sub(KEEP_FINISHED)) {
            jobs.remove(old);
        }
        Ok(id)
    }

    /// Starts converting `src` into `dst` on a thread of its own. `on_end` runs on that thread once
    /// the job has ended (the engine publishes statistics there). `pause` (tests only) sleeps after
    /// each tensor with the MLX lock let go. Invalid options are refused here, before any job
    /// exists, and so is a job beyond the limit.
    pub(crate) fn start(
        &self,
        src: PathBuf,
        dst: PathBuf,
        options: ConvertOptions,
        pause: Option<Duration>,
        on_end: impl FnOnce() + Send + 'static,
    ) -> Result<JobView, EngineError> {
        crate::quant::check_options(&options).map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let (tx, _) = broadcast::channel(256);
        let view = JobView {
            job: String::new(),
            state: JobStatus::Queued,
            src: src.clone(),
            dst: dst.clone(),
            options: options.clone(),
            created_ms: unix_ms(),
            finished_ms: None,
            done: 0,
            total: 0,
            predicted_bytes: None,
            predicted_bpw: None,
            path: None,
            bytes: None,
            bpw: None,
            last_event: None,
            events: Vec::new(),
            report: None,
            error: None,
        };
        let job = Arc::new(Job { cancel: AtomicBool::new(false), view: Mutex::new(view), tx });
        let id = self.insert(job.clone())?;
        lock(&job.view).job = id.to_string();
        let worker = job.clone();
        let spawned = std::thread::Builder::new().name(format!("tandem-convert-{id}")).spawn(move || {
            let job = worker;
            let result = if job.cancel.load(Ordering::SeqCst) {
                Err(ConvertError::Cancelled)
            } else {
                lock(&job.view).state = JobStatus::Running;
                let mut on_event = |e: &ConvertEvent| {
                    job.progress(e);
                    if let (Some(pause), ConvertEvent::Tensor { .. }) = (pause, e) {
                        std::thread::sleep(pause);
                    }
                    if job.cancel.load(Ordering::SeqCst) {
                        Control::Cancel
                    } else {
                        Control::Continue
                    }
                };
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    crate::quant::convert(&src, &dst, &options, &mut on_event)
                }))
                .unwrap_or_else(|_| Err(ConvertError::Internal("the conversion panicked".into())))
            };
            job.finish(result);
            on_end();
        });
        if let Err(e) = spawned {
            job.finish(Err(ConvertError::Internal(format!("cannot start the conversion thread: {e}"))));
        }
        Ok(job.view())
    }
}
