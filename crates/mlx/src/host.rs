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
