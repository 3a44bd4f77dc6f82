//! Download jobs: `hub::pull` on a background thread, then the snapshot linked into the models folder;
//! progress kept for polling (a reloaded page finds its downloads again) and sent to listeners, as
//! conversion jobs are. Cancelling keeps what arrived, for the next pull of the same repo to resume.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::broadcast;
use ts_rs::TS;

use super::jobs::JobStatus;
use super::live::unix_ms;
use super::EngineError;
use crate::hub::{self, Control, HubConfig, HubError, PullEvent, PullOptions, Pulled, RepoRef};
use crate::sync::lock;

/// Finished downloads kept for polling.
const KEEP_FINISHED: usize = 32;
/// Downloads queued or running at once.
pub const MAX_DOWNLOADS: usize = 2;

/// What a download reports: the Hub's events (`listed`, `progress`, `file_done`), then one of
/// `finished`, `error` or `cancelled`.
#[derive(Debug, Clone, Serialize, TS)]
#[serde(untagged)]
pub enum DownloadEvent {
    Pull(PullEvent),
    End(DownloadEnd),
}

#[derive(Debug, Clone, Serialize, TS)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum DownloadEnd {
    /// The snapshot is complete and listed as model `model` (a link in the models folder).
    Finished {
        model: String,
        path: PathBuf,
        pulled: Pulled,
    },
    Error {
        message: String,
    },
    Cancelled,
}

/// A download as `GET /api/pull/{job}` shows it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct DownloadView {
    pub job: String,
    pub repo: String,
    pub revision: String,
    pub include: Vec<String>,
    /// For a head's download: the model it is grafted onto once here.
    pub graft_onto: Option<String>,
    pub state: JobStatus,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
    /// The commit the revision named, once listed.
    pub commit: Option<String>,
    pub total_bytes: u64,
    /// Bytes here so far (files already in the cache count).
    pub done_bytes: u64,
    /// Bytes that were already in the cache.
    pub cached_bytes: u64,
    /// The file arriving now.
    pub file: Option<String>,
    /// Bytes per second over the transfer so far.
    pub bytes_per_s: f64,
    /// Whether the weights run on this machine as they are, and (bf16 weights that do not) the
    /// quantization that would; known once the listing and config.json are in.
    pub fit: Option<super::catalog::Fit>,
    /// This machine's memory, for the figures beside `fit`.
    pub memory_total: u64,
    /// Once finished: the model's name and its folder (the link in the models folder).
    pub model: Option<String>,
    pub path: Option<PathBuf>,
    pub error: Option<String>,
    /// The newest event.
    pub last_event: Option<DownloadEvent>,
}

/// What to download: the repo, the files (globs; empty: all), and for a head's download the model it is
/// grafted onto.
pub(crate) struct DownloadRequest {
    pub repo: RepoRef,
    pub include: Vec<String>,
    pub graft_onto: Option<String>,
}

pub struct Download {
    cancel: AtomicBool,
    view: Mutex<DownloadView>,
    tx: broadcast::Sender<DownloadEvent>,
}

impl Download {
    pub fn view(&self) -> DownloadView {
        lock(&self.view).clone()
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// The newest event, and the live ones unless the download has ended.
    pub fn subscribe(&self) -> (Option<DownloadEvent>, Option<broadcast::Receiver<DownloadEvent>>) {
        let live = self.tx.subscribe();
        let view = lock(&self.view);
        (view.last_event.clone(), (!view.state.is_final()).then_some(live))
    }

    fn record(&self, event: DownloadEvent) {
        lock(&self.view).last_event = Some(event.clone());
        let _ = self.tx.send(event);
    }
}

#[derive(Default)]
pub struct Downloads {
    jobs: Mutex<BTreeMap<u64, Arc<Download>>>,
    next: AtomicU64,
}

impl Downloads {
    pub fn get(&self, id: &str) -> Option<Arc<Download>> {
        id.parse::<u64>().ok().and_then(|n| lock(&self.jobs).get(&n).cloned())
    }

    pub fn list(&self) -> Vec<DownloadView> {
        lock(&self.jobs).values().map(|j| j.view()).collect()
    }

    /// Forgets a finished download; false when it is unknown or still running.
    pub fn remove(&self, id: &str) -> bool {
        let Ok(n) = id.parse::<u64>() else { return false };
        let mut jobs = lock(&self.jobs);
        match jobs.get(&n) {
            Some(j) if lock(&j.view).state.is_final() => jobs.remove(&n).is_some(),
            _ => false,
        }
    }

    /// Starts pulling `r` on a thread of its own; `link` runs there once the snapshot is complete and
    /// names the model it became. A second download of a repo already downloading is refused.
    pub(crate) fn start(
        &self,
        hub_config: HubConfig,
        req: DownloadRequest,
        memory_total: u64,
        link: impl FnOnce(&Pulled) -> Result<(String, PathBuf), String> + Send + 'static,
        on_end: impl FnOnce() + Send + 'static,
    ) -> Result<DownloadView, EngineError> {
        let DownloadRequest { repo: r, include, graft_onto } = req;
        let (tx, _) = broadcast::channel(256);
        let view = DownloadView {
            job: String::new(),
            repo: r.repo.clone(),
            revision: r.revision.clone(),
            include: include.clone(),
            graft_onto,
            state: JobStatus::Queued,
            created_ms: unix_ms(),
            finished_ms: None,
            commit: None,
            total_bytes: 0,
            done_bytes: 0,
            cached_bytes: 0,
            file: None,
            bytes_per_s: 0.0,
            fit: None,
            memory_total,
            model: None,
            path: None,
            error: None,
            last_event: None,
        };
        let job = Arc::new(Download { cancel: AtomicBool::new(false), view: Mutex::new(view), tx });
        let id = {
            let mut jobs = lock(&self.jobs);
            let active: Vec<DownloadView> = jobs.values().map(|j| j.view()).filter(|v| !v.state.is_final()).collect();
            if active.iter().any(|v| v.repo == r.repo) {
                return Err(EngineError::InvalidRequest(format!("{} is already downloading", r.repo)));
            }
            if active.len() >= MAX_DOWNLOADS {
                return Err(EngineError::InvalidRequest(format!(
                    "{MAX_DOWNLOADS} downloads are already running; wait for one to end or cancel one"
                )));
            }
            let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
            jobs.insert(id, job.clone());
            let finished: Vec<u64> =
                jobs.iter().filter(|(_, j)| lock(&j.view).state.is_final()).map(|(k, _)| *k).collect();
            for old in finished.iter().take(finished.len().saturating_sub(KEEP_FINISHED)) {
                jobs.remove(old);
            }
            id
        };
        lock(&job.view).job = id.to_string();
        let worker = job.clone();
        let spawned = std::thread::Builder::new().name(format!("tandem-pull-{id}")).spawn(move || {
            let job = worker;
            lock(&job.view).state = JobStatus::Running;
            let started = Instant::now();
            let mut first_done = None;
            let mut weight_bytes = 0;
            let repo_dir = hub::repo_dir(&hub_config.cache, &r.repo);
            let mut on_event = |e: PullEvent| {
                {
                    let mut v = lock(&job.view);
                    match &e {
                        PullEvent::Listed { commit, total_bytes, cached_bytes, files } => {
                            v.commit = Some(commit.clone());
                            (v.total_bytes, v.done_bytes, v.cached_bytes) =
                                (*total_bytes, *cached_bytes, *cached_bytes);
                            weight_bytes =
                                files.iter().filter(|f| f.path.ends_with(".safetensors")).map(|f| f.size).sum();
                            // Until config.json says whether they are quantized: as they are.
                            v.fit = Some(super::catalog::fit(weight_bytes, false, memory_total));
                        }
                        PullEvent::FileDone { file, .. } if file == "config.json" => {
                            let config =
                                v.commit.as_ref().map(|c| repo_dir.join("snapshots").join(c).join("config.json"));
                            let quantized = config
                                .and_then(|p| std::fs::read_to_string(p).ok())
                                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                                .map(|c| c.get("quantization").is_some() || c.get("quantization_config").is_some());
                            if let Some(quantized) = quantized {
                                v.fit = Some(super::catalog::fit(weight_bytes, !quantized, memory_total));
                            }
                        }
                        PullEvent::Progress { file, done, .. } => {
                            let base = *first_done.get_or_insert(*done);
                            v.done_bytes = *done;
                            v.file = Some(file.clone());
                            let secs = started.elapsed().as_secs_f64();
                            v.bytes_per_s = if secs > 0.0 { done.saturating_sub(base) as f64 / secs } else { 0.0 };
                        }
                        PullEvent::FileDone { .. } => {}
                    }
                }
                job.record(DownloadEvent::Pull(e));
                if job.cancel.load(Ordering::SeqCst) {
                    Control::Cancel
                } else {
                    Control::Continue
                }
            };
            let opts = PullOptions { include, ..Default::default() };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                hub::pull(&hub_config, &r, &opts, &mut on_event)
            }))
            .unwrap_or_else(|_| {
                Err(HubError::Network { url: r.repo.clone(), message: "the download panicked".into() })
            });
            let end = match result {
                Ok(pulled) => match link(&pulled) {
                    Ok((model, path)) => {
                        let mut v = lock(&job.view);
                        v.state = JobStatus::Finished;
                        (v.model, v.path) = (Some(model.clone()), Some(path.clone()));
                        v.done_bytes = v.total_bytes;
                        DownloadEnd::Finished { model, path, pulled }
                    }
                    Err(message) => fail(&job, message),
                },
                Err(HubError::Cancelled) => {
                    lock(&job.view).state = JobStatus::Cancelled;
                    DownloadEnd::Cancelled
                }
                Err(e) => fail(&job, e.to_string()),
            };
            lock(&job.view).finished_ms = Some(unix_ms());
            job.record(DownloadEvent::End(end));
            on_end();
        });
        if let Err(e) = spawned {
            let end = fail(&job, format!("cannot start the download thread: {e}"));
            job.record(DownloadEvent::End(end));
        }
        Ok(job.view())
    }
}

fn fail(job: &Download, message: String) -> DownloadEnd {
    let mut v = lock(&job.view);
    v.state = JobStatus::Failed;
    v.error = Some(message.clone());
    DownloadEnd::Error { message }
}
