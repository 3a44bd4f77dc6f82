//! MLX's fused kernels (`mlx::core::fast`).

use crate::ffi::ffi;
use crate::{Array, Result};

/// `x * rsqrt(mean(x^2) + eps) * w` over the last axis.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    Array::wrap(ffi::rms_norm(x.raw(), weight.unwrap_or(x).raw(), weight.is_some(), eps))
}

pub fn layer_norm(x: &Array, weight: Option<&Array>, bias: Option<&Array>, eps: f32) -> Result<Array> {
    Array::wrap(ffi::layer_norm(
        x.raw(),
        weight.unwrap_or(x).raw(),
        weight.is_some(),
        bias.unwrap_or(x).raw(),
        bias.is_some(),
        eps,
    ))
}

/// Rotary embedding on the first `dims` features of the last axis, positions starting at `offset`
/// along axis -2. `traditional = false` is the rotate-half (NeoX) form.
pub fn rope(x: &Array, dims: i32, traditional: bool, base: f32, scale: f32, offset: i32) -> Result<Array> {
    Array::wrap(ffi::rope(x.raw(), dims, traditional, base, scale, offset))
}

/// As [`rope`], with the offset held in an array (no host synchronisation).
pub fn rope_dynamic(x: &Array, dims: i32, traditional: bool, base: f32, scale: f32, offset: &Array) -> Result<Array> {
    Array::wrap(ffi::rope_dynamic(x.raw(), dims, traditional, base, scale, offset.raw()))
}

/// As [`rope`], with explicit inverse frequencies instead of a base.
pub fn rope_with_freqs(
    x: &Array,
    dims: i32,
    traditional: bool,
    scale: f32,
    offset: i32,
    freqs: &Array,
) -> Result<Array> {
    Array::wrap(ffi::rope_freqs(x.raw(), dims, traditional, scale, offset, freqs.raw()))
}

/// Attention masks for [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    None,
    Causal,
    /// Additive (float) or boolean mask broadcastable to `[B, H, Lq, Lk]`.
    Array(&'a Array),
}

/// `softmax(q k^T * scale + mask) v` with q `[B, Hq, Lq, D]`, k and v `[B, Hkv, Lk, D]` (GQA when Hq > Hkv).
pub fn scaled_dot_product_attention(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>) -> Result<Array> {
    let (mode, arr) = match mask {
        Mask::None => ("", None),
        Mask::Causal => ("causal", None),
        Mask::Array(a) => ("array", Some(a)),
    };
    Array::wrap(ffi::sdpa(q.raw(), k.raw(), v.raw(), scale, mode, arr.unwrap_or(q).raw(), arr.is_some()))
}

/// MLX's fused Gated DeltaNet recurrence. Returns `(outputs, final_state)`.
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
) -> Result<(Array, Array)> {
    let out = crate::vec_from(ffi::gated_delta_update(
        q.raw(),
        k.raw(),
        v.raw(),
        g.raw(),
        beta.raw(),
        state.unwrap_or(q).raw(),
        state.is_some(),
    )?)?;
    let mut it = out.into_iter();
    match (it.next(), it.next()) {
        (Some(y), Some(s)) => Ok((y, s)),
        _ => Err(crate::Error::Invalid("gated_delta_update returned fewer than two arrays".into())),
    }
}
