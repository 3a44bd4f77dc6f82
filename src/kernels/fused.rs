//! The elementwise chains of a forward pass, each compiled once by MLX's graph compiler
//! (`mlx::compile`, shapeless) so that a decode step launches one fused kernel where it would
//! launch a handful of tiny ones: a GPU at decode is bound by launches, not arithmetic. Each body
//! here is also its own fallback: with `TANDEM_COMPILE=off` (or where compiling fails) it runs op
//! by op, computing the same values (`tests/it/kernels.rs` compares the two on every chain).

use std::sync::OnceLock;

use mlx::compile::Compiled;
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

macro_rules! chains {
    ($($(#[$doc:meta])* $name:ident ( $($arg:ident),* ) -> $out:tt = $body:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name($($arg: &Array),*) -> Result<$out> {
            static CELL: OnceLock<Option<Compiled>> = OnceLock::new();
            let body: Body = $body;
            let out = run(&CELL, stringify!($name), body, &[$($arg),*])?;
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
    silu_gate(n, z) -> Array = |x| {
        let z = x[1].as_dtype(Dtype::F32)?;
        Ok(vec![x[0].multiply(&z.silu()?)?.as_dtype(x[1].dtype())?])
    };
    /// SwiGLU: `silu(gate) * up`.
    swiglu(gate, up) -> Array = |x| Ok(vec![x[0].silu()?.multiply(x[1])?]);
    /// The attention output's gate: `o * sigmoid(gate)`.
    sigmoid_gate(o, gate) -> Array = |x| Ok(vec![x[0].multiply(&x[1].sigmoid()?)?]);
    /// `silu(x)`.
    silu(x) -> Array = |x| Ok(vec![x[0].silu()?]);
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
