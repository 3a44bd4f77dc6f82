//! The Settings page's API: the app-wide settings (`GET`/`PATCH /api/settings`), the server's own
//! state (`GET /api/server`) and its recent requests (`GET /api/server/requests`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use super::error::{ApiError, ApiJson};
use super::request_log::RequestLog;
use super::wire::{ServerInfo, SettingsView};
use super::{blocking, AppState};
use crate::registry::AppPatch;

pub async fn get(State(state): State<Arc<AppState>>) -> Json<SettingsView> {
    Json(view(&state))
}

/// Saves a change; the server's own settings (`server`) apply when it next starts, which the
/// answer's `restart_needed` says.
pub async fn patch(
    State(state): State<Arc<AppState>>,
    ApiJson(patch): ApiJson<AppPatch>,
) -> Result<Json<SettingsView>, ApiError> {
    let s = state.clone();
    blocking(move || {
        s.engine.update_app_settings_blocking(&patch)?;
        Ok(Json(view(&s)))
    })
    .await
}

fn view(state: &AppState) -> SettingsView {
    SettingsView { restart_needed: restart_needed(state), settings: state.engine.registry().app_settings() }
}

/// The saved `[server]` differs from the one this server started with.
fn restart_needed(state: &AppState) -> bool {
    state.engine.registry().server() != &state.started_with
}

pub async fn server(State(state): State<Arc<AppState>>) -> Json<ServerInfo> {
    let bound = state.policy.bound;
    Json(ServerInfo {
        url: super::local_url(bound),
        listening: bound.to_string(),
        exposed: !state.policy.loopback_only(),
        api_key_required: state.policy.api_key.is_some(),
        uptime_s: state.started.elapsed().as_secs_f64(),
        requests_served: state.requests.served(),
        restart_needed: restart_needed(&state),
    })
}

pub async fn requests(State(state): State<Arc<AppState>>) -> Json<RequestLog> {
    Json(state.requests.recent())
}
