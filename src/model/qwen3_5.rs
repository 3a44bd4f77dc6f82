//! Qwen3.5 (`qwen3_5`): a hybrid of Gated DeltaNet (linear attention) and gated full-attention
//! layers, with an optional MTP head. Config, checkpoint mapping, cache layout and forward pass.
//! Math: shared/spec/qwen35-mtp-mlx-format.md, section 3; the MTP head: section 4.

use std::path::Path;

use mlx::fast;
use mlx::{concatenate, Array, Dtype};
use serde::Deserialize;

use super::convention::{self, HeadDecision, NormStat, Reference, Stored};
use super::layers::{causal_attention, Embedding, Fused, Linear, Mlp, NormConvention, Result, RmsNorm};
use super::store::Store;
use super::vision::{GridThw, VisionConfig, VisionTower};
use super::weights::{Checkpoint, Layout};
use super::{LoadError, LoadOptions};
use crate::cache::{KvCache, LayerCache, LinearState, Recording};

// ---------------------------------------------------------------------------------------------
// Config

#[derive(Debug, Clone, Deserialize)]
pub struct RopeParameters {
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default = "default_partial")]
    pub partial_rotary_factor: f32,
    #[serde(default)]
    pub mrope_section: Vec<i32>,
    #[serde(default)]
    pub mrope_interleaved: bool,
}

fn default_theta() -> f32 {
    10_000_000.0
}
fn default_partial() -> f32 {
    0.25
}
fn default_interval() -> usize {
    4
}
fn default_kernel() -> i32 {
    4
}
fn default_eps() -> f32 {
    1e-6
}

/// The text model's configuration (`text_config`, or the top level of a text-only config).
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: usize,
    pub vocab_size: i32,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "default_interval")]
    pub full_attention_interval: usize,
    pub linear_num_key_heads: i32,
    pub linear_num_value_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    #[serde(default = "default_kernel")]
    pub linear_conv_kernel_dim: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f32>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub mtp_num_hidden_layers: usize,
    #[serde(default)]
    pub mtp_use_dedicated_embeddings: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub text: TextConfig,
    pub tie_word_embeddings: bool,
    /// `tie_word_embeddings` differs between `text_config` and the top level.
    pub tie_conflict: bool,
    pub full_attention: Vec<bool>,
    pub rope_theta: f32,
    pub rope_dims: i32,
    /// M-RoPE: how many of the `rope_dims / 2` frequencies follow the t, h and w position axes.
    pub mrope_section: Vec<i32>,
    pub mrope_interleaved: bool,
    pub has_vision: bool,
}

impl Config {
    pub fn from_json(v: &serde_json::Value) -> std::result::Result<Config, LoadError> {
        let text_v = v.get("text_config").unwrap_or(v);
        let text: TextConfig = serde_json::from_value(text_v.clone()).map_err(|e| LoadError::Config(e.to_string()))?;
        let n = text.num_hidden_layers;
        let full_attention = match &text.layer_types {
            Some(types) => {
                if types.len() != n {
                    return Err(LoadError::Config(format!("layer_types has {} entries for {n} layers", types.len())));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "full_attention" => Ok(true),
                        "linear_attention" => Ok(false),
                        other => Err(LoadError::Config(format!("layer_types: unknown layer type `{other}`"))),
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
            None => (0..n).map(|i| (i + 1) % text.full_attention_interval.max(1) == 0).collect(),
        };
        let check = |ok: bool, msg: &str| if ok { Ok(()) } else { Err(LoadError::Config(msg.to_string())) };
        check(
            text.linear_num_key_heads > 0 && text.linear_num_value_heads % text.linear_num_key_heads == 0,
            "linear_num_value_heads must be a multiple of linear_num_key_heads",
        )?;
        check(
            text.num_key_value_heads > 0 && text.num_attention_heads % text.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads",
        )?;
        let rope = text.rope_parameters.clone();
        let rope_theta = rope.as_ref().map(|r| r.rope_theta).or(text.rope_theta).unwrap_or(default_theta());
        let partial =
            rope.as_ref().map(|r| r.partial_rotary_factor).or(text.partial_rotary_factor).unwrap_or(default_partial());
        let rope_dims = (text.head_dim as f32 * partial).round() as i32;
        // The text config's flag wins over the top level's (a common source of tied/untied mix-ups);
        // where both are given and disagree, the checkpoint decides (see `resolve_tie`).
        let top_tie =
            if v.get("text_config").is_some() { v.get("tie_word_embeddings").and_then(|t| t.as_bool()) } else { None };
        let tie_word_embeddings = text.tie_word_embeddings.or(top_tie).unwrap_or(false);
        let tie_conflict = matches!((text.tie_word_embeddings, top_tie), (Some(a), Some(b)) if a != b);
        let (mrope_section, mrope_interleaved) =
            rope.map(|r| (r.mrope_section, r.mrope_interleaved)).unwrap_or_default();
        Ok(Config {
            tie_word_embeddings,
            tie_conflict,
            full_attention,
            rope_theta,
            rope_dims,
            mrope_section,
            mrope_interleaved,
            has_vision: v.get("vision_config").is_some(),
            text,
        })
    }

    /// Settles `tie_word_embeddings` when the config's two levels disagree: transformers reads the
    /// top level, mlx-lm and mlx-vlm read `text_config`, so either may be the one the checkpoint
    /// was saved by. Its files decide: a stored `lm_head.weight` means untied. Returns a note
    /// when it had to decide.
    pub fn resolve_tie(&mut self, has_lm_head: bool) -> Option<String> {
        if !self.tie_conflict {
            return None;
        }
        self.tie_word_embeddings = !has_lm_head;
        Some(format!(
            "config.json: `tie_word_embeddings` is {} in text_config but {} at the top level; the checkpoint {} `lm_head.weight`, so the embeddings are {}",
            self.text.tie_word_embeddings.unwrap_or(false),
            !self.text.tie_word_embeddings.unwrap_or(false),
            if has_lm_head { "has" } else { "has no" },
            if has_lm_head { "untied" } else { "tied" }
        ))
    }

    fn key_dim(&self) -> i32 {
        self.text.linear_num_key_heads * self.text.linear_key_head_dim
    }
    fn value_dim(&self) -> i32 {
        self.text.linear_num_value_heads * self.text.linear_value_head_dim
    }
    fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }
}

// ---------------------------------------------------------------------------------------------
// Layers

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
    out_proj: Linear,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    kernel: i32,
    eps: f32,
    /// Canonical module name (`layers.0.linear_attn`), for taps.
    prefix: String,
}

impl GatedDeltaNet {
    fn load(s: &Store, p: &str, c: &Config) -> std::result::Result<Self, LoadError> {
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
        Ok(GatedDeltaNet {
            in_proj: Fused::new(vec![
                s.linear(&format!("{p}.in_proj_qkv"), c.conv_dim(), d, false)?,
                s.linear(&format!("{p}.in_proj_z"), c.value_dim(), d, false)?,
                s.linear(&format!("{p}.in_proj_b"), hv, d, false)?,
                s.linear(&format!("{p}.in_proj_a"), hv, d, false)?,
            ])
            .map_err(|e| mlx_err(p, e))?,
            conv_weight,
            dt_bias: s.tensor(&format!("{p}.dt_bias"), &[hv])?,
            neg_a,
            // The gated norm uses a standard (never shifted) weight.
            norm_weight: s.raw(&format!("{p}.norm.weight"), &[dv])?.as_dtype(Dtype::F32).map_err(|e| mlx_err(p, e))?,
            out_proj: s.linear(&format!("{p}.out_proj"), d, c.value_dim(), false)?,
            hk,
            hv,
            dk,
            dv,
            kernel: k,
            eps: c.text.rms_norm_eps,
            prefix: p.to_string(),
        })
    }

    fn forward(&self, x: &Array, st: &mut LinearState, taps: &mut Taps<'_>) -> Result<Array> {
        let (b, t) = (x.dim(0), x.dim(1));
        let dt = x.dtype();
        for name in ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"] {
            taps.see(&self.prefix, name, x);
        }
        let mut proj = self.in_proj.forward(x)?.into_iter();
        let mut next =
            || proj.next().ok_or_else(|| mlx::Error::Invalid("fused projection returned too few parts".into()));
        let (qkv, z, b_in, a_in) = (next()?, next()?, next()?, next()?);
        let z = z.reshape(&[b, t, self.hv, self.dv])?;
        let beta = b_in.as_dtype(Dtype::F32)?.sigmoid()?;
        let a = a_in.as_dtype(Dtype::F32)?;
        let g = a.add(&self.dt_bias.as_dtype(Dtype::F32)?)?.softplus()?.multiply(&self.neg_a)?;
        let decay = g.exp()?;

        // Causal depthwise conv over [window ++ new rows]; the window keeps the last K-1 rows.
        let c = qkv.dim(2);
        let prev = match st.conv.take() {
            Some(p) => p,
            None => Array::zeros(&[b, self.kernel - 1, c], qkv.dtype())?,
        };
        let conv_input = concatenate(&[&prev, &qkv], 1)?;
        // In f32: q and k are L2-normalised next; rounding the conv output to bf16 first was the largest
        // bf16 drift found op by op against mlx-lm (it cost a third to a half of the layer's accuracy).
        let conv_f32 = conv_input.as_dtype(Dtype::F32)?;
        let conv = mlx::ops::conv1d(&conv_f32, &self.conv_weight.as_dtype(Dtype::F32)?, 1, 0, 1, c)?.silu()?;
        st.conv = Some(conv_input.slice_axis(1, t, t + self.kernel - 1)?);

        let (kd, _) = (self.hk * self.dk, 0);
        let parts = conv.split_at(&[kd, 2 * kd], 2)?;
        let q = parts[0].reshape(&[b, t, self.hk, self.dk])?.as_dtype(Dtype::F32)?;
        let k = parts[1].reshape(&[b, t, self.hk, self.dk])?.as_dtype(Dtype::F32)?;
        let v = parts[2].reshape(&[b, t, self.hv, self.dv])?.as_dtype(Dtype::F32)?;
        // L2 normalisation x / sqrt(sum x^2 + eps) == rms_norm(x, eps / D) / sqrt(D); q also takes 1/sqrt(Dk).
        let dkf = self.dk as f32;
        let q = fast::rms_norm(&q, None, 1e-6 / dkf)?.multiply(&Array::f32(1.0 / dkf))?;
        let k = fast::rms_norm(&k, None, 1e-6 / dkf)?.multiply(&Array::f32(1.0 / dkf.sqrt()))?;
        // The recurrence (spec 3.2 step 7) with MLX's fused kernel; its state is [B, Hv, Dv, Dk] and
        // it maps value heads to key heads itself. A verify pass records what a rollback needs to
        // recompute the state of a shorter prefix (cache::Recording).
        let initial = match st.ssm.take() {
            Some(s) => s,
            None => Array::zeros(&[b, self.hv, self.dv, self.dk], Dtype::F32)?,
        };
        let (o, state) = fast::gated_delta_update(&q, &k, &v, &decay, &beta, Some(&initial))?;
        if std::mem::take(&mut st.record_next) {
            st.recording =
                Some(Recording { conv_input, inputs: [q, k, v, decay, beta], initial, final_state: state.clone() });
        }
        st.ssm = Some(state);

        // Gated RMSNorm per head, w * rmsnorm(o) * silu(z), in f32 from the recurrence's f32 output
        // [B,T,Hv,Dv] and rounded once. Rounding o and then w * rmsnorm(o) to bf16 first (transformers'
        // order of casts) amplified the error of positions whose output nearly cancels (small rms).
        let n = fast::rms_norm(&o, Some(&self.norm_weight), self.eps)?;
        let gated = n.multiply(&z.as_dtype(Dtype::F32)?.silu()?)?.as_dtype(dt)?;
        let gated = gated.reshape(&[b, t, self.hv * self.dv])?;
        taps.see(&self.prefix, "out_proj", &gated);
        self.out_proj.forward(&gated)
    }
}

/// Gated full attention: per-head interleaved query and gate, q/k norms, partial RoPE, GQA.
pub struct Attention {
    /// q_proj (query and gate), k_proj, v_proj over the same input.
    qkv: Fused,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    hq: i32,
    hkv: i32,
    hd: i32,
    rope_dims: i32,
    rope_theta: f32,
    /// Canonical module name (`layers.3.self_attn`), for taps.
    prefix: String,
}

impl Attention {
    fn load(
        s: &Store,
        p: &str,
        c: &Config,
        norms: &dyn Fn(&str, i32) -> std::result::Result<RmsNorm, LoadError>,
    ) -> std::result::Result<Self, LoadError> {
        let (d, hq, hkv, hd) =
            (c.text.hidden_size, c.text.num_attention_heads, c.text.num_key_value_heads, c.text.head_dim);
        Ok(Attention {
            qkv: Fused::new(vec![
                s.linear(&format!("{p}.q_proj"), 2 * hq * hd, d, false)?,
                s.linear(&format!("{p}.k_proj"), hkv * hd, d, false)?,
                s.linear(&format!("{p}.v_proj"), hkv * hd, d, false)?,
            ])
            .map_err(|e| mlx_err(p, e))?,
            o_proj: s.linear(&format!("{p}.o_proj"), d, hq * hd, false)?,
            q_norm: norms(&format!("{p}.q_norm.weight"), hd)?,
            k_norm: norms(&format!("{p}.k_norm.weight"), hd)?,
            hq,
            hkv,
            hd,
            rope_dims: c.rope_dims,
            rope_theta: c.rope_theta,
            prefix: p.to_string(),
        })
    }

    fn forward(&self, x: &Array, cache: &mut KvCache, rope: Option<&MRope>, taps: &mut Taps<'_>) -> Result<Array> {
        let (b, t) = (x.dim(0), x.dim(1));
        for name in ["q_proj", "k_proj", "v_proj"] {
            taps.see(&self.prefix, name, x);
        }
        let mut proj = self.qkv.forward(x)?.into_iter();
        let mut next =
            || proj.next().ok_or_else(|| mlx::Error::Invalid("fused projection returned too few parts".into()));
        let (qg, k, v) = (next()?, next()?, next()?);
        let halves = qg.reshape(&[b, t, self.hq, 2 * self.hd])?.split(2, 3)?;
        let gate = halves[1].reshape(&[b, t, self.hq * self.hd])?;
        let q = self.q_norm.forward(&halves[0])?.swapaxes(1, 2)?;
        let k = self.k_norm.forward(&k.reshape(&[b, t, self.hkv, self.hd])?)?.swapaxes(1, 2)?;
        let v = v.reshape(&[b, t, self.hkv, self.hd])?.swapaxes(1, 2)?;
        let (q, k) = match rope {
            Some(r) => (r.apply(&q)?, r.apply(&k)?),
            None => {
                // After images, text positions run `rope_delta` behind (or ahead of) the token count.
                let pos = cache.offset + cache.rope_delta;
                (
                    fast::rope(&q, self.rope_dims, false, self.rope_theta, 1.0, pos)?,
                    fast::rope(&k, self.rope_dims, false, self.rope_theta, 1.0, pos)?,
                )
            }
        };
        let (keys, values) = cache.update(&k, &v)?;
        let o = causal_attention(&q, &keys, &values, 1.0 / (self.hd as f32).sqrt())?;
        let o = o.swapaxes(1, 2)?.reshape(&[b, t, self.hq * self.hd])?.multiply(&gate.sigmoid()?)?;
        taps.see(&self.prefix, "o_proj", &o);
        self.o_proj.forward(&o)
    }
}

/// Explicit M-RoPE rotation for one pass (spec 3.3): cos and sin `[T, rope_dims]` built from position
/// ids `[3, T]` (t, h, w), each frequency taking its position from the axis `mrope_section` assigns it.
struct MRope {
    cos: Array,
    sin: Array,
    dims: i32,
}

impl MRope {
    fn new(c: &Config, position_ids: &Array, dtype: Dtype) -> Result<MRope> {
        let half = c.rope_dims / 2;
        let t = position_ids.dim(1);
        if position_ids.shape() != [3, t] {
            return Err(mlx::Error::Invalid(format!(
                "M-RoPE position ids have shape {:?}, expected [3, T]",
                position_ids.shape()
            )));
        }
        let inv: Vec<f32> = (0..half).map(|i| 1.0 / c.rope_theta.powf((2 * i) as f32 / c.rope_dims as f32)).collect();
        let sec = |i: usize| c.mrope_section.get(i).copied().unwrap_or(0);
        let axis: Vec<i32> = (0..half)
            .map(|i| {
                if c.mrope_interleaved {
                    // transformers: all t, then h at 1, 4, .. < 3*sec[1], w at 2, 5, .. < 3*sec[2].
                    match i % 3 {
                        1 if i < 3 * sec(1) => 1,
                        2 if i < 3 * sec(2) => 2,
                        _ => 0,
                    }
                } else if i < sec(0) {
                    0
                } else if i < sec(0) + sec(1) {
                    1
                } else {
                    2
                }
            })
            .collect();
        let freqs =
            position_ids.as_dtype(Dtype::F32)?.expand_dims(&[2])?.multiply(&Array::from_slice(&inv, &[1, 1, half])?)?;
        let pick = Array::from_slice(&axis, &[1, 1, half])?.broadcast_to(&[1, t, half])?;
        let f = freqs.take_along_axis(&pick, 0)?.squeeze(&[0])?; // [T, half]
        let emb = concatenate(&[&f, &f], -1)?;
        Ok(MRope { cos: emb.cos()?.as_dtype(dtype)?, sin: emb.sin()?.as_dtype(dtype)?, dims: c.rope_dims })
    }

    /// Rotate-half rotation of the first `dims` features of x `[B, H, T, hd]`.
    fn apply(&self, x: &Array) -> Result<Array> {
        let hd = x.dim(-1);
        let parts = x.split_at(&[self.dims / 2, self.dims], -1)?;
        let rotated = concatenate(&[&parts[1].negative()?, &parts[0]], -1)?;
        let y = x.slice_axis(-1, 0, self.dims)?.multiply(&self.cos)?.add(&rotated.multiply(&self.sin)?)?;
        if self.dims == hd {
            Ok(y)
        } else {
            concatenate(&[&y, &parts[2]], -1)
        }
    }
}

/// Sees each linear layer's input by its canonical module name (see [`Qwen35::forward_observed`]).
pub type LinearObserver<'a> = dyn FnMut(&str, &Array) + 'a;

/// An optional observer of linear-layer inputs.
struct Taps<'a>(Option<&'a mut LinearObserver<'a>>);

impl Taps<'_> {
    fn active(&self) -> bool {
        self.0.is_some()
    }
    fn see(&mut self, prefix: &str, name: &str, x: &Array) {
        if let Some(f) = self.0.as_mut() {
            f(&format!("{prefix}.{name}"), x);
        }
    }
}

pub enum Mixer {
    Linear(GatedDeltaNet),
    Attention(Attention),
}

pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    mixer: Mixer,
    mlp: Mlp,
    /// Canonical layer name (`layers.3`, `mtp.layers.0`), for taps.
    prefix: String,
}

impl DecoderLayer {
    fn load(
        s: &Store,
        p: &str,
        c: &Config,
        full: bool,
        norms: &dyn Fn(&str, i32) -> std::result::Result<RmsNorm, LoadError>,
    ) -> std::result::Result<Self, LoadError> {
        let (d, i) = (c.text.hidden_size, c.text.intermediate_size);
        let mixer = if full {
            Mixer::Attention(Attention::load(s, &format!("{p}.self_attn"), c, norms)?)
        } else {
            Mixer::Linear(GatedDeltaNet::load(s, &format!("{p}.linear_attn"), c)?)
        };
        Ok(DecoderLayer {
            input_layernorm: norms(&format!("{p}.input_layernorm.weight"), d)?,
            post_attention_layernorm: norms(&format!("{p}.post_attention_layernorm.weight"), d)?,
            mixer,
            mlp: Mlp {
                gate_proj: s.linear(&format!("{p}.mlp.gate_proj"), i, d, false)?,
                up_proj: s.linear(&format!("{p}.mlp.up_proj"), i, d, false)?,
                down_proj: s.linear(&format!("{p}.mlp.down_proj"), d, i, false)?,
            },
            prefix: format!("{p}.mlp"),
        })
    }

    fn forward(&self, h: &Array, cache: &mut LayerCache, rope: Option<&MRope>, taps: &mut Taps<'_>) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let mixed = match (&self.mixer, cache) {
            (Mixer::Attention(a), LayerCache::Kv(c)) => a.forward(&x, c, rope, taps)?,
            (Mixer::Linear(l), LayerCache::Linear(s)) => l.forward(&x, s, taps)?,
            _ => return Err(mlx::Error::Invalid("cache kind does not match the layer kind".into())),
        };
        let h = h.add(&mixed)?;
        let x = self.post_attention_layernorm.forward(&h)?;
        if !taps.active() {
            return h.add(&self.mlp.forward(&x)?);
        }
        // Mlp::forward, spelled out so that the down projection's input can be observed.
        let (m, p) = (&self.mlp, &self.prefix);
        taps.see(p, "gate_proj", &x);
        taps.see(p, "up_proj", &x);
        let inner = m.gate_proj.forward(&x)?.silu()?.multiply(&m.up_proj.forward(&x)?)?;
        taps.see(p, "down_proj", &inner);
        h.add(&m.down_proj.forward(&inner)?)
    }
}

// ---------------------------------------------------------------------------------------------
// MTP head

/// The names of the 15 logical tensors of a one-layer MTP head (spec section 2), without `mtp.`.
pub const MTP_TENSORS: [&str; 15] = [
    "fc.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
];

/// The 7 zero-centred norms of the MTP head.
pub const MTP_NORMS: [&str; 7] = [
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight",
];

pub struct MtpHead {
    fc: Linear,
    pre_fc_norm_embedding: RmsNorm,
    pre_fc_norm_hidden: RmsNorm,
    layer: DecoderLayer,
    norm: RmsNorm,
}

/// Whether the MTP head loaded, and if not, why; plus what the loader checked of its norms.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MtpStatus {
    pub declared_layers: usize,
    pub tensors_found: usize,
    pub loaded: bool,
    /// Why the head is not running (None when it loaded).
    pub reason: Option<String>,
    /// Set when a norm convention was repaired at load time.
    pub repaired: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Model

pub struct Qwen35 {
    pub config: Config,
    pub layout: Layout,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    mtp: Option<MtpHead>,
    pub mtp_status: MtpStatus,
    vision: Option<VisionTower>,
    /// Why a vision tower declared by the config is not loaded (None when loaded or not declared).
    pub vision_status: Option<String>,
    /// The model folder's name, for messages.
    name: String,
}

fn mlx_err(context: &str, e: mlx::Error) -> LoadError {
    LoadError::Mlx { context: context.to_string(), source: e }
}

impl Qwen35 {
    pub fn load(dir: &Path, config: &serde_json::Value, opts: &LoadOptions) -> std::result::Result<Qwen35, LoadError> {
        let mut c = Config::from_json(config)?;
        let store = Store::new(Checkpoint::open(dir)?, opts.dtype)?;
        if let Some(note) = c.resolve_tie(store.has("lm_head.weight")) {
            tracing::warn!("{}: {note}", dir.display());
        }
        let (d, v, eps) = (c.text.hidden_size, c.text.vocab_size, c.text.rms_norm_eps);
        let norms = |name: &str, dim: i32| store.norm(name, dim, eps);
        let embed_tokens = store.embedding("embed_tokens", v, d)?;
        let layers = (0..c.text.num_hidden_layers)
            .map(|i| DecoderLayer::load(&store, &format!("layers.{i}"), &c, c.full_attention[i], &norms))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let norm = norms("norm.weight", d)?;
        let lm_head = if c.tie_word_embeddings {
            if store.has("lm_head.weight") {
                // Some exports keep a copy of the tied head; it must equal the embedding, so it is unused.
                store.skip_prefix("lm_head.");
            }
            None
        } else {
            Some(store.linear("lm_head", v, d, false)?)
        };
        let (mtp, mtp_status) = load_mtp(&store, &c)?;
        // A tower whose tensors are all there loads strictly; a text-only conversion (mlx-lm drops
        // `visual.*` but keeps `vision_config`) or an unsupported vision config loads as text only.
        let has_tensors = !store.names_with_prefix("visual.").is_empty();
        let (vision, vision_status) = match VisionConfig::from_json(config) {
            Ok(Some(vc)) if has_tensors => (Some(VisionTower::load(&store, &vc)?), None),
            Ok(Some(_)) => (None, Some("the checkpoint has no visual.* tensors (a text-only conversion)".to_string())),
            Ok(None) => (None, has_tensors.then(|| "visual.* tensors but no vision_config in config.json".to_string())),
            Err(e) => (None, Some(e.to_string())),
        };
        if let Some(why) = &vision_status {
            tracing::warn!("{}: vision tower not loaded: {why}", dir.display());
            store.skip_prefix("visual.");
        }
        store.finish()?;
        let name =
            dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string());
        Ok(Qwen35 {
            config: c,
            layout: store.layout,
            embed_tokens,
            layers,
            norm,
            lm_head,
            mtp,
            mtp_status,
            vision,
            vision_status,
            name,
        })
    }

    /// Fresh per-sequence state: one cache per decoder layer.
    pub fn make_cache(&self) -> Vec<LayerCache> {
        self.config
            .full_attention
            .iter()
            .map(
                |&full| {
                    if full {
                        LayerCache::Kv(KvCache::default())
                    } else {
                        LayerCache::Linear(LinearState::default())
                    }
                },
            )
            .collect()
    }

    /// The MTP head's own KV cache (None when the head is not loaded).
    pub fn make_mtp_cache(&self) -> Option<KvCache> {
        self.mtp.as_ref().map(|_| KvCache::default())
    }

    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    pub fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    /// Runs the decoder over `tokens` `[B, T]` and returns the post-final-norm hidden states `[B, T, D]`.
    pub fn forward(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        self.forward_embeddings(&self.embed(tokens)?, cache)
    }

    pub fn forward_embeddings(&self, h: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        self.forward_tapped(h, cache, None, &mut Taps(None))
    }

    /// [`forward_embeddings`](Self::forward_embeddings) at explicit M-RoPE position ids `[3, T]`
    /// (t, h, w), for a pass over a prompt that holds images. Later passes without explicit ids run
    /// at `offset + rope_delta` of each KV cache (see [`set_rope_delta`]).
    pub fn forward_embeddings_at(&self, h: &Array, cache: &mut [LayerCache], position_ids: &Array) -> Result<Array> {
        let rope = MRope::new(&self.config, position_ids, h.dtype())?;
        self.forward_tapped(h, cache, Some(&rope), &mut Taps(None))
    }

    /// The folder the model was loaded from (its name), for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn has_vision(&self) -> bool {
        self.vision.is_some()
    }

    pub fn vision(&self) -> Option<&VisionTower> {
        self.vision.as_ref()
    }

    /// The vision tower's merged features `[tokens, hidden]` for images stacked in `pixel_values`
    /// `[patches, C*T*P*P]` with grids `[t, h, w]` (see `model::vision_input`).
    pub fn encode_images(&self, pixel_values: &Array, grid_thw: &[GridThw]) -> Result<Array> {
        let v = self.vision.as_ref().ok_or_else(|| {
            let why = self.vision_status.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
            mlx::Error::Invalid(format!("model `{}` has no vision tower: it cannot read images{why}", self.name))
        })?;
        v.encode(pixel_values, grid_thw)
    }

    /// [`forward`](Self::forward) that shows `observe` the input of every linear layer, named by
    /// its canonical module name (`layers.3.mlp.down_proj`), e.g. to calibrate quantization.
    pub fn forward_observed(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        observe: &mut dyn FnMut(&str, &Array),
    ) -> Result<Array> {
        self.forward_tapped(&self.embed(tokens)?, cache, None, &mut Taps(Some(observe)))
    }

    fn forward_tapped(
        &self,
        h: &Array,
        cache: &mut [LayerCache],
        rope: Option<&MRope>,
        taps: &mut Taps<'_>,
    ) -> Result<Array> {
        let mut h = h.clone();
        for (layer, c) in self.layers.iter().zip(cache.iter_mut()) {
            h = layer.forward(&h, c, rope, taps)?;
        }
        self.norm.forward(&h)
    }

    /// Logits from post-norm hidden states (the untied `lm_head`, or the tied embedding).
    pub fn logits(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.as_linear(hidden),
        }
    }

    /// One MTP step: for post-norm hidden `h_t` and the token `x_{t+1}` that follows position t,
    /// returns the head's normed output (which both feeds the next draft and gives the logits).
    pub fn mtp_forward(&self, hidden: &Array, next_tokens: &Array, cache: &mut KvCache) -> Result<Array> {
        self.mtp_forward_tapped(hidden, next_tokens, cache, &mut Taps(None))
    }

    /// [`mtp_forward`](Self::mtp_forward) that shows `observe` the input of every linear layer of
    /// the head (`mtp.fc`, `mtp.layers.0.self_attn.q_proj`, ...).
    pub fn mtp_forward_observed(
        &self,
        hidden: &Array,
        next_tokens: &Array,
        cache: &mut KvCache,
        observe: &mut dyn FnMut(&str, &Array),
    ) -> Result<Array> {
        self.mtp_forward_tapped(hidden, next_tokens, cache, &mut Taps(Some(observe)))
    }

    fn mtp_forward_tapped(
        &self,
        hidden: &Array,
        next_tokens: &Array,
        cache: &mut KvCache,
        taps: &mut Taps<'_>,
    ) -> Result<Array> {
        let head = self.mtp.as_ref().ok_or_else(|| mlx::Error::Invalid("this model has no MTP head loaded".into()))?;
        let e = head.pre_fc_norm_embedding.forward(&self.embed(next_tokens)?)?;
        let hh = head.pre_fc_norm_hidden.forward(hidden)?;
        let cat = concatenate(&[&e, &hh], -1)?;
        taps.see("mtp", "fc", &cat);
        let u = head.fc.forward(&cat)?;
        let mut lc = LayerCache::Kv(std::mem::take(cache));
        let u = head.layer.forward(&u, &mut lc, None, taps);
        if let LayerCache::Kv(c) = lc {
            *cache = c;
        }
        head.norm.forward(&u?)
    }

    pub fn layers_len(&self) -> usize {
        self.layers.len()
    }

    pub fn linear_kernel(&self) -> i32 {
        self.config.text.linear_conv_kernel_dim
    }
}

/// Sets the M-RoPE delta of every KV cache of a sequence: text after images sits at `index + delta`.
pub fn set_rope_delta(cache: &mut [LayerCache], delta: i32) {
    for kv in cache.iter_mut().filter_map(LayerCache::as_kv) {
        kv.rope_delta = delta;
    }
}

/// Loads the MTP head if the config declares one and the files hold all of it. The seven norms'
/// convention is decided by [`mtp_head_norms`]: from provenance facts, with statistics only for a
/// re-attached head; a head shifted twice does not run.
fn load_mtp(s: &Store, c: &Config) -> std::result::Result<(Option<MtpHead>, MtpStatus), LoadError> {
    let declared = c.text.mtp_num_hidden_layers;
    let present = s.names_with_prefix("mtp.");
    let found = MTP_TENSORS.iter().filter(|n| s.has(&format!("mtp.{n}"))).count();
    let mut status =
        MtpStatus { declared_layers: declared, tensors_found: found, loaded: false, reason: None, repaired: None };
    if declared == 0 {
        if !present.is_empty() {
            status.reason = Some(format!("config declares no MTP layers; ignoring {} mtp.* tensors", present.len()));
            s.skip_prefix("mtp.");
        } else {
            status.reason = Some("the model has no MTP head".into());
        }
        return Ok((None, status));
    }
    if declared > 1 || c.text.mtp_use_dedicated_embeddings {
        status.reason = Some(format!(
            "unsupported MTP head ({declared} layers, dedicated embeddings {})",
            c.text.mtp_use_dedicated_embeddings
        ));
        s.skip_prefix("mtp.");
        return Ok((None, status));
    }
    let missing: Vec<&str> = MTP_TENSORS.iter().filter(|n| !s.has(&format!("mtp.{n}"))).copied().collect();
    if !missing.is_empty() {
        status.reason = Some(format!(
            "config declares {declared} MTP layer(s) but the checkpoint lacks {} of its 15 tensors (e.g. mtp.{}); MTP is off",
            missing.len(),
            missing[0]
        ));
        s.skip_prefix("mtp.");
        return Ok((None, status));
    }
    let decision = mtp_head_norms(s)?;
    if let Some(why) = &decision.refused {
        status.reason = Some(format!("{why}; MTP is off (`tandem convert --repair` writes a fixed copy)"));
        tracing::warn!("{}", status.reason.as_deref().unwrap_or_default());
        s.skip_prefix("mtp.");
        return Ok((None, status));
    }
    if let Some(doubt) = &decision.doubt {
        tracing::warn!("{doubt}");
    }
    if let Some(fixed) = &decision.repaired {
        tracing::warn!("{fixed}");
    }
    status.repaired = decision.repaired.clone();
    let eps = c.text.rms_norm_eps;
    let norms = |name: &str, dim: i32| {
        let conv = decision.stored(name).map(|st| st.convention()).unwrap_or(NormConvention::ZeroCentred);
        s.norm_with(name, dim, eps, conv)
    };
    let d = c.text.hidden_size;
    let head = MtpHead {
        fc: s.linear("mtp.fc", d, 2 * d, false)?,
        pre_fc_norm_embedding: norms("mtp.pre_fc_norm_embedding.weight", d)?,
        pre_fc_norm_hidden: norms("mtp.pre_fc_norm_hidden.weight", d)?,
        layer: DecoderLayer::load(s, "mtp.layers.0", c, true, &norms)?,
        norm: norms("mtp.norm.weight", d)?,
    };
    status.loaded = true;
    Ok((Some(head), status))
}

/// How each of the MTP head's seven norms is stored (see `model::convention`): the head's origin
/// from names and files, the norms' means, and the body's final norm as the yardstick.
pub fn mtp_head_norms(s: &Store) -> std::result::Result<HeadDecision, LoadError> {
    let origin = convention::head_origin(s.layout, s.entries());
    let stat = |name: &str| -> std::result::Result<NormStat, LoadError> {
        let (key, file) = s.origin(name).ok_or_else(|| LoadError::Missing(name.to_string()))?;
        let provenance = s.provenance(name).ok_or_else(|| LoadError::Missing(name.to_string()))?;
        Ok(NormStat {
            name: name.to_string(),
            key: key.to_string(),
            file: file.to_path_buf(),
            provenance,
            mean: s.mean(name)?,
        })
    };
    let body = stat("norm.weight")?;
    let scale = body.mean + 1.0 - Stored::declared_by(body.provenance).offset();
    let reference = Reference { key: body.key, file: body.file, scale };
    let norms = MTP_NORMS.iter().map(|n| stat(&format!("mtp.{n}"))).collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(convention::decide(origin, norms, &reference))
}
