//! The architecture's name mapping and tensor roles, against the spec.

use super::*;
use serde_json::json;

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

/// The bundled model's config with `text_config.FIELD` replaced (or removed when `value` is null).
fn tiny_config_with(edits: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(include_str!("../../../assets/models/tandem-tiny/config.json")).unwrap();
    for (field, value) in edits {
        let text = v["text_config"].as_object_mut().unwrap();
        if value.is_null() {
            text.remove(*field);
        } else {
            text.insert(field.to_string(), value.clone());
        }
    }
    v
}

#[test]
fn config_sizes_outside_sane_ranges_are_refused_naming_field_and_value() {
    assert!(Config::from_json(&tiny_config_with(&[])).is_ok());
    // Without layer_types, 2^31-1 layers would build a 2 GB per-layer table before any error.
    let huge = tiny_config_with(&[("num_hidden_layers", (i32::MAX as u64).into()), ("layer_types", json!(null))]);
    let t0 = std::time::Instant::now();
    let e = Config::from_json(&huge).unwrap_err().to_string();
    assert!(e.contains("num_hidden_layers") && e.contains("2147483647"), "{e}");
    assert!(t0.elapsed().as_secs_f64() < 1.0, "refused before building anything");
    for (field, value) in [
        ("hidden_size", json!(0)),
        ("hidden_size", json!(1 << 30)),
        ("intermediate_size", json!(-4)),
        ("vocab_size", json!(i32::MAX)),
        ("num_attention_heads", json!(100_000)),
        ("num_key_value_heads", json!(0)),
        ("head_dim", json!(1 << 20)),
        ("linear_num_value_heads", json!(-1)),
        ("linear_key_head_dim", json!(0)),
        ("max_position_embeddings", json!(i32::MAX)),
        ("mtp_num_hidden_layers", json!(1u64 << 40)),
    ] {
        let e = Config::from_json(&tiny_config_with(&[(field, value.clone())])).unwrap_err().to_string();
        assert!(e.contains(&format!("`{field}` is {value}")), "{field} = {value}: {e}");
    }
    let e = Config::from_json(&tiny_config_with(&[("rms_norm_eps", json!(-1.0))])).unwrap_err().to_string();
    assert!(e.contains("rms_norm_eps"), "{e}");
    let e = Config::from_json(&tiny_config_with(&[("num_hidden_layers", json!(9))])).unwrap_err().to_string();
    assert!(e.contains("layer_types has 8 entries for 9 layers"), "{e}");
}
