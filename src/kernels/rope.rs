//! RoPE (the rotate-half form of Qwen3.5's attention) at text positions. MLX 0.32.4 has no CPU kernel for
//! `fast::rope`: on its CPU backend each call is its op-by-op fallback, about 28 operations (positions,
//! frequencies, angles, cos and sin, four products, a difference, a sum, slices, broadcasts, a
//! concatenation), so the two calls of an attention layer were ~55 of tandem-tiny's ~300 operations a
//! forward. The host kernel (kernels/cpu/elementwise.cc, `rope`) computes the same operations in the same
//! order and precision (MLX's exp for the frequencies, `std::cos` / `std::sin` on the f32 angles, each
//! product, difference and sum rounded to x's dtype) in one primitive: **the fallback's own bits**, taken
//! wherever its probe finds them ([`host_selected`]); `TANDEM_KERNELS=-cpu_rope` turns it off. Elsewhere
//! (CUDA, Metal) MLX's own RoPE kernel runs.

use std::sync::OnceLock;

use mlx::{fast, random, Array, Dtype};

use super::fused::differing_bits;
use super::probe_verdict;

type Result<T> = std::result::Result<T, mlx::Error>;

/// The host kernel's name for `TANDEM_KERNELS=-cpu_rope`.
pub const HOST_NAME: &str = "cpu_rope";

/// `x [B, N, T, D]` with its first `dims` features rotated at row b's positions `offsets[b] + t` (`offsets`
/// int32 `[1]` for every row, or `[B]`), base `base`: the host kernel where [`host_selected`], MLX's
/// `fast::rope` otherwise.
pub fn rope(x: &Array, dims: i32, base: f32, offsets: &Array) -> Result<Array> {
    if host_selected(x, offsets, dims) {
        return host(x, offsets, dims, base);
    }
    fast::rope_dynamic(x, dims, false, base, 1.0, offsets)
}

/// Whether a call takes the host kernel: MLX computing on the CPU, [`host_applicable`] arrays, not switched off,
/// and its probe found MLX's bits on this machine.
pub fn host_selected(x: &Array, offsets: &Array, dims: i32) -> bool {
    super::policy() != super::Policy::Off
        && !super::disabled(HOST_NAME)
        && mlx::device::default_device() == mlx::device::Device::Cpu
        && host_applicable(x, offsets, dims)
        && host_probe_passed()
}

/// What the host kernel computes: x `[B, N, T, D]` f32 or bf16, offsets int32 `[1]` or `[B]`, an even `dims`
/// from 2 up to D (MLX refuses 0).
pub fn host_applicable(x: &Array, offsets: &Array, dims: i32) -> bool {
    x.ndim() == 4
        && matches!(x.dtype(), Dtype::F32 | Dtype::BF16)
        && offsets.dtype() == Dtype::I32
        && offsets.ndim() == 1
        && (offsets.dim(0) == 1 || offsets.dim(0) == x.dim(0))
        && (2..=x.dim(3)).contains(&dims)
        && dims % 2 == 0
}

/// Runs the host kernel (MLX's CPU stream). The parity tests call this.
pub fn host(x: &Array, offsets: &Array, dims: i32, base: f32) -> Result<Array> {
    mlx::host::rope(x, offsets, dims, base, 1.0)
}

fn host_probe_passed() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE
        .get_or_init(|| probe_verdict("host RoPE kernel (outputs off MLX's bits)", host_probe().map(|n| n as f32), 0.0))
}

/// Random heads `[b, n, t, d]` of `dtype` ~ N(0, 4), as a transposed view (the layer's heads are a swapaxes of
/// its projection), and positions `offsets` per row.
pub fn random_input(b: i32, n: i32, t: i32, d: i32, dtype: Dtype, seed: u64) -> Result<Array> {
    let x = random::normal(&[b, t, n, d], Dtype::F32, &random::key(seed)?)?.multiply(&Array::f32(2.0))?;
    x.as_dtype(dtype)?.swapaxes(1, 2)
}

/// How many of the host kernel's outputs differ in their bits from MLX's: f32 and bf16, one offset for two rows
/// and one per row (positions past 4,000, where the angles' rounding shows), RoPE on part of a head and on all
/// of it.
pub fn host_probe() -> Result<usize> {
    let mut n = 0;
    for (i, dtype) in [Dtype::F32, Dtype::BF16].into_iter().enumerate() {
        let x = random_input(2, 3, 5, 24, dtype, 0x726f_7065 + i as u64)?;
        for (offsets, dims) in [(vec![77], 8), (vec![311, 4_093], 24), (vec![0, 1], 2)] {
            let len = offsets.len() as i32;
            let offsets = Array::from_slice(&offsets, &[len])?;
            n += differing_bits(
                &host(&x, &offsets, dims, 1e7)?,
                &fast::rope_dynamic(&x, dims, false, 1e7, 1.0, &offsets)?,
            )?;
        }
    }
    Ok(n)
}
