//! The adaptive controller: from the measured cost of a plain step and of a cycle at each depth,
//! and the running acceptance at each draft position, it picks the depth that maximises expected
//! tokens per second, or parks drafting (plain decoding) for a while when no depth beats plain
//! decoding, then probes again.
//!
//! Expected tokens of a cycle at depth k: 1 + sum over j <= k of P(the first j drafts are
//! accepted), each estimated from recent cycles that drafted position j. Its cost: the measured
//! mean at depth k, or, for a depth not measured lately, a line through the measured depths (one
//! measured depth and the plain step when only one is known).
//!
//! A probe after a park can be a shadow one ([`Controller::with_shadow_probes`]): the head drafts
//! beside a plain step and its drafts are checked against the tokens plain decoding goes on to
//! produce, so a probe that loses costs a few head passes, not a losing cycle and the unpipelined
//! steps around it. Drafting resumes when those drafts, priced at the cycle costs measured before
//! the park (in plain steps, so a change of the machine's load between does not decide), would win.

use std::collections::VecDeque;

/// Costs are means over recent windows, not running averages of single cycles: on a GPU one cycle
/// in ten can take twice as long for reasons of its own, and one such cycle must not swing the
/// choice.
pub struct Controller {
    adaptive: bool,
    max_depth: usize,
    /// The depth cycles run at now (1..=max_depth).
    depth: usize,
    /// Costs at each batch size (index: size - 1), measured when the sequence ran in a batch of it.
    costs: Vec<Costs>,
    /// The batch size the next steps run in (1: alone).
    batch: usize,
    /// Per draft position j (index j - 1): whether the first j drafts were accepted, in recent
    /// cycles that drafted position j.
    reached: Vec<VecDeque<bool>>,
    parked_left: usize,
    cycles_since_probe: usize,
    /// Cycles at the current depth since it was chosen or last judged; judged again after
    /// `JUDGE_AFTER`, or after `JUDGE_EARLY` when none of their drafts was accepted.
    cycles_at_depth: usize,
    /// Drafts accepted in those cycles.
    accepted_at_depth: usize,
    /// The next parking's length: doubles each time a probe loses again, so a model whose drafts do
    /// not pay spends ever less time probing; back to `PARK` once drafting wins.
    next_park: usize,
    /// Whether probes after a lost park may be shadow probes (the decoder can draft beside a plain step).
    shadows: bool,
    /// How many of the next plain steps do not price plain decoding: they follow a cycle, or open the
    /// run or a batch size ([`Controller::after_plain`]).
    skip_plain: usize,
    pub reason: Option<String>,
}

/// What steps cost at one batch size.
struct Costs {
    plain: Window,
    /// `plain` holds one step that was not steady (`Controller::after_plain`), to be replaced.
    plain_provisional: bool,
    /// Per depth k (index k - 1): recent cycles' `(ms, tokens)`.
    cycles: Vec<Window>,
    /// Drafting lost at this size when last judged (parked there).
    lost: bool,
    /// Per depth, the lower median cycle measured before the last park (which clears `cycles`), in plain
    /// steps of that time: what a shadow probe prices its drafts at, in plain steps of its own time. A
    /// median, not the judge's mean: a park can follow a window of four cycles one of which stalled (a loaded
    /// machine), and every shadow probe after it would price its drafts at that stall, keeping drafting that
    /// pays parked for good (tests/it/mtp_decode.rs under `make test`); real cycles judge again with the
    /// mean once drafting resumes. The lower one: a park after the two cycles of an early judgement has two
    /// to price by, the first of them the first at its verify width (new shapes, the head's first catch-up),
    /// and their mean kept drafting parked for a whole run under load (3 ms a cycle against 1 ms a plain
    /// step, `shadow_probes_replace_losing_probe_cycles_and_resume_drafting` with two CPU hogs beside it).
    /// Pricing a cycle too low costs at most the cycles that judge again after a resume; too high, every
    /// probe after the park. In plain steps, not ms: where the machine's load falls during a park, plain
    /// steps measured after it against cycles measured before it kept drafting that pays parked (the
    /// same test, plain steps 2.5x faster at the end of the park than before it).
    before_park: Vec<Option<f64>>,
}

impl Costs {
    fn new(max_depth: usize) -> Costs {
        let cycles = (0..max_depth).map(|_| Window::new(Controller::WINDOW)).collect();
        Costs {
            plain: Window::new(16),
            plain_provisional: false,
            cycles,
            lost: false,
            before_park: vec![None; max_depth],
        }
    }
}

/// The most recent `(ms, tokens)` pairs, up to a capacity.
struct Window {
    items: VecDeque<(f64, usize)>,
    capacity: usize,
}

impl Window {
    fn new(capacity: usize) -> Window {
        Window { items: VecDeque::with_capacity(capacity), capacity }
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

    fn ms_per_item(&self) -> Option<f64> {
        (!self.items.is_empty()).then(|| self.items.iter().map(|&(ms, _)| ms).sum::<f64>() / self.items.len() as f64)
    }

    /// The lower median item's ms (the smaller of the middle two for an even count, so the faster of two).
    fn lower_median_per_item(&self) -> Option<f64> {
        let mut ms: Vec<f64> = self.items.iter().map(|&(ms, _)| ms).collect();
        ms.sort_by(f64::total_cmp);
        ms.get(ms.len().saturating_sub(1) / 2).copied()
    }
}

impl Controller {
    /// Plain steps a probe of plain decoding takes: the first two and a pipeline's last do not price it
    /// (`Controller::after_plain`), so four give one steady step.
    const PROBE: usize = 4;
    /// Plain steps after a cycle, or at the start of the run or of a batch size, that do not price plain
    /// decoding ([`Controller::after_plain`]).
    const SETTLING: usize = 2;
    const PARK: usize = 16;
    const MAX_PARK: usize = 512;
    const REPROBE_EVERY: usize = 64;
    /// Cycles measured at a depth before judging it.
    const JUDGE_AFTER: usize = 4;
    /// Cycles after which a depth none of whose drafts was accepted is judged at once (one cycle
    /// when probing after a loss): a cycle that yields one token costs more than a plain step, and
    /// four such cycles before every park cost ~5% of a 256-token run on the GPU (docs/PERF.md,
    /// session 23). A model that drafts well is caught out rarely (both first drafts wrong at 80%
    /// acceptance: 4%), and its next probe wins back.
    const JUDGE_EARLY: usize = 2;
    /// Drafting is parked only when the best depth costs this much more per token than plain
    /// decoding, and the depth changes only for a gain this large: within it the choices are a
    /// wash, and measurement noise should not decide.
    const MARGIN: f64 = 0.03;
    /// Cycles remembered per depth and per draft position.
    const WINDOW: usize = 8;
    const ACCEPT_WINDOW: usize = 32;
    /// How many cycles' worth a shadow probe's verdict counts for among the acceptance windows' (up to
    /// `ACCEPT_WINDOW`) when it decides whether drafting resumes ([`Controller::after_shadow`]).
    const SHADOW_WEIGHT: usize = 8;

    /// A controller for drafting up to `max_depth` tokens a cycle; without `adaptive` it always
    /// drafts `max_depth`.
    pub fn new(adaptive: bool, max_depth: usize) -> Controller {
        let max_depth = max_depth.max(1);
        // Measure plain decoding first (two steps) so there is something to compare with.
        Controller {
            adaptive,
            max_depth,
            depth: max_depth,
            costs: vec![Costs::new(max_depth)],
            batch: 1,
            reached: vec![VecDeque::new(); max_depth],
            parked_left: if adaptive { Self::PROBE } else { 0 },
            cycles_since_probe: 0,
            cycles_at_depth: 0,
            accepted_at_depth: 0,
            next_park: Self::PARK,
            shadows: false,
            skip_plain: Self::SETTLING,
            reason: None,
        }
    }

    /// Lets probes after a lost park be shadow probes ([`Controller::shadow_due`]).
    pub fn with_shadow_probes(mut self, on: bool) -> Controller {
        self.shadows = on;
        self
    }

    pub fn parked(&self) -> bool {
        self.parked_left > 0
    }

    /// The depth the next cycle should draft.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether the step after the plain step now running is plain too (drafting still parked, or
    /// the probe that ends the park will be a shadow one).
    pub fn parked_after_this_step(&self) -> bool {
        self.parked_left > 1 || (self.parked_left == 1 && self.shadow_possible())
    }

    /// Whether the probe that ends this park can be a shadow one: drafting lost here and the cycles
    /// it was judged on are remembered, to price the drafts at.
    fn shadow_possible(&self) -> bool {
        self.adaptive && self.shadows && self.now().lost && self.now().before_park.iter().any(Option::is_some)
    }

    /// After a plain step: the depth of a shadow probe to draft now, where the park just ended and
    /// the probe can be a shadow one. Drafting stays parked until [`Controller::after_shadow`] has
    /// the drafts' verdict (after the next `k` tokens).
    pub fn shadow_due(&mut self) -> Option<usize> {
        if self.parked_left > 0 || !self.shadow_possible() {
            return None;
        }
        self.parked_left = self.max_depth + 1;
        Some(self.max_depth)
    }

    /// A shadow probe's verdict: of its `drafted` drafts, the first `accepted` were the tokens plain
    /// decoding produced. Drafting resumes (the verdict joins the acceptance cycles measure) where drafts
    /// accepted at the rate the acceptance windows give with this probe counted [`Controller::SHADOW_WEIGHT`]
    /// times, at the cycle costs measured before the park (in plain steps of then, as plain steps of now),
    /// would not lose to plain decoding by more than the margin (cycles then measure their costs again: one
    /// unlucky window must not keep drafting parked); otherwise it parks again, twice as long. Weighted so, a
    /// probe whose drafts all land after a park where none did resumes at once, and one lucky probe does not
    /// resume drafting parked at its usual rate: taken alone, every other probe at 80 % acceptance (all three
    /// drafts right: p = 0.51) resumed drafting that lost at that rate, for four losing cycles each
    /// (tandem-tiny, two streams on the CPU: docs/PERF.md, session 31).
    pub fn after_shadow(&mut self, drafted: usize, accepted: usize) {
        let drafted = drafted.min(self.max_depth);
        let Some(plain) = self.now().plain.ms_per_token() else {
            self.parked_left = 0;
            return;
        };
        let mut reached = self.reached.clone();
        for _ in 0..Self::SHADOW_WEIGHT {
            record_reached(&mut reached, drafted, accepted);
        }
        let tokens = |k: usize| expected_tokens(&reached, k);
        let best = (1..=drafted)
            .filter_map(|k| {
                let ms = plain * line_through(&self.now().before_park, k, 1.0)?;
                Some((k, ms / tokens(k)))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            // Not clearly losing at the old costs (the park's own rule): real cycles measure again.
            Some((_, ms)) if ms <= plain * (1.0 + Self::MARGIN) => {
                record_reached(&mut self.reached, drafted, accepted);
                self.parked_left = 0;
                self.cycles_since_probe = 0;
                // Judged lost no longer: cycles judge drafting again, from the depth they ran at (and no
                // shadow follows a resume).
                self.now_mut().lost = false;
                self.restart_judging();
            }
            _ => {
                self.parked_left = self.next_park;
                self.next_park = (self.next_park * 2).min(Self::MAX_PARK);
            }
        }
    }

    /// The batch size the following steps run in. At a size whose plain step is unknown, plain
    /// decoding is measured first (as at the start); at one with measured cycles the depth is
    /// judged again on that size's costs (which may park drafting, or resume it).
    pub fn set_batch(&mut self, batch: usize) {
        let batch = batch.max(1);
        if batch == self.batch {
            return;
        }
        self.batch = batch;
        self.skip_plain = Self::SETTLING;
        if self.costs.len() < batch {
            self.costs.resize_with(batch, || Costs::new(self.max_depth));
        }
        if !self.adaptive {
            return;
        }
        let Some(plain) = self.now().plain.ms_per_token() else {
            self.parked_left = self.parked_left.max(Self::PROBE);
            return;
        };
        // Cycles measured at this size: judge on them now, parked or not. Drafting that lost here
        // (a park cleared its cycles) stays parked until the next probe.
        if self.now().cycles.iter().any(|w| !w.items.is_empty()) {
            self.parked_left = 0;
            self.judge(plain);
        } else if self.now().lost {
            // A park already counting down goes on (switching sizes must never put off the probe).
            if !self.parked() {
                self.parked_left = Self::PARK;
            }
        } else {
            self.parked_left = 0;
        }
    }

    /// The costs at the current batch size.
    fn now(&self) -> &Costs {
        &self.costs[self.batch - 1]
    }

    fn now_mut(&mut self) -> &mut Costs {
        &mut self.costs[self.batch - 1]
    }

    /// After a plain step that took `ms`; `steady`: its time is a plain step's in a row of them
    /// (`Pipeline::steady`: started ahead and starting the next, or not pipelined at all). Only steady
    /// steps price plain decoding (another stands in only while nothing else has, until the first steady
    /// one), and not the first [`Controller::SETTLING`] after a cycle or at the start of the run or of a
    /// batch size: the first pays the cycle's rollback (evaluated with the next forward) and builds its
    /// graph with the device idle (docs/PERF.md, session 28), and the second still ran ~10-15 % over a
    /// steady step on the CPU (session 31); at a start, shapes are new. Where drafting never parks, the
    /// re-probes' steps are all the window gets: priced by such steps, drafting that lost ran on.
    pub fn after_plain(&mut self, ms: f64, steady: bool) {
        let skip = self.skip_plain > 0;
        self.skip_plain = self.skip_plain.saturating_sub(1);
        let costs = self.now_mut();
        if !skip && steady {
            if std::mem::take(&mut costs.plain_provisional) {
                costs.plain.items.clear();
            }
            costs.plain.push(ms, 1);
        } else if !skip && costs.plain.items.is_empty() {
            costs.plain.push(ms, 1);
            costs.plain_provisional = true;
        }
        self.parked_left = self.parked_left.saturating_sub(1);
    }

    /// Records a cycle that drafted `drafted` tokens, accepted `accepted` of them and took `ms`.
    pub fn after_spec(&mut self, ms: f64, drafted: usize, accepted: usize) {
        self.skip_plain = Self::SETTLING;
        if (1..=self.max_depth).contains(&drafted) {
            self.now_mut().cycles[drafted - 1].push(ms, accepted + 1);
        }
        record_reached(&mut self.reached, drafted, accepted);
        self.cycles_since_probe += 1;
        self.cycles_at_depth += 1;
        self.accepted_at_depth += accepted;
        if !self.adaptive {
            return;
        }
        let early = if self.next_park > Self::PARK { 1 } else { Self::JUDGE_EARLY };
        let nothing_accepted = self.accepted_at_depth == 0 && self.cycles_at_depth >= early;
        if self.cycles_at_depth >= Self::JUDGE_AFTER || nothing_accepted {
            if let Some(plain) = self.now().plain.ms_per_token() {
                self.judge(plain);
                if self.parked() {
                    return;
                }
            }
        }
        if self.cycles_since_probe >= Self::REPROBE_EVERY {
            // Measure plain decoding again, then the deepest drafts, whose acceptance a shallower
            // depth no longer shows.
            self.parked_left = Self::PROBE;
            self.cycles_since_probe = 0;
            self.set_depth(self.max_depth);
        }
    }

    fn set_depth(&mut self, depth: usize) {
        if depth != self.depth {
            self.depth = depth;
            self.restart_judging();
        }
    }

    fn restart_judging(&mut self) {
        self.cycles_at_depth = 0;
        self.accepted_at_depth = 0;
    }

    /// Picks the depth with the lowest expected cost per token, or parks when plain decoding beats it.
    fn judge(&mut self, plain: f64) {
        let Some((best, best_ms)) = (1..=self.max_depth)
            .filter_map(|k| self.ms_per_token(k, plain).map(|c| (k, c)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
        else {
            return;
        };
        // No draft landed lately: a cycle then yields one token for at least a plain step's work, whatever the
        // timings say (a plain price measured on warm-up steps under load let drafting run on at depth 1).
        let none_landed = !self.reached[0].is_empty() && self.reached[0].iter().all(|&a| !a);
        if none_landed || best_ms > plain * (1.0 + Self::MARGIN) {
            self.reason = Some(match none_landed {
                true => format!("parked: no draft accepted in the last {} cycles", self.reached[0].len()),
                false => format!(
                    "parked: drafting costs {best_ms:.2} ms/token at its best depth ({best}), plain decoding {plain:.2} ms/token"
                ),
            });
            tracing::debug!("{}", self.reason.as_deref().unwrap_or(""));
            self.parked_left = self.next_park;
            self.next_park = (self.next_park * 2).min(Self::MAX_PARK);
            self.now_mut().lost = true;
            self.cycles_since_probe = 0;
            let costs = self.now_mut();
            costs.before_park = costs.cycles.iter().map(|w| w.lower_median_per_item().map(|ms| ms / plain)).collect();
            for w in &mut costs.cycles {
                w.items.clear();
            }
            self.restart_judging();
            return;
        }
        self.next_park = Self::PARK;
        self.now_mut().lost = false;
        let current = self.ms_per_token(self.depth, plain).unwrap_or(f64::INFINITY);
        if best_ms * (1.0 + Self::MARGIN) < current {
            self.set_depth(best);
        } else {
            self.restart_judging();
        }
    }

    /// Expected ms per token of cycles at depth `k`.
    fn ms_per_token(&self, k: usize, plain: f64) -> Option<f64> {
        Some(self.cycle_ms(k, plain)? / expected_tokens(&self.reached, k))
    }

    /// The cost of a cycle at depth `k`: measured, or on a line through the measured depths.
    fn cycle_ms(&self, k: usize, plain: f64) -> Option<f64> {
        let measured: Vec<Option<f64>> = self.now().cycles.iter().map(Window::ms_per_item).collect();
        line_through(&measured, k, plain)
    }
}

/// Records in `reached` whether each of the first `drafted` draft positions was reached (its draft and those
/// before it accepted).
fn record_reached(reached: &mut [VecDeque<bool>], drafted: usize, accepted: usize) {
    for (j, seen) in reached.iter_mut().enumerate().take(drafted) {
        if seen.len() == Controller::ACCEPT_WINDOW {
            seen.pop_front();
        }
        seen.push_back(j < accepted);
    }
}

/// Expected tokens of a cycle at depth `k`: 1 + sum over j <= k of P(the first j drafts are accepted), from
/// `reached` (per draft position, whether it was reached in recent cycles).
fn expected_tokens(reached: &[VecDeque<bool>], k: usize) -> f64 {
    let (mut tokens, mut p, mut conditional) = (1.0, 1.0, 1.0);
    for seen in &reached[..k] {
        // A position not drafted lately keeps the conditional rate of the one before it.
        let next = match seen.is_empty() {
            true => p * conditional,
            false => seen.iter().filter(|&&a| a).count() as f64 / seen.len() as f64,
        };
        if p > 0.0 {
            conditional = next / p;
        }
        p = next;
        tokens += p;
    }
    tokens
}

/// A cycle's cost at depth `k` from the costs measured per depth (index d - 1): the measured one, or on a
/// line through the measured depths (from the plain step, depth 0, when only one is measured).
fn line_through(measured: &[Option<f64>], k: usize, plain: f64) -> Option<f64> {
    if let Some(ms) = measured.get(k - 1).copied().flatten() {
        return Some(ms);
    }
    let known: Vec<(f64, f64)> =
        measured.iter().enumerate().filter_map(|(d, ms)| ms.map(|ms| ((d + 1) as f64, ms))).collect();
    let x = k as f64;
    match known.as_slice() {
        [] => return None,
        [(d, ms)] => return Some(plain + (ms - plain) * x / d),
        _ => {}
    }
    let n = known.len() as f64;
    let (mx, my) = (known.iter().map(|p| p.0).sum::<f64>() / n, known.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = known.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = known.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    Some(my + slope * (x - mx))
}

#[cfg(test)]
mod tests;
