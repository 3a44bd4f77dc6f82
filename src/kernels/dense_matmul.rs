//! `y = x @ w^T` for dense bf16 or f16 weights: at verify widths (M = 1..32 rows of x) on CUDA, the kernel in
//! kernels/cuda/dense_matmul.cu{,h}; everywhere else, MLX's matmul ([`fallback`]).
//!
//! MLX 0.32.4's CUDA matmul in bf16 gives a row of x different bits at M = 1 than inside M = 2..4 (its
//! gemv and its gemm tile sum in different orders), so an MTP verify's logits were not plain decoding's
//! and bf16 MTP left the plain continuation (docs/PERF.md). The kernel computes each row of x the same way
//! whatever M is and whatever the other rows hold, so a verify's logits are decoding's own, bit for bit; it
//! is taken for all M in 1..=32, M = 1 included, for that reason, and reads each weight byte once a call (past 8
//! rows, one block takes every 8-row slab of x: [`slab_shape`]).
//!
//! Tolerance: against an fp32 reference (x and w upcast) the relative Frobenius error of its output is at
//! most half an ulp of the output dtype (2^-8 bf16, 2^-11 f16), what rounding the exact result costs.

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::quantized_matmul::{host_tolerance, relative_error, tolerance};
use super::{probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/dense_matmul.cuh");
const SOURCE: &str = include_str!("../../kernels/cuda/dense_matmul.cu");

/// This kernel's name for `TANDEM_KERNELS=-dense_matmul` (every other kernel stays on).
pub const NAME: &str = "dense_matmul";
/// Rows of x the kernel takes ([`super::VERIFY_ROWS`]).
pub const MAX_ROWS: i32 = super::VERIFY_ROWS;
/// K is consumed in chunks of this many elements (each lane loads two 16-byte pieces of a chunk).
pub const CHUNK: i32 = 64;
/// The range of K (x's last axis) and N (weight rows) the parity runs covered (benches/gpu/dmm_kernel.py,
/// tests/it/kernels.rs: K from 64 to 17408, N from 40 to a 248320-row vocabulary).
pub const K_RANGE: (i32, i32) = (64, 17408);
pub const MAX_N: i32 = 262_144;
/// Compute capabilities (major, minor) where the parity test passed: the H200 (kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];

/// Launch shape (R 16-row tiles per warp, KS warps per block splitting K, U chunks per load round), chosen
/// on the H200 (benches/gpu/dmm_kernel.py). It depends on the weight's shape only, never on M: the rows'
/// bits must not change with the number of rows.
fn launch_shape(_n: i32, _k: i32) -> (i32, i32, i32) {
    (2, 4, 2)
}

/// 8-row slabs of x one block takes for `m` rows, and the chunks it loads per round (`u`, the launch shape's):
/// past 8 rows a block takes every slab and loads each weight chunk once for all of them (as the quantized
/// matmul does, kernels/README.md), one chunk a round past two slabs (128 registers where two would take 234:
/// `benches/gpu/nvrtc_check.py ... dmm`). Neither changes a row's bits. bf16 slice on an H100, 8 streams at
/// depth 3: 1,405-1,429 -> 1,554-1,678 tok/s (docs/PERF.md, session 22). `TANDEM_KERNELS=-dmm_slabs` runs a
/// block per slab, as before.
pub fn slab_shape(m: i32, u: i32) -> (i32, i32) {
    let slabs = super::slabs(m);
    if slabs == 1 || super::disabled("dmm_slabs") {
        return (1, u);
    }
    (slabs, if slabs > 2 { 1 } else { u })
}

/// `x @ w^T`: the CUDA kernel where [`selected`], the host kernel where [`cpu_selected`], MLX's matmul
/// otherwise.
pub fn dense_matmul(x: &Array, w: &Array) -> Result<Array> {
    if selected(x, w) {
        return cuda(x, w);
    }
    if cpu_selected(x, w) {
        return mlx::host::dense_matmul(x, w);
    }
    fallback(x, w)
}

/// The host kernel's name for `TANDEM_KERNELS=-cpu_matmul`.
pub const CPU_NAME: &str = "cpu_matmul";

/// Whether a call takes the host kernel (kernels/cpu/dense_matmul.cc, `mlx::host::dense_matmul`): MLX
/// computing on the CPU, x and w both f32, bf16 or f16 with w `[N, K]`, kernels not switched off. On the
/// CPU MLX's matmul runs at ~2 GFLOP/s (a gemm of its own in bf16 and f16, reference BLAS for f32 in the Linux
/// wheels); the kernel runs a decoding step's products several times faster, and a row's bits never depend on the other rows (kernels/README.md,
/// "Dense matmul on the CPU").
pub fn cpu_selected(x: &Array, w: &Array) -> bool {
    let dt = x.dtype();
    super::policy() != super::Policy::Off
        && !super::disabled(CPU_NAME)
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && matches!(dt, Dtype::F32 | Dtype::BF16 | Dtype::F16)
        && w.dtype() == dt
        && w.ndim() == 2
        && x.ndim() >= 1
        && x.dim(-1) == w.dim(1)
        && cpu_probe_passed(dt)
}

/// The host kernel's probe verdict for `dtype`, once per process: the kernel is C++ built for the machine
/// it runs on (arm64 NEON on a Mac, where no test of this repository runs), so it proves itself there
/// before it is taken.
fn cpu_probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)].get_or_init(|| {
        probe_verdict(&format!("host dense matmul ({dtype:?})"), cpu_probe(dtype), host_tolerance(dtype))
    })
}

/// Relative Frobenius error of the host kernel against an fp32 reference on x of 19 rows (K of 264: a tail
/// past the eight lanes; N of 42: a tail past the four-row groups), infinite where its last 3 rows alone do
/// not give the same bits.
pub fn cpu_probe(dtype: Dtype) -> Result<f32> {
    let keys = random::split(&random::key(0x686d_6d00)?, 2)?;
    let w = random::normal(&[42, 264], Dtype::F32, &keys[0])?.multiply(&Array::f32(0.02))?.as_dtype(dtype)?;
    let x19 = random::normal(&[19, 264], Dtype::F32, &keys[1])?.as_dtype(dtype)?;
    let Some(y19) = super::last_slab_alone(&x19, |x| mlx::host::dense_matmul(x, &w))? else {
        return Ok(f32::INFINITY);
    };
    relative_error(&y19, &reference(&x19, &w)?)
}

/// The MLX op the kernel replaces.
pub fn fallback(x: &Array, w: &Array) -> Result<Array> {
    x.matmul(&w.t()?)
}

/// Whether a call goes to the kernel: CUDA on the GPU, a format and shape inside [`applicable`], a machine
/// class whose parity test passed (or `TANDEM_KERNELS=on`), not `-dense_matmul`, and this machine's probe
/// passed.
pub fn selected(x: &Array, w: &Array) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES) && applicable(x, w) && probe_passed(x.dtype())
}

/// The formats and shapes the kernel computes and its parity runs covered: x and w both bf16 or both f16,
/// w `[N, K]`, x `[..., K]` with M = 1..=32 rows, K a multiple of 64 in range, N in range.
pub fn applicable(x: &Array, w: &Array) -> bool {
    let dt = x.dtype();
    if !matches!(dt, Dtype::BF16 | Dtype::F16) || w.dtype() != dt || x.ndim() == 0 || w.ndim() != 2 {
        return false;
    }
    let (k, n) = (x.dim(-1), w.dim(0));
    if w.dim(1) != k || !(K_RANGE.0..=K_RANGE.1).contains(&k) || k % CHUNK != 0 || !(1..=MAX_N).contains(&n) {
        return false;
    }
    (1..=MAX_ROWS as usize).contains(&(x.size() / k as usize))
}

/// Runs the kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only
/// what would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(x: &Array, w: &Array) -> Result<Array> {
    let invalid = |what: &str| mlx::Error::Invalid(format!("dense_matmul kernel: {what}"));
    let dt = x.dtype();
    if !matches!(dt, Dtype::BF16 | Dtype::F16) || w.dtype() != dt || w.ndim() != 2 {
        return Err(invalid(&format!("x {:?}, w {:?} of {} axes", dt, w.dtype(), w.ndim())));
    }
    let (k, n) = (x.dim(-1), w.dim(0));
    if k <= 0 || k % CHUNK != 0 || w.dim(1) != k || n <= 0 {
        return Err(invalid(&format!("K {k} (w {:?}), a multiple of {CHUNK} needed", w.shape())));
    }
    let m = (x.size() / k as usize) as i32;
    if !(1..=MAX_ROWS).contains(&m) {
        return Err(invalid(&format!("{m} rows of x, at most {MAX_ROWS}")));
    }
    if !matches!(x.ndim(), 2 | 3) {
        // The kernel reads two or three axes (it flattens the leading ones itself); others are reshaped.
        return cuda(&x.reshape(&[-1, k])?, w)?.reshape(&super::last_axis_set(x, n));
    }
    let out_shape = super::last_axis_set(x, n);
    let (r, ks, u) = launch_shape(n, k);
    let (slabs_per_block, u) = slab_shape(m, u);
    let blocks = (n + 16 * r - 1) / (16 * r) * (super::slabs(m) / slabs_per_block);
    with_kernel(dt, |kernel| {
        kernel.call(
            &[x, w],
            &Launch {
                outputs: &[(&out_shape[..], dt)],
                grid: [blocks * 32 * ks, 1, 1],
                threadgroup: [32 * ks, 1, 1],
                template: &[("R", r), ("KS", ks), ("U", u), ("S", slabs_per_block), ("XD", x.ndim() as i32)],
            },
        )
    })?
    .into_iter()
    .next()
    .ok_or_else(|| invalid("no output"))
}

/// The kernel object for `dtype`, made once per thread ([`super::with_cached`]).
fn with_kernel<R>(dtype: Dtype, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<Dtype> = const { RefCell::new(Vec::new()) };
    }
    let name = format!("tandem_dmm_{}", super::dtype_suffix(dtype));
    with_cached(&KERNELS, dtype, || Kernel::new(KernelBackend::Cuda, &name, &["x", "w"], &["y"], SOURCE, HEADER), f)
}

/// The probe's verdict for `dtype`, run once per process: the kernel on a small random problem (3 rows, 40
/// outputs, K = 256: partial tiles, one chunk per warp) against an fp32 reference. A kernel that fails to
/// compile or to match is never selected; the reason is logged.
fn probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = &PROBES[usize::from(dtype == Dtype::F16)];
    *slot.get_or_init(|| probe_verdict(&format!("dense_matmul kernel ({dtype:?})"), probe(dtype), tolerance(dtype)))
}

/// Relative Frobenius error of the kernel on small random problems against an fp32 reference: x of 3 rows, and
/// of 19 (three slabs in one block, [`slab_shape`]) whose last slab must give the bits of those
/// 3 rows alone: infinite where it does not.
pub fn probe(dtype: Dtype) -> Result<f32> {
    let keys = random::split(&random::key(0x646d_6d00)?, 3)?;
    let w = random::normal(&[40, 256], Dtype::F32, &keys[0])?.multiply(&Array::f32(0.02))?.as_dtype(dtype)?;
    // x of two axes and of three: both ways the kernel reads x's rows.
    let x = random::normal(&[3, 256], Dtype::F32, &keys[1])?.as_dtype(dtype)?;
    let x3 = x.reshape(&[1, 3, 256])?;
    let worst = relative_error(&cuda(&x, &w)?, &reference(&x, &w)?)?;
    let x19 = random::normal(&[19, 256], Dtype::F32, &keys[2])?.as_dtype(dtype)?;
    let Some(y19) = super::last_slab_alone(&x19, |x| cuda(x, &w))? else { return Ok(f32::INFINITY) };
    let worst = worst.max(relative_error(&y19, &reference(&x19, &w)?)?);
    Ok(worst.max(relative_error(&cuda(&x3, &w)?, &reference(&x3, &w)?)?))
}

/// `x @ w^T` in fp32.
pub fn reference(x: &Array, w: &Array) -> Result<Array> {
    x.as_dtype(Dtype::F32)?.matmul(&w.as_dtype(Dtype::F32)?.t()?)
}
