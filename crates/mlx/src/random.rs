//! Counter-based random numbers with explicit keys (reproducible given a seed).

use crate::ffi::ffi;
use crate::{Array, Dtype, Result};

pub fn key(seed: u64) -> Result<Array> {
    Array::wrap(ffi::random_key(seed))
}

/// Splits a key into `num` independent keys.
pub fn split(key: &Array, num: i32) -> Result<Vec<Array>> {
    crate::vec_from(ffi::random_split(key.raw(), num)?)
}

pub fn uniform(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    Array::wrap(ffi::random_uniform(shape, dtype.code(), key.raw()))
}

pub fn normal(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    Array::wrap(ffi::random_normal(shape, dtype.code(), key.raw()))
}

pub fn gumbel(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    Array::wrap(ffi::random_gumbel(shape, dtype.code(), key.raw()))
}

/// Samples indices from unnormalised log-probabilities along `axis`.
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    Array::wrap(ffi::random_categorical(logits.raw(), axis, key.raw()))
}
