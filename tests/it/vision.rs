//! The Qwen3.5 vision tower and prompts with images, against transformers (tests/fixtures/tiny-vlm-reference.*
//! and vision-reference.*, made by tools/fixtures/make_fixtures.py and tools/fixtures/vision_reference.py on the
//! CPU in f32), plus image decoding limits and errors, a text-only model refusing images, and lossless MTP with
//! an image in the prompt.

use std::path::{Path, PathBuf};

use crate::common::*;
use mlx::{Array, Dtype};
use tandem::generate::prefill_images;
use tandem::generate::{generate_prompt, Control, GenerateError, GenerateOptions, MtpOptions, Prompt, SamplingParams};
use tandem::model::vision::rope_index;
use tandem::model::vision_input::{expand_image_pads, ImageError, ImageInput, ImageProcessor};
use tandem::model::{self, LoadOptions, Qwen35};

fn vlm() -> Qwen35 {
    model::load(&fixture("tiny-vlm"), &LoadOptions { dtype: Some(Dtype::F32), ..Default::default() })
        .expect("load tiny-vlm")
}

pub(crate) fn reference() -> PathBuf {
    fixture("tiny-vlm-reference.safetensors")
}

fn read_i64(path: &Path, name: &str) -> Vec<i64> {
    read_ids(path, name).into_iter().map(|v| v as i32 as i64).collect()
}

/// The fixture's processor output (transformers) as an `ImageInput`.
pub(crate) fn fixture_image() -> ImageInput {
    let (pixel_values, shape) = read_f32(&reference(), "pixel_values");
    let g = read_ids(&reference(), "image_grid_thw");
    ImageInput {
        pixel_values,
        grid_thw: [g[0], g[1], g[2]],
        patch_dim: shape[1],
        merge_size: 2,
        source: "fixture".into(),
    }
}

fn pixels(img: &ImageInput) -> Array {
    Array::from_slice(&img.pixel_values, &[(img.pixel_values.len() / img.patch_dim) as i32, img.patch_dim as i32])
        .unwrap()
}

// Tolerances (f32 engine vs transformers f32 on the CPU): both compute the same f32 math; the differences come
// from summation order (MLX's matmul/sdpa/layer_norm kernels vs PyTorch's) and from cos/sin evaluated by different
// libraries. Measured: vision stages <= 6.2e-6 and logits <= 3.7e-6 max |diff| on values of magnitude ~1-4; the
// bound 1e-4 leaves margin for other CPUs' kernels while a real mistake (one wrong position axis, a missing
// bias, a wrong GELU) moves them by 1e-2 or more (see `positions_and_features_matter`).
const F32_TOL: f32 = 1e-4;

#[test]
fn vision_tower_matches_transformers_in_f32() {
    let m = vlm();
    assert!(m.has_vision());
    let img = fixture_image();
    let trace = m.vision().unwrap().encode_traced(&pixels(&img), &[img.grid_thw]).unwrap();
    for (name, got) in [
        ("vision.patch_embed", &trace.patch_embed),
        ("vision.blocks_out", &trace.blocks_out),
        ("vision.merged", &trace.merged),
    ] {
        let (want, shape) = read_f32(&reference(), name);
        assert_eq!(got.shape().iter().map(|&d| d as usize).collect::<Vec<_>>(), shape, "{name}");
        let d = max_abs(&got.to_f32_vec().unwrap(), &want);
        println!("{name}: max |diff| {d:.3e}");
        assert!(d <= F32_TOL, "{name}: max |diff| {d}");
    }
    let merged = m.encode_images(&pixels(&img), &[img.grid_thw]).unwrap();
    assert_eq!(merged.to_f32_vec().unwrap(), trace.merged.to_f32_vec().unwrap());
    // Shapes that do not fit are errors, not panics.
    assert!(m.encode_images(&pixels(&img), &[[1, 4, 4]]).is_err());
    assert!(m.encode_images(&pixels(&img), &[[1, 3, 8]]).is_err(), "h not a multiple of the merge size");
}

#[test]
fn mrope_positions_and_pad_expansion_match_transformers() {
    let ids = read_ids(&reference(), "input_ids");
    let (pos, delta) = rope_index(&ids, 5, &[fixture_image().grid_thw], 2).unwrap();
    assert_eq!(pos.concat().iter().map(|&p| p as i64).collect::<Vec<_>>(), read_i64(&reference(), "position_ids"));
    assert_eq!(delta as i64, read_i64(&reference(), "rope_deltas")[0]);
    // The chat template renders one pad per image; expanding it gives the processor's ids.
    let first = ids.iter().position(|&id| id == 5).unwrap();
    let mut rendered: Vec<u32> = ids.iter().copied().filter(|&id| id != 5).collect();
    rendered.insert(first, 5);
    assert_eq!(expand_image_pads(&rendered, 5, &[fixture_image()]).unwrap(), ids);
    assert!(matches!(
        expand_image_pads(&ids, 5, &[fixture_image()]),
        Err(ImageError::PadCount { pads: 6, images: 1, .. })
    ));
    assert!(rope_index(&ids[..8], 5, &[fixture_image().grid_thw], 2).is_err(), "too few pads");
    assert!(rope_index(&ids, 5, &[], 2).is_err(), "pads without an image");
}

/// Logits of every prompt position, from generation's own prefill.
fn prefill_logits(
    m: &Qwen35,
    ids: &[u32],
    images: &[ImageInput],
    chunk: usize,
) -> (Vec<f32>, Vec<tandem::cache::LayerCache>) {
    let mut cache = m.make_cache();
    let h = prefill_images(m, ids, 0, images, &mut cache, chunk).unwrap();
    (m.logits(&h).unwrap().to_f32_vec().unwrap(), cache)
}

#[test]
fn image_prompt_and_decoding_after_it_match_transformers_in_f32() {
    let m = vlm();
    let ids = read_ids(&reference(), "input_ids");
    let (want, shape) = read_f32(&reference(), "logits");
    assert_eq!(shape, [ids.len(), 4096]);
    let vref = fixture("vision-reference.safetensors");
    let continued = read_ids(&vref, "continued_ids");
    let (want_next, _) = read_f32(&vref, "continued_logits");
    assert_eq!(continued[..ids.len()], ids[..]);
    // One pass over the prompt, and chunks of 7 (chunk boundaries inside the image's pads).
    for chunk in [512, 7] {
        let (got, mut cache) = prefill_logits(&m, &ids, &[fixture_image()], chunk);
        let d = max_abs(&got, &want);
        println!("chunk {chunk}: prompt logits max |diff| {d:.3e}");
        assert!(d <= F32_TOL, "chunk {chunk}: max |diff| {d}");
        // Decoding the text after the image one token at a time: positions continue at offset + rope_delta.
        let mut rows = got[got.len() - 4096..].to_vec();
        for &id in &continued[ids.len()..] {
            let h = m.forward(&Array::from_slice(&[id as i32], &[1, 1]).unwrap(), &mut cache).unwrap();
            rows.extend(m.logits(&h).unwrap().to_f32_vec().unwrap());
        }
        let d = max_abs(&rows, &want_next);
        println!("chunk {chunk}: decode logits after the image max |diff| {d:.3e}");
        assert!(d <= F32_TOL, "chunk {chunk}: decode max |diff| {d}");
    }
}

/// The checks above have teeth: the same prompt without M-RoPE positions, or without the image features,
/// misses the reference by far more than the tolerance.
#[test]
fn positions_and_features_matter() {
    let m = vlm();
    let ids = read_ids(&reference(), "input_ids");
    let (want, _) = read_f32(&reference(), "logits");
    let idx: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let t = ids.len() as i32;
    let feats = m.encode_images(&pixels(&fixture_image()), &[fixture_image().grid_thw]).unwrap();
    let first = ids.iter().position(|&id| id == 5).unwrap() as i32;
    let rows: Vec<i32> = (0..t).map(|p| if ids[p as usize] == 5 { t + p - first } else { p }).collect();
    let table = mlx::concatenate(&[&m.embed(&Array::from_slice(&idx, &[t]).unwrap()).unwrap(), &feats], 0).unwrap();
    let h = table.take(&Array::from_slice(&rows, &[t]).unwrap(), 0).unwrap().expand_dims(&[0]).unwrap();
    let plain = m.logits(&m.forward_embeddings(&h, &mut m.make_cache()).unwrap()).unwrap().to_f32_vec().unwrap();
    let no_image = m
        .logits(&m.forward(&Array::from_slice(&idx, &[1, t]).unwrap(), &mut m.make_cache()).unwrap())
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let (d_plain, d_text) = (max_abs(&plain, &want), max_abs(&no_image, &want));
    println!("plain 1-D positions: {d_plain:.3e}; pad embeddings instead of features: {d_text:.3e}");
    assert!(d_plain > 100.0 * F32_TOL && d_text > 100.0 * F32_TOL);
}

#[test]
fn preprocessor_config_is_read() {
    let p = ImageProcessor::from_model_dir(&fixture("tiny-vlm")).unwrap();
    assert_eq!(
        (p.min_pixels, p.max_pixels, p.patch_size, p.temporal_patch_size, p.merge_size),
        (4096, 1048576, 16, 2, 2)
    );
    let defaults = ImageProcessor::from_model_dir(&tiny_model_dir()).unwrap(); // no preprocessor_config.json
    assert_eq!((defaults.min_pixels, defaults.max_pixels), (65_536, 16_777_216));
    let legacy = serde_json::json!({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14});
    let p = ImageProcessor::from_json(&legacy, Path::new("preprocessor_config.json")).unwrap();
    assert_eq!((p.min_pixels, p.max_pixels, p.patch_size), (3136, 12845056, 14));
    let bad = serde_json::json!({"size": {"shortest_edge": -4}});
    let e = ImageProcessor::from_json(&bad, Path::new("x/preprocessor_config.json")).unwrap_err().to_string();
    assert!(e.contains("x/preprocessor_config.json") && e.contains("size.shortest_edge") && e.contains("-4"), "{e}");
}

/// Our pixel_values for the committed images against transformers' Qwen2VLImageProcessor (torchvision backend)
/// after its `load_image` (EXIF transpose, RGB).
/// - PNG, WebP (lossless) and GIF: identical (max |diff| 0 measured), resized or not: the resampler reproduces
///   torchvision's fixed-point bicubic antialias exactly, and normalisation is the same f32 expression.
/// - JPEG: the decoders differ (zune-jpeg here, libjpeg-turbo in Pillow; the standard allows IDCT and chroma
///   upsampling to vary), measured max 4 levels of 255 (0.031 after normalisation by 127.5) on a few percent of
///   values, mean |diff| <= 6e-4. Bounds: max 6 levels, mean 1.5e-3 (0.2 levels).
#[test]
fn preprocessing_matches_transformers() {
    let vref = fixture("vision-reference.safetensors");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("vision-reference.json")).unwrap()).unwrap();
    let cases = meta["cases"].as_object().unwrap();
    assert!(cases.len() >= 8);
    for (case, c) in cases {
        let mut p = ImageProcessor::from_model_dir(&fixture("tiny-vlm")).unwrap();
        p.min_pixels = c["min_pixels"].as_u64().unwrap();
        p.max_pixels = c["max_pixels"].as_u64().unwrap();
        let file = c["image"].as_str().unwrap();
        let got = p.load_file(&fixture(file)).unwrap();
        let (want, shape) = read_f32(&vref, &format!("{case}.pixel_values"));
        assert_eq!(got.grid_thw.to_vec(), read_ids(&vref, &format!("{case}.image_grid_thw")), "{case}");
        assert_eq!([got.pixel_values.len() / got.patch_dim, got.patch_dim], [shape[0], shape[1]], "{case}");
        let (max, mean) = (max_abs(&got.pixel_values, &want), mean_abs(&got.pixel_values, &want));
        println!("{case} ({file}): max |diff| {max:.3e}, mean {mean:.3e}");
        if file.ends_with(".jpg") {
            assert!(max <= 6.0 / 127.5 && mean <= 1.5e-3, "{case}: max {max}, mean {mean}");
        } else {
            assert_eq!(max, 0.0, "{case}");
        }
    }
    // The image of tiny-vlm-reference (its processor output, not resized).
    let p = ImageProcessor::from_model_dir(&fixture("tiny-vlm")).unwrap();
    let got = p.load_file(&fixture("images/black-canyon-96x64.png")).unwrap();
    assert_eq!(got.grid_thw, fixture_image().grid_thw);
    assert_eq!(max_abs(&got.pixel_values, &fixture_image().pixel_values), 0.0);
}

fn mean_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
}

/// A PNG whose header declares `w x h` pixels, followed by a few bytes of image data.
fn png_header(w: u32, h: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend((data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend(kind);
        out.extend(data);
        let crc = out[start..].iter().fold(0xFFFF_FFFFu32, |c, &b| {
            (0..8).fold(c ^ b as u32, |c, _| if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 })
        }) ^ 0xFFFF_FFFF;
        out.extend(crc.to_be_bytes());
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = [w.to_be_bytes(), h.to_be_bytes()].concat();
    ihdr.extend([8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &[0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01]);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// The process's peak resident memory (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

#[test]
fn bad_images_are_refused_with_the_file_named() {
    let dir = tempdir();
    let p = ImageProcessor::default();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let good = std::fs::read(fixture("images/black-canyon-96x64.png")).unwrap();
    let mut flipped = good.clone();
    let n = flipped.len();
    flipped[n / 2..n / 2 + 64].iter_mut().for_each(|b| *b ^= 0x5a);
    let cases: Vec<(PathBuf, &str)> = vec![
        (write("truncated.png", &good[..good.len() / 2]), "cannot decode"),
        (write("flipped.png", &flipped), "cannot decode"),
        (write("empty.png", b""), "not an image"),
        (write("zero-size.png", &png_header(0, 0)), "dimensions"),
        (write("zero-size.gif", b"GIF89a\0\0\0\0\0\0\0\x2c\0\0\0\0\0\0\0\0\0\x02\x02\x44\x01\0\x3b"), "0x0"),
        (write("notes.png", b"Call me Ishmael. Some years ago, never mind how long precisely."), "not an image"),
        (write("huge.png", &png_header(20_000, 20_000)), "limit"),
    ];
    let before = peak_rss();
    for (path, says) in &cases {
        let e = p.load_file(path).expect_err(&path.display().to_string()).to_string();
        println!("{e}");
        assert!(e.contains(&path.display().to_string()), "names the file: {e}");
        assert!(e.contains(says), "{e} (expected `{says}`)");
    }
    let grown = peak_rss().saturating_sub(before);
    // Decoding 20000x20000 RGB would take 1.2 GB; refusing the header costs nothing.
    assert!(grown < 256 << 20, "peak memory grew by {grown} bytes");
    let e = p.load_file(&dir.path().join("missing.png")).unwrap_err().to_string();
    assert!(e.contains("missing.png"), "{e}");
    let e = p.load_bytes(&png_header(20_000, 20_000), "upload #1").unwrap_err();
    assert!(matches!(e, ImageError::TooManyPixels { width: 20_000, height: 20_000, .. }), "{e}");
    assert!(e.to_string().starts_with("upload #1: the image is 20000x20000 pixels"), "{e}");
}

fn greedy_opts(n: usize, mtp: Option<MtpOptions>) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        mtp: mtp.unwrap_or(MtpOptions { enabled: false, ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn a_text_only_model_refuses_images() {
    let m = model::load(&tiny_model_dir(), &LoadOptions::default()).unwrap();
    assert!(!m.has_vision());
    let prompt = Prompt { ids: vec![1, 2, 3], images: vec![fixture_image()] };
    let e = generate_prompt(&m, &prompt, &greedy_opts(4, None), &mut |_| Control::Continue).unwrap_err();
    assert!(matches!(e, GenerateError::NoVision { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("tandem-tiny") && msg.contains("no vision tower"), "{msg}");
    assert!(m
        .encode_images(&pixels(&fixture_image()), &[fixture_image().grid_thw])
        .unwrap_err()
        .to_string()
        .contains("tandem-tiny"));
}

/// tandem-tiny (trained text model and MTP head) with a small random vision tower grafted on: `visual.safetensors`
/// beside a copy of its weights, and a `vision_config` in its config. Its greedy text after an image is not
/// degenerate and its MTP head accepts drafts, unlike the random tiny VLM's.
pub(crate) fn tandem_tiny_with_eyes(dir: &Path) -> Qwen35 {
    let src = tiny_model_dir();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let (hv, iv, out) = (32usize, 64usize, 256usize);
    config["vision_config"] = serde_json::json!({"depth": 2, "hidden_size": hv, "intermediate_size": iv, "num_heads": 2,
        "out_hidden_size": out, "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("patch_embed.proj.weight".into(), vec![hv, 3, 2, 16, 16]),
        ("patch_embed.proj.bias".into(), vec![hv]),
        ("pos_embed.weight".into(), vec![2304, hv]),
        ("merger.norm.weight".into(), vec![hv]),
        ("merger.norm.bias".into(), vec![hv]),
        ("merger.linear_fc1.weight".into(), vec![4 * hv, 4 * hv]),
        ("merger.linear_fc1.bias".into(), vec![4 * hv]),
        ("merger.linear_fc2.weight".into(), vec![out, 4 * hv]),
        ("merger.linear_fc2.bias".into(), vec![out]),
    ];
    for j in 0..2 {
        for (name, shape) in [
            ("norm1.weight", vec![hv]),
            ("norm1.bias", vec![hv]),
            ("norm2.weight", vec![hv]),
            ("norm2.bias", vec![hv]),
            ("attn.qkv.weight", vec![3 * hv, hv]),
            ("attn.qkv.bias", vec![3 * hv]),
            ("attn.proj.weight", vec![hv, hv]),
            ("attn.proj.bias", vec![hv]),
            ("mlp.linear_fc1.weight", vec![iv, hv]),
            ("mlp.linear_fc1.bias", vec![iv]),
            ("mlp.linear_fc2.weight", vec![hv, iv]),
            ("mlp.linear_fc2.bias", vec![hv]),
        ] {
            shapes.push((format!("blocks.{j}.{name}"), shape));
        }
    }
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let norm_weight =
                name.ends_with("norm.weight") || name.contains(".norm1.weight") || name.contains(".norm2.weight");
            let bytes = (0..n)
                .flat_map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let u = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // uniform in [-0.5, 0.5)
                    (if norm_weight { 1.0 + 0.1 * u } else { 0.1 * u }).to_le_bytes()
                })
                .collect();
            (format!("model.visual.{name}"), shape, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .iter()
        .map(|(name, shape, bytes)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes).unwrap())
        })
        .collect();
    std::fs::write(dir.join("visual.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    model::load(dir, &LoadOptions { dtype: Some(Dtype::F32), ..Default::default() })
        .expect("load tandem-tiny with a vision tower")
}

#[test]
fn greedy_with_an_image_is_the_same_with_and_without_mtp() {
    let ids = read_ids(&reference(), "input_ids");
    // The image through the chat template's single pad (generate_prompt expands it) and already expanded.
    let first = ids.iter().position(|&id| id == 5).unwrap();
    let mut rendered: Vec<u32> = ids.iter().copied().filter(|&id| id != 5).collect();
    rendered.insert(first, 5);
    let dir = tempdir();
    for (name, m) in [("tiny-vlm", vlm()), ("tandem-tiny + vision", tandem_tiny_with_eyes(dir.path()))] {
        assert!(m.has_vision() && m.has_mtp(), "{name}: {:?}", m.mtp_status);
        let run = |prompt: &Prompt, mtp: Option<MtpOptions>| {
            let out = generate_prompt(&m, prompt, &greedy_opts(32, mtp), &mut |_| Control::Continue).unwrap();
            (out.tokens, out.stats)
        };
        let prompt = Prompt { ids: ids.clone(), images: vec![fixture_image()] };
        let (plain, stats) = run(&prompt, None);
        assert_eq!((plain.len(), stats.prompt_tokens), (32, ids.len()), "{name}");
        assert_eq!(run(&Prompt { ids: rendered.clone(), images: vec![fixture_image()] }, None).0, plain, "{name}");
        println!("{name}: {plain:?}");
        for depth in [1, 2, 3] {
            for exact_verify in [false, true] {
                let (spec, stats) = run(
                    &prompt,
                    Some(MtpOptions { enabled: true, depth, adaptive: false, exact_verify, ..Default::default() }),
                );
                assert_eq!(spec, plain, "{name}: depth {depth}, exact_verify {exact_verify}");
                let s = stats.spec.expect("spec stats");
                assert!(s.cycles > 0 && s.drafted > 0, "{name}: depth {depth}: {s:?}");
                println!("{name}: depth {depth}, exact verify {exact_verify}: acceptance {:.2}", s.acceptance);
                if name.starts_with("tandem-tiny") {
                    assert!(s.accepted > 0, "the trained head accepts drafts after an image: {s:?}");
                }
            }
        }
    }
}

/// Speculative rollback after an image: verify 4 continuation tokens in one pass, keep a prefix, and the next
/// token's logits still match transformers (the KV trim keeps each cache's rope delta).
#[test]
fn rollback_after_an_image_keeps_positions() {
    let m = vlm();
    let ids = read_ids(&reference(), "input_ids");
    let vref = fixture("vision-reference.safetensors");
    let continued = read_ids(&vref, "continued_ids");
    let (want_next, _) = read_f32(&vref, "continued_logits");
    let n = ids.len();
    let tokens =
        |t: &[u32]| Array::from_slice(&t.iter().map(|&x| x as i32).collect::<Vec<_>>(), &[1, t.len() as i32]).unwrap();
    for keep in 1..=4 {
        let (_, mut cache) = prefill_logits(&m, &ids, &[fixture_image()], 512);
        let mut tx = tandem::cache::Verify::begin(&mut cache, 4);
        m.forward(&tokens(&continued[n..n + 4]), tx.cache()).unwrap();
        tx.commit(keep).unwrap();
        let h = m.forward(&tokens(&continued[n + keep..n + keep + 1]), &mut cache).unwrap();
        let got = m.logits(&h).unwrap().to_f32_vec().unwrap();
        let d = max_abs(&got, &want_next[(keep + 1) * 4096..(keep + 2) * 4096]);
        assert!(d <= F32_TOL, "keep {keep}: max |diff| {d}");
    }
}

/// A copy of tiny-vlm in `dir` whose tensors went through `edit` (which may rename, change or drop them).
fn edited_tiny_vlm(
    dir: &Path,
    edit: impl Fn(&str, Vec<usize>, Vec<u8>) -> Option<(String, Vec<usize>, Vec<u8>)>,
) -> Result<Qwen35, model::LoadError> {
    let src = fixture("tiny-vlm");
    for f in ["config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let data: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter_map(|(name, t)| {
            edit(&name, t.shape().to_vec(), t.data().to_vec()).map(|(n, shape, raw)| (n, t.dtype(), shape, raw))
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .iter()
        .map(|(n, d, s, r)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), r).unwrap()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    model::load(dir, &LoadOptions { dtype: Some(Dtype::F32), ..Default::default() })
}

/// The vision tower under MLX names (`vision_tower.*`), with the patch embedding in mlx-vlm's layout
/// `[out, T, P, P, C]` or kept in PyTorch's (Tandem's converter keeps vision tensors as they are), loads and
/// computes exactly what the raw checkpoint does.
#[test]
fn vision_tower_loads_under_mlx_names_in_either_conv_layout() {
    let m = vlm();
    let img = fixture_image();
    let want = m.encode_images(&pixels(&img), &[img.grid_thw]).unwrap().to_f32_vec().unwrap();
    for mlx_layout in [false, true] {
        let dir = tempdir();
        let renamed = edited_tiny_vlm(dir.path(), |name, mut shape, mut raw| {
            if name == "model.visual.patch_embed.proj.weight" && mlx_layout {
                // [O, C, T, P, P] -> [O, T, P, P, C] (bf16: 2 bytes per value)
                let [_, c, tt, p, q] = [shape[0], shape[1], shape[2], shape[3], shape[4]];
                let mut out = vec![0u8; raw.len()];
                for (i, v) in raw.chunks_exact(2).enumerate() {
                    let (oi, rest) = (i / (c * tt * p * q), i % (c * tt * p * q));
                    let (ci, ti, pi, qi) = (rest / (tt * p * q), rest / (p * q) % tt, rest / q % p, rest % q);
                    let j = (((oi * tt + ti) * p + pi) * q + qi) * c + ci;
                    out[2 * j..2 * j + 2].copy_from_slice(v);
                }
                (shape, raw) = (vec![shape[0], tt, p, q, c], out);
            }
            Some((name.replace("model.visual.", "vision_tower."), shape, raw))
        })
        .unwrap();
        let got = renamed.encode_images(&pixels(&img), &[img.grid_thw]).unwrap().to_f32_vec().unwrap();
        assert_eq!(got, want, "MLX conv layout: {mlx_layout}");
    }
}

/// A text-only conversion of a VLM (mlx-lm drops `visual.*` and keeps `vision_config`) still loads for text
/// and refuses images saying why; a tower missing one tensor is an error naming it.
#[test]
fn vision_tensors_all_or_none() {
    let dir = tempdir();
    let m = edited_tiny_vlm(dir.path(), |name, shape, raw| {
        (!name.starts_with("model.visual.")).then(|| (name.to_string(), shape, raw))
    })
    .unwrap();
    assert!(!m.has_vision());
    let prompt = Prompt { ids: read_ids(&reference(), "input_ids"), images: vec![fixture_image()] };
    let e = generate_prompt(&m, &prompt, &greedy_opts(4, None), &mut |_| Control::Continue).unwrap_err().to_string();
    assert!(e.contains("no vision tower") && e.contains("no visual.* tensors"), "{e}");
    let dir = tempdir();
    let missing = "model.visual.blocks.1.attn.proj.bias";
    let e = edited_tiny_vlm(dir.path(), |name, shape, raw| (name != missing).then(|| (name.to_string(), shape, raw)))
        .err()
        .expect("must fail");
    assert!(e.to_string().contains("visual.blocks.1.attn.proj.bias"), "{e}");
}
