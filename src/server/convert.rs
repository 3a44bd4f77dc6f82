//! Conversion jobs: `tandem::quant::convert` on a background thread, its progress kept for polling
//! and streamed as server-sent events, cancellable. Paths are confined to the models folder and the
//! registry's models.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

use super::error::{ApiError, ApiJson};
use super::security::PathRules;
use super::AppState;
use crate::engine::live::unix_ms;
use crate::quant::{Control, ConvertEvent, ConvertOptions};

/// Finished jobs kept for polling; older ones are forgotten first.
const KEEP_FINISHED: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    fn is_final(self) -> bool {
        matches!(self, JobStatus::Finished | JobStatus::Failed | JobStatus::Cancelled)
    }
}

#[derive(Debug, Clone, Serialize)]
struct JobView {
    job: String,
    state: JobStatus,
    src: PathBuf,
    dst: PathBuf,
    options: ConvertOptions,
    created_ms: u64,
    finished_ms: Option<u64>,
    /// Tensors written so far, of `total`.
    done: usize,
    total: usize,
    predicted_bytes: Option<u64>,
    predicted_bpw: Option<f64>,
    /// Once finished: the new model's folder, its size and bits per weight.
    path: Option<PathBuf>,
    bytes: Option<u64>,
    bpw: Option<f64>,
    /// The newest event.
    last_event: Option<Value>,
    /// Every event except per-tensor progress (validated, planned, calibrating..., the end).
    events: Vec<Value>,
    /// The `ConvertReport` once finished.
    report: Option<Value>,
    error: Option<String>,
}

struct Job {
    cancel: AtomicBool,
    view: Mutex<JobView>,
    tx: broadcast::Sender<Value>,
}

#[derive(Default)]
pub struct Jobs {
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Jobs {
    fn get(&self, id: &str) -> Result<Arc<Job>, ApiError> {
        id.parse::<u64>()
            .ok()
            .and_then(|n| lock(&self.jobs).get(&n).cloned())
            .ok_or_else(|| ApiError::not_found("job_not_found", format!("no conversion job `{id}`")))
    }

    fn insert(&self, job: Arc<Job>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut jobs = lock(&self.jobs);
        jobs.insert(id, job);
        let finished: Vec<u64> =
            jobs.iter().filter(|(_, j)| lock(&j.view).state.is_final()).map(|(id, _)| *id).collect();
        for old in finished.iter().take(finished.len().saturating_sub(KEEP_FINISHED)) {
            jobs.remove(old);
        }
        id
    }
}

/// The event names that end a job's stream.
const TERMINAL: [&str; 3] = ["finished", "error", "cancelled"];

impl Job {
    /// Records a converter event (as the stream shows it) and sends it to the listeners.
    fn progress(&self, e: &ConvertEvent) {
        let event = match e {
            // Per-tensor progress as `progress {done, total, tensor}`.
            ConvertEvent::Tensor { name, index, total, bytes_done, bytes_total } => {
                let mut view = lock(&self.view);
                (view.done, view.total) = (*index, *total);
                drop(view);
                json!({ "event": "progress", "done": index, "total": total, "tensor": name,
                        "bytes_done": bytes_done, "bytes_total": bytes_total })
            }
            // The end is announced once, with the report, when `convert` has returned.
            ConvertEvent::Finished { .. } => return,
            other => {
                if let ConvertEvent::Planned { predicted_bytes, predicted_bpw, .. } = other {
                    let mut view = lock(&self.view);
                    (view.predicted_bytes, view.predicted_bpw) = (Some(*predicted_bytes), Some(*predicted_bpw));
                }
                serde_json::to_value(other).unwrap_or(Value::Null)
            }
        };
        let milestone = event["event"] != "progress";
        self.record(event, milestone);
    }

    fn record(&self, event: Value, milestone: bool) {
        let mut view = lock(&self.view);
        if milestone {
            view.events.push(event.clone());
        }
        view.last_event = Some(event.clone());
        drop(view);
        let _ = self.tx.send(event);
    }

    fn finish(&self, result: Result<crate::quant::ConvertReport, crate::quant::ConvertError>) {
        let mut view = lock(&self.view);
        let event = match result {
            Ok(report) => {
                view.state = JobStatus::Finished;
                (view.path, view.bytes, view.bpw) = (Some(report.dst.clone()), Some(report.bytes), Some(report.bpw));
                view.done = view.total;
                let report = serde_json::to_value(&report).unwrap_or(Value::Null);
                view.report = Some(report.clone());
                json!({ "event": "finished", "path": view.path, "bytes": view.bytes, "bpw": view.bpw, "report": report })
            }
            Err(crate::quant::ConvertError::Cancelled) => {
                view.state = JobStatus::Cancelled;
                json!({ "event": "cancelled" })
            }
            Err(e) => {
                view.state = JobStatus::Failed;
                let message = e.to_string();
                view.error = Some(message.clone());
                let error = ApiError::internal(message.clone());
                json!({ "event": "error", "message": message, "error": error.body()["error"] })
            }
        };
        view.finished_ms = Some(unix_ms());
        drop(view);
        self.record(event, true);
    }
}

#[derive(Debug, Deserialize)]
pub struct ConvertRequest {
    /// A model name from the registry, or a model folder inside the models folder.
    src: String,
    /// The new folder: a name (created in the models folder) or a path inside it. Default:
    /// `<src>-<bits>bit` (or `<src>-<dtype>`) in the models folder.
    #[serde(alias = "name", alias = "out")]
    dst: Option<String>,
    /// `uniform`, `mixed_3_6`, `mixed_4_6` or `auto` (the CLI's spellings).
    recipe: Option<String>,
    /// `bf16` or `f16`.
    dtype: Option<String>,
    /// An integer, `"none"`, or null (the head unquantized); absent follows the recipe.
    #[serde(default, deserialize_with = "present")]
    mtp_bits: Option<Value>,
    #[serde(flatten)]
    options: ConvertOptions,
}

/// Tells a present `null` (Some(Null)) from an absent field (None, by `default`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

fn path_rules(state: &AppState) -> PathRules {
    let registry = state.engine.registry();
    PathRules {
        models_dir: registry.models_dir().to_owned(),
        model_paths: registry.list().into_iter().map(|m| m.path).collect(),
    }
}

/// `POST /api/convert` -> 202 `{"job": id, ...}`.
pub async fn start(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ConvertRequest>,
) -> Result<Response, ApiError> {
    let st = state.clone();
    let (src, dst, options) = tokio::task::spawn_blocking(move || resolve(&st, req))
        .await
        .map_err(|e| ApiError::internal(format!("a background task failed: {e}")))??;
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
    let id = state.jobs.insert(job.clone());
    lock(&job.view).job = id.to_string();
    let engine = state.engine.clone();
    let worker = job.clone();
    let pause = state.convert_pause;
    // MLX is driven by one thread at a time: the conversion takes the engine's lock per tensor, so
    // chats go on while it runs (each waits for at most one tensor).
    let mut options = options;
    options.gate = engine.compute_gate();
    let spawned = std::thread::Builder::new().name(format!("tandem-convert-{id}")).spawn(move || {
        let job = worker;
        let result = if job.cancel.load(Ordering::SeqCst) {
            Err(crate::quant::ConvertError::Cancelled)
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
            .unwrap_or_else(|_| Err(crate::quant::ConvertError::Internal("the conversion panicked".into())))
        };
        job.finish(result);
        engine.publish();
    });
    if let Err(e) = spawned {
        job.finish(Err(crate::quant::ConvertError::Internal(format!("cannot start the conversion thread: {e}"))));
    }
    let view = lock(&job.view).clone();
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

/// Checks and resolves the request's paths.
fn resolve(state: &AppState, req: ConvertRequest) -> Result<(PathBuf, PathBuf, ConvertOptions), ApiError> {
    let rules = path_rules(state);
    let src = match state.engine.entry(&req.src) {
        Ok(entry) => rules.existing("src", &entry.path.to_string_lossy())?,
        Err(_) => rules.existing("src", &req.src)?,
    };
    if !crate::registry::is_model_folder(&src) {
        return Err(ApiError::bad_request(
            "invalid_path",
            format!("src `{}` is not a model folder (config.json and *.safetensors)", req.src),
        ));
    }
    std::fs::create_dir_all(&rules.models_dir).map_err(|e| {
        ApiError::internal(format!("cannot create the models folder {}: {e}", rules.models_dir.display()))
    })?;
    let dst_name = match &req.dst {
        Some(dst) => dst.clone(),
        None => {
            let base = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
            match req.options.bits {
                Some(bits) => format!("{base}-{bits}bit"),
                None => format!(
                    "{base}-{}",
                    serde_json::to_value(req.options.dtype)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
            }
        }
    };
    let dst = rules.new_in_models_dir("dst", &dst_name)?;
    let mut options = req.options;
    let bad = |e: crate::quant::ParseOptionError| ApiError::bad_request("invalid_value", e.to_string());
    if let Some(recipe) = &req.recipe {
        options.recipe = recipe.parse().map_err(bad)?;
    }
    if let Some(dtype) = &req.dtype {
        options.dtype = dtype.parse().map_err(bad)?;
    }
    options.mtp_bits = match req.mtp_bits {
        None => None,
        Some(Value::Null) => Some(crate::quant::MtpBits::Dense),
        Some(Value::Number(n)) => Some(n.to_string().parse().map_err(bad)?),
        Some(Value::String(s)) => Some(s.parse().map_err(bad)?),
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`mtp_bits` = {other}: expected a bit width, \"none\" or null"),
            ))
        }
    };
    if dst.exists() && !options.force {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "already_exists",
            format!("{} already exists; pick another name, or pass \"force\": true to replace it", dst.display()),
        ));
    }
    if let Some(calibration) = &options.calibration {
        options.calibration = Some(rules.existing("calibration", &calibration.to_string_lossy())?);
    }
    Ok((src, dst, options))
}

pub async fn list(State(state): State<Arc<AppState>>) -> Json<Value> {
    let jobs: Vec<JobView> = lock(&state.jobs.jobs).values().map(|j| lock(&j.view).clone()).collect();
    Json(json!({ "jobs": jobs }))
}

pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let job = state.jobs.get(&id)?;
    let view = lock(&job.view).clone();
    Ok(Json(json!(view)))
}

/// Cancels a queued or running job (202), or forgets a finished one (200).
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = state.jobs.get(&id)?;
    let status = lock(&job.view).state;
    if status.is_final() {
        if let Ok(n) = id.parse::<u64>() {
            lock(&state.jobs.jobs).remove(&n);
        }
        return Ok((StatusCode::OK, Json(json!({ "job": id, "state": status, "removed": true }))).into_response());
    }
    job.cancel.store(true, Ordering::SeqCst);
    Ok((StatusCode::ACCEPTED, Json(json!({ "job": id, "state": status, "cancelling": true }))).into_response())
}

/// The job's events: the milestones so far (and the newest event), then live ones, ending after
/// `finished`, `error` or `cancelled`.
pub async fn events(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let job = state.jobs.get(&id)?;
    // Subscribe before reading the past, so nothing falls between the two.
    let live = BroadcastStream::new(job.tx.subscribe()).filter_map(|r| async move { r.ok() });
    let (mut past, finished) = {
        let view = lock(&job.view);
        (view.events.clone(), view.state.is_final())
    };
    if let Some(last) = lock(&job.view).last_event.clone() {
        if !past.contains(&last) {
            past.push(last);
        }
    }
    let replay = futures::stream::iter(past);
    let live: futures::stream::BoxStream<'static, Value> =
        if finished { futures::stream::empty().boxed() } else { live.boxed() };
    // Ends right after the terminal event, without waiting for another.
    let events = futures::stream::unfold((replay.chain(live).boxed(), false), |(mut events, ended)| async move {
        if ended {
            return None;
        }
        let event = events.next().await?;
        let terminal = event.get("event").and_then(Value::as_str).is_some_and(|e| TERMINAL.contains(&e));
        Some((event, (events, terminal)))
    });
    let stream =
        events.map(|event| Ok(SseEvent::default().data(event.to_string()))).take_until(state.shutdown_signal());
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
