//! Devices, streams, evaluation and memory statistics.

use crate::ffi::ffi;
use crate::{Array, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

/// Makes `device` the default for new operations.
pub fn set_default_device(device: Device) -> Result<()> {
    Ok(ffi::set_default_device(device == Device::Gpu)?)
}

pub fn default_device() -> Device {
    if ffi::default_device_is_gpu() {
        Device::Gpu
    } else {
        Device::Cpu
    }
}

/// Whether this MLX build has a usable GPU backend (Metal or CUDA).
pub fn gpu_available() -> bool {
    ffi::gpu_available()
}

/// Which GPU backend this MLX build has, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Metal,
    Cuda,
}

/// The backend of the GPU device (`Cpu` when there is none). Decided once per process.
pub fn backend() -> Backend {
    static BACKEND: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();
    *BACKEND.get_or_init(|| match (ffi::gpu_available(), ffi::cuda_available()) {
        (false, _) => Backend::Cpu,
        (true, true) => Backend::Cuda,
        (true, false) => Backend::Metal,
    })
}

/// The CUDA device's compute capability as (major, minor), e.g. (9, 0) on an H100 or H200; `None`
/// without CUDA.
pub fn cuda_compute_capability() -> Option<(u32, u32)> {
    let cc = ffi::cuda_compute_capability();
    (cc >= 0).then_some(((cc / 10) as u32, (cc % 10) as u32))
}

/// A new stream on `device`; returns its index.
pub fn new_stream(device: Device) -> Result<i32> {
    Ok(ffi::new_stream(device == Device::Gpu)?)
}

pub fn set_default_stream(index: i32, device: Device) -> Result<()> {
    Ok(ffi::set_default_stream(index, device == Device::Gpu)?)
}

/// Waits for all queued work on all streams.
pub fn synchronize() -> Result<()> {
    Ok(ffi::synchronize()?)
}

/// Evaluates several arrays at once (shared subgraphs run once).
pub fn eval(arrays: &[&Array]) -> Result<()> {
    Ok(ffi::eval_all(&crate::vec_to(arrays))?)
}

/// Starts evaluating without waiting; a later `eval` or data read waits.
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    Ok(ffi::async_eval_all(&crate::vec_to(arrays))?)
}

/// MLX's allocator figures, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub active: usize,
    pub peak: usize,
    pub cache: usize,
}

pub fn memory_stats() -> MemoryStats {
    MemoryStats { active: ffi::get_active_memory(), peak: ffi::get_peak_memory(), cache: ffi::get_cache_memory() }
}

pub fn reset_peak_memory() {
    ffi::reset_peak_memory()
}

pub fn clear_cache() {
    ffi::clear_cache()
}

/// Sets the memory limit; returns the previous one.
pub fn set_memory_limit(bytes: usize) -> usize {
    ffi::set_memory_limit(bytes)
}

/// Sets the buffer-cache limit; returns the previous one.
pub fn set_cache_limit(bytes: usize) -> usize {
    ffi::set_cache_limit(bytes)
}

/// The linked MLX version, e.g. "0.32.4".
pub fn version() -> String {
    ffi::version()
}
