//! What a conversion is asked to do: bits, group size, recipe, dtype, what happens to the MTP head.
//! Every option parses from the CLI's spelling (`FromStr`) and serialises for the HTTP API.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::gate::ComputeGate;

/// The bit widths MLX's affine quantization supports.
pub const SUPPORTED_BITS: [u8; 6] = [2, 3, 4, 5, 6, 8];
/// The group sizes Tandem writes (the ones mlx-lm offers).
pub const SUPPORTED_GROUP_SIZES: [u32; 3] = [32, 64, 128];

/// Which layers get which bit width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum Recipe {
    /// Every quantizable layer at `bits`.
    #[default]
    Uniform,
    /// mlx-lm's `mixed_3_6`: 3 bits, 6 for the sensitive layers (see `recipe.rs`).
    Mixed36,
    /// mlx-lm's `mixed_4_6`: 4 bits, 6 for the sensitive layers.
    Mixed46,
    /// Bits chosen per layer from measured sensitivity on calibration text, to reach `target_bpw`.
    Auto,
}

impl Recipe {
    pub fn as_str(self) -> &'static str {
        match self {
            Recipe::Uniform => "uniform",
            Recipe::Mixed36 => "mixed_3_6",
            Recipe::Mixed46 => "mixed_4_6",
            Recipe::Auto => "auto",
        }
    }
}

/// The floating dtype of the written model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum OutDtype {
    #[default]
    Bf16,
    F16,
    /// Full precision, to check a doubtful bf16 output against (twice the size of bf16).
    F32,
}

impl OutDtype {
    pub fn dtype(self) -> mlx::Dtype {
        match self {
            OutDtype::Bf16 => mlx::Dtype::BF16,
            OutDtype::F16 => mlx::Dtype::F16,
            OutDtype::F32 => mlx::Dtype::F32,
        }
    }
    /// The name `config.json` uses (`torch_dtype`).
    pub fn config_name(self) -> &'static str {
        match self {
            OutDtype::Bf16 => "bfloat16",
            OutDtype::F16 => "float16",
            OutDtype::F32 => "float32",
        }
    }
}

/// Whether the MTP head is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum MtpMode {
    #[default]
    Keep,
    Drop,
}

/// How the MTP head's linears are stored when it is kept (`mtp.fc` is always full precision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum MtpBits {
    /// In the model dtype, not quantized (`--mtp-bits none`).
    Dense,
    /// Quantized at this many bits, with the conversion's group size.
    Bits(u8),
}

/// Everything `convert` can be asked. `Default` is a plain bf16 conversion keeping the MTP head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(default)]
pub struct ConvertOptions {
    /// Bits for the uniform recipe; None writes full precision (dtype conversion only). The mixed
    /// recipes define their own bits (this must then be None or the recipe's low width).
    pub bits: Option<u8>,
    pub group_size: u32,
    pub recipe: Recipe,
    /// The bits per weight `auto` aims at (whole model: every byte written over every weight).
    pub target_bpw: Option<f64>,
    /// Text for `auto`'s calibration; None uses the text built into Tandem.
    pub calibration: Option<PathBuf>,
    /// At most this many calibration tokens are run through the model.
    pub calibration_tokens: usize,
    pub dtype: OutDtype,
    pub mtp: MtpMode,
    /// None follows the recipe.
    pub mtp_bits: Option<MtpBits>,
    /// Replace an existing destination.
    pub force: bool,
    /// Fix an MTP head whose norm convention contradicts its names (see `repair`) instead of refusing.
    pub repair: bool,
    /// Largest shard file in bytes (a tensor larger than this gets a shard of its own).
    pub shard_bytes: u64,
    /// Taken around each unit of MLX work, so that MLX work elsewhere in the process (a chat)
    /// waits for one tensor, not the whole conversion (see [`ComputeGate`]). Set by the caller,
    /// never read from a request.
    #[serde(skip)]
    pub gate: ComputeGate,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            bits: None,
            group_size: 64,
            recipe: Recipe::Uniform,
            target_bpw: None,
            calibration: None,
            calibration_tokens: 512,
            dtype: OutDtype::Bf16,
            mtp: MtpMode::Keep,
            mtp_bits: None,
            force: false,
            repair: false,
            shard_bytes: 2 << 30,
            gate: ComputeGate::default(),
        }
    }
}

/// An option string that is not one of the accepted spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{value}` (expected {expected})")]
pub struct ParseOptionError {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

fn parse_err(what: &'static str, value: &str, expected: &'static str) -> ParseOptionError {
    ParseOptionError { what, value: value.to_string(), expected }
}

impl FromStr for Recipe {
    type Err = ParseOptionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uniform" => Ok(Recipe::Uniform),
            "mixed_3_6" => Ok(Recipe::Mixed36),
            "mixed_4_6" => Ok(Recipe::Mixed46),
            "auto" => Ok(Recipe::Auto),
            _ => Err(parse_err("recipe", s, "uniform, mixed_3_6, mixed_4_6 or auto")),
        }
    }
}

impl FromStr for OutDtype {
    type Err = ParseOptionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bf16" | "bfloat16" => Ok(OutDtype::Bf16),
            "f16" | "float16" | "fp16" => Ok(OutDtype::F16),
            "f32" | "float32" | "fp32" => Ok(OutDtype::F32),
            _ => Err(parse_err("dtype", s, "bf16, f16 or f32")),
        }
    }
}

impl FromStr for MtpMode {
    type Err = ParseOptionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "keep" => Ok(MtpMode::Keep),
            "drop" => Ok(MtpMode::Drop),
            _ => Err(parse_err("mtp mode", s, "keep or drop")),
        }
    }
}

impl FromStr for MtpBits {
    type Err = ParseOptionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" {
            return Ok(MtpBits::Dense);
        }
        match s.parse::<u8>() {
            Ok(b) if SUPPORTED_BITS.contains(&b) => Ok(MtpBits::Bits(b)),
            _ => Err(parse_err("MTP bits", s, "2, 3, 4, 5, 6, 8 or none")),
        }
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses `--bits`: a supported width, or `none` for no quantization.
pub fn parse_bits(s: &str) -> Result<Option<u8>, ParseOptionError> {
    if s == "none" {
        return Ok(None);
    }
    match s.parse::<u8>() {
        Ok(b) if SUPPORTED_BITS.contains(&b) => Ok(Some(b)),
        _ => Err(parse_err("bits", s, "2, 3, 4, 5, 6, 8 or none")),
    }
}

/// Parses `--group-size`.
pub fn parse_group_size(s: &str) -> Result<u32, ParseOptionError> {
    match s.parse::<u32>() {
        Ok(g) if SUPPORTED_GROUP_SIZES.contains(&g) => Ok(g),
        _ => Err(parse_err("group size", s, "32, 64 or 128")),
    }
}
