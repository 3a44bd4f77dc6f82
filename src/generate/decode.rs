//! The decode loop: chunked prefill, then one token per step, or MTP speculative cycles (mtp.rs).
//! Emits tokens through a callback that can stop the run (cancellation, stop sequences).

use std::time::Instant;

use mlx::{Array, Dtype};
use thiserror::Error;

use super::mtp::SpecDecoder;
use super::sampler::{Sampler, SamplingParams};
use super::stats::{SpecStats, Stats};
use crate::cache::LayerCache;
use crate::model::qwen3_5::set_rope_delta;
use crate::model::vision::{rope_index, GridThw};
use crate::model::vision_input::{expand_image_pads, ImageInput};
use crate::model::Qwen35;

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens and {max_tokens} more were asked for, but the model's context is {context} tokens")]
    ContextExceeded { prompt: usize, max_tokens: usize, context: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: i32 },
    #[error("invalid sampling settings: {0}")]
    Sampling(String),
    #[error("MTP depth {0} is outside 1..=8")]
    Depth(usize),
    #[error("model `{model}` has no vision tower: it cannot read images{} (send text only, or choose a vision model)", .reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    NoVision { model: String, reason: Option<String> },
    #[error("images: {0}")]
    Images(String),
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
}

pub type Result<T> = std::result::Result<T, GenerateError>;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MtpOptions {
    pub enabled: bool,
    /// Drafts per cycle, 1..=8.
    pub depth: usize,
    /// Park at depth 0 when drafting does not pay.
    pub adaptive: bool,
    /// Verify drafts one token at a time, so that verify logits are bit-identical to plain decoding.
    pub exact_verify: bool,
}

impl Default for MtpOptions {
    fn default() -> Self {
        MtpOptions { enabled: true, depth: 3, adaptive: true, exact_verify: false }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub mtp: MtpOptions,
    /// Prompt tokens per prefill forward.
    pub prefill_chunk: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_ids: vec![],
            mtp: MtpOptions::default(),
            prefill_chunk: 512,
        }
    }
}

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
    generate_with(model, prompt, &[], opts, on_progress)
}

/// [`generate`] for a prompt with images: the vision tower encodes them and their features replace
/// the image pads during prefill, at M-RoPE positions. A model without a vision tower refuses.
pub fn generate_prompt(
    model: &Qwen35,
    prompt: &Prompt,
    opts: &GenerateOptions,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    if prompt.images.is_empty() {
        return generate(model, &prompt.ids, opts, on_progress);
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
    generate_with(model, &ids, &prompt.images, opts, on_progress)
}

fn generate_with(
    model: &Qwen35,
    prompt: &[u32],
    images: &[ImageInput],
    opts: &GenerateOptions,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output> {
    check(model, prompt, opts)?;
    let mut sampler = Sampler::new(opts.sampling.clone())?;
    let mut cache = model.make_cache();
    let t0 = Instant::now();
    let hidden = if images.is_empty() {
        prefill(model, prompt, &mut cache, opts.prefill_chunk)?
    } else {
        prefill_images(model, prompt, images, &mut cache, opts.prefill_chunk)?
    };
    let mut history: Vec<u32> = prompt.to_vec();
    let first = sample_last(model, &mut sampler, &hidden, &history)?;
    let ttft = t0.elapsed().as_secs_f64();
    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        ttft_ms: ttft * 1e3,
        prefill_tok_s: prompt.len() as f64 / ttft.max(1e-9),
        ..Default::default()
    };

    let mut run =
        Run { opts, tokens: Vec::new(), finish: None, stats: &mut stats, on_progress, t_decode: Instant::now() };
    let want_mtp = opts.mtp.enabled;
    if want_mtp && model.has_mtp() && opts.max_tokens > 1 {
        let mut spec = SpecDecoder::new(model, &opts.mtp, &mut sampler, cache, &hidden, prompt, first)?;
        run.stats.spec = Some(SpecStats::new(opts.mtp.depth));
        run.emit(&[first]);
        while run.finish.is_none() {
            let remaining = opts.max_tokens - run.tokens.len();
            let new = spec.step(&mut sampler, &mut history, remaining, run.stats)?;
            run.emit(&new);
        }
        spec.finish(run.stats);
    } else {
        if want_mtp {
            let why = model.mtp_status.reason.clone().unwrap_or_else(|| "the model has no MTP head".into());
            run.stats.spec = Some(SpecStats::fallback(opts.mtp.depth, why));
        }
        let mut tok = first;
        run.emit(&[tok]);
        while run.finish.is_none() {
            history.push(tok);
            let h = model.forward(&Array::from_slice(&[tok as i32], &[1, 1])?, &mut cache)?;
            tok = sample_last(model, &mut sampler, &h, &history)?;
            run.emit(&[tok]);
        }
    }
    let finish = run.finish.unwrap_or(FinishReason::Length);
    let tokens = std::mem::take(&mut run.tokens);
    let decode_s = run.t_decode.elapsed().as_secs_f64();
    stats.completion_tokens = tokens.len();
    // The first token belongs to prefill (TTFT); decode speed counts the rest.
    stats.decode_tok_s = if tokens.len() > 1 { (tokens.len() - 1) as f64 / decode_s.max(1e-9) } else { 0.0 };
    Ok(Output { tokens, stats, finish })
}

struct Run<'a, 'b> {
    opts: &'a GenerateOptions,
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    stats: &'a mut Stats,
    on_progress: &'b mut dyn FnMut(Progress<'_>) -> Control,
    t_decode: Instant,
}

impl Run<'_, '_> {
    /// Appends tokens up to a stop token or the length limit, then reports them.
    fn emit(&mut self, new: &[u32]) {
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
        self.stats.completion_tokens = self.tokens.len();
        let elapsed = self.t_decode.elapsed().as_secs_f64();
        if self.tokens.len() > 1 && elapsed > 0.0 {
            self.stats.decode_tok_s = (self.tokens.len() - 1) as f64 / elapsed;
        }
        let progress = Progress { new_tokens: &self.tokens[start..], stats: self.stats };
        if (self.on_progress)(progress) == Control::Stop && self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
        }
    }
}

fn check(model: &Qwen35, prompt: &[u32], opts: &GenerateOptions) -> Result<()> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let vocab = model.config.text.vocab_size;
    if let Some(&id) = prompt.iter().find(|&&id| id as i64 >= vocab as i64) {
        return Err(GenerateError::BadToken { id, vocab });
    }
    if let Some(context) = model.config.text.max_position_embeddings {
        let context = context as usize;
        if prompt.len() + opts.max_tokens > context {
            return Err(GenerateError::ContextExceeded { prompt: prompt.len(), max_tokens: opts.max_tokens, context });
        }
    }
    opts.sampling.validate().map_err(GenerateError::Sampling)?;
    if opts.mtp.enabled && !(1..=8).contains(&opts.mtp.depth) {
        return Err(GenerateError::Depth(opts.mtp.depth));
    }
    Ok(())
}

/// Runs the prompt through the model in chunks; returns the post-norm hidden states of the last chunk.
pub fn prefill(model: &Qwen35, prompt: &[u32], cache: &mut [LayerCache], chunk: usize) -> Result<Array> {
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let mut hidden_parts = Vec::new();
    for part in ids.chunks(chunk.max(1)) {
        let h = model.forward(&Array::from_slice(part, &[1, part.len() as i32])?, cache)?;
        let mut arrays: Vec<&Array> = cache.iter().flat_map(|c| c.arrays()).collect();
        arrays.push(&h);
        mlx::device::eval(&arrays)?;
        hidden_parts.push(h);
    }
    // Callers need every prompt position's hidden state (the MTP head is primed on all of them).
    let refs: Vec<&Array> = hidden_parts.iter().collect();
    Ok(mlx::concatenate(&refs, 1)?)
}

fn no_vision(model: &Qwen35) -> GenerateError {
    GenerateError::NoVision { model: model.name().to_string(), reason: model.vision_status.clone() }
}

/// [`prefill`] for a prompt with images (its pads already expanded, one per vision feature): the
/// vision tower's features replace the pads' embeddings, positions follow M-RoPE, and every KV cache
/// keeps the rope delta so that decoding continues after the images' largest position.
pub fn prefill_images(
    model: &Qwen35,
    prompt: &[u32],
    images: &[ImageInput],
    cache: &mut [LayerCache],
    chunk: usize,
) -> Result<Array> {
    let vision = model.vision().ok_or_else(|| no_vision(model))?;
    let vc = &vision.config;
    let image_id = vc
        .image_token_id
        .ok_or_else(|| GenerateError::Images(format!("model `{}`: config.json has no image_token_id", model.name())))?;
    for img in images {
        let expected = (vc.patch_dim() as usize, vc.spatial_merge_size as u32);
        if (img.patch_dim, img.merge_size) != expected
            || img.pixel_values.len() != img.tokens() * img.merge_size.pow(2) as usize * img.patch_dim
        {
            return Err(GenerateError::Images(format!(
                "{}: preprocessed for {} values per patch and merge size {} ({} values), but model `{}` takes {} and {}",
                img.source,
                img.patch_dim,
                img.merge_size,
                img.pixel_values.len(),
                model.name(),
                expected.0,
                expected.1
            )));
        }
    }
    let grids: Vec<GridThw> = images.iter().map(|i| i.grid_thw).collect();
    let (positions, delta) =
        rope_index(prompt, image_id, &grids, vc.spatial_merge_size as u32).map_err(GenerateError::Images)?;
    let pixels: Vec<f32> = images.iter().flat_map(|i| i.pixel_values.iter().copied()).collect();
    let patches = (pixels.len() / vc.patch_dim() as usize) as i32;
    let features = vision.encode(&Array::from_slice(&pixels, &[patches, vc.patch_dim()])?, &grids)?;

    // Each pad's embedding row is replaced by the next feature row: gather from [embeddings; features].
    let t = prompt.len() as i32;
    let ids: Vec<i32> = prompt.iter().map(|&id| id as i32).collect();
    let embeds = model.embed(&Array::from_slice(&ids, &[t])?)?;
    let mut next_feature = t;
    let rows: Vec<i32> = (0..t)
        .zip(prompt)
        .map(|(p, &id)| {
            if id == image_id {
                next_feature += 1;
                next_feature - 1
            } else {
                p
            }
        })
        .collect();
    let table = mlx::concatenate(&[&embeds, &features.as_dtype(embeds.dtype())?], 0)?;
    let h = table.take(&Array::from_slice(&rows, &[t])?, 0)?.expand_dims(&[0])?;
    let positions = Array::from_slice(&positions.concat(), &[3, t])?;

    let mut hidden_parts = Vec::new();
    let step = chunk.max(1) as i32;
    for start in (0..t).step_by(step as usize) {
        let end = (start + step).min(t);
        let out =
            model.forward_embeddings_at(&h.slice_axis(1, start, end)?, cache, &positions.slice_axis(1, start, end)?)?;
        let mut arrays: Vec<&Array> = cache.iter().flat_map(|c| c.arrays()).collect();
        arrays.push(&out);
        mlx::device::eval(&arrays)?;
        hidden_parts.push(out);
    }
    set_rope_delta(cache, delta);
    let refs: Vec<&Array> = hidden_parts.iter().collect();
    Ok(mlx::concatenate(&refs, 1)?)
}

/// Samples the token after the last position of `hidden` `[1, T, D]`.
pub fn sample_last(model: &Qwen35, sampler: &mut Sampler, hidden: &Array, history: &[u32]) -> Result<u32> {
    let t = hidden.dim(1);
    let logits = model.logits(&hidden.slice_axis(1, t - 1, t)?)?.reshape(&[-1])?.as_dtype(Dtype::F32)?;
    let logits = sampler.penalize(&logits, history)?;
    Ok(sampler.sample(&logits)?.item::<u32>()?)
}
