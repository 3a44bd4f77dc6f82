//! Errors as the API returns them: `{"error": {"message", "type", "code"}}` with the right status,
//! and the JSON body extractor whose every rejection is such an error.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::wire::{ErrorBody, ErrorDetail};
use crate::engine::{ConversationError, EngineError};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's error `type`: invalid_request_error, authentication_error, permission_error,
    /// not_found_error, rate_limit_error, server_error.
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, code, message: message.into() }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", code, message)
    }
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", code, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error", message)
    }

    /// The JSON body, also used inside event streams.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail { message: self.message.clone(), kind: self.kind.into(), code: self.code.into() },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, code = self.code, "{}", self.message);
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<ConversationError> for ApiError {
    fn from(e: ConversationError) -> Self {
        let message = e.message();
        match e {
            ConversationError::InvalidId(_) => ApiError::bad_request("invalid_conversation_id", message),
            ConversationError::NotFound(_) => ApiError::not_found("conversation_not_found", message),
            ConversationError::Invalid(_) => ApiError::bad_request("invalid_value", message),
            ConversationError::Io { .. } | ConversationError::Corrupt { .. } => ApiError::internal(message),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.message();
        match e {
            EngineError::UnknownModel { .. } => ApiError::not_found("model_not_found", message),
            EngineError::NotLoaded(_) => {
                ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "model_not_loaded", message)
            }
            EngineError::Busy { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "queue_full", message)
            }
            EngineError::NotEnoughMemory { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "insufficient_memory", message)
            }
            EngineError::Load { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "model_load_failed", message)
            }
            EngineError::ImagesBusy { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "queue_full", message)
            }
            EngineError::Images(_) => ApiError::bad_request("model_not_multimodal", message),
            EngineError::InvalidImage(_) => ApiError::bad_request("invalid_image", message),
            EngineError::InvalidRequest(_) => ApiError::bad_request("invalid_value", message),
            EngineError::ContextLength { .. } | EngineError::PromptTooLarge { .. } => {
                ApiError::bad_request("context_length_exceeded", message)
            }
            EngineError::ConversionsBusy { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "too_many_conversions", message)
            }
            EngineError::Unloaded(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "model_unloaded", message)
            }
            EngineError::InvalidSettings(_) => ApiError::bad_request("invalid_value", message),
            EngineError::Hub(e) => {
                use crate::hub::HubError as H;
                match &*e {
                    H::NotFound { .. } => ApiError::not_found("hub_not_found", message),
                    H::Unauthorized { .. } => ApiError::forbidden("hub_unauthorized", message),
                    H::InvalidRepo { .. } | H::BadQuery(_) | H::BadPattern(_) => {
                        ApiError::bad_request("invalid_value", message)
                    }
                    H::Offline { .. } | H::OfflineSearch => {
                        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "hub_offline", message)
                    }
                    _ => ApiError::new(StatusCode::BAD_GATEWAY, "server_error", "hub_unreachable", message),
                }
            }
            EngineError::Registry(_) | EngineError::Generate(_) | EngineError::Internal(_) => {
                ApiError::internal(message)
            }
        }
    }
}

/// Bodies of this size or more (or of unknown size) take one of [`LARGE_BODIES_AT_ONCE`] slots.
const LARGE_BODY: u64 = 1 << 20;
/// How many large bodies are read and parsed at once; more wait their turn.
pub const LARGE_BODIES_AT_ONCE: usize = 4;

static LARGE_BODIES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LARGE_BODIES_AT_ONCE);

/// A JSON body. Unlike `axum::Json`, every rejection is an [`ApiError`]: a body over the limit is
/// 413, a wrong content type 415, bad JSON or a wrong type 400 with the path of the bad field.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .is_some_and(|v| v == "application/json" || (v.starts_with("application/") && v.ends_with("+json")));
        if !json_type {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "unsupported_media_type",
                "the body must be JSON, sent with `Content-Type: application/json`",
            ));
        }
        // Large bodies are read and parsed a few at a time, so what many at once can cost is bounded
        // (each costs about twice its size while it is parsed; docs/PERF.md has the figures).
        let length = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let _large = match length {
            Some(n) if n < LARGE_BODY => None,
            _ => Some(LARGE_BODIES.acquire().await.map_err(|_| ApiError::internal("the server is stopping"))?),
        };
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    status,
                    "invalid_request_error",
                    "body_too_large",
                    "the request body is larger than the server accepts",
                )
            } else {
                ApiError::bad_request(
                    "invalid_body",
                    format!("cannot read the request body: {}", rejection.body_text()),
                )
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses JSON, naming the field where a value has the wrong type.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let at = if path == "." { String::new() } else { format!("`{path}`: ") };
                ApiError::bad_request("invalid_value", format!("invalid request: {at}{inner}"))
            }
            _ => invalid_json(&inner),
        }
    })?;
    de.end().map_err(|e| invalid_json(&e))?;
    Ok(value)
}

fn invalid_json(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
}
