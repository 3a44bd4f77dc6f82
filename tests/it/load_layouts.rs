//! Checkpoints as real users have them, beyond the bundled raw VLM layout and Tandem's own
//! conversions: a raw text-only checkpoint as transformers' `Qwen3_5ForCausalLM` saves it (flat
//! `model.*` keys, config without `text_config`), sharded or not, with its MTP head inline or in an
//! `mtp.safetensors` sidecar; what `mlx_lm convert` writes; tied embeddings and a config whose two
//! levels disagree on tying; and the errors for broken shard sets and contradictory layouts.
//!
//! Each layout is compared with the same weights loaded through the bundled layout: identical
//! logits (the same arrays enter the same computation, so the tolerance is 0) and identical MTP
//! drafting. A wrong norm convention moves logits by O(1) and MTP acceptance to about 0.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use mlx::{Array, Dtype};
use serde_json::{json, Value};
use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, SamplingParams};
use tandem::model::{self, Layout, LoadOptions, Qwen35};
use tandem::quant::{self, ConvertOptions};

const PROMPT: [i32; 18] = [1, 1113, 207, 63, 80, 275, 335, 268, 1173, 276, 268, 1249, 39, 2, 207, 1, 1118, 207];

type Owned = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

fn read_all(file: &Path) -> Vec<Owned> {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<Owned> =
        st.tensors().into_iter().map(|(k, v)| (k, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes tensors with safetensors metadata `{"format": format}` (transformers writes "pt").
fn write_all(file: &Path, tensors: &[Owned], format: Option<&str>) {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(k, d, s, b)| (k.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = format.map(|f| [("format".to_string(), f.to_string())].into_iter().collect());
    safetensors::serialize_to_file(views, meta, file).unwrap();
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn write_json(p: &Path, v: &Value) {
    std::fs::write(p, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

/// The config transformers writes for the text-only class: `text_config` flattened to the top.
fn text_only_config(src: &Value) -> Value {
    let mut c = src["text_config"].clone();
    c["model_type"] = json!("qwen3_5_text");
    c["architectures"] = json!(["Qwen3_5ForCausalLM"]);
    if c.get("tie_word_embeddings").is_none() {
        c["tie_word_embeddings"] = src["tie_word_embeddings"].clone();
    }
    c
}

/// How the text-only copy stores its tensors.
struct TextOnly {
    /// Prefix of the head's keys (`mtp.` as in real checkpoints, or `model.mtp.`).
    head: &'static str,
    /// Safetensors metadata format.
    format: Option<&'static str>,
    /// Split the body into two shards with an index, the head into an `mtp.safetensors` sidecar.
    sharded: bool,
}

/// A raw text-only checkpoint made from the raw VLM-layout checkpoint in `src`: keys
/// `model.language_model.*` become `model.*`, `lm_head.weight` and `mtp.*` stay top-level.
fn make_text_only(src: &Path, dst: &Path, how: &TextOnly) {
    std::fs::create_dir_all(dst).unwrap();
    let mut body = Vec::new();
    let mut head = Vec::new();
    for (k, d, s, b) in read_all(&src.join("model.safetensors")) {
        if let Some(rest) = k.strip_prefix("model.language_model.") {
            body.push((format!("model.{rest}"), d, s, b));
        } else if let Some(rest) = k.strip_prefix("mtp.") {
            head.push((format!("{}{rest}", how.head), d, s, b));
        } else {
            assert_eq!(k, "lm_head.weight", "unexpected key in the source");
            body.push((k, d, s, b));
        }
    }
    if how.sharded {
        let half = body.len() / 2;
        let mut map = serde_json::Map::new();
        for (i, part) in [&body[..half], &body[half..]].into_iter().enumerate() {
            let file = format!("model-{:05}-of-00002.safetensors", i + 1);
            write_all(&dst.join(&file), part, how.format);
            for t in part {
                map.insert(t.0.clone(), json!(file));
            }
        }
        write_json(
            &dst.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": 0}, "weight_map": map}),
        );
        if !head.is_empty() {
            write_all(&dst.join("mtp.safetensors"), &head, how.format);
        }
    } else {
        body.extend(head);
        write_all(&dst.join("model.safetensors"), &body, how.format);
    }
    write_json(&dst.join("config.json"), &text_only_config(&read_json(&src.join("config.json"))));
}

fn load(dir: &Path) -> Qwen35 {
    model::load(dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("load {}: {e}", dir.display()))
}

fn load_err(dir: &Path) -> String {
    match model::load(dir, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn logits(m: &Qwen35) -> Vec<f32> {
    let ids: Vec<i32> = PROMPT.iter().map(|&t| t % m.config.text.vocab_size).collect();
    let mut cache = m.make_cache();
    let h = m.forward(&Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap(), &mut cache).unwrap();
    m.logits(&h).unwrap().as_dtype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Greedy tokens with MTP at depth 3, and (drafted, accepted).
fn mtp_run(m: &Qwen35) -> (Vec<u32>, usize, usize) {
    let prompt: Vec<u32> = PROMPT[..14].iter().map(|&t| t as u32).collect();
    let opts = GenerateOptions {
        max_tokens: 48,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: true, depth: 3, adaptive: false, exact_verify: false, ..Default::default() },
        ..Default::default()
    };
    let out = generate(m, &prompt, &opts, &mut |_| Control::Continue).unwrap();
    let spec = out.stats.spec.expect("MTP ran");
    (out.tokens, spec.drafted, spec.accepted)
}

#[test]
fn raw_text_only_checkpoints_compute_exactly_like_the_bundled_model() {
    let base = load(&tiny_model_dir());
    assert_eq!(base.layout, Layout::Hf);
    let want = logits(&base);
    let want_mtp = mtp_run(&base);
    assert!(want_mtp.2 * 2 > want_mtp.1, "the bundled head drafts well: {want_mtp:?}");
    let tmp = tempdir();
    for (name, how) in [
        // As transformers' Qwen3_5ForCausalLM.save_pretrained writes it (plus the head).
        ("single file, format pt", TextOnly { head: "mtp.", format: Some("pt"), sharded: false }),
        // As `mx.save_safetensors` writes (no metadata), sharded, head in a sidecar: the conv1d
        // layout alone says raw.
        ("sharded, no metadata, mtp.safetensors", TextOnly { head: "mtp.", format: None, sharded: true }),
        // Head under the text model's prefix, as some exporters write it.
        ("model.mtp.* head", TextOnly { head: "model.mtp.", format: Some("pt"), sharded: false }),
    ] {
        let dir = tmp.path().join(name.replace([' ', ',', '*'], "_"));
        make_text_only(&tiny_model_dir(), &dir, &how);
        let m = load(&dir);
        assert_eq!(m.layout, Layout::Hf, "{name}");
        assert!(!m.config.has_vision, "{name}");
        assert!(m.has_mtp() && m.mtp_status.repaired.is_none(), "{name}: {:?}", m.mtp_status);
        let got = logits(&m);
        let e = max_abs(&got, &want);
        assert!(e == 0.0, "{name}: logits differ from the bundled model's by up to {e}");
        assert_eq!(mtp_run(&m), want_mtp, "{name}: MTP drafting differs");
        let r = quant::inspect(&dir).unwrap_or_else(|e| panic!("inspect {name}: {e}"));
        assert_eq!((r.format, r.mtp.verdict), (Layout::Hf, quant::Verdict::Ok), "{name}: {}", r.mtp.message);
    }
    // Converting the text-only checkpoint gives the same model as converting the bundled one.
    let text_only = tmp.path().join("single_file__format_pt");
    for (src, dst) in
        [(&text_only, tmp.path().join("from-text-only")), (&tiny_model_dir(), tmp.path().join("from-bundled"))]
    {
        quant::convert(src, &dst, &ConvertOptions { bits: Some(8), ..Default::default() }, &mut |_| {
            quant::Control::Continue
        })
        .unwrap();
    }
    let (a, b) = (load(&tmp.path().join("from-text-only")), load(&tmp.path().join("from-bundled")));
    assert!(a.has_mtp() && b.has_mtp());
    let ours = logits(&a);
    assert_eq!(max_abs(&ours, &logits(&b)), 0.0, "8-bit conversions of the two layouts differ");
    // mlx-lm loads the conversion of the text-only checkpoint (it knows no `qwen3_5_text`, so the
    // converter writes a flat `qwen3_5` config) exactly as the conversion of the bundled one: the
    // tensors are the same, only the config's nesting differs.
    assert_eq!(read_json(&tmp.path().join("from-text-only/config.json"))["model_type"], "qwen3_5");
    let ids: Vec<String> = PROMPT.iter().map(|t| t.to_string()).collect();
    let mlx_lm_logits = |name: &str| {
        let (dir, out) = (tmp.path().join(name), tmp.path().join(format!("{name}.logits.safetensors")));
        let mut args = vec!["logits", dir.to_str().unwrap(), out.to_str().unwrap()];
        args.extend(ids.iter().map(|s| s.as_str()));
        mlx_lm_ref(&args);
        read_f32(&out, "logits").0
    };
    let theirs = mlx_lm_logits("from-text-only");
    assert_eq!(max_abs(&theirs, &mlx_lm_logits("from-bundled")), 0.0, "mlx-lm reads the two conversions differently");
    // ... and close to Tandem's (bf16 compute in a different order; measured 3.1% on 8-bit weights).
    let e = rel_err(&ours, &theirs);
    assert!(e < 0.06, "mlx-lm's logits differ from Tandem's by {e}");
}

#[test]
fn mlx_lm_conversions_load_like_tandems_own() {
    // What `python -m mlx_lm convert` writes for qwen3_5: `language_model.model.*` and
    // `language_model.lm_head.weight`, conv1d [C, K, 1], norms shifted in bf16, metadata
    // {"format": "mlx"}, an index, and no MTP head although config.json still declares one.
    // Tandem's converter writes the same bytes for every tensor mlx-lm writes (tests/it/convert.rs),
    // so Tandem must compute exactly the same logits from either.
    let tmp = tempdir();
    let src = tmp.path().join("src");
    copy_dir(&tiny_model_dir(), &src);
    for (name, args, bits) in
        [("bf16", vec![], None), ("4-bit", vec!["-q", "--q-bits", "4", "--q-group-size", "64"], Some(4u8))]
    {
        let theirs = tmp.path().join(format!("mlx-lm-{name}"));
        let out = Command::new(python())
            .args([
                "-m",
                "mlx_lm",
                "convert",
                "--hf-path",
                src.to_str().unwrap(),
                "--mlx-path",
                theirs.to_str().unwrap(),
            ])
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "mlx_lm convert {name}: {}", String::from_utf8_lossy(&out.stderr));
        let ours = tmp.path().join(format!("tandem-{name}"));
        quant::convert(&src, &ours, &ConvertOptions { bits, ..Default::default() }, &mut |_| quant::Control::Continue)
            .unwrap();

        let m = load(&theirs);
        assert_eq!(m.layout, Layout::Mlx, "{name}");
        assert!(!m.has_mtp(), "{name}");
        let reason = m.mtp_status.reason.clone().unwrap_or_default();
        assert!(reason.contains("lacks 15 of its 15 tensors"), "{name}: {reason}");
        let e = max_abs(&logits(&m), &logits(&load(&ours)));
        assert!(e == 0.0, "{name}: Tandem's logits on mlx-lm's conversion differ from those on its own by up to {e}");
        let r = quant::inspect(&theirs).unwrap();
        assert_eq!((r.format, r.mtp.verdict), (Layout::Mlx, quant::Verdict::Missing), "{name}");
    }
}

#[test]
fn tied_text_only_and_disagreeing_tie_flags_follow_the_checkpoint() {
    let src = tempdir();
    random_hf_model(src.path(), &["--seed", "31", "--tied"]);
    let want = logits(&load(src.path()));
    let tmp = tempdir();

    // Tied, text-only: no lm_head.weight (transformers drops tied copies when saving).
    let dir = tmp.path().join("tied-text-only");
    make_text_only(src.path(), &dir, &TextOnly { head: "mtp.", format: Some("pt"), sharded: false });
    let m = load(&dir);
    assert!(m.config.tie_word_embeddings && m.has_mtp());
    assert_eq!(max_abs(&logits(&m), &want), 0.0);

    // text_config says untied, the top level tied, and there is no lm_head: tied (transformers
    // reads the top level). Before, this failed with "missing tensor `lm_head.weight`".
    let dir = tmp.path().join("tie-conflict");
    copy_dir(src.path(), &dir);
    let mut c = read_json(&dir.join("config.json"));
    c["tie_word_embeddings"] = json!(true);
    c["text_config"]["tie_word_embeddings"] = json!(false);
    write_json(&dir.join("config.json"), &c);
    let m = load(&dir);
    assert!(m.config.tie_word_embeddings);
    assert_eq!(max_abs(&logits(&m), &want), 0.0);
    let out = tmp.path().join("tie-conflict-q8");
    quant::convert(&dir, &out, &ConvertOptions { bits: Some(8), ..Default::default() }, &mut |_| {
        quant::Control::Continue
    })
    .unwrap();
    assert!(load(&out).config.tie_word_embeddings);
    let c = read_json(&out.join("config.json"));
    assert_eq!(
        (&c["tie_word_embeddings"], &c["text_config"]["tie_word_embeddings"]),
        (&json!(true), &json!(true)),
        "one answer in the written config"
    );
}

#[test]
fn broken_shard_sets_and_contradictory_layouts_are_named() {
    let tmp = tempdir();
    let sharded = tmp.path().join("sharded");
    make_text_only(&tiny_model_dir(), &sharded, &TextOnly { head: "mtp.", format: Some("pt"), sharded: true });

    // A shard listed by the index is missing (an interrupted download).
    let dir = tmp.path().join("missing-shard");
    copy_dir(&sharded, &dir);
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("model.safetensors.index.json")
            && e.contains("model-00002-of-00002.safetensors")
            && e.contains("missing"),
        "{e}"
    );
    assert!(e.contains("tensor(s), e.g. `model."), "{e}");

    // A shard that does not hold what the index says it holds.
    let dir = tmp.path().join("stale-shard");
    copy_dir(&sharded, &dir);
    let shard = dir.join("model-00001-of-00002.safetensors");
    let mut tensors = read_all(&shard);
    let dropped = tensors.remove(0).0;
    write_all(&shard, &tensors, Some("pt"));
    let e = load_err(&dir);
    assert!(e.contains("model-00001-of-00002.safetensors") && e.contains(&format!("`{dropped}`")), "{e}");

    // An index that points outside the model folder.
    let dir = tmp.path().join("escaping-index");
    copy_dir(&sharded, &dir);
    let mut index = read_json(&dir.join("model.safetensors.index.json"));
    index["weight_map"]["model.norm.weight"] = json!("../elsewhere.safetensors");
    write_json(&dir.join("model.safetensors.index.json"), &index);
    let e = load_err(&dir);
    assert!(e.contains("model.norm.weight") && e.contains("../elsewhere.safetensors"), "{e}");

    // One layer's conv1d in raw layout, another's in MLX layout: the norm convention cannot be told.
    let dir = tmp.path().join("mixed-conv");
    std::fs::create_dir_all(&dir).unwrap();
    let mut tensors = read_all(&tiny_model_dir().join("model.safetensors"));
    let key = "model.language_model.layers.4.linear_attn.conv1d.weight";
    let t = tensors.iter_mut().find(|t| t.0 == key).unwrap();
    t.2 = vec![t.2[0], t.2[2], t.2[1]];
    write_all(&dir.join("model.safetensors"), &tensors, None);
    std::fs::copy(tiny_model_dir().join("config.json"), dir.join("config.json")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("layers.0.linear_attn.conv1d.weight") && e.contains(key) && e.contains("[512, 4, 1]"), "{e}");

    // MLX names on raw tensors (a renamed raw checkpoint): refused, not run with the wrong norms.
    let dir = tmp.path().join("renamed");
    std::fs::create_dir_all(&dir).unwrap();
    let tensors: Vec<Owned> = read_all(&tiny_model_dir().join("model.safetensors"))
        .into_iter()
        .map(|(k, d, s, b)| (k.replace("model.language_model.", "language_model.model."), d, s, b))
        .collect();
    write_all(&dir.join("model.safetensors"), &tensors, None);
    std::fs::copy(tiny_model_dir().join("config.json"), dir.join("config.json")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("conv1d.weight") && e.contains("[512, 1, 4]") && e.contains("language_model.model."), "{e}");
}
