//! No silent MTP: the load-time acceptance probe on the seed's scenario and its variants, all built
//! from tandem-tiny. Each variant either runs MTP within 0.05 of its correct head's fixed-depth
//! acceptance, or is refused with a reason that names the figures; none runs at near-0%. Also: the
//! probe's figure against measured depth-1 acceptance, and the probe in inspect and convert.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use tandem::generate::MtpOptions;
use tandem::model::{self, LoadOptions, Qwen35};
use tandem::quant::{self, ConvertOptions, MtpMode, Verdict};

/// Prompts in the tiny model's register (speech prose), through its tokenizer.
const PROMPTS: [&str; 3] = [
    "The State of the Union",
    "Fellow citizens of the Senate and of the House of Representatives:",
    "Call me Ishmael. Some years ago",
];

fn load(dir: &Path) -> Qwen35 {
    model::load(dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("load {}: {e}", dir.display()))
}

/// Plain greedy continuations of the prompts, by body: variants that differ only in their head
/// share their body's, decoded once.
type PlainByBody = std::collections::HashMap<&'static str, Vec<Vec<u32>>>;

/// Depth-1 greedy acceptance with the adaptive controller off (every cycle drafts), over the
/// prompts; greedy output must equal decoding without MTP (`body` names the body for `plain`).
/// None when MTP does not run.
/// Tokens decoded per prompt for a depth-1 figure: ~220 drafts, whose binomial spread (~0.03) leaves room
/// for the 0.05 by which equivalent heads must agree.
const DEPTH1_TOKENS: usize = 128;

fn depth1(m: &Qwen35, body: &'static str, plain: &mut PlainByBody) -> Option<f64> {
    if !m.has_mtp() {
        return None;
    }
    let tok = tandem::chat::Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let ids: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, false).unwrap()).collect();
    let plain =
        plain.entry(body).or_insert_with(|| ids.iter().map(|ids| greedy(m, ids, DEPTH1_TOKENS, None).0).collect());
    let (mut drafted, mut accepted) = (0usize, 0usize);
    for (ids, plain) in ids.iter().zip(plain.iter()) {
        let opts = MtpOptions { enabled: true, depth: 1, adaptive: false, exact_verify: false, ..Default::default() };
        let (spec, stats) = greedy(m, ids, DEPTH1_TOKENS, Some(opts));
        assert_eq!(&spec, plain, "MTP changed the greedy output (body: {body})");
        let s = stats.spec.expect("spec stats");
        drafted += s.drafted;
        accepted += s.accepted;
    }
    Some(accepted as f64 / drafted.max(1) as f64)
}

fn py(script: &str) {
    let out = Command::new(python()).arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "{}\n{script}", String::from_utf8_lossy(&out.stderr));
}

fn convert(src: &Path, dst: &Path, opts: &ConvertOptions) {
    quant::convert(src, dst, opts, &mut |_| quant::Control::Continue).unwrap_or_else(|e| panic!("convert: {e}"));
}

fn opts(bits: Option<u8>, mtp: MtpMode) -> ConvertOptions {
    ConvertOptions { bits, mtp, ..Default::default() }
}

/// Python prelude: the raw head of tandem-tiny and helpers over a converted folder `d`.
fn prelude(d: &Path) -> String {
    format!(
        "import mlx.core as mx, json, os\nd = {d:?}\nraw = {{k: v for k, v in mx.load({src:?}).items() if k.startswith('mtp.')}}\n\
         NORMS = {norms:?}\n\
         def set_layers(n):\n    c = json.load(open(d + '/config.json'))\n    c['text_config']['mtp_num_hidden_layers'] = n\n    json.dump(c, open(d + '/config.json', 'w'))\n\
         def index(extra):\n    body = mx.load(d + '/model.safetensors')\n    wm = {{k: 'model.safetensors' for k in body}}\n    wm.update({{k: 'model-extra.safetensors' for k in extra}})\n    json.dump({{'metadata': {{}}, 'weight_map': wm}}, open(d + '/model.safetensors.index.json', 'w'))\n    mx.save_safetensors(d + '/model-extra.safetensors', extra)\n",
        d = d.to_str().unwrap(),
        src = tiny_model_dir().join("model.safetensors").to_str().unwrap(),
        norms = tandem::model::mtp_head::MTP_NORMS.iter().map(|n| format!("mtp.{n}")).collect::<Vec<_>>(),
    )
}

/// An MLX conversion of tandem-tiny without head (as mlx-lm writes), config still declaring it,
/// then `edit` (Python) applied to the folder.
fn dropped_then(dir: &Path, edit: &str) {
    convert(&tiny_model_dir(), dir, &opts(None, MtpMode::Drop));
    py(&format!("{}set_layers(1)\n{edit}", prelude(dir)));
}

struct Case {
    name: &'static str,
    dir: std::path::PathBuf,
    /// Which body it has (see [`PlainByBody`]).
    body: &'static str,
    /// The acceptance of the correct head of the same body.
    reference: f64,
    /// Must run (a repairable head) rather than be refused.
    must_run: bool,
}

#[test]
fn no_variant_runs_mtp_silently_near_zero() {
    let tmp = tempdir();
    let w = |n: &str| tmp.path().join(n);
    let mut plain = PlainByBody::new();
    let raw = load(&tiny_model_dir());
    let bf16 = depth1(&raw, "raw", &mut plain).expect("tandem-tiny runs MTP");
    assert!(bf16 > 0.6, "the correct head: {bf16}");

    // The converter's output with the head dropped: nothing to probe, MTP off with that reason.
    dropped_then(&w("dropped"), "");
    let m = load(&w("dropped"));
    let reason = m.mtp_status.reason.clone().unwrap_or_default();
    assert!(!m.has_mtp() && reason.contains("lacks 15 of its 15 tensors"), "{reason}");
    assert!(m.mtp_status.probe.is_none());

    // The seed: the raw head re-attached under MLX names in an extra shard listed in the index.
    dropped_then(&w("seed"), "index({'language_model.' + k: v for k, v in raw.items()})");
    // The raw head in a sidecar, under its own names; the same head shifted once (an MLX head's
    // values under raw names); half its norms shifted (under MLX names, in an extra shard).
    dropped_then(&w("sidecar"), "mx.save_safetensors(d + '/mtp.safetensors', raw)");
    dropped_then(
        &w("shifted-once"),
        "mx.save_safetensors(d + '/mtp.safetensors', {k: (v.astype(mx.float32) + 1).astype(v.dtype) if k in NORMS else v for k, v in raw.items()})",
    );
    dropped_then(
        &w("half-shifted"),
        "index({'language_model.' + k: ((v.astype(mx.float32) + 1).astype(v.dtype) if k in NORMS[:4] else v) for k, v in raw.items()})",
    );
    // A converted model whose head was shifted a second time.
    convert(&tiny_model_dir(), &w("twice"), &opts(None, MtpMode::Keep));
    py(&format!(
        "{}w = mx.load(d + '/model.safetensors')\nw = {{k: ((v.astype(mx.float32) + 1).astype(v.dtype) if k[len('language_model.'):] in NORMS else v) for k, v in w.items()}}\n\
         mx.save_safetensors(d + '/model.safetensors', w, metadata={{'format': 'mlx'}})\n",
        prelude(&w("twice"))
    ));
    // A head from another checkpoint: same shapes and norms, other (random) linear weights.
    dropped_then(
        &w("garbage"),
        "mx.random.seed(3)\nmx.save_safetensors(d + '/mtp.safetensors', {k: (v if k in NORMS else (mx.random.normal(v.shape) * v.astype(mx.float32).std()).astype(v.dtype)) for k, v in raw.items()})",
    );
    // 8- and 4-bit conversions, and the same with `mtp.fc` quantized too.
    let mut quantized = Vec::new();
    for bits in [8u8, 4] {
        let q = w(&format!("q{bits}"));
        convert(&tiny_model_dir(), &q, &opts(Some(bits), MtpMode::Keep));
        let body = if bits == 8 { "8-bit" } else { "4-bit" };
        let reference = depth1(&load(&q), body, &mut plain).expect("a quantized conversion runs MTP");
        let fc = w(&format!("q{bits}-fc"));
        convert(&tiny_model_dir(), &fc, &opts(Some(bits), MtpMode::Keep));
        py(&format!(
            "{}w = mx.load(d + '/model.safetensors')\nk = 'language_model.mtp.fc'\nq, s, b = mx.quantize(w[k + '.weight'], 64, {bits})\n\
             w.update({{k + '.weight': q, k + '.scales': s, k + '.biases': b}})\nmx.save_safetensors(d + '/model.safetensors', w, metadata={{'format': 'mlx'}})\n\
             c = json.load(open(d + '/config.json'))\nc['quantization'][k] = {{'group_size': 64, 'bits': {bits}}}\nc['quantization_config'] = c['quantization']\njson.dump(c, open(d + '/config.json', 'w'))\n",
            prelude(&fc)
        ));
        quantized.push(Case {
            name: if bits == 8 { "8-bit, mtp.fc quantized" } else { "4-bit, mtp.fc quantized" },
            dir: fc,
            body,
            reference,
            must_run: false,
        });
    }

    // Every variant below has the body of the bf16 MLX conversion.
    let mut cases = vec![
        Case {
            name: "seed: raw head under MLX names in an extra shard",
            dir: w("seed"),
            body: "mlx bf16",
            reference: bf16,
            must_run: true,
        },
        Case { name: "raw head in a sidecar", dir: w("sidecar"), body: "mlx bf16", reference: bf16, must_run: true },
        Case {
            name: "shifted once under raw names",
            dir: w("shifted-once"),
            body: "mlx bf16",
            reference: bf16,
            must_run: true,
        },
        Case {
            name: "half its norms shifted",
            dir: w("half-shifted"),
            body: "mlx bf16",
            reference: bf16,
            must_run: true,
        },
        Case { name: "shifted twice", dir: w("twice"), body: "mlx bf16", reference: bf16, must_run: false },
        Case { name: "garbage head", dir: w("garbage"), body: "mlx bf16", reference: bf16, must_run: false },
    ];
    cases.extend(quantized);
    let mut seen = Vec::new();
    for c in &cases {
        let m = load(&c.dir);
        let got = depth1(&m, c.body, &mut plain);
        let probe = m.mtp_status.probe.clone();
        seen.push((c.name, got, probe.as_ref().and_then(|p| p.acceptance), m.mtp_status.reason.clone()));
        match got {
            Some(a) => assert!(
                (a - c.reference).abs() <= 0.05,
                "{}: runs at {a:.3}, correct head {:.3} ({:?}; {:?})",
                c.name,
                c.reference,
                m.mtp_status.repaired,
                probe
            ),
            None => {
                assert!(!c.must_run, "{}: refused but repairable: {:?}", c.name, m.mtp_status.reason);
                let why = m.mtp_status.reason.clone().unwrap_or_default();
                assert!(why.contains("probes at best") && why.contains("tried:"), "{}: {why}", c.name);
            }
        }
        assert!(probe.is_some_and(|p| !p.inconclusive && !p.tried.is_empty()), "{}: not probed", c.name);
    }
    eprintln!("correct head {bf16:.3}; variants (depth-1 acceptance, probe, reason): {seen:#?}");
    // The garbage head can never be repaired by a convention: it must be refused.
    assert!(seen.iter().any(|(n, got, _, _)| *n == "garbage head" && got.is_none()), "{seen:?}");
}

/// The probe's figures are remembered for unchanged files (a reload reuses them, with the same
/// verdict) and measured anew once a file changes.
#[test]
fn probe_figures_are_remembered_for_unchanged_files_only() {
    use tandem::model::mtp_head::probe::memo::remembered;
    let tmp = tempdir();
    let dir = tmp.path().join("tiny");
    copy_dir(&tiny_model_dir(), &dir);
    assert!(!remembered(&dir, None));
    let first = load(&dir);
    assert!(remembered(&dir, None), "probed once, remembered");
    assert!(!remembered(&dir, Some(mlx::Dtype::F32)), "another dtype computes other figures");
    let again = load(&dir);
    let (a, b) = (first.mtp_status.probe.clone().unwrap(), again.mtp_status.probe.clone().unwrap());
    assert_eq!(
        (a.acceptance, &a.tried, a.chosen.as_deref(), a.tokens),
        (b.acceptance, &b.tried, b.chosen.as_deref(), b.tokens)
    );
    assert_eq!(first.has_mtp(), again.has_mtp());
    // Any file written since (here the config, rewritten with the same bytes) is measured anew.
    let config = std::fs::read(dir.join("config.json")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::remove_file(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    assert!(!remembered(&dir, None), "a changed folder is not remembered");
    let third = load(&dir);
    assert_eq!(third.mtp_status.probe.unwrap().acceptance, a.acceptance, "the same files measure the same");
}

#[test]
fn the_probe_agrees_with_measured_depth1_acceptance() {
    let m = load(&tiny_model_dir());
    let p = m.mtp_status.probe.clone().expect("probed at load");
    assert_eq!(p.chosen.as_deref(), Some("zero_centred"), "{p:?}");
    assert_eq!(p.tried.len(), 1, "a raw head on its raw body is probed as it is: {p:?}");
    use tandem::model::mtp_head::probe::{CONTINUATION, MAX_TOKENS};
    assert!(p.tokens > 100 + CONTINUATION && p.tokens <= MAX_TOKENS + CONTINUATION && !p.inconclusive, "{p:?}");
    let measured = depth1(&m, "raw", &mut PlainByBody::new()).unwrap();
    let probed = p.acceptance.unwrap();
    eprintln!(
        "probe {probed:.3} ({} tokens, {:.3} s, body {:.3}) vs depth-1 {measured:.3}",
        p.tokens, p.seconds, p.body_agreement
    );
    // Within 0.1, as the MTP issue asks: the probe now measures the positions a greedy decode meets
    // (the body's own continuation), where prose alone read 0.635 against a measured 0.748.
    assert!((probed - measured).abs() <= 0.1, "probe {probed:.3} vs measured {measured:.3}");
}

#[test]
fn inspect_and_convert_report_the_probe_and_refuse_a_bad_head() {
    let tmp = tempdir();
    let w = |n: &str| tmp.path().join(n);
    // inspect --json: `mtp.probe` in the shape README's inspect contract gives.
    let r = quant::inspect(&tiny_model_dir()).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    let p = &v["mtp"]["probe"];
    assert!(p["acceptance"].as_f64().is_some_and(|a| a > 0.3), "{p}");
    assert!(p["tried"][0]["convention"].is_string() && p["tried"][0]["acceptance"].is_number(), "{p}");
    assert!(p["chosen"].is_string() && p["seconds"].is_number(), "{p}");

    // The seed scenario inspects as repaired (it used to say `ok`), and `repair` writes the fix.
    dropped_then(&w("seed"), "index({'language_model.' + k: v for k, v in raw.items()})");
    let r = quant::inspect(&w("seed")).unwrap();
    assert_eq!(r.mtp.verdict, Verdict::Repaired, "{}", r.mtp.message);
    quant::repair(&w("seed"), &w("fixed")).unwrap();
    let fixed = load(&w("fixed"));
    assert!(fixed.has_mtp() && fixed.mtp_status.repaired.is_none(), "{:?}", fixed.mtp_status);
    assert_eq!(quant::inspect(&w("fixed")).unwrap().mtp.verdict, Verdict::Ok);

    // convert writes the verified convention and figure into config.json.
    convert(&tiny_model_dir(), &w("q8"), &opts(Some(8), MtpMode::Keep));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(w("q8").join("config.json")).unwrap()).unwrap();
    assert_eq!(c["tandem"]["mtp"]["convention"], "shifted", "{c}");
    assert!(c["tandem"]["mtp"]["probe"]["acceptance"].as_f64().is_some_and(|a| a > 0.3), "{c}");

    // A raw source whose head is garbage: keeping it fails, naming the figures; force writes it.
    let bad = w("bad-src");
    std::fs::create_dir(&bad).unwrap();
    for f in std::fs::read_dir(tiny_model_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, bad.join(f.file_name().unwrap())).unwrap();
    }
    py(&format!(
        "{}mx.random.seed(4)\nw = mx.load(d + '/model.safetensors')\nw = {{k: ((mx.random.normal(v.shape) * v.astype(mx.float32).std()).astype(v.dtype) if k.startswith('mtp.') and k not in NORMS else v) for k, v in w.items()}}\n\
         mx.save_safetensors(d + '/model.safetensors', w, metadata={{'format': 'pt'}})\n",
        prelude(&bad)
    ));
    let err = quant::convert(&bad, &w("bad-out"), &opts(None, MtpMode::Keep), &mut |_| quant::Control::Continue)
        .expect_err("a garbage head must not be written silently")
        .to_string();
    assert!(err.contains("probes at best") && err.contains("force"), "{err}");
    assert!(!w("bad-out").exists());
    let forced = ConvertOptions { force: true, ..opts(None, MtpMode::Keep) };
    let report = quant::convert(&bad, &w("bad-out"), &forced, &mut |_| quant::Control::Continue).unwrap();
    assert!(report.notes.iter().any(|n| n.contains("written anyway")), "{:?}", report.notes);
}
