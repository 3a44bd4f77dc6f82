//! MTP speculative decoding (docs/MODEL.md §4.2–4.4): the model's own MTP head drafts k tokens
//! ([`drafter`]), one forward over k+1 tokens verifies them, [`acceptance`] decides how many stay,
//! and the caches keep exactly the accepted prefix (a [`Verify`] transaction). The [`controller`]
//! parks drafting when it does not pay.
//!
//! Invariant between cycles: the main caches hold every committed token except `last`, the newest
//! sampled one.

pub mod acceptance;
pub mod ahead;
pub mod controller;
pub mod drafter;
pub mod oracle;

use std::time::Instant;

use mlx::{Array, Dtype};

use self::acceptance::accept_drawn;
pub(crate) use self::acceptance::draw_ahead;
use self::ahead::AheadChoice;
use self::controller::Controller;
use self::drafter::Drafter;
use self::oracle::{Oracle, OracleDrafts};
use super::error::Result;
use super::options::MtpOptions;
use super::sampler::Sampler;
use super::stats::{SpecStats, Stats};
use super::step::{step, Pipeline};
use crate::cache::{LayerCache, Open, Snapshot, Verify};
use crate::model::{launch, Qwen35};

pub struct MtpDecoder<'m> {
    model: &'m Qwen35,
    cache: Vec<LayerCache>,
    drafter: Drafter,
    opts: MtpOptions,
    /// The newest sampled token, not yet fed to the main model.
    last: u32,
    ctl: Controller,
    /// Tokens emitted so far, the first one included.
    emitted: usize,
    /// When set, the drafts sent to verify come from here (benchmarks).
    oracle: Option<OracleDrafts>,
    /// Plain steps while parked (pipelined, see [`Pipeline`]).
    steps: Pipeline,
    /// When the previous step returned: a step's cost is the time between returns, which is what
    /// a token costs when steps overlap with the host's work.
    returned: Option<Instant>,
    /// Tokens that end the generation: acceptance stops at a draft of one.
    stop_ids: Vec<u32>,
    /// The next cycle, built and started while this one's verify ran ([`Ahead`]).
    ahead: Option<Ahead>,
    /// Whether cycles are built ahead, and how many were built and kept.
    choice: AheadChoice,
    ahead_counts: (usize, usize),
    /// A shadow probe's drafts, checked against the tokens the plain steps after it produce.
    shadow: Option<Shadow>,
}

/// A shadow probe ([`Controller::shadow_due`]): drafts made beside a plain step, never verified; the
/// tokens plain decoding goes on to produce say how many of them a cycle would have kept.
struct Shadow {
    /// `[k]`, on the device: read once `k` tokens have come, when they are long computed (read at the
    /// first token, the host would wait for the device to finish them: a bubble in the pipelined steps).
    drafts: Array,
    /// The tokens plain decoding produced since.
    tokens: Vec<u32>,
}

/// A cycle built before the one before it was decided, on the guess that every draft of that one is
/// kept (the guess's bonus token included: the verify's own greedy target, still on the device). It
/// has its own copy of the caches and of the drafter, so dropping it (the guess was wrong, the depth
/// changed, a batch took the sequence) leaves the decoder exactly as if it had never been built; kept,
/// it replaces them, and its verify is already running. The same operations run on the same values
/// as when the cycle is built after the decision: the tokens are the same bits (tests).
struct Ahead {
    k: usize,
    cache: Vec<LayerCache>,
    drafter: Drafter,
    drafted: Drafted,
    built: Built,
}

/// A verify forward built and started, not read yet.
struct Built {
    /// Post-norm hidden states `[1, k + 1, D]`.
    hidden: Array,
    /// `[k + 1, V]`, f32.
    logits: Array,
    /// The targets drawn ahead ([`draw_ahead`]), where the sampler allows it.
    drawn: Option<Array>,
    open: Open,
}

/// A cycle's drafts `[k]` (`u32`, on the device): those sent to verify, and the head's own (the same
/// unless an oracle drafts).
pub struct Drafted {
    pub drafts: Array,
    pub head: Array,
}

/// What a verify decided and what the committed positions look like.
pub(crate) struct Verified {
    /// The drafts that were verified.
    pub drafts: Vec<u32>,
    pub accepted: usize,
    pub next: u32,
    /// Post-norm hidden states at the `accepted + 1` committed positions, for the head.
    pub hidden: Vec<Array>,
    /// Phase times after drafting (ms): verify, sample, rollback.
    pub ms: [f64; 3],
}

impl<'m> MtpDecoder<'m> {
    /// Starts from a prefilled cache and a drafter primed on the prompt (`Drafter::new`, or
    /// `Drafter::resume` after a restored prefix); `first` is the token sampled after the prompt.
    /// A draft of a token in `stop_ids` ends the cycle's acceptance (see [`MtpDecoder::verify`]).
    pub fn new(
        model: &'m Qwen35,
        opts: &MtpOptions,
        cache: Vec<LayerCache>,
        drafter: Drafter,
        first: u32,
        stop_ids: &[u32],
    ) -> MtpDecoder<'m> {
        MtpDecoder {
            model,
            cache,
            drafter,
            opts: opts.clone(),
            last: first,
            ctl: Controller::new(opts.adaptive, opts.depth)
                .with_shadow_probes(model.drafts_here() && !model.splits_drafting()),
            emitted: 1,
            oracle: None,
            steps: Pipeline::default(),
            returned: None,
            stop_ids: stop_ids.to_vec(),
            ahead: None,
            choice: AheadChoice::new(opts.cycle_ahead),
            ahead_counts: (0, 0),
            shadow: None,
        }
    }

    /// The state after the tokens its caches hold (`history`, and `last` too while a parked step
    /// runs ahead), with the head's cache settled to match; returns those tokens and the snapshot.
    pub fn snapshot(&mut self, history: &[u32], block: usize) -> Result<(Vec<u32>, Snapshot)> {
        let mut tokens = history.to_vec();
        let hidden = match self.steps.ahead_hidden() {
            Some(h) => {
                let h = h.clone();
                tokens.push(self.last);
                self.drafter.settle(self.model, false)?;
                h
            }
            None => self
                .drafter
                .settle(self.model, true)?
                .ok_or_else(|| mlx::Error::Invalid("the MTP head has no pending pair".into()))?,
        };
        let snap = Snapshot::take(&self.cache, Some(self.drafter.cache()), &hidden, tokens.len(), block)?;
        Ok((tokens, snap))
    }

    /// Drafts from `oracle`'s continuation instead of the head's guesses; the head still runs.
    pub fn with_oracle(mut self, oracle: &Oracle) -> MtpDecoder<'m> {
        self.oracle = Some(OracleDrafts::new(oracle, self.model.config.text.vocab_size.max(0) as u32));
        self
    }

    /// One plain step (while parked) or one speculative cycle; returns the new tokens (at least
    /// one). `history` holds the prompt and every emitted token except the newest (`last`).
    /// `run_ahead`: a following plain step may be started now (nothing else will use the caches
    /// in between; see [`Pipeline`]).
    pub fn step(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        remaining: usize,
        stats: &mut Stats,
        run_ahead: bool,
    ) -> Result<Vec<u32>> {
        let t0 = Instant::now();
        let since = self.returned.unwrap_or(t0);
        let ahead = self.ahead.take();
        let Some(k) = self.cycle_depth(remaining) else {
            let ahead = run_ahead && remaining > 1 && self.next_is_plain(remaining);
            let (hidden, next) = self.steps.step(self.model, &mut self.cache, sampler, history, self.last, ahead)?;
            return self.after_plain(hidden, next, since, stats);
        };
        let (drafted, built, t1) = match ahead.filter(|a| a.k == k) {
            Some(a) => {
                self.ahead_counts.1 += 1;
                (self.cache, self.drafter) = (a.cache, a.drafter);
                (a.drafted, Some(a.built), t0)
            }
            None => {
                let drafted = self.draft(k)?;
                launch::start(&[&drafted.drafts, &drafted.head])?;
                (drafted, None, Instant::now())
            }
        };
        let v = if self.opts.exact_verify {
            mlx::device::eval(&[&drafted.drafts, &drafted.head])?;
            self.verify_exact(sampler, history, &drafted.drafts.to_vec::<u32>()?)?
        } else {
            let built = match built {
                Some(b) => b,
                None => self.build_verify(sampler, &drafted)?,
            };
            if self.builds_ahead(sampler, k, remaining) {
                self.ahead = Some(self.build_ahead(sampler, k, &drafted, &built)?);
                self.ahead_counts.0 += 1;
            }
            let v = self.verify(sampler, history, &drafted, built)?;
            if v.accepted < k {
                self.ahead = None; // built on a guess that was wrong
            }
            v
        };
        Ok(self.after_cycle(k, v, [since, t0, t1], stats))
    }

    /// Whether to build the next cycle while this one's verify runs: asked for, the verify's last
    /// target is drawn on the device with nothing to read first (greedy, no penalties, grammar or
    /// log-probabilities), drafts are made here, and a cycle of the same depth is likely to follow.
    fn builds_ahead(&self, sampler: &Sampler, k: usize, remaining: usize) -> bool {
        self.choice.ahead()
            && sampler.params.is_greedy()
            && !sampler.params.uses_history()
            && !sampler.is_constrained()
            && !sampler.records_logprobs()
            && self.model.drafts_here()
            && !self.model.splits_drafting()
            && remaining > 2 * (k + 1)
            && !self.ctl.parked()
    }

    /// The next cycle of depth `k`, built on the guess that this one (`drafted`, `built`) keeps every
    /// draft: its drafts from the head fed this verify's hidden states, its verify on a copy of the
    /// caches with the whole pass kept; both started.
    fn build_ahead(&self, sampler: &Sampler, k: usize, drafted: &Drafted, built: &Built) -> Result<Ahead> {
        let guess = match &built.drawn {
            Some(t) => t.slice_axis(0, k as i32, k as i32 + 1)?.as_dtype(Dtype::U32)?, // [1]
            None => return Err(mlx::Error::Invalid("a cycle built ahead needs its targets drawn ahead".into()).into()),
        };
        let mut drafter = self.drafter.clone();
        let ids = mlx::concatenate(&[&drafted.drafts.as_dtype(Dtype::U32)?, &guess], 0)?.reshape(&[1, k as i32 + 1])?;
        drafter.queue_lazy([built.hidden.clone()], ids);
        let head = drafter.draft(self.model, k, self.opts.depth)?;
        let next = self.drafted_at(head, k, self.emitted + k + 1)?;
        launch::start(&[&next.drafts, &next.head])?;
        let mut cache = built.open.all_kept(&self.cache)?;
        let built = build_verify(self.model, sampler, &mut cache, &guess, &next)?;
        Ok(Ahead { k, cache, drafter, drafted: next, built })
    }

    /// This cycle's verify forward over `last` and the drafts, built and started on the caches.
    fn build_verify(&mut self, sampler: &Sampler, d: &Drafted) -> Result<Built> {
        let last = Array::from_slice(&[self.last], &[1])?;
        build_verify(self.model, sampler, &mut self.cache, &last, d)
    }

    /// The depth of the cycle to run now, or None for a plain step (parked, no room, or a plain
    /// step already running ahead).
    pub(crate) fn cycle_depth(&self, remaining: usize) -> Option<usize> {
        let k = self.ctl.depth().min(remaining.saturating_sub(1));
        (k > 0 && !self.ctl.parked() && !self.steps.is_running()).then_some(k)
    }

    /// Other work ran since the previous step returned (a newcomer's prefill chunk): the next
    /// step's cost is timed from its own start, so the controller does not charge that work to it.
    pub(crate) fn interrupted(&mut self) {
        self.returned = None;
    }

    /// The batch size the next steps run in (the controller's costs are per size).
    pub(crate) fn set_batch(&mut self, batch: usize) {
        self.ctl.set_batch(batch);
    }

    /// Whether drafts are verified token by token (then a cycle cannot share a batched forward).
    pub(crate) fn verifies_exactly(&self) -> bool {
        self.opts.exact_verify
    }

    /// Its plain steps' pipeline.
    pub(crate) fn steps(&self) -> &Pipeline {
        &self.steps
    }

    pub(crate) fn steps_mut(&mut self) -> &mut Pipeline {
        &mut self.steps
    }

    /// Whether the step after the plain step about to run is plain too (drafting stays parked, or too
    /// few tokens are left for a cycle), `remaining` tokens being left before it.
    pub(crate) fn next_is_plain(&self, remaining: usize) -> bool {
        self.ctl.parked_after_this_step() || remaining <= 2
    }

    /// The newest sampled token, which the next forward feeds.
    pub(crate) fn last(&self) -> u32 {
        self.last
    }

    /// The caches, for a batched forward: a cycle built ahead alone no longer applies.
    pub(crate) fn cache_mut(&mut self) -> &mut [LayerCache] {
        self.ahead = None;
        &mut self.cache
    }

    /// When the previous step returned (or `now` for the first): a step's cost runs from there.
    pub(crate) fn since(&self, now: Instant) -> Instant {
        self.returned.unwrap_or(now)
    }

    /// The bookkeeping after a plain step that fed `last`: `hidden` at it, `next` sampled after it.
    /// Where a park ends in a shadow probe, its drafts are built and started here.
    fn after_plain(&mut self, hidden: Array, next: u32, since: Instant, stats: &mut Stats) -> Result<Vec<u32>> {
        let new = self.after_plain_step(hidden, next, since, self.steps.steady(), stats)?;
        if let Some(k) = self.shadow_due() {
            start_shadows(&mut [self], k)?;
        }
        Ok(new)
    }

    /// [`MtpDecoder::after_plain`] but for the shadow probe, which a batch starts for all its sequences
    /// whose park ends at this step ([`MtpDecoder::shadow_due`], [`start_shadows`]). `steady`: the step's
    /// time is a plain step's in a row of them ([`Pipeline::steady`]).
    pub(crate) fn after_plain_step(
        &mut self,
        hidden: Array,
        next: u32,
        since: Instant,
        steady: bool,
        stats: &mut Stats,
    ) -> Result<Vec<u32>> {
        stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth)).parked_cycles += 1;
        // The head catches up on this position when drafting resumes.
        self.drafter.queue([hidden], &[next]);
        self.last = next;
        self.emitted += 1;
        let now = Instant::now();
        tracing::trace!(ms = ms(since, now), steady, "mtp: parked step");
        self.ctl.after_plain(ms(since, now), steady);
        self.returned = Some(now);
        self.check_shadow(next)?;
        Ok(vec![next])
    }

    /// The depth of a shadow probe to start now (the park just ended), after a plain step's bookkeeping:
    /// the caller starts it ([`start_shadows`]).
    pub(crate) fn shadow_due(&mut self) -> Option<usize> {
        self.ctl.shadow_due()
    }

    /// Adds `next`, a token plain decoding produced, to the pending shadow probe's; once there are as many
    /// as its drafts, the controller has its verdict: how many leading drafts were those tokens.
    fn check_shadow(&mut self, next: u32) -> Result<()> {
        let Some(s) = self.shadow.as_mut() else { return Ok(()) };
        s.tokens.push(next);
        let k = s.drafts.dim(0).max(0) as usize;
        if s.tokens.len() < k {
            return Ok(());
        }
        let drafts = s.drafts.to_vec::<u32>()?;
        let accepted = drafts.iter().zip(&s.tokens).take_while(|(d, t)| d == t).count();
        self.shadow = None;
        tracing::trace!(k, accepted, "mtp: shadow probe");
        self.ctl.after_shadow(k, accepted);
        Ok(())
    }

    /// The head's `k` drafts (on the device), or the oracle's in their place.
    pub(crate) fn draft(&mut self, k: usize) -> Result<Drafted> {
        // The drafts stay on the device: verify is built on them and one wait covers both.
        let head = self.drafter.draft(self.model, k, self.opts.depth)?;
        self.drafted(head, k)
    }

    /// The drafts sent to verify for the head's `head` `[k]`: its own, or its oracle's, drawn at this
    /// sequence's own count of emitted tokens.
    fn drafted(&self, head: Array, k: usize) -> Result<Drafted> {
        self.drafted_at(head, k, self.emitted)
    }

    /// [`MtpDecoder::drafted`] after `emitted` tokens.
    fn drafted_at(&self, head: Array, k: usize, emitted: usize) -> Result<Drafted> {
        let drafts = match self.oracle.as_ref() {
            Some(oracle) => Array::from_slice(&oracle.drafts(emitted, k), &[k as i32])?,
            None => head.clone(),
        };
        Ok(Drafted { drafts, head })
    }

    /// The bookkeeping after a cycle of depth `k`: the tokens it emits. `times`: when the previous
    /// step returned, when this one started, when its drafts were built.
    pub(crate) fn after_cycle(&mut self, k: usize, v: Verified, times: [Instant; 3], stats: &mut Stats) -> Vec<u32> {
        let [since, t0, t1] = times;
        let drafts = &v.drafts;
        let a = v.accepted;
        let now = Instant::now();
        let cycle_ms = ms(since, now);
        self.returned = Some(now);
        self.shadow = None; // its drafts no longer line up with the tokens
        let mut out = drafts[..a].to_vec();
        out.push(v.next);
        self.drafter.queue(v.hidden, &out);
        self.last = v.next;

        tracing::trace!(
            k,
            accepted = a,
            ms = cycle_ms,
            draft_ms = ms(t0, t1),
            catch_up_ms = self.drafter.catch_up_ms(),
            verify_ms = v.ms[0],
            "mtp: cycle"
        );
        let spec = stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth));
        spec.record_cycle(k, a);
        spec.ms.draft += ms(t0, t1);
        spec.ms.verify += v.ms[0];
        spec.ms.sample += v.ms[1];
        spec.ms.rollback += v.ms[2];
        self.emitted += a + 1;
        self.ctl.after_spec(cycle_ms - self.drafter.catch_up_ms(), k, a);
        self.choice.after_cycle(cycle_ms - self.drafter.catch_up_ms(), a + 1);
        out
    }

    /// Cycles built ahead so far, and how many of them were kept (their guess was right).
    pub fn cycles_ahead(&self) -> (usize, usize) {
        self.ahead_counts
    }

    /// Fills in the final statistics.
    pub fn finish(&self, stats: &mut Stats) {
        let (built, kept) = self.ahead_counts;
        tracing::debug!(built, kept, judged = ?self.choice.last, "mtp: cycles built ahead");
        if let Some(spec) = stats.spec.as_mut() {
            if self.ctl.parked() && spec.cycles == 0 {
                spec.fallback = self.ctl.reason.clone();
            }
        }
    }

    /// Reads the verify `built` over `last` and the drafts `[k]` (on the device), then keeps the
    /// accepted prefix. The head's own drafts are computed with it even when the oracle replaced
    /// them.
    fn verify(&mut self, sampler: &mut Sampler, history: &mut Vec<u32>, d: &Drafted, built: Built) -> Result<Verified> {
        let t1 = Instant::now();
        let Built { hidden, logits, drawn, open } = built;
        let mut wait = vec![&logits, &d.drafts, &d.head];
        wait.extend(drawn.as_ref());
        mlx::device::eval(&wait)?;
        let t2 = Instant::now();
        let (drafts, accepted, next) =
            decide(sampler, history, self.last, &logits, &d.drafts, &self.stop_ids, drawn.as_ref())?;
        let t3 = Instant::now();
        open.resume(&mut self.cache).commit(accepted + 1)?;
        let hidden = vec![hidden.slice_axis(1, 0, accepted as i32 + 1)?];
        let t4 = Instant::now();
        Ok(Verified { drafts, accepted, next, hidden, ms: [ms(t1, t2), ms(t2, t3), ms(t3, t4)] })
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
                Some(&d) if d == tok && !self.stop_ids.contains(&tok) => fed = tok,
                _ => break tok,
            }
        };
        let drafts = drafts.to_vec();
        Ok(Verified { drafts, accepted: hidden.len() - 1, next, hidden, ms: [ms(t1, Instant::now()), 0.0, 0.0] })
    }
}

/// The drafts of several sequences for a cycle of depth `k`, their heads run together
/// ([`Drafter::draft_batch`]: one output head, argmax and head pass per draft step for the group);
/// each keeps its own oracle, catch-up time and head cache. One decoder drafts as it does alone.
pub(crate) fn draft_batch(decoders: &mut [&mut MtpDecoder<'_>], k: usize) -> Result<Vec<Drafted>> {
    let Some(model) = decoders.first().map(|d| d.model) else { return Ok(Vec::new()) };
    let depths: Vec<usize> = decoders.iter().map(|d| d.opts.depth).collect();
    for d in decoders.iter_mut() {
        d.ahead = None; // a cycle built alone does not apply to a batch's
    }
    let heads = {
        let mut drafters: Vec<&mut Drafter> = decoders.iter_mut().map(|d| &mut d.drafter).collect();
        Drafter::draft_batch(model, &mut drafters, k, &depths)?
    };
    decoders.iter_mut().zip(heads).map(|(d, head)| d.drafted(head, k)).collect()
}

/// Shadow probes of depth `k` for `decoders` whose parks end at this step: each catches its head up alone
/// (cache writes), then their drafts run together as a group's do ([`draft_batch`]: one head pass a
/// draft step for all, where several streams parked together would each have run their own). Built and
/// started, read once `k` tokens have come ([`MtpDecoder::check_shadow`]).
pub(crate) fn start_shadows(decoders: &mut [&mut MtpDecoder<'_>], k: usize) -> Result<()> {
    let Some(model) = decoders.first().map(|d| d.model) else { return Ok(()) };
    let (t, pending) = (Instant::now(), decoders.iter().map(|d| d.drafter.pending()).max().unwrap_or(0));
    for d in decoders.iter_mut() {
        d.drafter.write_catch_up(model)?;
    }
    let drafted = draft_batch(decoders, k)?;
    let started: Vec<&Array> = drafted.iter().flat_map(|d| [&d.drafts, &d.head]).collect();
    let ops = tracing::enabled!(tracing::Level::TRACE).then(|| mlx::compile::graph_ops(&started));
    launch::start(&started)?;
    // Traced: what the probes' catch-ups and drafts cost the host (building and launching them).
    tracing::trace!(streams = decoders.len(), pending, ops, ms = ms(t, Instant::now()), "mtp: shadow drafts started");
    for (d, drafted) in decoders.iter_mut().zip(drafted) {
        d.shadow = Some(Shadow { drafts: drafted.drafts, tokens: Vec::with_capacity(k) });
    }
    Ok(())
}

/// Builds and starts a verify forward over `last` (`[1]`, on the device or not) and the drafts on
/// `cache`, its layers launched as they are built; the pass stays open ([`Built::open`]).
fn build_verify(
    model: &Qwen35,
    sampler: &Sampler,
    cache: &mut [LayerCache],
    last: &Array,
    d: &Drafted,
) -> Result<Built> {
    let k = d.drafts.dim(0);
    let input =
        mlx::concatenate(&[&last.as_dtype(Dtype::U32)?, &d.drafts.as_dtype(Dtype::U32)?], 0)?.reshape(&[1, k + 1])?;
    let mut verify = Verify::begin(cache, k as usize + 1);
    // The drafts are already running; the verify's layers start as they are built.
    let hidden = launch::early(|| model.forward(&input, verify.cache()))?;
    let logits = model.logits(&hidden)?.squeeze(&[0])?.as_dtype(Dtype::F32)?; // [k+1, V]
    let drawn = draw_ahead(sampler, &logits)?;
    let mut start = vec![&logits];
    start.extend(drawn.as_ref());
    launch::start(&start)?;
    Ok(Built { hidden, logits, drawn, open: verify.suspend() })
}

/// A verify's input `[1, k + 1]`: `last`, then the drafts `[k]`.
pub(crate) fn verify_input(last: u32, drafts: &Array) -> Result<Array> {
    let k = drafts.dim(0);
    let last = Array::from_slice(&[last], &[1, 1])?;
    Ok(mlx::concatenate(&[&last, &drafts.as_dtype(Dtype::U32)?.reshape(&[1, k])?], 1)?)
}

/// Decides a verified cycle from its logits `[k + 1, V]` (evaluated) and the targets drawn ahead
/// with them, if any ([`draw_ahead`]): how many drafts stay and
/// the token after them, appending `last` and the kept drafts to `history`. An accepted draft
/// that ends the generation is emitted as the cycle's last token instead of being fed: the same
/// tokens come out, and the caches hold exactly the prompt and the reply (what the prefix cache
/// keeps for the next turn), not tokens past the end.
pub(crate) fn decide(
    sampler: &mut Sampler,
    history: &mut Vec<u32>,
    last: u32,
    logits: &Array,
    drafts: &Array,
    stop_ids: &[u32],
    drawn: Option<&Array>,
) -> Result<(Vec<u32>, usize, u32)> {
    let drafts = drafts.to_vec::<u32>()?;
    history.push(last);
    let (mut accepted, mut next) = accept_drawn(sampler, logits, &drafts, history, drawn)?;
    if let Some(j) = drafts[..accepted].iter().position(|d| stop_ids.contains(d)) {
        (accepted, next) = (j, drafts[j]);
    }
    history.extend_from_slice(&drafts[..accepted]);
    Ok((drafts, accepted, next))
}

pub(crate) fn ms(a: Instant, b: Instant) -> f64 {
    (b - a).as_secs_f64() * 1e3
}
