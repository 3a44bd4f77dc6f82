//! `/api/pull`: the engine's download jobs ([`crate::engine::downloads`]) over HTTP, their events as
//! server-sent events. What is downloaded goes to the Hub cache and is linked into the models folder.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
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
