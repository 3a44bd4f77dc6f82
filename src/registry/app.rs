//! models.toml's app-wide settings, those of the Settings page: where models and conversations
//! live, the default model, `[server]` (how `tandem serve` and the desktop app listen) and `[ui]`
//! (the web UI's theme and the context policy of new chats).
//!
//! ```toml
//! [server]
//! port = 11435          # default 11435
//! expose = false        # true: listen on every network interface (needs api_key)
//! api_key = "..."       # required as `Authorization: Bearer <key>` when set
//! [ui]
//! theme = "system"      # "system", "light" or "dark"
//! context_policy = "rolling"   # a chat past its context: "rolling", "middle" or "stop"
//! ```
//! The server's settings apply when it next starts; the rest at once.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use toml_edit::{DocumentMut, Item, Table, TableLike};

use super::{parse_error, set_key, write_atomic, Place, RegistryError, SettingError};

/// The port `tandem serve` and the desktop app listen on when models.toml does not say.
pub const DEFAULT_PORT: u16 = 11435;

/// `[server]` of models.toml.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub port: Option<u16>,
    /// Listen on every interface instead of loopback only (an API key is then required).
    #[serde(default)]
    pub expose: bool,
    pub api_key: Option<String>,
}

impl ServerSettings {
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_PORT)
    }

    /// The address to bind: every interface when exposed, else loopback.
    pub fn host(&self) -> &'static str {
        if self.expose {
            "0.0.0.0"
        } else {
            "127.0.0.1"
        }
    }

    pub fn check(&self) -> Result<(), SettingError> {
        if self.port == Some(0) {
            return Err(SettingError { field: "server.port", value: "0".into(), expected: "a port from 1 to 65535" });
        }
        if let Some(key) = &self.api_key {
            if let Some(why) = api_key_problem(key) {
                return Err(SettingError { field: "server.api_key", value: "(hidden)".into(), expected: why });
            }
        }
        if self.expose && self.api_key.is_none() {
            return Err(SettingError {
                field: "server.expose",
                value: "true".into(),
                expected: "false unless server.api_key is set (anyone on the network could use the models)",
            });
        }
        Ok(())
    }
}

/// Why a key could never be sent, if so. Clients send it as `Authorization: Bearer <key>`, which
/// carries visible ASCII only and is compared trimmed: an empty or blank key, one with spaces at
/// either end or one with other characters would bind beyond loopback with a key nobody can send.
pub fn api_key_problem(key: &str) -> Option<&'static str> {
    if key.trim().is_empty() {
        Some("is empty or only spaces")
    } else if key.trim() != key {
        Some("starts or ends with a space")
    } else if !key.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        Some("holds characters other than visible ASCII (an HTTP header cannot carry them)")
    } else {
        None
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum Theme {
    /// The system's light or dark appearance.
    #[default]
    System,
    Light,
    Dark,
}

/// What a chat does when its history no longer fits the model's context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum ContextPolicy {
    /// Leave out the oldest messages (the system prompt stays).
    #[default]
    Rolling,
    /// Leave out messages from the middle (the first exchange and the latest stay).
    Middle,
    /// Stop and say so.
    Stop,
}

/// `[ui]` of models.toml.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct UiSettings {
    pub theme: Theme,
    /// The policy of new chats (each chat may change its own).
    pub context_policy: ContextPolicy,
}

/// The app-wide settings as `GET /api/settings` shows them (the API key itself is never shown).
#[derive(Debug, Clone, PartialEq, Serialize, TS)]
pub struct AppSettings {
    /// The models.toml these settings are saved in.
    pub config_path: std::path::PathBuf,
    pub models_dir: std::path::PathBuf,
    pub conversations_dir: std::path::PathBuf,
    pub default_model: Option<String>,
    pub server: ServerView,
    pub ui: UiSettings,
}

#[derive(Debug, Clone, PartialEq, Serialize, TS)]
pub struct ServerView {
    pub port: u16,
    pub expose: bool,
    pub api_key_set: bool,
}

/// A change of the app-wide settings (`PATCH /api/settings`): what is left out stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
#[ts(optional_fields)]
pub struct AppPatch {
    /// A folder; `~` is the home folder. Created when missing.
    pub models_dir: Option<String>,
    pub conversations_dir: Option<String>,
    /// A model's name.
    pub default_model: Option<String>,
    #[ts(optional)]
    pub server: Option<ServerPatch>,
    #[ts(optional)]
    pub ui: Option<UiPatch>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
#[ts(optional_fields)]
pub struct ServerPatch {
    pub port: Option<u16>,
    pub expose: Option<bool>,
    /// The new key; an empty string removes it.
    pub api_key: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
#[ts(optional_fields)]
pub struct UiPatch {
    pub theme: Option<Theme>,
    pub context_policy: Option<ContextPolicy>,
}

impl AppPatch {
    /// The patch as (table, key, value) edits of the file's top level (table "" for a root key);
    /// a value of None removes the key.
    pub(super) fn edits(&self) -> Vec<(&'static str, &'static str, Option<toml_edit::Value>)> {
        let text = |s: &String| Some(toml_edit::Value::from(s.as_str()));
        let mut edits = Vec::new();
        let root = [("models_dir", &self.models_dir), ("conversations_dir", &self.conversations_dir)];
        for (key, value) in root {
            if let Some(v) = value {
                edits.push(("", key, text(v)));
            }
        }
        if let Some(v) = &self.default_model {
            edits.push(("", "default", text(v)));
        }
        if let Some(s) = &self.server {
            if let Some(port) = s.port {
                edits.push(("server", "port", Some(toml_edit::Value::from(i64::from(port)))));
            }
            if let Some(expose) = s.expose {
                edits.push(("server", "expose", Some(toml_edit::Value::from(expose))));
            }
            if let Some(key) = &s.api_key {
                edits.push(("server", "api_key", Some(key).filter(|k| !k.is_empty()).and_then(text)));
            }
        }
        if let Some(u) = &self.ui {
            if let Some(theme) = u.theme {
                edits.push(("ui", "theme", Some(theme.word().into())));
            }
            if let Some(policy) = u.context_policy {
                edits.push(("ui", "context_policy", Some(policy.word().into())));
            }
        }
        edits
    }

    /// The folder settings' own problems (an empty path), before anything is read or written (the
    /// rest is checked with the file as it would be written: [`ServerSettings::check`], the default).
    pub(super) fn check(&self) -> Result<(), SettingError> {
        for (field, value) in [("models_dir", &self.models_dir), ("conversations_dir", &self.conversations_dir)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(SettingError { field, value: "\"\"".into(), expected: "a folder" });
            }
        }
        Ok(())
    }

    /// Whether it changes how the server listens (which applies when it next starts).
    pub fn touches_server(&self) -> bool {
        self.server.as_ref().is_some_and(|s| s.port.is_some() || s.expose.is_some() || s.api_key.is_some())
    }
}

impl Theme {
    /// As models.toml holds it.
    pub fn word(self) -> &'static str {
        match self {
            Theme::System => "system",
            Theme::Light => "light",
            Theme::Dark => "dark",
        }
    }
}

impl ContextPolicy {
    /// As models.toml holds it.
    pub fn word(self) -> &'static str {
        match self {
            ContextPolicy::Rolling => "rolling",
            ContextPolicy::Middle => "middle",
            ContextPolicy::Stop => "stop",
        }
    }
}

impl super::Registry {
    /// The app-wide settings as the Settings page shows them.
    pub fn app_settings(&self) -> AppSettings {
        AppSettings {
            config_path: self.path.clone(),
            models_dir: self.models_dir.clone(),
            conversations_dir: self.conversations_dir.clone(),
            default_model: self.default_model().ok().map(|m| m.name),
            server: ServerView {
                port: self.server.port(),
                expose: self.server.expose,
                api_key_set: self.server.api_key.is_some(),
            },
            ui: self.ui,
        }
    }

    /// Changes the app-wide settings and writes them to models.toml, keeping the file's comments
    /// (read again first, so hand edits since loading survive). A folder that is missing is created;
    /// nothing is written unless every value is valid (a default that names a model, an exposed
    /// server with a key, folders that can be created).
    pub fn update_app(&mut self, patch: &AppPatch) -> super::Result<AppSettings> {
        let here = Place { path: self.path.clone(), line: None };
        patch.check().map_err(|error| RegistryError::Setting { at: here.clone(), error })?;
        let text = std::fs::read_to_string(&self.path)
            .map_err(|error| RegistryError::Io { path: self.path.clone(), error })?;
        let mut doc: DocumentMut = text.parse().map_err(|e| parse_error(&self.path, &text, e))?;
        for (table, key, value) in patch.edits() {
            let section: &mut dyn TableLike = if table.is_empty() {
                doc.as_table_mut()
            } else {
                match doc.entry(table).or_insert(Item::Table(Table::new())).as_table_like_mut() {
                    Some(t) => t,
                    None => {
                        return Err(RegistryError::Parse {
                            path: self.path.clone(),
                            message: format!(" `{table}` must be a table to hold `{key}`"),
                        })
                    }
                }
            };
            set_key(section, key, value);
        }
        let text = doc.to_string();
        let updated = Self::parse(&self.path, &text)?;
        for (field, dir, changed) in [
            ("models_dir", &updated.models_dir, patch.models_dir.is_some()),
            ("conversations_dir", &updated.conversations_dir, patch.conversations_dir.is_some()),
        ] {
            if changed {
                std::fs::create_dir_all(dir).map_err(|error| RegistryError::Folder {
                    field,
                    path: dir.clone(),
                    error,
                })?;
            }
        }
        write_atomic(&self.path, &text)?;
        *self = updated;
        Ok(self.app_settings())
    }
}

#[cfg(test)]
#[path = "app_tests.rs"]
mod tests;
