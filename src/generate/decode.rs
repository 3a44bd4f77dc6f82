//! The decode loop: prefill, then a [`Decoder`] step after step (one token, or an MTP cycle's),
//! each batch of new tokens reported through a callback that can stop the run (cancellation, stop
//! sequences).

use super::decoder::Decoder;
use super::error::{GenerateError, Result};
use super::options::GenerateOptions;
use super::prefill::no_vision;
use super::sampler::TokenLogprob;
use super::sequence::Sequence;
use super::stats::Stats;
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
    /// With `keep`, also snapshot a text prompt inside its prefill every this many tokens (a
    /// multiple of `keep`): a later prompt that shares only part of this one (an edited message,
    /// another question after the same documents) resumes from the last such boundary before
    /// they differ, where the linear-attention state cannot be cut back.
    pub every: Option<usize>,
}

/// A snapshot taken during a generation, and the tokens it covers (the prompt's first).
#[derive(Debug, Clone)]
pub struct Kept {
    pub tokens: Vec<u32>,
    pub snapshot: Snapshot,
    /// Taken inside a prompt's prefill ([`Resume::every`]): worth keeping only while there is room,
    /// so a cache evicts it before any turn's end.
    pub inside: bool,
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
    let (ids, resume) = expanded(model, prompt, resume)?;
    generate_with(model, &ids, &prompt.images, opts, resume, on_progress)
}

/// The prompt's token ids with each image's single pad expanded to its feature count (a prompt
/// without images as it is), and the resume state that still applies to them.
pub(super) fn expanded(model: &Qwen35, prompt: &Prompt, resume: Resume) -> Result<(Vec<u32>, Resume)> {
    if prompt.images.is_empty() {
        return Ok((prompt.ids.clone(), resume));
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
    Ok((ids, resume))
}

fn generate_with(
    model: &Qwen35,
    prompt: &[u32],
    images: &[ImageInput],
    opts: &GenerateOptions,
    resume: Resume,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    let mut seq = Sequence::start(model, prompt, images, opts.clone(), resume, on_progress)?;
    while !seq.is_done() {
        seq.step(true, on_progress)?;
    }
    Ok(seq.finish())
}

/// Whether position `at` falls between two image pads (a prefix cannot end inside an image: the
/// rest's images are encoded whole).
pub(super) fn inside_image(model: &Qwen35, prompt: &[u32], at: usize) -> bool {
    let pad = model.vision().and_then(|v| v.config.image_token_id);
    pad.is_some_and(|pad| at > 0 && prompt[at - 1] == pad && prompt.get(at) == Some(&pad))
}

/// Snapshots the decoder's state for the prefix cache; a failure costs the cache entry, not the
/// generation.
pub(super) fn keep(decoder: &mut Decoder<'_>, history: &[u32], block: usize, kept: &mut Vec<Kept>) {
    match decoder.snapshot(history, block) {
        Ok((tokens, snapshot)) => kept.push(Kept { tokens, snapshot, inside: false }),
        Err(e) => tracing::warn!("prefix cache: no snapshot after {} tokens: {e}", history.len()),
    }
}
