//! Gated DeltaNet (linear attention) mixer of Qwen3.5 (docs/MODEL.md §3.2).

use mlx::{concatenate, Array, Dtype};

use super::{mlx_err, Config};
use crate::cache::{LinearState, Recording};
use crate::kernels::{conv, fused, gated_delta, gated_delta_qkv, gated_norm};
use crate::model::layers::{Fused, Linear, Result, Tap};
use crate::model::parallel::{Cut, Parallel};
use crate::model::store::Store;
use crate::model::LoadError;

/// Gated DeltaNet (linear attention) mixer.
pub struct GatedDeltaNet {
    /// in_proj_qkv, in_proj_z, in_proj_b, in_proj_a over the same input.
    in_proj: Fused,
    /// Depthwise conv weight in MLX layout `[C, K, 1]`.
    conv_weight: Array,
    dt_bias: Array,
    /// `-exp(A_log)` in f32.
    neg_a: Array,
    /// The gated norm's weight in f32 (applied in f32, see `forward`).
    norm_weight: Array,
    /// q's and k's scales after their L2 normalisation (`1/Dk` and `1/sqrt(Dk)`, see `forward`) as norm
    /// weights: the multiply is the norm's own, not one more launch.
    qk_scales: [Array; 2],
    out_proj: Linear,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    kernel: i32,
    eps: f32,
    /// Shows calibration the projections' inputs (`layers.0.linear_attn.*`).
    tap: Tap,
}

impl GatedDeltaNet {
    pub(super) fn load(
        s: &Store,
        p: &str,
        c: &Config,
        tap: Tap,
        tp: Option<&Parallel>,
    ) -> std::result::Result<Self, LoadError> {
        let d = c.text.hidden_size;
        let (hk, hv) = (c.text.linear_num_key_heads, c.text.linear_num_value_heads);
        let (dk, dv, k) = (c.text.linear_key_head_dim, c.text.linear_value_head_dim, c.text.linear_conv_kernel_dim);
        let conv_name = format!("{p}.conv1d.weight");
        // Raw HF stores PyTorch's `[C, 1, K]`; MLX conversions store `[C, K, 1]`. The shape itself
        // says which (the checkpoint's layout was decided from these same shapes).
        let conv_weight = if k != 1 && s.shape(&conv_name) == Some(&[c.conv_dim(), 1, k][..]) {
            s.tensor(&conv_name, &[c.conv_dim(), 1, k])?.swapaxes(1, 2).map_err(|e| mlx_err(&conv_name, e))?
        } else {
            s.tensor(&conv_name, &[c.conv_dim(), k, 1])?
        };
        let a_log = s.raw(&format!("{p}.A_log"), &[hv])?;
        let neg_a =
            a_log.as_dtype(Dtype::F32).and_then(|a| a.exp()).and_then(|a| a.negative()).map_err(|e| mlx_err(p, e))?;
        // With `tp`, this rank's key heads and the value heads that read them (value head j reads key
        // head j / (hv / hk)): contiguous blocks of the q, k and v channels, z, b, a, the conv's
        // channels and the per-head decay parameters.
        let ((k0, k1), (v0, v1)) = match tp {
            Some(tp) => (tp.share(hk, "linear_num_key_heads")?, tp.share(hv, "linear_num_value_heads")?),
            None => ((0, hk), (0, hv)),
        };
        let kd = hk * dk;
        let channels = vec![(k0 * dk, k1 * dk), (kd + k0 * dk, kd + k1 * dk), (2 * kd + v0 * dv, 2 * kd + v1 * dv)];
        let cut = |rows: Vec<(i32, i32)>| if tp.is_some() { Cut::Rows(rows) } else { Cut::All };
        let parts = vec![
            s.linear_cut(&format!("{p}.in_proj_qkv"), c.conv_dim(), d, &cut(channels.clone()))?,
            s.linear_cut(&format!("{p}.in_proj_z"), c.value_dim(), d, &cut(vec![(v0 * dv, v1 * dv)]))?,
            s.linear_cut(&format!("{p}.in_proj_b"), hv, d, &cut(vec![(v0, v1)]))?,
            s.linear_cut(&format!("{p}.in_proj_a"), hv, d, &cut(vec![(v0, v1)]))?,
        ];
        let out_cut = if tp.is_some() { Cut::Cols(v0 * dv, v1 * dv) } else { Cut::All };
        let out_proj = s.linear_cut(&format!("{p}.out_proj"), d, c.value_dim(), &out_cut)?;
        let (mut conv_weight, mut dt_bias, mut neg_a) = (conv_weight, s.tensor(&format!("{p}.dt_bias"), &[hv])?, neg_a);
        if tp.is_some() {
            let err = |e| mlx_err(p, e);
            let heads = |a: &Array| a.slice_axis(0, v0, v1).and_then(|a| a.contiguous());
            let conv = channels.iter().map(|&(a, b)| conv_weight.slice_axis(0, a, b)).collect::<Result<Vec<_>>>();
            conv_weight =
                conv.and_then(|c| concatenate(&c.iter().collect::<Vec<_>>(), 0)?.contiguous()).map_err(err)?;
            dt_bias = heads(&dt_bias).map_err(err)?;
            neg_a = heads(&neg_a).map_err(err)?;
        }
        let (hk, hv) = (k1 - k0, v1 - v0);
        // The conv runs in f32 (below): its weight is cast once here, not at every step.
        let conv_weight =
            conv_weight.as_dtype(Dtype::F32).and_then(|w| w.contiguous()).map_err(|e| mlx_err(&conv_name, e))?;
        // The scales as f32 computes them (what the separate multiply by an f32 scalar used).
        let dkf = dk as f32;
        let scale = |v: f32| Array::full(&[dk], f64::from(v), Dtype::F32).map_err(|e| mlx_err(p, e));
        let qk_scales = [scale(1.0 / dkf)?, scale(1.0 / dkf.sqrt())?];
        Ok(GatedDeltaNet {
            in_proj: Fused::new(parts).map_err(|e| mlx_err(p, e))?,
            qk_scales,
            conv_weight,
            dt_bias,
            neg_a,
            // The gated norm uses a standard (never shifted) weight.
            norm_weight: s.raw(&format!("{p}.norm.weight"), &[dv])?.as_dtype(Dtype::F32).map_err(|e| mlx_err(p, e))?,
            out_proj,
            hk,
            hv,
            dk,
            dv,
            kernel: k,
            eps: c.text.rms_norm_eps,
            tap,
        })
    }

    /// The mixer over `x` `[B, T, D]` for B sequences, each with its own state (`states[i]` is row
    /// i's): conv windows and recurrent states are stacked along the batch axis for one pass and
    /// handed back to each sequence after it.
    pub(super) fn forward(&self, x: &Array, states: &mut [&mut LinearState]) -> Result<Array> {
        let b = x.dim(0);
        if states.len() != b as usize {
            return Err(mlx::Error::Invalid(format!("linear attention: {} states for {b} sequences", states.len())));
        }
        self.tap.see_all(&["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"], x);
        let mut proj = self.in_proj.forward(x)?.into_iter();
        let mut next =
            || proj.next().ok_or_else(|| mlx::Error::Invalid("fused projection returned too few parts".into()));
        let (qkv, z, b_in, a_in) = (next()?, next()?, next()?, next()?);
        let (beta, decay) = fused::delta_gates(&b_in, &a_in, &self.dt_bias, &self.neg_a)?;

        // Causal depthwise conv over [window ++ new rows]; the window keeps the last K-1 rows.
        let c = qkv.dim(2);
        // The previous states, whole where the last batched forward left them for these same sequences.
        let (prev, initial) = match LinearState::batched(states) {
            Some(whole) => whole,
            None => (
                stacked(states, LinearState::conv, || Array::zeros(&[1, self.kernel - 1, c], qkv.dtype()))?,
                stacked(states, LinearState::ssm, || Array::zeros(&[1, self.hv, self.dv, self.dk], Dtype::F32))?,
            ),
        };
        // In f32: q and k are L2-normalised next; rounding the conv output to bf16 first was the largest
        // bf16 drift found op by op against mlx-lm (it cost a third to a half of the layer's accuracy). The
        // conv's input [window ++ qkv] is kept only by a verify, for its rollback (kernels::conv::step).
        let verifying = states.iter().any(|st| st.verifying());
        let conv::Step { y: conv, window, input } = conv::step(&prev, &qkv, &self.conv_weight, verifying)?;

        // q, k and v are the conv output's channels, by heads; q and k L2-normalised: x / sqrt(sum x^2 + eps) ==
        // rms_norm(x, eps / D) / sqrt(D), q also taking 1/sqrt(Dk). Then the recurrence (docs/MODEL.md §3.2),
        // its state [B, Hv, Dv, Dk], value heads mapped to key heads inside. On CUDA at decode and verify widths
        // one kernel does all of it and returns every token's state too (kernels::gated_delta_qkv); else MLX's
        // operations, the recurrence by kernels::gated_delta. A verify pass records what a rollback needs to
        // recompute the state of a shorter prefix (cache::Recording).
        let layout = gated_delta_qkv::Layout { hk: self.hk, hv: self.hv, dk: self.dk, dv: self.dv };
        let (eps, scales) = (1e-6 / self.dk as f32, &self.qk_scales);
        let call = gated_delta_qkv::Call { layout, eps, qkv: &conv, scales, g: &decay, beta: &beta, state: &initial };
        let gated_delta_qkv::Recurrence { update, qkv } = gated_delta_qkv::update(&call)?;
        let gated_delta::Update { y: o, state, steps } = update;
        if let Some(conv_input) = input {
            let final_state = state.clone();
            let inputs = qkv.map(|[q, k, v]| [q, k, v, decay, beta]);
            LinearState::record(states, Recording { conv_input, inputs, initial, final_state, steps });
        }
        LinearState::set_rows(states, &window, &state)?;

        // Gated RMSNorm per head, w * rmsnorm(o) * silu(z), in f32 from the recurrence's f32 output
        // [B,T,Hv,Dv] and rounded once. Rounding o and then w * rmsnorm(o) to bf16 first (transformers'
        // order of casts) amplified the error of positions whose output nearly cancels (small rms).
        let gated = gated_norm::gated_norm(&o, &z, &self.norm_weight, self.eps)?;
        self.tap.see("out_proj", &gated);
        self.out_proj.forward(&gated)
    }
}

/// One array of every sequence's state part stacked along the batch axis (a fresh one for a
/// sequence that has none yet); a single sequence's is used as it is.
fn stacked(
    states: &[&mut LinearState],
    part: impl Fn(&LinearState) -> Option<&Array>,
    fresh: impl Fn() -> Result<Array>,
) -> Result<Array> {
    let parts = states.iter().map(|st| part(st).cloned().map_or_else(&fresh, Ok)).collect::<Result<Vec<_>>>()?;
    match parts.as_slice() {
        [one] => Ok(one.clone()),
        _ => concatenate(&parts.iter().collect::<Vec<_>>(), 0),
    }
}
