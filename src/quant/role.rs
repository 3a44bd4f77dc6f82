//! What each tensor of a Qwen3.5 checkpoint is, by name: which are linear layers that may be
//! quantized, which norms are zero-centred in raw checkpoints, and what they are called in the MLX
//! layout. Names here are the loader's canonical names (`layers.3.mlp.down_proj.weight`, `lm_head.*`,
//! `mtp.*`, `visual.*`); see `model/store.rs`.

use crate::model::qwen3_5::MTP_NORMS;

/// Maps a stored key to (canonical name, provenance): the loader's own rules.
pub use crate::model::store::canonical;

/// The key a canonical name gets in the MLX layout that mlx-lm and mlx-vlm load.
pub fn mlx_key(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("visual.") {
        format!("vision_tower.{rest}")
    } else if name == "lm_head" || name.starts_with("lm_head.") || name.starts_with("mtp.") {
        format!("language_model.{name}")
    } else {
        format!("language_model.model.{name}")
    }
}

/// The module path mlx-lm uses for a canonical module name (for per-module quantization entries).
pub fn mlx_module_path(module: &str) -> String {
    mlx_key(module)
}

/// Which family a quantizable linear belongs to (for recipes and reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinearKind {
    Embedding,
    LmHead,
    AttnQ,
    AttnK,
    AttnV,
    AttnO,
    /// Gated DeltaNet's fused q|k|v input projection (it holds the value projection).
    GdnQkv,
    GdnZ,
    GdnB,
    GdnA,
    GdnOut,
    MlpGate,
    MlpUp,
    MlpDown,
    /// `mtp.fc`: the head's fusion projection, always kept in full precision.
    MtpFc,
}

impl LinearKind {
    /// The module group `inspect` reports.
    pub fn group(self) -> &'static str {
        match self {
            LinearKind::Embedding => "embed_tokens",
            LinearKind::LmHead => "lm_head",
            LinearKind::AttnQ | LinearKind::AttnK | LinearKind::AttnV | LinearKind::AttnO => "self_attn",
            LinearKind::GdnQkv | LinearKind::GdnZ | LinearKind::GdnB | LinearKind::GdnA | LinearKind::GdnOut => {
                "linear_attn"
            }
            LinearKind::MlpGate | LinearKind::MlpUp | LinearKind::MlpDown => "mlp",
            LinearKind::MtpFc => "mtp",
        }
    }
}

/// What a tensor is, which decides how it is converted.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// The weight `[out, in]` of a linear layer or embedding whose module is `module`.
    Linear { module: String, kind: LinearKind },
    /// A zero-centred RMSNorm weight in raw checkpoints (`1 + w` is the scale).
    ZeroCentredNorm,
    /// Gated DeltaNet's depthwise conv weight (`[C,1,K]` raw, `[C,K,1]` MLX).
    Conv1d,
    /// Gated DeltaNet's `A_log`, kept in float32.
    ALog,
    /// A vision-tower tensor, kept as it is (cast to the dtype only).
    Vision,
    /// Anything else (biases, `dt_bias`, the gated norm): cast to the dtype.
    Other,
}

const LINEARS: &[(&str, LinearKind)] = &[
    ("self_attn.q_proj", LinearKind::AttnQ),
    ("self_attn.k_proj", LinearKind::AttnK),
    ("self_attn.v_proj", LinearKind::AttnV),
    ("self_attn.o_proj", LinearKind::AttnO),
    ("linear_attn.in_proj_qkv", LinearKind::GdnQkv),
    ("linear_attn.in_proj_z", LinearKind::GdnZ),
    ("linear_attn.in_proj_b", LinearKind::GdnB),
    ("linear_attn.in_proj_a", LinearKind::GdnA),
    ("linear_attn.out_proj", LinearKind::GdnOut),
    ("mlp.gate_proj", LinearKind::MlpGate),
    ("mlp.up_proj", LinearKind::MlpUp),
    ("mlp.down_proj", LinearKind::MlpDown),
];

const ZERO_CENTRED_SUFFIXES: &[&str] = &[
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
];

/// Classifies a canonical tensor name.
pub fn role(name: &str) -> Role {
    if name.starts_with("visual.") {
        return Role::Vision;
    }
    match name {
        "embed_tokens.weight" => return Role::Linear { module: "embed_tokens".into(), kind: LinearKind::Embedding },
        "lm_head.weight" => return Role::Linear { module: "lm_head".into(), kind: LinearKind::LmHead },
        "mtp.fc.weight" => return Role::Linear { module: "mtp.fc".into(), kind: LinearKind::MtpFc },
        "norm.weight" => return Role::ZeroCentredNorm,
        _ => {}
    }
    if let Some(short) = name.strip_prefix("mtp.") {
        if MTP_NORMS.contains(&short) {
            return Role::ZeroCentredNorm;
        }
    }
    // `layers.{i}.…` or `mtp.layers.{i}.…`
    let in_layer = name.strip_prefix("mtp.").unwrap_or(name);
    if let Some(rest) = in_layer.strip_prefix("layers.") {
        let Some((idx, tail)) = rest.split_once('.') else { return Role::Other };
        if idx.parse::<usize>().is_err() {
            return Role::Other;
        }
        if ZERO_CENTRED_SUFFIXES.contains(&tail) {
            return Role::ZeroCentredNorm;
        }
        if tail == "linear_attn.conv1d.weight" {
            return Role::Conv1d;
        }
        if tail == "linear_attn.A_log" {
            return Role::ALog;
        }
        if let Some(module) = tail.strip_suffix(".weight") {
            if let Some((_, kind)) = LINEARS.iter().find(|(m, _)| *m == module) {
                let module = name.strip_suffix(".weight").unwrap_or(name).to_string();
                return Role::Linear { module, kind: *kind };
            }
        }
    }
    Role::Other
}

/// The decoder layer a canonical name belongs to (None for the MTP head and global tensors).
pub fn layer_index(name: &str) -> Option<usize> {
    name.strip_prefix("layers.")?.split_once('.')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::store::Provenance;
    use crate::model::Layout;

    #[test]
    fn roles_follow_the_spec() {
        assert_eq!(role("norm.weight"), Role::ZeroCentredNorm);
        assert_eq!(role("layers.0.linear_attn.norm.weight"), Role::Other, "the gated norm is never shifted");
        assert_eq!(role("layers.3.self_attn.q_norm.weight"), Role::ZeroCentredNorm);
        assert_eq!(role("mtp.pre_fc_norm_hidden.weight"), Role::ZeroCentredNorm);
        assert_eq!(role("mtp.norm.weight"), Role::ZeroCentredNorm);
        assert_eq!(role("mtp.layers.0.self_attn.k_norm.weight"), Role::ZeroCentredNorm);
        assert_eq!(role("visual.blocks.0.norm1.weight"), Role::Vision);
        assert_eq!(role("layers.0.linear_attn.conv1d.weight"), Role::Conv1d);
        assert_eq!(role("layers.0.linear_attn.A_log"), Role::ALog);
        assert_eq!(role("layers.0.linear_attn.dt_bias"), Role::Other);
        assert_eq!(
            role("mtp.layers.0.mlp.down_proj.weight"),
            Role::Linear { module: "mtp.layers.0.mlp.down_proj".into(), kind: LinearKind::MlpDown }
        );
        assert_eq!(role("mtp.fc.weight"), Role::Linear { module: "mtp.fc".into(), kind: LinearKind::MtpFc });
        assert_eq!(layer_index("layers.12.mlp.up_proj.weight"), Some(12));
        assert_eq!(layer_index("mtp.layers.0.mlp.up_proj.weight"), None);
    }

    #[test]
    fn keys_round_trip_through_the_mlx_layout() {
        for name in [
            "layers.1.mlp.up_proj.weight",
            "lm_head.weight",
            "mtp.fc.weight",
            "visual.blocks.0.attn.qkv.bias",
            "norm.weight",
        ] {
            let key = mlx_key(name);
            assert_eq!(canonical(&key, Layout::Mlx), (name.to_string(), Provenance::Mlx), "{key}");
        }
        assert_eq!(mlx_key("embed_tokens.weight"), "language_model.model.embed_tokens.weight");
        assert_eq!(mlx_module_path("lm_head"), "language_model.lm_head");
        assert_eq!(mlx_module_path("mtp.layers.0.mlp.down_proj"), "language_model.mtp.layers.0.mlp.down_proj");
        assert_eq!(canonical("mtp.norm.weight", Layout::Mlx).1, Provenance::Hf);
    }
}
