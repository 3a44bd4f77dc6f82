//! A decoder turns the state after prefill into tokens, one [`Decoder::step`] at a time: plain
//! decoding (one token a step) or MTP speculative decoding (one cycle a step).

use mlx::Array;

use super::error::Result;
use super::mtp::drafter::Drafter;
use super::mtp::MtpDecoder;
use super::options::GenerateOptions;
use super::sampler::Sampler;
use super::stats::{SpecStats, Stats};
use super::step::Pipeline;
use crate::cache::{LayerCache, Snapshot};
use crate::model::Qwen35;

pub enum Decoder<'m> {
    Plain(Plain<'m>),
    /// Boxed: the MTP decoder holds the head's state besides the caches.
    Mtp(Box<MtpDecoder<'m>>),
}

/// Where decoding starts: the caches after prefill, and the MTP head's drafter.
pub struct Start {
    pub cache: Vec<LayerCache>,
    /// The post-norm hidden state `[1, 1, D]` at the prompt's last position.
    pub last_hidden: Array,
    /// The MTP head's drafter, holding (run or pending) every pair of the prompt but the last,
    /// which pairs `last_hidden` with `first` (see [`Start::drafter`]).
    pub drafter: Drafter,
    /// The token sampled after the prompt.
    pub first: u32,
}

/// Plain decoding: the newest sampled token is fed, the next one sampled.
pub struct Plain<'m> {
    model: &'m Qwen35,
    cache: Vec<LayerCache>,
    /// The newest sampled token, not yet fed to the model.
    last: u32,
    /// The post-norm hidden state `[1, 1, D]` at the newest token fed (a snapshot's).
    hidden: Array,
    steps: Pipeline,
}

impl<'m> Decoder<'m> {
    /// Starts from a prefilled cache. MTP runs when asked for and the model has a head
    /// ([`GenerateOptions::runs_mtp`]); when asked for and impossible, the statistics say why.
    pub fn new(model: &'m Qwen35, opts: &GenerateOptions, start: Start, stats: &mut Stats) -> Result<Decoder<'m>> {
        let Start { cache, last_hidden, mut drafter, first } = start;
        if opts.runs_mtp(model) {
            stats.spec = Some(SpecStats::new(opts.mtp.depth));
            drafter.queue([last_hidden], &[first]);
            let mut mtp = MtpDecoder::new(model, &opts.mtp, cache, drafter, first, &opts.stop_ids);
            if let Some(oracle) = &opts.oracle {
                mtp = mtp.with_oracle(oracle);
            }
            return Ok(Decoder::Mtp(Box::new(mtp)));
        }
        if opts.mtp.enabled {
            let why = model.mtp_status.reason.clone().unwrap_or_else(|| "the model has no MTP head".into());
            stats.spec = Some(SpecStats::fallback(opts.mtp.depth, why));
        }
        let hidden = last_hidden;
        Ok(Decoder::Plain(Plain { model, cache, last: first, hidden, steps: Pipeline::default() }))
    }

    /// The state after the tokens the caches hold now (`history`, plus the newest token when a
    /// pipelined step already fed it): those tokens and their snapshot, KV cut in `block`s.
    pub fn snapshot(&mut self, history: &[u32], block: usize) -> Result<(Vec<u32>, Snapshot)> {
        match self {
            Decoder::Plain(p) => {
                let mut tokens = history.to_vec();
                let hidden = match p.steps.ahead_hidden() {
                    Some(h) => {
                        tokens.push(p.last);
                        h.clone()
                    }
                    None => p.hidden.clone(),
                };
                let snap = Snapshot::take(&p.cache, None, &hidden, tokens.len(), block)?;
                Ok((tokens, snap))
            }
            Decoder::Mtp(m) => Ok(m.snapshot(history, block)?),
        }
    }

    /// Produces the next tokens (at least one). `history` holds the prompt and every emitted token
    /// except the newest; `remaining` is how many more tokens may be emitted. `run_ahead`: the
    /// following plain step may be started now (the caches are this decoder's alone until then).
    pub fn step(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        remaining: usize,
        stats: &mut Stats,
        run_ahead: bool,
    ) -> Result<Vec<u32>> {
        match self {
            Decoder::Plain(p) => p.step(sampler, history, remaining, run_ahead),
            Decoder::Mtp(m) => m.step(sampler, history, remaining, stats, run_ahead),
        }
    }

    /// The sequence's caches (a batched forward's share).
    pub(crate) fn cache_mut(&mut self) -> &mut [LayerCache] {
        match self {
            Decoder::Plain(p) => &mut p.cache,
            Decoder::Mtp(m) => m.cache_mut(),
        }
    }

    /// The newest sampled token, which the next forward feeds.
    pub(crate) fn last(&self) -> u32 {
        match self {
            Decoder::Plain(p) => p.last,
            Decoder::Mtp(m) => m.last(),
        }
    }

    /// How many sequences the next steps are decoded with (1: alone); MTP's controller keeps its
    /// costs per batch size.
    pub(crate) fn set_batch(&mut self, batch: usize) {
        if let Decoder::Mtp(m) = self {
            m.set_batch(batch);
        }
    }

    /// Other work ran on the device since its previous step (see [`MtpDecoder::interrupted`]).
    pub(crate) fn interrupted(&mut self) {
        if let Decoder::Mtp(m) = self {
            m.interrupted();
        }
    }

    /// Whether a plain step started by the previous one is still to be taken.
    pub fn running_ahead(&self) -> bool {
        self.steps().is_running()
    }

    /// Its plain steps (a batch starts its next step in each sequence's, see `generate::batch`).
    pub(crate) fn steps(&self) -> &Pipeline {
        match self {
            Decoder::Plain(p) => &p.steps,
            Decoder::Mtp(m) => m.steps(),
        }
    }

    pub(crate) fn steps_mut(&mut self) -> &mut Pipeline {
        match self {
            Decoder::Plain(p) => &mut p.steps,
            Decoder::Mtp(m) => m.steps_mut(),
        }
    }

    /// Whether this is an MTP decoder whose next step (after the one now running) is a parked plain step,
    /// which holds its batch's drafting back (`generate::batch`).
    pub(crate) fn parked_next(&self, remaining: usize) -> bool {
        matches!(self, Decoder::Mtp(m) if m.next_is_plain(remaining))
    }

    /// Whether the step after the next one may be started with it, `remaining` tokens being left
    /// before the next one: it will be a plain step too (an MTP decoder stays parked) and is needed.
    pub(crate) fn next_two_plain(&self, remaining: usize) -> bool {
        remaining > 1
            && match self {
                Decoder::Plain(_) => true,
                Decoder::Mtp(m) => m.next_is_plain(remaining),
            }
    }

    /// Fills in the final statistics.
    pub fn finish(&self, stats: &mut Stats) {
        if let Decoder::Mtp(m) = self {
            m.finish(stats);
        }
    }
}

impl Plain<'_> {
    /// One token (pipelined where sampling allows, see [`Pipeline`]).
    fn step(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        remaining: usize,
        run_ahead: bool,
    ) -> Result<Vec<u32>> {
        let (hidden, next) =
            self.steps.step(self.model, &mut self.cache, sampler, history, self.last, run_ahead && remaining > 1)?;
        Ok(self.after_step(hidden, next))
    }

    /// After a step that fed `last`: `hidden` at it, `next` sampled after it.
    pub(crate) fn after_step(&mut self, hidden: Array, next: u32) -> Vec<u32> {
        self.last = next;
        self.hidden = hidden;
        vec![next]
    }
}
