//! `tandem chat`: one prompt or an interactive conversation, streamed to the terminal.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem::chat::{ContentPart, Message};
use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, Output, SamplingParams, Stats};

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
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    temp: f32,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// MTP speculative decoding.
    #[arg(long, value_parser = ["on", "off"], default_value = "on")]
    mtp: String,
    /// Drafts per cycle.
    #[arg(long, default_value_t = 3)]
    depth: usize,
    /// Print one JSON object {model, text, token_ids, stats} at the end.
    #[arg(long)]
    json: bool,
}

pub fn run(a: ChatArgs) -> Result<()> {
    if !a.image.is_empty() {
        bail!("--image: this build's models are text-only (the vision tower is not available yet)");
    }
    if a.raw && a.prompt.is_none() {
        bail!("--raw needs --prompt");
    }
    let loaded = model_arg::load(a.model.as_deref())?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams { temperature: a.temp, top_p: a.top_p, seed: a.seed, ..Default::default() },
        stop_ids: loaded.tokenizer.stop_ids().to_vec(),
        mtp: MtpOptions { enabled: a.mtp == "on", depth: a.depth, ..Default::default() },
        ..Default::default()
    };
    match &a.prompt {
        Some(p) => {
            let ids = if a.raw {
                loaded.tokenizer.encode(p, true)?
            } else {
                loaded.tokenizer.encode_chat(&[Message::user(p.clone())], true)?
            };
            let (text, out) = complete(&loaded, &ids, &opts, !a.json)?;
            if a.json {
                let obj = serde_json::json!({
                    "model": model_arg::display_name(&loaded.dir),
                    "text": text,
                    "token_ids": out.tokens,
                    "stats": out.stats,
                });
                println!("{}", serde_json::to_string(&obj)?);
            } else {
                println!();
                eprintln!("{}", summary(&out.stats));
            }
            Ok(())
        }
        None => interactive(&loaded, &opts),
    }
}

/// Generates from `ids`, streaming text to stdout when `stream` is set; returns the full text.
fn complete(l: &Loaded, ids: &[u32], opts: &GenerateOptions, stream: bool) -> Result<(String, Output)> {
    let mut dec = l.tokenizer.stream_decoder(true);
    let mut text = String::new();
    let mut err = None;
    let out = generate(&l.model, ids, opts, &mut |p| {
        for &t in p.new_tokens {
            match dec.step(t) {
                Ok(Some(s)) => {
                    if stream {
                        print!("{s}");
                        let _ = std::io::stdout().flush();
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
            print!("{s}");
        }
        text.push_str(&s);
    }
    Ok((text, out))
}

fn interactive(l: &Loaded, opts: &GenerateOptions) -> Result<()> {
    eprintln!("Chatting with {} (empty line or Ctrl-D to quit)", model_arg::display_name(&l.dir));
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
        let (text, out) = complete(l, &ids, opts, true)?;
        println!();
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
