//! Continuous batching (src/generate/batch.rs, the engine's worker): every sequence decoded in a
//! batch gives what it gives alone — the same tokens and log-probabilities — plain and with MTP,
//! with prompts of different lengths, sequences joining and leaving mid-stream, one stopped
//! mid-cycle, and seeded sampling; a batched forward's rows are the single forwards' rows.

use mlx::Array;
use tandem::generate::batch::{draft, step_batch};
use tandem::generate::mtp::Drafted;
use tandem::generate::{
    Control, GenerateOptions, MtpOptions, Output, Prompt, Resume, SamplingParams, Sequence, TokenLogprob,
};
use tandem::model::{self, LoadOptions, Qwen35};

use crate::common::*;

fn tiny() -> Qwen35 {
    model::load(&tiny_model_dir(), &LoadOptions::default()).expect("load tandem-tiny")
}

fn opts(n: usize, mtp: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false, ..Default::default() },
        // The log-probabilities show a difference in any layer's state long before greedy text does.
        logprobs: Some(2),
        ..Default::default()
    }
}

/// Alone, as `generate` runs it.
fn alone(m: &Qwen35, prompt: &[u32], o: &GenerateOptions) -> Output {
    let mut seq = Sequence::start(m, prompt, &[], o.clone(), Resume::default(), &mut |_| Control::Continue).unwrap();
    while !seq.is_done() {
        seq.step(true, &mut |_| Control::Continue).unwrap();
    }
    seq.finish()
}

/// The same tokens, and log-probabilities equal to rounding.
fn same(batched: &Output, single: &Output, what: &str) {
    assert_eq!(batched.tokens, single.tokens, "{what}: tokens");
    assert_eq!(batched.logprobs.len(), single.logprobs.len(), "{what}: log-probabilities recorded");
    let worst = batched
        .logprobs
        .iter()
        .zip(&single.logprobs)
        .map(|(a, b): (&TokenLogprob, &TokenLogprob)| (a.logprob - b.logprob).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-4, "{what}: log-probabilities differ by up to {worst}");
}

/// A batch run: sequence i starts before step `joins[i]` of the batch; all step together until
/// each ends. `stop_after[i]`: its caller stops it after that many reported tokens.
fn batched(
    m: &Qwen35,
    prompts: &[Vec<u32>],
    o: &[GenerateOptions],
    joins: &[usize],
    stop_after: &[Option<usize>],
) -> Vec<Output> {
    // Mostly started ahead where they can be (the engine's way when nothing waits to join), every fourth
    // step not: both kinds of step, and steps after each.
    batched_with(m, prompts, o, joins, stop_after, |stepped, running| step_batch(running, stepped % 4 != 3).unwrap())
}

/// [`batched`], each step of the running sequences taken by `step` (given how many steps came before).
fn batched_with(
    m: &Qwen35,
    prompts: &[Vec<u32>],
    o: &[GenerateOptions],
    joins: &[usize],
    stop_after: &[Option<usize>],
    mut step: impl FnMut(usize, &mut [&mut Sequence<'_>]),
) -> Vec<Output> {
    let n = prompts.len();
    let mut seqs: Vec<Option<Sequence<'_>>> = (0..n).map(|_| None).collect();
    let mut seen = vec![0usize; n];
    let mut outs: Vec<Option<Output>> = (0..n).map(|_| None).collect();
    let mut stepped = 0;
    while outs.iter().any(Option::is_none) {
        for i in 0..n {
            if seqs[i].is_none() && outs[i].is_none() && joins[i] <= stepped {
                let (seen, stop) = (&mut seen[i], stop_after[i]);
                let mut cb = |p: tandem::generate::Progress<'_>| {
                    *seen += p.new_tokens.len();
                    if stop.is_some_and(|s| *seen >= s) {
                        Control::Stop
                    } else {
                        Control::Continue
                    }
                };
                seqs[i] = Some(Sequence::start(m, &prompts[i], &[], o[i].clone(), Resume::default(), &mut cb).unwrap());
            }
        }
        {
            let mut running: Vec<&mut Sequence<'_>> = seqs.iter_mut().flatten().filter(|s| !s.is_done()).collect();
            if !running.is_empty() {
                step(stepped, &mut running);
            }
        }
        stepped += 1;
        for i in 0..n {
            if let Some(seq) = seqs[i].as_mut() {
                let (seen, stop) = (&mut seen[i], stop_after[i]);
                seq.report(&mut |p| {
                    *seen += p.new_tokens.len();
                    if stop.is_some_and(|s| *seen >= s) {
                        Control::Stop
                    } else {
                        Control::Continue
                    }
                });
            }
            if seqs[i].as_ref().is_some_and(|s| s.is_done()) {
                outs[i] = seqs[i].take().map(Sequence::finish);
            }
        }
        assert!(stepped < 10_000, "the batch never ended");
    }
    outs.into_iter().map(Option::unwrap).collect()
}

#[test]
fn a_batched_forward_gives_each_row_its_single_forward() {
    let m = tiny();
    let prompts = [probe_tokens(5, 0), probe_tokens(17, 40), probe_tokens(9, 200)];
    let mut singles = Vec::new();
    let mut caches = Vec::new();
    for p in &prompts {
        let ids: Vec<i32> = p.iter().map(|&t| t as i32).collect();
        let mut c = m.make_cache();
        m.forward(&Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap(), &mut c).unwrap();
        caches.push(c);
    }
    // One further step of two tokens per sequence (a verify's width), alone and batched.
    let next: Vec<[i32; 2]> = vec![[11, 12], [300, 4], [7, 7]];
    for (c, t) in caches.iter().zip(&next) {
        let mut c = c.clone();
        let h = m.forward(&Array::from_slice(t, &[1, 2]).unwrap(), &mut c).unwrap();
        singles.push((h.to_f32_vec().unwrap(), c));
    }
    let flat: Vec<i32> = next.iter().flatten().copied().collect();
    let mut batch: Vec<Vec<tandem::cache::LayerCache>> = caches.clone();
    let h = {
        let mut refs: Vec<&mut [tandem::cache::LayerCache]> = batch.iter_mut().map(|c| c.as_mut_slice()).collect();
        m.forward_batch(&Array::from_slice(&flat, &[3, 2]).unwrap(), &mut refs).unwrap()
    };
    for (i, (single, cache)) in singles.iter().enumerate() {
        let row = h.slice_axis(0, i as i32, i as i32 + 1).unwrap().to_f32_vec().unwrap();
        assert!(max_abs(&row, single) <= 1e-5, "row {i}: hidden states differ by {}", max_abs(&row, single));
        // Each sequence's caches are its own: what its single forward left.
        for (l, (a, b)) in batch[i].iter().zip(cache).enumerate() {
            for (x, y) in a.contents().unwrap().iter().zip(b.contents().unwrap()) {
                assert_eq!(x.shape(), y.shape(), "row {i}, layer {l}");
                let d = max_abs(&x.to_f32_vec().unwrap(), &y.to_f32_vec().unwrap());
                assert!(d <= 1e-5, "row {i}, layer {l}: cache differs by {d}");
            }
        }
    }
    // A row count that does not match the caches is an error, not a panic.
    let mut two: Vec<&mut [tandem::cache::LayerCache]> = batch.iter_mut().take(2).map(|c| c.as_mut_slice()).collect();
    let err = m.forward_batch(&Array::from_slice(&flat, &[3, 2]).unwrap(), &mut two).unwrap_err();
    assert!(err.to_string().contains("3 token rows for 2 sequences"), "{err}");
}

/// A batched forward over the same sequences as the one before takes the linear-attention states
/// the batch left whole (no concatenation of the rows: two fewer per linear layer), and its rows
/// are still each sequence's own.
#[test]
fn a_second_batched_forward_takes_the_batch_states_whole() {
    use tandem::cache::LayerCache;
    let m = tiny();
    let prompts = [probe_tokens(6, 0), probe_tokens(19, 60), probe_tokens(11, 150)];
    let steps: [[i32; 3]; 2] = [[11, 300, 7], [42, 5, 900]];
    let mut caches: Vec<Vec<LayerCache>> = Vec::new();
    let mut singles = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let ids: Vec<i32> = p.iter().map(|&t| t as i32).collect();
        let mut c = m.make_cache();
        m.forward(&Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap(), &mut c).unwrap();
        caches.push(c.clone());
        let mut h = None;
        for step in &steps {
            h = Some(m.forward(&Array::from_slice(&[step[i]], &[1, 1]).unwrap(), &mut c).unwrap());
        }
        singles.push(h.unwrap().to_f32_vec().unwrap());
    }
    let linear = caches[0].iter().filter(|c| matches!(c, LayerCache::Linear(_))).count();
    assert!(linear > 0, "tandem-tiny has linear-attention layers");
    let concats = |h: &Array| {
        mlx::compile::graph_op_histogram(&[h]).iter().filter(|(n, _)| n == "Concatenate").map(|(_, c)| c).sum::<usize>()
    };
    let mut counted = Vec::new();
    let mut last = None;
    for step in &steps {
        let mut refs: Vec<&mut [LayerCache]> = caches.iter_mut().map(|c| c.as_mut_slice()).collect();
        let h = m.forward_batch(&Array::from_slice(step, &[3, 1]).unwrap(), &mut refs).unwrap();
        counted.push(concats(&h));
        // Evaluated with the caches, so the next step's graph starts from arrays, as in decoding.
        let mut arrays = vec![&h];
        arrays.extend(caches.iter().flatten().flat_map(|c| c.arrays()));
        mlx::device::eval(&arrays).unwrap();
        last = Some(h);
    }
    assert_eq!(counted[0] - counted[1], 2 * linear, "concatenations, first and second step: {counted:?}");
    let h = last.unwrap();
    for (i, single) in singles.iter().enumerate() {
        let row = h.slice_axis(0, i as i32, i as i32 + 1).unwrap().to_f32_vec().unwrap();
        assert!(max_abs(&row, single) <= 1e-5, "row {i}: hidden states differ by {}", max_abs(&row, single));
    }
}

#[test]
fn batched_sequences_decode_as_they_do_alone_plain_and_mtp() {
    let m = tiny();
    let prompts = vec![probe_tokens(12, 0), probe_tokens(48, 30), probe_tokens(5, 400), probe_tokens(30, 90)];
    for mtp in [false, true] {
        // Different lengths and limits: the second leaves early, the fourth joins mid-stream.
        let o: Vec<GenerateOptions> = [40, 9, 33, 25].iter().map(|&n| opts(n, mtp)).collect();
        let outs = batched(&m, &prompts, &o, &[0, 0, 0, 6], &[None; 4]);
        for (i, out) in outs.iter().enumerate() {
            let single = alone(&m, &prompts[i], &o[i]);
            same(out, &single, &format!("mtp {mtp}, sequence {i}"));
            if mtp {
                let spec = out.stats.spec.as_ref().expect("spec stats");
                assert!(spec.cycles > 0 && spec.accepted > 0, "sequence {i}: no accepted draft in the batch: {spec:?}");
            }
        }
    }
}

#[test]
fn a_mixed_batch_of_plain_mtp_and_adaptive_sequences_matches_alone() {
    let m = tiny();
    let prompts = vec![probe_tokens(20, 10), probe_tokens(7, 77), probe_tokens(33, 150)];
    let mut adaptive = opts(60, true);
    adaptive.mtp.adaptive = true;
    let o = vec![opts(30, false), opts(45, true), adaptive];
    let outs = batched(&m, &prompts, &o, &[0, 2, 0], &[None; 3]);
    for (i, out) in outs.iter().enumerate() {
        same(out, &alone(&m, &prompts[i], &o[i]), &format!("sequence {i}"));
    }
}

/// A drafting sequence beside a parked one steps plainly with it (one forward for the batch, not a plain one
/// and a cycle): a fixed-depth MTP sequence takes plain steps while an adaptive newcomer measures plain decoding
/// at the new batch size (its controller starts parked), and both still decode as they do alone.
#[test]
fn drafting_beside_a_parked_neighbour_steps_plainly_with_it_and_decodes_as_alone() {
    let m = tiny();
    let prompts = vec![probe_tokens(15, 20), probe_tokens(11, 250)];
    let mut adaptive = opts(24, true);
    adaptive.mtp.adaptive = true;
    let o = vec![opts(40, true), adaptive];
    let outs = batched(&m, &prompts, &o, &[0, 4], &[None; 2]);
    let parked = |out: &Output| out.stats.spec.as_ref().map_or(0, |s| s.parked_cycles);
    for (i, out) in outs.iter().enumerate() {
        same(out, &alone(&m, &prompts[i], &o[i]), &format!("sequence {i}"));
    }
    let single = alone(&m, &prompts[0], &o[0]);
    assert!(
        parked(&outs[0]) >= parked(&single) + 2,
        "the fixed-depth sequence drafted beside its parked neighbour: {} plain steps batched, {} alone",
        parked(&outs[0]),
        parked(&single)
    );
}

/// While a neighbour is parked, a drafting sequence's steps are plain too (above), so the batch's plain steps run
/// ahead (the next one started before this one's tokens are read) as a parked batch's do: an adaptive newcomer
/// measures plain decoding over four steps, the first three of which start the next (the first two counted). Before, the drafting
/// sequence's own plan (a cycle next) kept each of them unpipelined. Both decode as they do alone.
#[test]
fn a_batch_held_plain_by_a_parked_neighbour_runs_ahead() {
    let m = tiny();
    let prompts = vec![probe_tokens(15, 20), probe_tokens(11, 250)];
    let bare = |n: usize| GenerateOptions { logprobs: None, ..opts(n, true) };
    let mut adaptive = bare(24);
    adaptive.mtp.adaptive = true;
    let o = vec![bare(40), adaptive];
    let joins = [0, 4];
    let mut ahead = 0;
    let outs = batched_with(&m, &prompts, &o, &joins, &[None; 2], |stepped, running| {
        step_batch(running, true).unwrap();
        if (joins[1]..joins[1] + 2).contains(&stepped) {
            ahead += running.iter().filter(|s| s.running_ahead()).count();
        }
    });
    assert_eq!(ahead, 4, "rows started ahead in the newcomer's first two plain steps");
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.tokens, alone(&m, &prompts[i], &o[i]).tokens, "sequence {i}");
    }
}

#[test]
fn greedy_sequences_without_logprobs_share_one_argmax_and_decode_as_alone() {
    // Without log-probabilities (the other tests record them), plain greedy steps take one argmax for the
    // whole batch; a penalised neighbour sends the step back to each sequence's own sampler.
    let m = tiny();
    let prompts = vec![probe_tokens(18, 40), probe_tokens(9, 210), probe_tokens(27, 333)];
    let bare = |n: usize, mtp: bool| GenerateOptions { logprobs: None, ..opts(n, mtp) };
    let mut penalised = bare(28, false);
    penalised.sampling.repetition_penalty = 1.3;
    for (what, o) in [
        ("plain", vec![bare(30, false), bare(22, false), bare(35, false)]),
        ("mtp", vec![bare(30, true), bare(22, true), bare(35, true)]),
        ("one penalised", vec![bare(30, false), penalised, bare(35, true)]),
    ] {
        let outs = batched(&m, &prompts, &o, &[0, 0, 3], &[None; 3]);
        for (i, out) in outs.iter().enumerate() {
            assert_eq!(out.tokens, alone(&m, &prompts[i], &o[i]).tokens, "{what}, sequence {i}");
        }
    }
}

/// A batch's plain steps run ahead (the next built and started before this one's tokens are read) where every
/// sequence steps plainly again and samples without reading tokens on the host: greedy, seeded sampling, and an
/// adaptive MTP sequence while it measures plain decoding. A newcomer, a sequence ending early and one stopped by
/// its caller leave rows started ahead that are then taken alone. Each gives the tokens it gives alone.
#[test]
fn a_batchs_plain_steps_started_ahead_decode_as_alone() {
    let m = tiny();
    let prompts = [probe_tokens(13, 8), probe_tokens(21, 99), probe_tokens(6, 321), probe_tokens(17, 55)];
    let bare = |n: usize, mtp: bool| GenerateOptions { logprobs: None, ..opts(n, mtp) };
    let sampling = SamplingParams { temperature: 0.8, top_p: 0.9, seed: Some(5), ..SamplingParams::default() };
    let mut adaptive = bare(30, true);
    adaptive.mtp.adaptive = true;
    let o = [bare(40, false), GenerateOptions { sampling, ..bare(36, false) }, bare(12, false), adaptive];
    let (joins, stop_after) = ([0, 0, 0, 5], [None, Some(20), None, None]);
    let mut ahead = 0;
    let outs = batched_with(&m, &prompts, &o, &joins, &stop_after, |stepped, running| {
        step_batch(running, true).unwrap();
        // Counted before the adaptive sequence joins: once it has, whether it drafts (a cycle: nothing runs
        // ahead) depends on the times its controller measures.
        if stepped < joins[3] {
            ahead += running.iter().filter(|s| s.running_ahead()).count();
        }
    });
    assert_eq!(ahead, 3 * joins[3], "rows of the three plain sequences' batched steps started ahead before the join");
    for (i, out) in outs.iter().enumerate() {
        let single = alone(&m, &prompts[i], &o[i]);
        match stop_after[i] {
            Some(n) => {
                assert!(out.tokens.len() >= n && single.tokens.starts_with(&out.tokens), "sequence {i} (stopped)")
            }
            None => assert_eq!(out.tokens, single.tokens, "sequence {i}"),
        }
    }
}

#[test]
fn a_sequence_stopped_mid_cycle_leaves_its_neighbours_unchanged() {
    let m = tiny();
    let prompts = vec![probe_tokens(16, 3), probe_tokens(24, 60), probe_tokens(10, 300)];
    let o: Vec<GenerateOptions> = (0..3).map(|_| opts(36, true)).collect();
    // The middle one is stopped by its caller after 7 tokens, inside a cycle's tokens.
    let outs = batched(&m, &prompts, &o, &[0, 0, 0], &[None, Some(7), None]);
    assert_eq!(outs[1].finish, tandem::generate::FinishReason::Cancelled);
    let full = alone(&m, &prompts[1], &o[1]);
    assert!(outs[1].tokens.len() >= 7 && full.tokens.starts_with(&outs[1].tokens), "the stopped one's tokens");
    for i in [0, 2] {
        same(&outs[i], &alone(&m, &prompts[i], &o[i]), &format!("neighbour {i}"));
    }
}

#[test]
fn seeded_sampling_in_a_batch_draws_what_it_draws_alone() {
    // Draws are keyed by position, so a seeded sequence gives the same tokens with MTP or without
    // (speculative sampling keeps the distribution, docs/MODEL.md §4.3): batched, too.
    let m = tiny();
    let prompts = vec![probe_tokens(14, 5), probe_tokens(28, 120)];
    let sampled = |seed: u64, mtp: bool| GenerateOptions {
        sampling: SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(seed), ..SamplingParams::default() },
        ..opts(40, mtp)
    };
    let o = vec![sampled(11, true), sampled(12, true)];
    let outs = batched(&m, &prompts, &o, &[0, 0], &[None; 2]);
    for (i, out) in outs.iter().enumerate() {
        let plain = alone(&m, &prompts[i], &sampled(11 + i as u64, false));
        assert_eq!(out.tokens, plain.tokens, "sequence {i}: batched MTP sampling left plain sampling's tokens");
    }
}

/// Adaptive sequences whose drafts never land, decoded together: they park together after the first
/// judgement, and every probe after that is a shadow one, started for both at once (their heads' drafts as
/// one group's); no losing cycle runs after the first judgement, and each gives plain decoding's tokens.
#[test]
fn parked_sequences_in_a_batch_probe_by_shadow_drafts_together() {
    let m = tiny();
    let prompts = vec![probe_tokens(20, 0), probe_tokens(33, 90)];
    let n = 150;
    let plain: Vec<Output> = prompts.iter().map(|p| alone(&m, p, &opts(n, false))).collect();
    let o: Vec<GenerateOptions> = plain
        .iter()
        .map(|out| {
            let oracle = Some(tandem::generate::Oracle { continuation: out.tokens.clone(), acceptance: 0.0, seed: 2 });
            let mut o = GenerateOptions { oracle, ..opts(n, true) };
            o.mtp.adaptive = true;
            o
        })
        .collect();
    let outs = batched(&m, &prompts, &o, &[0, 0], &[None; 2]);
    for (i, (out, single)) in outs.iter().zip(&plain).enumerate() {
        same(out, single, &format!("sequence {i}"));
        let s = out.stats.spec.as_ref().expect("spec stats");
        // Two cycles before the first park (a third where a loaded machine's timings delay that judgement);
        // probing by cycles would add one per park (16, 32, 64 steps): five.
        assert!(s.accepted_hist[0] <= 3, "sequence {i}: losing cycles: {s:?}");
        assert!(s.parked_cycles > 100, "sequence {i}: {s:?}");
    }
}

/// The drafts of shadow probes started together (each head's catch-up written into its cache, then one head
/// pass a draft step for the group) are those each head makes alone after its own catch-up, and the group's
/// drafting graph is smaller than the heads' one by one.
#[test]
fn shadow_drafts_of_a_group_are_each_heads_own() {
    use tandem::generate::mtp::drafter::Drafter;
    use tandem::generate::prefill;
    let m = tiny();
    let k = 3;
    let drafters: Vec<Drafter> = [probe_tokens(20, 0), probe_tokens(33, 90), probe_tokens(9, 200)]
        .iter()
        .map(|prompt| {
            let mut cache = m.make_cache();
            let hidden = prefill(&m, prompt, &mut cache, 512).unwrap();
            Drafter::new(&m, &hidden, prompt, 7)
        })
        .collect();
    let mut alone_ops = 0;
    let alone: Vec<Vec<u32>> = drafters
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.write_catch_up(&m).unwrap();
            let drafts = d.draft(&m, k, k).unwrap();
            alone_ops += mlx::compile::graph_ops(&[&drafts]);
            drafts.to_vec::<u32>().unwrap()
        })
        .collect();
    let mut group = drafters.clone();
    for d in group.iter_mut() {
        d.write_catch_up(&m).unwrap();
        assert_eq!(d.pending(), 1, "the catch-up leaves the last pair for the draft");
    }
    let drafts = Drafter::draft_batch(&m, &mut group.iter_mut().collect::<Vec<_>>(), k, &[k; 3]).unwrap();
    let group_ops = mlx::compile::graph_ops(&drafts.iter().collect::<Vec<_>>());
    let together: Vec<Vec<u32>> = drafts.iter().map(|d| d.to_vec::<u32>().unwrap()).collect();
    assert_eq!(together, alone, "the group's shadow drafts against each head's own");
    assert!(group_ops < alone_ops, "the group's drafts: {group_ops} operations, one by one {alone_ops}");
}

/// Sequences started alone, each then stepped alone `cycles[i]` times: their positions differ, and
/// so do the pairs their heads have still to run (a fresh one holds its whole prompt's).
fn stepped<'m>(m: &'m Qwen35, prompts: &[Vec<u32>], o: &[GenerateOptions], cycles: &[usize]) -> Vec<Sequence<'m>> {
    let mut seqs = Vec::new();
    for ((p, o), &n) in prompts.iter().zip(o).zip(cycles) {
        let mut seq = Sequence::start(m, p, &[], o.clone(), Resume::default(), &mut |_| Control::Continue).unwrap();
        for _ in 0..n {
            seq.step(false, &mut |_| Control::Continue).unwrap();
        }
        seqs.push(seq);
    }
    seqs
}

/// The drafts sent to verify and the head's own, as tokens.
fn draft_tokens(drafted: &[Drafted]) -> Vec<(Vec<u32>, Vec<u32>)> {
    drafted.iter().map(|d| (d.drafts.to_vec::<u32>().unwrap(), d.head.to_vec::<u32>().unwrap())).collect()
}

/// The drafts of a group, made in one batched pass per draft step, are those each sequence makes
/// alone: fresh sequences (each flushes its prompt's pairs alone, the chained steps run together),
/// sequences part way into their replies (their pending pairs flushed together, padded where their
/// counts differ) and a mix; with oracle drafts, each sequence's come from its own continuation at
/// its own position.
#[test]
fn a_group_drafts_what_each_of_its_sequences_drafts_alone() {
    let m = tiny();
    let k = 3;
    let prompts = vec![probe_tokens(12, 0), probe_tokens(30, 45), probe_tokens(7, 300), probe_tokens(21, 120)];
    let mtp: Vec<GenerateOptions> = (0..4).map(|_| opts(64, true)).collect();
    // Oracle drafts always right (or always wrong) leave every sequence the same number of pairs.
    let oracle = |p: f64| -> Vec<GenerateOptions> {
        prompts
            .iter()
            .map(|prompt| {
                let continuation = alone(&m, prompt, &opts(64, false)).tokens;
                let oracle = Some(tandem::generate::Oracle { continuation, acceptance: p, seed: 5 });
                GenerateOptions { oracle, ..opts(64, true) }
            })
            .collect()
    };
    let cases = [
        ("fresh", mtp.clone(), [0, 0, 0, 0]),
        ("part way", mtp.clone(), [1, 3, 2, 4]),
        ("mixed", mtp, [0, 2, 0, 1]),
        ("oracle 1", oracle(1.0), [1, 3, 2, 4]),
        ("oracle 0", oracle(0.0), [2, 1, 3, 1]),
    ];
    for (what, o, cycles) in cases {
        let mut lone = stepped(&m, &prompts, &o, &cycles);
        let alone: Vec<_> = lone.iter_mut().flat_map(|s| draft_tokens(&draft(&mut [s], k).unwrap())).collect();
        let mut group = stepped(&m, &prompts, &o, &cycles);
        let together = draft_tokens(&draft(&mut group.iter_mut().collect::<Vec<_>>(), k).unwrap());
        assert_eq!(together, alone, "{what}: the group's drafts against each sequence's own");
        if what.starts_with("oracle 1") {
            for (i, seq) in group.iter().enumerate() {
                let at = seq.stats().completion_tokens;
                let right = &o[i].oracle.as_ref().unwrap().continuation[at..at + k];
                assert_eq!(together[i].0, right, "{what}: sequence {i} drafts from its own continuation");
            }
        }
    }
}

/// The group's drafting graph runs the output head with its argmax, and the head (its embedding
/// lookup), once per draft step for all its sequences: k of each, not B·k as when each sequence
/// drafted on its own. Counted before anything is evaluated; the pending pairs' counts differ (the
/// sequences are at different points of their replies), so the flush is the padded one.
#[test]
fn a_group_drafts_with_one_head_pass_per_step() {
    let m = tiny();
    let k = 3;
    let prompts = vec![probe_tokens(12, 0), probe_tokens(30, 45), probe_tokens(7, 300), probe_tokens(21, 120)];
    let o: Vec<GenerateOptions> = (0..4).map(|_| opts(64, true)).collect();
    let cycles = [1, 3, 2, 4];
    let ops = |drafted: &[Drafted]| {
        let heads: Vec<&Array> = drafted.iter().map(|d| &d.head).collect();
        mlx::compile::graph_op_histogram(&heads)
    };
    let count = |h: &[(String, usize)], name: &str| h.iter().filter(|(n, _)| n == name).map(|(_, c)| c).sum::<usize>();
    let total = |h: &[(String, usize)]| h.iter().map(|(_, c)| c).sum::<usize>();
    let mut lone = stepped(&m, &prompts, &o, &cycles);
    let alone: Vec<Vec<(String, usize)>> = lone.iter_mut().map(|s| ops(&draft(&mut [s], k).unwrap())).collect();
    let mut group = stepped(&m, &prompts, &o, &cycles);
    let together = ops(&draft(&mut group.iter_mut().collect::<Vec<_>>(), k).unwrap());
    // The output head's argmax and the head's embedding lookup: one per draft step (the flush,
    // then k - 1 chained passes), for one sequence and for the group alike.
    for name in ["ArgReduce", "Gather"] {
        assert!(alone.iter().all(|a| count(a, name) == k), "{name} alone: {alone:?}");
        assert_eq!(count(&together, name), k, "{name} in the group's drafts: {together:?}");
    }
    let one_by_one: usize = alone.iter().map(|a| total(a)).sum();
    assert!(total(&together) < one_by_one, "the group's drafts: {} ops, one by one {one_by_one}", total(&together));
}

#[test]
fn a_prompt_with_images_is_refused_by_a_text_model_in_the_batch_too() {
    // Sanity of the batch's entry point for prompts (start_prompt): the usual error, not a panic.
    let m = tiny();
    let prompt = Prompt::text(probe_tokens(6, 0));
    let seq = Sequence::start_prompt(&m, &prompt, opts(4, false), Resume::default(), &mut |_| Control::Continue);
    assert!(seq.is_ok());
    let empty = Sequence::start_prompt(&m, &Prompt::text(vec![]), opts(4, false), Resume::default(), &mut |_| {
        Control::Continue
    });
    assert!(empty.is_err(), "an empty prompt starts nothing");
}

/// A newcomer's prompt prefilled a chunk at a time between a running sequence's steps (as the
/// worker interleaves them) changes neither: both give what they give alone, plain and MTP, and
/// the running one really stepped while the newcomer was part way through its prompt.
#[test]
fn a_newcomer_prefilled_in_chunks_between_steps_decodes_as_alone() {
    let m = tiny();
    for mtp in [false, true] {
        let (pa, pb) = (probe_tokens(20, 7), probe_tokens(1300, 50));
        let (oa, ob) = (opts(40, mtp), opts(24, mtp));
        let mut a = Sequence::start(&m, &pa, &[], oa.clone(), Resume::default(), &mut |_| Control::Continue).unwrap();
        let mut b = Sequence::begin(&m, &pb, &[], ob.clone(), Resume::default()).unwrap();
        let mut steps_during = 0;
        while b.left() > 0 {
            b.advance().unwrap();
            if !a.is_done() {
                a.step(false, &mut |_| Control::Continue).unwrap();
                steps_during += 1;
            }
        }
        assert!(steps_during >= 2, "the running sequence stepped {steps_during} times during a 1300-token prefill");
        let b = b.start(&mut |_| Control::Continue).unwrap();
        let mut seqs = [a, b];
        loop {
            let mut live: Vec<&mut Sequence<'_>> = seqs.iter_mut().filter(|s| !s.is_done()).collect();
            if live.is_empty() {
                break;
            }
            step_batch(&mut live, false).unwrap();
            for s in live {
                s.report(&mut |_| Control::Continue);
            }
        }
        let [a, b] = seqs;
        same(&a.finish(), &alone(&m, &pa, &oa), &format!("mtp {mtp}: the running sequence"));
        same(&b.finish(), &alone(&m, &pb, &ob), &format!("mtp {mtp}: the newcomer"));
    }
}

/// Through the engine's worker: while a newcomer's long prompt prefills, a running generation
/// keeps streaming (its prefill is cut into chunks with the batch's steps in between), and both
/// answers are what each gives alone. Before chunked prefill the running one got no token from
/// the newcomer's admission to its first token.
#[test]
fn the_worker_keeps_decoding_while_a_newcomer_prefills() {
    use std::time::{Duration, Instant};
    use tandem::engine::Event;
    let (_tmp, e) = batch_engine();
    let (pa, pb) = (probe_tokens(16, 3), probe_tokens(1600, 11));
    let alone_a = e.chat_blocking(request(pa.clone(), 400)).and_then(|g| g.blocking_collect()).unwrap();
    let alone_b = e.chat_blocking(request(pb.clone(), 8)).and_then(|g| g.blocking_collect()).unwrap();

    let mut ga = e.submit(request(pa, 400)).unwrap();
    // Wait for the running one's first tokens before the newcomer arrives.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut a_tokens = Vec::new();
    while a_tokens.is_empty() {
        assert!(Instant::now() < deadline, "no token from the first request");
        if let Ok(Event::Delta { tokens, .. }) = ga.events.try_recv() {
            a_tokens.extend(tokens);
        }
    }
    let mut gb = e.submit(request(pb, 8)).unwrap();
    let (mut b_started, mut b_first, mut a_during) = (false, false, 0);
    let (mut a_done, mut b_done) = (None, None);
    while a_done.is_none() || b_done.is_none() {
        assert!(Instant::now() < deadline, "the requests did not end");
        let mut idle = true;
        while let Ok(ev) = ga.events.try_recv() {
            idle = false;
            match ev {
                Event::Delta { tokens, .. } => {
                    if b_started && !b_first && !tokens.is_empty() {
                        a_during += 1;
                    }
                    a_tokens.extend(tokens);
                }
                Event::Done(c) => a_done = Some(c),
                Event::Failed(err) => panic!("the first request failed: {err:?}"),
                Event::Started => {}
            }
        }
        while let Ok(ev) = gb.events.try_recv() {
            idle = false;
            match ev {
                Event::Started => b_started = true,
                Event::Delta { tokens, .. } if !tokens.is_empty() => b_first = true,
                Event::Done(c) => b_done = Some(c),
                Event::Failed(err) => panic!("the newcomer failed: {err:?}"),
                Event::Delta { .. } => {}
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert!(a_during >= 2, "the running request got {a_during} deltas while a 1600-token prompt prefilled");
    assert_eq!(a_done.unwrap().tokens, alone_a.tokens, "the running request beside the newcomer");
    assert_eq!(b_done.unwrap().tokens, alone_b.tokens, "the newcomer, prefilled in chunks");
}

/// An engine serving tandem-tiny (no prefix cache) two streams at a time, in a temporary folder.
fn batch_engine() -> (tempfile::TempDir, tandem::engine::Engine) {
    use tandem::engine::{Engine, EngineConfig};
    use tandem::registry::Registry;
    let tmp = tempdir();
    let toml = tmp.path().join("models.toml");
    let tiny = tiny_model_dir();
    std::fs::write(
        &toml,
        format!("models_dir = \"models\"\n[[model]]\nname = \"t\"\npath = {tiny:?}\nprefix_cache_bytes = 0\nbatch = {{ max_streams = 2 }}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.path().join("models")).unwrap();
    let e = Engine::new(Registry::load(&toml).unwrap(), EngineConfig::default());
    (tmp, e)
}

/// A greedy request of tandem-tiny for `n` tokens that never stops early.
fn request(ids: Vec<u32>, n: usize) -> tandem::engine::Request {
    let mut r = tandem::engine::Request::new("t", tandem::engine::Input::Tokens(ids));
    r.max_tokens = Some(n);
    r.ignore_eos = true;
    r.sampling.temperature = Some(0.0);
    r
}

/// Waits for a generation's `Started` (sent when the worker admits it, before its prefill).
fn wait_started(g: &mut tandem::engine::Generation) {
    match g.events.blocking_recv() {
        Some(tandem::engine::Event::Started) => {}
        other => panic!("expected Started, got {other:?}"),
    }
}

/// A lone request is prefilled chunk by chunk too: a cancel while its 2000-token prompt prefills
/// ends it before its first token (before, its whole prompt was prefilled at once and the cancel
/// was heard only after a token had been sampled).
#[test]
fn a_cancel_stops_a_lone_prefill_between_chunks() {
    let (_tmp, e) = batch_engine();
    e.load_blocking("t").unwrap();
    let mut g = e.submit(request(probe_tokens(2000, 5), 4)).unwrap();
    wait_started(&mut g);
    // Let its first chunk begin (a cancel before it is heard at admission, in both designs); its
    // whole prefill takes seconds on the CI's CPU.
    std::thread::sleep(std::time::Duration::from_millis(200));
    g.cancel_handle().cancel();
    let done = g.blocking_collect().unwrap();
    assert_eq!(done.finish, tandem::generate::FinishReason::Cancelled);
    assert!(done.tokens.is_empty(), "cancelled while prefilling, it still sampled {:?}", done.tokens);
}

/// Unloading a model fails a request still prefilling as `Unloaded` (it never ran, like those
/// still queued), and cancels the one decoding beside it.
#[test]
fn an_unload_fails_a_request_still_prefilling() {
    use tandem::engine::{EngineError, Event};
    let (_tmp, e) = batch_engine();
    e.load_blocking("t").unwrap();
    let mut running = e.submit(request(probe_tokens(16, 3), 3000)).unwrap();
    while !matches!(running.events.blocking_recv(), Some(Event::Delta { .. })) {}
    let mut newcomer = e.submit(request(probe_tokens(2000, 7), 4)).unwrap();
    wait_started(&mut newcomer);
    assert!(e.unload_blocking("t"));
    match newcomer.blocking_collect() {
        Err(EngineError::Unloaded(model)) => assert_eq!(model, "t"),
        other => panic!("the prefilling request: expected Unloaded, got {other:?}"),
    }
    let done = running.blocking_collect().unwrap();
    assert_eq!(done.finish, tandem::generate::FinishReason::Cancelled);
}

/// A forward launched as it is built (`model::launch::early`: the layers start computing every few
/// layers while the rest is built, as an MTP verify and a batched step run) gives the lazy forward's
/// bits, alone and batched, and leaves the caches as the lazy forward does; and it did launch: its
/// output's graph no longer holds the layers already started.
#[test]
fn a_forward_launched_as_it_is_built_gives_the_lazy_forwards_bits() {
    let m = tiny();
    let prompts = [probe_tokens(20, 0), probe_tokens(9, 77)];
    let prefilled = |p: &[u32]| {
        let mut c = m.make_cache();
        let ids: Vec<i32> = p.iter().map(|&t| t as i32).collect();
        let h = m.forward(&Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap(), &mut c).unwrap();
        let mut arrays = vec![&h];
        arrays.extend(c.iter().flat_map(|l| l.arrays()));
        mlx::device::eval(&arrays).unwrap();
        c
    };
    let verify = Array::from_slice(&[5i32, 17, 300, 41], &[1, 4]).unwrap();
    let (mut lazy, mut early) = (prefilled(&prompts[0]), prefilled(&prompts[0]));
    let h_lazy = m.forward(&verify, &mut lazy).unwrap();
    let h_early = model::launch::early(|| m.forward(&verify, &mut early)).unwrap();
    let (ops_lazy, ops_early) = (mlx::compile::graph_ops(&[&h_lazy]), mlx::compile::graph_ops(&[&h_early]));
    if std::env::var_os("TANDEM_NO_EARLY_LAUNCH").is_none() {
        assert!(ops_early < ops_lazy, "nothing was launched early: {ops_early} operations left of {ops_lazy}");
    }
    assert_eq!(h_early.to_f32_vec().unwrap(), h_lazy.to_f32_vec().unwrap());
    let next = Array::from_slice(&[9i32], &[1, 1]).unwrap();
    assert_eq!(
        m.forward(&next, &mut early).unwrap().to_f32_vec().unwrap(),
        m.forward(&next, &mut lazy).unwrap().to_f32_vec().unwrap(),
        "the caches differ after the forward"
    );

    let rows = Array::from_slice(&[5i32, 17, 300, 41, 2, 2, 8, 1000], &[2, 4]).unwrap();
    let mut lazy: Vec<_> = prompts.iter().map(|p| prefilled(p)).collect();
    let mut early: Vec<_> = prompts.iter().map(|p| prefilled(p)).collect();
    let h_lazy = m.forward_batch(&rows, &mut lazy.iter_mut().map(|c| c.as_mut_slice()).collect::<Vec<_>>()).unwrap();
    let h_early = model::launch::early(|| {
        m.forward_batch(&rows, &mut early.iter_mut().map(|c| c.as_mut_slice()).collect::<Vec<_>>())
    })
    .unwrap();
    assert_eq!(h_early.to_f32_vec().unwrap(), h_lazy.to_f32_vec().unwrap());
}

/// The batched attention rotates all rows with one RoPE and an offset per row (`fast::rope_dynamic`);
/// a sequence alone takes `fast::rope` at its integer offset. Bit for bit the same, or a batched
/// sequence's keys would differ from its keys alone (on the CPU in CI; on CUDA through the GPU bench's
/// `rust` phase).
#[test]
fn a_batchs_rope_with_an_offset_per_row_rotates_each_row_as_rope_alone() {
    let offsets = [0i32, 17, 300, 4095];
    let (b, h, d, dims) = (offsets.len() as i32, 3, 64, 16);
    for dtype in [mlx::Dtype::F32, mlx::Dtype::BF16] {
        for t in [1, 4] {
            let x = mlx::random::normal(&[b, h, t, d], dtype, &mlx::random::key(7).unwrap()).unwrap();
            let pos = Array::from_slice(&offsets, &[b]).unwrap();
            let batched = mlx::fast::rope_dynamic(&x, dims, false, 1e7, 1.0, &pos).unwrap();
            for (i, &offset) in offsets.iter().enumerate() {
                let i = i as i32;
                let alone =
                    mlx::fast::rope(&x.slice_axis(0, i, i + 1).unwrap(), dims, false, 1e7, 1.0, offset).unwrap();
                let row = batched.slice_axis(0, i, i + 1).unwrap();
                assert_eq!(
                    row.to_bytes().unwrap(),
                    alone.to_bytes().unwrap(),
                    "{dtype:?}, T = {t}, row {i} at offset {offset}"
                );
                // Not a rotation by nothing: a row past position 0 changed.
                if offset > 0 {
                    assert_ne!(row.to_bytes().unwrap(), x.slice_axis(0, i, i + 1).unwrap().to_bytes().unwrap());
                }
            }
        }
    }
}
