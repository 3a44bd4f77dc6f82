//! Bad inputs to loading and generation, each a clear error naming the problem; and quantized
//! models' logits against their bf16 source, with a bound per bit width.

use std::process::Command;

use crate::common::*;
use mlx::{Array, Dtype};
use tandem::generate::{generate, Control, GenerateError, GenerateOptions};
use tandem::model::{self, LoadOptions};
use tandem::quant::{self, ConvertOptions};

/// Rewrites `model.safetensors` of `dir` with a Python snippet (`w` is the dict of arrays).
fn edit_weights(dir: &std::path::Path, code: &str) {
    let f = dir.join("model.safetensors");
    let script = format!(
        "import mlx.core as mx\nw = mx.load({f:?})\n{code}\nmx.save_safetensors({f:?}, w)\n",
        f = f.to_str().unwrap()
    );
    let out = Command::new(python()).arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn load_err(dir: &std::path::Path) -> String {
    match model::load(dir, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_unexpected_and_misshaped_tensors_are_named() {
    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "7"]);
    edit_weights(dir.path(), "del w['model.language_model.layers.2.mlp.up_proj.weight']");
    let e = load_err(dir.path());
    assert!(e.contains("missing tensor") && e.contains("layers.2.mlp.up_proj.weight"), "{e}");

    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "7"]);
    edit_weights(dir.path(), "w['model.language_model.layers.0.extra.weight'] = mx.zeros((4,))");
    let e = load_err(dir.path());
    assert!(e.contains("unexpected") && e.contains("model.language_model.layers.0.extra.weight"), "{e}");

    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "7"]);
    edit_weights(dir.path(), "w['model.language_model.layers.3.self_attn.k_proj.weight'] = mx.zeros((8, 64))");
    let e = load_err(dir.path());
    assert!(
        e.contains("layers.3.self_attn.k_proj.weight") && e.contains("[8, 64]") && e.contains("expected [32, 64]"),
        "{e}"
    );
}

#[test]
fn truncated_files_unknown_types_and_missing_configs_are_refused() {
    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "8"]);
    let f = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len / 2).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("model.safetensors")
            && (e.contains("truncated") || e.contains("past the end") || e.contains("not a valid")),
        "{e}"
    );

    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "8"]);
    let cfg = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("\"qwen3_5\"", "\"llama9\"");
    std::fs::write(&cfg, text).unwrap();
    let e = load_err(dir.path());
    assert!(e.contains("unknown model_type `llama9`"), "{e}");

    std::fs::remove_file(&cfg).unwrap();
    let e = load_err(dir.path());
    assert!(e.contains("missing config.json"), "{e}");
    let e = load_err(&dir.path().join("nope"));
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn prompts_longer_than_the_context_are_refused() {
    let m = model::load(&tiny_model_dir(), &LoadOptions::default()).unwrap();
    let ctx = m.config.text.max_position_embeddings.unwrap() as usize;
    let prompt = vec![10u32; ctx - 5];
    let opts = GenerateOptions { max_tokens: 10, ..Default::default() };
    match generate(&m, &prompt, &opts, &mut |_| Control::Continue) {
        Err(GenerateError::ContextExceeded { prompt, max_tokens, context }) => {
            assert_eq!((prompt, max_tokens, context), (ctx - 5, 10, ctx));
        }
        other => panic!("expected ContextExceeded, got {:?}", other.map(|o| o.tokens)),
    }
    let e = generate(&m, &[], &opts, &mut |_| Control::Continue).unwrap_err();
    assert!(matches!(e, GenerateError::EmptyPrompt));
    let e = generate(&m, &[99_999], &opts, &mut |_| Control::Continue).unwrap_err();
    assert!(e.to_string().contains("99999"), "{e}");
}

/// Quantized conversions of the bundled model stay close to the bf16 source. Bounds on the relative
/// L2 error of the logits, per bit width: affine quantization's error per weight is up to one step
/// (range / (2^bits - 1)), so fewer bits cost more. Measured on this model: 8-bit 3.0%, 6-bit 4.0%,
/// 4-bit 12.0% (the 8-bit floor includes the conversion's bf16 rounding of the shifted norms and
/// bf16 compute); the bounds are twice those.
#[test]
fn quantized_logits_stay_close_to_bf16() {
    let ids: Vec<i32> = vec![1, 1113, 207, 63, 80, 275, 335, 268, 1173, 276, 268, 1249, 39, 2, 207, 1, 1118, 207];
    let logits = |dir: &std::path::Path| {
        let m = model::load(dir, &LoadOptions::default()).unwrap();
        let mut cache = m.make_cache();
        let h = m.forward(&Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap(), &mut cache).unwrap();
        m.logits(&h).unwrap().as_dtype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
    };
    let base = logits(&tiny_model_dir());
    let mut errs = vec![];
    for (bits, bound) in [(8u8, 0.06f32), (6, 0.08), (4, 0.25)] {
        let out = tempdir();
        let dst = out.path().join(format!("q{bits}"));
        let opts = ConvertOptions { bits: Some(bits), ..Default::default() };
        quant::convert(&tiny_model_dir(), &dst, &opts, &mut |_| quant::Control::Continue).unwrap();
        let e = rel_err(&logits(&dst), &base);
        assert!(e < bound, "{bits}-bit: relative logit error {e} over {bound}");
        eprintln!("{bits}-bit: relative logit error {e}");
        errs.push(e);
    }
    assert!(errs[0] < errs[1] && errs[1] < errs[2], "error must grow as bits shrink: {errs:?}");
}
