//! The web UI's static files from `ui/dist`, with `index.html` for client-side routes, and JSON 404s
//! under `/api` and `/v1`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use tower::ServiceExt;
use tower_http::services::{ServeDir, ServeFile};

use super::error::ApiError;
use super::AppState;

const NOT_BUILT: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><title>Tandem</title></head>\
<body><h1>Tandem</h1><p>The web UI is not built. Build it with <code>make setup-ui</code> \
(or <code>cd ui &amp;&amp; npm install &amp;&amp; npm run build</code>) and reload.</p>\
<p>The API is running: <a href=\"/api/health\">/api/health</a>, <a href=\"/v1/models\">/v1/models</a>.</p></body></html>";

pub async fn fallback(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let path = req.uri().path();
    if path == "/v1" || path == "/api" || path.starts_with("/v1/") || path.starts_with("/api/") {
        return ApiError::not_found("not_found", format!("no route {} {path}", req.method())).into_response();
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "only GET is served here",
        )
        .into_response();
    }
    let dir = &state.ui_dir;
    let index = dir.join("index.html");
    if !index.is_file() {
        return (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")], Html(NOT_BUILT)).into_response();
    }
    let files = ServeDir::new(dir).not_found_service(ServeFile::new(index));
    match files.oneshot(req).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

pub async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}
