//! Every layer's RMSNorm in fp32 over bf16/f16 rows, alone ([`rms_norm`]) or after the residual add
//! ([`add_rms_norm`]): on CUDA the kernels in kernels/cuda/rms_norm.cuh (one launch each), everywhere else
//! MLX's ops ([`fallback`], [`add_fallback`]): the cast to fp32, MLX's norm with the fp32 scale, the cast
//! back, and the add before them.
//!
//! Why: on CUDA a decode step is bound by MLX's host cost per launch, and those casts and adds were 79 + 32
//! of the 434 launches of a 27B-shaped step (docs/PERF.md, session 15); a decoder layer's norms become 2
//! launches where they were 7.
//!
//! A row's result depends on that row only (one block, a fixed summation order), so a token is normalised
//! to the same bits alone, in a verify or in a batch. It is not MLX's summation order, so its rounding may
//! differ from the fallback's by an ulp of the output in a few elements: the tolerance is half an ulp of the
//! output dtype against fp32, as for the matmul kernels.
//!
//! Selected on the classes in [`TESTED_CLASSES`], where its parity test
//! (`tests/it/norm_kernel.rs::norm_cuda_parity`) passed; its CUDA source is checked on every machine by a CPU
//! emulation (`norm_source_emulated_on_cpu`).

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::device::{default_device, Device};
use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{fast, random, Array, Dtype};

use super::quantized_matmul::{relative_error, tolerance};
use super::{probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/rms_norm.cuh");
const NORM: &str = include_str!("../../kernels/cuda/rms_norm.cu");
const ADD_NORM: &str = include_str!("../../kernels/cuda/add_rms_norm.cu");

/// This kernel's name for `TANDEM_KERNELS=-norm`.
pub const NAME: &str = "norm";
/// Threads of a row's block (`THREADS` in rms_norm.cuh).
const THREADS: i32 = 256;
/// The longest row it takes (a hidden size; Qwen3.5's largest is 8192).
pub const MAX_DIM: i32 = 65536;
/// Compute capabilities (major, minor) where the parity test passed: the H200 (kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];

/// `w * rmsnorm(x)` in fp32 with the fp32 scale `w` `[D]`, rounded to x's dtype: the kernel where
/// [`selected`], MLX's ops otherwise.
pub fn rms_norm(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    if selected(x, None, w) {
        return cuda(x, w, eps);
    }
    fallback(x, w, eps)
}

/// The residual add and the norm after it: `(h + m, rms_norm(h + m))`, the sum in h's dtype.
pub fn add_rms_norm(h: &Array, m: &Array, w: &Array, eps: f32) -> Result<(Array, Array)> {
    if selected(h, Some(m), w) {
        return add_cuda(h, m, w, eps);
    }
    add_fallback(h, m, w, eps)
}

/// MLX's ops the plain kernel replaces: MLX's norm over x in fp32 with the fp32 scale, rounded once to x's
/// dtype (for f32 x the casts are no operations; the linear-attention layers' f32 norms take this too). On the
/// CPU, where MLX's norm is its own op-by-op fallback, those operations by a host kernel or compiled into one
/// chain ([`super::fused::rms_norm_cpu`], the same bits).
pub fn fallback(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    if default_device() == Device::Cpu {
        return super::fused::rms_norm_cpu(x, w, eps);
    }
    fast::rms_norm(&x.as_dtype(Dtype::F32)?, Some(w), eps)?.as_dtype(x.dtype())
}

/// MLX's ops the residual kernel replaces.
pub fn add_fallback(h: &Array, m: &Array, w: &Array, eps: f32) -> Result<(Array, Array)> {
    let sum = h.add(m)?;
    let y = fallback(&sum, w, eps)?;
    Ok((sum, y))
}

/// Whether a call goes to the kernel: CUDA on the GPU, shapes inside [`applicable`], a machine class whose
/// parity test passed (or `TANDEM_KERNELS=on`), not `-norm`, and this machine's probe passed.
pub fn selected(x: &Array, m: Option<&Array>, w: &Array) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES) && applicable(x, m, w) && probe_passed(x.dtype())
}

/// The shapes the kernel computes: rows of D (1..=[`MAX_DIM`]) bf16, f16 or f32 elements, `w` fp32 `[D]`;
/// with a residual `m`, the same shape and dtype as x.
pub fn applicable(x: &Array, m: Option<&Array>, w: &Array) -> bool {
    if !matches!(x.dtype(), Dtype::BF16 | Dtype::F16 | Dtype::F32) || w.dtype() != Dtype::F32 {
        return false;
    }
    if x.ndim() == 0 || x.size() == 0 || w.ndim() != 1 || w.dim(0) != x.dim(-1) || !(1..=MAX_DIM).contains(&w.dim(0)) {
        return false;
    }
    m.is_none_or(|m| m.dtype() == x.dtype() && m.shape() == x.shape())
}

/// Runs the plain kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). The
/// parity tests call this.
pub fn cuda(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    check(x, None, w)?;
    let mut out = launch(Stage::Norm, &[x, w], rows(x, w), eps)?;
    out.pop().ok_or_else(|| invalid("no output"))
}

/// Runs the residual kernel: `(h + m, its norm)`.
pub fn add_cuda(h: &Array, m: &Array, w: &Array, eps: f32) -> Result<(Array, Array)> {
    check(h, Some(m), w)?;
    let mut out = launch(Stage::AddNorm, &[h, m, w], rows(h, w), eps)?.into_iter();
    match (out.next(), out.next()) {
        (Some(sum), Some(y)) => Ok((sum, y)),
        _ => Err(invalid("too few outputs")),
    }
}

fn invalid(what: &str) -> mlx::Error {
    mlx::Error::Invalid(format!("rms_norm kernel: {what}"))
}

fn check(x: &Array, m: Option<&Array>, w: &Array) -> Result<()> {
    if applicable(x, m, w) {
        return Ok(());
    }
    Err(invalid(&format!(
        "x {:?} {:?}, residual {:?}, w {:?} {:?}",
        x.shape(),
        x.dtype(),
        m.map(|m| (m.shape(), m.dtype())),
        w.shape(),
        w.dtype()
    )))
}

fn rows(x: &Array, w: &Array) -> i32 {
    (x.size() / w.dim(0) as usize) as i32
}

#[derive(Clone, Copy, PartialEq)]
enum Stage {
    Norm,
    AddNorm,
}

/// One launch of `stage` over `inputs` (rows first): its outputs are shaped and typed like the rows, one
/// for the norm, two (the sum, the norm) for the residual form.
fn launch(stage: Stage, inputs: &[&Array], rows: i32, eps: f32) -> Result<Vec<Array>> {
    let (shape, dt) = (inputs[0].shape(), inputs[0].dtype());
    let count = if stage == Stage::Norm { 1 } else { 2 };
    let outputs = vec![(shape.as_slice(), dt); count];
    with_kernel(stage, dt, |kernel| {
        kernel.call(
            inputs,
            &Launch {
                outputs: &outputs,
                grid: [rows * THREADS, 1, 1],
                threadgroup: [THREADS, 1, 1],
                template: &[("EPS", eps.to_bits() as i32)],
            },
        )
    })
}

/// The kernel object for a stage and dtype, made once per thread ([`super::with_cached`]).
fn with_kernel<R>(stage: Stage, dtype: Dtype, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<(Stage, Dtype)> = const { RefCell::new(Vec::new()) };
    }
    let suffix = super::dtype_suffix(dtype);
    with_cached(
        &KERNELS,
        (stage, dtype),
        || match stage {
            Stage::Norm => Kernel::new(
                KernelBackend::Cuda,
                &format!("tandem_rms_norm_{suffix}"),
                &["x", "w"],
                &["y"],
                NORM,
                HEADER,
            ),
            Stage::AddNorm => Kernel::new(
                KernelBackend::Cuda,
                &format!("tandem_add_rms_norm_{suffix}"),
                &["h", "m", "w"],
                &["hs", "y"],
                ADD_NORM,
                HEADER,
            ),
        },
        f,
    )
}

/// Random inputs of one call: the residual h and the sublayer output m `[rows, d]` of `dtype`, and a scale
/// around 1 in fp32 (a zero-centred weight plus one).
pub fn random_inputs(rows: i32, d: i32, dtype: Dtype, seed: u64) -> Result<(Array, Array, Array)> {
    let keys = random::split(&random::key(seed)?, 3)?;
    let h = random::normal(&[rows, d], Dtype::F32, &keys[0])?.as_dtype(dtype)?;
    let m = random::normal(&[rows, d], Dtype::F32, &keys[1])?.multiply(&Array::f32(0.3))?.as_dtype(dtype)?;
    let w = random::normal(&[d], Dtype::F32, &keys[2])?.multiply(&Array::f32(0.1))?.add(&Array::f32(1.0))?;
    Ok((h, m, w))
}

/// `w * x / sqrt(mean(x^2) + eps)` in fp32 from x's values: what both paths round.
pub fn reference(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    let x = x.as_dtype(Dtype::F32)?;
    let ms = x.square()?.mean(&[-1], true)?;
    x.multiply(&ms.add(&Array::f32(eps))?.rsqrt()?)?.multiply(w)
}

/// The probe's verdict for `dtype`, run once per process: both kernels against the fallback on a small
/// problem ([`super::probe_verdict`]; a kernel that fails to compile for this dtype is never selected).
fn probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)]
        .get_or_init(|| probe_verdict(&format!("rms_norm kernel ({dtype:?})"), probe(dtype), tolerance(dtype)))
}

/// Relative error of both kernels' outputs against the fallback's, 3 rows of 300 of `dtype`.
pub fn probe(dtype: Dtype) -> Result<f32> {
    let (h, m, w) = random_inputs(3, 300, dtype, 0x6e6f_726d)?;
    let (sum, y) = add_cuda(&h, &m, &w, 1e-6)?;
    let (want_sum, want_y) = add_fallback(&h, &m, &w, 1e-6)?;
    let plain = relative_error(&cuda(&h, &w, 1e-6)?, &fallback(&h, &w, 1e-6)?)?;
    Ok(relative_error(&sum, &want_sum)?.max(relative_error(&y, &want_y)?).max(plain))
}
