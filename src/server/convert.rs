//! `/api/convert`: the engine's conversion jobs ([`crate::engine::jobs`]) over HTTP, their events
//! as server-sent events. Sources are read from the models folder, the registry's models and the
//! folders the person chose (server/folders.rs); outputs are written inside the models folder.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use serde::Deserialize;
use serde_json::Value;
use ts_rs::TS;

use super::error::{ApiError, ApiJson};
use super::security::PathRules;
use super::wire::{JobDeleted, JobList};
use super::{blocking, AppState};
use crate::engine::{Job, JobEvent, JobView};
use crate::quant::{ConvertOptions, MtpMode};

/// `POST /api/convert`. Absent fields take `tandem convert`'s defaults.
#[derive(Debug, Deserialize, TS)]
#[ts(optional_fields)]
pub struct ConvertRequest {
    /// A model name from the registry, or a model folder inside the models folder or a chosen folder
    /// (`POST /api/folders`, or the desktop app's dialog and drops).
    pub src: String,
    /// The new folder: a name (created in the models folder) or a path inside it. Default:
    /// `<src>-<bits>bit` (or `<src>-<dtype>`) in the models folder. Also accepted as `name` or `out`.
    #[serde(alias = "name", alias = "out")]
    pub dst: Option<String>,
    /// Bits for the uniform recipe (2, 3, 4, 5, 6 or 8); absent writes full precision.
    pub bits: Option<u8>,
    /// 32, 64 or 128.
    pub group_size: Option<u32>,
    /// `uniform`, `mixed_3_6`, `mixed_4_6` or `auto` (the CLI's spellings).
    pub recipe: Option<String>,
    /// The bits per weight `auto` aims at.
    pub target_bpw: Option<f64>,
    /// Calibration text for `auto`, inside the models folder.
    pub calibration: Option<PathBuf>,
    pub calibration_tokens: Option<usize>,
    /// `bf16` or `f16`.
    pub dtype: Option<String>,
    /// Keep or drop the MTP head.
    pub mtp: Option<MtpMode>,
    /// An integer, `"none"`, or null (the head unquantized); absent follows the recipe.
    #[serde(default, deserialize_with = "present")]
    #[ts(optional, type = "number | \"none\" | null")]
    pub mtp_bits: Option<Value>,
    /// Replace an existing destination.
    pub force: Option<bool>,
    /// Fix an MTP head whose norm convention contradicts its names instead of refusing.
    pub repair: Option<bool>,
    /// Largest shard file in bytes.
    pub shard_bytes: Option<u64>,
}

/// Tells a present `null` (Some(Null)) from an absent field (None, by `default`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Where requests may read: the models folder, the registry's models, the folders chosen in this run.
pub(super) fn path_rules(state: &AppState) -> PathRules {
    let registry = state.engine.registry();
    PathRules {
        models_dir: registry.models_dir().to_owned(),
        model_paths: registry.list().into_iter().map(|m| m.path).collect(),
        chosen: state.engine.chosen_folders(),
    }
}

fn job(state: &AppState, id: &str) -> Result<Arc<Job>, ApiError> {
    state.engine.jobs().get(id).ok_or_else(|| ApiError::not_found("job_not_found", format!("no conversion job `{id}`")))
}

/// `POST /api/convert` -> 202 and the job (`{"job": id, ...}`).
pub async fn start(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ConvertRequest>,
) -> Result<Response, ApiError> {
    let st = state.clone();
    let (src, dst, options) = blocking(move || resolve(&st, req)).await?;
    let view = state.engine.convert(src, dst, options, state.convert_pause)?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

/// Checks and resolves the request's paths and options.
fn resolve(state: &AppState, req: ConvertRequest) -> Result<(PathBuf, PathBuf, ConvertOptions), ApiError> {
    let rules = path_rules(state);
    let src = match state.engine.entry(&req.src) {
        Ok(entry) => rules.existing("src", &entry.path.to_string_lossy())?,
        Err(_) => rules.existing("src", &req.src)?,
    };
    if !crate::registry::is_model_folder(&src) {
        return Err(ApiError::bad_request(
            "invalid_path",
            format!("src `{}` is not a model folder (config.json and *.safetensors)", req.src),
        ));
    }
    std::fs::create_dir_all(&rules.models_dir).map_err(|e| {
        ApiError::internal(format!("cannot create the models folder {}: {e}", rules.models_dir.display()))
    })?;
    let bad = |e: crate::quant::ParseOptionError| ApiError::bad_request("invalid_value", e.to_string());
    let defaults = ConvertOptions::default();
    let mut options = ConvertOptions {
        bits: req.bits,
        group_size: req.group_size.unwrap_or(defaults.group_size),
        target_bpw: req.target_bpw,
        calibration: req.calibration,
        calibration_tokens: req.calibration_tokens.unwrap_or(defaults.calibration_tokens),
        mtp: req.mtp.unwrap_or(defaults.mtp),
        force: req.force.unwrap_or(defaults.force),
        repair: req.repair.unwrap_or(defaults.repair),
        shard_bytes: req.shard_bytes.unwrap_or(defaults.shard_bytes),
        ..defaults
    };
    if let Some(recipe) = &req.recipe {
        options.recipe = recipe.parse().map_err(bad)?;
    }
    if let Some(dtype) = &req.dtype {
        options.dtype = dtype.parse().map_err(bad)?;
    }
    let dst_name = match &req.dst {
        Some(dst) => dst.clone(),
        None => {
            let base = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
            match options.bits {
                Some(bits) => format!("{base}-{bits}bit"),
                None => format!(
                    "{base}-{}",
                    serde_json::to_value(options.dtype)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
            }
        }
    };
    let dst = rules.new_in_models_dir("dst", &dst_name)?;
    options.mtp_bits = match req.mtp_bits {
        None => None,
        Some(Value::Null) => Some(crate::quant::MtpBits::Dense),
        Some(Value::Number(n)) => Some(n.to_string().parse().map_err(bad)?),
        Some(Value::String(s)) => Some(s.parse().map_err(bad)?),
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`mtp_bits` = {other}: expected a bit width, \"none\" or null"),
            ))
        }
    };
    if dst.exists() && !options.force {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "already_exists",
            format!("{} already exists; pick another name, or pass \"force\": true to replace it", dst.display()),
        ));
    }
    if let Some(calibration) = &options.calibration {
        options.calibration = Some(rules.existing("calibration", &calibration.to_string_lossy())?);
    }
    Ok((src, dst, options))
}

pub async fn list(State(state): State<Arc<AppState>>) -> Json<JobList> {
    Json(JobList { jobs: state.engine.jobs().list() })
}

pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<JobView>, ApiError> {
    Ok(Json(job(&state, &id)?.view()))
}

/// Cancels a queued or running job (202), or forgets a finished one (200).
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = job(&state, &id)?;
    let status = job.view().state;
    if status.is_final() {
        state.engine.jobs().remove(&id);
        let body = JobDeleted { job: id, state: status, removed: Some(true), cancelling: None };
        return Ok((StatusCode::OK, Json(body)).into_response());
    }
    job.cancel();
    let body = JobDeleted { job: id, state: status, removed: None, cancelling: Some(true) };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// The job's events: the milestones so far (and the newest event), then live ones, ending after
/// `finished`, `error` or `cancelled`.
pub async fn events(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let subscription = job(&state, &id)?.subscribe();
    Ok(super::job_events(&state, subscription.past, subscription.live, JobEvent::is_terminal))
}
