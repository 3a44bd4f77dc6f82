//! One generation as a value: started (prefill, first token), then stepped, alone or in a batch
//! with others ([`super::batch`]), until it ends. [`super::generate`] is a sequence stepped alone.

use std::time::Instant;

use super::decode::{keep, Control, FinishReason, Kept, Output, Progress, Prompt, Resume};
use super::decoder::{Decoder, Start};
use super::error::{GenerateError, Result};
use super::options::GenerateOptions;
use super::prefill::{prefill, prefill_images};
use super::sampler::{Sampler, TokenLogprob};
use super::stats::Stats;
use super::step::sample_last;
use crate::model::vision_input::ImageInput;
use crate::model::Qwen35;

pub struct Sequence<'m> {
    pub(super) model: &'m Qwen35,
    pub(super) opts: GenerateOptions,
    pub(super) sampler: Sampler,
    /// The prompt and every emitted token except the newest.
    pub(super) history: Vec<u32>,
    pub(super) decoder: Decoder<'m>,
    pub(super) stats: Stats,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    finish: Option<FinishReason>,
    kept: Vec<Kept>,
    /// Prefix-cache snapshots at the end, KV cut in blocks of this many tokens.
    keep_block: Option<usize>,
    t_decode: Instant,
    /// Tokens a batched step produced, not yet reported.
    pending: Option<(Vec<u32>, Vec<TokenLogprob>)>,
}

impl<'m> Sequence<'m> {
    /// Prefills `prompt` (its images' pads already expanded) from the state `resume` restores,
    /// samples the first token and reports it.
    pub fn start(
        model: &'m Qwen35,
        prompt: &[u32],
        images: &[ImageInput],
        opts: GenerateOptions,
        resume: Resume,
        on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
    ) -> Result<Sequence<'m>> {
        opts.check(model, prompt)?;
        let mut sampler = Sampler::new(opts.sampling.clone())?
            .with_prompt_len(prompt.len())
            .with_constraint(opts.constraint.clone())
            .with_logprobs(opts.logprobs);
        let t0 = Instant::now();
        let restored = resume
            .restored
            .filter(|s| (1..=prompt.len()).contains(&s.len) && !super::decode::inside_image(model, prompt, s.len));
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
        let history: Vec<u32> = prompt.to_vec();
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
        let mut decoder = Decoder::new(model, &opts, start_state, &mut stats)?;
        let mut kept = Vec::new();
        if let Some(block) = resume.keep.filter(|_| start < prompt.len()) {
            keep(&mut decoder, &history, block, &mut kept);
        }
        let mut seq = Sequence {
            model,
            opts,
            sampler,
            history,
            decoder,
            stats,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            kept,
            keep_block: resume.keep,
            t_decode: Instant::now(),
            pending: None,
        };
        let logprobs = seq.sampler.take_logprobs();
        seq.emit(&[first], logprobs, on_progress);
        Ok(seq)
    }

    /// [`Sequence::start`] for a prompt that may hold images (as [`super::generate_resumed`] takes it).
    pub fn start_prompt(
        model: &'m Qwen35,
        prompt: &Prompt,
        opts: GenerateOptions,
        resume: Resume,
        on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
    ) -> Result<Sequence<'m>> {
        let (ids, resume) = super::decode::expanded(model, prompt, resume)?;
        Sequence::start(model, &ids, &prompt.images, opts, resume, on_progress)
    }

    /// Whether the sequence has ended (a stop token, the length limit, or its caller stopped it).
    pub fn is_done(&self) -> bool {
        self.finish.is_some()
    }

    /// How many more tokens it may emit.
    pub fn remaining(&self) -> usize {
        self.opts.max_tokens.saturating_sub(self.tokens.len())
    }

    /// The statistics so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Steps it alone and reports the new tokens. `run_ahead`: the following plain step may be
    /// started now, to overlap with the host's work (pass false when the next step may be batched).
    pub fn step(&mut self, run_ahead: bool, on_progress: &mut dyn FnMut(Progress<'_>) -> Control) -> Result<()> {
        let remaining = self.remaining();
        let new = self.decoder.step(&mut self.sampler, &mut self.history, remaining, &mut self.stats, run_ahead)?;
        let logprobs = self.sampler.take_logprobs();
        self.emit(&new, logprobs, on_progress);
        Ok(())
    }

    /// Keeps what a batched step produced, for [`Sequence::report`].
    pub(super) fn produced(&mut self, new: Vec<u32>) {
        let logprobs = self.sampler.take_logprobs();
        self.pending = Some((new, logprobs));
    }

    /// Reports the tokens of the latest batched step (nothing when it produced none).
    pub fn report(&mut self, on_progress: &mut dyn FnMut(Progress<'_>) -> Control) {
        if let Some((new, logprobs)) = self.pending.take() {
            self.emit(&new, logprobs, on_progress);
        }
    }

    /// Ends it: final statistics and the prefix cache's snapshot of the prompt and reply.
    pub fn finish(mut self) -> Output {
        self.decoder.finish(&mut self.stats);
        if let Some(block) = self.keep_block {
            if self.kept.last().is_none_or(|k: &Kept| k.tokens.len() != self.history.len()) {
                keep(&mut self.decoder, &self.history, block, &mut self.kept);
            }
        }
        let finish = self.finish.unwrap_or(FinishReason::Length);
        let decode_s = self.t_decode.elapsed().as_secs_f64();
        let mut stats = self.stats;
        stats.completion_tokens = self.tokens.len();
        // The first token belongs to prefill (TTFT); decode speed counts the rest.
        stats.decode_tok_s =
            if self.tokens.len() > 1 { (self.tokens.len() - 1) as f64 / decode_s.max(1e-9) } else { 0.0 };
        Output { tokens: self.tokens, stats, finish, logprobs: self.logprobs, kept: self.kept }
    }

    /// Appends tokens up to a stop token or the length limit, then reports them.
    fn emit(
        &mut self,
        new: &[u32],
        mut logprobs: Vec<TokenLogprob>,
        on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
    ) {
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
            Progress { new_tokens: &self.tokens[start..], stats: &self.stats, logprobs: &self.logprobs[from..] };
        if on_progress(progress) == Control::Stop && self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
        }
    }
}
