//! Images through `tandem serve` end to end, on a loopback ephemeral port: the tiny vision checkpoint
//! (tests/fixtures/tiny-vlm, random weights) reads a picture sent as a data URL or a file URL, its
//! tokens count in `usage.prompt_tokens`, and its greedy answer (streamed or not, with MTP or
//! without) is exactly what `tandem::generate::generate_prompt` gives for the same ids and image.
//! Bad images, images for a text-only model (the bundled tandem-tiny) and file URLs outside the
//! allowed folders are refused with the API's error codes.
//!
//! HTTP is spoken by hand over a TcpStream (`Connection: close`).

use crate::common;

use std::path::PathBuf;

use crate::common::http::{post_json, Reply};
use base64::Engine as _;
use serde_json::{json, Value};
use tandem::chat::{ChatOptions, ContentPart, Message, Tokenizer};
use tandem::engine::{ChatMessage, Engine, EngineConfig, Image, Input, MtpOverrides, Part, Request};
use tandem::generate::{generate, generate_prompt, Control, GenerateOptions, MtpOptions, Prompt, SamplingParams};
use tandem::model::vision_input::{expand_image_pads, ImageProcessor};
use tandem::model::{self, LoadOptions};
use tandem::registry::Registry;
use tandem::server::{start_with_engine, RunningServer, ServeConfig};

const VLM: &str = "vlm";
const TEXT: &str = "tiny";
const QUESTION: &str = "What is in this picture?";
/// Generated tokens per answer (past end-of-sequence: the random model may end at once).
const N: usize = 12;
/// Sampling at which the random model's answer changes with the picture's pixels (checked each run).
const SEED: u64 = 9;
const TEMPERATURE: f32 = 0.2;

fn canyon() -> PathBuf {
    common::fixture("images/black-canyon-96x64.png")
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A models.toml in a fresh folder: `vlm` (tiny-vlm, the default) and `tiny` (the bundled text
/// model), both greedy with MTP on, and an empty models folder beside it.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = common::tempdir();
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        let sampling = "sampling = { temperature = 0.0, top_p = 1.0, top_k = 0, min_p = 0.0, repetition_penalty = 1.0, max_tokens = 32 }";
        let toml = format!(
            "models_dir = \"{}\"\ndefault = \"{VLM}\"\n\n\
             [[model]]\nname = \"{VLM}\"\npath = \"{}\"\nmtp = {{ enabled = true, depth = 3 }}\n{sampling}\n\n\
             [[model]]\nname = \"{TEXT}\"\npath = \"{}\"\nmtp = {{ enabled = true, depth = 3 }}\n{sampling}\n",
            dir.path().join("models").display(),
            common::fixture("tiny-vlm").display(),
            common::tiny_model_dir().display()
        );
        std::fs::write(dir.path().join("models.toml"), toml).unwrap();
        Setup { dir }
    }

    async fn start(&self, image_dirs: Vec<PathBuf>) -> RunningServer {
        let path = self.dir.path().join("models.toml");
        let mut config = ServeConfig::new(&path);
        config.port = 0;
        config.api_key = None;
        config.ui_dir = self.dir.path().join("ui-dist");
        config.image_dirs = image_dirs;
        let engine = Engine::new(Registry::load(&path).unwrap(), EngineConfig::default());
        start_with_engine(config, engine).await.expect("server starts")
    }
}

async fn post(addr: std::net::SocketAddr, body: &Value) -> Reply {
    post_json(addr, "/v1/chat/completions", body).await
}

/// A user turn of images (as URLs) then the question.
fn chat(model: &str, urls: &[&str], extra: Value) -> Value {
    let mut content: Vec<Value> = urls.iter().map(|u| json!({"type": "image_url", "image_url": {"url": u}})).collect();
    content.push(json!({"type": "text", "text": QUESTION}));
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": N, "ignore_eos": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// What the library gives for the prompt the server should build: the chat template's ids (one
/// `<|image_pad|>`), the image from the model's processor, greedy, no stop tokens.
struct Direct {
    /// Template ids, one pad for the image.
    ids: Vec<u32>,
    /// The same, the pad expanded to the image's tokens.
    expanded: Vec<u32>,
    /// Greedy tokens with MTP (depth 3, as models.toml says) and without.
    with_mtp: Vec<u32>,
    without_mtp: Vec<u32>,
    text_with_mtp: String,
    /// Sampled at [`TEMPERATURE`] with [`SEED`] (MTP on): unlike the random model's greedy answer,
    /// which repeats one token whatever the picture, these change with its pixels.
    sampled: Vec<u32>,
    sampled_text: String,
    /// The image's `<|image_pad|>` tokens once expanded.
    image_tokens: usize,
}

fn direct(engine: &Engine) -> Direct {
    let dir = common::fixture("tiny-vlm");
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let messages = [Message::new("user", vec![ContentPart::Image, ContentPart::Text(QUESTION.into())])];
    let ids = tokenizer
        .encode_chat_with(&messages, &ChatOptions { add_generation_prompt: true, enable_thinking: None, tools: None })
        .unwrap();
    let processor = ImageProcessor::from_model_dir(&dir).unwrap();
    let image = processor.load_file(&canyon()).unwrap();
    let image_tokens = image.tokens();
    let pad = tokenizer.token_id("<|image_pad|>").unwrap();
    let expanded = expand_image_pads(&ids, pad, std::slice::from_ref(&image)).unwrap();
    let prompt = Prompt { ids: ids.clone(), images: vec![image] };
    // The same picture in negative: same size and prompt, other pixels.
    let mut negative = image::open(canyon()).unwrap().into_rgb8();
    image::imageops::invert(&mut negative);
    let other = Prompt { ids: ids.clone(), images: vec![processor.preprocess(&negative, "negative").unwrap()] };
    let greedy = |enabled| GenerateOptions {
        max_tokens: N,
        sampling: SamplingParams::greedy(),
        stop_ids: Vec::new(),
        mtp: MtpOptions { enabled, depth: 3, ..MtpOptions::default() },
        ..GenerateOptions::default()
    };
    let seeded = GenerateOptions {
        sampling: SamplingParams { temperature: TEMPERATURE, seed: Some(SEED), ..SamplingParams::default() },
        ..greedy(true)
    };
    // MLX is driven by one thread at a time: the engine's models are idle meanwhile.
    let (with_mtp, without_mtp, sampled, sampled_other, sampled_blind) = engine.exclusive(|| {
        let m = model::load(&dir, &LoadOptions::default()).unwrap();
        let run = |prompt: &Prompt, opts: &GenerateOptions| {
            let out = generate_prompt(&m, prompt, opts, &mut |_| Control::Continue).unwrap();
            assert_eq!(out.stats.prompt_tokens, ids.len() - 1 + prompt.images[0].tokens());
            if opts.mtp.enabled {
                let spec = out.stats.spec.as_ref().expect("MTP ran");
                assert!(spec.drafted > 0, "{spec:?}");
            }
            out.tokens
        };
        // The pads' own embeddings at text positions: what a server that dropped the pixels would say.
        let blind = generate(&m, &expanded, &seeded, &mut |_| Control::Continue).unwrap().tokens;
        (run(&prompt, &greedy(true)), run(&prompt, &greedy(false)), run(&prompt, &seeded), run(&other, &seeded), blind)
    });
    assert_eq!((with_mtp.len(), sampled.len()), (N, N));
    assert_ne!(sampled, sampled_other, "the sampled answer depends on the pixels");
    assert_ne!(sampled, sampled_blind, "the sampled answer depends on the image features");
    let text_with_mtp = tokenizer.decode(&with_mtp, true).unwrap();
    let sampled_text = tokenizer.decode(&sampled, true).unwrap();
    Direct { ids, expanded, with_mtp, without_mtp, text_with_mtp, sampled, sampled_text, image_tokens }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn images_end_to_end() {
    let setup = Setup::new();
    // Files: one in the folder of models.toml (allowed), one in a configured image folder, one
    // outside both, and a link from the allowed folder to the one outside.
    let (extra, outside) = (common::tempdir(), common::tempdir());
    let png = std::fs::read(canyon()).unwrap();
    for d in [setup.dir.path(), extra.path(), outside.path()] {
        std::fs::write(d.join("canyon.png"), &png).unwrap();
    }
    #[cfg(unix)]
    std::os::unix::fs::symlink(outside.path().join("canyon.png"), setup.dir.path().join("link.png")).unwrap();
    let server = setup.start(vec![extra.path().to_owned()]).await;
    let a = server.addr();
    let engine = server.engine().clone();

    let want = tokio::task::spawn_blocking({
        let engine = engine.clone();
        move || direct(&engine)
    })
    .await
    .unwrap();
    // The fixture's prompt (transformers' processor): 26 ids, the image's 6 = (64/16/2) x (96/16/2) pads among them.
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixture("tiny-vlm-reference.json")).unwrap()).unwrap();
    assert_eq!(want.image_tokens, (64 / 16 / 2) * (96 / 16 / 2));
    let prompt_tokens = want.ids.len() - 1 + want.image_tokens;
    let reference_ids: Vec<u32> =
        reference["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(want.expanded, reference_ids);
    assert_eq!(prompt_tokens, 26);

    // 200, usage counts the image's tokens, the greedy text is the library's (MTP on, as configured).
    let url = data_url(&png);
    let r = post(a, &chat(VLM, &[&url], json!({}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], N, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want.text_with_mtp.as_str(), "{v}");
    assert!(v["stats"]["spec"]["drafted"].as_u64().unwrap() > 0, "MTP drafted after the image: {v}");
    let r = post(a, &chat(VLM, &[&url], json!({"temperature": TEMPERATURE, "seed": SEED}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.sampled_text.as_str());

    // The engine's tokens themselves, with MTP and without.
    let request = |mtp: bool, seed: Option<u64>| {
        let mut r = Request::new(
            VLM,
            Input::Chat(vec![ChatMessage {
                role: "user".into(),
                parts: vec![Part::Image(Image { bytes: png.clone(), media_type: None }), Part::Text(QUESTION.into())],
                tool_calls: Vec::new(),
            }]),
        );
        r.max_tokens = Some(N);
        r.ignore_eos = true;
        r.mtp = MtpOverrides { enabled: Some(mtp), depth: None, adaptive: None };
        if seed.is_some() {
            (r.sampling.temperature, r.sampling.seed) = (Some(TEMPERATURE), seed);
        }
        r
    };
    for (mtp, seed, tokens) in
        [(true, None, &want.with_mtp), (false, None, &want.without_mtp), (true, Some(SEED), &want.sampled)]
    {
        let generation = engine.chat(request(mtp, seed)).await.unwrap();
        assert_eq!(generation.prompt_tokens, prompt_tokens);
        let done = generation.collect().await.unwrap();
        assert_eq!(&done.tokens, tokens, "mtp {mtp}, seed {seed:?}");
        assert_eq!(done.stats.prompt_tokens, prompt_tokens);
    }
    let r = post(a, &chat(VLM, &[&url], json!({"mtp": {"enabled": false}}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tokenizer = Tokenizer::from_dir(&common::fixture("tiny-vlm")).unwrap();
    assert_eq!(r.json()["choices"][0]["message"]["content"], tokenizer.decode(&want.without_mtp, true).unwrap());

    // Streaming: the deltas make the same text; the usage chunk counts the image.
    let r = post(a, &chat(VLM, &[&url], json!({"stream": true, "stream_options": {"include_usage": true}}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", r.text());
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c.get("error").is_none()), "{}", r.text());
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, want.text_with_mtp);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()),
        (Some(prompt_tokens as u64), Some(N as u64))
    );

    // File URLs: inside the folder of models.toml or a configured image folder, read; the same answer.
    for dir in [setup.dir.path(), extra.path()] {
        let file = format!("file://{}", dir.join("canyon.png").display());
        let r = post(a, &chat(VLM, &[&file], json!({}))).await;
        assert_eq!(r.status, 200, "{file}: {}", r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], want.text_with_mtp.as_str());
    }
    let missing = format!("file://{}", setup.dir.path().join("missing.png").display());
    let m = post(a, &chat(VLM, &[&missing], json!({}))).await.error(400, "invalid_image");
    assert!(m.contains("missing.png"), "{m}");
    // Outside them, refused (also through a link, and whether the file exists or not).
    let mut refused = vec![outside.path().join("canyon.png"), outside.path().join("missing.png")];
    if cfg!(unix) {
        refused.push(setup.dir.path().join("link.png"));
    }
    for path in refused {
        let m =
            post(a, &chat(VLM, &[&format!("file://{}", path.display())], json!({}))).await.error(403, "path_forbidden");
        assert!(m.starts_with("image #1 (`messages[0].content[0].image_url`)") && m.contains("outside"), "{m}");
    }

    // A corrupt image: 400 invalid_image, naming it.
    let truncated = data_url(&png[..png.len() / 2]);
    let m = post(a, &chat(VLM, &[&truncated], json!({}))).await.error(400, "invalid_image");
    assert!(m.starts_with("image #1: cannot decode"), "{m}");
    let m = post(a, &chat(VLM, &[&url, &truncated], json!({"stream": true}))).await.error(400, "invalid_image");
    assert!(m.starts_with("image #2: cannot decode"), "{m}");
    let m =
        post(a, &chat(VLM, &[&url, &data_url(b"GIF89a but not really")], json!({}))).await.error(400, "invalid_image");
    assert!(m.starts_with("image #2: "), "{m}");
    let m = post(a, &chat(VLM, &[&url, &data_url(b"plain text")], json!({}))).await.error(400, "invalid_image");
    assert!(m.starts_with("image #2 (`messages[0].content[1].image_url`): not a PNG"), "{m}");
    // Too many images for one request.
    let many = vec![url.as_str(); 9];
    let m = post(a, &chat(VLM, &many, json!({}))).await.error(400, "invalid_image");
    assert!(m.contains("9 images") && m.contains("at most 8"), "{m}");

    // The text-only model refuses images, without loading itself to do so.
    let m = post(a, &chat(TEXT, &[&url], json!({}))).await.error(400, "model_not_multimodal");
    assert!(m.contains("`tiny`") && m.contains("text-only"), "{m}");
    assert!(!engine.is_loaded(TEXT));
    // ... and once loaded, still.
    engine.load(TEXT).await.unwrap();
    post(a, &chat(TEXT, &[&url], json!({}))).await.error(400, "model_not_multimodal");
    let r = post(a, &json!({"model": TEXT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // Refused requests left nothing behind: the vision model still answers.
    let r = post(a, &chat(VLM, &[&url], json!({"max_tokens": 1}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    server.shutdown().await.unwrap();
    tokio::task::spawn_blocking(move || engine.shutdown()).await.unwrap();
}
