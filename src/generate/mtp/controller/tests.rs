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
    accepted: impl FnMut(usize) -> usize,
) -> Run {
    simulate_with(c, tokens, |_, _| (plain, true), plain, cycle, accepted)
}

/// [`simulate`] with a plain step's cost and whether it is steady given by `plain(place, starts_next)`: its
/// place in a pipelined run of plain steps (1 for a step not started by the one before) and whether it starts
/// the next; a shadow probe's head passes cost [`SHADOW`] times `steady` ms.
fn simulate_with(
    c: &mut Controller,
    tokens: usize,
    plain: impl Fn(usize, bool) -> (f64, bool),
    steady: f64,
    cycle: impl Fn(usize) -> f64,
    mut accepted: impl FnMut(usize) -> usize,
) -> Run {
    let mut run = Run { by_depth: vec![0; c.max_depth], ms: 0.0 };
    let (mut done, mut place, mut started_ahead) = (0, 0, false);
    // A shadow probe in flight: its depth, drafts accepted, tokens until its verdict.
    let mut shadow: Option<(usize, usize, usize)> = None;
    while done < tokens {
        if c.parked() {
            let starts_next = c.parked_after_this_step();
            place = if started_ahead { place + 1 } else { 1 };
            let (ms, is_steady) = plain(place, starts_next);
            c.after_plain(ms, is_steady);
            started_ahead = starts_next;
            run.ms += ms;
            done += 1;
            if let Some((k, a, left)) = shadow.as_mut() {
                *left -= 1;
                if *left == 0 {
                    c.after_shadow(*k, *a);
                    shadow = None;
                }
            }
            if let Some(k) = c.shadow_due() {
                // Its head passes beside the plain step.
                run.ms += SHADOW * steady;
                let a = accepted(k);
                shadow = Some((k, a, k));
            }
        } else {
            (shadow, started_ahead) = (None, false);
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

/// What a shadow probe's head passes cost, in plain steps (three head passes of the 27B slice's 17
/// layers, one of them the head, set generously high).
const SHADOW: f64 = 0.5;

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
    // Probes after a park by cycles, and by shadow drafts (the decoder's way where the head is here).
    for shadows in [false, true] {
        // Drafts never accepted and a cycle costs 1.8 steps (the GPU measurement in docs/PERF.md).
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
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
}

/// Drafting that wins by 12% on average keeps running although one cycle in ten takes twice as
/// long (GPU timings); an average that one slow cycle can swing parked it again and again.
#[test]
fn controller_keeps_drafting_that_wins_through_noisy_cycles() {
    // Probes after a park by cycles, and by shadow drafts (the decoder's way where the head is here).
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
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
    // Probes after a park by cycles, and by shadow drafts (the decoder's way where the head is here).
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let r = simulate(&mut c, 4000, 10.0, |k| 10.0 + 6.0 * k as f64, chain(0.7, 1));
        let total: usize = r.by_depth.iter().sum::<usize>();
        assert!(r.by_depth[0] * 10 > 4000 * 7, "depth 1 made only {:?} of 4000 tokens", r.by_depth);
        assert!(r.ms < 4000.0 * 10.0 * 0.98, "{:.0} ms against {:.0} plain ({total} by cycles)", r.ms, 40000.0);
        if !shadows {
            // (With shadow probes this run happens to end inside a re-probe, at depth 3.)
            assert_eq!(c.depth(), 1);
        }
    }
}

/// Where no depth pays (drafts right half the time, a depth-1 cycle 1.74 steps: the H200
/// figures of issue 16, where drafting ran at 0.70x), MTP on is never much slower than off.
#[test]
fn controller_is_never_much_slower_than_plain_when_no_depth_pays() {
    // Probes after a park by cycles, and by shadow drafts (the decoder's way where the head is here).
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let plain = 8.4;
        let r = simulate(&mut c, 4000, plain, |k| 13.1 + 1.5 * k as f64 + 3.9 * (k as f64 - 1.0), chain(0.5, 2));
        assert!(r.ms < 4000.0 * plain * 1.03, "{:.0} ms against {:.0} plain", r.ms, 4000.0 * plain);
    }
}

/// A deep drafter that pays most at depth 3 keeps depth 3 (2 ms a draft, 95% right).
#[test]
fn controller_keeps_the_deepest_depth_when_it_pays_most() {
    // Probes after a park by cycles, and by shadow drafts (the decoder's way where the head is here).
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let r = simulate(&mut c, 3000, 10.0, |k| 12.0 + 2.0 * k as f64, chain(0.95, 3));
        assert!(r.by_depth[2] * 10 > 3000 * 8, "{:?}", r.by_depth);
    }
}

/// Costs are per batch size: alone, depth 3 pays (a cycle 12 + 2k ms against a 10 ms step, 95%
/// right); in a batch of 8 on a compute-bound machine a step of all eight costs 40 ms and each
/// draft position 60 ms more, so no depth pays there (depth 1: 100 ms for 1.95 tokens). The
/// controller parks in the batch, drafts at depth 3 at once when alone again (its costs there are
/// remembered), and stays parked on returning to the batch.
#[test]
fn controller_decides_per_batch_size() {
    // Probes after a park by cycles, and by shadow drafts (the decoder's way where the head is here).
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let alone = simulate(&mut c, 1000, 10.0, |k| 12.0 + 2.0 * k as f64, chain(0.95, 4));
        assert!(alone.by_depth[2] * 10 > 1000 * 8, "alone: {:?}", alone.by_depth);
        c.set_batch(8);
        let batched = simulate(&mut c, 3000, 40.0, |k| 40.0 + 60.0 * k as f64, chain(0.95, 5));
        let drafted: usize = batched.by_depth.iter().sum();
        assert!(drafted * 10 < 3000, "in a batch of 8, {drafted} of 3000 tokens came from losing cycles");
        assert!(batched.ms < 3000.0 * 40.0 * 1.1, "{:.0} ms against {:.0} plain", batched.ms, 3000.0 * 40.0);
        c.set_batch(1);
        assert!(!c.parked(), "alone again, drafting resumes without probing plain decoding");
        assert_eq!(c.depth(), 3);
        let again = simulate(&mut c, 500, 10.0, |k| 12.0 + 2.0 * k as f64, chain(0.95, 6));
        assert!(again.by_depth[2] * 10 > 500 * 8, "alone again: {:?}", again.by_depth);
        c.set_batch(8);
        assert!(c.parked(), "back in the batch of 8, where drafting lost");
    }
}

/// A batch size met for the first time measures plain decoding there before drafting.
#[test]
fn a_new_batch_size_measures_plain_decoding_first() {
    let mut c = Controller::new(true, 2);
    simulate(&mut c, 200, 10.0, |k| 11.0 + k as f64, chain(0.9, 7));
    assert!(!c.parked());
    c.set_batch(3);
    assert!(c.parked(), "plain decoding at 3 streams is not known yet");
    // The fixed-depth controller ignores batch sizes.
    let mut fixed = Controller::new(false, 2);
    fixed.set_batch(4);
    assert!(!fixed.parked());
    assert_eq!(fixed.depth(), 2);
}

/// A short run where no draft is ever accepted, at the 4-bit slice's costs on an H100 (a plain step
/// 3.05 ms, a cycle 4.3 ms at depth 1 and 5.66 ms at depth 3: docs/PERF.md, sessions 22-23): MTP on
/// stays within 3% of plain decoding over 256 and 512 tokens (issue 16's 0.97x). Four losing cycles
/// before each park gave 0.949x here (0.92x measured).
#[test]
fn controller_loses_under_3_percent_of_a_short_run_where_no_draft_is_accepted() {
    for tokens in [256, 512] {
        let mut c = Controller::new(true, 3);
        let plain = 3.05;
        let r = simulate(&mut c, tokens, plain, |k| 4.3 + (5.66 - 4.3) * (k as f64 - 1.0) / 2.0, |_| 0);
        let vs_plain = tokens as f64 * plain / r.ms;
        println!("{tokens} tokens, no draft accepted: {vs_plain:.3}x plain decoding ({:?} by cycles)", r.by_depth);
        assert!(vs_plain >= 0.97, "{tokens} tokens: {vs_plain:.3}x plain decoding ({:?} by cycles)", r.by_depth);
    }
}

/// Shadow probes where no draft lands, at the same H100 costs: after the first judgement no cycle runs
/// (each probe after a park is a head's drafts beside a plain step), and the run is closer to plain
/// decoding than with probe cycles.
#[test]
fn shadow_probes_run_no_losing_cycle_after_the_first_park() {
    let plain = 3.05;
    let cycle = |k: usize| 4.3 + (5.66 - 4.3) * (k as f64 - 1.0) / 2.0;
    for tokens in [256, 512, 2000] {
        let mut shadowed = Controller::new(true, 3).with_shadow_probes(true);
        let r = simulate(&mut shadowed, tokens, plain, cycle, |_| 0);
        let mut cycled = Controller::new(true, 3);
        let old = simulate(&mut cycled, tokens, plain, cycle, |_| 0);
        let cycles: usize = r.by_depth.iter().sum();
        assert!(cycles <= Controller::JUDGE_EARLY, "{tokens} tokens: {:?} by cycles", r.by_depth);
        let vs_plain = tokens as f64 * plain / r.ms;
        assert!(vs_plain >= 0.98, "{tokens} tokens: {vs_plain:.3}x plain decoding");
        assert!(r.ms < old.ms, "{tokens} tokens: {:.1} ms shadowed against {:.1} probing by cycles", r.ms, old.ms);
    }
}

/// Drafting parked while it lost resumes through a shadow probe once its drafts land, and then pays.
#[test]
fn a_shadow_probe_resumes_drafting_that_pays_again() {
    let mut c = Controller::new(true, 3).with_shadow_probes(true);
    let lost = simulate(&mut c, 2000, 10.0, |_| 18.0, |_| 0);
    assert!(lost.by_depth.iter().sum::<usize>() <= Controller::JUDGE_EARLY, "{:?}", lost.by_depth);
    assert!(c.parked());
    let won = simulate(&mut c, 4000, 10.0, |_| 15.0, |k| k);
    let won: usize = won.by_depth.iter().sum();
    assert!(won * 10 > 4000 * 8, "only {won} of 4000 tokens from cycles once drafting pays");
}

/// One stalled cycle (a loaded machine: 40 steps' time) among the four judged after drafting resumed parks
/// drafting that pays (a cycle 15 ms for 4 tokens against 10 ms a token); the shadow probes after that park
/// must not price their drafts at the stall, or drafting stays parked for good (their price was the window's
/// mean, ~28 ms a token).
#[test]
fn a_stalled_cycle_does_not_keep_drafting_that_pays_parked() {
    let mut c = Controller::new(true, 3).with_shadow_probes(true);
    let lost = simulate(&mut c, 200, 10.0, |_| 18.0, |_| 0);
    assert!(lost.by_depth.iter().sum::<usize>() <= Controller::JUDGE_EARLY, "{:?}", lost.by_depth);
    let cycles = std::cell::Cell::new(0);
    let stall_once = |_| {
        cycles.set(cycles.get() + 1);
        if cycles.get() == 3 {
            400.0
        } else {
            15.0
        }
    };
    let r = simulate(&mut c, 4000, 10.0, stall_once, |k| k);
    assert!(cycles.get() >= 3, "drafting never resumed: {:?}", r.by_depth);
    let by_cycles: usize = r.by_depth.iter().sum();
    assert!(by_cycles * 10 > 4000 * 8, "only {by_cycles} of 4000 tokens from cycles after one stalled cycle");
}

/// The first park can follow the two cycles of an early judgement, the first of them cold (its verify width's
/// first shapes, the head's first catch-up: 40 ms on a loaded machine, where a warm cycle takes 15 ms against
/// 10 ms a plain step). The shadow probes after it must price their drafts at the warm one: at the two's mean
/// (27.5 ms, 2.75 plain steps for at most 3.4 expected tokens) drafting that pays never resumed
/// (`tests/it/mtp_decode.rs::shadow_probes_replace_losing_probe_cycles_and_resume_drafting` beside two CPU hogs).
#[test]
fn a_cold_first_cycle_does_not_keep_drafting_that_pays_parked() {
    let mut c = Controller::new(true, 3).with_shadow_probes(true);
    let cycles = std::cell::Cell::new(0);
    let cold_first = |_| {
        cycles.set(cycles.get() + 1);
        if cycles.get() == 1 {
            40.0
        } else {
            15.0
        }
    };
    let lost = simulate(&mut c, 200, 10.0, cold_first, |_| 0);
    assert_eq!(lost.by_depth.iter().sum::<usize>(), Controller::JUDGE_EARLY, "{:?}", lost.by_depth);
    assert!(c.parked());
    let won = simulate(&mut c, 4000, 10.0, cold_first, |k| k);
    let won: usize = won.by_depth.iter().sum();
    assert!(won * 10 > 4000 * 8, "only {won} of 4000 tokens from cycles once drafting pays");
}

/// A shadow probe whose drafts all land does not resume drafting that would lose even so (a cycle at
/// any depth costs more than its tokens' plain steps), nor a park that has no cycle costs to price at.
#[test]
fn a_shadow_probe_resumes_only_drafting_that_would_win() {
    let mut c = Controller::new(true, 3).with_shadow_probes(true);
    let r = simulate(&mut c, 3000, 10.0, |k| 12.0 * (k + 1) as f64, |k| k);
    let cycles: usize = r.by_depth.iter().sum();
    assert!(cycles < 40, "{cycles} tokens by cycles that cost more than plain steps: {:?}", r.by_depth);
    // A park that measured no cycle here (a new batch size's first plain steps) probes by a cycle.
    let mut fresh = Controller::new(true, 3).with_shadow_probes(true);
    assert!(fresh.parked());
    for _ in 0..Controller::PROBE {
        fresh.after_plain(10.0, true);
    }
    assert_eq!(fresh.shadow_due(), None);
    assert!(!fresh.parked(), "drafting is tried by a cycle after the first plain steps");
}

/// The step before a shadow probe is pipelined like any parked one (the probe keeps drafting parked).
#[test]
fn the_step_before_a_shadow_probe_counts_as_parked() {
    let mut c = Controller::new(true, 3).with_shadow_probes(true);
    simulate(&mut c, 40, 10.0, |_| 30.0, |_| 0);
    while c.parked_left > 1 {
        c.after_plain(10.0, true);
    }
    assert!(c.parked_after_this_step());
    c.after_plain(10.0, true);
    assert_eq!(c.shadow_due(), Some(3));
    assert!(c.parked());
    let mut without = Controller::new(true, 3);
    simulate(&mut without, 40, 10.0, |_| 30.0, |_| 0);
    while without.parked_left > 1 {
        without.after_plain(10.0, true);
    }
    assert!(!without.parked_after_this_step(), "a probe by a cycle follows");
}

/// The first plain step after a cycle costs more than plain decoding does (it pays the cycle's rollback
/// and restarts the pipeline): here 1.6x a 10 ms step, as is the run's first (warming up). Drafting
/// that loses by 8 % in steady state (10.8 ms a token at every depth) must be parked once the re-probes'
/// plain steps have priced plain decoding; with the step after a cycle in the window, each re-probe's two
/// steps averaged 13 ms and drafting ran on for good.
#[test]
fn the_step_after_a_cycle_does_not_price_plain_decoding() {
    let mut c = Controller::new(true, 3);
    let (mut done, mut by_cycles, mut previous_cycle) = (0, 0, true);
    let mut late = 0;
    while done < 8000 {
        if c.parked() {
            c.after_plain(if previous_cycle { 16.0 } else { 10.0 }, true);
            previous_cycle = false;
            done += 1;
        } else {
            let k = c.depth();
            let accepted = k.min(2);
            c.after_spec(10.8 * (accepted + 1) as f64, k, accepted);
            previous_cycle = true;
            done += accepted + 1;
            by_cycles += accepted + 1;
            if done > 6000 {
                late += accepted + 1;
            }
        }
    }
    assert!(late * 5 < 2000, "{late} of the last 2000 tokens by losing cycles ({by_cycles} in all)");
}

/// Drafts that never land park drafting at the first judgement even where plain decoding looks dear: the run's
/// first plain steps (warming up on a loaded machine) at 40 ms against 10 ms after, cycles at 14 ms for their
/// one token. Priced on those steps, depth 1 looked cheaper than plain decoding and drafting ran on.
#[test]
fn drafts_that_never_land_park_whatever_plain_steps_cost() {
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let (mut done, mut by_cycles, mut steps) = (0, 0, 0);
        while done < 2000 {
            if c.parked() {
                c.after_plain(if steps < 2 { 40.0 } else { 10.0 }, true);
                if let Some(k) = c.shadow_due() {
                    c.after_shadow(k, 0);
                }
                steps += 1;
                done += 1;
            } else {
                c.after_spec(14.0, c.depth(), 0);
                done += 1;
                by_cycles += 1;
            }
        }
        assert!(by_cycles <= 10, "shadows {shadows}: {by_cycles} losing cycles");
        assert!(c.reason.as_deref().is_some_and(|r| r.contains("no draft accepted")), "{:?}", c.reason);
    }
}

/// Pipelined plain steps, priced as the decoder reports them: a run's first step builds two graphs (`first`
/// ms), its second still settles (`second`), its last only waits for the device (`last`), the others cost
/// `steady`; those started ahead that start the next are reported steady. A lone step costs `steady + last`.
fn simulate_pipelined(
    c: &mut Controller,
    tokens: usize,
    [first, second, steady, last]: [f64; 4],
    cycle: impl Fn(usize) -> f64,
    accepted: impl FnMut(usize) -> usize,
) -> Run {
    let plain = |place: usize, next: bool| match (place, next) {
        (1, true) => (first, false),
        (1, false) => (steady + last, false),
        (_, false) => (last, false),
        (2, true) => (second, true),
        (_, true) => (steady, true),
    };
    simulate_with(c, tokens, plain, steady, cycle, accepted)
}

/// A plain run's first step costs 3x a steady one and its last 0.3x, as measured with tandem-tiny at two streams
/// on the CPU (docs/PERF.md, session 31). Drafting that loses by ~15 % (cycles of 14 + 7k ms at 80 % acceptance
/// against 10 ms a plain step) is parked at the first judgement; priced by every step but the first after a
/// cycle, the run's first two steps (warming up, then only waiting) said 16.5 ms, and ~25 % of 1000 tokens
/// came from losing cycles before the re-probes' last steps brought the price down. Drafting that wins by
/// ~15 % (10 + 5k ms) keeps drafting.
#[test]
fn only_steady_plain_steps_price_plain_decoding() {
    let costs = [30.0, 10.0, 10.0, 3.0];
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let lost = simulate_pipelined(&mut c, 1000, costs, |k| 14.0 + 7.0 * k as f64, chain(0.8, 12));
        let by_cycles: usize = lost.by_depth.iter().sum();
        assert!(by_cycles * 10 < 1000, "shadows {shadows}: {by_cycles} of 1000 tokens by cycles that lose");
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let won = simulate_pipelined(&mut c, 4000, costs, |k| 10.0 + 5.0 * k as f64, chain(0.8, 11));
        let by_cycles: usize = won.by_depth.iter().sum();
        assert!(by_cycles * 10 > 4000 * 9, "shadows {shadows}: {by_cycles} of 4000 tokens by cycles that win");
    }
}

/// The second step of a plain run still settles (11.5 ms against 10, as the CPU's ran ~10-15 % over a steady
/// step: docs/PERF.md, session 31). Drafting that loses by ~6 % (cycles of 12 + 7k ms at 80 % acceptance) is
/// parked; priced by that step, as a probe of three steps did, it looked ~8 % cheaper than plain decoding and
/// every token came from cycles.
#[test]
fn the_second_step_of_a_plain_run_does_not_price_plain_decoding() {
    for shadows in [false, true] {
        let mut c = Controller::new(true, 3).with_shadow_probes(shadows);
        let r = simulate_pipelined(&mut c, 2000, [30.0, 11.5, 10.0, 3.0], |k| 12.0 + 7.0 * k as f64, chain(0.8, 13));
        let by_cycles: usize = r.by_depth.iter().sum();
        assert!(by_cycles * 5 < 2000, "shadows {shadows}: {by_cycles} of 2000 tokens by cycles that lose");
    }
}

/// Drafting that loses by ~10 % at 80 % acceptance (cycles of 13 + 7k ms against 10 ms a plain step) mostly
/// stays parked through shadow probes whose drafts land by luck. Judged alone, a probe with two or three
/// drafts right (p = 0.64) priced drafting at 9-9.3 ms a token and resumed it, for four or more losing cycles
/// each time: 82 tokens by cycles a run on average over these seeds, against 44 with the probe weighed
/// among the acceptance windows.
#[test]
fn a_lucky_shadow_probe_does_not_resume_drafting_that_loses_at_its_usual_rate() {
    let (runs, mut by_cycles) = (20, 0);
    for seed in 0..runs {
        let mut c = Controller::new(true, 3).with_shadow_probes(true);
        let r = simulate(&mut c, 2000, 10.0, |k| 13.0 + 7.0 * k as f64, chain(0.8, seed));
        by_cycles += r.by_depth.iter().sum::<usize>();
    }
    assert!(by_cycles <= 60 * runs as usize, "{} tokens by losing cycles a run", by_cycles / runs as usize);
}

/// Cycles measured on a loaded machine (plain steps 30 ms, a cycle 60) before a park, and the load gone by the
/// time drafts land again (10 ms and 20): a shadow probe prices its drafts in plain steps of its own time and
/// resumes drafting, which then pays. Priced in the old milliseconds (60 ms a cycle against 10 a plain step),
/// no probe ever resumed it (`make test`'s `mtp_decode::shadow_probes_replace_losing_probe_cycles_and_resume_drafting`
/// under load).
#[test]
fn a_park_across_a_change_of_load_prices_its_cycles_in_plain_steps() {
    let mut c = Controller::new(true, 3).with_shadow_probes(true);
    simulate(&mut c, 300, 30.0, |_| 60.0, |_| 0);
    assert!(c.parked());
    let r = simulate(&mut c, 3000, 10.0, |_| 20.0, |k| k);
    let by_cycles: usize = r.by_depth.iter().sum();
    assert!(by_cycles * 10 > 3000 * 8, "only {by_cycles} of 3000 tokens from cycles once drafting pays");
}
