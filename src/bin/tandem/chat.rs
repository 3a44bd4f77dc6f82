//! `tandem chat`: one prompt or an interactive conversation, streamed to the terminal.

use std::io::BufRead;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem::chat::{ContentPart, Message};
use tandem::engine::{generate_options, MtpOverrides, Overrides, SamplingOverrides};
use tandem::generate::{generate_prompt, Control, GenerateOptions, Output, Prompt, Stats};
use tandem::model::vision_input::{ImageInput, ImageProcessor};

use crate::model_arg::{self, Loaded};

#[derive(Args)]
pub struct ChatArgs {
    /// Model name or folder (default: the bundled model).
    #[arg(long)]
    model: Option<String>,
    /// The prompt; without it, an interactive chat.
    #[arg(long)]
    prompt: Option<String>,
    /// Feed the prompt as plain text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Images to attach (vision models).
    #[arg(long)]
    image: Vec<std::path::PathBuf>,
    /// Default: the model's setting in models.toml.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Sampling temperature (0 = greedy). Default: the model's setting.
    #[arg(long)]
    temp: Option<f32>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// MTP speculative decoding. Default: the model's setting.
    #[arg(long, value_parser = ["on", "off"])]
    mtp: Option<String>,
    /// Drafts per cycle (1 to 8). Default: the model's setting.
    #[arg(long)]
    depth: Option<usize>,
    /// Whether the adaptive controller may park drafting (off: every cycle drafts `depth`
    /// tokens). Default: the model's setting.
    #[arg(long, value_parser = ["on", "off"])]
    adaptive: Option<String>,
    /// Print one JSON object {model, text, token_ids, stats} at the end.
    #[arg(long)]
    json: bool,
}

pub fn run(a: ChatArgs) -> Result<()> {
    if a.raw && a.prompt.is_none() {
        bail!("--raw needs --prompt");
    }
    if !a.image.is_empty() && (a.raw || a.prompt.is_none()) {
        bail!("--image needs --prompt and the chat template (not --raw)");
    }
    let loaded = model_arg::load(a.model.as_deref())?;
    let images = load_images(&loaded, &a.image)?;
    // The model's settings (models.toml), then the flags: resolved as the engine resolves a request's.
    let overrides = Overrides {
        sampling: SamplingOverrides { temperature: a.temp, top_p: a.top_p, seed: a.seed, ..Default::default() },
        mtp: MtpOverrides {
            enabled: a.mtp.as_deref().map(|v| v == "on"),
            depth: a.depth,
            adaptive: a.adaptive.as_deref().map(|v| v == "on"),
        },
        max_tokens: a.max_tokens,
    };
    let opts = generate_options(&loaded.entry, &overrides, 0, None, loaded.tokenizer.stop_ids().to_vec())?;
    match &a.prompt {
        Some(p) => {
            let ids = if a.raw {
                loaded.tokenizer.encode(p, true)?
            } else {
                let mut parts = vec![ContentPart::Image; images.len()];
                parts.push(ContentPart::Text(p.clone()));
                loaded.tokenizer.encode_chat(&[Message::new("user", parts)], true)?
            };
            let prompt = Prompt { ids, images };
            let (text, out) = complete(&loaded, &prompt, &opts, !a.json)?;
            if a.json {
                let obj = serde_json::json!({
                    "model": loaded.entry.name,
                    "text": text,
                    "token_ids": out.tokens,
                    "stats": out.stats,
                });
                crate::out::line(serde_json::to_string(&obj)?);
            } else {
                crate::out::line("");
                eprintln!("{}", summary(&out.stats));
            }
            Ok(())
        }
        None => interactive(&loaded, &opts),
    }
}

/// Decodes the images for a vision model; a text-only model refuses them, naming itself.
fn load_images(l: &Loaded, paths: &[std::path::PathBuf]) -> Result<Vec<ImageInput>> {
    if paths.is_empty() {
        return Ok(vec![]);
    }
    if !l.model.has_vision() {
        bail!(
            "model `{}` has no vision tower: it cannot read images (remove --image or pick a vision model)",
            l.entry.name
        );
    }
    let processor = ImageProcessor::from_model_dir(&l.entry.path)?;
    paths.iter().map(|p| Ok(processor.load_file(p)?)).collect()
}

/// Generates from `prompt`, streaming text to stdout when `stream` is set; returns the full text.
fn complete(l: &Loaded, prompt: &Prompt, opts: &GenerateOptions, stream: bool) -> Result<(String, Output)> {
    let mut dec = l.tokenizer.stream_decoder(true);
    let mut text = String::new();
    let mut err = None;
    let out = generate_prompt(&l.model, prompt, opts, &mut |p| {
        for &t in p.new_tokens {
            match dec.step(t) {
                Ok(Some(s)) => {
                    if stream {
                        crate::out::text(&s);
                    }
                    text.push_str(&s);
                }
                Ok(None) => {}
                Err(e) => {
                    err = Some(e);
                    return Control::Stop;
                }
            }
        }
        Control::Continue
    })?;
    if let Some(e) = err {
        return Err(e).context("decoding tokens");
    }
    if let Some(s) = dec.flush()? {
        if stream {
            crate::out::text(&s);
        }
        text.push_str(&s);
    }
    Ok((text, out))
}

fn interactive(l: &Loaded, opts: &GenerateOptions) -> Result<()> {
    eprintln!("Chatting with {} (empty line or Ctrl-D to quit)", l.entry.name);
    let mut messages: Vec<Message> = Vec::new();
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        messages.push(Message::user(line.trim_end().to_string()));
        let ids = l.tokenizer.encode_chat(&messages, true)?;
        let (text, out) = complete(l, &Prompt::text(ids), opts, true)?;
        crate::out::line("");
        eprintln!("{}", summary(&out.stats));
        messages.push(Message::new("assistant", vec![ContentPart::Text(text)]));
    }
}

/// One line for people: speed and MTP figures.
pub fn summary(s: &Stats) -> String {
    let mut line = format!(
        "[{} prompt + {} tokens | TTFT {:.0} ms | prefill {:.1} tok/s | decode {:.1} tok/s",
        s.prompt_tokens, s.completion_tokens, s.ttft_ms, s.prefill_tok_s, s.decode_tok_s
    );
    if let Some(spec) = &s.spec {
        match &spec.fallback {
            Some(why) if spec.cycles == 0 => line.push_str(&format!(" | MTP off: {why}")),
            _ => line.push_str(&format!(
                " | MTP depth {}: acceptance {:.1}%, {:.2} tok/cycle",
                spec.depth,
                spec.acceptance * 100.0,
                spec.tok_per_cycle
            )),
        }
    }
    line.push(']');
    line
}
