//! The UI's conversations, kept on disk: one JSON file per conversation in the conversations folder
//! (`conversations_dir` in models.toml, by default `conversations` beside the models folder). A
//! browser's own storage belongs to one origin, and the desktop window's origin changes with the
//! port, so conversations kept there could vanish; kept here they do not.
//!
//! Ids are 1 to 128 letters, digits, `-` and `_` (so a file name, never a path); files are replaced
//! atomically, so a crash never leaves half a conversation. A conversation is checked for the fields
//! the store relies on ([`ConversationCore`]); everything else in it is kept as sent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use ts_rs::TS;

use crate::sync::lock;

/// The longest id accepted.
pub const MAX_ID: usize = 128;

/// What the list shows of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, TS)]
pub struct ConversationSummary {
    pub id: String,
    pub title: String,
    /// Milliseconds since the Unix epoch.
    pub updated: u64,
}

/// The fields of a conversation the store relies on; a client may add any others, which are kept.
#[derive(Debug, Clone, Deserialize, Serialize, TS)]
#[serde(expecting = "a conversation (an object)")]
pub struct ConversationCore {
    pub id: String,
    pub title: String,
    /// Milliseconds since the Unix epoch.
    pub updated: u64,
    #[serde(default)]
    #[ts(optional)]
    pub created: Option<u64>,
    pub messages: Vec<MessageCore>,
}

/// The fields of a message the store relies on.
#[derive(Debug, Clone, Deserialize, Serialize, TS)]
#[serde(expecting = "a message (an object)")]
pub struct MessageCore {
    pub role: Role,
    pub content: String,
    /// Images attached to a user message, as data URLs.
    #[serde(default)]
    #[ts(optional)]
    pub images: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    System,
}

#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error("conversation id `{}` is not valid: ids are 1 to {MAX_ID} letters, digits, `-` or `_`", shown(.0))]
    InvalidId(String),
    #[error("no conversation `{0}`")]
    NotFound(String),
    /// The body is not a conversation; the message names the field.
    #[error("invalid conversation: {0}")]
    Invalid(String),
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not valid JSON", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl ConversationError {
    /// The error with its cause, as one line.
    pub fn message(&self) -> String {
        match std::error::Error::source(self) {
            Some(cause) => format!("{self}: {cause}"),
            None => self.to_string(),
        }
    }
}

/// An id as an error shows it: escaped, and not much longer than a valid one.
fn shown(id: &str) -> String {
    let shown: String = id.chars().take(MAX_ID + 8).collect();
    shown.escape_debug().to_string()
}

/// A checked id: a file name, never a path.
pub fn check_id(id: &str) -> Result<&str, ConversationError> {
    let ok =
        !id.is_empty() && id.len() <= MAX_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(id)
    } else {
        Err(ConversationError::InvalidId(id.to_owned()))
    }
}

/// The conversations folder, and the summaries read from it (by file modification time and
/// length, so a list reads only what changed).
/// Each file's summary with the modification time and length it was read at.
type Summaries = HashMap<String, (Option<SystemTime>, u64, ConversationSummary)>;

pub struct ConversationStore {
    dir: PathBuf,
    summaries: Mutex<Summaries>,
    /// Serializes writes and deletes.
    write: Mutex<()>,
}

impl ConversationStore {
    pub fn new(dir: PathBuf) -> ConversationStore {
        ConversationStore { dir, summaries: Mutex::default(), write: Mutex::new(()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Every readable conversation, newest first. Files that are not conversations are skipped
    /// (with a warning), not fatal: one bad file must not hide the others.
    pub fn list(&self) -> Result<Vec<ConversationSummary>, ConversationError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(ConversationError::Io {
                    what: "cannot read the conversations folder",
                    path: self.dir.clone(),
                    source,
                })
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

    /// The conversation as it was saved.
    pub fn get(&self, id: &str) -> Result<Value, ConversationError> {
        let path = self.file(check_id(id)?);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ConversationError::NotFound(id.into())),
            Err(source) => return Err(ConversationError::Io { what: "cannot read", path, source }),
        };
        serde_json::from_slice(&bytes).map_err(|source| ConversationError::Corrupt { path, source })
    }

    /// Checks `conversation` and writes it atomically. True when it is new.
    pub fn put(&self, id: &str, conversation: &Value) -> Result<(ConversationSummary, bool), ConversationError> {
        let id = check_id(id)?;
        let core: ConversationCore = serde_path_to_error::deserialize(conversation).map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." { String::new() } else { format!("`{path}`: ") };
            ConversationError::Invalid(format!("{at}{}", e.into_inner()))
        })?;
        if core.id != id {
            return Err(ConversationError::Invalid(format!(
                "`id`: the body's id `{}` is not the URL's `{id}`",
                core.id.escape_debug()
            )));
        }
        let summary = ConversationSummary { id: id.to_owned(), title: core.title, updated: core.updated };
        let bytes = serde_json::to_vec(conversation)
            .map_err(|source| ConversationError::Corrupt { path: self.file(id), source })?;
        let _write = lock(&self.write);
        create_private_dir(&self.dir).map_err(|source| ConversationError::Io {
            what: "cannot create the conversations folder",
            path: self.dir.clone(),
            source,
        })?;
        let path = self.file(id);
        let new = !path.exists();
        crate::atomic_file::write_atomic(&path, &bytes).map_err(|source| ConversationError::Io {
            what: "cannot write",
            path: path.clone(),
            source,
        })?;
        if let Ok(meta) = std::fs::metadata(&path) {
            lock(&self.summaries).insert(id.to_owned(), (meta.modified().ok(), meta.len(), summary.clone()));
        }
        Ok((summary, new))
    }

    pub fn delete(&self, id: &str) -> Result<(), ConversationError> {
        let path = self.file(check_id(id)?);
        let _write = lock(&self.write);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                lock(&self.summaries).remove(id);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ConversationError::NotFound(id.into())),
            Err(source) => Err(ConversationError::Io { what: "cannot delete", path, source }),
        }
    }
}

fn read_summary(path: &Path, id: &str) -> Result<ConversationSummary, String> {
    #[derive(Deserialize)]
    struct Head {
        title: String,
        updated: u64,
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let head: Head = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    Ok(ConversationSummary { id: id.to_owned(), title: head.title, updated: head.updated })
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
            assert!(matches!(check_id(bad), Err(ConversationError::InvalidId(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_body_that_is_not_a_conversation_names_the_field_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path().join("c"));
        let body =
            serde_json::json!({"id": "a", "title": "t", "updated": 1, "messages": [{"role": "robot", "content": ""}]});
        let e = store.put("a", &body).unwrap_err();
        assert!(matches!(&e, ConversationError::Invalid(m) if m.starts_with("`messages[0].role`")), "{e}");
        assert!(!dir.path().join("c").exists());
    }
}
