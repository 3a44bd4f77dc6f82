//! Custom kernels, each beside the MLX op it replaces. The kernel sources live in the top-level `kernels/`
//! folder (kernels/README.md lists them with their tolerances and figures): GPU kernels are compiled by
//! MLX's custom-kernel API on first use, host kernels for MLX's CPU backend are built into `crates/mlx`
//! (`mlx::host`). A kernel is taken only on the backend and shapes its parity test
//! covers, on machine classes where that test passed, after a small parity probe on this machine; every
//! other call goes to the MLX op. `TANDEM_KERNELS=off` turns them all off; `TANDEM_KERNELS=-gated_delta`
//! (a comma-separated list: a policy, and names with a `-` before them) turns off the named kernels only
//! (`gated_delta`, `gated_delta_qkv`, `dense_matmul`, `attention`, `attention_front`, `attention_gate`, `conv`,
//! `conv_window`, `gated_norm`, `norm`; on the CPU `cpu_matmul`, `cpu_qmm`, `cpu_gated_delta`,
//! `cpu_gated_delta_qkv`, `cpu_gated_norm`, `cpu_attention`, `cpu_elementwise`, `cpu_rope`; `qmm_narrow`
//! launches the quantized matmul in its one wide shape for every weight, `qmm_slabs` / `dmm_slabs` a matmul
//! block per 8-row slab of x).
//! `fused` holds the elementwise chains MLX's graph compiler fuses on every backend (`TANDEM_COMPILE=off`
//! runs them op by op), and on the CPU their host kernels, which give MLX's own bits.

pub mod attention;
pub mod attention_front;
pub mod conv;
pub mod dense_matmul;
pub mod fused;
pub mod gated_delta;
pub mod gated_delta_qkv;
pub mod gated_norm;
pub mod norm;
pub mod quantized_matmul;
pub mod rope;

pub use dense_matmul::dense_matmul;
pub use quantized_matmul::quantized_matmul;

use std::sync::OnceLock;

use mlx::Array;

/// What `TANDEM_KERNELS` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Unset or `auto`: kernels on the machine classes where their parity tests passed.
    Auto,
    /// `off`: MLX's ops only.
    Off,
    /// `on`: also on GPUs of the right backend whose class has not been tested (the probe still runs).
    On,
}

impl Policy {
    /// The policy of a `TANDEM_KERNELS` value: its last item without a `-` before it (auto if none).
    fn parse(v: Option<&str>) -> Policy {
        let items = v.map(|v| v.split(',').map(str::trim).filter(|s| !s.starts_with('-')).collect::<Vec<_>>());
        match items.as_ref().and_then(|items| items.iter().rev().find(|s| !s.is_empty())) {
            Some(item) => Policy::parse_one(item),
            None => Policy::Auto,
        }
    }

    fn parse_one(v: &str) -> Policy {
        match v.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Policy::Off,
            "on" | "1" | "true" | "yes" => Policy::On,
            "auto" | "" => Policy::Auto,
            other => {
                tracing::warn!("TANDEM_KERNELS={other:?} is not one of auto, on, off; using auto");
                Policy::Auto
            }
        }
    }
}

/// The policy of this process, read once from `TANDEM_KERNELS`.
pub fn policy() -> Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    *POLICY.get_or_init(|| Policy::parse(std::env::var("TANDEM_KERNELS").ok().as_deref()))
}

/// The kernels a `TANDEM_KERNELS` value names with a `-` before them.
fn exclusions(v: Option<&str>) -> Vec<String> {
    v.map(|v| v.split(',').filter_map(|s| s.trim().strip_prefix('-')).map(|s| s.trim().to_ascii_lowercase()).collect())
        .unwrap_or_default()
}

/// Whether `TANDEM_KERNELS` turns off the kernel called `name` alone (`-name` in its list).
pub fn disabled(name: &str) -> bool {
    static EXCLUDED: OnceLock<Vec<String>> = OnceLock::new();
    EXCLUDED.get_or_init(|| exclusions(std::env::var("TANDEM_KERNELS").ok().as_deref())).iter().any(|n| n == name)
}

/// Whether a kernel may be taken on this machine at all, before its shapes and its probe are asked: MLX on
/// a CUDA GPU, `TANDEM_KERNELS` not `off` nor `-name` (`name`: the kernel's switch, where it has one), and
/// unless it is `on`, this GPU's compute capability among `tested` (the classes where the kernel's parity
/// test passed).
pub(crate) fn cuda_allows(name: Option<&str>, tested: &[(u32, u32)]) -> bool {
    use mlx::device::{backend, cuda_compute_capability, default_device, Backend, Device};
    static CLASS: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    if policy() == Policy::Off
        || name.is_some_and(disabled)
        || backend() != Backend::Cuda
        || default_device() != Device::Gpu
    {
        return false;
    }
    let allowed =
        policy() == Policy::On || CLASS.get_or_init(cuda_compute_capability).is_some_and(|cc| tested.contains(&cc));
    if allowed {
        static HEADERS: std::sync::Once = std::sync::Once::new();
        HEADERS.call_once(|| {
            tracing::info!(
                "CUDA kernel headers: {} ({})",
                mlx::kernel::cuda_headers_mode(),
                mlx::kernel::header_file::dir().display()
            )
        });
    }
    allowed
}

/// A kernel's probe verdict, logged: `what` (the kernel, and the variant probed) is selected when its probe
/// ran and its error is within `tolerance`. A kernel that fails to compile or to match is never selected.
pub(crate) fn probe_verdict(what: &str, probe: mlx::Result<f32>, tolerance: f32) -> bool {
    match probe {
        Ok(err) if err <= tolerance => {
            tracing::info!("{what}: probe error {err:.2e}, selected");
            true
        }
        Ok(err) => {
            tracing::warn!("{what}: probe error {err:.2e} over {tolerance:.2e}; using MLX's op");
            false
        }
        Err(e) => {
            tracing::warn!("{what} failed its probe ({e}); using MLX's op");
            false
        }
    }
}

/// A launch's arrays for an error that refuses it: `name [shape] Dtype` each, comma-separated.
pub(crate) fn arrays_text(arrays: &[(&str, &mlx::Array)]) -> String {
    arrays.iter().map(|(n, a)| format!("{n} {:?} {:?}", a.shape(), a.dtype())).collect::<Vec<_>>().join(", ")
}

/// The part of a kernel's name that says its input dtype (`tandem_conv_silu_bf16`): MLX caches a compiled
/// kernel by name, so each dtype's instance needs its own.
pub(crate) fn dtype_suffix(dtype: mlx::Dtype) -> &'static str {
    match dtype {
        mlx::Dtype::F16 => "f16",
        mlx::Dtype::F32 => "f32",
        _ => "bf16",
    }
}

/// Which of a kernel's three per-dtype slots (bf16, f16, f32: probe verdicts) `dtype` takes.
pub(crate) fn dtype_slot(dtype: mlx::Dtype) -> usize {
    match dtype {
        mlx::Dtype::F16 => 1,
        mlx::Dtype::F32 => 2,
        _ => 0,
    }
}

/// Kernel objects of one module, one per key (an input dtype, a stage), made once per thread.
pub(crate) type KernelCache<K> = std::cell::RefCell<Vec<(K, mlx::kernel::Kernel)>>;

/// `f` with the kernel object for `key` from `cache`, made by `make` on first use. MLX names a compiled
/// kernel by its name and template integers only, so each input dtype gets its own name and object.
pub(crate) fn with_cached<K: Copy + PartialEq + 'static, R>(
    cache: &'static std::thread::LocalKey<KernelCache<K>>,
    key: K,
    make: impl FnOnce() -> mlx::Result<mlx::kernel::Kernel>,
    f: impl FnOnce(&mlx::kernel::Kernel) -> mlx::Result<R>,
) -> mlx::Result<R> {
    cache.with(|cell| {
        let mut kernels = cell.borrow_mut();
        if !kernels.iter().any(|(k, _)| *k == key) {
            let kernel = make()?;
            kernels.push((key, kernel));
        }
        let kernel = kernels.iter().find(|(k, _)| *k == key).map(|(_, kernel)| kernel);
        kernel.map_or_else(|| Err(mlx::Error::Invalid("kernel cache".into())), f)
    })
}

/// Rows of x the verify-width matmul kernels take (quantized and dense): a verify of depth 7 alone, or
/// of depth 3 for each of 8 batched streams. Past 8 rows x goes in 8-row slabs, each computed as its rows
/// alone, so a row's bits stay those of M = 1; both kernels take every slab in one block (each weight tile
/// loaded, and unpacked, once for all rows).
pub const VERIFY_ROWS: i32 = 32;

/// A matmul kernel's probe of its slabs: `kernel` over x of 19 rows (three slabs) and over its last 3 rows
/// alone; returns the 19-row result, or None where those rows' bytes differ (a slab that is not computed as
/// its rows alone).
pub(crate) fn last_slab_alone(
    x19: &Array,
    kernel: impl Fn(&Array) -> mlx::Result<Array>,
) -> mlx::Result<Option<Array>> {
    let y19 = kernel(x19)?;
    let alone = kernel(&x19.slice_axis(0, 16, 19)?)?;
    Ok((y19.slice_axis(0, 16, 19)?.to_bytes()? == alone.to_bytes()?).then_some(y19))
}

/// The 8-row slabs of `m` rows of x (the kernels' `slabs`).
pub fn slabs(m: i32) -> i32 {
    (m + 7) / 8
}

/// `x`'s shape with its last axis `n`: a matmul's output shape.
pub(crate) fn last_axis_set(x: &Array, n: i32) -> Vec<i32> {
    let mut shape = x.shape();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    shape
}

/// Rows up to which a matmul's output rows are the same bits whatever the number of rows (the
/// verify-width kernels, M = 1..=32), where those kernels run; None where every path already is (the
/// CPU). A batched verify wider than this would score drafts with other bits than plain decoding
/// does, so MTP would no longer give plain decoding's tokens (`generate::batch` keeps under it).
pub fn row_invariant_width() -> Option<usize> {
    use mlx::device::{backend, default_device, Backend, Device};
    (backend() == Backend::Cuda && default_device() == Device::Gpu).then_some(VERIFY_ROWS as usize)
}

#[cfg(test)]
mod tests {
    use super::{exclusions, Policy};

    #[test]
    fn policy_values() {
        assert_eq!(Policy::parse(None), Policy::Auto);
        assert_eq!(Policy::parse(Some("auto")), Policy::Auto);
        assert_eq!(Policy::parse(Some(" OFF ")), Policy::Off);
        assert_eq!(Policy::parse(Some("0")), Policy::Off);
        assert_eq!(Policy::parse(Some("on")), Policy::On);
        assert_eq!(Policy::parse(Some("sometimes")), Policy::Auto);
        assert_eq!(Policy::parse(Some("-gated_delta")), Policy::Auto);
        assert_eq!(Policy::parse(Some("on, -gated_delta")), Policy::On);
        assert_eq!(exclusions(Some("on, -gated_delta,-Other")), ["gated_delta", "other"]);
        assert!(exclusions(Some("off")).is_empty() && exclusions(None).is_empty());
    }
}
