//! The linear-attention layers' causal depthwise conv with the SiLU after it, in fp32: on CUDA, for a decode
//! step or a verify (1..=[`MAX_STEPS`] new positions), the kernel in kernels/cuda/conv_silu.cu{,h}; everywhere
//! else MLX's conv and the compiled SiLU ([`fallback`]).
//!
//! MLX 0.32.4's CUDA conv runs through cuDNN, which builds a graph for each exact input shape, ~100-300 ms on
//! the H200 the first time: every new batch size and verify width met one (docs/PERF.md, session 14). The
//! kernel is one launch for the cast, the conv and the SiLU, and has no per-shape state.
//!
//! Each output depends only on its own window, summed in a fixed order, so a position's result is the same
//! bits whether it is decoded alone or inside a verify or a batch: the kernel is taken at T = 1 too.
//!
//! Tolerance: against the fallback (both fp32), relative Frobenius error at most [`TOLERANCE`].
//!
//! Selected on the classes where its parity test (`tests/it/conv_kernel.rs::conv_cuda_parity`) passed; its CUDA
//! source is also checked on every machine by a CPU emulation (`conv_source_emulated_on_cpu`).

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::quantized_matmul::relative_error;
use super::{fused, probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/conv_silu.cuh");
const SOURCE: &str = include_str!("../../kernels/cuda/conv_silu.cu");

/// This kernel's name for `TANDEM_KERNELS=-conv`.
pub const NAME: &str = "conv";
/// New positions per call the kernel takes (a verify of depth 15); longer passes (prefill) go to MLX.
pub const MAX_STEPS: i32 = 16;
/// Kernel widths it takes (Qwen3.5's is 4).
pub const MAX_WIDTH: i32 = 8;
/// Compute capabilities (major, minor) where the parity test passed (the H200, kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];
/// Relative Frobenius error against the fallback.
pub const TOLERANCE: f32 = 1e-5;

/// `silu(conv1d(x, w))` in fp32 over `x` `[B, K - 1 + T, C]` (any float dtype) and the depthwise weight
/// `w` `[C, K, 1]` (fp32): the kernel where [`selected`], the fallback otherwise. Output `[B, T, C]` fp32.
pub fn conv_silu(x: &Array, w: &Array) -> Result<Array> {
    if selected(x, w) {
        return cuda(x, w);
    }
    fallback(x, w)
}

/// MLX's ops the kernel replaces: x cast to fp32, a depthwise conv, the compiled SiLU.
pub fn fallback(x: &Array, w: &Array) -> Result<Array> {
    let c = x.dim(2);
    fused::silu(&mlx::ops::conv1d(&x.as_dtype(Dtype::F32)?, w, 1, 0, 1, c)?)
}

/// Whether a call goes to the kernel: CUDA on the GPU, shapes inside [`applicable`], a machine class whose
/// parity test passed (or `TANDEM_KERNELS=on`), not `-conv`, and this machine's probe passed.
pub fn selected(x: &Array, w: &Array) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES) && applicable(x, w) && probe_passed()
}

/// The shapes the kernel computes: x `[B, K - 1 + T, C]` of bf16, f16 or f32 with T in 1..=[`MAX_STEPS`],
/// w `[C, K, 1]` fp32 with K in 1..=[`MAX_WIDTH`].
pub fn applicable(x: &Array, w: &Array) -> bool {
    if !matches!(x.dtype(), Dtype::BF16 | Dtype::F16 | Dtype::F32) || w.dtype() != Dtype::F32 {
        return false;
    }
    if x.ndim() != 3 || w.ndim() != 3 {
        return false;
    }
    let (c, k) = (w.dim(0), w.dim(1));
    let steps = x.dim(1) - k + 1;
    w.dim(2) == 1
        && x.dim(2) == c
        && c >= 1
        && x.dim(0) >= 1
        && (1..=MAX_WIDTH).contains(&k)
        && (1..=MAX_STEPS).contains(&steps)
}

/// Runs the kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only
/// what would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(x: &Array, w: &Array) -> Result<Array> {
    if !applicable(x, w) {
        return Err(mlx::Error::Invalid(format!(
            "conv kernel: x {:?} {:?}, w {:?} {:?}",
            x.shape(),
            x.dtype(),
            w.shape(),
            w.dtype()
        )));
    }
    let (b, c, k) = (x.dim(0), w.dim(0), w.dim(1));
    let steps = x.dim(1) - k + 1;
    let out_shape = [b, steps, c];
    with_kernel(x.dtype(), |kernel| {
        kernel.call(
            &[x, w],
            &Launch {
                outputs: &[(&out_shape[..], Dtype::F32)],
                grid: [(c + 255) / 256 * 256, steps, b],
                threadgroup: [256, 1, 1],
                template: &[("K", k)],
            },
        )
    })?
    .into_iter()
    .next()
    .ok_or_else(|| mlx::Error::Invalid("conv kernel: no output".into()))
}

/// The kernel object for x's dtype, made once per thread ([`super::with_cached`]).
fn with_kernel<R>(dtype: Dtype, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<Dtype> = const { RefCell::new(Vec::new()) };
    }
    let name = format!("tandem_conv_silu_{}", super::dtype_suffix(dtype));
    with_cached(&KERNELS, dtype, || Kernel::new(KernelBackend::Cuda, &name, &["x", "w"], &["y"], SOURCE, HEADER), f)
}

/// Random inputs of one call: x `[b, k - 1 + t, c]` of `dtype` and an fp32 weight `[c, k, 1]`.
pub fn random_inputs(b: i32, t: i32, c: i32, k: i32, dtype: Dtype, seed: u64) -> Result<(Array, Array)> {
    let keys = random::split(&random::key(seed)?, 2)?;
    let x = random::normal(&[b, k - 1 + t, c], Dtype::F32, &keys[0])?.as_dtype(dtype)?;
    let w = random::normal(&[c, k, 1], Dtype::F32, &keys[1])?.multiply(&Array::f32(0.5))?;
    Ok((x, w))
}

/// The probe's verdict, run once per process: the kernel against the fallback on a small random problem.
fn probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| probe_verdict("conv kernel", probe(), TOLERANCE))
}

/// Relative error of the kernel against the fallback on 2 sequences of 3 positions, 300 channels, K = 4.
pub fn probe() -> Result<f32> {
    let (x, w) = random_inputs(2, 3, 300, 4, Dtype::BF16, 0x636f_6e76)?;
    relative_error(&cuda(&x, &w)?, &fallback(&x, &w)?)
}
