//! The bug that started the project: MTP acceptance 0% on a bf16 model and 71.5% on an 8-bit
//! conversion of the same checkpoint. Here acceptance on the raw bf16 checkpoint, an 8-bit and a
//! 4-bit conversion, and an MLX conversion whose dropped head was re-attached from the raw
//! checkpoint must all be far from zero and close to each other, through the same code path.

use std::process::Command;

use crate::common::*;
use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, SamplingParams};
use tandem::model::{self, LoadOptions};
use tandem::quant::{self, ConvertOptions, MtpMode};

const PROMPT: [u32; 14] = [1, 1113, 207, 63, 80, 275, 335, 268, 1173, 276, 268, 1249, 39, 2];

fn acceptance(dir: &std::path::Path) -> f64 {
    let m = model::load(dir, &LoadOptions::default()).unwrap();
    assert!(m.has_mtp(), "{}: {:?}", dir.display(), m.mtp_status);
    let opts = GenerateOptions {
        max_tokens: 320,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: true, depth: 1, adaptive: false, exact_verify: false, ..Default::default() },
        ..Default::default()
    };
    let out = generate(&m, &PROMPT, &opts, &mut |_| Control::Continue).unwrap();
    // Lossless in every dtype: the same greedy tokens as decoding without MTP.
    let plain_opts = GenerateOptions { mtp: MtpOptions { enabled: false, ..opts.mtp.clone() }, ..opts.clone() };
    let plain = generate(&m, &PROMPT, &plain_opts, &mut |_| Control::Continue).unwrap();
    assert_eq!(out.tokens, plain.tokens, "{}: MTP changed the greedy output", dir.display());
    out.stats.spec.unwrap().acceptance
}

fn convert(dst: &std::path::Path, bits: Option<u8>, mtp: MtpMode) {
    let opts = ConvertOptions { bits, mtp, ..Default::default() };
    quant::convert(&tiny_model_dir(), dst, &opts, &mut |_| quant::Control::Continue).unwrap();
}

#[test]
fn acceptance_agrees_across_bf16_quantized_and_reattached_heads() {
    let tmp = tempdir();
    let bf16 = acceptance(&tiny_model_dir());
    let q8 = tmp.path().join("q8");
    convert(&q8, Some(8), MtpMode::Keep);
    let q4 = tmp.path().join("q4");
    convert(&q4, Some(4), MtpMode::Keep);
    let mlx_bf16 = tmp.path().join("mlx-bf16");
    convert(&mlx_bf16, None, MtpMode::Keep);

    // An MLX conversion that dropped the head (as mlx-lm does), with the raw head put back beside it.
    let grafted = tmp.path().join("grafted");
    convert(&grafted, None, MtpMode::Drop);
    let script = format!(
        "import mlx.core as mx, json\nw = mx.load({src:?})\nmx.save_safetensors({dst:?}, {{k: v for k, v in w.items() if k.startswith('mtp.')}})\n\
         c = json.load(open({cfg:?}))\nc['text_config']['mtp_num_hidden_layers'] = 1\njson.dump(c, open({cfg:?}, 'w'))\n",
        src = tiny_model_dir().join("model.safetensors").to_str().unwrap(),
        dst = grafted.join("mtp.safetensors").to_str().unwrap(),
        cfg = grafted.join("config.json").to_str().unwrap(),
    );
    let out = Command::new(python()).arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let results = [
        ("raw bf16", bf16),
        ("mlx bf16", acceptance(&mlx_bf16)),
        ("8-bit", acceptance(&q8)),
        ("4-bit", acceptance(&q4)),
        ("grafted raw head", acceptance(&grafted)),
    ];
    eprintln!("depth-1 acceptance: {results:?}");
    // The head accepts ~83% of its own model's greedy tokens (assets/models/tandem-tiny/README.md);
    // 0.6 is a floor far from the failure (0%). bf16 in either layout, 8-bit and the re-attached head
    // must agree within 0.1. 4-bit changes the model enough to move acceptance: it only has the floor.
    // Each model decodes its own greedy text, so acceptance also moves with the text: over 96 tokens 8-bit
    // measured 0.92, then 0.84 once the linear-attention layers' conv and gated norm went to f32 (issue 15),
    // then 0.76 with the CPU attention kernel (its text changed again), where a 512-token bench gives 8-bit
    // and bf16 the same 0.84. Hence 320 tokens (~170 draft decisions; measured 0.85 / 0.90 / 0.78 / 0.80 /
    // 0.90 in the order below) and 0.15 for 8-bit.
    for (name, a) in results {
        assert!(a > 0.6, "{name}: acceptance {a:.3} ({results:?})");
        let tolerance = if name == "8-bit" { 0.15 } else { 0.1 };
        if name != "4-bit" {
            assert!((a - bf16).abs() < tolerance, "{name}: acceptance {a:.3} vs raw bf16 {bf16:.3} ({results:?})");
        }
    }
}
