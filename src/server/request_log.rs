//! The server's recent requests, for the Settings page: method, path (no query, no body, no
//! headers: nothing secret), status and time, in a ring of the last [`KEPT`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;
use ts_rs::TS;

use super::AppState;

/// Requests kept.
pub const KEPT: usize = 200;

#[derive(Debug, Clone, Serialize, TS)]
pub struct LoggedRequest {
    /// When it arrived (Unix milliseconds).
    pub at_ms: u64,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Until the response's head (a stream goes on after it).
    pub ms: f64,
}

/// `GET /api/server/requests`: newest first.
#[derive(Debug, Clone, Serialize, TS)]
pub struct RequestLog {
    pub requests: Vec<LoggedRequest>,
}

#[derive(Default)]
pub struct Requests {
    ring: Mutex<VecDeque<LoggedRequest>>,
    served: AtomicU64,
}

impl Requests {
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    pub fn recent(&self) -> RequestLog {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        RequestLog { requests: ring.iter().rev().cloned().collect() }
    }

    fn push(&self, entry: LoggedRequest) {
        self.served.fetch_add(1, Ordering::Relaxed);
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == KEPT {
            ring.pop_front();
        }
        ring.push_back(entry);
    }
}

/// Only the API's requests are kept: not the UI's files, and not the polling that would bury the
/// rest (statistics, this log, the server's state).
fn worth_logging(path: &str) -> bool {
    (path.starts_with("/v1/") || path.starts_with("/api/"))
        && !path.starts_with("/api/stats")
        && !path.starts_with("/api/server")
        && path != "/api/health"
}

pub async fn record(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    if !worth_logging(&path) {
        return next.run(req).await;
    }
    let method = req.method().to_string();
    let (at_ms, t0) = (crate::engine::live::unix_ms(), Instant::now());
    let response = next.run(req).await;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    state.requests.push(LoggedRequest { at_ms, method, path, status: response.status().as_u16(), ms });
    response
}
