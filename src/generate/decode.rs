//! The decode loop: chunked prefill, then one token per step, or MTP speculative cycles (mtp.rs).
//! Emits tokens through a callback that can stop the run (cancellation, stop sequences).

use std::time::Instant;

use mlx::{Array, Dtype};
use thiserror::Error;

use super::mtp::SpecDecoder;
use super::sampler::{Sampler, SamplingParams};
use super::stats::{SpecStats, Stats};
use crate::cache::LayerCache;
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
        GenerateOptions { max_tokens: 256, sampling: SamplingParams::default(), stop_ids: vec![], mtp: MtpOptions::default(), prefill_chunk: 512 }
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

/// Runs the prompt and generates up to `max_tokens` tokens.
pub fn generate(model: &Qwen35, prompt: &[u32], opts: &GenerateOptions, on_progress: &mut dyn FnMut(Progress<'_>) -> Control) -> Result<Output> {
    check(model, prompt, opts)?;
    let mut sampler = Sampler::new(opts.sampling.clone())?;
    let mut cache = model.make_cache();
    let t0 = Instant::now();
    let hidden = prefill(model, prompt, &mut cache, opts.prefill_chunk)?;
    let mut history: Vec<u32> = prompt.to_vec();
    let first = sample_last(model, &mut sampler, &hidden, &history)?;
    let ttft = t0.elapsed().as_secs_f64();
    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        ttft_ms: ttft * 1e3,
        prefill_tok_s: prompt.len() as f64 / ttft.max(1e-9),
        ..Default::default()
    };

    let mut run = Run { opts, tokens: Vec::new(), finish: None, stats: &mut stats, on_progress, t_decode: Instant::now() };
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

/// Samples the token after the last position of `hidden` `[1, T, D]`.
pub fn sample_last(model: &Qwen35, sampler: &mut Sampler, hidden: &Array, history: &[u32]) -> Result<u32> {
    let t = hidden.dim(1);
    let logits = model.logits(&hidden.slice_axis(1, t - 1, t)?)?.reshape(&[-1])?.as_dtype(Dtype::F32)?;
    let logits = sampler.penalize(&logits, history)?;
    Ok(sampler.sample(&logits)?.item::<u32>()?)
}
