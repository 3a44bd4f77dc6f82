//! `/api/conversations`: the engine's conversation store ([`crate::engine::conversations`]) over HTTP.
//!
//! - `GET /api/conversations` -> `{"conversations": [{"id", "title", "updated"}]}`, newest first;
//! - `GET /api/conversations/{id}` -> the conversation as it was saved;
//! - `PUT /api/conversations/{id}` with the whole conversation -> 201 (new) or 200, its summary;
//! - `DELETE /api/conversations/{id}` -> `{"id", "deleted": true}`.
//!
//! Bodies are limited by the server's body limit.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::error::{ApiError, ApiJson};
use super::wire::{ConversationDeleted, ConversationList};
use super::{blocking, AppState};

pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<ConversationList>, ApiError> {
    blocking(move || Ok(Json(ConversationList { conversations: state.engine.conversations().list()? }))).await
}

/// The id in the URL; one that is not even text is refused like any other bad id.
fn url_id(id: Result<UrlPath<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|UrlPath(id)| id).map_err(|e| {
        ApiError::bad_request(
            "invalid_conversation_id",
            format!("the conversation id in the URL is not valid: {}", e.body_text()),
        )
    })
}

pub async fn get(
    State(state): State<Arc<AppState>>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = url_id(id)?;
    blocking(move || Ok(Json(state.engine.conversations().get(&id)?))).await
}

pub async fn put(
    State(state): State<Arc<AppState>>,
    id: Result<UrlPath<String>, PathRejection>,
    ApiJson(conversation): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let id = url_id(id)?;
    blocking(move || {
        let (summary, new) = state.engine.conversations().put(&id, &conversation)?;
        let status = if new { StatusCode::CREATED } else { StatusCode::OK };
        Ok((status, Json(summary)).into_response())
    })
    .await
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Result<Json<ConversationDeleted>, ApiError> {
    let id = url_id(id)?;
    blocking(move || {
        state.engine.conversations().delete(&id)?;
        Ok(Json(ConversationDeleted { id, deleted: true }))
    })
    .await
}
