//! `tandem::quant::convert` on random tiny Qwen3.5 checkpoints with an MTP head (made by
//! tests/reference/mlx_lm_ref.py): bit-exact quantization against Python's `mx.quantize`, mlx-lm
//! loading every output and generating Tandem's greedy tokens, the MTP head surviving conversion,
//! dropping it, `auto`, and the safety rules (cancel, existing destination, corrupt input, the
//! source never touched).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::common::*;
use mlx::Array;
use tandem::generate::{generate, Control as GenControl, GenerateOptions, MtpOptions, SamplingParams};
use tandem::model::{self, LoadOptions};
use tandem::quant::{
    self, Control, ConvertError, ConvertEvent, ConvertOptions, ConvertReport, MtpBits, MtpMode, Recipe,
};

const PROMPT: [u32; 10] = [3, 17, 99, 4, 250, 8, 8, 61, 120, 7];
const GEN: usize = 16;

fn source(seed: &str, extra: &[&str]) -> tempfile::TempDir {
    let dir = tempdir();
    let mut args = vec!["--seed", seed];
    args.extend_from_slice(extra);
    random_hf_model(dir.path(), &args);
    // A few side files that must be copied.
    std::fs::write(dir.path().join("generation_config.json"), "{\"eos_token_id\": 1}\n").unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages }}\n").unwrap();
    dir
}

/// A random checkpoint whose layers only nudge the residual stream (see `tame` in convert_ref.py):
/// two engines' rounding differences then stay below the margins of the greedy choices.
fn tame_source(seed: &str, extra: &[&str]) -> tempfile::TempDir {
    let dir = source(seed, extra);
    convert_ref(&["tame", dir.path().to_str().unwrap(), "0.1"]);
    dir
}

fn run(src: &Path, dst: &Path, opts: &ConvertOptions) -> (ConvertReport, Vec<ConvertEvent>) {
    let mut events = Vec::new();
    let report = quant::convert(src, dst, opts, &mut |e| {
        events.push(e.clone());
        Control::Continue
    })
    .unwrap_or_else(|e| panic!("convert {} -> {}: {e}", src.display(), dst.display()));
    (report, events)
}

/// A content hash of every file under `dir` (names and bytes).
fn hash_dir(dir: &Path) -> BTreeMap<PathBuf, u64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::fs::read(&p).unwrap().hash(&mut h);
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), h.finish());
            }
        }
    }
    out
}

fn tandem_greedy(dir: &Path) -> Vec<u32> {
    let m = model::load(dir, &LoadOptions::default()).unwrap();
    let opts = GenerateOptions {
        max_tokens: GEN,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: false, ..Default::default() },
        ..Default::default()
    };
    generate(&m, &PROMPT, &opts, &mut |_| GenControl::Continue).unwrap().tokens
}

/// mlx-lm's greedy tokens and each step's log-probabilities.
fn mlx_lm_greedy(dir: &Path) -> (Vec<u32>, Vec<Vec<f32>>) {
    let out = tempdir();
    let file = out.path().join("gen.json");
    let ids: Vec<String> = PROMPT.iter().map(|i| i.to_string()).collect();
    let n = GEN.to_string();
    let mut args = vec!["greedy", dir.to_str().unwrap(), file.to_str().unwrap(), n.as_str()];
    args.extend(ids.iter().map(|s| s.as_str()));
    convert_ref(&args);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    (serde_json::from_value(v["tokens"].clone()).unwrap(), serde_json::from_value(v["logprobs"].clone()).unwrap())
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
    x.iter().map(|v| v - lse).collect()
}

fn argmax(x: &[f32]) -> usize {
    x.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i)
}

/// Both engines decode the converted model greedily. Two engines round differently in bf16, so
/// where mlx-lm's top two tokens are closer than the engines' disagreement, either choice is right.
/// Tandem is therefore run teacher-forced on mlx-lm's tokens, and at every step whose margin exceeds
/// twice the largest log-probability difference between the engines at that step (no rounding of
/// that size can flip it) its argmax must be mlx-lm's token. When every step is decisive, plain
/// `generate` must produce mlx-lm's sequence exactly. Returns (decisive steps, largest difference).
fn assert_greedy_agrees(dir: &Path, what: &str) -> (usize, f32) {
    let (theirs, lps) = mlx_lm_greedy(dir);
    assert_eq!(theirs.len(), GEN, "{what}");
    let m = model::load(dir, &LoadOptions::default()).unwrap();
    let mut cache = m.make_cache();
    let mut input: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
    let (mut decisive, mut worst) = (0, 0f32);
    for (step, (&tok, lp)) in theirs.iter().zip(&lps).enumerate() {
        let h = m.forward(&Array::from_slice(&input, &[1, input.len() as i32]).unwrap(), &mut cache).unwrap();
        let t = h.dim(1);
        let logits = m.logits(&h.slice_axis(1, t - 1, t).unwrap()).unwrap().to_f32_vec().unwrap();
        let ours = log_softmax(&logits);
        let diff = ours.iter().zip(lp).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let mut sorted = lp.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let margin = sorted[0] - sorted[1];
        worst = worst.max(diff);
        if margin > 2.0 * diff {
            decisive += 1;
            assert_eq!(
                argmax(&ours) as u32,
                tok,
                "{what}: step {step}: Tandem's greedy token differs from mlx-lm's (margin {margin}, difference {diff})"
            );
        }
        input = vec![tok as i32];
    }
    let plain = tandem_greedy(dir);
    if decisive == GEN {
        assert_eq!(plain, theirs, "{what}: Tandem's generate differs from mlx-lm");
    }
    (decisive, worst)
}

fn convert_ref(args: &[&str]) {
    let out = std::process::Command::new(python())
        .arg(repo().join("tests/reference/convert_ref.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "convert_ref {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn index_keys(dir: &Path) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    v["weight_map"].as_object().unwrap().keys().cloned().collect()
}

/// Reads one tensor's raw bytes from whichever shard of `dir` holds it.
fn tensor_bytes(dir: &Path, key: &str) -> (Vec<u8>, Vec<usize>, String) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    let file = dir.join(v["weight_map"][key].as_str().unwrap_or_else(|| panic!("no {key} in the index")));
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(key).unwrap();
    (t.data().to_vec(), t.shape().to_vec(), format!("{:?}", t.dtype()))
}

#[test]
fn quantized_tensors_are_bit_identical_to_mx_quantize() {
    let src = source("11", &[]);
    let keys = [
        "model.language_model.embed_tokens.weight",
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.language_model.layers.0.linear_attn.in_proj_b.weight",
        "model.language_model.layers.3.self_attn.q_proj.weight",
        "model.language_model.layers.5.mlp.down_proj.weight",
        "lm_head.weight",
        "mtp.layers.0.self_attn.o_proj.weight",
        "mtp.layers.0.mlp.down_proj.weight",
    ];
    for (bits, group, dtype) in [(4u8, 64u32, "bfloat16"), (3, 32, "bfloat16"), (6, 128, "float16"), (8, 64, "float16")]
    {
        let out = tempdir();
        let dst = out.path().join("q");
        let opts =
            ConvertOptions { bits: Some(bits), group_size: group, dtype: dtype.parse().unwrap(), ..Default::default() };
        run(src.path(), &dst, &opts);
        // Layers whose input width (64) the group size does not divide stay dense (mlx-lm's rule).
        let quantizable: Vec<&str> = keys.iter().copied().filter(|k| group != 128 || k.contains("down_proj")).collect();
        let reference = out.path().join("ref.safetensors");
        let mut args = vec!["quantize", src.path().to_str().unwrap(), reference.to_str().unwrap(), dtype];
        let (g, b) = (group.to_string(), bits.to_string());
        args.push(&g);
        args.push(&b);
        args.extend(quantizable.iter().copied());
        convert_ref(&args);
        let want_file = std::fs::read(&reference).unwrap();
        let want = safetensors::SafeTensors::deserialize(&want_file).unwrap();
        for key in &quantizable {
            let canonical = key.trim_start_matches("model.language_model.");
            let module = tandem::model::qwen3_5::mlx_key(canonical);
            let module = module.trim_end_matches(".weight");
            for (ours, theirs) in [("weight", "q"), ("scales", "scales"), ("biases", "biases")] {
                let (got, shape, _) = tensor_bytes(&dst, &format!("{module}.{ours}"));
                let w = want.tensor(&format!("{key}.{theirs}")).unwrap();
                assert_eq!(shape, w.shape(), "{module}.{ours} shape ({bits} bits, group {group})");
                assert!(
                    got == w.data(),
                    "{module}.{ours} differs from mx.quantize ({bits} bits, group {group}, {dtype})"
                );
            }
        }
        if group == 128 {
            let keys = index_keys(&dst);
            assert!(keys.contains(&"language_model.model.layers.0.linear_attn.in_proj_qkv.weight".to_string()));
            assert!(
                !keys.iter().any(|k| k.ends_with("in_proj_qkv.scales")),
                "a 64-wide input cannot take groups of 128"
            );
        }
    }
}

/// Every tensor of a safetensors folder: key -> (dtype, shape, bytes).
fn all_tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let bytes = std::fs::read(&p).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for (k, v) in st.tensors() {
                out.insert(k, (format!("{:?}", v.dtype()), v.shape().to_vec(), v.data().to_vec()));
            }
        }
    }
    out
}

#[test]
fn every_tensor_equals_mlx_lm_own_conversion() {
    // mlx-lm's pipeline (load_model with its sanitize, cast to bf16 but A_log, quantize_model,
    // save_model) is the reference: Tandem writes the same bytes for every tensor mlx-lm writes, and
    // only the MTP head besides.
    let src = source("19", &[]);
    for (what, opts, args) in [
        ("bf16", ConvertOptions::default(), vec![]),
        ("4-bit", ConvertOptions { bits: Some(4), ..Default::default() }, vec!["4", "64"]),
        ("3-bit g32", ConvertOptions { bits: Some(3), group_size: 32, ..Default::default() }, vec!["3", "32"]),
    ] {
        let out = tempdir();
        let (ours, theirs) = (out.path().join("ours"), out.path().join("theirs"));
        run(src.path(), &ours, &opts);
        let mut a = vec!["mlx-convert", src.path().to_str().unwrap(), theirs.to_str().unwrap()];
        a.extend(args);
        convert_ref(&a);
        let (ours_t, theirs_t) = (all_tensors(&ours), all_tensors(&theirs));
        for (k, (dt, shape, bytes)) in &theirs_t {
            let (odt, oshape, obytes) = ours_t.get(k).unwrap_or_else(|| panic!("{what}: Tandem did not write `{k}`"));
            assert_eq!((odt, oshape), (dt, shape), "{what}: `{k}`");
            assert!(obytes == bytes, "{what}: `{k}` differs from mlx-lm's conversion");
        }
        let extra: Vec<&String> = ours_t.keys().filter(|k| !theirs_t.contains_key(*k)).collect();
        assert!(
            extra.iter().all(|k| k.starts_with("language_model.mtp.")),
            "{what}: unexpected extra tensors {extra:?}"
        );
        assert!(!extra.is_empty(), "{what}: the MTP head is kept");
        let (cq, tq) = (config(&ours)["quantization"].clone(), config(&theirs)["quantization"].clone());
        assert_eq!(
            (cq.get("bits"), cq.get("group_size")),
            (tq.get("bits"), tq.get("group_size")),
            "{what}: quantization block"
        );
    }
}

#[test]
fn mlx_lm_generates_tandem_greedy_tokens_on_every_output() {
    let src = tame_source("12", &[]);
    let before = hash_dir(src.path());
    let cases: Vec<(&str, ConvertOptions)> = vec![
        ("bf16", ConvertOptions::default()),
        ("4-bit", ConvertOptions { bits: Some(4), ..Default::default() }),
        // Small shards: the index and several files must load in both engines.
        ("8-bit, sharded", ConvertOptions { bits: Some(8), shard_bytes: 96 << 10, ..Default::default() }),
        ("mixed_3_6", ConvertOptions { recipe: Recipe::Mixed36, group_size: 32, ..Default::default() }),
    ];
    for (what, opts) in cases {
        let out = tempdir();
        let dst = out.path().join("m");
        let (report, events) = run(src.path(), &dst, &opts);
        assert_eq!(hash_dir(src.path()), before, "{what}: the source changed");
        assert_eq!(report.bytes, report.predicted_bytes, "{what}: predicted size");
        assert!(matches!(events.first(), Some(ConvertEvent::Validated { .. })));
        assert!(events.iter().any(|e| matches!(e, ConvertEvent::Planned { .. })));
        assert!(matches!(events.last(), Some(ConvertEvent::Finished { .. })));
        if what.contains("sharded") {
            assert!(report.shards > 1, "{what}: {} shard(s)", report.shards);
        }
        for f in ["generation_config.json", "chat_template.jinja"] {
            assert!(dst.join(f).exists(), "{what}: {f} not copied");
        }
        let (decisive, worst) = assert_greedy_agrees(&dst, what);
        // Most steps must be decisive, or the comparison would prove little.
        assert!(decisive >= GEN / 4, "{what}: only {decisive} of {GEN} steps decisive (engines differ by {worst})");
        eprintln!(
            "{what}: {} bytes, {:.3} bpw; {decisive}/{GEN} decisive steps, largest log-prob difference {worst:.4}",
            report.bytes, report.bpw
        );
    }
}

#[test]
fn mixed_recipe_writes_per_module_bits_that_mlx_lm_builds() {
    let src = source("13", &[]);
    let out = tempdir();
    let dst = out.path().join("mixed");
    let (report, _) = run(src.path(), &dst, &ConvertOptions { recipe: Recipe::Mixed46, ..Default::default() });
    let cfg = config(&dst);
    assert_eq!(cfg["quantization"], cfg["quantization_config"]);
    assert_eq!(cfg["quantization"]["bits"], 4);
    // 8 layers: the high-bit layers are 0, 3, 6, 7 (mlx-lm's use_more_bits).
    let q = &cfg["quantization"];
    assert_eq!(q["language_model.model.layers.0.mlp.down_proj"]["bits"], 6);
    assert_eq!(q["language_model.model.layers.3.self_attn.v_proj"]["bits"], 6);
    assert_eq!(q["language_model.model.layers.6.linear_attn.in_proj_qkv"]["bits"], 6);
    assert!(q.get("language_model.model.layers.1.mlp.down_proj").is_none(), "layer 1 is low");
    assert_eq!(q["language_model.lm_head"]["bits"], 6);
    assert_eq!(q["language_model.mtp.fc"], false);
    // mlx-lm builds exactly these layers from the files and config.
    let file = out.path().join("modules.json");
    convert_ref(&["modules", dst.to_str().unwrap(), file.to_str().unwrap()]);
    let built: BTreeMap<String, Option<(u8, u32)>> =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(built["language_model.model.layers.0.mlp.down_proj"], Some((6, 64)));
    assert_eq!(built["language_model.model.layers.1.mlp.down_proj"], Some((4, 64)));
    assert_eq!(
        built["language_model.model.layers.6.linear_attn.out_proj"],
        Some((4, 64)),
        "out_proj stays low on a high-bit layer"
    );
    assert_eq!(built["language_model.lm_head"], Some((6, 64)));
    let groups = &report.quantization.as_ref().unwrap().groups;
    assert_eq!(groups["mlp"].bits.values().sum::<usize>(), 24);
    assert_eq!(report.mtp.quantized_linears, 7, "every head linear but mtp.fc");
}

/// MTP logits for the same hidden states and tokens.
fn mtp_logits(m: &tandem::model::Qwen35, hidden: &Array, next: &Array) -> Vec<f32> {
    let mut cache = m.make_mtp_cache().expect("MTP head loaded");
    let h = m.mtp_forward(hidden, next, &mut cache).unwrap();
    m.logits(&h).unwrap().to_f32_vec().unwrap()
}

#[test]
fn the_converted_mtp_head_loads_and_matches_the_source() {
    let src = source("14", &[]);
    let out = tempdir();
    let dst = out.path().join("bf16");
    let (report, _) = run(src.path(), &dst, &ConvertOptions::default());
    assert!(report.mtp.kept);
    assert_eq!(report.mtp.tensors, 15);
    let keys = index_keys(&dst);
    assert_eq!(keys.iter().filter(|k| k.starts_with("language_model.mtp.")).count(), 15);
    assert!(!keys.iter().any(|k| k.starts_with("mtp.")));

    // Both in bf16 weights: the only difference left is the converted norms' 1 + w rounded to bf16.
    let opts = LoadOptions { dtype: Some(mlx::Dtype::BF16), ..Default::default() };
    let a = model::load(src.path(), &opts).unwrap();
    let b = model::load(&dst, &LoadOptions::default()).unwrap();
    assert!(b.has_mtp(), "{:?}", b.mtp_status);
    assert!(b.mtp_status.repaired.is_none(), "{:?}", b.mtp_status.repaired);
    let ids: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
    let toks = Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap();
    let hidden = a.forward(&toks, &mut a.make_cache()).unwrap();
    let t = ids.len() as i32;
    let (h, next) = (hidden.slice_axis(1, 0, t - 1).unwrap(), toks.slice_axis(1, 1, t).unwrap());
    let (la, lb) = (mtp_logits(&a, &h, &next), mtp_logits(&b, &h, &next));
    let e = rel_err(&lb, &la);
    // Scale of bf16 rounding on this model: the main logits of the two models on the same tokens.
    let main_a = a.logits(&hidden).unwrap().to_f32_vec().unwrap();
    let main_b = b.logits(&b.forward(&toks, &mut b.make_cache()).unwrap()).unwrap().to_f32_vec().unwrap();
    let main_e = rel_err(&main_b, &main_a);
    eprintln!("MTP logits relative error {e}, main logits {main_e}");
    assert!(e < 0.02, "MTP logits differ by {e}");
    // A head that lost its +1 (the ~0% acceptance bug) would be off by order 1.
    assert!(e <= 2.0 * main_e.max(0.005), "MTP error {e} is large next to the main logits' {main_e}");
}

/// The source's model card describes the source's files: the conversion writes its own, keeping the
/// card's front matter (license, base model) as it was.
#[test]
fn the_model_card_describes_the_conversion_and_keeps_the_front_matter() {
    let src = source("16", &[]);
    let front = "---\nlicense: apache-2.0\nbase_model: Org/Source\n---\n";
    std::fs::write(src.path().join("README.md"), format!("{front}# Source\n\n14 MB of bf16 weights.\n")).unwrap();
    let out = tempdir();
    let dst = out.path().join("q4");
    run(src.path(), &dst, &ConvertOptions { bits: Some(4), mtp: MtpMode::Drop, ..Default::default() });
    let card = std::fs::read_to_string(dst.join("README.md")).unwrap();
    assert!(card.starts_with(front), "{card}");
    assert!(!card.contains("14 MB of bf16"), "the source's description is not copied: {card}");
    assert!(card.contains("Converted by Tandem") && card.contains("4-bit, group size 64"), "{card}");
    assert!(card.contains("without its MTP head"), "{card}");
}

#[test]
fn dropping_the_head_writes_none_and_loads_with_mtp_off() {
    let src = source("15", &[]);
    let out = tempdir();
    let dst = out.path().join("nomtp");
    let (report, _) =
        run(src.path(), &dst, &ConvertOptions { mtp: MtpMode::Drop, bits: Some(4), ..Default::default() });
    assert!(!report.mtp.kept);
    assert!(!index_keys(&dst).iter().any(|k| k.contains("mtp.")));
    let cfg = config(&dst);
    assert_eq!(cfg["text_config"]["mtp_num_hidden_layers"], 0);
    let m = model::load(&dst, &LoadOptions::default()).unwrap();
    assert!(!m.has_mtp());
    assert!(m.mtp_status.reason.is_some());
    let opts = GenerateOptions { max_tokens: 4, sampling: SamplingParams::greedy(), ..Default::default() };
    let o = generate(&m, &PROMPT, &opts, &mut |_| GenControl::Continue).unwrap();
    assert!(o.stats.spec.and_then(|s| s.fallback).is_some(), "MTP asked for but not running must say why");
    let report = quant::inspect(&dst).unwrap();
    assert_eq!(report.mtp.verdict, quant::Verdict::Missing);
}

#[test]
fn mtp_bits_none_keeps_head_linears_dense_and_tied_models_convert() {
    let src = tame_source("16", &["--tied"]);
    let out = tempdir();
    let dst = out.path().join("tied");
    let opts = ConvertOptions { bits: Some(4), mtp_bits: Some(MtpBits::Dense), ..Default::default() };
    let (report, _) = run(src.path(), &dst, &opts);
    assert_eq!(report.mtp.quantized_linears, 0);
    let keys = index_keys(&dst);
    assert!(!keys.iter().any(|k| k.starts_with("language_model.lm_head")), "tied: no lm_head");
    assert!(keys.contains(&"language_model.model.embed_tokens.scales".to_string()));
    assert!(!keys.iter().any(|k| k.starts_with("language_model.mtp.") && k.ends_with(".scales")));
    let cfg = config(&dst);
    assert_eq!(cfg["quantization"]["language_model.mtp.layers.0.mlp.up_proj"], false);
    assert_greedy_agrees(&dst, "tied 4-bit");
    let m = model::load(&dst, &LoadOptions::default()).unwrap();
    assert!(m.has_mtp());
}

#[test]
fn auto_recipe_measures_and_reaches_the_target() {
    let src = tame_source("17", &[]);
    let out = tempdir();
    let dst = out.path().join("auto");
    let target = 5.0;
    let opts =
        ConvertOptions { recipe: Recipe::Auto, target_bpw: Some(target), calibration_tokens: 64, ..Default::default() };
    let (report, events) = run(src.path(), &dst, &opts);
    assert!(events.iter().any(|e| matches!(e, ConvertEvent::Calibrating { .. })));
    assert!(report.bpw <= target + 1e-9, "bpw {} above the target {target}", report.bpw);
    assert!(report.bpw > target - 1.0, "bpw {} far below the target {target}", report.bpw);
    let alloc = report.allocation.as_ref().unwrap();
    for (s, _) in alloc {
        let e: Vec<f64> = s.errors.iter().map(|x| x.1).collect();
        assert!(e.windows(2).all(|w| w[1] <= w[0] * 1.05 + 1e-6), "{}: errors do not fall with bits: {e:?}", s.module);
        assert!(e[0] > 0.0);
    }
    let widths: std::collections::BTreeSet<Option<u8>> = alloc.iter().map(|(_, b)| *b).collect();
    assert!(widths.len() > 1, "auto chose one width for everything: {widths:?}");
    assert!(alloc.iter().any(|(s, _)| s.module.starts_with("mtp.")), "the head's linears follow the recipe");
    assert_greedy_agrees(&dst, "auto");
    eprintln!("auto: {:.3} bpw, widths {widths:?}", report.bpw);
}

#[test]
fn cancel_existing_destination_and_bad_input_are_refused_cleanly() {
    let src = source("18", &[]);
    let before = hash_dir(src.path());
    let out = tempdir();
    let dst = out.path().join("m");
    let no_partial = |dir: &Path| {
        std::fs::read_dir(dir).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".partial-"))
    };

    // Cancelled after a few tensors: nothing is left behind.
    let mut seen = 0;
    let r = quant::convert(src.path(), &dst, &ConvertOptions { bits: Some(4), ..Default::default() }, &mut |e| {
        if matches!(e, ConvertEvent::Tensor { .. }) {
            seen += 1;
        }
        if seen >= 3 {
            Control::Cancel
        } else {
            Control::Continue
        }
    });
    assert!(matches!(r, Err(ConvertError::Cancelled)), "{r:?}");
    assert_eq!(seen, 3);
    assert!(!dst.exists());
    assert!(no_partial(out.path()));

    // An existing destination is refused without force and replaced with it.
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("keep.txt"), "x").unwrap();
    let r = quant::convert(src.path(), &dst, &ConvertOptions::default(), &mut |_| Control::Continue);
    assert!(matches!(r, Err(ConvertError::DestinationExists(_))), "{r:?}");
    assert!(dst.join("keep.txt").exists());
    run(src.path(), &dst, &ConvertOptions { force: true, ..Default::default() });
    assert!(!dst.join("keep.txt").exists() && dst.join("config.json").exists());
    assert!(no_partial(out.path()));
    // Never into the source.
    let inside = src.path().join("out");
    let r = quant::convert(src.path(), &inside, &ConvertOptions::default(), &mut |_| Control::Continue);
    assert!(matches!(r, Err(ConvertError::Destination { .. })), "{r:?}");
    assert_eq!(hash_dir(src.path()), before, "the source changed");

    // An already quantized model is not quantized again.
    let r = quant::convert(
        &dst,
        &out.path().join("again"),
        &ConvertOptions { bits: Some(4), ..Default::default() },
        &mut |_| Control::Continue,
    );
    let q = out.path().join("q4");
    run(src.path(), &q, &ConvertOptions { bits: Some(4), ..Default::default() });
    assert!(r.is_ok(), "re-converting a bf16 MLX model is allowed: {r:?}");
    let r = quant::convert(
        &q,
        &out.path().join("q4again"),
        &ConvertOptions { bits: Some(4), ..Default::default() },
        &mut |_| Control::Continue,
    );
    let msg = r.expect_err("re-quantizing").to_string();
    assert!(msg.contains("already quantized"), "{msg}");

    // Corrupt inputs: each is rejected with the file (and tensor) named, before anything is written.
    let weights = src.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    type Corruption<'a> = (&'a str, Box<dyn Fn(&Path) + 'a>, Vec<&'a str>);
    let cases: Vec<Corruption> = vec![
        (
            "truncated",
            Box::new(|d: &Path| std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() - 1000]).unwrap()),
            vec!["model.safetensors", "runs past the end"],
        ),
        (
            "garbage header",
            Box::new(|d: &Path| {
                let mut b = bytes.clone();
                for x in &mut b[8..40] {
                    *x = b'#';
                }
                std::fs::write(d.join("model.safetensors"), b).unwrap()
            }),
            vec!["model.safetensors", "JSON"],
        ),
        (
            "NaN weights",
            Box::new(|d: &Path| {
                let mut b = bytes.clone();
                let n = b.len();
                for x in &mut b[n - 64..] {
                    *x = 0xff;
                }
                std::fs::write(d.join("model.safetensors"), b).unwrap()
            }),
            vec!["model.safetensors", "NaN"],
        ),
        (
            "unknown model type",
            Box::new(|d: &Path| {
                let c = std::fs::read_to_string(d.join("config.json")).unwrap().replacen("\"qwen3_5\"", "\"llama\"", 1);
                std::fs::write(d.join("config.json"), c).unwrap()
            }),
            vec!["llama"],
        ),
        (
            "missing tensor",
            Box::new(|d: &Path| {
                let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
                let kept: Vec<(String, safetensors::tensor::TensorView)> = st
                    .tensors()
                    .into_iter()
                    .filter(|(k, _)| k != "model.language_model.layers.2.mlp.up_proj.weight")
                    .collect();
                safetensors::serialize_to_file(kept, None, &d.join("model.safetensors")).unwrap();
            }),
            vec!["layers.2.mlp.up_proj.weight"],
        ),
    ];
    for (what, corrupt, words) in cases {
        let bad = tempdir();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(src.path().join(f), bad.path().join(f)).unwrap();
        }
        corrupt(bad.path());
        let dst = out.path().join(format!("bad-{}", what.replace(' ', "-")));
        let r = quant::convert(bad.path(), &dst, &ConvertOptions { bits: Some(4), ..Default::default() }, &mut |_| {
            Control::Continue
        });
        let msg = r.expect_err(what).to_string();
        for w in words {
            assert!(msg.contains(w), "{what}: message `{msg}` lacks `{w}`");
        }
        assert!(!dst.exists(), "{what}: destination written");
        assert!(no_partial(out.path()), "{what}: partial folder left");
        eprintln!("{what}: {msg}");
    }
    assert_eq!(hash_dir(src.path()), before, "the source changed");
}

#[test]
fn bundled_tandem_tiny_converts_when_present() {
    let tiny = repo().join("assets/models/tandem-tiny");
    if !tiny.join("config.json").exists() {
        eprintln!("assets/models/tandem-tiny is not there yet: skipped");
        return;
    }
    let out = tempdir();
    let dst = out.path().join("tiny-4bit");
    let (report, _) = run(&tiny, &dst, &ConvertOptions { bits: Some(4), ..Default::default() });
    assert!(report.mtp.kept || !model::load(&tiny, &LoadOptions::default()).unwrap().has_mtp());
    assert!(dst.join("tokenizer.json").exists() || !tiny.join("tokenizer.json").exists());
    assert_greedy_agrees(&dst, "tandem-tiny 4-bit");
    let m = model::load(&dst, &LoadOptions::default()).unwrap();
    assert!(m.mtp_status.repaired.is_none());
    eprintln!("tandem-tiny 4-bit: {} bytes, {:.3} bpw", report.bytes, report.bpw);
}

/// A conversion beside other MLX work takes its gate per unit of work: held while each tensor (and
/// each calibrated module) is computed, let go before every event is reported. So whoever else
/// wants MLX (the server's chats, tests/it/server_api.rs) waits for one unit, never the whole run.
#[test]
fn the_compute_gate_is_taken_per_tensor_and_let_go_between() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Lets the gate go when dropped.
    struct Release(Arc<AtomicBool>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }

    let tiny = tiny_model_dir();
    for (what, opts) in [
        ("4-bit", ConvertOptions { bits: Some(4), ..Default::default() }),
        (
            "auto",
            ConvertOptions {
                recipe: Recipe::Auto,
                target_bpw: Some(5.0),
                calibration_tokens: 32,
                ..Default::default()
            },
        ),
    ] {
        let held = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(AtomicUsize::new(0));
        let gate = {
            let (held, taken) = (held.clone(), taken.clone());
            quant::ComputeGate::new(move || {
                assert!(!held.swap(true, Ordering::SeqCst), "the gate was taken twice without being let go");
                taken.fetch_add(1, Ordering::SeqCst);
                Box::new(Release(held.clone()))
            })
        };
        let out = tempdir();
        let dst = out.path().join("m");
        let (mut tensors, mut modules, mut reported_held) = (0, 0, 0);
        let opts = ConvertOptions { gate, ..opts };
        quant::convert(&tiny, &dst, &opts, &mut |e| {
            match e {
                ConvertEvent::Tensor { .. } => tensors += 1,
                ConvertEvent::Calibrating { .. } => modules += 1,
                _ => {}
            }
            if held.load(Ordering::SeqCst) {
                reported_held += 1;
            }
            Control::Continue
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(reported_held, 0, "{what}: events reported while holding the gate");
        assert!(!held.load(Ordering::SeqCst), "{what}: the gate is still held after the conversion");
        assert_eq!(modules > 0, opts.recipe == Recipe::Auto, "{what}: {modules} calibrated modules");
        // Opening the source, analysing the head, the peak-memory reset and read, one per tensor
        // and, for auto, one more per calibrated module.
        let taken = taken.load(Ordering::SeqCst);
        assert!(tensors > 100, "{what}: {tensors} tensors");
        assert!(
            taken >= tensors + modules + 2,
            "{what}: the gate was taken {taken} times for {tensors} tensors and {modules} modules"
        );
        assert!(dst.join("config.json").exists(), "{what}");
        eprintln!("{what}: gate taken {taken} times for {tensors} tensors, {modules} calibrated modules");
    }
}
