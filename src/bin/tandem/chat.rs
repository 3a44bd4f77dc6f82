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
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P. Default: the
    /// model's setting.
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Seed for sampling: the same seed gives the same tokens, with MTP on or off.
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
    /// Keep generating past the end-of-sequence token, up to --max-tokens (benchmarks, tests).
    #[arg(long)]
    ignore_eos: bool,
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
    let stop_ids = if a.ignore_eos { Vec::new() } else { loaded.tokenizer.stop_ids().to_vec() };
    let opts = generate_options(&loaded.entry, &overrides, 0, None, stop_ids)?;
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
    complete_until(l, prompt, opts, stream, &|| false)
}

/// [`complete`], stopping early once `stop()` says so (Ctrl-C in the interactive chat).
fn complete_until(
    l: &Loaded,
    prompt: &Prompt,
    opts: &GenerateOptions,
    stream: bool,
    stop: &dyn Fn() -> bool,
) -> Result<(String, Output)> {
    let mut dec = l.tokenizer.stream_decoder(true);
    let mut text = String::new();
    let mut err = None;
    let out = generate_prompt(&l.model, prompt, opts, &mut |p| {
        if stop() {
            return Control::Stop;
        }
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
    // A reply stopped by Ctrl-C leaves the step it started ahead running on MLX's stream; a `/exit` right
    // after would run MLX's static destructors beside it (a heap corruption at exit, seen once under load).
    mlx::device::synchronize().context("waiting for the stopped reply's last step")?;
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

const HELP: &str = "Commands: /help this list, /clear start a new conversation, /save FILE write the conversation \
(.md: Markdown, else JSON), /model the model and its settings, /exit quit (Ctrl-D too). Ctrl-C stops a reply.";

/// What the interactive chat does with a line.
#[derive(Debug, PartialEq)]
enum Line {
    Say(String),
    Help,
    Clear,
    Save(std::path::PathBuf),
    Model,
    Exit,
    Nothing,
    Unknown(String),
}

fn parse_line(line: &str) -> Line {
    let t = line.trim();
    let Some(cmd) = t.strip_prefix('/') else {
        return if t.is_empty() { Line::Nothing } else { Line::Say(line.trim_end_matches(['\n', '\r']).to_string()) };
    };
    let (name, arg) = cmd.split_once(char::is_whitespace).map_or((cmd, ""), |(n, a)| (n, a.trim()));
    match (name, arg) {
        ("help" | "?", _) => Line::Help,
        ("clear" | "new", _) => Line::Clear,
        ("model", _) => Line::Model,
        ("exit" | "quit" | "bye", _) => Line::Exit,
        ("save", "") => Line::Unknown("/save needs a file name: /save chat.md".into()),
        ("save", f) => Line::Save(f.into()),
        _ => Line::Unknown(format!("unknown command /{name} (/help lists them)")),
    }
}

/// The conversation as Markdown (`.md`) or JSON (`[{role, content}]`).
fn render(messages: &[Message], markdown: bool) -> Result<String> {
    let text = |m: &Message| {
        m.content
            .iter()
            .filter_map(|p| if let ContentPart::Text(t) = p { Some(t.as_str()) } else { None })
            .collect::<String>()
    };
    if markdown {
        Ok(messages.iter().map(|m| format!("**{}**\n\n{}\n", m.role, text(m))).collect::<Vec<_>>().join("\n"))
    } else {
        let v: Vec<_> = messages.iter().map(|m| serde_json::json!({"role": m.role, "content": text(m)})).collect();
        Ok(serde_json::to_string_pretty(&v)? + "\n")
    }
}

fn interactive(l: &Loaded, opts: &GenerateOptions) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    eprintln!("Chatting with {}. /help lists commands; Ctrl-C stops a reply, /exit or Ctrl-D quits.", l.entry.name);
    // Ctrl-C stops the reply being written and comes back to the prompt; at the prompt it says how
    // to quit. The conversation is never lost to a stray Ctrl-C.
    let generating = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (generating, interrupted) = (generating.clone(), interrupted.clone());
        ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                interrupted.store(true, Ordering::SeqCst);
            } else {
                eprint!("\n(/exit or Ctrl-D quits)\n> ");
            }
        })
        .context("cannot install the Ctrl-C handler")?;
    }
    let mut messages: Vec<Message> = Vec::new();
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        match parse_line(&line) {
            Line::Nothing => {}
            Line::Exit => return Ok(()),
            Line::Help => eprintln!("{HELP}"),
            Line::Unknown(why) => eprintln!("{why}"),
            Line::Clear => {
                messages.clear();
                eprintln!("(new conversation)");
            }
            Line::Model => eprintln!(
                "{} ({}): max_tokens {}, temperature {}, MTP {}",
                l.entry.name,
                l.entry.path.display(),
                opts.max_tokens,
                opts.sampling.temperature,
                if opts.mtp.enabled { format!("on, depth {}", opts.mtp.depth) } else { "off".into() }
            ),
            Line::Save(path) => {
                let markdown = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("md"));
                match render(&messages, markdown).and_then(|t| Ok(std::fs::write(&path, t)?)) {
                    Ok(()) => eprintln!("(saved {} messages to {})", messages.len(), path.display()),
                    Err(e) => eprintln!("cannot save {}: {e:#}", path.display()),
                }
            }
            Line::Say(text) => {
                messages.push(Message::user(text));
                let ids = l.tokenizer.encode_chat(&messages, true)?;
                interrupted.store(false, Ordering::SeqCst);
                generating.store(true, Ordering::SeqCst);
                let result = complete_until(l, &Prompt::text(ids), opts, true, &|| interrupted.load(Ordering::SeqCst));
                generating.store(false, Ordering::SeqCst);
                let (text, out) = match result {
                    Ok(r) => r,
                    Err(e) => {
                        // The turn failed: it leaves the conversation as it was.
                        messages.pop();
                        eprintln!("\nerror: {e:#}");
                        continue;
                    }
                };
                crate::out::line("");
                if interrupted.load(Ordering::SeqCst) {
                    eprintln!("(stopped)");
                }
                eprintln!("{}", summary(&out.stats));
                messages.push(Message::new("assistant", vec![ContentPart::Text(text)]));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_messages_or_commands() {
        assert_eq!(parse_line("hello there\n"), Line::Say("hello there".into()));
        assert_eq!(parse_line("  \n"), Line::Nothing);
        assert_eq!(parse_line("/help\n"), Line::Help);
        assert_eq!(parse_line("/clear"), Line::Clear);
        assert_eq!(parse_line("/save  notes/chat.md \n"), Line::Save("notes/chat.md".into()));
        assert!(matches!(parse_line("/save"), Line::Unknown(w) if w.contains("needs a file name")));
        assert!(matches!(parse_line("/frobnicate x"), Line::Unknown(w) if w.contains("/frobnicate")));
        assert_eq!(parse_line("/exit"), Line::Exit);
    }

    #[test]
    fn a_conversation_saves_as_markdown_or_json() {
        let m = [Message::user("hi".to_string()), Message::new("assistant", vec![ContentPart::Text("hello".into())])];
        assert_eq!(render(&m, true).unwrap(), "**user**\n\nhi\n\n**assistant**\n\nhello\n");
        let v: serde_json::Value = serde_json::from_str(&render(&m, false).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
        );
    }
}
