//! `y = x @ dequantize(w)^T` for affine-quantized weights: at verify widths (M = 1..32 rows of x) on CUDA,
//! the kernel in kernels/cuda/quantized_matmul.cu{,h}; on the CPU, the host kernel in
//! kernels/cpu/quantized_matmul.cc ([`host_selected`]: 2, 4 and 8 bits), else MLX's op computed in fp32
//! ([`cpu_f32`]: other bit widths, bf16 or f16 x); everywhere else, MLX's `quantized_matmul` ([`fallback`]).
//!
//! The CPU paths exist because MLX 0.32.4's CPU `quantized_matmul` accumulates in the input's dtype when
//! that is bf16: eight times slower than the same op in fp32 and, at K = 1024, up to 8% off the exact
//! result where fp32 accumulation rounded once is within half an ulp (kernels/README.md has the figures).
//! The host kernel is the fp32 path again, several times faster, and its rows' bits never depend on M.
//!
//! MLX's CUDA op costs almost linearly in M (an MTP verify of 4 tokens paid ~3.5 plain steps of it on the
//! H200); the kernel reads the weights once for all M rows, so M = 8 costs what M = 1 does. It computes
//! each row of x the same way whatever M is, so a verify's logits stay decoding's own (bit for bit).
//! It is taken for all M in 1..=32, M = 1 included, for that reason; past 8 rows it runs per 8-row slab, all
//! of a call's slabs in one block ([`slab_shape`]).
//!
//! Tolerance: against an fp32 reference (x and the dequantized weight in fp32) the relative Frobenius error
//! of its output is at most half an ulp of the output dtype at its worst (2^-8 bf16, 2^-11 f16), what
//! rounding the exact result costs; MLX's op is itself further from that reference in bf16 (kernels/README.md).

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::device::{default_device, Device};
use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::quantized::{dequantize, quantize};
use mlx::{random, Array, Dtype, QuantMode, Quantized};

use super::{policy, probe_verdict, with_cached, KernelCache, Policy};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/quantized_matmul.cuh");
const SOURCE: &str = include_str!("../../kernels/cuda/quantized_matmul.cu");

/// Rows of x the kernel takes ([`super::VERIFY_ROWS`]).
pub const MAX_ROWS: i32 = super::VERIFY_ROWS;
pub const GROUP_SIZE: i32 = 64;
/// The range of K (x's last axis) and N (weight rows) the parity runs covered (benches/gpu/qmm_kernel.py:
/// K from 128 to 17408, N from 40 to a 248320-row vocabulary).
pub const K_RANGE: (i32, i32) = (128, 17408);
pub const MAX_N: i32 = 262_144;
/// Compute capabilities (major, minor) where the parity test passed: the H200 (kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];

/// Launch shape by the weight's row count N, never by M, so a row of x gives the same bits at every M. Chosen
/// on the H200 from each shape's device time under Nsight Compute (benches/gpu/qmm_device.py, kernels/README.md):
/// the wide projections (N > 8192) run two 16-row tiles per warp and four warps per block splitting K, two
/// groups of 64 loaded per round (more rows per block, fewer blocks to schedule); the narrow ones (the 5120-row
/// down, o and out projections, a small vocabulary) one tile per warp and eight warps, so enough blocks and
/// warps stream their fewer rows, with L2's 256-byte prefetch hint on the loads (`P = 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    /// 16-row tiles per warp.
    pub tiles_per_warp: i32,
    /// Warps per block, splitting K.
    pub warps: i32,
    /// Groups of 64 each warp loads per round.
    pub groups_per_round: i32,
    /// Load strategy bits (kernels/cuda/quantized_matmul.cuh): 1 = L2's 256-byte prefetch hint.
    pub prefetch: i32,
}

pub const WIDE: LaunchShape = LaunchShape { tiles_per_warp: 2, warps: 4, groups_per_round: 2, prefetch: 0 };
pub const NARROW: LaunchShape = LaunchShape { tiles_per_warp: 1, warps: 8, groups_per_round: 2, prefetch: 1 };
/// The largest N launched as [`NARROW`].
pub const NARROW_MAX_N: i32 = 8192;

/// The launch shape for a weight of `n` rows. `TANDEM_KERNELS=-qmm_narrow` launches every shape as [`WIDE`]
/// (the one shape of sessions before 17: an A/B switch for benchmarks).
pub fn launch_shape(n: i32) -> LaunchShape {
    if n <= NARROW_MAX_N && !super::disabled("qmm_narrow") {
        NARROW
    } else {
        WIDE
    }
}

/// 8-row slabs of x one block takes for `m` rows, and the groups it loads per round: past 8 rows (a batch's
/// verify) a block takes every slab, so each weight tile is loaded and unpacked once for all rows where a block
/// per slab did both once per slab (8 streams at depth 3, 4-bit slice: the six projections' device time 468 ->
/// 379 us, kernels/README.md). [`NARROW`] then loads one group a round (its registers stay near a one-slab
/// block's; faster at 16 to 32 rows on the H200), [`WIDE`] keeps two. Neither changes a row's bits (only the
/// warps per block do). `TANDEM_KERNELS=-qmm_slabs` runs a block per slab, as before session 21.
pub fn slab_shape(m: i32, ls: LaunchShape) -> (i32, i32) {
    let slabs = super::slabs(m);
    if slabs == 1 || super::disabled("qmm_slabs") {
        return (1, ls.groups_per_round);
    }
    (slabs, if ls == NARROW { 1 } else { ls.groups_per_round })
}

/// Half an ulp of `dtype` at its worst, relative: the tolerance against an fp32 reference.
pub fn tolerance(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => 1.0 / 2048.0,
        _ => 1.0 / 256.0,
    }
}

/// The host kernels' tolerance against an fp32 reference: [`tolerance`], and for f32 outputs 1e-5 (an fp32
/// sum in another order than the reference's).
pub fn host_tolerance(dtype: Dtype) -> f32 {
    if dtype == Dtype::F32 {
        1e-5
    } else {
        tolerance(dtype)
    }
}

/// `x @ dequantize(q)^T` (`q.matmul(x, true)`): the CUDA kernel where [`selected`], the host kernel where
/// [`host_selected`], the fp32 CPU path where [`cpu_selected`], MLX's op otherwise.
pub fn quantized_matmul(x: &Array, q: &Quantized) -> Result<Array> {
    if selected(x, q) {
        return cuda(x, q);
    }
    if host_selected(x, q) {
        return host(x, q);
    }
    if cpu_selected(x, q) {
        return cpu_f32(x, q);
    }
    fallback(x, q)
}

/// The host kernel's name for `TANDEM_KERNELS=-cpu_qmm`.
pub const HOST_NAME: &str = "cpu_qmm";

/// Whether a call takes the host kernel (kernels/cpu/quantized_matmul.cc): MLX computing on the CPU, x f32,
/// bf16 or f16, affine weights of 2, 4 or 8 bits in groups of a multiple of 8 with float scales and biases of
/// one dtype, shapes that agree, kernels not switched off, and its probe passed for x's dtype.
pub fn host_selected(x: &Array, q: &Quantized) -> bool {
    let float = |d: Dtype| matches!(d, Dtype::F32 | Dtype::BF16 | Dtype::F16);
    let Some(biases) = &q.biases else { return false };
    if super::policy() == super::Policy::Off
        || super::disabled(HOST_NAME)
        || default_device() != Device::Cpu
        || q.mode != QuantMode::Affine
        || !matches!(q.bits, 2 | 4 | 8)
        || q.group_size <= 0
        || q.group_size % 8 != 0
        || !float(x.dtype())
        || !float(q.scales.dtype())
        || biases.dtype() != q.scales.dtype()
        || q.weight.dtype() != Dtype::U32
        || q.weight.ndim() != 2
        || x.ndim() == 0
    {
        return false;
    }
    let (k, n) = (x.dim(-1), q.weight.dim(0));
    let groups = [n, k / q.group_size];
    k % q.group_size == 0
        && q.weight.dim(1) as i64 * 32 == k as i64 * q.bits as i64
        && q.scales.shape() == groups
        && biases.shape() == groups
        && host_probe_passed(x.dtype())
}

/// The host kernel: `mlx::host::quantized_matmul` on the quantized weight's parts.
pub fn host(x: &Array, q: &Quantized) -> Result<Array> {
    let biases = q.biases.as_ref().ok_or_else(|| mlx::Error::Invalid("host quantized matmul: no biases".into()))?;
    mlx::host::quantized_matmul(x, &q.weight, &q.scales, biases, q.group_size, q.bits)
}

/// The host kernel's probe verdict for x of `dtype`, once per process: like the dense one's, it is C++ built
/// for the machine it runs on, so it proves itself there before it is taken.
fn host_probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)].get_or_init(|| {
        probe_verdict(&format!("host quantized matmul ({dtype:?})"), host_probe(dtype), host_tolerance(dtype))
    })
}

/// The larger relative Frobenius error of the host kernel against an fp32 reference, at 2, 4 and 8 bits, on x
/// of 19 rows (K of 256 in groups of 64; N of 42: a tail past the four-row groups), infinite where its last 3
/// rows alone do not give the same bits.
pub fn host_probe(dtype: Dtype) -> Result<f32> {
    let keys = random::split(&random::key(0x716d_6d00)?, 2)?;
    let w = random::normal(&[42, 256], Dtype::F32, &keys[0])?.multiply(&Array::f32(0.02))?.as_dtype(dtype)?;
    let x19 = random::normal(&[19, 256], Dtype::F32, &keys[1])?.as_dtype(dtype)?;
    let mut worst = 0.0f32;
    for bits in [2, 4, 8] {
        let q = quantize(&w, GROUP_SIZE, bits, QuantMode::Affine)?;
        let Some(y19) = super::last_slab_alone(&x19, |x| host(x, &q))? else { return Ok(f32::INFINITY) };
        worst = worst.max(relative_error(&y19, &reference(&x19, &q)?)?);
    }
    Ok(worst)
}

/// Whether a call takes [`cpu_f32`]: MLX computing on the CPU, x in bf16 or f16, affine weights (whose
/// scales and biases are plain floats), kernels not switched off.
pub fn cpu_selected(x: &Array, q: &Quantized) -> bool {
    policy() != Policy::Off
        && default_device() == Device::Cpu
        && matches!(x.dtype(), Dtype::BF16 | Dtype::F16)
        && q.mode == QuantMode::Affine
}

/// MLX's op with x, scales and biases cast to fp32, the result cast back to x's dtype: each output is the
/// fp32 dot product rounded once. The casts of the scales and biases (one pair per 64 weights) are small
/// beside the product they serve.
pub fn cpu_f32(x: &Array, q: &Quantized) -> Result<Array> {
    let f32 = |a: &Array| a.as_dtype(Dtype::F32);
    let biases = q.biases.as_ref().map(f32).transpose()?;
    let y = mlx::quantized::quantized_matmul(
        &f32(x)?,
        &q.weight,
        &f32(&q.scales)?,
        biases.as_ref(),
        true,
        q.group_size,
        q.bits,
        q.mode,
    )?;
    y.as_dtype(x.dtype())
}

/// The MLX op the kernel replaces.
pub fn fallback(x: &Array, q: &Quantized) -> Result<Array> {
    q.matmul(x, true)
}

/// Whether a call goes to the kernel: CUDA on the GPU, a format and shape inside [`applicable`], a machine
/// class whose parity test passed (or `TANDEM_KERNELS=on`), and this machine's probe passed.
pub fn selected(x: &Array, q: &Quantized) -> bool {
    super::cuda_allows(None, TESTED_CLASSES) && applicable(x, q) && probe_passed(x.dtype(), q.bits)
}

/// The formats and shapes the kernel computes and its parity runs covered: x bf16 or f16 with M = 1..=32
/// rows; affine weights of 4 or 8 bits in groups of 64 with scales and biases of x's dtype; K and N in range.
pub fn applicable(x: &Array, q: &Quantized) -> bool {
    let dt = x.dtype();
    if !matches!(dt, Dtype::BF16 | Dtype::F16) || x.ndim() == 0 {
        return false;
    }
    if q.mode != QuantMode::Affine || q.group_size != GROUP_SIZE || !matches!(q.bits, 4 | 8) {
        return false;
    }
    let Some(biases) = &q.biases else { return false };
    if q.weight.dtype() != Dtype::U32 || q.scales.dtype() != dt || biases.dtype() != dt || q.weight.ndim() != 2 {
        return false;
    }
    let k = x.dim(-1);
    let n = q.weight.dim(0);
    if !(K_RANGE.0..=K_RANGE.1).contains(&k) || k % GROUP_SIZE != 0 || !(1..=MAX_N).contains(&n) {
        return false;
    }
    let groups = [n, k / GROUP_SIZE];
    if q.weight.dim(1) != k * q.bits / 32 || q.scales.shape() != groups || biases.shape() != groups {
        return false;
    }
    (1..=MAX_ROWS as usize).contains(&(x.size() / k as usize))
}

/// Runs the kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only
/// what would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(x: &Array, q: &Quantized) -> Result<Array> {
    let invalid = |what: &str| mlx::Error::Invalid(format!("quantized_matmul kernel: {what}"));
    let biases = q.biases.as_ref().ok_or_else(|| invalid("affine weights need biases"))?;
    let (k, n) = (x.dim(-1), q.weight.dim(0));
    if k <= 0 || k % GROUP_SIZE != 0 || q.group_size != GROUP_SIZE || !matches!(q.bits, 4 | 8) {
        return Err(invalid(&format!("K {k}, group size {}, {} bits", q.group_size, q.bits)));
    }
    let m = (x.size() / k as usize) as i32;
    if !(1..=MAX_ROWS).contains(&m) {
        return Err(invalid(&format!("{m} rows of x, at most {MAX_ROWS}")));
    }
    let dt = x.dtype();
    if !matches!(x.ndim(), 2 | 3) {
        // The kernel reads two or three axes (it flattens the leading ones itself); others are reshaped.
        return cuda(&x.reshape(&[-1, k])?, q)?.reshape(&super::last_axis_set(x, n));
    }
    let out_shape = super::last_axis_set(x, n);
    let ls = launch_shape(n);
    let (slabs_per_block, groups_per_round) = slab_shape(m, ls);
    let rows_per_block = 16 * ls.tiles_per_warp;
    let blocks = (n + rows_per_block - 1) / rows_per_block * (super::slabs(m) / slabs_per_block);
    let template = [
        ("BITS", q.bits),
        ("R", ls.tiles_per_warp),
        ("KS", ls.warps),
        ("U", groups_per_round),
        ("P", ls.prefetch),
        ("S", slabs_per_block),
        ("XD", x.ndim() as i32),
    ];
    with_kernel(dt, |kernel| {
        kernel.call(
            &[x, &q.weight, &q.scales, biases],
            &Launch {
                outputs: &[(&out_shape[..], dt)],
                grid: [blocks * 32 * ls.warps, 1, 1],
                threadgroup: [32 * ls.warps, 1, 1],
                template: &template,
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
    let name = format!("tandem_qmm_{}", super::dtype_suffix(dtype));
    let make = || Kernel::new(KernelBackend::Cuda, &name, &["x", "w", "scales", "biases"], &["y"], SOURCE, HEADER);
    with_cached(&KERNELS, dtype, make, f)
}

/// The probe's verdict for (dtype, bits), run once per process: the kernel on small random problems (3 rows,
/// K = 256: partial tiles, two groups per warp), one per launch shape, against an fp32 reference. A kernel
/// that fails to compile or to match is never selected; the reason is logged.
fn probe_passed(dtype: Dtype, bits: i32) -> bool {
    static PROBES: [[OnceLock<bool>; 2]; 2] = [[OnceLock::new(), OnceLock::new()], [OnceLock::new(), OnceLock::new()]];
    let slot = &PROBES[usize::from(dtype == Dtype::F16)][usize::from(bits == 8)];
    *slot.get_or_init(|| {
        probe_verdict(
            &format!("quantized_matmul kernel ({dtype:?}, {bits} bits)"),
            probe(dtype, bits),
            tolerance(dtype),
        )
    })
}

/// The larger relative Frobenius error of the kernel on small random problems against an fp32 reference: 40
/// output rows ([`NARROW`], x `[3, K]`) and [`NARROW_MAX_N`] + 40 ([`WIDE`], x `[1, 3, K]`), each also with 19
/// rows of x (three slabs in one block, [`slab_shape`]), whose last slab must give the bits of those 3 rows
/// alone (one slab a block): infinite where it does not.
pub fn probe(dtype: Dtype, bits: i32) -> Result<f32> {
    let mut worst = 0.0f32;
    for (i, n) in [40, NARROW_MAX_N + 40].into_iter().enumerate() {
        let keys = random::split(&random::key(0x7a6e_6465_6d00 + i as u64)?, 3)?;
        let w = random::normal(&[n, 256], Dtype::F32, &keys[0])?.multiply(&Array::f32(0.02))?.as_dtype(dtype)?;
        let q = quantize(&w, GROUP_SIZE, bits, QuantMode::Affine)?;
        // One problem with x of two axes, one with three: both ways the kernel reads x's rows.
        let x_shape: &[i32] = if i == 0 { &[3, 256] } else { &[1, 3, 256] };
        let x = random::normal(x_shape, Dtype::F32, &keys[1])?.as_dtype(dtype)?;
        let y = cuda(&x, &q)?;
        worst = worst.max(relative_error(&y, &reference(&x, &q)?)?);
        let x19 = random::normal(&[19, 256], Dtype::F32, &keys[2])?.as_dtype(dtype)?;
        let Some(y19) = super::last_slab_alone(&x19, |x| cuda(x, &q))? else { return Ok(f32::INFINITY) };
        worst = worst.max(relative_error(&y19, &reference(&x19, &q)?)?);
    }
    Ok(worst)
}

/// `x @ dequantize(q)^T` in fp32, the scales and biases upcast before dequantizing.
pub fn reference(x: &Array, q: &Quantized) -> Result<Array> {
    let f32 = |a: &Array| a.as_dtype(Dtype::F32);
    let biases = q.biases.as_ref().map(f32).transpose()?;
    let w = dequantize(&q.weight, &f32(&q.scales)?, biases.as_ref(), q.group_size, q.bits, q.mode)?;
    f32(x)?.matmul(&w.t()?)
}

/// ‖a − b‖ / ‖b‖ over all elements, in fp32 (infinite when `a` holds a NaN or an infinity).
pub fn relative_error(a: &Array, b: &Array) -> Result<f32> {
    let (a, b) = (a.as_dtype(Dtype::F32)?, b.as_dtype(Dtype::F32)?);
    let num = a.subtract(&b)?.square()?.sum(&[], false)?.sqrt()?.item::<f32>()?;
    let den = b.square()?.sum(&[], false)?.sqrt()?.item::<f32>()?;
    Ok(if num.is_finite() { num / den.max(f32::MIN_POSITIVE) } else { f32::INFINITY })
}
