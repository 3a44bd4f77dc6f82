//! MTP speculative decoding (docs/MODEL.md §4.2–4.4): the model's own MTP head drafts k tokens,
//! one forward over k+1 tokens verifies them, and the caches roll back exactly to the accepted prefix.
//!
//! Invariants between cycles:
//! - the main caches hold every committed token except `last`, the newest sampled one;
//! - the MTP cache holds one entry per pair (h_i, x_{i+1}) already run through the head; the pairs
//!   not yet run wait in `pending` and are flushed in one batched head forward before drafting.

use std::time::Instant;

use mlx::{concatenate, random, Array, Dtype};

use super::decode::{sample_last, MtpOptions, Result};
use super::sampler::Sampler;
use super::stats::{SpecStats, Stats};
use crate::cache::{KvCache, LayerCache};
use crate::model::Qwen35;

pub struct SpecDecoder<'m> {
    model: &'m Qwen35,
    cache: Vec<LayerCache>,
    mtp_cache: KvCache,
    opts: MtpOptions,
    /// Hidden states `[1, T, D]` and the tokens that follow them, not yet run through the head.
    pending_hidden: Vec<Array>,
    pending_tokens: Vec<u32>,
    /// The newest sampled token, not yet fed to the main model.
    last: u32,
    ctl: Controller,
    emitted_in_cycles: usize,
    /// Time the current cycle spent catching the head up on positions decoded while parked: a
    /// one-off cost of having parked, kept out of the controller's judgement of drafting.
    catch_up_ms: f64,
}

impl<'m> SpecDecoder<'m> {
    /// Starts from a prefilled cache: `hidden` holds the prompt's post-norm hidden states and
    /// `first` the token sampled after the prompt.
    pub fn new(
        model: &'m Qwen35,
        opts: &MtpOptions,
        _sampler: &mut Sampler,
        cache: Vec<LayerCache>,
        hidden: &Array,
        prompt: &[u32],
        first: u32,
    ) -> Result<Self> {
        let mut tokens: Vec<u32> = prompt[1..].to_vec();
        tokens.push(first);
        Ok(SpecDecoder {
            model,
            cache,
            mtp_cache: model.make_mtp_cache().unwrap_or_default(),
            opts: opts.clone(),
            pending_hidden: vec![hidden.clone()],
            pending_tokens: tokens,
            last: first,
            ctl: Controller::new(opts.adaptive),
            emitted_in_cycles: 0,
            catch_up_ms: 0.0,
        })
    }

    /// One plain step or one speculative cycle; returns the new tokens (at least one).
    /// `history` holds the prompt and every emitted token except the newest (`last`).
    pub fn step(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        remaining: usize,
        stats: &mut Stats,
    ) -> Result<Vec<u32>> {
        let spec = stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth));
        let k = self.opts.depth.min(remaining.saturating_sub(1));
        if k == 0 || self.ctl.parked() {
            spec.parked_cycles += 1;
            return self.plain_step(sampler, history);
        }
        let t0 = Instant::now();
        let drafts = self.draft(k)?;
        let t1 = Instant::now();
        let base = history.len();
        history.push(self.last);
        let mut input: Vec<i32> = vec![self.last as i32];
        input.extend(drafts.iter().map(|&d| d as i32));
        if self.opts.exact_verify {
            return self.exact_cycle(sampler, history, &drafts, stats, t0, t1);
        }
        for c in self.cache.iter_mut() {
            if let Some(s) = c.as_linear() {
                s.record_next = true;
            }
        }
        let hidden = self.model.forward(&Array::from_slice(&input, &[1, input.len() as i32])?, &mut self.cache)?;
        let logits = self.model.logits(&hidden)?.squeeze(&[0])?.as_dtype(Dtype::F32)?; // [k+1, V]
        logits.eval()?;
        let t2 = Instant::now();
        let (accepted, next) = accept(sampler, &logits, &drafts, history)?;
        let t3 = Instant::now();
        history.truncate(base + 1);
        history.extend_from_slice(&drafts[..accepted]);
        self.commit(&hidden, &drafts[..accepted], next, k)?;
        let t4 = Instant::now();

        let spec = stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth));
        spec.record_cycle(k, accepted);
        spec.ms.draft += ms(t0, t1);
        spec.ms.verify += ms(t1, t2);
        spec.ms.sample += ms(t2, t3);
        spec.ms.rollback += ms(t3, t4);
        self.emitted_in_cycles += accepted + 1;
        self.ctl.after_spec(ms(t0, t4) - self.catch_up_ms, accepted + 1);
        let mut out = drafts[..accepted].to_vec();
        out.push(next);
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

    /// Runs the pending pairs through the head; returns its normed output at the last pair.
    fn flush(&mut self) -> Result<Array> {
        let hidden = concatenate(&self.pending_hidden.iter().collect::<Vec<_>>(), 1)?;
        let ids: Vec<i32> = self.pending_tokens.iter().map(|&t| t as i32).collect();
        debug_assert_eq!(hidden.dim(1) as usize, ids.len());
        let out =
            self.model.mtp_forward(&hidden, &Array::from_slice(&ids, &[1, ids.len() as i32])?, &mut self.mtp_cache)?;
        self.pending_hidden.clear();
        self.pending_tokens.clear();
        let t = out.dim(1);
        Ok(out.slice_axis(1, t - 1, t)?)
    }

    /// Drafts `k` tokens greedily, chaining through the head's normed output (docs/MODEL.md §4.2).
    fn draft(&mut self, k: usize) -> Result<Vec<u32>> {
        let catching_up = self.pending_tokens.len() > self.opts.depth + 1;
        let t = Instant::now();
        let mut hm = self.flush()?;
        self.catch_up_ms = if catching_up {
            hm.eval()?;
            ms(t, Instant::now())
        } else {
            0.0
        };
        let mut drafts: Vec<Array> = Vec::with_capacity(k);
        for j in 0..k {
            let d = self.model.logits(&hm)?.argmax(-1, false)?; // [1, 1]
            if j + 1 < k {
                hm = self.model.mtp_forward(&hm, &d, &mut self.mtp_cache)?;
            }
            drafts.push(d);
        }
        let refs: Vec<&Array> = drafts.iter().collect();
        let all = concatenate(&refs, 1)?.reshape(&[-1])?;
        Ok(all.to_vec::<u32>()?)
    }

    /// Keeps the accepted prefix in every cache and queues the committed pairs for the head.
    fn commit(&mut self, hidden: &Array, accepted: &[u32], next: u32, k: usize) -> Result<()> {
        let a = accepted.len();
        for c in self.cache.iter_mut() {
            match c {
                LayerCache::Kv(kv) => kv.trim((k - a) as i32)?,
                LayerCache::Linear(s) => s.rollback(a + 1, self.model.linear_kernel())?,
            }
        }
        // The k-1 chained draft entries were speculative.
        self.mtp_cache.trim(k as i32 - 1)?;
        self.pending_hidden.push(hidden.slice_axis(1, 0, a as i32 + 1)?);
        self.pending_tokens.extend_from_slice(accepted);
        self.pending_tokens.push(next);
        self.last = next;
        Ok(())
    }

    /// Verifies one token at a time, so verify logits are exactly those of plain decoding, and
    /// stops at the first mismatch (no rollback of the main caches is needed).
    fn exact_cycle(
        &mut self,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        drafts: &[u32],
        stats: &mut Stats,
        t0: Instant,
        t1: Instant,
    ) -> Result<Vec<u32>> {
        let k = drafts.len();
        let mut fed = self.last;
        let mut accepted = 0;
        let mut hiddens = Vec::new();
        let next = loop {
            let h = self.model.forward(&Array::from_slice(&[fed as i32], &[1, 1])?, &mut self.cache)?;
            let tok = sample_last(self.model, sampler, &h, history)?;
            hiddens.push(h);
            if accepted < k && tok == drafts[accepted] {
                fed = tok;
                history.push(tok);
                accepted += 1;
            } else {
                break tok;
            }
        };
        let t2 = Instant::now();
        self.mtp_cache.trim(k as i32 - 1)?;
        self.pending_hidden.extend(hiddens);
        self.pending_tokens.extend_from_slice(&drafts[..accepted]);
        self.pending_tokens.push(next);
        self.last = next;
        let spec = stats.spec.get_or_insert_with(|| SpecStats::new(self.opts.depth));
        spec.record_cycle(k, accepted);
        spec.ms.draft += ms(t0, t1);
        spec.ms.verify += ms(t1, t2);
        self.emitted_in_cycles += accepted + 1;
        self.ctl.after_spec(ms(t0, t2) - self.catch_up_ms, accepted + 1);
        let mut out = drafts[..accepted].to_vec();
        out.push(next);
        Ok(out)
    }

    /// Plain decoding while parked; the head catches up later from `pending`.
    fn plain_step(&mut self, sampler: &mut Sampler, history: &mut Vec<u32>) -> Result<Vec<u32>> {
        let t0 = Instant::now();
        history.push(self.last);
        let h = self.model.forward(&Array::from_slice(&[self.last as i32], &[1, 1])?, &mut self.cache)?;
        let next = sample_last(self.model, sampler, &h, history)?;
        self.pending_hidden.push(h);
        self.pending_tokens.push(next);
        self.last = next;
        self.ctl.after_plain(ms(t0, Instant::now()));
        Ok(vec![next])
    }
}

fn ms(a: Instant, b: Instant) -> f64 {
    (b - a).as_secs_f64() * 1e3
}

/// Decides how many drafts to accept from verify logits `[k+1, V]` and the token that follows them.
/// Greedy: the longest prefix where the target's argmax equals the draft, then the target's argmax.
/// Sampling (drafts are argmax, so q is one-hot): accept d_j with probability p_j(d_j); on rejection
/// draw from p_j with d_j removed; after all k, draw the bonus from p_k. This keeps the output
/// distribution exactly the target's (speculative sampling).
fn accept(sampler: &mut Sampler, logits: &Array, drafts: &[u32], history: &mut Vec<u32>) -> Result<(usize, u32)> {
    let k = drafts.len();
    let row = |sampler: &Sampler, j: usize, hist: &[u32]| -> Result<Array> {
        let l = logits.slice_axis(0, j as i32, j as i32 + 1)?.reshape(&[-1])?;
        Ok(sampler.penalize(&l, hist)?)
    };
    if sampler.is_greedy() && sampler.params.repetition_penalty == 1.0 {
        let targets = logits.argmax(-1, false)?.to_vec::<u32>()?;
        let a = (0..k).take_while(|&j| targets[j] == drafts[j]).count();
        return Ok((a, targets[a]));
    }
    for j in 0..k {
        let l = row(sampler, j, history)?;
        if sampler.is_greedy() {
            let t = l.argmax(-1, false)?.item::<u32>()?;
            if t != drafts[j] {
                return Ok((j, t));
            }
        } else {
            let lp = sampler.logprobs(&l)?;
            let p = lp.exp()?;
            let pd = p.take(&Array::from_slice(&[drafts[j] as i32], &[1])?, 0)?.item::<f32>()?;
            let u = random::uniform(&[1], Dtype::F32, &sampler.next_key()?)?.item::<f32>()?;
            if u >= pd {
                // Residual max(0, p - q) with q one-hot at d_j: p without d_j, renormalised.
                let mask = Array::arange(0.0, p.dim(0) as f64, 1.0, Dtype::I32)?
                    .equal(&Array::scalar(drafts[j], Dtype::I32)?)?;
                let resid = mlx::where_(&mask, &Array::f32(f32::NEG_INFINITY), &lp)?;
                let t = random::categorical(&resid, -1, &sampler.next_key()?)?.item::<u32>()?;
                return Ok((j, t));
            }
        }
        history.push(drafts[j]);
    }
    let l = row(sampler, k, history)?;
    let t = sampler.sample(&l)?.item::<u32>()?;
    Ok((k, t))
}

/// Parks drafting (depth 0) when a speculative cycle costs more per token than a plain step.
///
/// Both costs are means over recent windows, not running averages of single cycles: on a GPU one
/// cycle in ten can take twice as long for reasons of its own, and a judgement that one such cycle
/// can swing parks drafting that pays.
struct Controller {
    adaptive: bool,
    spec: Window,
    plain: Window,
    parked_left: usize,
    cycles_since_probe: usize,
    /// The next parking's length: doubles each time a probe loses again, so a model whose drafts do
    /// not pay spends ever less time probing; back to `PARK` once drafting wins.
    next_park: usize,
    reason: Option<String>,
}

/// The most recent `(ms, tokens)` pairs, up to a capacity.
struct Window {
    items: std::collections::VecDeque<(f64, usize)>,
    capacity: usize,
}

impl Window {
    fn new(capacity: usize) -> Window {
        Window { items: std::collections::VecDeque::with_capacity(capacity), capacity }
    }

    fn push(&mut self, ms: f64, tokens: usize) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back((ms, tokens));
    }

    fn ms_per_token(&self) -> Option<f64> {
        let tokens: usize = self.items.iter().map(|&(_, t)| t).sum();
        (tokens > 0).then(|| self.items.iter().map(|&(ms, _)| ms).sum::<f64>() / tokens as f64)
    }
}

impl Controller {
    const PROBE: usize = 2;
    const PARK: usize = 16;
    const MAX_PARK: usize = 512;
    const REPROBE_EVERY: usize = 64;
    /// Speculative cycles measured before comparing with plain decoding.
    const JUDGE_AFTER: usize = 4;
    /// Drafting is parked only when it costs this much more per token than plain decoding: within
    /// it the two are a wash, and measurement noise should not decide.
    const MARGIN: f64 = 0.03;

    fn new(adaptive: bool) -> Controller {
        // Measure plain decoding first (two steps) so there is something to compare with.
        Controller {
            adaptive,
            spec: Window::new(8),
            plain: Window::new(16),
            parked_left: if adaptive { Self::PROBE } else { 0 },
            cycles_since_probe: 0,
            next_park: Self::PARK,
            reason: None,
        }
    }

    fn parked(&self) -> bool {
        self.parked_left > 0
    }

    fn after_plain(&mut self, ms: f64) {
        self.plain.push(ms, 1);
        self.parked_left = self.parked_left.saturating_sub(1);
    }

    fn after_spec(&mut self, ms: f64, emitted: usize) {
        self.spec.push(ms, emitted);
        self.cycles_since_probe += 1;
        if !self.adaptive {
            return;
        }
        if let (Some(spec), Some(plain)) = (self.spec.ms_per_token(), self.plain.ms_per_token()) {
            if self.spec.items.len() >= Self::JUDGE_AFTER {
                if spec > plain * (1.0 + Self::MARGIN) {
                    self.reason =
                        Some(format!("parked: drafting costs {spec:.2} ms/token, plain decoding {plain:.2} ms/token"));
                    tracing::debug!("{}", self.reason.as_deref().unwrap_or(""));
                    self.parked_left = self.next_park;
                    self.next_park = (self.next_park * 2).min(Self::MAX_PARK);
                    self.cycles_since_probe = 0;
                    self.spec.items.clear();
                    return;
                }
                self.next_park = Self::PARK;
            }
        }
        if self.cycles_since_probe >= Self::REPROBE_EVERY {
            self.parked_left = Self::PROBE;
            self.cycles_since_probe = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the controller for `tokens` tokens with fixed costs: a plain step costs `plain` ms, a
    /// speculative cycle `spec` ms and emits `emitted` tokens. Returns the tokens emitted by cycles.
    fn drive(c: &mut Controller, tokens: usize, plain: f64, spec: f64, emitted: usize) -> usize {
        let (mut done, mut by_spec) = (0, 0);
        while done < tokens {
            if c.parked() {
                c.after_plain(plain);
                done += 1;
            } else {
                c.after_spec(spec, emitted);
                done += emitted;
                by_spec += emitted;
            }
        }
        by_spec
    }

    #[test]
    fn controller_backs_off_when_drafting_loses_and_returns_when_it_wins() {
        // Drafts never accepted and a cycle costs 1.8 steps (the GPU measurement in docs/PERF.md).
        let mut c = Controller::new(true);
        let spec_tokens = drive(&mut c, 2000, 10.0, 18.0, 1);
        // With a fixed 16-step park, 3 of every 19 tokens would come from losing cycles (~16%).
        assert!(spec_tokens * 100 < 2000 * 3, "{spec_tokens} of 2000 tokens from losing cycles");
        assert!(c.reason.as_deref().is_some_and(|r| r.contains("parked")), "{:?}", c.reason);
        // Drafting that pays (3 tokens per 15 ms against 10 ms per step) takes over again.
        let won = drive(&mut c, 4000, 10.0, 15.0, 3);
        assert!(won * 10 > 4000 * 8, "only {won} of 4000 tokens from cycles once drafting pays");
    }

    /// Drafting that wins by 12% on average keeps running although one cycle in ten takes twice as
    /// long (GPU timings); an average that one slow cycle can swing parked it again and again.
    #[test]
    fn controller_keeps_drafting_that_wins_through_noisy_cycles() {
        let mut c = Controller::new(true);
        let (mut done, mut by_spec, mut cycle) = (0, 0, 0usize);
        while done < 3000 {
            if c.parked() {
                c.after_plain(10.0);
                done += 1;
            } else {
                cycle += 1;
                // 3 tokens per cycle; 24 ms, or 48 ms every tenth cycle: 8.8 ms a token on average.
                c.after_spec(if cycle % 10 == 0 { 48.0 } else { 24.0 }, 3);
                done += 3;
                by_spec += 3;
            }
        }
        assert!(by_spec * 100 > 3000 * 95, "only {by_spec} of 3000 tokens from cycles");
    }

    #[test]
    fn controller_off_never_parks() {
        let mut c = Controller::new(false);
        assert_eq!(drive(&mut c, 500, 10.0, 40.0, 1), 500);
    }
    use crate::generate::SamplingParams;

    fn softmax(l: &[f32], temp: f32) -> Vec<f64> {
        let m = l.iter().cloned().fold(f32::MIN, f32::max);
        let e: Vec<f64> = l.iter().map(|&x| (((x - m) / temp) as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|x| x / s).collect()
    }

    /// Pearson's chi-square statistic of observed counts against expected probabilities.
    fn chi_square(counts: &[usize], p: &[f64]) -> f64 {
        let n: usize = counts.iter().sum();
        counts.iter().zip(p).map(|(&c, &pi)| (c as f64 - n as f64 * pi).powi(2) / (n as f64 * pi)).sum()
    }

    /// Speculative sampling must leave the target distribution unchanged: with argmax drafts, the
    /// first emitted token is distributed as the target's p_0, and the second (given the first was
    /// the draft) as p_1. Fixed seed; significance 0.001 (chi-square critical value for 7 degrees
    /// of freedom: 24.32). With 3000 draws, the drafts' own mass (~0.3) would give a statistic in the
    /// hundreds if acceptance were biased, e.g. if drafts were always accepted.
    #[test]
    fn speculative_sampling_preserves_the_target_distribution() {
        let v = 8;
        let l0: Vec<f32> = vec![1.0, 0.2, -0.5, 1.4, 0.0, -1.0, 0.7, 0.3];
        let l1: Vec<f32> = vec![0.1, 1.1, 0.4, -0.2, 0.9, 0.0, -0.6, 0.5];
        let temp = 0.8;
        let logits = Array::from_slice(&[l0.clone(), l1.clone(), vec![0.0; v]].concat(), &[3, v as i32]).unwrap();
        let p0 = softmax(&l0, temp);
        let p1 = softmax(&l1, temp);
        // Drafts as the head would make them: the argmax of its own (here: the target's) logits.
        let drafts = [3u32, 1u32];
        let params = SamplingParams { temperature: temp, seed: Some(1234), ..Default::default() };
        let mut sampler = Sampler::new(params).unwrap();
        let (mut first, mut second) = (vec![0usize; v], vec![0usize; v]);
        for _ in 0..3000 {
            let mut history = vec![];
            let (a, next) = accept(&mut sampler, &logits, &drafts, &mut history).unwrap();
            let emitted: Vec<u32> = drafts[..a].iter().copied().chain(std::iter::once(next)).collect();
            first[emitted[0] as usize] += 1;
            if emitted[0] == drafts[0] {
                second[emitted[1] as usize] += 1;
            }
        }
        let (c0, c1) = (chi_square(&first, &p0), chi_square(&second, &p1));
        assert!(c0 < 24.32, "first token: chi-square {c0}, counts {first:?}, p {p0:?}");
        assert!(c1 < 24.32, "second token: chi-square {c1}, counts {second:?}, p {p1:?}");
        // The check has power: accepting every draft would fail it.
        let mut biased = vec![0usize; v];
        biased[3] = 3000;
        assert!(chi_square(&biased, &p0) > 1000.0);
    }
}
