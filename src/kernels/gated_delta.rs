//! The gated-delta recurrence of a Gated DeltaNet layer over a few tokens (a decode step, an MTP verify of
//! depth + 1 tokens): on CUDA the kernel in kernels/cuda/gated_delta.cu{,h}, on MLX's CPU backend the host
//! kernel in kernels/cpu/gated_delta.{h,cc} ([`host`], any number of tokens); both also return the state
//! after every token, so a verify's rollback to an accepted prefix is a slice. Elsewhere MLX's
//! `fast::gated_delta_update` ([`fallback`]), after which a rollback re-runs it over the kept prefix
//! (`cache::Recording`).
//!
//! MLX 0.32.4's CUDA `gated_delta_update` runs the recurrence as a loop of MLX ops over the tokens (about
//! seven a token and layer: a depth-3 verify of the 27B slice paid ~85 extra ops a token for it), and
//! a partly accepted verify ran it again for the rollback. The kernel is one launch for all tokens.
//! Each token's arithmetic is the same whatever the number of tokens, so its outputs and states are
//! bit-identical between a plain step and a verify: it is taken at T = 1 too, for that reason.
//!
//! Tolerance: against the fallback (both fp32, summing in different orders), the relative Frobenius error
//! of the outputs and of every step's state is at most [`TOLERANCE`]; a token's results are bit-identical
//! across T (kernels/README.md).

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::probe_verdict;
use super::quantized_matmul::relative_error;

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/gated_delta.cuh");
const SOURCE: &str = include_str!("../../kernels/cuda/gated_delta.cu");

/// This kernel's name for `TANDEM_KERNELS=-gated_delta` (every other kernel stays on).
pub const NAME: &str = "gated_delta";
/// Tokens per call the kernel takes: a verify of depth 8 at most; longer passes (prefill) go to MLX.
pub const MAX_TOKENS: i32 = 9;
/// (Dk, Dv) pairs the parity test covered (tests/it/kernels.rs): every Qwen3.5 size has 128 × 128.
pub const TESTED_DIMS: &[(i32, i32)] = &[(128, 128), (64, 64), (128, 64)];
/// Compute capabilities (major, minor) where the parity test passed: the H200 (kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];
/// Relative Frobenius error against the fallback, outputs and every step's state.
pub const TOLERANCE: f32 = 1e-5;
/// State rows (warps) per block.
const ROWS: i32 = 4;

/// One call's results: the outputs `[B, T, Hv, Dv]`, the state after the last token `[B, Hv, Dv, Dk]`,
/// and (from the kernel) the state after every token `[T, B, Hv, Dv, Dk]`.
pub struct Update {
    pub y: Array,
    pub state: Array,
    pub steps: Option<Array>,
}

/// The recurrence over `q, k [B, T, Hk, Dk]`, `v [B, T, Hv, Dv]`, `g, beta [B, T, Hv]` from `state
/// [B, Hv, Dv, Dk]`: the CUDA kernel where [`selected`], the host kernel where [`host_selected`], MLX's op
/// otherwise.
pub fn gated_delta_update(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<Update> {
    if selected(q, k, v, g, beta, state) {
        return cuda(q, k, v, g, beta, state);
    }
    if host_selected(q, k, v, g, beta, state) {
        return host(q, k, v, g, beta, state);
    }
    fallback(q, k, v, g, beta, state)
}

/// The host kernel's name for `TANDEM_KERNELS=-cpu_gated_delta`.
pub const HOST_NAME: &str = "cpu_gated_delta";

/// Whether a call takes the host kernel (kernels/cpu/gated_delta.cc, `mlx::host::gated_delta`): MLX
/// computing on the CPU, f32 inputs of consistent shapes with at least one token, kernels not switched
/// off, and its probe passed on this machine. MLX 0.32.4 has no CPU kernel for the recurrence: its op
/// is a loop of operations, about seven a token and layer, which made a two-stream MTP verify of
/// tandem-tiny 1,834 operations against a batched plain step's 737 (docs/PERF.md).
pub fn host_selected(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> bool {
    super::policy() != super::Policy::Off
        && !super::disabled(HOST_NAME)
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && host_applicable(q, k, v, g, beta, state)
        && host_probe_passed()
}

/// The shapes the host kernel computes: all f32; q, k `[B, T, Hk, Dk]` with T >= 1; v `[B, T, Hv, Dv]`
/// with Hv a multiple of Hk; one gate and one beta per head and token; the state `[B, Hv, Dv, Dk]`.
pub fn host_applicable(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> bool {
    dims(q, k, v, g, beta, state).is_some_and(|d| d.t >= 1)
}

/// The sizes of one call whose inputs are all f32 and of consistent shapes (q, k `[B, T, Hk, Dk]`, v
/// `[B, T, Hv, Dv]`, g and beta `[B, T, Hv]`, the state `[B, Hv, Dv, Dk]`, Hv a multiple of Hk), else None.
fn dims(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Option<Dims> {
    let all_f32 = [q, k, v, g, beta, state].iter().all(|a| a.dtype() == Dtype::F32);
    if !all_f32 || q.ndim() != 4 || v.ndim() != 4 || g.ndim() != 3 || state.ndim() != 4 {
        return None;
    }
    let (b, t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let ok = k.shape() == q.shape()
        && v.shape() == [b, t, hv, dv]
        && g.shape() == [b, t, hv]
        && beta.shape() == [b, t, hv]
        && state.shape() == [b, hv, dv, dk]
        && hk >= 1
        && hv % hk == 0;
    ok.then_some(Dims { b, t, dk, dv })
}

struct Dims {
    b: i32,
    t: i32,
    dk: i32,
    dv: i32,
}

/// Runs the host kernel: every token's state up to [`MAX_TOKENS`] tokens (a decode step, a verify: a
/// rollback is then a slice), the last state only past it (prefill). The parity tests call this.
pub fn host(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<Update> {
    let t = q.dim(1);
    let all_steps = t <= MAX_TOKENS;
    let (y, states) = mlx::host::gated_delta(q, k, v, g, beta, state, all_steps)?;
    let last = if all_steps { t - 1 } else { 0 };
    let state = states.slice_axis(0, last, last + 1)?.squeeze(&[0])?;
    Ok(Update { y, state, steps: all_steps.then_some(states) })
}

/// The host kernel's probe verdict, once per process: it is C++ built for the machine it runs on (arm64
/// NEON on a Mac, where no test of this repository runs), so it proves itself there before it is taken.
fn host_probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| probe_verdict("host gated_delta kernel", host_probe(), TOLERANCE))
}

/// [`probe`]'s comparison for the host kernel, and infinite where a verify's last token does not get
/// the bits of a decode step from the state before it.
pub fn host_probe() -> Result<f32> {
    let (q, k, v, g, beta, state) = random_inputs(1, 3, 2, 6, 128, 128, 0x6764_6e01)?;
    let kernel = host(&q, &k, &v, &g, &beta, &state)?;
    let steps = kernel.steps.as_ref().ok_or_else(|| mlx::Error::Invalid("no steps".into()))?;
    let at = |a: &Array| a.slice_axis(1, 2, 3);
    let alone = host(&at(&q)?, &at(&k)?, &at(&v)?, &at(&g)?, &at(&beta)?, &step_state(steps, 2)?)?;
    if alone.y.to_bytes()? != at(&kernel.y)?.to_bytes()? || alone.state.to_bytes()? != kernel.state.to_bytes()? {
        return Ok(f32::INFINITY);
    }
    worst_against_fallback(&kernel, &q, &k, &v, &g, &beta, &state)
}

/// The MLX op the kernel replaces (no per-step states).
pub fn fallback(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<Update> {
    let (y, state) = mlx::fast::gated_delta_update(q, k, v, g, beta, Some(state))?;
    Ok(Update { y, state, steps: None })
}

/// Whether a call goes to the kernel: CUDA on the GPU, shapes inside [`applicable`] with (Dk, Dv) in
/// [`TESTED_DIMS`], a machine class whose parity test passed (or `TANDEM_KERNELS=on`), and this machine's
/// probe passed.
pub fn selected(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES)
        && applicable(q, k, v, g, beta, state)
        && TESTED_DIMS.contains(&(q.dim(3), v.dim(3)))
        && probe_passed()
}

/// The shapes the kernel computes: all fp32; q, k `[B, T, Hk, Dk]` with T in 1..=[`MAX_TOKENS`] and Dk a
/// multiple of 32 up to 256; v `[B, T, Hv, Dv]` with Hv a multiple of Hk; one gate and one beta per head
/// and token; the state `[B, Hv, Dv, Dk]`.
pub fn applicable(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> bool {
    dims(q, k, v, g, beta, state).is_some_and(|Dims { b, t, dk, dv }| {
        b >= 1 && (1..=MAX_TOKENS).contains(&t) && dk % 32 == 0 && (32..=256).contains(&dk) && (1..=256).contains(&dv)
    })
}

/// Runs the kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only
/// what would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<Update> {
    if !applicable(q, k, v, g, beta, state) {
        return Err(mlx::Error::Invalid(format!(
            "gated_delta kernel: shapes q {:?} v {:?} g {:?} state {:?} (or not all f32)",
            q.shape(),
            v.shape(),
            g.shape(),
            state.shape()
        )));
    }
    let (b, t, dk) = (q.dim(0), q.dim(1), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let y_shape = [b, t, hv, dv];
    let steps_shape = [t, b, hv, dv, dk];
    let mut out = with_kernel(|kernel| {
        kernel.call(
            &[q, k, v, g, beta, state],
            &Launch {
                outputs: &[(&y_shape[..], Dtype::F32), (&steps_shape[..], Dtype::F32)],
                grid: [32, dv, b * hv],
                threadgroup: [32, ROWS.min(dv), 1],
                template: &[("DK", dk), ("DV", dv)],
            },
        )
    })?
    .into_iter();
    let (Some(y), Some(steps)) = (out.next(), out.next()) else {
        return Err(mlx::Error::Invalid("gated_delta kernel: fewer than two outputs".into()));
    };
    let state = steps.slice_axis(0, t - 1, t)?.squeeze(&[0])?;
    Ok(Update { y, state, steps: Some(steps) })
}

/// The state after the first `keep` tokens of a call, `1..=T`, from its [`Update::steps`].
pub fn step_state(steps: &Array, keep: usize) -> Result<Array> {
    let k = keep as i32;
    steps.slice_axis(0, k - 1, k)?.squeeze(&[0])
}

/// The kernel object, made once per thread (MLX caches the compiled code by name and template integers).
fn with_kernel<R>(f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNEL: RefCell<Option<Kernel>> = const { RefCell::new(None) };
    }
    KERNEL.with(|cell| {
        let mut kernel = cell.borrow_mut();
        if kernel.is_none() {
            *kernel = Some(Kernel::new(
                KernelBackend::Cuda,
                "tandem_gated_delta",
                &["q", "k", "v", "g", "beta", "state"],
                &["y", "states"],
                SOURCE,
                HEADER,
            )?);
        }
        kernel.as_ref().map_or_else(|| Err(mlx::Error::Invalid("kernel cache".into())), f)
    })
}

/// The probe's verdict, run once per process: the kernel on a small random problem against the fallback.
/// A kernel that fails to compile or to match is never selected; the reason is logged.
fn probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| probe_verdict("gated_delta kernel", probe(), TOLERANCE))
}

/// Random inputs of one call: `(q, k, v, g, beta, state)`, q and k L2-normalised as the model's are,
/// gates in (0, 1).
#[allow(clippy::type_complexity)]
pub fn random_inputs(
    b: i32,
    t: i32,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    seed: u64,
) -> Result<(Array, Array, Array, Array, Array, Array)> {
    let keys = random::split(&random::key(seed)?, 6)?;
    let normal = |shape: &[i32], i: usize| random::normal(shape, Dtype::F32, &keys[i]);
    let unit = |a: Array| -> Result<Array> {
        let norm = a.square()?.sum(&[-1], true)?.sqrt()?;
        a.divide(&norm)
    };
    let q = unit(normal(&[b, t, hk, dk], 0)?)?.multiply(&Array::f32(1.0 / (dk as f32).sqrt()))?;
    let k = unit(normal(&[b, t, hk, dk], 1)?)?;
    let v = normal(&[b, t, hv, dv], 2)?;
    let g = normal(&[b, t, hv], 3)?.sigmoid()?.multiply(&Array::f32(0.5))?.add(&Array::f32(0.5))?;
    let beta = normal(&[b, t, hv], 4)?.sigmoid()?;
    let state = normal(&[b, hv, dv, dk], 5)?.multiply(&Array::f32(0.1))?;
    Ok((q, k, v, g, beta, state))
}

/// Worst relative error of the kernel against the fallback on one small random problem (T = 3, two key
/// heads shared by three value heads each): the outputs and the state after every token.
pub fn probe() -> Result<f32> {
    let (q, k, v, g, beta, state) = random_inputs(1, 3, 2, 6, 128, 128, 0x6764_6e00)?;
    let kernel = cuda(&q, &k, &v, &g, &beta, &state)?;
    worst_against_fallback(&kernel, &q, &k, &v, &g, &beta, &state)
}

/// Worst relative error of a kernel's call over three tokens against the fallback: the outputs and the
/// state after every token.
fn worst_against_fallback(
    kernel: &Update,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<f32> {
    let steps = kernel.steps.as_ref().ok_or_else(|| mlx::Error::Invalid("no steps".into()))?;
    let mut worst = 0.0f32;
    for keep in 1..=3 {
        let at = |a: &Array| a.slice_axis(1, 0, keep);
        let r = fallback(&at(q)?, &at(k)?, &at(v)?, &at(g)?, &at(beta)?, state)?;
        worst = worst.max(relative_error(&step_state(steps, keep as usize)?, &r.state)?);
        if keep == 3 {
            worst = worst.max(relative_error(&kernel.y, &r.y)?);
        }
    }
    Ok(worst)
}
