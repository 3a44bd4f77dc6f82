//! A decoder turns the state after prefill into tokens, one [`Decoder::step`] at a time: plain
//! decoding (one token a step) or MTP speculative decoding (one cycle a step).

use mlx::Array;

use super::error::Result;
use super::mtp::MtpDecoder;
use super::options::GenerateOptions;
use super::sampler::Sampler;
use super::stats::{SpecStats, Stats};
use super::step::Pipeline;
use crate::cache::LayerCache;
use crate::model::Qwen35;

pub enum Decoder<'m> {
    Plain(Plain<'m>),
    /// Boxed: the MTP decoder holds the head's state besides the caches.
    Mtp(Box<MtpDecoder<'m>>),
}

/// Plain decoding: the newest sampled token is fed, the next one sampled.
pub struct Plain<'m> {
    model: &'m Qwen35,
    cache: Vec<LayerCache>,
    /// The newest sampled token, not yet fed to the model.
    last: u32,
    steps: Pipeline,
}

impl<'m> Decoder<'m> {
    /// Starts from a prefilled cache: `hidden` holds the prompt's post-norm hidden states and
    /// `first` the token sampled after the prompt. MTP runs when asked for and the model has a
    /// head; when asked for and impossible, the statistics say why.
    pub fn new(
        model: &'m Qwen35,
        opts: &GenerateOptions,
        cache: Vec<LayerCache>,
        hidden: &Array,
        prompt: &[u32],
        first: u32,
        stats: &mut Stats,
    ) -> Result<Decoder<'m>> {
        if opts.mtp.enabled && model.has_mtp() && opts.max_tokens > 1 {
            stats.spec = Some(SpecStats::new(opts.mtp.depth));
            let mut mtp = MtpDecoder::new(model, &opts.mtp, cache, hidden, prompt, first);
            if let Some(oracle) = &opts.oracle {
                mtp = mtp.with_oracle(oracle);
            }
            return Ok(Decoder::Mtp(Box::new(mtp)));
        }
        if opts.mtp.enabled {
            let why = model.mtp_status.reason.clone().unwrap_or_else(|| "the model has no MTP head".into());
            stats.spec = Some(SpecStats::fallback(opts.mtp.depth, why));
        }
        Ok(Decoder::Plain(Plain { model, cache, last: first, steps: Pipeline::default() }))
    }

    /// Produces the next tokens (at least one). `history` holds the prompt and every emitted token
    /// except the newest; `remaining` is how many more tokens may be emitted.
    pub fn step(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        remaining: usize,
        stats: &mut Stats,
    ) -> Result<Vec<u32>> {
        match self {
            Decoder::Plain(p) => p.step(sampler, history, remaining),
            Decoder::Mtp(m) => m.step(sampler, history, remaining, stats),
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
    fn step(&mut self, sampler: &mut Sampler, history: &mut Vec<u32>, remaining: usize) -> Result<Vec<u32>> {
        let (_, next) = self.steps.step(self.model, &mut self.cache, sampler, history, self.last, remaining > 1)?;
        self.last = next;
        Ok(vec![next])
    }
}
