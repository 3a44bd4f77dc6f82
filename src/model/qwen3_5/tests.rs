//! The architecture's name mapping and tensor roles, against the spec.

use super::*;

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
        assert_eq!(sanitize(&key, Layout::Mlx), (name.to_string(), Provenance::Mlx), "{key}");
    }
    assert_eq!(mlx_key("embed_tokens.weight"), "language_model.model.embed_tokens.weight");
    assert_eq!(mlx_key("lm_head"), "language_model.lm_head");
    assert_eq!(mlx_key("mtp.layers.0.mlp.down_proj"), "language_model.mtp.layers.0.mlp.down_proj");
    assert_eq!(sanitize("mtp.norm.weight", Layout::Mlx).1, Provenance::Hf);
}
