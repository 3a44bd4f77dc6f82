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

use super::fused::differing_bits;
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

/// One call: the conv's output `qkv` `[B, T, channels]` (f32) of a layer of `layout`, q's and k's norm scales
/// `[Dk]` and `eps`, the gates `g`, `beta` `[B, T, Hv]`, and the state before it `[B, Hv, Dv, Dk]`.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub layout: Layout,
    pub eps: f32,
    pub qkv: &'a Array,
    pub scales: &'a [Array; 2],
    pub g: &'a Array,
    pub beta: &'a Array,
    pub state: &'a Array,
}

/// The recurrence's results, and (from the fallback) the q, k and v it ran on, `[B, T, heads, dim]`, which a
/// verify's recording keeps for a rollback where no per-step states were computed.
pub struct Recurrence {
    pub update: Update,
    pub qkv: Option<[Array; 3]>,
}

/// The recurrence of `x`: the CUDA kernel where [`selected`], the host kernel where [`host_selected`],
/// [`fallback`] otherwise.
pub fn update(x: &Call<'_>) -> Result<Recurrence> {
    if selected(x) {
        return Ok(Recurrence { update: cuda(x)?, qkv: None });
    }
    if host_selected(x) {
        return Ok(Recurrence { update: host(x)?, qkv: None });
    }
    fallback(x)
}

/// MLX's operations the kernels replace: the split into q, k, v, their heads, q's and k's norms (MLX's norm
/// in f32, `norm::fallback`), then the recurrence as [`gd::gated_delta_update`] selects it.
pub fn fallback(x: &Call<'_>) -> Result<Recurrence> {
    let Layout { hk, hv, dk, dv } = x.layout;
    let (b, t) = (x.qkv.dim(0), x.qkv.dim(1));
    let parts = x.qkv.split_at(&[hk * dk, 2 * hk * dk], 2)?;
    let heads = |a: &Array, h: i32, d: i32| a.reshape(&[b, t, h, d])?.as_dtype(Dtype::F32);
    let q = norm::fallback(&heads(&parts[0], hk, dk)?, &x.scales[0], x.eps)?;
    let k = norm::fallback(&heads(&parts[1], hk, dk)?, &x.scales[1], x.eps)?;
    let v = heads(&parts[2], hv, dv)?;
    let update = gd::gated_delta_update(&q, &k, &v, x.g, x.beta, x.state)?;
    Ok(Recurrence { update, qkv: Some([q, k, v]) })
}

/// Whether a call goes to the CUDA kernel: CUDA on the GPU, shapes inside [`applicable`] with (Dk, Dv) in the
/// recurrence kernel's tested dims, a machine class in [`TESTED_CLASSES`] (or `TANDEM_KERNELS=on`), and this
/// machine's probe passed.
pub fn selected(x: &Call<'_>) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES)
        && applicable(x)
        && TESTED_DIMS.contains(&(x.layout.dk, x.layout.dv))
        && probe_passed()
}

/// The shapes the CUDA kernel computes: [`host_applicable`]'s, with Dk a multiple of 32 up to 256 and Dv up to 256.
pub fn applicable(x: &Call<'_>) -> bool {
    let Layout { dk, dv, .. } = x.layout;
    dk % 32 == 0 && (32..=256).contains(&dk) && (1..=256).contains(&dv) && host_applicable(x)
}

/// The shapes the host kernel computes (and the CUDA kernel's within its limits): all f32 and of the layout's
/// shapes, T in 1..=[`MAX_TOKENS`] (so every token's state comes back), Hv a multiple of Hk.
pub fn host_applicable(x: &Call<'_>) -> bool {
    let Layout { hk, hv, dk, dv } = x.layout;
    let all_f32 = [x.qkv, &x.scales[0], &x.scales[1], x.g, x.beta, x.state].iter().all(|a| a.dtype() == Dtype::F32);
    if !all_f32 || x.qkv.ndim() != 3 || hk < 1 || hv % hk != 0 {
        return false;
    }
    let (b, t) = (x.qkv.dim(0), x.qkv.dim(1));
    b >= 1
        && (1..=MAX_TOKENS).contains(&t)
        && x.qkv.dim(2) == x.layout.channels()
        && x.scales.iter().all(|s| s.shape() == [dk])
        && x.g.shape() == [b, t, hv]
        && x.beta.shape() == [b, t, hv]
        && x.state.shape() == [b, hv, dv, dk]
}

/// Runs the CUDA kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only
/// what would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(x: &Call<'_>) -> Result<Update> {
    if !applicable(x) {
        return Err(mlx::Error::Invalid(format!(
            "gated_delta_qkv kernel: qkv {:?} for {:?}, g {:?}, state {:?} (or not all f32)",
            x.qkv.shape(),
            x.layout,
            x.g.shape(),
            x.state.shape()
        )));
    }
    let Layout { hk, hv, dk, dv } = x.layout;
    let (b, t) = (x.qkv.dim(0), x.qkv.dim(1));
    let y_shape = [b, t, hv, dv];
    let steps_shape = [t, b, hv, dv, dk];
    let mut out = with_kernel(|kernel| {
        kernel.call(
            &[x.qkv, &x.scales[0], &x.scales[1], x.g, x.beta, x.state],
            &Launch {
                outputs: &[(&y_shape[..], Dtype::F32), (&steps_shape[..], Dtype::F32)],
                grid: [32, dv, b * hv],
                threadgroup: [32, ROWS.min(dv), 1],
                template: &[("DK", dk), ("DV", dv), ("HK", hk), ("EPS", x.eps.to_bits() as i32)],
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

/// The CUDA kernel's probe verdict, run once per process: a small random problem against the fallback.
fn probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| probe_verdict("gated_delta_qkv kernel", probe(), TOLERANCE))
}

/// Whether a call takes the host kernel: MLX computing on the CPU, [`host_applicable`], neither it nor the host
/// recurrence and norm it is made of switched off, and its probe found the fallback's bits on this machine.
pub fn host_selected(x: &Call<'_>) -> bool {
    super::policy() != super::Policy::Off
        && ![HOST_NAME, gd::HOST_NAME, "cpu_elementwise"].iter().any(|n| super::disabled(n))
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && host_applicable(x)
        && host_probe_passed()
}

/// Runs the host kernel (MLX's CPU stream; shapes as [`host_applicable`] says). The parity tests call this.
pub fn host(x: &Call<'_>) -> Result<Update> {
    let t = x.qkv.dim(1);
    let (qs, ks) = (&x.scales[0], &x.scales[1]);
    let (y, steps) = mlx::host::gated_delta_qkv(x.qkv, qs, ks, x.g, x.beta, x.state, x.layout.hk, x.eps)?;
    Ok(Update { y, state: step_state(&steps, t as usize)?, steps: Some(steps) })
}

/// The host kernel's verdict, once per process: no bit off the fallback's on [`host_probe`]'s problem.
fn host_probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    let verdict = || probe_verdict("host gated_delta_qkv kernel (outputs off the fallback's bits)", host_probe(), 0.0);
    *PROBE.get_or_init(verdict)
}

/// How many of the host kernel's outputs and states differ in their bits from the fallback's on a small random
/// problem (three tokens, two sequences, three value heads a key head).
pub fn host_probe() -> Result<f32> {
    let sample = Sample::random(2, 3, Layout { hk: 2, hv: 6, dk: 64, dv: 32 }, 0x6764_6e03)?;
    let x = sample.call();
    let (kernel, fb) = (host(&x)?, fallback(&x)?.update);
    let mut n = differing_bits(&kernel.y, &fb.y)? + differing_bits(&kernel.state, &fb.state)?;
    if let (Some(k), Some(f)) = (&kernel.steps, &fb.steps) {
        n += differing_bits(k, f)?;
    }
    Ok(n as f32)
}

/// A call's inputs held: random ones for the probes and tests ([`Sample::random`]), and their first tokens or
/// one token of them from another state.
pub struct Sample {
    pub layout: Layout,
    pub qkv: Array,
    pub scales: [Array; 2],
    pub g: Array,
    pub beta: Array,
    pub state: Array,
}

impl Sample {
    /// B sequences of T tokens: the conv's output ~ N(0, 1), the model's scales (1/Dk for q, 1/sqrt(Dk) for k),
    /// gates in (0.5, 1), betas in (0, 1), a small random state.
    pub fn random(b: i32, t: i32, layout: Layout, seed: u64) -> Result<Sample> {
        let Layout { hv, dk, dv, .. } = layout;
        let keys = random::split(&random::key(seed)?, 4)?;
        let normal = |shape: &[i32], i: usize| random::normal(shape, Dtype::F32, &keys[i]);
        let scale = |v: f32| Array::full(&[dk], f64::from(v), Dtype::F32);
        Ok(Sample {
            layout,
            qkv: normal(&[b, t, layout.channels()], 0)?,
            scales: [scale(1.0 / dk as f32)?, scale(1.0 / (dk as f32).sqrt())?],
            g: normal(&[b, t, hv], 1)?.sigmoid()?.multiply(&Array::f32(0.5))?.add(&Array::f32(0.5))?,
            beta: normal(&[b, t, hv], 2)?.sigmoid()?,
            state: normal(&[b, hv, dv, dk], 3)?.multiply(&Array::f32(0.1))?,
        })
    }

    /// The call over these inputs, with the model's eps (1e-6 / Dk).
    pub fn call(&self) -> Call<'_> {
        let (qkv, scales, g, beta, state) = (&self.qkv, &self.scales, &self.g, &self.beta, &self.state);
        Call { layout: self.layout, eps: 1e-6 / self.layout.dk as f32, qkv, scales, g, beta, state }
    }

    /// Tokens `from..to` of every sequence, from `state`.
    pub fn tokens(&self, from: i32, to: i32, state: &Array) -> Result<Sample> {
        let at = |a: &Array| a.slice_axis(1, from, to);
        Ok(Sample {
            layout: self.layout,
            qkv: at(&self.qkv)?,
            scales: self.scales.clone(),
            g: at(&self.g)?,
            beta: at(&self.beta)?,
            state: state.clone(),
        })
    }
}

/// Worst relative error of the CUDA kernel against the fallback on one small random problem (three tokens,
/// two key heads shared by three value heads each): the outputs and the state after every token.
pub fn probe() -> Result<f32> {
    let sample = Sample::random(1, 3, Layout { hk: 2, hv: 6, dk: 128, dv: 128 }, 0x6764_6e02)?;
    let kernel = cuda(&sample.call())?;
    let steps = kernel.steps.as_ref().ok_or_else(|| mlx::Error::Invalid("no steps".into()))?;
    let mut worst = 0.0f32;
    for keep in 1..=3 {
        let r = fallback(&sample.tokens(0, keep, &sample.state)?.call())?.update;
        worst = worst.max(relative_error(&step_state(steps, keep as usize)?, &r.state)?);
        if keep == 3 {
            worst = worst.max(relative_error(&kernel.y, &r.y)?);
        }
    }
    Ok(worst)
}
