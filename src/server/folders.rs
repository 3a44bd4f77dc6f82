//! Folders outside the models folder that the person chose, and model folders added without
//! converting them:
//!
//! - `POST /api/folders {"path"}`: the web UI calls this after the person confirmed the folder in a
//!   dialog of its own; a conversion may then read it ([`Engine::choose_folder`]). Other web origins
//!   never reach it (the security guard), and the folder must exist.
//! - `POST /api/folders/pick`: the desktop app's native folder dialog. Only the shell can answer it
//!   (a [`FolderPicker`] in the server's config, and its token, which only the app's window holds);
//!   the folder the person picks is chosen at once. Elsewhere it answers 404 `no_folder_dialog`.
//! - `GET /api/folders`: the folders chosen in this run.
//! - `POST /api/models {"path", "name"?}`: registers an existing model folder (MLX conversion or raw
//!   checkpoint) in models.toml; it must be a folder that requests may name.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use ts_rs::TS;

use super::error::{ApiError, ApiJson};
use super::wire::{ChosenFolder, FolderList, PickedFolder};
use super::{blocking, convert, AppState};

/// The header that carries the shell's token on `POST /api/folders/pick`.
pub const SHELL_TOKEN_HEADER: &str = "x-tandem-shell";

/// The desktop shell's native folder dialog, and the token its window sends to open it. `pick`
/// blocks until the person picks a folder (Some) or closes the dialog (None); `title` says what for.
#[derive(Clone)]
pub struct FolderPicker {
    pub token: String,
    pub pick: PickFn,
}

/// Opens the dialog titled by its argument; the folder picked, or None.
pub type PickFn = Arc<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

impl std::fmt::Debug for FolderPicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FolderPicker")
    }
}

/// `POST /api/folders`
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "ChooseFolderRequest")]
#[serde(deny_unknown_fields)]
pub struct ChooseFolder {
    /// An absolute path (`~/` is the home folder).
    path: String,
}

/// `POST /api/folders/pick`
#[derive(Debug, Default, Deserialize, TS)]
#[ts(rename = "PickFolderRequest", optional_fields)]
#[serde(deny_unknown_fields)]
pub struct PickFolder {
    /// The dialog's title.
    title: Option<String>,
}

/// `POST /api/models`
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "AddModelRequest", optional_fields)]
#[serde(deny_unknown_fields)]
pub struct AddModel {
    /// A model folder: in the models folder, a registered model's folder or a chosen folder.
    #[ts(optional = false)]
    path: String,
    /// Default: the folder's name.
    name: Option<String>,
}

pub async fn list(State(state): State<Arc<AppState>>) -> Json<FolderList> {
    Json(FolderList { folders: state.engine.chosen_folders() })
}

pub async fn choose(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ChooseFolder>,
) -> Result<Json<ChosenFolder>, ApiError> {
    blocking(move || {
        let given = super::security::expand(&req.path);
        if !given.is_absolute() {
            return Err(ApiError::bad_request(
                "invalid_path",
                format!("`path` = `{}`: give the folder's absolute path", req.path),
            ));
        }
        let path =
            state.engine.choose_folder(&given).map_err(|e| ApiError::bad_request("invalid_path", e.message()))?;
        Ok(Json(ChosenFolder { model_folder: crate::registry::is_model_folder(&path), path }))
    })
    .await
}

pub async fn pick(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<PickFolder>,
) -> Result<Json<PickedFolder>, ApiError> {
    let Some(picker) = state.folder_picker.clone() else {
        return Err(ApiError::not_found(
            "no_folder_dialog",
            "this server has no folder dialog (only the desktop app has one): send the folder's path to POST /api/folders",
        ));
    };
    let sent = headers.get(SHELL_TOKEN_HEADER).and_then(|v| v.to_str().ok());
    if !sent.is_some_and(|t| super::security::constant_time_eq(t.as_bytes(), picker.token.as_bytes())) {
        return Err(ApiError::forbidden("not_the_app", "only the desktop app's window may open its folder dialog"));
    }
    let title = body.title.unwrap_or_else(|| "Choose a model folder".into());
    blocking(move || {
        let Some(picked) = (picker.pick)(&title) else {
            return Ok(Json(PickedFolder { path: None, model_folder: false }));
        };
        let path =
            state.engine.choose_folder(&picked).map_err(|e| ApiError::bad_request("invalid_path", e.message()))?;
        Ok(Json(PickedFolder { model_folder: crate::registry::is_model_folder(&path), path: Some(path) }))
    })
    .await
}

pub async fn add_model(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<AddModel>,
) -> Result<Response, ApiError> {
    let st = state.clone();
    let status = blocking(move || {
        let path = convert::path_rules(&st).existing("path", &req.path)?;
        if !crate::registry::is_model_folder(&path) {
            return Err(ApiError::bad_request(
                "invalid_path",
                format!("`{}` is not a model folder (it needs config.json and *.safetensors)", req.path),
            ));
        }
        let entry = st.engine.add_model_blocking(&path, req.name.as_deref())?;
        st.engine.model_status(&entry.name).map_err(ApiError::from)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(status)).into_response())
}
