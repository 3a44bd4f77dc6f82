//! Qwen3.5's configuration (`config.json`, `text_config`), with the derived facts the model uses:
//! which layers are full attention, the RoPE setting, and whether the embeddings are tied.

use serde::Deserialize;

use super::LinearKind;
use crate::model::LoadError;

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

/// Bounds on the sizes a config may declare, each far beyond any released model (Qwen3.5's largest
/// has 60 layers, hidden size 4096 and a 248,320-token vocabulary) yet small enough that nothing
/// sized from them (per-layer tables, caches, shape products in `i32`) can ask for gigabytes or
/// overflow before the weights' shapes are checked.
const RANGES: &[(&str, i64, i64)] = &[
    ("num_hidden_layers", 1, 1024),
    ("hidden_size", 1, 65_536),
    ("intermediate_size", 1, 1 << 20),
    ("vocab_size", 1, 1 << 22),
    ("num_attention_heads", 1, 1024),
    ("num_key_value_heads", 1, 1024),
    ("head_dim", 1, 4096),
    ("linear_num_key_heads", 1, 1024),
    ("linear_num_value_heads", 1, 1024),
    ("linear_key_head_dim", 1, 4096),
    ("linear_value_head_dim", 1, 4096),
    ("linear_conv_kernel_dim", 1, 64),
    ("full_attention_interval", 0, 1024),
    ("mtp_num_hidden_layers", 0, 16),
    ("max_position_embeddings", 1, 1 << 24),
];

impl TextConfig {
    /// Checks every size against [`RANGES`] and the floats for sense, naming the field and value.
    fn check_ranges(&self) -> std::result::Result<(), LoadError> {
        let t = self;
        let value = |field: &str| -> Option<i64> {
            Some(match field {
                "num_hidden_layers" => i64::try_from(t.num_hidden_layers).unwrap_or(i64::MAX),
                "hidden_size" => t.hidden_size.into(),
                "intermediate_size" => t.intermediate_size.into(),
                "vocab_size" => t.vocab_size.into(),
                "num_attention_heads" => t.num_attention_heads.into(),
                "num_key_value_heads" => t.num_key_value_heads.into(),
                "head_dim" => t.head_dim.into(),
                "linear_num_key_heads" => t.linear_num_key_heads.into(),
                "linear_num_value_heads" => t.linear_num_value_heads.into(),
                "linear_key_head_dim" => t.linear_key_head_dim.into(),
                "linear_value_head_dim" => t.linear_value_head_dim.into(),
                "linear_conv_kernel_dim" => t.linear_conv_kernel_dim.into(),
                "full_attention_interval" => i64::try_from(t.full_attention_interval).unwrap_or(i64::MAX),
                "mtp_num_hidden_layers" => i64::try_from(t.mtp_num_hidden_layers).unwrap_or(i64::MAX),
                "max_position_embeddings" => t.max_position_embeddings?.into(),
                _ => return None,
            })
        };
        for &(field, lo, hi) in RANGES {
            if let Some(v) = value(field).filter(|v| !(lo..=hi).contains(v)) {
                return Err(LoadError::Config(format!("`{field}` is {v}, outside {lo}..={hi}")));
            }
        }
        let positive = |field: &str, v: Option<f32>| match v {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                Err(LoadError::Config(format!("`{field}` is {x}, not a positive number")))
            }
            _ => Ok(()),
        };
        positive("rms_norm_eps", Some(t.rms_norm_eps))?;
        positive("rope_theta", t.rope_parameters.as_ref().map(|r| r.rope_theta).or(t.rope_theta))?;
        let partial = t.rope_parameters.as_ref().map(|r| r.partial_rotary_factor).or(t.partial_rotary_factor);
        if let Some(p) = partial.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(LoadError::Config(format!("`partial_rotary_factor` is {p}, outside (0, 1]")));
        }
        Ok(())
    }
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
        text.check_ranges()?;
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

    pub(crate) fn key_dim(&self) -> i32 {
        self.text.linear_num_key_heads * self.text.linear_key_head_dim
    }
    pub(crate) fn value_dim(&self) -> i32 {
        self.text.linear_num_value_heads * self.text.linear_value_head_dim
    }
    pub(crate) fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }

    /// The input width of a linear module of this family (a packed weight does not show it).
    pub fn linear_in(&self, kind: LinearKind) -> i32 {
        let t = &self.text;
        match kind {
            LinearKind::AttnO => t.num_attention_heads * t.head_dim,
            LinearKind::GdnOut => t.linear_num_value_heads * t.linear_value_head_dim,
            LinearKind::MlpDown => t.intermediate_size,
            LinearKind::MtpFc => 2 * t.hidden_size,
            _ => t.hidden_size,
        }
    }
}
