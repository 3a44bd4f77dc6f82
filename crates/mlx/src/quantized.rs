//! Affine (and MX/NV float) quantization: `quantize`, `dequantize`, `quantized_matmul`.

use crate::ffi::ffi;
use crate::{Array, Error, Result};

/// MLX's quantization modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    Affine,
    Mxfp4,
    Mxfp8,
    Nvfp4,
}

impl QuantMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }
}

/// A quantized weight as MLX stores it: packed `u32` values, per-group scales and (affine) biases.
#[derive(Debug, Clone)]
pub struct Quantized {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
}

/// Quantizes `w` along its last axis (`mx.quantize`).
pub fn quantize(w: &Array, group_size: i32, bits: i32, mode: QuantMode) -> Result<Quantized> {
    let mut parts = crate::vec_from(ffi::quantize(w.raw(), group_size, bits, mode.as_str())?)?.into_iter();
    let (weight, scales) = match (parts.next(), parts.next()) {
        (Some(w), Some(s)) => (w, s),
        _ => return Err(Error::Invalid("quantize returned fewer than two arrays".into())),
    };
    Ok(Quantized { weight, scales, biases: parts.next(), group_size, bits, mode })
}

impl Quantized {
    /// `mx.dequantize`: back to a dense array of the scales' dtype.
    pub fn dequantize(&self) -> Result<Array> {
        dequantize(&self.weight, &self.scales, self.biases.as_ref(), self.group_size, self.bits, self.mode)
    }

    /// `x @ dequantize(w).T` (`transpose = true`) or `x @ dequantize(w)`.
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array> {
        quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            transpose,
            self.group_size,
            self.bits,
            self.mode,
        )
    }
}

pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    let b = biases.unwrap_or(scales);
    Array::wrap(ffi::dequantize(w.raw(), scales.raw(), b.raw(), biases.is_some(), group_size, bits, mode.as_str()))
}

#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    let b = biases.unwrap_or(scales);
    Array::wrap(ffi::quantized_matmul(
        x.raw(),
        w.raw(),
        scales.raw(),
        b.raw(),
        biases.is_some(),
        transpose,
        group_size,
        bits,
        mode.as_str(),
    ))
}
