//! A Gated DeltaNet layer's gated norm: each value head of the recurrence's output `o [B, T, Hv, Dv]` (f32)
//! RMS-normalised with the norm's weight, times `silu(z)` (`z [B, T, Hv·Dv]`, a slice of the in-projection),
//! rounded once to z's dtype, as `[B, T, Hv·Dv]` for the out-projection. Through MLX that is four operations a
//! layer ([`fallback`]: z's reshape to heads, the norm, the compiled SiLU gate, the reshape back); on MLX's CPU
//! backend the host kernel (kernels/cpu/elementwise.cc, `gated_norm`) does it in one with the fallback's own bits
//! (the host norm's arithmetic, then the SiLU gate's), so it is taken wherever its probe finds those bits
//! ([`host_selected`]); `TANDEM_KERNELS=-cpu_gated_norm` turns it off. No GPU kernel yet: there z is a strided
//! view, which MLX's custom kernels copy first.

use std::sync::OnceLock;

use mlx::{random, Array, Dtype};

use super::{fused, norm, probe_verdict};

type Result<T> = std::result::Result<T, mlx::Error>;

/// The host kernel's name for `TANDEM_KERNELS=-cpu_gated_norm`.
pub const HOST_NAME: &str = "cpu_gated_norm";

/// `rms_norm(o) * silu(z)` per head, `[B, T, Hv·Dv]` in z's dtype: the host kernel where [`host_selected`], MLX's
/// operations otherwise.
pub fn gated_norm(o: &Array, z: &Array, w: &Array, eps: f32) -> Result<Array> {
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
