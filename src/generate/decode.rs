//! The decode loop: prefill, then a [`Decoder`] step after step (one token, or an MTP cycle's),
//! each batch of new tokens reported through a callback that can stop the run (cancellation, stop
//! sequences).

use std::time::Instant;

use super::decoder::{Decoder, Start};
use super::error::{GenerateError, Result};
use super::options::GenerateOptions;
use super::prefill::{no_vision, prefill, prefill_images};
use super::sampler::{Sampler, TokenLogprob};
use super::stats::Stats;
use super::step::sample_last;
use crate::cache::Snapshot;
use crate::model::vision_input::{expand_image_pads, ImageInput};
use crate::model::Qwen35;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

/// What the callback sees after each batch of new tokens.
pub struct Progress<'a> {
    pub new_tokens: &'a [u32],
    pub stats: &'a Stats,
    /// One per new token when log-probabilities were asked for, else empty.
    pub logprobs: &'a [TokenLogprob],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

#[derive(Debug, Clone)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub stats: Stats,
    pub finish: FinishReason,
    /// One per token when log-probabilities were asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Snapshots taken for the prefix cache ([`Resume::keep`]).
    pub kept: Vec<Kept>,
}

/// What a generation reuses and keeps of its state (the engine's prefix cache, docs/MODEL.md §4.6).
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// The state after the prompt's first `len` tokens, restored instead of prefilled.
    pub restored: Option<Snapshot>,
    /// Take snapshots at the end of prefill and at the end of the generation (the prompt and the
    /// reply, which the next turn of a chat resends), KV cut in blocks of this many tokens.
    pub keep: Option<usize>,
}

/// A snapshot taken during a generation, and the tokens it covers (the prompt's first).
#[derive(Debug, Clone)]
pub struct Kept {
    pub tokens: Vec<u32>,
    pub snapshot: Snapshot,
}

/// A prompt that may hold images.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    /// Token ids. Each image is either one `<|image_pad|>` (as the chat template renders it), which
    /// is expanded here, or already its [`ImageInput::tokens`] pads (`vision_input::expand_image_pads`).
    pub ids: Vec<u32>,
    /// The images, in the order of their pads (`vision_input::ImageProcessor` makes them).
    pub images: Vec<ImageInput>,
}

impl Prompt {
    pub fn text(ids: Vec<u32>) -> Prompt {
        Prompt { ids, images: Vec::new() }
    }
}

/// Runs the prompt and generates up to `max_tokens` tokens.
pub fn generate(
    model: &Qwen35,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    generate_with(model, prompt, &[], opts, Resume::default(), on_progress)
}

/// [`generate`] for a prompt with images: the vision tower encodes them and their features replace
/// the image pads during prefill, at M-RoPE positions. A model without a vision tower refuses.
pub fn generate_prompt(
    model: &Qwen35,
    prompt: &Prompt,
    opts: &GenerateOptions,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    generate_resumed(model, prompt, opts, Resume::default(), on_progress)
}

/// [`generate_prompt`] from a restored prefix state, keeping snapshots as `resume` asks.
pub fn generate_resumed(
    model: &Qwen35,
    prompt: &Prompt,
    opts: &GenerateOptions,
    resume: Resume,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    if prompt.images.is_empty() {
        return generate_with(model, &prompt.ids, &[], opts, resume, on_progress);
    }
    let vision = model.vision().ok_or_else(|| no_vision(model))?;
    let image_id = vision
        .config
        .image_token_id
        .ok_or_else(|| GenerateError::Images(format!("model `{}`: config.json has no image_token_id", model.name())))?;
    let pads = prompt.ids.iter().filter(|&&id| id == image_id).count();
    let ids = if pads == prompt.images.len() && pads != prompt.images.iter().map(ImageInput::tokens).sum::<usize>() {
        expand_image_pads(&prompt.ids, image_id, &prompt.images).map_err(|e| GenerateError::Images(e.to_string()))?
    } else {
        prompt.ids.clone()
    };
    // Snapshots are keyed by the caller's positions: a prompt expanded here has others.
    let resume = if ids.len() == prompt.ids.len() { resume } else { Resume::default() };
    generate_with(model, &ids, &prompt.images, opts, resume, on_progress)
}

fn generate_with(
    model: &Qwen35,
    prompt: &[u32],
    images: &[ImageInput],
    opts: &GenerateOptions,
    resume: Resume,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    opts.check(model, prompt)?;
    let mut sampler = Sampler::new(opts.sampling.clone())?
        .with_prompt_len(prompt.len())
        .with_constraint(opts.constraint.clone())
        .with_logprobs(opts.logprobs);
    let t0 = Instant::now();
    let restored =
        resume.restored.filter(|s| (1..=prompt.len()).contains(&s.len) && !inside_image(model, prompt, s.len));
    let start = restored.as_ref().map_or(0, |s| s.len);
    let (mut cache, head) = match &restored {
        Some(s) => s.restore()?,
        None => (model.make_cache(), None),
    };
    let rest = if start == prompt.len() {
        None
    } else if images.is_empty() {
        Some(prefill(model, &prompt[start..], &mut cache, opts.prefill_chunk)?)
    } else {
        Some(prefill_images(model, prompt, start, images, &mut cache, opts.prefill_chunk)?)
    };
    // The hidden states from the restored prefix's last position on: it samples the first token
    // when the whole prompt was cached, and pairs with the rest's first token for the MTP head.
    let hidden = match (restored.as_ref().map(|s| &s.last_hidden), rest) {
        (Some(h), Some(r)) => mlx::concatenate(&[h, &r], 1)?,
        (Some(h), None) => h.clone(),
        (None, Some(r)) => r,
        (None, None) => return Err(GenerateError::EmptyPrompt),
    };
    let mut history: Vec<u32> = prompt.to_vec();
    let first = sample_last(model, &mut sampler, &hidden, &history)?;
    let ttft = t0.elapsed().as_secs_f64();
    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        cached_tokens: start,
        ttft_ms: ttft * 1e3,
        prefill_tok_s: (prompt.len() - start) as f64 / ttft.max(1e-9),
        ..Default::default()
    };

    let mut next_tokens = prompt[start.max(1)..].to_vec();
    next_tokens.push(first);
    let start_state = Start { cache, hidden, next_tokens, head, first };
    let mut decoder = Decoder::new(model, opts, start_state, &mut stats)?;
    let mut kept = Vec::new();
    if let Some(block) = resume.keep.filter(|_| start < prompt.len()) {
        keep(&mut decoder, &history, block, &mut kept);
    }
    let mut run = Run {
        opts,
        tokens: Vec::new(),
        logprobs: Vec::new(),
        finish: None,
        stats: &mut stats,
        on_progress,
        t_decode: Instant::now(),
    };
    run.emit(&[first], sampler.take_logprobs());
    while run.finish.is_none() {
        let remaining = opts.max_tokens - run.tokens.len();
        let new = decoder.step(&mut sampler, &mut history, remaining, run.stats)?;
        run.emit(&new, sampler.take_logprobs());
    }
    decoder.finish(run.stats);
    if let Some(block) = resume.keep {
        if kept.last().is_none_or(|k: &Kept| k.tokens.len() != history.len()) {
            keep(&mut decoder, &history, block, &mut kept);
        }
    }
    let finish = run.finish.unwrap_or(FinishReason::Length);
    let tokens = std::mem::take(&mut run.tokens);
    let logprobs = std::mem::take(&mut run.logprobs);
    let decode_s = run.t_decode.elapsed().as_secs_f64();
    stats.completion_tokens = tokens.len();
    // The first token belongs to prefill (TTFT); decode speed counts the rest.
    stats.decode_tok_s = if tokens.len() > 1 { (tokens.len() - 1) as f64 / decode_s.max(1e-9) } else { 0.0 };
    Ok(Output { tokens, stats, finish, logprobs, kept })
}

/// Whether position `at` falls between two image pads (a prefix cannot end inside an image: the
/// rest's images are encoded whole).
fn inside_image(model: &Qwen35, prompt: &[u32], at: usize) -> bool {
    let pad = model.vision().and_then(|v| v.config.image_token_id);
    pad.is_some_and(|pad| at > 0 && prompt[at - 1] == pad && prompt.get(at) == Some(&pad))
}

/// Snapshots the decoder's state for the prefix cache; a failure costs the cache entry, not the
/// generation.
fn keep(decoder: &mut Decoder<'_>, history: &[u32], block: usize, kept: &mut Vec<Kept>) {
    match decoder.snapshot(history, block) {
        Ok((tokens, snapshot)) => kept.push(Kept { tokens, snapshot }),
        Err(e) => tracing::warn!("prefix cache: no snapshot after {} tokens: {e}", history.len()),
    }
}

struct Run<'a, 'b> {
    opts: &'a GenerateOptions,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    finish: Option<FinishReason>,
    stats: &'a mut Stats,
    on_progress: &'b mut dyn FnMut(Progress<'_>) -> Control,
    t_decode: Instant,
}

impl Run<'_, '_> {
    /// Appends tokens up to a stop token or the length limit, then reports them.
    fn emit(&mut self, new: &[u32], mut logprobs: Vec<TokenLogprob>) {
        let start = self.tokens.len();
        for &t in new {
            if self.finish.is_some() {
                break;
            }
            if self.opts.stop_ids.contains(&t) {
                self.finish = Some(FinishReason::Stop);
                break;
            }
            self.tokens.push(t);
            if self.tokens.len() >= self.opts.max_tokens {
                self.finish = Some(FinishReason::Length);
            }
        }
        if start == 0 {
            self.t_decode = Instant::now();
        }
        // The records follow the draws; the tokens kept are a prefix of them.
        logprobs.truncate(self.tokens.len() - start);
        let from = self.logprobs.len();
        self.logprobs.extend(logprobs);
        self.stats.completion_tokens = self.tokens.len();
        let elapsed = self.t_decode.elapsed().as_secs_f64();
        if self.tokens.len() > 1 && elapsed > 0.0 {
            self.stats.decode_tok_s = (self.tokens.len() - 1) as f64 / elapsed;
        }
        let progress =
            Progress { new_tokens: &self.tokens[start..], stats: self.stats, logprobs: &self.logprobs[from..] };
        if (self.on_progress)(progress) == Control::Stop && self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
        }
    }
}
