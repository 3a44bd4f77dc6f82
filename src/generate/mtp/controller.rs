//! The adaptive controller: from the measured cost of a plain step and of a cycle at each depth,
//! and the running acceptance at each draft position, it picks the depth that maximises expected
//! tokens per second, or parks drafting (plain decoding) for a while when no depth beats plain
//! decoding, then probes again.
//!
//! Expected tokens of a cycle at depth k: 1 + sum over j <= k of P(the first j drafts are
//! accepted), each estimated from recent cycles that drafted position j. Its cost: the measured
//! mean at depth k, or, for a depth not measured lately, a line through the measured depths (one
//! measured depth and the plain step when only one is known).

use std::collections::VecDeque;

/// Costs are means over recent windows, not running averages of single cycles: on a GPU one cycle
/// in ten can take twice as long for reasons of its own, and one such cycle must not swing the
/// choice.
pub struct Controller {
    adaptive: bool,
    max_depth: usize,
    /// The depth cycles run at now (1..=max_depth).
    depth: usize,
    plain: Window,
    /// Per depth k (index k - 1): recent cycles' `(ms, tokens)`.
    cycles: Vec<Window>,
    /// Per draft position j (index j - 1): whether the first j drafts were accepted, in recent
    /// cycles that drafted position j.
    reached: Vec<VecDeque<bool>>,
    parked_left: usize,
    cycles_since_probe: usize,
    /// Cycles at the current depth since it was chosen; judged again after `JUDGE_AFTER`.
    cycles_at_depth: usize,
    /// The next parking's length: doubles each time a probe loses again, so a model whose drafts do
    /// not pay spends ever less time probing; back to `PARK` once drafting wins.
    next_park: usize,
    pub reason: Option<String>,
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
}

impl Controller {
    const PROBE: usize = 2;
    const PARK: usize = 16;
    const MAX_PARK: usize = 512;
    const REPROBE_EVERY: usize = 64;
    /// Cycles measured at a depth before judging it.
    const JUDGE_AFTER: usize = 4;
    /// Drafting is parked only when the best depth costs this much more per token than plain
    /// decoding, and the depth changes only for a gain this large: within it the choices are a
    /// wash, and measurement noise should not decide.
    const MARGIN: f64 = 0.03;
    /// Cycles remembered per depth and per draft position.
    const WINDOW: usize = 8;
    const ACCEPT_WINDOW: usize = 32;

    /// A controller for drafting up to `max_depth` tokens a cycle; without `adaptive` it always
    /// drafts `max_depth`.
    pub fn new(adaptive: bool, max_depth: usize) -> Controller {
        let max_depth = max_depth.max(1);
        // Measure plain decoding first (two steps) so there is something to compare with.
        Controller {
            adaptive,
            max_depth,
            depth: max_depth,
            plain: Window::new(16),
            cycles: (0..max_depth).map(|_| Window::new(Self::WINDOW)).collect(),
            reached: vec![VecDeque::new(); max_depth],
            parked_left: if adaptive { Self::PROBE } else { 0 },
            cycles_since_probe: 0,
            cycles_at_depth: 0,
            next_park: Self::PARK,
            reason: None,
        }
    }

    pub fn parked(&self) -> bool {
        self.parked_left > 0
    }

    /// The depth the next cycle should draft.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether the step after the plain step now running is plain too (drafting still parked).
    pub fn parked_after_this_step(&self) -> bool {
        self.parked_left > 1
    }

    pub fn after_plain(&mut self, ms: f64) {
        self.plain.push(ms, 1);
        self.parked_left = self.parked_left.saturating_sub(1);
    }

    /// Records a cycle that drafted `drafted` tokens, accepted `accepted` of them and took `ms`.
    pub fn after_spec(&mut self, ms: f64, drafted: usize, accepted: usize) {
        if (1..=self.max_depth).contains(&drafted) {
            self.cycles[drafted - 1].push(ms, accepted + 1);
        }
        for (j, seen) in self.reached.iter_mut().enumerate().take(drafted) {
            if seen.len() == Self::ACCEPT_WINDOW {
                seen.pop_front();
            }
            seen.push_back(j < accepted);
        }
        self.cycles_since_probe += 1;
        self.cycles_at_depth += 1;
        if !self.adaptive {
            return;
        }
        if self.cycles_at_depth >= Self::JUDGE_AFTER {
            if let Some(plain) = self.plain.ms_per_token() {
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
            self.cycles_at_depth = 0;
        }
    }

    /// Picks the depth with the lowest expected cost per token, or parks when plain decoding beats it.
    fn judge(&mut self, plain: f64) {
        let Some((best, best_ms)) = (1..=self.max_depth)
            .filter_map(|k| self.ms_per_token(k, plain).map(|c| (k, c)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
        else {
            return;
        };
        if best_ms > plain * (1.0 + Self::MARGIN) {
            self.reason = Some(format!(
                "parked: drafting costs {best_ms:.2} ms/token at its best depth ({best}), plain decoding {plain:.2} ms/token"
            ));
            tracing::debug!("{}", self.reason.as_deref().unwrap_or(""));
            self.parked_left = self.next_park;
            self.next_park = (self.next_park * 2).min(Self::MAX_PARK);
            self.cycles_since_probe = 0;
            for w in &mut self.cycles {
                w.items.clear();
            }
            self.cycles_at_depth = 0;
            return;
        }
        self.next_park = Self::PARK;
        let current = self.ms_per_token(self.depth, plain).unwrap_or(f64::INFINITY);
        if best_ms * (1.0 + Self::MARGIN) < current {
            self.set_depth(best);
        } else {
            self.cycles_at_depth = 0;
        }
    }

    /// Expected ms per token of cycles at depth `k`.
    fn ms_per_token(&self, k: usize, plain: f64) -> Option<f64> {
        let (mut tokens, mut p, mut conditional) = (1.0, 1.0, 1.0);
        for seen in &self.reached[..k] {
            // A position not drafted lately keeps the conditional rate of the one before it.
            let next = if seen.is_empty() {
                p * conditional
            } else {
                seen.iter().filter(|&&a| a).count() as f64 / seen.len() as f64
            };
            if p > 0.0 {
                conditional = next / p;
            }
            p = next;
            tokens += p;
        }
        Some(self.cycle_ms(k, plain)? / tokens)
    }

    /// The cost of a cycle at depth `k`: measured, or on a line through the measured depths.
    fn cycle_ms(&self, k: usize, plain: f64) -> Option<f64> {
        if let Some(ms) = self.cycles[k - 1].ms_per_item() {
            return Some(ms);
        }
        let known: Vec<(f64, f64)> =
            (1..=self.max_depth).filter_map(|d| self.cycles[d - 1].ms_per_item().map(|ms| (d as f64, ms))).collect();
        let x = k as f64;
        match known.as_slice() {
            [] => return None,
            // One depth measured: a line from the plain step (depth 0) through it.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a simulated run did: tokens in all, tokens by cycles at each depth (index k - 1), and
    /// the time it took.
    struct Run {
        by_depth: Vec<usize>,
        ms: f64,
    }

    /// Drives the controller for `tokens` tokens: a plain step costs `plain` ms, a cycle at depth
    /// k `cycle(k)` ms and accepts `accepted(k)` drafts.
    fn simulate(
        c: &mut Controller,
        tokens: usize,
        plain: f64,
        cycle: impl Fn(usize) -> f64,
        mut accepted: impl FnMut(usize) -> usize,
    ) -> Run {
        let mut run = Run { by_depth: vec![0; c.max_depth], ms: 0.0 };
        let mut done = 0;
        while done < tokens {
            if c.parked() {
                c.after_plain(plain);
                run.ms += plain;
                done += 1;
            } else {
                let k = c.depth();
                let (ms, a) = (cycle(k), accepted(k));
                c.after_spec(ms, k, a);
                run.ms += ms;
                done += a + 1;
                run.by_depth[k - 1] += a + 1;
            }
        }
        run
    }

    /// Each draft is accepted with probability `p` given the one before it was (splitmix64 stream).
    fn chain(p: f64, seed: u64) -> impl FnMut(usize) -> usize {
        let mut state = seed;
        move |k| {
            let mut uniform = || {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
            };
            (0..k).take_while(|_| uniform() < p).count()
        }
    }

    #[test]
    fn controller_backs_off_when_drafting_loses_and_returns_when_it_wins() {
        // Drafts never accepted and a cycle costs 1.8 steps (the GPU measurement in docs/PERF.md).
        let mut c = Controller::new(true, 3);
        let r = simulate(&mut c, 2000, 10.0, |_| 18.0, |_| 0);
        let spec_tokens: usize = r.by_depth.iter().sum();
        // With a fixed 16-step park, 3 of every 19 tokens would come from losing cycles (~16%).
        assert!(spec_tokens * 100 < 2000 * 3, "{spec_tokens} of 2000 tokens from losing cycles");
        assert!(c.reason.as_deref().is_some_and(|r| r.contains("parked")), "{:?}", c.reason);
        // Drafting that pays (every draft accepted, 15 ms a cycle against 10 ms a step) takes over.
        let won = simulate(&mut c, 4000, 10.0, |_| 15.0, |k| k);
        let won: usize = won.by_depth.iter().sum();
        assert!(won * 10 > 4000 * 8, "only {won} of 4000 tokens from cycles once drafting pays");
    }

    /// Drafting that wins by 12% on average keeps running although one cycle in ten takes twice as
    /// long (GPU timings); an average that one slow cycle can swing parked it again and again.
    #[test]
    fn controller_keeps_drafting_that_wins_through_noisy_cycles() {
        let mut c = Controller::new(true, 3);
        let n = std::cell::Cell::new(0usize);
        // 3 tokens per cycle; 24 ms, or 48 ms every tenth cycle: 8.8 ms a token on average.
        let cost = |_| {
            n.set(n.get() + 1);
            if n.get() % 10 == 0 {
                48.0
            } else {
                24.0
            }
        };
        let r = simulate(&mut c, 3000, 10.0, cost, |k| (k.min(3)).saturating_sub(1));
        let by_spec: usize = r.by_depth.iter().sum();
        assert!(by_spec * 100 > 3000 * 95, "only {by_spec} of 3000 tokens from cycles");
    }

    #[test]
    fn controller_off_never_parks_nor_changes_depth() {
        let mut c = Controller::new(false, 3);
        let r = simulate(&mut c, 500, 10.0, |_| 40.0, |_| 0);
        assert_eq!(r.by_depth, vec![0, 0, 500]);
    }

    /// Depth 3 loses to plain decoding but depth 1 wins: a cycle costs a step plus 6 ms a draft,
    /// each draft is right 70% of the time. Expected ms per token: plain 10, depth 1 16/1.7 = 9.4,
    /// depth 3 28/2.53 = 11.1. The old rule judged only the configured depth and parked; the
    /// controller drafts at depth 1 and beats plain decoding.
    #[test]
    fn controller_picks_the_depth_that_pays_when_the_deepest_loses() {
        let mut c = Controller::new(true, 3);
        let r = simulate(&mut c, 4000, 10.0, |k| 10.0 + 6.0 * k as f64, chain(0.7, 1));
        let total: usize = r.by_depth.iter().sum::<usize>();
        assert!(r.by_depth[0] * 10 > 4000 * 7, "depth 1 made only {:?} of 4000 tokens", r.by_depth);
        assert!(r.ms < 4000.0 * 10.0 * 0.98, "{:.0} ms against {:.0} plain ({total} by cycles)", r.ms, 40000.0);
        assert_eq!(c.depth(), 1);
    }

    /// Where no depth pays (drafts right half the time, a depth-1 cycle 1.74 steps: the H200
    /// figures of issue 16, where drafting ran at 0.70x), MTP on is never much slower than off.
    #[test]
    fn controller_is_never_much_slower_than_plain_when_no_depth_pays() {
        let mut c = Controller::new(true, 3);
        let plain = 8.4;
        let r = simulate(&mut c, 4000, plain, |k| 13.1 + 1.5 * k as f64 + 3.9 * (k as f64 - 1.0), chain(0.5, 2));
        assert!(r.ms < 4000.0 * plain * 1.03, "{:.0} ms against {:.0} plain", r.ms, 4000.0 * plain);
    }

    /// A deep drafter that pays most at depth 3 keeps depth 3 (2 ms a draft, 95% right).
    #[test]
    fn controller_keeps_the_deepest_depth_when_it_pays_most() {
        let mut c = Controller::new(true, 3);
        let r = simulate(&mut c, 3000, 10.0, |k| 12.0 + 2.0 * k as f64, chain(0.95, 3));
        assert!(r.by_depth[2] * 10 > 3000 * 8, "{:?}", r.by_depth);
    }
}
