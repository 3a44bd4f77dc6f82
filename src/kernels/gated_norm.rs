//! A Gated DeltaNet layer's gated norm: each value head of the recurrence's output `o [B, T, Hv, Dv]` (f32)
//! RMS-normalised with the norm's weight, times `silu(z)` (`z [B, T, Hv·Dv]`, a slice of the in-projection),
//! rounded once to z's dtype, as `[B, T, Hv·Dv]` for the out-projection. Through MLX that is four operations a
//! layer ([`fallback`]: z's reshape to heads, the norm, the compiled SiLU gate, the reshape back). Two kernels
//! do it in one:
//! - on MLX's CPU backend the host kernel (kernels/cpu/elementwise.cc, `gated_norm`), with the fallback's own
//!   bits (the host norm's arithmetic, then the SiLU gate's), taken wherever its probe finds those bits
//!   ([`host_selected`]); `TANDEM_KERNELS=-cpu_gated_norm` turns it off;
//! - on CUDA the device function `gated_norm` of kernels/cuda/rms_norm.cuh, built strided so that z's slice is
//!   read in place (MLX would copy it first, a launch of its own). Its summation order and its `expf` are not
//!   MLX's, so its tolerance is the host kernels' (`host_tolerance`): half an ulp of a bf16 or f16 output,
//!   1e-5 of an f32 one. Selected on the classes in [`TESTED_CLASSES`] (none yet: its GPU parity test has not
//!   run) or under `TANDEM_KERNELS=on`; `-gated_norm` turns it off. Its source is checked on every machine by a
//!   CPU emulation.

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::quantized_matmul::{host_tolerance, relative_error};
use super::{fused, norm, probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

/// The host kernel's name for `TANDEM_KERNELS=-cpu_gated_norm`.
pub const HOST_NAME: &str = "cpu_gated_norm";
/// The CUDA kernel's name for `TANDEM_KERNELS=-gated_norm`.
pub const NAME: &str = "gated_norm";
/// Compute capabilities (major, minor) where the CUDA kernel's parity test passed: none yet.
pub const TESTED_CLASSES: &[(u32, u32)] = &[];

const HEADER: &str = include_str!("../../kernels/cuda/rms_norm.cuh");
const BODY: &str = include_str!("../../kernels/cuda/gated_norm.cu");
/// Heads a block (`GATED_HEADS` in rms_norm.cuh), one warp each.
const HEADS_PER_BLOCK: i32 = 4;

/// `rms_norm(o) * silu(z)` per head, `[B, T, Hv·Dv]` in z's dtype: a kernel where [`selected`] or
/// [`host_selected`], MLX's operations otherwise.
pub fn gated_norm(o: &Array, z: &Array, w: &Array, eps: f32) -> Result<Array> {
    if selected(o, z, w) {
        return cuda(o, z, w, eps);
    }
    if host_selected(o, z, w) {
        return host(o, z, w, eps);
    }
    fallback(o, z, w, eps)
}

/// MLX's operations the host kernel replaces: the norm in f32 (`norm::fallback`), z by heads, the SiLU gate
/// (`fused::silu_gate`), the heads joined again.
pub fn fallback(o: &Array, z: &Array, w: &Array, eps: f32) -> Result<Array> {
    let n = norm::fallback(o, w, eps)?;
    let gated = fused::silu_gate(&n, &z.reshape(&o.shape())?)?;
    gated.reshape(&z.shape())
}

/// Whether a call takes the CUDA kernel: MLX on a CUDA GPU whose class passed the parity test (or
/// `TANDEM_KERNELS=on`), not `-gated_norm`, [`applicable`] arrays, and this machine's probe passed for z's dtype.
pub fn selected(o: &Array, z: &Array, w: &Array) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES) && applicable(o, z, w) && cuda_probe_passed(z.dtype())
}

/// What the CUDA kernel computes: o `[B, T, H, D]` f32, z `[B, T, H·D]` bf16, f16 or f32, w `[D]` f32.
pub fn applicable(o: &Array, z: &Array, w: &Array) -> bool {
    o.ndim() == 4 && o.size() > 0 && matches!(z.dtype(), Dtype::BF16 | Dtype::F16 | Dtype::F32) && {
        let (os, zs) = (o.shape(), z.shape());
        o.dtype() == Dtype::F32
            && w.dtype() == Dtype::F32
            && w.shape() == [os[3]]
            && zs == [os[0], os[1], os[2] * os[3]]
    }
}

/// Runs the CUDA kernel (elsewhere MLX reports an error when the result is evaluated). The parity tests call
/// this.
pub fn cuda(o: &Array, z: &Array, w: &Array, eps: f32) -> Result<Array> {
    if !applicable(o, z, w) {
        let arrays = super::arrays_text(&[("o", o), ("z", z), ("w", w)]);
        return Err(mlx::Error::Invalid(format!("gated norm kernel: {arrays}")));
    }
    let heads = (o.size() / o.dim(3) as usize) as i32;
    let blocks = (heads + HEADS_PER_BLOCK - 1) / HEADS_PER_BLOCK;
    let shape = z.shape();
    let mut out = with_kernel(z.dtype(), |kernel| {
        kernel.call(
            &[o, z, w],
            &Launch {
                outputs: &[(shape.as_slice(), z.dtype())],
                grid: [blocks * 32 * HEADS_PER_BLOCK, 1, 1],
                threadgroup: [32 * HEADS_PER_BLOCK, 1, 1],
                template: &[("EPS", eps.to_bits() as i32)],
            },
        )
    })?;
    out.pop().ok_or_else(|| mlx::Error::Invalid("gated norm kernel: no output".into()))
}

/// The kernel object for z's dtype, made once per thread ([`super::with_cached`]); strided, so z's slice is
/// read where it lies.
fn with_kernel<R>(dtype: Dtype, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<Dtype> = const { RefCell::new(Vec::new()) };
    }
    let make = || {
        let name = format!("tandem_gated_norm_{}", super::dtype_suffix(dtype));
        Kernel::strided(KernelBackend::Cuda, &name, &["o", "z", "w"], &["y"], BODY, HEADER)
    };
    with_cached(&KERNELS, dtype, make, f)
}

fn cuda_probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)].get_or_init(|| {
        probe_verdict(&format!("gated norm kernel ({dtype:?})"), cuda_probe(dtype), host_tolerance(dtype))
    })
}

/// Relative error of the CUDA kernel's output against the fallback's, two sequences of three tokens of five
/// heads (a block's last warps idle), z of `dtype` sliced from a wider array.
pub fn cuda_probe(dtype: Dtype) -> Result<f32> {
    let (o, z, w) = random_inputs(2, 3, 5, 32, dtype, 0x676e_6375)?;
    relative_error(&cuda(&o, &z, &w, 1e-6)?, &fallback(&o, &z, &w, 1e-6)?)
}

/// Whether a call takes the host kernel: MLX computing on the CPU, [`host_applicable`] shapes and dtypes, neither
/// it nor the host chains it is made of switched off, and its probe found the fallback's bits on this machine.
pub fn host_selected(o: &Array, z: &Array, w: &Array) -> bool {
    super::policy() != super::Policy::Off
        && ![HOST_NAME, "cpu_elementwise"].iter().any(|n| super::disabled(n))
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && host_applicable(o, z, w)
        && host_probe_passed()
}

/// What the host kernel computes: o `[..., H, D]` f32, z `[..., H·D]` f32 or bf16 over the same leading axes,
/// w `[D]` f32.
pub fn host_applicable(o: &Array, z: &Array, w: &Array) -> bool {
    let (nd, zs, os) = (o.ndim(), z.shape(), o.shape());
    o.dtype() == Dtype::F32
        && matches!(z.dtype(), Dtype::F32 | Dtype::BF16)
        && w.dtype() == Dtype::F32
        && nd >= 2
        && w.shape() == [os[nd - 1]]
        && zs.len() == nd - 1
        && zs[..nd - 2] == os[..nd - 2]
        && zs[nd - 2] == os[nd - 2] * os[nd - 1]
}

/// Runs the host kernel (MLX's CPU stream). The parity tests call this.
pub fn host(o: &Array, z: &Array, w: &Array, eps: f32) -> Result<Array> {
    mlx::host::gated_norm(o, z, w, eps, 1.0 / o.dim(-1) as f32)
}

fn host_probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    let verdict = || probe_verdict("host gated norm kernel (outputs off the fallback's bits)", host_probe(), 0.0);
    *PROBE.get_or_init(verdict)
}

/// Random inputs `(o, z, w)`: o `[b, t, h, d]` ~ N(0, 1), z a slice of a wider `[b, t, h·d + 7]` array of
/// `dtype` (as the in-projection's split gives it), w ~ N(1, 0.1).
pub fn random_inputs(b: i32, t: i32, h: i32, d: i32, dtype: Dtype, seed: u64) -> Result<(Array, Array, Array)> {
    let keys = random::split(&random::key(seed)?, 3)?;
    let o = random::normal(&[b, t, h, d], Dtype::F32, &keys[0])?;
    let wide = random::normal(&[b, t, h * d + 7], Dtype::F32, &keys[1])?.multiply(&Array::f32(3.0))?.as_dtype(dtype)?;
    let z = wide.slice_axis(2, 3, 3 + h * d)?;
    let w = random::normal(&[d], Dtype::F32, &keys[2])?.multiply(&Array::f32(0.1))?.add(&Array::f32(1.0))?;
    Ok((o, z, w))
}

/// How many of the host kernel's outputs differ in their bits from the fallback's, over two sequences of three
/// tokens in f32 and in bf16.
pub fn host_probe() -> Result<f32> {
    let mut n = 0usize;
    for (i, dtype) in [Dtype::F32, Dtype::BF16].into_iter().enumerate() {
        let (o, z, w) = random_inputs(2, 3, 4, 32, dtype, 0x676e_0000 + i as u64)?;
        n += fused::differing_bits(&host(&o, &z, &w, 1e-6)?, &fallback(&o, &z, &w, 1e-6)?)?;
    }
    Ok(n as f32)
}
