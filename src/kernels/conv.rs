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
//!
//! A layer's whole conv step ([`step`]) is also the concatenation of its window and the new rows before the conv
//! and the next window's slice after it: on CUDA the window kernel (kernels/cuda/conv_window.cu) does all three
//! in one launch, reading the rows where they lie (two MLX operations fewer a layer and a forward), with the
//! conv kernel's bits (the same products in the same order) and the concatenation's rows exactly: its probe's
//! tolerance is 0. Not selected until its parity test (`conv_window_cuda_parity`) passes on a GPU
//! ([`WINDOW_TESTED_CLASSES`]); `TANDEM_KERNELS=-conv_window` turns it off.

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::quantized_matmul::relative_error;
use super::{fused, probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

const HEADER: &str = include_str!("../../kernels/cuda/conv_silu.cuh");
const SOURCE: &str = include_str!("../../kernels/cuda/conv_silu.cu");
const WINDOW_SOURCE: &str = include_str!("../../kernels/cuda/conv_window.cu");

/// This kernel's name for `TANDEM_KERNELS=-conv`.
pub const NAME: &str = "conv";
/// New positions per call the kernel takes (a verify of depth 15); longer passes (prefill) go to MLX.
pub const MAX_STEPS: i32 = 16;
/// Kernel widths it takes (Qwen3.5's is 4).
pub const MAX_WIDTH: i32 = 8;
/// Compute capabilities (major, minor) where the parity test passed (the H200, kernels/README.md).
pub const TESTED_CLASSES: &[(u32, u32)] = &[(9, 0)];
/// The window kernel's name for `TANDEM_KERNELS=-conv_window` (`-conv` turns it off too).
pub const WINDOW_NAME: &str = "conv_window";
/// Compute capabilities where the window kernel's parity test (`conv_window_cuda_parity`) passed: none yet.
pub const WINDOW_TESTED_CLASSES: &[(u32, u32)] = &[];
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

/// A layer's conv step over its window `prev` `[B, K - 1, C]` and the pass's rows `next` `[B, T, C]`: the conv's
/// output `y` `[B, T, C]` (fp32), the next `window` (the last K - 1 rows of `prev ++ next`) and, where asked
/// (`record`: a verify, whose rollback reads it), `input`, `prev ++ next` itself.
pub struct Step {
    pub y: Array,
    pub window: Array,
    pub input: Option<Array>,
}

/// [`Step`]: on CUDA where [`window_selected`], one launch that reads `prev` and `next` where they lie
/// (kernels/cuda/conv_window.cu); otherwise the concatenation, [`conv_silu`] and the window's slice (three MLX
/// operations and the conv's).
pub fn step(prev: &Array, next: &Array, w: &Array, record: bool) -> Result<Step> {
    if window_selected(prev, next, w, record) {
        return window_cuda(prev, next, w, record);
    }
    let input = mlx::concatenate(&[prev, next], 1)?;
    let t = next.dim(1);
    let window = input.slice_axis(1, t, t + prev.dim(1))?;
    Ok(Step { y: conv_silu(&input, w)?, window, input: record.then_some(input) })
}

/// Whether a step takes the window kernel: CUDA on a class where its parity test passed (or
/// `TANDEM_KERNELS=on`), and where the conv kernel is allowed too (neither `-conv` nor `-conv_window`),
/// [`window_applicable`] arrays, and the conv kernel's probe and the window kernel's own (for this dtype, with
/// or without the recorded input) passed: the window kernel's probe compares its y with the conv kernel's.
pub fn window_selected(prev: &Array, next: &Array, w: &Array, record: bool) -> bool {
    super::cuda_allows(Some(WINDOW_NAME), WINDOW_TESTED_CLASSES)
        && super::cuda_allows(Some(NAME), TESTED_CLASSES)
        && window_applicable(prev, next, w)
        && probe_passed()
        && window_probe_passed(next.dtype(), record)
}

/// What the window kernel computes: `prev` `[B, K - 1, C]` and `next` `[B, T, C]` of one float dtype with T
/// in 1..=[`MAX_STEPS`], w `[C, K, 1]` fp32 with K in 2..=[`MAX_WIDTH`] (a window of at least one row).
pub fn window_applicable(prev: &Array, next: &Array, w: &Array) -> bool {
    prev.ndim() == 3
        && next.ndim() == 3
        && prev.dtype() == next.dtype()
        && w.ndim() == 3
        && w.dim(1) >= 2
        && prev.shape() == [next.dim(0), w.dim(1) - 1, next.dim(2)]
        && fits(next.dtype(), next.dim(0), prev.dim(1) + next.dim(1), next.dim(2), w)
}

/// Runs the window kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). The
/// parity tests call this.
pub fn window_cuda(prev: &Array, next: &Array, w: &Array, record: bool) -> Result<Step> {
    if !window_applicable(prev, next, w) {
        let arrays = super::arrays_text(&[("prev", prev), ("next", next), ("w", w)]);
        return Err(mlx::Error::Invalid(format!("conv window kernel: {arrays}")));
    }
    let (b, t, c, k) = (next.dim(0), next.dim(1), next.dim(2), w.dim(1));
    let dt = next.dtype();
    let (y, window, input) = ([b, t, c], [b, k - 1, c], [b, k - 1 + t, c]);
    let mut outputs = vec![(&y[..], Dtype::F32), (&window[..], dt)];
    if record {
        outputs.push((&input[..], dt));
    }
    let copies = if record { k - 1 + t } else { k - 1 };
    let out = with_window_kernel(dt, record, |kernel| {
        kernel.call(
            &[prev, next, w],
            &Launch {
                outputs: &outputs,
                grid: [(c + 255) / 256 * 256, t + copies, b],
                threadgroup: [256, 1, 1],
                template: &[("K", k)],
            },
        )
    })?;
    let mut out = out.into_iter();
    match (out.next(), out.next(), out.next()) {
        (Some(y), Some(window), input) if input.is_some() == record => Ok(Step { y, window, input }),
        _ => Err(mlx::Error::Invalid("conv window kernel: outputs missing".into())),
    }
}

/// The window kernel for the rows' dtype, with or without the recorded input, made once per thread; strided,
/// so `next` (a slice of the in-projection) is read where it lies.
fn with_window_kernel<R>(dtype: Dtype, record: bool, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<(Dtype, bool)> = const { RefCell::new(Vec::new()) };
    }
    let make = || {
        let name = format!("tandem_conv_window_{}{}", super::dtype_suffix(dtype), if record { "_rec" } else { "" });
        let source = format!("#define TANDEM_RECORD {}\n{WINDOW_SOURCE}", u8::from(record));
        let outputs: &[&str] = if record { &["y", "window", "input"] } else { &["y", "window"] };
        Kernel::strided(KernelBackend::Cuda, &name, &["prev", "next", "w"], outputs, &source, HEADER)
    };
    with_cached(&KERNELS, (dtype, record), make, f)
}

fn window_probe_passed(dtype: Dtype, record: bool) -> bool {
    static PROBES: [[OnceLock<bool>; 2]; 3] = [const { [const { OnceLock::new() }; 2] }; 3];
    *PROBES[super::dtype_slot(dtype)][usize::from(record)].get_or_init(|| {
        let what = format!("conv window kernel ({dtype:?}, recording {record})");
        probe_verdict(&what, window_probe(dtype, record), 0.0)
    })
}

/// How many of the window kernel's outputs differ in their bits from the conv kernel's over the concatenation
/// (y) and from the concatenation's rows (window, input), rows of `dtype`, with or without the recorded input:
/// 2 sequences of 3 positions, 300 channels, K = 4; the window a packed array of its own, the new rows a slice
/// of a wider array (as the in-projection gives them), the weight a transposed view.
pub fn window_probe(dtype: Dtype, record: bool) -> Result<f32> {
    let (prev, next, w) = window_inputs(2, 3, 300, 4, dtype, 0x6377_696e)?;
    let got = window_cuda(&prev, &next, &w, record)?;
    let input = mlx::concatenate(&[&prev, &next], 1)?;
    let want = [cuda(&input, &w)?, input.slice_axis(1, 3, 6)?, input.clone()];
    let got = [Some(got.y), Some(got.window), got.input];
    let mut n = 0;
    for (g, want) in got.iter().zip(&want).take(if record { 3 } else { 2 }) {
        n += match g {
            Some(g) => super::fused::differing_bits(g, want)?,
            None => want.size(),
        };
    }
    Ok(n as f32)
}

/// Random inputs of one conv step laid out as a layer meets them: the window `prev` `[b, k - 1, c]` packed,
/// the new rows `next` `[b, t, c]` a slice of a wider `[b, t, c + 6]` array (another row stride than the
/// window's), and the weight `[c, k, 1]` a transposed view of a `[1, k, c]` array (fp32).
pub fn window_inputs(b: i32, t: i32, c: i32, k: i32, dtype: Dtype, seed: u64) -> Result<(Array, Array, Array)> {
    let keys = random::split(&random::key(seed)?, 3)?;
    let prev = random::normal(&[b, k - 1, c], Dtype::F32, &keys[0])?.as_dtype(dtype)?;
    let wide = random::normal(&[b, t, c + 6], Dtype::F32, &keys[1])?.as_dtype(dtype)?;
    let w = random::normal(&[1, k, c], Dtype::F32, &keys[2])?.multiply(&Array::f32(0.5))?.swapaxes(0, 2)?;
    Ok((prev, wide.slice_axis(2, 4, 4 + c)?, w))
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
    x.ndim() == 3 && fits(x.dtype(), x.dim(0), x.dim(1), x.dim(2), w)
}

/// [`applicable`] for x of `dtype` and shape `[b, span, c]`.
fn fits(dtype: Dtype, b: i32, span: i32, c: i32, w: &Array) -> bool {
    if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) || w.dtype() != Dtype::F32 || w.ndim() != 3 {
        return false;
    }
    let k = w.dim(1);
    w.dim(2) == 1
        && c == w.dim(0)
        && c >= 1
        && b >= 1
        && (1..=MAX_WIDTH).contains(&k)
        && (1..=MAX_STEPS).contains(&(span - k + 1))
}

/// Runs the kernel (CUDA only; elsewhere MLX reports an error when the result is evaluated). Checks only
/// what would make the launch wrong; [`applicable`] is the selection's rule. The parity tests call this.
pub fn cuda(x: &Array, w: &Array) -> Result<Array> {
    if !applicable(x, w) {
        let arrays = super::arrays_text(&[("x", x), ("w", w)]);
        return Err(mlx::Error::Invalid(format!("conv kernel: {arrays}")));
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
