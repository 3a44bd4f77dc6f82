//! The admin API: health, models (list, load, unload, settings) and live statistics.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::{BroadcastStream, IntervalStream};

use super::error::{ApiError, ApiJson};
use super::wire::{Health, ModelList};
use super::AppState;
use crate::engine::{ModelStatus, StatsSnapshot};
use crate::registry::SettingsPatch;

/// How often the stats stream sends a snapshot when nothing happens (memory still changes).
const STATS_TICK: Duration = Duration::from_secs(2);

pub async fn health(State(state): State<Arc<AppState>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: state.started.elapsed().as_secs_f64(),
        models_loaded: state.engine.loaded(),
        api_key_required: state.policy.api_key.is_some(),
        backend: match mlx::device::backend() {
            mlx::device::Backend::Metal => "metal",
            mlx::device::Backend::Cuda => "cuda",
            mlx::device::Backend::Cpu => "cpu",
        }
        .into(),
    })
}

use super::blocking;

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || {
        let registry = engine.registry();
        Ok(Json(ModelList {
            models: engine.models(),
            default: registry.default_model().ok().map(|m| m.name),
            models_dir: registry.models_dir().to_path_buf(),
        }))
    })
    .await
}

pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<ModelStatus>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || Ok(Json(engine.model_status(&id)?))).await
}

pub async fn load(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<ModelStatus>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || {
        engine.load_blocking(&id)?;
        Ok(Json(engine.model_status(&id)?))
    })
    .await
}

pub async fn unload(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<ModelStatus>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || {
        // An unknown name is a 404, not a silent no-op.
        engine.entry(&id)?;
        engine.unload_blocking(&id);
        Ok(Json(engine.model_status(&id)?))
    })
    .await
}

pub async fn settings(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    ApiJson(patch): ApiJson<SettingsPatch>,
) -> Result<Json<ModelStatus>, ApiError> {
    let engine = state.engine.clone();
    blocking(move || {
        engine.update_settings_blocking(&id, &patch)?;
        Ok(Json(engine.model_status(&id)?))
    })
    .await
}

pub async fn stats(State(state): State<Arc<AppState>>) -> Json<StatsSnapshot> {
    Json(state.engine.stats())
}

/// Server-sent events, one `data:` line per [`StatsSnapshot`]: one at once, then on every engine
/// event (a few per second while generating) and every 2 s otherwise.
pub async fn stats_stream(State(state): State<Arc<AppState>>) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let engine = state.engine.clone();
    let first = futures::stream::iter([Arc::new(engine.stats())]);
    let published = BroadcastStream::new(engine.subscribe_stats()).filter_map(|r| async move { r.ok() });
    let mut interval = tokio::time::interval(STATS_TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ticks = IntervalStream::new(interval).skip(1).map({
        let engine = engine.clone();
        move |_| Arc::new(engine.stats())
    });
    let stream = first
        .chain(futures::stream::select(published, ticks))
        .map(|snapshot| Ok(SseEvent::default().data(serde_json::to_string(&*snapshot).unwrap_or_else(|_| "{}".into()))))
        .take_until(state.shutdown_signal());
    Sse::new(stream).keep_alive(KeepAlive::default())
}
