//! `/api/pull`: the engine's download jobs ([`crate::engine::downloads`]) over HTTP, their events as
//! server-sent events. What is downloaded goes to the Hub cache and is linked into the models folder.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::error::{ApiError, ApiJson};
use super::AppState;
use crate::engine::downloads::{Download, DownloadEvent, DownloadView};
use crate::engine::remote::{CatalogView, PreviewView};
use crate::hub::{HubModel, RepoRef};

/// `POST /api/pull`
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "PullRequest", optional_fields)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `ORG/NAME`, optionally `@BRANCH`, `@TAG` or `@COMMIT`.
    #[ts(optional = false)]
    repo: String,
    /// Glob patterns of the files to fetch; absent or empty: every file.
    include: Option<Vec<String>>,
}

/// `GET /api/pull`: every download kept, oldest first.
#[derive(Debug, Clone, Serialize, TS)]
pub struct DownloadList {
    pub downloads: Vec<DownloadView>,
}

fn download(state: &AppState, id: &str) -> Result<Arc<Download>, ApiError> {
    state
        .engine
        .downloads()
        .get(id)
        .ok_or_else(|| ApiError::not_found("download_not_found", format!("no download `{id}`")))
}

pub async fn start(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<PullRequest>,
) -> Result<Response, ApiError> {
    let repo =
        req.repo.parse().map_err(|e: crate::hub::HubError| ApiError::bad_request("invalid_value", e.to_string()))?;
    let view = state.engine.pull(repo, req.include.unwrap_or_default())?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

pub async fn list(State(state): State<Arc<AppState>>) -> Json<DownloadList> {
    Json(DownloadList { downloads: state.engine.downloads().list() })
}

pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<DownloadView>, ApiError> {
    Ok(Json(download(&state, &id)?.view()))
}

/// Cancels a running download (202; what arrived is kept for a resume), or forgets a finished one (200).
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let d = download(&state, &id)?;
    if d.view().state.is_final() {
        state.engine.downloads().remove(&id);
        return Ok((StatusCode::OK, Json(d.view())).into_response());
    }
    d.cancel();
    Ok((StatusCode::ACCEPTED, Json(d.view())).into_response())
}

/// The newest event, then live ones, ending after `finished`, `error` or `cancelled`.
pub async fn events(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let (last, live) = download(&state, &id)?.subscribe();
    Ok(super::job_events(&state, last.into_iter().collect(), live, |e| matches!(e, DownloadEvent::End(_))))
}

/// `GET /api/catalog`: the known Qwen3.5-family repos, each with what fits this machine.
#[derive(Debug, Clone, Serialize, TS)]
pub struct CatalogList {
    pub entries: Vec<CatalogView>,
    /// This machine's memory, for the figures beside each fit.
    pub memory_total: u64,
}

pub async fn catalog(State(state): State<Arc<AppState>>) -> Json<CatalogList> {
    let memory_total = state.engine.memory_total();
    Json(CatalogList { entries: state.engine.catalog(), memory_total })
}

#[derive(Debug, Deserialize)]
pub struct SearchQuery {
    q: String,
}

/// `GET /api/hub/search?q=…`
#[derive(Debug, Clone, Serialize, TS)]
pub struct HubSearch {
    pub models: Vec<HubModel>,
}

/// Runs `f` on a blocking thread (the Hub's requests), its panic an internal error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::engine::EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("the Hub request failed: {e}")))?
        .map_err(ApiError::from)
}

pub async fn search(
    State(state): State<Arc<AppState>>,
    Query(q): Query<SearchQuery>,
) -> Result<Json<HubSearch>, ApiError> {
    let engine = state.engine.clone();
    let models = blocking(move || engine.search_hub(&q.q)).await?;
    Ok(Json(HubSearch { models }))
}

#[derive(Debug, Deserialize)]
pub struct PreviewQuery {
    repo: String,
}

fn repo_ref(text: &str) -> Result<RepoRef, ApiError> {
    text.parse().map_err(|e: crate::hub::HubError| ApiError::bad_request("invalid_value", e.to_string()))
}

/// `GET /api/hub/preview?repo=ORG/NAME[@REV]`: sizes, the head and the fit, before downloading.
pub async fn preview(
    State(state): State<Arc<AppState>>,
    Query(q): Query<PreviewQuery>,
) -> Result<Json<PreviewView>, ApiError> {
    let r = repo_ref(&q.repo)?;
    let engine = state.engine.clone();
    Ok(Json(blocking(move || engine.preview(&r)).await?))
}

/// `POST /api/models/{id}/graft`
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "GraftRequest", optional_fields)]
#[serde(deny_unknown_fields)]
pub struct GraftRequest {
    /// The raw checkpoint to take the head from (`ORG/NAME[@REV]`); default: the model's `base_model`.
    from: Option<String>,
}

/// Fetches the raw head and grafts it onto the model, as a download job (202).
pub async fn graft(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<GraftRequest>,
) -> Result<Response, ApiError> {
    let from = req.from.as_deref().map(repo_ref).transpose()?;
    let engine = state.engine.clone();
    let view = blocking(move || engine.graft(&id, from)).await?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}
