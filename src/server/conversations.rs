//! The UI's conversations, kept by the server: one JSON file per conversation in the
//! conversations folder (`conversations_dir` in models.toml, by default `conversations` beside the
//! models folder). A browser's own storage belongs to one origin, and the desktop window's origin
//! changes with the port, so conversations kept there could vanish; kept here they do not.
//!
//! - `GET /api/conversations` -> `{"conversations": [{"id", "title", "updated"}]}`, newest first;
//! - `GET /api/conversations/{id}` -> the conversation as it was saved;
//! - `PUT /api/conversations/{id}` with the whole conversation -> 201 (new) or 200, its summary;
//! - `DELETE /api/conversations/{id}` -> `{"id", "deleted": true}`.
//!
//! Ids are 1 to 128 letters, digits, `-` and `_` (so a file name, never a path); bodies are limited
//! by the server's body limit; files are written to a temporary file in the same folder and renamed
//! over the old one, so a crash never leaves half a conversation.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::{ApiError, ApiJson};
use super::AppState;

/// The longest id accepted.
const MAX_ID: usize = 128;

/// What the list shows of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub id: String,
    pub title: String,
    /// Milliseconds since the Unix epoch.
    pub updated: u64,
}

/// The fields the server relies on; everything else in a conversation is kept as sent.
#[derive(Deserialize)]
#[serde(expecting = "a conversation (an object)")]
#[allow(dead_code)] // read to check their types only
struct Shape {
    id: String,
    title: String,
    updated: u64,
    #[serde(default)]
    created: Option<u64>,
    messages: Vec<MessageShape>,
}

#[derive(Deserialize)]
#[serde(expecting = "a message (an object)")]
#[allow(dead_code)]
struct MessageShape {
    role: Role,
    content: String,
    #[serde(default)]
    images: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    Assistant,
    System,
}

/// The conversations folder, and the summaries read from it (by file modification time and
/// length, so a list reads only what changed).
pub struct Store {
    dir: PathBuf,
    summaries: Mutex<HashMap<String, (Option<SystemTime>, u64, Summary)>>,
    /// Serializes writes and deletes.
    write: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A checked id: a file name, never a path.
fn check_id(id: &str) -> Result<&str, ApiError> {
    let ok =
        !id.is_empty() && id.len() <= MAX_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(id)
    } else {
        let shown: String = id.chars().take(MAX_ID + 8).collect();
        Err(ApiError::bad_request(
            "invalid_conversation_id",
            format!(
                "conversation id `{}` is not valid: ids are 1 to {MAX_ID} letters, digits, `-` or `_`",
                shown.escape_debug()
            ),
        ))
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found("conversation_not_found", format!("no conversation `{id}`"))
}

impl Store {
    pub fn new(dir: PathBuf) -> Store {
        Store { dir, summaries: Mutex::default(), write: Mutex::new(()) }
    }

    fn file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Every readable conversation, newest first. Files that are not conversations are skipped
    /// (with a warning), not fatal: one bad file must not hide the others.
    pub fn list(&self) -> Result<Vec<Summary>, ApiError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "cannot read the conversations folder {}: {e}",
                    self.dir.display()
                )))
            }
        };
        let mut cache = lock(&self.summaries);
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
            if check_id(id).is_err() {
                continue; // temporary files (`.ID.json.XXXX.tmp`) and anything else
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let stamp = (meta.modified().ok(), meta.len());
            seen.push(id.to_owned());
            if let Some((modified, len, summary)) = cache.get(id) {
                if (*modified, *len) == stamp {
                    out.push(summary.clone());
                    continue;
                }
            }
            match read_summary(&entry.path(), id) {
                Ok(summary) => {
                    cache.insert(id.to_owned(), (stamp.0, stamp.1, summary.clone()));
                    out.push(summary);
                }
                Err(message) => tracing::warn!("skipping {}: {message}", entry.path().display()),
            }
        }
        cache.retain(|id, _| seen.contains(id));
        out.sort_by(|a, b| b.updated.cmp(&a.updated).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }

    pub fn get(&self, id: &str) -> Result<Value, ApiError> {
        let path = self.file(check_id(id)?);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found(id)),
            Err(e) => return Err(ApiError::internal(format!("cannot read {}: {e}", path.display()))),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::internal(format!("{} is not valid JSON: {e}", path.display())))
    }

    /// Checks `conversation` and writes it atomically. True when it is new.
    pub fn put(&self, id: &str, conversation: &Value) -> Result<(Summary, bool), ApiError> {
        let id = check_id(id)?;
        let shape: Shape = serde_path_to_error::deserialize(conversation).map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." { String::new() } else { format!("`{path}`: ") };
            ApiError::bad_request("invalid_value", format!("invalid conversation: {at}{}", e.into_inner()))
        })?;
        if shape.id != id {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!(
                    "invalid conversation: `id`: the body's id `{}` is not the URL's `{id}`",
                    shape.id.escape_debug()
                ),
            ));
        }
        let summary = Summary { id: id.to_owned(), title: shape.title, updated: shape.updated };
        let bytes = serde_json::to_vec(conversation)
            .map_err(|e| ApiError::internal(format!("cannot encode the conversation: {e}")))?;
        let _write = lock(&self.write);
        create_private_dir(&self.dir).map_err(|e| {
            ApiError::internal(format!("cannot create the conversations folder {}: {e}", self.dir.display()))
        })?;
        let path = self.file(id);
        let new = !path.exists();
        write_atomic(&self.dir, &path, &bytes)
            .map_err(|e| ApiError::internal(format!("cannot write {}: {e}", path.display())))?;
        if let Ok(meta) = std::fs::metadata(&path) {
            lock(&self.summaries).insert(id.to_owned(), (meta.modified().ok(), meta.len(), summary.clone()));
        }
        Ok((summary, new))
    }

    pub fn delete(&self, id: &str) -> Result<(), ApiError> {
        let path = self.file(check_id(id)?);
        let _write = lock(&self.write);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                lock(&self.summaries).remove(id);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_found(id)),
            Err(e) => Err(ApiError::internal(format!("cannot delete {}: {e}", path.display()))),
        }
    }
}

fn read_summary(path: &Path, id: &str) -> Result<Summary, String> {
    #[derive(Deserialize)]
    struct Head {
        title: String,
        updated: u64,
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let head: Head = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    Ok(Summary { id: id.to_owned(), title: head.title, updated: head.updated })
}

/// Creates the folder (and its parents), readable by its owner only where that can be said.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// A temporary file in the same folder (readable by its owner only), flushed to disk, then renamed
/// over `path`; on failure the old file is untouched and the temporary one removed.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut file = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Runs file work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("a background task failed: {e}")))?
}

pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    blocking(move || Ok(Json(json!({ "conversations": state.conversations.list()? })))).await
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
    blocking(move || Ok(Json(state.conversations.get(&id)?))).await
}

pub async fn put(
    State(state): State<Arc<AppState>>,
    id: Result<UrlPath<String>, PathRejection>,
    ApiJson(conversation): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let id = url_id(id)?;
    blocking(move || {
        let (summary, new) = state.conversations.put(&id, &conversation)?;
        let status = if new { StatusCode::CREATED } else { StatusCode::OK };
        Ok((status, Json(summary)).into_response())
    })
    .await
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = url_id(id)?;
    blocking(move || {
        state.conversations.delete(&id)?;
        Ok(Json(json!({ "id": id, "deleted": true })))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "0f8c2a8e-4b1d-4e0b-9a51-3c1f2d9e8b7a", "lxk3z9_ab", &"x".repeat(MAX_ID)] {
            assert!(check_id(ok).is_ok(), "{ok}");
        }
        for bad in
            ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "a.json", "a b", "é", "\0", &"x".repeat(MAX_ID + 1)]
        {
            let e = check_id(bad).unwrap_err();
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "invalid_conversation_id"), "{bad:?}");
        }
    }
}
