//! Host (CPU) kernels of the repository's `kernels/cpu/`, as MLX operations: MLX has no custom-kernel
//! API for its CPU backend, so each is a primitive of the bridge's own that joins the lazy graph like any
//! op and runs on MLX's CPU stream, in graph order.

use crate::ffi::ffi;
use crate::{Array, Result};

/// `x @ w^T` for x `[..., K]` and w `[N, K]`, both f32, bf16 or f16 (the same): each output one fp32 dot
/// product in a fixed order, rounded once, so a row of x gets the same bits whatever the other rows are
/// (kernels/cpu/dense_matmul.h). Strided inputs are packed first.
pub fn dense_matmul(x: &Array, w: &Array) -> Result<Array> {
    Array::wrap(ffi::host_dense_matmul(x.raw(), w.raw()))
}

/// `x @ dequantize(w, scales, biases)^T` for MLX's affine layout (`mlx::quantized::quantize`): w `[N, K * bits
/// / 32]` uint32 words of 2, 4 or 8 bits, scales and biases `[N, K / group_size]` (f32, bf16 or f16), x
/// `[..., K]` (f32, bf16 or f16, also the output's dtype). Each weight row dequantized to fp32, then the dense
/// kernel's fixed-order dot products (kernels/cpu/quantized_matmul.h).
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    Array::wrap(ffi::host_quantized_matmul(x.raw(), w.raw(), scales.raw(), biases.raw(), group_size, bits))
}

/// The gated-delta recurrence (kernels/cpu/gated_delta.h) over q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`,
/// g, beta `[B, T, Hv]` from `state [B, Hv, Dv, Dk]`, all f32: the outputs `[B, T, Hv, Dv]`, and the states
/// after every token `[T, B, Hv, Dv, Dk]` (`all_steps`) or after the last `[1, B, Hv, Dv, Dk]`. A token's
/// bits are the same whatever T is.
pub fn gated_delta(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    all_steps: bool,
) -> Result<(Array, Array)> {
    let parts = ffi::host_gated_delta(q.raw(), k.raw(), v.raw(), g.raw(), beta.raw(), state.raw(), all_steps)?;
    let mut parts = crate::vec_from(parts)?.into_iter();
    match (parts.next(), parts.next()) {
        (Some(y), Some(states)) => Ok((y, states)),
        _ => Err(crate::Error::Invalid("host gated delta returned fewer than two arrays".into())),
    }
}

/// The same recurrence from a Gated DeltaNet layer's conv output `qkv [B, T, 2·hk·Dk + Hv·Dv]` (f32), q and k
/// normalised by `qs`, `ks` `[Dk]` under `eps` as [`rms_norm`] does (kernels/cpu/gated_delta.h,
/// `gated_delta_qkv`); the state `[B, Hv, Dv, Dk]` gives Hv and Dv. The bits of those norms and [`gated_delta`]
/// with every step's state `[T, B, Hv, Dv, Dk]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_qkv(
    qkv: &Array,
    qs: &Array,
    ks: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    hk: i32,
    eps: f32,
) -> Result<(Array, Array)> {
    let parts = ffi::host_gated_delta_qkv(qkv.raw(), qs.raw(), ks.raw(), g.raw(), beta.raw(), state.raw(), hk, eps)?;
    let mut parts = crate::vec_from(parts)?.into_iter();
    match (parts.next(), parts.next()) {
        (Some(y), Some(states)) => Ok((y, states)),
        _ => Err(crate::Error::Invalid("host gated delta qkv returned fewer than two arrays".into())),
    }
}

/// Causal attention of q `[1, Hq, T, D]` over the first `len` rows of a KV cache's buffers `[1, Hkv, CAP, D]`
/// (one float dtype for all, Hq a multiple of Hkv, `T <= len <= CAP`): query t sees keys `0..len - T + t + 1`;
/// softmax and sums in fp32 (kernels/cpu/attention.h). A query's bits depend only on its row and its keys.
pub fn attention(q: &Array, keys: &Array, values: &Array, len: i32, scale: f32) -> Result<Array> {
    Array::wrap(ffi::host_attention(q.raw(), keys.raw(), values.raw(), len, scale))
}

/// The elementwise chains of kernels/cpu/elementwise.h, each the bits of MLX's own CPU ops (T: b's dtype, f32
/// or bf16; every op rounds to T as MLX's does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    /// `a * sigmoid(a) * b` (SwiGLU: gate a, up b).
    Swiglu = 0,
    /// `a * sigmoid(b)` (the attention output's gate).
    SigmoidGate = 1,
    /// `a * sigmoid(a)` (b is a).
    Silu = 2,
    /// `a * silu(b as f32)` rounded once to b's dtype, a f32 (the gated norm's gate).
    SiluGate = 3,
}

/// One elementwise chain over a and b of one shape (for [`Chain::Silu`] pass a twice): a last-axis slice
/// (a row stride) is read in place, any other strided input packed first.
pub fn elementwise(chain: Chain, a: &Array, b: &Array) -> Result<Array> {
    Array::wrap(ffi::host_elementwise(chain as i32, a.raw(), b.raw()))
}

/// RMSNorm with the bits of MLX's op-by-op norm on its CPU: per row of x `[..., D]` (f32 or bf16), the squares
/// summed in order in f32, `r = 1 / sqrt(sum * inv_d + eps)`, `(x * r) * w` (w `[D]` f32) rounded once to x's
/// dtype (kernels/cpu/elementwise.h). `inv_d` is the caller's `1 / D`, as MLX's mean multiplies by it.
pub fn rms_norm(x: &Array, w: &Array, eps: f32, inv_d: f32) -> Result<Array> {
    Array::wrap(ffi::host_rms_norm(x.raw(), w.raw(), eps, inv_d))
}

/// A Gated DeltaNet layer's gated norm with the bits of [`rms_norm`] followed by [`Chain::SiluGate`]: each head
/// of o `[..., H, D]` (f32) normalised with w `[D]`, times `silu(z)` (z `[..., H·D]`, f32 or bf16; a last-axis
/// slice read in place), rounded once to z's dtype; out like z (kernels/cpu/elementwise.h, `gated_norm`).
pub fn gated_norm(o: &Array, z: &Array, w: &Array, eps: f32, inv_d: f32) -> Result<Array> {
    Array::wrap(ffi::host_gated_norm(o.raw(), z.raw(), w.raw(), eps, inv_d))
}

/// RoPE (rotate-half form) with the bits of MLX's CPU `fast::rope`: x `[B, N, T, D]` (f32 or bf16, any strides),
/// row b's positions `offsets[b] + t` (`offsets` int32 `[1]` for all rows or `[B]`) times `scale`, the first
/// `dims` features rotated at base `base`; out like x (kernels/cpu/elementwise.h, `rope`).
pub fn rope(x: &Array, offsets: &Array, dims: i32, base: f32, scale: f32) -> Result<Array> {
    Array::wrap(ffi::host_rope(x.raw(), offsets.raw(), dims, base, scale))
}
