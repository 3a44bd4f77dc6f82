//! Conversion and quantization that keep the MTP head; inspection and repair of MTP norm conventions.
//!
//! - [`convert`]: a raw Hugging Face checkpoint (or a full-precision MLX one) to the MLX layout that
//!   mlx-lm and mlx-vlm load, optionally affine-quantized (uniform, mlx-lm's mixed recipes, or `auto`
//!   from measured sensitivity), with the MTP head kept as `language_model.mtp.*`.
//! - [`inspect`]: format, architecture, size, quantization and the MTP head's state.
//! - [`repair`]: a copy of a model whose MTP head follows another norm convention than its body.
//!
//! Conventions written (docs/MODEL.md §3.6 and §5.3):
//! - keys `language_model.model.*`, `language_model.lm_head.weight` (absent when tied),
//!   `language_model.mtp.*`, `vision_tower.*` (vision tensors kept, only cast);
//! - +1 on exactly the zero-centred norms (input/post-attention layernorms, the final norm, q/k norms
//!   and the seven MTP norms; never `linear_attn.norm` or vision norms), computed in float32 and
//!   stored in the model dtype. Storing them in float32 would be exact, but MLX promotes bf16
//!   activations times f32 norm weights to f32, so mlx-lm (and every MLX app) would then run the
//!   whole model in float32 activations: slower, and no longer the computation Tandem runs. The
//!   rounding is at most 2^-8 per scale, the same size as bf16 activation rounding, and it equals
//!   what `mlx_lm.convert` writes.
//! - conv1d `[C,1,K]` -> `[C,K,1]`; `A_log` in float32; other floats in the model dtype;
//! - affine quantization with MLX's own `quantize` (bit-identical to `mx.quantize`) of every linear
//!   and embedding whose input width divides by the group size; `mtp.fc` always full precision;
//! - config.json with `quantization` and the same `quantization_config`, with per-module entries
//!   keyed by mlx-lm module path; safetensors metadata `{"format": "mlx"}`; shards with an index.

mod calibrate;
mod convert;
pub mod gate;
mod graft;
pub mod head;
mod inspect;
pub mod options;
pub mod plan;
pub mod recipe;
mod repair;
pub mod source;
pub mod writer;

use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::model::{Layout, LoadError};

pub use convert::{check_options, convert, ConvertReport, MtpOutcome};
pub use gate::ComputeGate;
pub use graft::{graft_head, GraftOptions, GraftReport};
pub use head::{HeadAnalysis, Verdict};
pub use inspect::{inspect, GroupQuant, InspectReport, MtpReport, NormReport, QuantSummary};
pub use options::{parse_bits, parse_group_size, ConvertOptions, MtpBits, MtpMode, OutDtype, ParseOptionError, Recipe};
pub use recipe::{QuantParams, Sensitivity};
pub use repair::{repair, repair_with, RepairReport};

/// The calibration text built into Tandem (`assets/calibration/default.txt`: public-domain prose).
pub const DEFAULT_CALIBRATION: &str = include_str!("../../assets/calibration/default.txt");

/// What the progress callback answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Control {
    #[default]
    Continue,
    /// Stop: the partial output is removed and `convert` returns [`ConvertError::Cancelled`].
    Cancel,
}

/// Progress of a conversion or repair, serialisable for the HTTP API's server-sent events
/// (`{"event": "tensor", "name": ..., ...}`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ConvertEvent {
    /// The source was read and checked.
    Validated { format: Layout, tensors: usize, bytes: u64, mtp: String },
    /// `auto`: one module's sensitivity measured (`tokens`: the calibration text it is measured over).
    Calibrating { module: String, done: usize, total: usize, tokens: usize },
    /// What will be written, exactly: sizes include every header.
    Planned {
        tensors: usize,
        shards: usize,
        params: u64,
        predicted_bytes: u64,
        predicted_bpw: f64,
        quantized_modules: usize,
        dense_modules: usize,
    },
    /// One source tensor written (as one tensor, or three when quantized).
    Tensor { name: String, index: usize, total: usize, bytes_done: u64, bytes_total: u64 },
    /// The destination is in place.
    Finished { dst: PathBuf, bytes: u64, bpw: f64, params: u64, seconds: f64 },
}

#[derive(Debug, Error)]
pub enum ConvertError {
    #[error("{}: {message}", path.display())]
    Source { path: PathBuf, message: String },
    #[error("{}: tensor `{tensor}`: {message}", file.display())]
    Tensor { file: PathBuf, tensor: String, message: String },
    #[error("{}: unknown model_type `{model_type}` (supported: qwen3_5, qwen3_5_text)", path.display())]
    UnknownModelType { path: PathBuf, model_type: String },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{}: already quantized ({modules} quantized modules, e.g. `{example}`); convert from the full-precision model", path.display())]
    AlreadyQuantized { path: PathBuf, modules: usize, example: String },
    #[error("invalid option {option}: {message}")]
    Option { option: &'static str, message: String },
    #[error("{}: already exists (pass force to replace it)", .0.display())]
    DestinationExists(PathBuf),
    #[error("destination {}: {message}", path.display())]
    Destination { path: PathBuf, message: String },
    #[error("not enough disk space in {}: the output needs {need} bytes, {available} are available", path.display())]
    DiskSpace { path: PathBuf, need: u64, available: u64 },
    #[error("{}: MTP head: {message}", path.display())]
    Mtp { path: PathBuf, message: String },
    #[error("{}: nothing to repair: {message}", path.display())]
    NothingToRepair { path: PathBuf, message: String },
    #[error("calibration: {0}")]
    Calibration(String),
    #[error("cancelled")]
    Cancelled,
    // The cause is part of the message and not also a `source`, or a chain printed whole (the CLI's
    // `{:#}`) would say it twice.
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("cannot write {}: {why}; the partial output was removed", path.display())]
    NoRoom { path: PathBuf, why: &'static str },
    #[error("{context}: {error}")]
    Mlx { context: String, error: mlx::Error },
    #[error("internal error: {0}")]
    Internal(String),
}

/// Makes a write past the file-size limit (`ulimit -f`) fail with EFBIG instead of killing the
/// process with SIGXFSZ, which would leave a partial folder and no message. Every program that
/// converts (the CLI, the desktop app) calls this first, before it starts threads.
pub fn fail_writes_past_the_file_size_limit() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_IGN has no effect besides that disposition.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

impl ConvertError {
    /// An I/O error on `path`; a write refused for lack of room (a full disk, or the file-size
    /// limit of `ulimit -f`, which the CLI turns from a killing SIGXFSZ into EFBIG) says so.
    pub(crate) fn io(path: &Path, source: std::io::Error) -> ConvertError {
        let why = match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Some("the disk is full (or the disk quota is used up)"),
            Some(libc::EFBIG) => {
                Some("the file would exceed the file-size limit (`ulimit -f`) or the file system's maximum")
            }
            _ => None,
        };
        match why {
            Some(why) => ConvertError::NoRoom { path: path.to_path_buf(), why },
            None => ConvertError::Io { path: path.to_path_buf(), error: source },
        }
    }
}
