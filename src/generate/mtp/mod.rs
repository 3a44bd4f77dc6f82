//! MTP speculative decoding (spec sections 4.2–4.4): the model's own MTP head drafts k tokens
//! ([`drafter`]), one forward over k+1 tokens verifies them, [`acceptance`] decides how many stay,
//! and the caches keep exactly the accepted prefix (a [`Verify`] transaction). The [`controller`]
//! parks drafting when it does not pay.
//!
//! Invariant between cycles: the main caches hold every committed token except `last`, the newest
//! sampled one.

pub mod acceptance;
pub mod controller;
pub mod drafter;
pub mod oracle;

use std::time::Instant;

use mlx::{Array, Dtype};

use self::acceptance::accept;
use self::controller::Controller;
use self::drafter::Drafter;
use self::oracle::{Oracle, OracleDrafts};
use super::error::Result;
use super::options::MtpOptions;
use super::sampler::Sampler;
use super::stats::{SpecStats, Stats};
use super::step::step;
use crate::cache::{LayerCache, Verify};
use crate::model::Qwen35;

pub struct MtpDecoder<'m> {
    model: &'m Qwen35,
    cache: Vec<LayerCache>,
    drafter: Drafter,
    opts: MtpOptions,
    /// The newest sampled token, not yet fed to the main model.
    last: u32,
    ctl: Controller,
    emitted_in_cycles: usize,
    /// Tokens emitted so far, the first one included.
    emitted: usize,
    /// When set, the drafts sent to verify come from here (benchmarks).
    oracle: Option<OracleDrafts>,
}

/// What a verify decided and what the committed positions look like.
struct Verified {
    accepted: usize,
    next: u32,
    /// Post-norm hidden states at the `accepted + 1` committed positions, for the head.
    hidden: Vec<Array>,
    /// Phase times after drafting (ms): verify, sample, rollback.
    ms: [f64; 3],
}

impl<'m> MtpDecoder<'m> {
    /// Starts from a prefilled cache: `hidden` holds the prompt's post-norm hidden states and
    /// `first` the token sampled after the prompt.
    pub fn new(
        model: &'m Qwen35,
        opts: &MtpOptions,
        cache: Vec<LayerCache>,
        hidden: &Array,
        prompt: &[u32],
        first: u32,
    ) -> MtpDecoder<'m> {
        MtpDecoder {
            model,
            cache,
            drafter: Drafter::new(model, hidden, prompt, first),
            opts: opts.clone(),
            last: first,
            ctl: Controller::new(opts.adaptive),
            emitted_in_cycles: 0,
            emitted: 1,
            oracle: None,
        }
    }

    /// Drafts from `oracle`'s continuation instead of the head's guesses; the head still runs.
    pub fn with_oracle(mut self, oracle: &Oracle) -> MtpDecoder<'m> {
        self.oracle = Some(OracleDrafts::new(oracle, self.model.config.text.vocab_size.max(0) as u32));
        self
    }

    /// One plain step (while parked) or one speculative cycle; returns the new tokens (at least
    /// one). `history` holds the prompt and every emitted token except the newest (`last`).
    pub fn step(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        remaining: usize,
        stats: &mut Stats,
    ) -> Result<Vec<u32>> {
        let k = self.opts.depth.min(remaining.saturating_sub(1));
        if k == 0 || self.ctl.parked() {
            stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth)).parked_cycles += 1;
            let t0 = Instant::now();
            let (hidden, next) = step(self.model, &mut self.cache, sampler, history, self.last)?;
            // The head catches up on this position when drafting resumes.
            self.drafter.queue([hidden], &[next]);
            self.last = next;
            self.emitted += 1;
            self.ctl.after_plain(ms(t0, Instant::now()));
            return Ok(vec![next]);
        }
        let t0 = Instant::now();
        let mut drafts = self.drafter.draft(self.model, k, self.opts.depth)?;
        if let Some(oracle) = self.oracle.as_mut() {
            drafts = oracle.drafts(self.emitted, &drafts);
        }
        let t1 = Instant::now();
        let v = if self.opts.exact_verify {
            self.verify_exact(sampler, history, &drafts)?
        } else {
            self.verify(sampler, history, &drafts)?
        };
        let a = v.accepted;
        let cycle_ms = ms(t0, Instant::now());
        let mut out = drafts[..a].to_vec();
        out.push(v.next);
        self.drafter.queue(v.hidden, &out);
        self.last = v.next;

        let spec = stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth));
        spec.record_cycle(k, a);
        spec.ms.draft += ms(t0, t1);
        spec.ms.verify += v.ms[0];
        spec.ms.sample += v.ms[1];
        spec.ms.rollback += v.ms[2];
        self.emitted_in_cycles += a + 1;
        self.emitted += a + 1;
        self.ctl.after_spec(cycle_ms - self.drafter.catch_up_ms(), a + 1);
        Ok(out)
    }

    /// Fills in the final statistics.
    pub fn finish(&self, stats: &mut Stats) {
        if let Some(spec) = stats.spec.as_mut() {
            spec.finish(self.emitted_in_cycles);
            if self.ctl.parked() && spec.cycles == 0 {
                spec.fallback = self.ctl.reason.clone();
            }
        }
    }

    /// Verifies `last` and the drafts in one forward, then keeps the accepted prefix.
    fn verify(&mut self, sampler: &mut Sampler, history: &mut Vec<u32>, drafts: &[u32]) -> Result<Verified> {
        let t1 = Instant::now();
        let mut input: Vec<i32> = vec![self.last as i32];
        input.extend(drafts.iter().map(|&d| d as i32));
        let mut verify = Verify::begin(&mut self.cache, input.len());
        let hidden = self.model.forward(&Array::from_slice(&input, &[1, input.len() as i32])?, verify.cache())?;
        let logits = self.model.logits(&hidden)?.squeeze(&[0])?.as_dtype(Dtype::F32)?; // [k+1, V]
        logits.eval()?;
        let t2 = Instant::now();
        history.push(self.last);
        let (accepted, next) = accept(sampler, &logits, drafts, history)?;
        history.extend_from_slice(&drafts[..accepted]);
        let t3 = Instant::now();
        verify.commit(accepted + 1)?;
        let hidden = vec![hidden.slice_axis(1, 0, accepted as i32 + 1)?];
        let t4 = Instant::now();
        Ok(Verified { accepted, next, hidden, ms: [ms(t1, t2), ms(t2, t3), ms(t3, t4)] })
    }

    /// Verifies one token at a time, so verify logits are exactly those of plain decoding, and
    /// stops at the first mismatch (the main caches then hold exactly the kept tokens).
    fn verify_exact(&mut self, sampler: &mut Sampler, history: &mut Vec<u32>, drafts: &[u32]) -> Result<Verified> {
        let t1 = Instant::now();
        let mut fed = self.last;
        let mut hidden = Vec::new();
        let next = loop {
            let (h, tok) = step(self.model, &mut self.cache, sampler, history, fed)?;
            hidden.push(h);
            match drafts.get(hidden.len() - 1) {
                Some(&d) if d == tok => fed = tok,
                _ => break tok,
            }
        };
        Ok(Verified { accepted: hidden.len() - 1, next, hidden, ms: [ms(t1, Instant::now()), 0.0, 0.0] })
    }
}

fn ms(a: Instant, b: Instant) -> f64 {
    (b - a).as_secs_f64() * 1e3
}
