//! One generation as a value: started (prefill, first token), then stepped, alone or in a batch
//! with others ([`super::batch`]), until it ends. [`super::generate`] is a sequence stepped alone.

use std::time::{Duration, Instant};

use mlx::Array;

use super::decode::{keep, Control, FinishReason, Kept, Output, Progress, Prompt, Resume};
use super::decoder::{Decoder, Start};
use super::error::{GenerateError, Result};
use super::mtp::drafter::Drafter;
use super::options::GenerateOptions;
use super::prefill::Prefilling;
use super::sampler::{Sampler, TokenLogprob};
use super::stats::Stats;
use super::step::sample_last;
use crate::cache::{LayerCache, Snapshot};
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

/// A sequence whose prompt is part way through prefill ([`Sequence::begin`]): [`Starting::advance`]
/// feeds one chunk, so a running batch can decode between a newcomer's chunks; [`Starting::start`]
/// feeds the rest and samples the first token.
pub struct Starting<'m> {
    model: &'m Qwen35,
    opts: GenerateOptions,
    sampler: Sampler,
    prompt: Vec<u32>,
    /// Tokens the caches held before prefill (a restored prefix).
    start: usize,
    cache: Vec<LayerCache>,
    prefill: Option<Prefilling>,
    /// The MTP head's pairs, queued as prefill produces them and run after each chunk when MTP will
    /// draft (else only for a snapshot).
    drafter: Drafter,
    /// The restored prefix's last hidden state, when nothing is left to prefill.
    restored_hidden: Option<Array>,
    keep: Option<usize>,
    every: Option<usize>,
    kept: Vec<Kept>,
    t0: Instant,
    /// Time spent prefilling (the prefill speed leaves out the batch's steps in between).
    busy: Duration,
}

impl<'m> Starting<'m> {
    /// The MTP head's drafter as prefill leaves it: with MTP, every pair of the prompt fed so far has run
    /// through the head after each chunk ([`Starting::advance`]); without, they wait (for a snapshot).
    pub fn drafter(&self) -> &Drafter {
        &self.drafter
    }

    /// Prompt tokens still to prefill.
    pub fn left(&self) -> usize {
        self.prefill.as_ref().map_or(0, Prefilling::left)
    }

    /// Prefills the next chunk (at most the options' `prefill_chunk` tokens, and never past a
    /// snapshot boundary); a no-op once nothing is left.
    pub fn advance(&mut self) -> Result<()> {
        let t = Instant::now();
        let Some(p) = self.prefill.as_mut() else { return Ok(()) };
        if p.left() == 0 {
            return Ok(());
        }
        let from = self.start + p.fed();
        let mut chunk = self.opts.prefill_chunk.max(1);
        let every = self.every.filter(|_| self.keep.is_some() && p.is_text()).unwrap_or(0);
        if every > 0 {
            chunk = chunk.min(every - from % every);
        }
        let hidden = p.advance(self.model, &mut self.cache, chunk)?;
        let to = self.start + p.fed();
        // Pairs (h_i, x_{i+1}) for the head; the prompt's last position waits for the first token.
        let pairs = (to.min(self.prompt.len() - 1)).saturating_sub(from);
        if pairs > 0 {
            let h = if pairs == to - from { hidden } else { hidden.slice_axis(1, 0, pairs as i32)? };
            self.drafter.queue([h], &self.prompt[from + 1..from + 1 + pairs]);
        }
        if every > 0 && to % every == 0 && to < self.prompt.len() {
            let n = hidden_last(&self.prefill)?;
            self.snapshot_at(to, n)?;
        }
        // With MTP the head runs this chunk's pairs now (after any snapshot, which keeps the last one
        // pending): a long prompt's head pass was one stall after the first token (a 2,048-token prompt:
        // ~230 ms on the 2-core CPU, docs/PERF.md), and in a batch it held every stream's next cycle.
        if self.opts.runs_mtp(self.model) && Drafter::runs_in_prefill(self.model) {
            self.drafter.run_pending(self.model)?;
        }
        self.busy += t.elapsed();
        Ok(())
    }

    /// Keeps a snapshot after the prompt's first `at` tokens, whose last hidden state is `last`
    /// (the prefix cache takes it at the end). With MTP the head first runs the pairs before it.
    fn snapshot_at(&mut self, at: usize, last: Array) -> Result<()> {
        let Some(block) = self.keep else { return Ok(()) };
        let head = if self.opts.runs_mtp(self.model) {
            self.drafter.settle(self.model, true)?;
            Some(self.drafter.cache())
        } else {
            None
        };
        // The previous boundary's KV segments are shared, not copied again.
        let prev = self.kept.last().map(|k| &k.snapshot);
        match Snapshot::take_after(prev, &self.cache, head, &last, at, block) {
            Ok(snapshot) => self.kept.push(Kept { tokens: self.prompt[..at].to_vec(), snapshot, inside: true }),
            Err(e) => tracing::warn!("prefix cache: no snapshot after {at} prompt tokens: {e}"),
        }
        Ok(())
    }

    /// Prefills what is left, samples the first token and reports it.
    pub fn start(mut self, on_progress: &mut dyn FnMut(Progress<'_>) -> Control) -> Result<Sequence<'m>> {
        while self.left() > 0 {
            self.advance()?;
        }
        let t = Instant::now();
        let model = self.model;
        let last_hidden = match (self.prefill.take(), self.restored_hidden.take()) {
            (Some(p), _) => p.finish_last(&mut self.cache)?,
            (None, Some(h)) => h,
            (None, None) => return Err(GenerateError::EmptyPrompt),
        };
        let history = self.prompt;
        let first = sample_last(model, &mut self.sampler, &last_hidden, &history)?;
        let ttft = self.t0.elapsed().as_secs_f64();
        let prefill_s = (self.busy + t.elapsed()).as_secs_f64();
        let start = self.start;
        let mut stats = Stats {
            prompt_tokens: history.len(),
            cached_tokens: start,
            ttft_ms: ttft * 1e3,
            prefill_tok_s: (history.len() - start) as f64 / prefill_s.max(1e-9),
            ..Default::default()
        };
        let start_state = Start { cache: self.cache, last_hidden, drafter: self.drafter, first };
        let mut decoder = Decoder::new(model, &self.opts, start_state, &mut stats)?;
        let mut kept = self.kept;
        if let Some(block) = self.keep.filter(|_| start < history.len()) {
            keep(&mut decoder, &history, block, &mut kept);
        }
        let mut seq = Sequence {
            model,
            opts: self.opts,
            sampler: self.sampler,
            history,
            decoder,
            stats,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            kept,
            keep_block: self.keep,
            t_decode: Instant::now(),
            pending: None,
        };
        let logprobs = seq.sampler.take_logprobs();
        seq.emit(&[first], logprobs, on_progress);
        Ok(seq)
    }
}

/// The hidden state `[1, 1, D]` at the last position prefilled so far.
fn hidden_last(prefill: &Option<Prefilling>) -> Result<Array> {
    prefill
        .as_ref()
        .and_then(Prefilling::last_hidden)
        .ok_or_else(|| mlx::Error::Invalid("no prompt position has been prefilled".into()).into())
}

impl<'m> Sequence<'m> {
    /// Readies `prompt` (its images' pads already expanded) for prefill from the state `resume`
    /// restores; nothing is computed yet ([`Starting::advance`], [`Starting::start`]).
    pub fn begin(
        model: &'m Qwen35,
        prompt: &[u32],
        images: &[ImageInput],
        opts: GenerateOptions,
        resume: Resume,
    ) -> Result<Starting<'m>> {
        opts.check(model, prompt)?;
        let sampler = Sampler::new(opts.sampling.clone())?
            .with_prompt_len(prompt.len())
            .with_constraint(opts.constraint.clone())
            .with_logprobs(opts.logprobs);
        let t0 = Instant::now();
        let restored = resume
            .restored
            .filter(|s| (1..=prompt.len()).contains(&s.len) && !super::decode::inside_image(model, prompt, s.len));
        let start = restored.as_ref().map_or(0, |s| s.len);
        let (cache, head) = match &restored {
            Some(s) => s.restore()?,
            None => (model.make_cache(), None),
        };
        let mut drafter = Drafter::primed(head.or_else(|| model.make_mtp_cache()).unwrap_or_default());
        let prefill = if start == prompt.len() {
            None
        } else if images.is_empty() {
            Some(Prefilling::text(&prompt[start..]))
        } else {
            Some(Prefilling::images(model, prompt, start, images)?)
        };
        let mut restored_hidden = restored.map(|s| s.last_hidden);
        if prefill.is_some() {
            // The restored prefix's last position pairs with the rest's first token.
            if let Some(h) = restored_hidden.take() {
                drafter.queue([h], &prompt[start..start + 1]);
            }
        }
        Ok(Starting {
            model,
            opts,
            sampler,
            prompt: prompt.to_vec(),
            start,
            cache,
            prefill,
            drafter,
            restored_hidden,
            keep: resume.keep,
            every: resume.every,
            kept: Vec::new(),
            t0,
            busy: Duration::ZERO,
        })
    }

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
        Sequence::begin(model, prompt, images, opts, resume)?.start(on_progress)
    }

    /// [`Sequence::begin`] for a prompt that may hold images (as [`super::generate_resumed`] takes it).
    pub fn begin_prompt(
        model: &'m Qwen35,
        prompt: &Prompt,
        opts: GenerateOptions,
        resume: Resume,
    ) -> Result<Starting<'m>> {
        let (ids, resume) = super::decode::expanded(model, prompt, resume)?;
        Sequence::begin(model, &ids, &prompt.images, opts, resume)
    }

    /// [`Sequence::start`] for a prompt that may hold images (as [`super::generate_resumed`] takes it).
    pub fn start_prompt(
        model: &'m Qwen35,
        prompt: &Prompt,
        opts: GenerateOptions,
        resume: Resume,
        on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
    ) -> Result<Sequence<'m>> {
        Sequence::begin_prompt(model, prompt, opts, resume)?.start(on_progress)
    }

    /// Whether the sequence has ended (a stop token, the length limit, or its caller stopped it).
    pub fn is_done(&self) -> bool {
        self.finish.is_some()
    }

    /// How many more tokens it may emit.
    pub fn remaining(&self) -> usize {
        self.opts.max_tokens.saturating_sub(self.tokens.len())
    }

    /// Whether its next step is already running (started ahead by the last one, alone or in a batch).
    pub fn running_ahead(&self) -> bool {
        self.decoder.running_ahead()
    }

    /// The statistics so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Steps it alone and reports the new tokens. `run_ahead`: the following plain step may be
    /// started now, to overlap with the host's work (pass false when the next step may be batched).
    pub fn step(&mut self, run_ahead: bool, on_progress: &mut dyn FnMut(Progress<'_>) -> Control) -> Result<()> {
        let remaining = self.remaining();
        self.decoder.set_batch(1);
        let new = self.decoder.step(&mut self.sampler, &mut self.history, remaining, &mut self.stats, run_ahead)?;
        let logprobs = self.sampler.take_logprobs();
        self.emit(&new, logprobs, on_progress);
        Ok(())
    }

    /// Other work (another request's prefill chunk) ran since its previous step: that time is
    /// not this sequence's step cost.
    pub fn interrupted(&mut self) {
        self.decoder.interrupted();
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
