//! Safe Rust over MLX's C++ API.
//!
//! MLX is linked from the official PyPI wheels (`mlx-cpu`, `mlx-metal`, `mlx-cuda-13`), never built
//! here. This crate is the only place in Tandem with C++ or `unsafe`. Every MLX call is fallible:
//! MLX's C++ exceptions arrive as [`Error::Mlx`] with MLX's message.

mod array;
pub mod compile;
pub mod device;
pub mod distributed;
mod dtype;
mod error;
pub mod fast;
mod ffi;
pub mod host;
pub mod kernel;
pub mod ops;
pub mod quantized;
pub mod random;

use cxx::UniquePtr;

pub use array::Array;
pub use device::{Device, MemoryStats};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use ops::{concatenate, stack, where_};
pub use quantized::{QuantMode, Quantized};

pub use half::{bf16, f16};

fn vec_to(arrays: &[&Array]) -> UniquePtr<ffi::ffi::ArrayVec> {
    let mut v = ffi::ffi::vec_new();
    for a in arrays {
        ffi::ffi::vec_push(v.pin_mut(), a.raw());
    }
    v
}

fn vec_from(v: UniquePtr<ffi::ffi::ArrayVec>) -> Result<Vec<Array>> {
    let r = v.as_ref().ok_or_else(|| Error::Invalid("null array list".into()))?;
    (0..ffi::ffi::vec_len(r)).map(|i| Array::wrap(ffi::ffi::vec_get(r, i))).collect()
}
