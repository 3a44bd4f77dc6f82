//! Custom GPU kernels through MLX's `fast::metal_kernel` / `fast::cuda_kernel`.
//! On a backend without the matching GPU, building or calling a kernel returns an error.
//!
//! MLX's CUDA custom kernel pastes the header into the kernel's source on every call and hashes that
//! whole source on every launch (to name its compiled module), so a 16 KB header costs each launch a
//! few microseconds of host time. On CUDA a header therefore goes into a file named by its contents,
//! and the source only `#include`s it (NVRTC reads the file once, when the module is compiled), where a
//! one-time check shows that this works here; otherwise, or under `TANDEM_KERNEL_HEADERS=inline`, the
//! header is pasted as before.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cxx::UniquePtr;

use crate::ffi::ffi;
use crate::{Array, Dtype, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelBackend {
    Metal,
    Cuda,
}

/// A kernel body plus the names of its inputs and outputs, compiled on first call by MLX.
pub struct Kernel {
    inner: UniquePtr<ffi::Kernel>,
}

/// One call's launch configuration.
pub struct Launch<'a> {
    pub outputs: &'a [(&'a [i32], Dtype)],
    pub grid: [i32; 3],
    pub threadgroup: [i32; 3],
    /// Integer template arguments, e.g. `("N", 4)`.
    pub template: &'a [(&'a str, i32)],
}

impl Kernel {
    /// A kernel whose inputs arrive row-contiguous: MLX copies any strided input before the launch.
    pub fn new(
        backend: KernelBackend,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
    ) -> Result<Kernel> {
        Self::build(backend, name, inputs, outputs, source, header, true)
    }

    /// A kernel that takes its inputs as MLX holds them, strided views included, and indexes them through
    /// `{input}_strides` (and `_shape`, `_ndim`), which MLX passes where the source names them: a slice of a
    /// wider array then costs no copy (a launch of its own on the GPU).
    pub fn strided(
        backend: KernelBackend,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
    ) -> Result<Kernel> {
        Self::build(backend, name, inputs, outputs, source, header, false)
    }

    fn build(
        backend: KernelBackend,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
        row_contiguous: bool,
    ) -> Result<Kernel> {
        let ins: Vec<String> = inputs.iter().map(|s| s.to_string()).collect();
        let outs: Vec<String> = outputs.iter().map(|s| s.to_string()).collect();
        let inner = match backend {
            KernelBackend::Metal => ffi::metal_kernel(name, &ins, &outs, source, header, row_contiguous)?,
            KernelBackend::Cuda => {
                let included = if header.is_empty() || cuda_headers_in_files().is_err() {
                    None
                } else {
                    header_file::place(&header_file::dir(), header).ok().and_then(|p| header_file::include_line(&p))
                };
                ffi::cuda_kernel(name, &ins, &outs, source, included.as_deref().unwrap_or(header), row_contiguous)?
            }
        };
        Ok(Kernel { inner })
    }

    pub fn call(&self, inputs: &[&Array], launch: &Launch<'_>) -> Result<Vec<Array>> {
        let mut flat = Vec::new();
        let mut ndims = Vec::new();
        let mut dtypes = Vec::new();
        for (shape, dt) in launch.outputs {
            flat.extend_from_slice(shape);
            ndims.push(shape.len() as i32);
            dtypes.push(dt.code());
        }
        let names: Vec<String> = launch.template.iter().map(|(n, _)| n.to_string()).collect();
        let ints: Vec<i32> = launch.template.iter().map(|(_, v)| *v).collect();
        let k = self.inner.as_ref().expect("null kernel");
        crate::vec_from(ffi::kernel_call(
            k,
            &crate::vec_to(inputs),
            &flat,
            &ndims,
            &dtypes,
            &launch.grid,
            &launch.threadgroup,
            &names,
            &ints,
        )?)
    }
}

/// Whether CUDA kernels take their headers from files (`Ok`), or why not (`Err`): not under
/// `TANDEM_KERNEL_HEADERS=inline`, and only where a kernel including a header file compiled and gave its
/// value (checked once a process, on first use).
pub fn cuda_headers_in_files() -> &'static std::result::Result<(), String> {
    static WORKS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    WORKS.get_or_init(|| {
        if std::env::var("TANDEM_KERNEL_HEADERS").is_ok_and(|v| v.trim().eq_ignore_ascii_case("inline")) {
            return Err("TANDEM_KERNEL_HEADERS=inline".into());
        }
        header_file::check().map_err(|e| e.to_string())
    })
}

/// [`cuda_headers_in_files`] in words, for logs and reports: `files`, or `inline: why`.
pub fn cuda_headers_mode() -> String {
    match cuda_headers_in_files() {
        Ok(()) => "files".to_string(),
        Err(why) => format!("inline: {why}"),
    }
}

/// Kernel headers as files named by their contents, and the `#include` line that reads one.
pub mod header_file {
    use super::*;

    /// Where the headers go: the user's cache folder (`$XDG_CACHE_HOME`, else `~/.cache`), not a shared
    /// temporary folder, where another user could swap a header between its check and its compilation.
    pub fn dir() -> PathBuf {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .filter(|p| p.is_absolute())
            .unwrap_or_else(std::env::temp_dir);
        cache.join("tandem").join("cuda-headers")
    }

    /// FNV-1a, 64 bits: a name that changes with every byte of the header, stable across builds (so MLX's
    /// disk cache of compiled modules, keyed by the source that names the file, stays valid).
    fn digest(text: &str) -> u64 {
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    }

    /// Writes `header` to `dir` under a name taken from its contents (unless that file already holds
    /// exactly it) and returns the file's path. Written to a temporary name and renamed, so a process
    /// reading it meanwhile sees the old file or the whole new one.
    pub fn place(dir: &Path, header: &str) -> std::io::Result<PathBuf> {
        let path = dir.join(format!("{:016x}-{}.cuh", digest(header), header.len()));
        if std::fs::read(&path).is_ok_and(|held| held == header.as_bytes()) {
            return Ok(path);
        }
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), digest(header)));
        std::fs::write(&tmp, header)?;
        std::fs::rename(&tmp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(path)
    }

    /// The line that includes the file at `path`: None where the path cannot be written in a quoted
    /// include (not UTF-8, or holding a quote, a backslash or a line break).
    pub fn include_line(path: &Path) -> Option<String> {
        let p = path.to_str()?;
        (path.is_absolute() && !p.contains(['"', '\\', '\n', '\r'])).then(|| format!("#include \"{p}\"\n"))
    }

    /// Compiles and runs a kernel whose header is a file: it must give the value the header defines.
    pub(super) fn check() -> Result<()> {
        let header = "__device__ inline float tandem_header_check() { return 3.5f; }\n";
        let path = place(&dir(), header).map_err(|e| crate::Error::Invalid(format!("writing a kernel header: {e}")))?;
        let line = include_line(&path)
            .ok_or_else(|| crate::Error::Invalid(format!("{} cannot be included", path.display())))?;
        let inner = ffi::cuda_kernel(
            "tandem_header_check",
            &["x".to_string()],
            &["y".to_string()],
            "y[0] = x[0] + tandem_header_check();",
            &line,
            true,
        )?;
        let kernel = Kernel { inner };
        let x = Array::from_slice(&[1.0f32], &[1])?;
        let y = kernel.call(
            &[&x],
            &Launch { outputs: &[(&[1], Dtype::F32)], grid: [1, 1, 1], threadgroup: [1, 1, 1], template: &[] },
        )?;
        let got =
            y.first().ok_or_else(|| crate::Error::Invalid("the header check gave no output".into()))?.item::<f32>()?;
        if got == 4.5 {
            Ok(())
        } else {
            Err(crate::Error::Invalid(format!("the header check gave {got}, not 4.5")))
        }
    }
}
