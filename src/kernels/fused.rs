//! The elementwise chains of a forward pass, each compiled once by MLX's graph compiler
//! (`mlx::compile`, shapeless) so that a decode step launches one fused kernel where it would
//! launch a handful of tiny ones: a GPU at decode is bound by launches, not arithmetic. Each body
//! here is also its own fallback: with `TANDEM_COMPILE=off` (or where compiling fails) it runs op
//! by op, computing the same values (`tests/it/kernels.rs` compares the two on every chain).
//!
//! On MLX's CPU the chains with a host kernel (kernels/cpu/elementwise.h) take it instead: MLX's Linux wheels
//! build their CPU backend without vector instructions, so a compiled chain there runs one element at a time,
//! its exp a scalar polynomial of libm fused multiply-adds (~20 % of MLX's CPU thread in a two-stream MTP run).
//! The host loops compute MLX's own operations in its order and precision, eight elements a vector: the same
//! bits (`tests/it/elementwise_kernel.rs` checks every bf16 input; a probe checks again in each process).

use std::sync::OnceLock;

use mlx::compile::Compiled;
use mlx::host::Chain;
use mlx::{Array, Dtype, Result};

type Body = fn(&[&Array]) -> Result<Vec<Array>>;

/// Whether chains are compiled in this process: `TANDEM_COMPILE=off` (or 0/false/no) runs them op
/// by op, to measure what compiling earns or to rule it out.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("TANDEM_COMPILE").map(|v| v.trim().to_ascii_lowercase()).as_deref(),
            Ok("off" | "0" | "false" | "no")
        )
    })
}

/// Runs `body` compiled (traced once per thread and input dtypes, for every shape), or op by op
/// when compiling is off or failed.
fn run(cell: &'static OnceLock<Option<Compiled>>, name: &str, body: Body, inputs: &[&Array]) -> Result<Vec<Array>> {
    if !enabled() {
        return body(inputs);
    }
    let compiled = cell.get_or_init(|| {
        Compiled::new(move |x: &[Array]| body(&x.iter().collect::<Vec<_>>()), true)
            .map_err(|e| tracing::warn!("compiling {name} failed ({e}); it runs op by op"))
            .ok()
    });
    match compiled {
        Some(c) => c.call(inputs),
        None => body(inputs),
    }
}

/// The host kernel's name for `TANDEM_KERNELS=-cpu_elementwise`.
pub const HOST_NAME: &str = "cpu_elementwise";

/// Whether `chain` over `inputs` takes the host kernel: MLX computing on the CPU, [`host_applicable`], kernels
/// not switched off, and this process's probe found the host kernel's bits equal to MLX's.
pub fn host_selected(chain: Chain, inputs: &[&Array]) -> bool {
    host_allowed() && host_applicable(chain, inputs) && host_probe_passed()
}

/// MLX computing on the CPU and the host kernels not switched off (`TANDEM_KERNELS`).
fn host_allowed() -> bool {
    super::policy() != super::Policy::Off
        && !super::disabled(HOST_NAME)
        && mlx::device::default_device() == mlx::device::Device::Cpu
}

/// The inputs the host kernel computes: one or two (`Silu` one) of one shape, the chain's storage type (the
/// last input's dtype) f32 or bf16, the first input of that type too (f32 for `SiluGate`).
pub fn host_applicable(chain: Chain, inputs: &[&Array]) -> bool {
    let (Some(a), Some(b)) = (inputs.first(), inputs.last()) else { return false };
    let t = b.dtype();
    let ta = if chain == Chain::SiluGate { Dtype::F32 } else { t };
    inputs.len() == if chain == Chain::Silu { 1 } else { 2 }
        && matches!(t, Dtype::F32 | Dtype::BF16)
        && a.dtype() == ta
        && a.shape() == b.shape()
}

/// `chain` by the host kernel (kernels/cpu/elementwise.h), whatever [`host_selected`] says (tests compare it).
pub fn host(chain: Chain, inputs: &[&Array]) -> Result<Array> {
    match inputs {
        [a] => mlx::host::elementwise(chain, a, a),
        [a, b] => mlx::host::elementwise(chain, a, b),
        _ => Err(mlx::Error::Invalid(format!("host elementwise {chain:?}: {} inputs", inputs.len()))),
    }
}

/// Whether RMSNorm over x with the f32 scale w takes the host kernel (kernels/cpu/elementwise.h): as
/// [`host_selected`], for x `[..., D]` f32 or bf16 and w `[D]` f32.
pub fn host_norm_selected(x: &Array, w: &Array) -> bool {
    host_allowed() && host_norm_applicable(x, w) && host_probe_passed()
}

/// The inputs the host norm computes: x `[..., D]` f32 or bf16, w `[D]` f32.
pub fn host_norm_applicable(x: &Array, w: &Array) -> bool {
    matches!(x.dtype(), Dtype::F32 | Dtype::BF16)
        && w.dtype() == Dtype::F32
        && x.ndim() >= 1
        && w.ndim() == 1
        && w.dim(0) == x.dim(-1)
}

/// MLX's RMSNorm on its CPU (`x * rsqrt(mean(x^2) + eps) * w` in f32, rounded once to x's dtype): the host
/// kernel where [`host_norm_selected`], else [`rms_norm_f32`]; the same bits either way.
pub fn rms_norm_cpu(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    let inv_d = 1.0 / x.dim(-1) as f32;
    if host_norm_selected(x, w) {
        return mlx::host::rms_norm(x, w, eps, inv_d);
    }
    rms_norm_f32(x, w, &Array::f32(eps), &Array::f32(inv_d))
}

/// Whether the host kernel gave MLX's own bits in this process (once): every chain, in f32 and bf16, over
/// values that cover exp's ranges, its limits at ±88 and the special values.
fn host_probe_passed() -> bool {
    static PASSED: OnceLock<bool> = OnceLock::new();
    *PASSED.get_or_init(|| {
        let differing = host_probe().map(|n| n as f32);
        super::probe_verdict("host elementwise kernel (outputs off MLX's bits)", differing, 0.0)
    })
}

/// Whether two outputs carry the same bits, any NaN matching any NaN (which NaN an operation on NaNs returns
/// is the processor's choice).
pub fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// How many elements of `got` differ in their bits from `want`'s ([`same_bits`], both read as f32), the
/// elements one has and the other lacks counted too: the host kernels' probes against their fallbacks.
pub fn differing_bits(got: &Array, want: &Array) -> Result<usize> {
    let (got, want) = (got.as_dtype(Dtype::F32)?.to_f32_vec()?, want.as_dtype(Dtype::F32)?.to_f32_vec()?);
    Ok(got.iter().zip(&want).filter(|(g, w)| !same_bits(**g, **w)).count() + got.len().abs_diff(want.len()))
}

/// How many outputs of the host kernels differ in their bits from MLX's op-by-op chains and norm, over
/// [`probe_values`].
pub fn host_probe() -> Result<usize> {
    let values = probe_values();
    let n = values.len() as i32;
    let x = Array::from_slice(&values, &[2, n / 2])?;
    let y = Array::from_slice(&values.iter().rev().copied().collect::<Vec<_>>(), &[2, n / 2])?;
    // Outputs of `got` whose bits differ from the reference chain's first output (or that one lacks).
    let differing = |got: Array, want: Vec<Array>| -> Result<usize> {
        differing_bits(&got, want.first().ok_or_else(|| mlx::Error::Invalid("empty reference".into()))?)
    };
    let mut differ = 0;
    for t in [Dtype::F32, Dtype::BF16] {
        let (a, b) = (x.as_dtype(t)?, y.as_dtype(t)?);
        let cases: [(Chain, Vec<&Array>, Vec<Array>); 4] = [
            (Chain::Swiglu, vec![&a, &b], reference::swiglu(&a, &b)?),
            (Chain::SigmoidGate, vec![&a, &b], reference::sigmoid_gate(&a, &b)?),
            (Chain::Silu, vec![&a], reference::silu(&a)?),
            (Chain::SiluGate, vec![&x, &b], reference::silu_gate(&x, &b)?),
        ];
        for (chain, inputs, want) in cases {
            differ += differing(host(chain, &inputs)?, want)?;
        }
        // The norm over rows of 203 (the values in four rows), the scale a spread around one.
        let rows = a.reshape(&[4, n / 4])?;
        let w: Vec<f32> = (0..n / 4).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let w = Array::from_slice(&w, &[n / 4])?;
        let inv_d = 1.0 / (n / 4) as f32;
        let got = mlx::host::rms_norm(&rows, &w, 1e-6, inv_d)?;
        differ += differing(got, reference::rms_norm_f32(&rows, &w, &Array::f32(1e-6), &Array::f32(inv_d))?)?;
    }
    Ok(differ)
}

/// The probe's inputs: a spread over exp's whole range and around its limits, and the special values.
pub fn probe_values() -> Vec<f32> {
    let mut v: Vec<f32> = (-400..400).map(|i| i as f32 * 0.237).collect();
    v.extend([0.0, -0.0, 88.0, -88.0, 88.01, -88.01, 1e-30, -1e-30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.5]);
    v
}

macro_rules! chains {
    ($($(#[$doc:meta])* $name:ident ( $($arg:ident),* ) -> $out:tt $(, host $chain:ident)? = $body:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name($($arg: &Array),*) -> Result<$out> {
            let inputs = [$($arg),*];
            $(
                if host_selected(Chain::$chain, &inputs) {
                    let out = vec![host(Chain::$chain, &inputs)?];
                    return chains!(@out out, $out);
                }
            )?
            static CELL: OnceLock<Option<Compiled>> = OnceLock::new();
            let body: Body = $body;
            let out = run(&CELL, stringify!($name), body, &inputs)?;
            chains!(@out out, $out)
        }
    )*
    #[doc(hidden)]
    pub mod reference {
        //! The same chains op by op (never compiled), for tests that compare the two.
        use super::*;
        $(pub fn $name($($arg: &Array),*) -> Result<Vec<Array>> { let body: Body = $body; body(&[$($arg),*]) })*
    }
    };
    (@out $v:ident, Array) => {{ let mut it = $v.into_iter(); it.next().ok_or_else(|| mlx::Error::Invalid("fused chain returned nothing".into())) }};
    (@out $v:ident, (Array, Array)) => {{
        let mut it = $v.into_iter();
        match (it.next(), it.next()) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(mlx::Error::Invalid("fused chain returned too few arrays".into())),
        }
    }};
}

chains! {
    /// The gated-delta gates in f32 (docs/MODEL.md §3.2): `beta = sigmoid(b)`,
    /// `decay = exp(softplus(a + dt_bias) * neg_a)` with `neg_a = -exp(A_log)` (f32, per value head).
    delta_gates(b, a, dt_bias, neg_a) -> (Array, Array) = |x| {
        let beta = x[0].as_dtype(Dtype::F32)?.sigmoid()?;
        let g = x[1].as_dtype(Dtype::F32)?.add(x[2])?.softplus()?.multiply(x[3])?;
        Ok(vec![beta, g.exp()?])
    };
    /// The gated norm's gate: `n * silu(z)` in f32, rounded once to z's dtype.
    silu_gate(n, z) -> Array, host SiluGate = |x| {
        let z = x[1].as_dtype(Dtype::F32)?;
        Ok(vec![x[0].multiply(&z.silu()?)?.as_dtype(x[1].dtype())?])
    };
    /// SwiGLU: `silu(gate) * up`.
    swiglu(gate, up) -> Array, host Swiglu = |x| Ok(vec![x[0].silu()?.multiply(x[1])?]);
    /// The attention output's gate: `o * sigmoid(gate)`.
    sigmoid_gate(o, gate) -> Array, host SigmoidGate = |x| Ok(vec![x[0].multiply(&x[1].sigmoid()?)?]);
    /// `silu(x)`.
    silu(x) -> Array, host Silu = |x| Ok(vec![x[0].silu()?]);
    /// RMSNorm in f32 as MLX's own op-by-op norm computes it (`x * rsqrt(mean(x^2) + eps) * w`, x cast to f32,
    /// `w` f32, `eps` and `inv_d` = 1/D 0-d f32 arrays: MLX's mean is the sum times 1/D in f32, and a shapeless
    /// trace would count D with one more operation), rounded once to x's dtype: where MLX has no norm kernel
    /// (the CPU) its norm is these operations, a dozen launches where compiled they are four.
    rms_norm_f32(x, w, eps, inv_d) -> Array = |x| {
        let x32 = x[0].as_dtype(Dtype::F32)?;
        let ms = x32.square()?.sum(&[-1], true)?.multiply(x[3])?;
        Ok(vec![x32.multiply(&ms.add(x[2])?.rsqrt()?)?.multiply(x[1])?.as_dtype(x[0].dtype())?])
    };
}
