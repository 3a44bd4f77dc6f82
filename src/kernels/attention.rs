//! Causal attention of a few queries over a KV cache (a decode step, an MTP verify, the MTP head's
//! catch-up): on CUDA the kernels in kernels/cuda/attention*.cu{,h}, reading the cache's buffers where they
//! lie; on MLX's CPU backend the host kernel in kernels/cpu/attention.{h,cc} ([`host`], any number of
//! queries); elsewhere the caller's MLX path (`model::layers::causal_attention`).
//!
//! MLX 0.32.4's CUDA backend has no one-query attention kernel for head_dim 256 (Qwen3.5's): each call ran
//! its op-by-op fallback (about ten operations, with matmuls meeting a new key length every step), and an
//! MTP verify ran one such call per query, a batched verify one per stream and query. That was host time
//! a batched cycle waited on (docs/PERF.md). Here a call is two launches for all its queries.
//!
//! A query's result depends only on its row of q and the keys it sees (kernels/cuda/attention.cuh says
//! how), so a verify's query t is bit-identical to a decode step over `len - T + t + 1` keys: the kernel
//! is taken at T = 1 too, for that reason.
//!
//! Tolerance: against an fp32 reference ([`reference`]), the relative Frobenius error of the output is at
//! most half an ulp of its dtype (2^-8 bf16, 2^-11 f16) or [`F32_TOLERANCE`].

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{concatenate, random, Array, Dtype};

use super::quantized_matmul::{relative_error, tolerance};
use super::{probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/attention.cuh");
const PARTIAL: &str = include_str!("../../kernels/cuda/attention_partial.cu");
const COMBINE: &str = include_str!("../../kernels/cuda/attention_combine.cu");

/// This kernel's name for `TANDEM_KERNELS=-attention` (every other kernel stays on).
pub const NAME: &str = "attention";
/// Rows of q a partial block holds (query heads sharing a key head × queries); more queries are split
/// into groups that fit, which changes no query's result.
pub const MAX_ROWS: i32 = 32;
/// Queries a call may carry (a verify of depth 15, the MTP head's catch-up chunks); longer passes
/// (prefill) go to MLX's fused attention.
pub const MAX_QUERIES: i32 = 16;
/// Keys per chunk (`tandem_attn::C`).
const CHUNK: i32 = 64;
/// Threads of a partial block (`tandem_attn::THREADS`).
const THREADS: i32 = 256;
/// Head sizes the parity test covered.
pub const TESTED_HEAD_DIMS: &[i32] = &[64, 128, 256];
/// Compute capabilities (major, minor) where the parity test passed (kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];
/// Relative Frobenius error against the fp32 reference for f32 inputs.
pub const F32_TOLERANCE: f32 = 1e-5;

/// The error the kernel may have against [`reference`] for output `dtype`.
pub fn tolerance_for(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F32 => F32_TOLERANCE,
        other => tolerance(other),
    }
}

/// Whether a call goes to the kernel: CUDA on the GPU, shapes inside [`applicable`] with a head size in
/// [`TESTED_HEAD_DIMS`], a machine class whose parity test passed (or `TANDEM_KERNELS=on`), not
/// `-attention`, and this machine's probe passed.
pub fn selected(q: &Array, keys: &Array, values: &Array, len: i32) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES)
        && applicable(q, keys, values, len)
        && TESTED_HEAD_DIMS.contains(&q.dim(3))
        && probe_passed(q.dtype())
}

/// The host kernel's name for `TANDEM_KERNELS=-cpu_attention`.
pub const HOST_NAME: &str = "cpu_attention";

/// Whether a call takes the host kernel (kernels/cpu/attention.cc, `mlx::host::attention`): MLX computing on
/// the CPU, [`host_applicable`], kernels not switched off, and its probe passed for q's dtype. MLX 0.32.4's
/// CPU attention is op by op over a bf16 gemm of its own (~2 GFLOP/s): at a 2,048-token context it was over
/// 60 % of tandem-tiny's decoding time, and MTP ran at a third of plain decoding's speed (docs/PERF.md).
pub fn host_selected(q: &Array, keys: &Array, values: &Array, len: i32) -> bool {
    super::policy() != super::Policy::Off
        && !super::disabled(HOST_NAME)
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && host_applicable(q, keys, values, len)
        && host_probe_passed(q.dtype())
}

/// The shapes the host kernel computes: q `[1, Hq, T, D]` and the cache's buffers `[1, Hkv, CAP, D]`, all of
/// one dtype (bf16, f16 or f32), Hq a multiple of Hkv and `1 <= T <= len <= CAP` (any number of queries:
/// decode, verify, prefill chunks).
pub fn host_applicable(q: &Array, keys: &Array, values: &Array, len: i32) -> bool {
    let dt = q.dtype();
    matches!(dt, Dtype::BF16 | Dtype::F16 | Dtype::F32)
        && keys.dtype() == dt
        && values.dtype() == dt
        && q.ndim() == 4
        && keys.ndim() == 4
        && keys.shape() == values.shape()
        && q.dim(0) == 1
        && keys.dim(0) == 1
        && keys.dim(3) == q.dim(3)
        && keys.dim(1) >= 1
        && q.dim(1) % keys.dim(1) == 0
        && q.dim(2) >= 1
        && q.dim(2) <= len
        && len <= keys.dim(2)
}

/// Runs the host kernel: the T queries of `q` over the first `len` positions of the buffers.
pub fn host(q: &Array, keys: &Array, values: &Array, len: i32, scale: f32) -> Result<Array> {
    mlx::host::attention(q, keys, values, len, scale)
}

/// The host kernel's probe verdict for `dtype`, once per process: C++ built for the machine it runs on
/// (arm64 NEON on a Mac, where no test of this repository runs) proves itself there before it is taken.
fn host_probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)].get_or_init(|| {
        probe_verdict(&format!("host attention kernel ({dtype:?})"), host_probe(dtype), tolerance_for(dtype))
    })
}

/// [`probe`]'s problem through the host kernel: relative error against [`reference`].
pub fn host_probe(dtype: Dtype) -> Result<f32> {
    probe_with(dtype, host)
}

/// The shapes the kernel computes: q `[1, Hq, T, D]`, the cache's buffers `[1, Hkv, CAP, D]` of q's dtype
/// (bf16, f16 or f32) with Hq a multiple of Hkv and at most [`MAX_ROWS`] query heads per key head, D a
/// multiple of 32 up to 256, 1..=[`MAX_QUERIES`] queries and `T <= len <= CAP` valid keys.
pub fn applicable(q: &Array, keys: &Array, values: &Array, len: i32) -> bool {
    let dt = q.dtype();
    if !matches!(dt, Dtype::BF16 | Dtype::F16 | Dtype::F32) || keys.dtype() != dt || values.dtype() != dt {
        return false;
    }
    if q.ndim() != 4 || keys.ndim() != 4 || keys.shape() != values.shape() {
        return false;
    }
    let (hq, t, d) = (q.dim(1), q.dim(2), q.dim(3));
    let (hkv, cap) = (keys.dim(1), keys.dim(2));
    q.dim(0) == 1
        && keys.dim(0) == 1
        && keys.dim(3) == d
        && d % 32 == 0
        && (32..=256).contains(&d)
        && hkv >= 1
        && hq % hkv == 0
        && hq / hkv <= MAX_ROWS
        && (1..=MAX_QUERIES).contains(&t)
        && t <= len
        && len <= cap
}

/// Runs the kernels (CUDA only; elsewhere MLX reports an error when the result is evaluated): the T
/// queries of `q` over the first `len` positions of the buffers, query t seeing `len - T + t + 1` keys.
/// Checks only what would make the launch wrong; [`applicable`] is the selection's rule.
pub fn cuda(q: &Array, keys: &Array, values: &Array, len: i32, scale: f32) -> Result<Array> {
    if !applicable(q, keys, values, len) {
        return Err(mlx::Error::Invalid(format!(
            "attention kernel: q {:?} {:?}, buffers {:?} {:?}, {len} keys",
            q.shape(),
            q.dtype(),
            keys.shape(),
            keys.dtype()
        )));
    }
    let (t, rep) = (q.dim(2), q.dim(1) / keys.dim(1));
    let group = MAX_ROWS / rep;
    if t <= group {
        return launch(q, keys, values, len, scale);
    }
    // Queries [a, b) see what they would in the whole call: the last of them `len - (T - b)` keys.
    let parts = (0..t)
        .step_by(group as usize)
        .map(|a| {
            let b = (a + group).min(t);
            launch(&q.slice_axis(2, a, b)?, keys, values, len - (t - b), scale)
        })
        .collect::<Result<Vec<_>>>()?;
    concatenate(&parts.iter().collect::<Vec<_>>(), 2)
}

/// One partial and one combine launch for `rep * T <= MAX_ROWS` rows.
fn launch(q: &Array, keys: &Array, values: &Array, len: i32, scale: f32) -> Result<Array> {
    let (hq, t, d) = (q.dim(1), q.dim(2), q.dim(3));
    let hkv = keys.dim(1);
    let rows = (hq / hkv) * t;
    let bucket = [8, 16, 32].into_iter().find(|&b| rows <= b).unwrap_or(MAX_ROWS);
    let nc = (len + CHUNK - 1) / CHUNK;
    let params = Array::from_slice(&[len as f32, scale], &[2])?;
    let (parts_shape, stats_shape) = ([hq, t, nc, d], [hq, t, nc, 2]);
    let mut partial = with_kernel(Stage::Partial, q.dtype(), |kernel| {
        kernel.call(
            &[q, keys, values, &params],
            &Launch {
                outputs: &[(&parts_shape[..], Dtype::F32), (&stats_shape[..], Dtype::F32)],
                grid: [THREADS * nc, hkv, 1],
                threadgroup: [THREADS, 1, 1],
                template: &[("D", d), ("ROWS", bucket)],
            },
        )
    })?
    .into_iter();
    let invalid = |what: &str| mlx::Error::Invalid(format!("attention kernel: {what}"));
    let (Some(parts), Some(stats)) = (partial.next(), partial.next()) else {
        return Err(invalid("fewer than two partial outputs"));
    };
    let out_shape = [1, hq, t, d];
    with_kernel(Stage::Combine, q.dtype(), |kernel| {
        kernel.call(
            &[&parts, &stats],
            &Launch {
                outputs: &[(&out_shape[..], q.dtype())],
                grid: [d, hq * t, 1],
                threadgroup: [d, 1, 1],
                template: &[],
            },
        )
    })?
    .into_iter()
    .next()
    .ok_or_else(|| invalid("no output"))
}

/// The attention the kernel computes, op by op in fp32, one query at a time: the parity tests' and the
/// probe's reference.
pub fn reference(q: &Array, keys: &Array, values: &Array, len: i32, scale: f32) -> Result<Array> {
    let (hq, t) = (q.dim(1), q.dim(2));
    let rep = hq / keys.dim(1);
    let f32 = |a: &Array| a.as_dtype(Dtype::F32);
    // Key heads repeated for their query heads: [1, Hq, len, D].
    let spread = |a: &Array| -> Result<Array> {
        let a = f32(&a.slice_axis(2, 0, len)?)?;
        let (hkv, d) = (a.dim(1), a.dim(3));
        a.reshape(&[1, hkv, 1, len, d])?.broadcast_to(&[1, hkv, rep, len, d])?.reshape(&[1, hq, len, d])
    };
    let (k, v) = (spread(keys)?, spread(values)?);
    let rows = (0..t)
        .map(|i| {
            let seen = len - t + i + 1;
            let qi = f32(&q.slice_axis(2, i, i + 1)?)?;
            let scores = qi.matmul(&k.slice_axis(2, 0, seen)?.swapaxes(2, 3)?)?.multiply(&Array::f32(scale))?;
            scores.softmax(&[-1], true)?.matmul(&v.slice_axis(2, 0, seen)?)
        })
        .collect::<Result<Vec<_>>>()?;
    concatenate(&rows.iter().collect::<Vec<_>>(), 2)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Partial,
    Combine,
}

/// The kernel object for a stage and dtype, made once per thread ([`super::with_cached`]).
fn with_kernel<R>(stage: Stage, dtype: Dtype, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<(Stage, Dtype)> = const { RefCell::new(Vec::new()) };
    }
    let suffix = super::dtype_suffix(dtype);
    let make = || match stage {
        Stage::Partial => Kernel::new(
            KernelBackend::Cuda,
            &format!("tandem_attn_partial_{suffix}"),
            &["q", "k", "v", "params"],
            &["parts", "stats"],
            PARTIAL,
            HEADER,
        ),
        Stage::Combine => Kernel::new(
            KernelBackend::Cuda,
            &format!("tandem_attn_combine_{suffix}"),
            &["parts", "stats"],
            &["o"],
            COMBINE,
            HEADER,
        ),
    };
    with_cached(&KERNELS, (stage, dtype), make, f)
}

/// Random inputs of one call: q `[1, hq, t, d]` and buffers `[1, hkv, cap, d]` of `dtype`.
pub fn random_inputs(hq: i32, hkv: i32, t: i32, d: i32, cap: i32, dtype: Dtype, seed: u64) -> Result<[Array; 3]> {
    let keys = random::split(&random::key(seed)?, 3)?;
    let normal = |shape: &[i32], i: usize| random::normal(shape, Dtype::F32, &keys[i])?.as_dtype(dtype);
    Ok([normal(&[1, hq, t, d], 0)?, normal(&[1, hkv, cap, d], 1)?, normal(&[1, hkv, cap, d], 2)?])
}

/// The probe's verdict for `dtype`, run once per process: the kernel on a small random problem (3 queries
/// of 6 heads over 2 key heads, 130 of 192 positions: three chunks, the last partly seen) against
/// [`reference`] ([`super::probe_verdict`]).
fn probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)]
        .get_or_init(|| probe_verdict(&format!("attention kernel ({dtype:?})"), probe(dtype), tolerance_for(dtype)))
}

/// Relative error of the kernel against [`reference`] on one small random problem.
pub fn probe(dtype: Dtype) -> Result<f32> {
    probe_with(dtype, cuda)
}

/// `kernel`'s relative error against [`reference`] on the probes' problem.
fn probe_with(dtype: Dtype, kernel: fn(&Array, &Array, &Array, i32, f32) -> Result<Array>) -> Result<f32> {
    let [q, k, v] = random_inputs(6, 2, 3, 128, 192, dtype, 0x6174_746e)?;
    let scale = 1.0 / (128f32).sqrt();
    relative_error(&kernel(&q, &k, &v, 130, scale)?, &reference(&q, &k, &v, 130, scale)?)
}
