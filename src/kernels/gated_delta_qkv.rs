//! A Gated DeltaNet layer's recurrence straight from its causal conv's output: the conv gives `qkv [B, T,
//! 2·Hk·Dk + Hv·Dv]` (f32), which the layer splits into q, k and v, reshapes to heads, L2-normalises q and k
//! (q also by 1/sqrt(Dk)) and hands to the recurrence ([`super::gated_delta`]). Through MLX that is six
//! operations a layer before the recurrence (a split, three reshapes, two norms); on CUDA, where a decode step
//! is bound by MLX's host cost per operation (docs/PERF.md), the kernel in kernels/cuda/gated_delta_qkv.cu
//! reads q, k and v from `qkv` where they lie and normalises q and k itself: one launch for all of it.
//!
//! Its norm sums the squares in its own fixed order, so it is not MLX's bits: the tolerance against the
//! fallback is [`super::gated_delta::TOLERANCE`] (relative Frobenius, outputs and every step's state). A
//! token's results depend on that token and the state before it only, so they are the same bits alone or in a
//! verify, as the recurrence kernel's are. Selected only on machine classes in [`TESTED_CLASSES`] (none yet:
//! its GPU parity test, `tests/it/gated_delta_kernel.rs::gated_delta_qkv_cuda_parity`, has not run), or under
//! `TANDEM_KERNELS=on`; `TANDEM_KERNELS=-gated_delta_qkv` turns it off. The CUDA source is checked on every
//! machine by a CPU emulation (`gated_delta_source_emulated_on_cpu`).
//!
//! On MLX's CPU backend the host kernel (kernels/cpu/gated_delta.cc, `gated_delta_qkv`) does the same with the
//! fallback's own bits: the host norm's arithmetic (kernels/cpu/elementwise.cc) and the host recurrence, so it
//! is taken wherever both would be and its probe finds the fallback's bits ([`host_selected`]);
//! `-cpu_gated_delta_qkv` turns it off.

use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::gated_delta::{self as gd, step_state, Update, MAX_TOKENS, TESTED_DIMS, TOLERANCE};
use super::quantized_matmul::relative_error;
use super::{norm, probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/gated_delta.cuh");
const SOURCE: &str = include_str!("../../kernels/cuda/gated_delta_qkv.cu");

/// This kernel's name for `TANDEM_KERNELS=-gated_delta_qkv`.
pub const NAME: &str = "gated_delta_qkv";
/// The host kernel's name for `TANDEM_KERNELS=-cpu_gated_delta_qkv`.
pub const HOST_NAME: &str = "cpu_gated_delta_qkv";
/// Compute capabilities (major, minor) where the parity test passed: none yet.
pub const TESTED_CLASSES: &[(u32, u32)] = &[];
/// State rows (warps) per block, as the recurrence kernel's.
const ROWS: i32 = 4;

/// How a layer's conv channels divide: `hk` key heads of `dk` (q's, then k's), then `hv` value heads of `dv`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Layout {
    pub hk: i32,
    pub hv: i32,
    pub dk: i32,
    pub dv: i32,
}

impl Layout {
    /// Channels of the conv's output.
    pub fn channels(&self) -> i32 {
        2 * self.hk * self.dk + self.hv * self.dv
    }
}

/// The recurrence's results, and (from the fallback) the q, k and v it ran on, `[B, T, heads, dim]`, which a
/// verify's recording keeps for a rollback where no per-step states were computed.
pub struct Recurrence {
    pub update: Update,
    pub qkv: Option<[Array; 3]>,
}

/// The recurrence over `qkv` `[B, T, channels]` (f32) with q and k normalised by `scales` (q's, k's `[Dk]`)
/// under `eps`, gates `g`, `beta` `[B, T, Hv]`, from `state` `[B, Hv, Dv, Dk]`: the kernel where [`selected`],
/// [`fallback`] otherwise.
pub fn update(
    qkv: &Array,
    layout: &Layout,
    scales: &[Array; 2],
    eps: f32,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<Recurrence> {
    if selected(qkv, layout, scales, g, beta, state) {
        return Ok(Recurrence { update: cuda(qkv, layout, scales, eps, g, beta, state)?, qkv: None });
    }
    if host_selected(qkv, layout, scales, g, beta, state) {
        return Ok(Recurrence { update: host(qkv, layout, scales, eps, g, beta, state)?, qkv: None });
    }
    fallback(qkv, layout, scales, eps, g, beta, state)
}

/// Whether a call takes the host kernel: MLX computing on the CPU, decode and verify widths (T in
/// 1..=[`MAX_TOKENS`], so every token's state comes back for a rollback), all f32 in the layout's shapes,
/// neither it nor the host recurrence and norm it is made of switched off, and its probe found the fallback's
/// bits on this machine.
pub fn host_selected(
    qkv: &Array,
    layout: &Layout,
    scales: &[Array; 2],
    g: &Array,
    beta: &Array,
    state: &Array,
) -> bool {
    super::policy() != super::Policy::Off
        && ![HOST_NAME, gd::HOST_NAME, "cpu_elementwise"].iter().any(|n| super::disabled(n))
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && host_applicable(qkv, layout, scales, g, beta, state)
        && host_probe_passed()
}

/// The shapes the host kernel computes: [`applicable`]'s without the CUDA kernel's limits on Dk and Dv.
pub fn host_applicable(
    qkv: &Array,
    layout: &Layout,
    scales: &[Array; 2],
    g: &Array,
    beta: &Array,
    state: &Array,
) -> bool {
    let fits = |d: i32| (1..=65536).contains(&d);
    fits(layout.dk) && fits(layout.dv) && shapes_fit(qkv, layout, scales, g, beta, state)
}

/// Runs the host kernel (MLX's CPU stream). The parity tests call this.
pub fn host(
    qkv: &Array,
    layout: &Layout,
    scales: &[Array; 2],
    eps: f32,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<Update> {
    let t = qkv.dim(1);
    let (y, steps) = mlx::host::gated_delta_qkv(qkv, &scales[0], &scales[1], g, beta, state, layout.hk, eps, true)?;
    Ok(Update { y, state: step_state(&steps, t as usize)?, steps: Some(steps) })
}

/// The host kernel's verdict, once per process: on a small random problem (three tokens, two sequences) the
/// fallback's bits, outputs and every step's state.
fn host_probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| {
        probe_verdict("host gated_delta_qkv kernel (outputs off the fallback's bits)", host_probe(), 0.0)
    })
}

/// How many of the host kernel's outputs and states differ in their bits from the fallback's on a small random
/// problem (three tokens, two sequences, three value heads a key head).
pub fn host_probe() -> Result<f32> {
    let layout = Layout { hk: 2, hv: 6, dk: 64, dv: 32 };
    let eps = 1e-6 / layout.dk as f32;
    let (qkv, scales, g, beta, state) = random_inputs(2, 3, &layout, 0x6764_6e03)?;
    let kernel = host(&qkv, &layout, &scales, eps, &g, &beta, &state)?;
    let fb = fallback(&qkv, &layout, &scales, eps, &g, &beta, &state)?.update;
    let differ = |a: &Array, b: &Array| -> Result<usize> {
        let (a, b) = (a.to_f32_vec()?, b.to_f32_vec()?);
        Ok(if a.len() != b.len() {
            a.len().max(1)
        } else {
            a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
        })
    };
    let mut n = differ(&kernel.y, &fb.y)? + differ(&kernel.state, &fb.state)?;
    if let (Some(k), Some(f)) = (&kernel.steps, &fb.steps) {
        n += differ(k, f)?;
    }
    Ok(n as f32)
}

/// MLX's operations the kernel replaces: the split into q, k, v, their heads, q's and k's norms (MLX's norm
/// in f32, `norm::fallback`), then the recurrence as [`gd::gated_delta_update`] selects it.
pub fn fallback(
    qkv: &Array,
    layout: &Layout,
    scales: &[Array; 2],
    eps: f32,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<Recurrence> {
    let Layout { hk, hv, dk, dv } = *layout;
    let (b, t) = (qkv.dim(0), qkv.dim(1));
    let parts = qkv.split_at(&[hk * dk, 2 * hk * dk], 2)?;
    let heads = |x: &Array, h: i32, d: i32| x.reshape(&[b, t, h, d])?.as_dtype(Dtype::F32);
    let q = norm::fallback(&heads(&parts[0], hk, dk)?, &scales[0], eps)?;
    let k = norm::fallback(&heads(&parts[1], hk, dk)?, &scales[1], eps)?;
    let v = heads(&parts[2], hv, dv)?;
    let update = gd::gated_delta_update(&q, &k, &v, g, beta, state)?;
    Ok(Recurrence { update, qkv: Some([q, k, v]) })
}

/// Whether a call goes to the kernel: CUDA on the GPU, shapes inside [`applicable`] with (Dk, Dv) in the
/// recurrence kernel's tested dims, a machine class in [`TESTED_CLASSES`] (or `TANDEM_KERNELS=on`), and this
/// machine's probe passed.
pub fn selected(qkv: &Array, layout: &Layout, scales: &[Array; 2], g: &Array, beta: &Array, state: &Array) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES)
        && applicable(qkv, layout, scales, g, beta, state)
        && TESTED_DIMS.contains(&(layout.dk, layout.dv))
        && probe_passed()
}

/// The shapes the kernel computes: all f32; `qkv` `[B, T, channels]` with T in 1..=[`MAX_TOKENS`]; Dk a
/// multiple of 32 up to 256, Dv up to 256, Hv a multiple of Hk; scales `[Dk]`; g and beta `[B, T, Hv]`; the
/// state `[B, Hv, Dv, Dk]`.
pub fn applicable(qkv: &Array, layout: &Layout, scales: &[Array; 2], g: &Array, beta: &Array, state: &Array) -> bool {
    let Layout { dk, dv, .. } = *layout;
    dk % 32 == 0
        && (32..=256).contains(&dk)
        && (1..=256).contains(&dv)
        && shapes_fit(qkv, layout, scales, g, beta, state)
}

/// All f32 and of the layout's shapes, T in 1..=[`MAX_TOKENS`], Hv a multiple of Hk.
fn shapes_fit(qkv: &Array, layout: &Layout, scales: &[Array; 2], g: &Array, beta: &Array, state: &Array) -> bool {
    let Layout { hk, hv, dk, dv } = *layout;
    let all_f32 = [qkv, &scales[0], &scales[1], g, beta, state].iter().all(|a| a.dtype() == Dtype::F32);
    if !all_f32 || qkv.ndim() != 3 || hk < 1 || hv % hk != 0 {
        return false;
    }
    let (b, t) = (qkv.dim(0), qkv.dim(1));
    b >= 1
        && (1..=MAX_TOKENS).contains(&t)
        && qkv.dim(2) == layout.channels()
        && scales.iter().all(|s| s.shape() == [dk])
        && g.shape() == [b, t, hv]
        && beta.shape() == [b, t, hv]
        && state.shape() == [b, hv, dv, dk]
}

/// Runs the kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only what
/// would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(
    qkv: &Array,
    layout: &Layout,
    scales: &[Array; 2],
    eps: f32,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<Update> {
    if !applicable(qkv, layout, scales, g, beta, state) {
        return Err(mlx::Error::Invalid(format!(
            "gated_delta_qkv kernel: qkv {:?} for {layout:?}, g {:?}, state {:?} (or not all f32)",
            qkv.shape(),
            g.shape(),
            state.shape()
        )));
    }
    let Layout { hk, hv, dk, dv } = *layout;
    let (b, t) = (qkv.dim(0), qkv.dim(1));
    let y_shape = [b, t, hv, dv];
    let steps_shape = [t, b, hv, dv, dk];
    let mut out = with_kernel(|kernel| {
        kernel.call(
            &[qkv, &scales[0], &scales[1], g, beta, state],
            &Launch {
                outputs: &[(&y_shape[..], Dtype::F32), (&steps_shape[..], Dtype::F32)],
                grid: [32, dv, b * hv],
                threadgroup: [32, ROWS.min(dv), 1],
                template: &[("DK", dk), ("DV", dv), ("HK", hk), ("EPS", eps.to_bits() as i32)],
            },
        )
    })?
    .into_iter();
    let (Some(y), Some(steps)) = (out.next(), out.next()) else {
        return Err(mlx::Error::Invalid("gated_delta_qkv kernel: fewer than two outputs".into()));
    };
    let state = step_state(&steps, t as usize)?;
    Ok(Update { y, state, steps: Some(steps) })
}

/// The kernel object, made once per thread (MLX caches the compiled code by name and template integers).
fn with_kernel<R>(f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<()> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let make = || {
        let inputs = ["qkv", "qs", "ks", "g", "beta", "state"];
        Kernel::new(KernelBackend::Cuda, "tandem_gated_delta_qkv", &inputs, &["y", "states"], SOURCE, HEADER)
    };
    with_cached(&KERNELS, (), make, f)
}

/// The probe's verdict, run once per process: the kernel on a small random problem against the fallback.
fn probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| probe_verdict("gated_delta_qkv kernel", probe(), TOLERANCE))
}

/// Random inputs of one call, `(qkv, scales, g, beta, state)`: the conv's output ~ N(0, 1), the model's
/// scales (1/Dk for q, 1/sqrt(Dk) for k), gates in (0.5, 1), betas in (0, 1), a small random state.
pub fn random_inputs(b: i32, t: i32, layout: &Layout, seed: u64) -> Result<(Array, [Array; 2], Array, Array, Array)> {
    let Layout { hv, dk, dv, .. } = *layout;
    let keys = random::split(&random::key(seed)?, 4)?;
    let normal = |shape: &[i32], i: usize| random::normal(shape, Dtype::F32, &keys[i]);
    let qkv = normal(&[b, t, layout.channels()], 0)?;
    let scale = |v: f32| Array::full(&[dk], f64::from(v), Dtype::F32);
    let scales = [scale(1.0 / dk as f32)?, scale(1.0 / (dk as f32).sqrt())?];
    let g = normal(&[b, t, hv], 1)?.sigmoid()?.multiply(&Array::f32(0.5))?.add(&Array::f32(0.5))?;
    let beta = normal(&[b, t, hv], 2)?.sigmoid()?;
    let state = normal(&[b, hv, dv, dk], 3)?.multiply(&Array::f32(0.1))?;
    Ok((qkv, scales, g, beta, state))
}

/// Worst relative error of the kernel against the fallback on one small random problem (three tokens, two
/// key heads shared by three value heads each): the outputs and the state after every token.
pub fn probe() -> Result<f32> {
    let layout = Layout { hk: 2, hv: 6, dk: 128, dv: 128 };
    let eps = 1e-6 / layout.dk as f32;
    let (qkv, scales, g, beta, state) = random_inputs(1, 3, &layout, 0x6764_6e02)?;
    let kernel = cuda(&qkv, &layout, &scales, eps, &g, &beta, &state)?;
    let steps = kernel.steps.as_ref().ok_or_else(|| mlx::Error::Invalid("no steps".into()))?;
    let mut worst = 0.0f32;
    for keep in 1..=3 {
        let at = |a: &Array| a.slice_axis(1, 0, keep);
        let r = fallback(&at(&qkv)?, &layout, &scales, eps, &at(&g)?, &at(&beta)?, &state)?.update;
        worst = worst.max(relative_error(&step_state(steps, keep as usize)?, &r.state)?);
        if keep == 3 {
            worst = worst.max(relative_error(&kernel.y, &r.y)?);
        }
    }
    Ok(worst)
}
