//! Live statistics: the running and the last generation, a rolling tok/s series, the loaded models and
//! memory (process, system, MLX), published as snapshots on a broadcast channel.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::broadcast;
use ts_rs::TS;

use super::prefix_cache::PrefixCacheStats;
use crate::generate::{FinishReason, Stats};
use crate::sync::lock;

/// Samples kept in the rolling series.
pub const SERIES_LEN: usize = 240;
/// Progress snapshots are published at most this often (the last one of a generation always is).
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// Everything the stats endpoints and the tray show, at one moment.
#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct StatsSnapshot {
    /// Unix time of the snapshot, in milliseconds.
    pub time_ms: u64,
    pub uptime_s: f64,
    /// A generation is running now.
    pub generating: bool,
    /// The model of the running generation, else of the last one.
    pub model: Option<String>,
    /// Decode speed now: the sum over the running generations (0 when idle).
    pub tok_s: f64,
    /// Generations running now, over all models.
    pub streams: usize,
    /// Draft acceptance of the running (else the last) generation, 0..1; null without MTP.
    pub acceptance: Option<f64>,
    /// Tokens per speculative cycle of the running (else the last) generation.
    pub tok_per_cycle: Option<f64>,
    /// Statistics of the running generation, else of the last one.
    pub stats: Option<Stats>,
    pub loaded_models: Vec<String>,
    pub models: Vec<LoadedModel>,
    /// Generations running now (several per model when requests are batched).
    pub running: Vec<RunningGeneration>,
    pub last: Option<LastGeneration>,
    /// Recent decode speed, oldest first.
    pub series: Vec<SeriesPoint>,
    pub totals: Totals,
    pub memory: Memory,
}

#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct LoadedModel {
    pub id: String,
    /// A generation is running.
    pub busy: bool,
    /// Generations running now (decoded together, in one batch).
    pub running: usize,
    /// Requests waiting for a place in the batch.
    pub queued: usize,
    pub mtp_loaded: bool,
    pub mtp_reason: Option<String>,
    /// Its prefix cache: size, entries, hit rate.
    pub prefix_cache: PrefixCacheStats,
}

#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct RunningGeneration {
    pub model: String,
    pub request: u64,
    pub stats: Stats,
}

#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct LastGeneration {
    pub model: String,
    pub request: u64,
    /// `FinishReason` of the generator.
    #[ts(type = "\"stop\" | \"length\" | \"cancelled\"")]
    pub finish: FinishReason,
    /// Unix time it ended, in milliseconds.
    pub ended_ms: u64,
    pub stats: Stats,
}

#[derive(Debug, Clone, Serialize, PartialEq, TS)]
pub struct SeriesPoint {
    /// Unix time in milliseconds.
    pub t_ms: u64,
    pub model: String,
    pub tok_s: f64,
    /// Draft acceptance so far in that generation (null without MTP).
    pub acceptance: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, TS)]
pub struct Totals {
    pub generations: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Bytes. `active`, `peak` and `cache` are MLX's allocator counters (all models share them).
#[derive(Debug, Clone, Default, Serialize, PartialEq, TS)]
pub struct Memory {
    /// Resident set size of this process.
    pub rss_bytes: u64,
    pub active_bytes: u64,
    pub peak_bytes: u64,
    pub cache_bytes: u64,
    /// The system's (or the container's) memory.
    pub system_total_bytes: u64,
    pub system_available_bytes: u64,
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[derive(Default)]
struct State {
    /// By model and request.
    running: BTreeMap<(String, u64), RunningGeneration>,
    last: Option<LastGeneration>,
    series: VecDeque<SeriesPoint>,
    totals: Totals,
    last_publish: Option<Instant>,
}

/// The statistics hub shared by the engine and its workers.
pub(crate) struct Live {
    started: Instant,
    state: Mutex<State>,
    system: Mutex<sysinfo::System>,
    tx: broadcast::Sender<Arc<StatsSnapshot>>,
}

impl Live {
    pub fn new() -> Live {
        let (tx, _) = broadcast::channel(64);
        Live { started: Instant::now(), state: Mutex::default(), system: Mutex::new(sysinfo::System::new()), tx }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StatsSnapshot>> {
        self.tx.subscribe()
    }

    /// Memory of the system, this process and MLX now.
    pub fn memory(&self) -> Memory {
        let mut sys = lock(&self.system);
        sys.refresh_memory();
        let (mut total, mut available) = (sys.total_memory(), sys.available_memory());
        // In a container the cgroup's limit is what counts.
        if let Some(cg) = sys.cgroup_limits() {
            if cg.total_memory > 0 && cg.total_memory < total {
                total = cg.total_memory;
                available = available.min(cg.free_memory);
            }
        }
        let process_rss = sysinfo::get_current_pid()
            .ok()
            .and_then(|pid| {
                sys.refresh_processes_specifics(
                    sysinfo::ProcessesToUpdate::Some(&[pid]),
                    true,
                    sysinfo::ProcessRefreshKind::nothing().with_memory(),
                );
                sys.process(pid).map(|p| p.memory())
            })
            .unwrap_or(0);
        let mlx = mlx::device::memory_stats();
        Memory {
            rss_bytes: process_rss,
            active_bytes: mlx.active as u64,
            peak_bytes: mlx.peak as u64,
            cache_bytes: mlx.cache as u64,
            system_total_bytes: total,
            system_available_bytes: available,
        }
    }

    pub fn snapshot(&self, models: Vec<LoadedModel>) -> StatsSnapshot {
        let memory = self.memory();
        let state = lock(&self.state);
        let running = state.running.values().next();
        let (model, stats) = match (running, &state.last) {
            (Some(r), _) => (Some(r.model.clone()), Some(r.stats.clone())),
            (None, Some(l)) => (Some(l.model.clone()), Some(l.stats.clone())),
            (None, None) => (None, None),
        };
        let spec = stats.as_ref().and_then(|s| s.spec.as_ref()).filter(|s| s.fallback.is_none());
        StatsSnapshot {
            time_ms: unix_ms(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            generating: running.is_some(),
            model,
            // `+ 0.0`: a sum of no f64 is -0.0, which JSON would carry as `-0.0`.
            tok_s: state.running.values().map(|r| r.stats.decode_tok_s).sum::<f64>() + 0.0,
            streams: state.running.len(),
            acceptance: stats.as_ref().and_then(acceptance),
            tok_per_cycle: spec.filter(|s| s.cycles > 0).map(|s| {
                if s.tok_per_cycle > 0.0 {
                    s.tok_per_cycle
                } else {
                    (s.accepted + s.cycles) as f64 / s.cycles as f64
                }
            }),
            stats: stats.clone(),
            loaded_models: models.iter().map(|m| m.id.clone()).collect(),
            models,
            running: state.running.values().cloned().collect(),
            last: state.last.clone(),
            series: state.series.iter().cloned().collect(),
            totals: state.totals.clone(),
            memory,
        }
    }

    /// Publishes a snapshot to the subscribers (none listening is fine).
    pub fn publish(&self, models: Vec<LoadedModel>) {
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(Arc::new(self.snapshot(models)));
        }
    }

    /// Records the progress of a running generation; true when it is time to publish.
    pub fn progress(&self, model: &str, request: u64, stats: &Stats) -> bool {
        let mut state = lock(&self.state);
        let generation = RunningGeneration { model: model.to_owned(), request, stats: stats.clone() };
        state.running.insert((model.to_owned(), request), generation);
        let due = state.last_publish.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY);
        if due && stats.completion_tokens > 1 {
            // The model's speed now: all its streams together.
            let tok_s = state.running.values().filter(|r| r.model == model).map(|r| r.stats.decode_tok_s).sum();
            let point = SeriesPoint { t_ms: unix_ms(), model: model.to_owned(), tok_s, acceptance: acceptance(stats) };
            push_point(&mut state.series, point);
        }
        if due {
            state.last_publish = Some(Instant::now());
        }
        due
    }

    /// Records a finished generation.
    pub fn finished(&self, model: &str, request: u64, finish: FinishReason, stats: &Stats) {
        let mut state = lock(&self.state);
        state.running.remove(&(model.to_owned(), request));
        state.totals.generations += 1;
        state.totals.prompt_tokens += stats.prompt_tokens as u64;
        state.totals.completion_tokens += stats.completion_tokens as u64;
        if stats.completion_tokens > 1 {
            let point = SeriesPoint {
                t_ms: unix_ms(),
                model: model.to_owned(),
                tok_s: stats.decode_tok_s,
                acceptance: acceptance(stats),
            };
            push_point(&mut state.series, point);
        }
        state.last = Some(LastGeneration {
            model: model.to_owned(),
            request,
            finish,
            ended_ms: unix_ms(),
            stats: stats.clone(),
        });
    }

    /// Forgets a running generation that ended without stats (an error).
    pub fn abandoned(&self, model: &str, request: u64) {
        lock(&self.state).running.remove(&(model.to_owned(), request));
    }
}

fn acceptance(stats: &Stats) -> Option<f64> {
    let spec = stats.spec.as_ref().filter(|s| s.fallback.is_none())?;
    (spec.drafted > 0).then(|| spec.accepted as f64 / spec.drafted as f64)
}

fn push_point(series: &mut VecDeque<SeriesPoint>, point: SeriesPoint) {
    if series.len() == SERIES_LEN {
        series.pop_front();
    }
    series.push_back(point);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing running is 0 tok/s, not the -0.0 of an empty float sum (`"tok_s": -0.0` in /api/stats).
    #[test]
    fn an_idle_snapshot_is_zero_tok_s() {
        let snapshot = Live::new().snapshot(Vec::new());
        assert_eq!(snapshot.streams, 0);
        assert!(snapshot.tok_s == 0.0 && snapshot.tok_s.is_sign_positive(), "{}", snapshot.tok_s);
        let json = serde_json::to_value(&snapshot).unwrap();
        assert_eq!(json["tok_s"].to_string(), "0.0");
    }
}
