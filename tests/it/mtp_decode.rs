//! MTP speculative decoding on a random checkpoint: greedy output identical to plain decoding at
//! every depth, and caches after rollback equal to those of a run that never saw the drafts.

use crate::common::*;
use mlx::Array;
use tandem::cache::Verify;
use tandem::generate::MtpOptions;
use tandem::model::{self, LoadOptions};

/// tandem-tiny's greedy MTP output at depths 1-3 is its plain greedy output in bf16 and in f32, on the
/// backend the suite runs on (the GPU kernel tests call the same helper with the kernels selected).
#[test]
fn tandem_tiny_greedy_mtp_equals_plain_in_bf16_and_f32() {
    for dtype in [mlx::Dtype::BF16, mlx::Dtype::F32] {
        crate::common::tiny_mtp_matches_plain(dtype, true);
    }
}

#[test]
fn greedy_with_mtp_equals_greedy_without_in_f32() {
    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "5"]);
    let m = model::load(dir.path(), &LoadOptions::default()).unwrap();
    assert!(m.has_mtp(), "{:?}", m.mtp_status);
    let prompt: Vec<u32> = vec![3, 17, 99, 4, 250, 8, 8, 61];
    let (plain, stats) = greedy(&m, &prompt, 40, None);
    assert_eq!(plain.len(), 40);
    assert!(stats.spec.is_none());
    for depth in [1, 2, 3, 5] {
        for exact_verify in [false, true] {
            let opts = MtpOptions { enabled: true, depth, adaptive: false, exact_verify, ..Default::default() };
            let (spec, stats) = greedy(&m, &prompt, 40, Some(opts));
            assert_eq!(spec, plain, "depth {depth}, exact_verify {exact_verify}");
            let s = stats.spec.expect("spec stats");
            assert!(s.cycles > 0 && s.drafted > 0, "depth {depth}: {s:?}");
            assert_eq!(s.accepted_hist.iter().sum::<usize>(), s.cycles);
            assert_eq!(s.by_depth.iter().map(|d| d.drafted).sum::<usize>(), s.drafted);
        }
    }
    // The adaptive controller parks drafting that does not pay (a random head's drafts almost never
    // do) and catches the head up when it probes again; the text stays the same.
    for depth in [2, 3] {
        let opts = MtpOptions { enabled: true, depth, adaptive: true, exact_verify: false, ..Default::default() };
        let (spec, stats) = greedy(&m, &prompt, 120, Some(opts));
        let (plain, _) = greedy(&m, &prompt, 120, None);
        assert_eq!(spec, plain, "adaptive, depth {depth}");
        let s = stats.spec.expect("spec stats");
        assert!(s.parked_cycles > 0, "depth {depth}: never parked: {s:?}");
    }
}

/// The arrays of every layer cache, flattened to f32 vectors.
fn snapshot(cache: &[tandem::cache::LayerCache]) -> Vec<Vec<f32>> {
    cache.iter().flat_map(|c| c.contents().unwrap()).map(|a| a.to_f32_vec().unwrap()).collect()
}

#[test]
fn rollback_restores_the_caches_of_a_run_without_the_drafts() {
    let dir = tempdir();
    random_hf_model(dir.path(), &["--seed", "6"]);
    let m = model::load(dir.path(), &LoadOptions::default()).unwrap();
    let prompt: Vec<i32> = vec![5, 6, 7, 8, 9, 10];
    let verify: Vec<i32> = vec![11, 12, 13, 14]; // the pending token and three drafts
    for keep in 0..=verify.len() {
        // Run prompt + all verify tokens in a verify transaction, then keep `keep` of them.
        let mut cache = m.make_cache();
        m.forward(&Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap(), &mut cache).unwrap();
        let mut tx = Verify::begin(&mut cache, verify.len());
        m.forward(&Array::from_slice(&verify, &[1, verify.len() as i32]).unwrap(), tx.cache()).unwrap();
        tx.commit(keep).unwrap();
        // A run that only ever saw the kept tokens.
        let mut clean = m.make_cache();
        let mut seen = prompt.clone();
        seen.extend_from_slice(&verify[..keep]);
        m.forward(&Array::from_slice(&seen, &[1, seen.len() as i32]).unwrap(), &mut clean).unwrap();
        let (a, b) = (snapshot(&cache), snapshot(&clean));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let e = rel_err(x, y);
            assert!(e < 1e-5, "keep {keep}: cache array {i} differs (relative error {e})");
        }
        // And the next step's logits agree.
        let next = Array::from_slice(&[42i32], &[1, 1]).unwrap();
        let la = m.logits(&m.forward(&next, &mut cache).unwrap()).unwrap().to_f32_vec().unwrap();
        let lb = m.logits(&m.forward(&next, &mut clean).unwrap()).unwrap().to_f32_vec().unwrap();
        assert!(rel_err(&la, &lb) < 1e-5, "keep {keep}: logits after rollback differ");
    }
}

/// The head's state after catching up on many positions at once (what happens after the adaptive
/// controller parked drafting) equals its state after taking them a few at a time (every cycle):
/// same outputs at every position, same next draft.
#[test]
fn head_catch_up_in_one_pass_equals_step_by_step() {
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let prompt: Vec<i32> = (0..40).map(|i| 20 + (i * 37) % 400).collect();
    let mut cache = m.make_cache();
    let hidden = m.forward(&Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap(), &mut cache).unwrap();
    let n = prompt.len() as i32 - 1;
    // Pairs (h_t, x_{t+1}) for t = 0..n-1.
    let ids = Array::from_slice(&prompt[1..], &[1, n]).unwrap();
    let h = hidden.slice_axis(1, 0, n).unwrap();
    let mut one = m.make_mtp_cache().unwrap();
    let all = m.mtp_forward(&h, &ids, &mut one).unwrap().to_f32_vec().unwrap();
    let mut steps = m.make_mtp_cache().unwrap();
    let mut parts = Vec::new();
    let mut t = 0;
    for size in [1, 3, 2, 4].iter().cycle() {
        if t >= n {
            break;
        }
        let e = (t + size).min(n);
        parts.extend(
            m.mtp_forward(&h.slice_axis(1, t, e).unwrap(), &ids.slice_axis(1, t, e).unwrap(), &mut steps)
                .unwrap()
                .to_f32_vec()
                .unwrap(),
        );
        t = e;
    }
    assert_eq!(all.len(), parts.len());
    let e = rel_err(&all, &parts);
    assert!(e < 1e-5, "head outputs differ between one catch-up pass and small steps (relative error {e})");
}

/// A verify commit that asks for more tokens than the pass held, or follows no pass at all, is an
/// error that says so, not a silently wrong cache.
#[test]
fn verify_commit_refuses_what_the_pass_did_not_hold() {
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let mut cache = m.make_cache();
    m.forward(&Array::from_slice(&[5i32, 6, 7], &[1, 3]).unwrap(), &mut cache).unwrap();
    let mut tx = Verify::begin(&mut cache, 2);
    m.forward(&Array::from_slice(&[8i32, 9], &[1, 2]).unwrap(), tx.cache()).unwrap();
    let e = tx.commit(3).unwrap_err().to_string();
    assert!(e.contains("keep 3 of 2"), "{e}");
    let e = Verify::begin(&mut cache, 2).commit(1).unwrap_err().to_string();
    assert!(e.contains("positions after a pass of 2") || e.contains("recorded no pass"), "{e}");
}

/// `tandem bench --oracle-acceptance P`: drafts from the plain continuation, each right with
/// probability P. At 1 every draft is accepted, at 0 none, and in between the output is still the
/// plain output (verify and rollback did their real work on every cycle).
#[test]
fn oracle_drafts_are_accepted_as_asked_and_leave_the_output_plain() {
    use tandem::generate::{generate, Control, GenerateOptions, Oracle, SamplingParams};
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let prompt = crate::common::probe_tokens(24, 0);
    let (plain, _) = greedy(&m, &prompt, 48, None);
    assert_eq!(plain.len(), 48);
    crate::common::assert_varies(&plain, "oracle test");
    for (acceptance, depth) in [(1.0, 3), (0.0, 3), (0.5, 2), (1.0, 1)] {
        let opts = GenerateOptions {
            max_tokens: 48,
            sampling: SamplingParams::greedy(),
            mtp: MtpOptions { enabled: true, depth, adaptive: false, exact_verify: false, ..Default::default() },
            oracle: Some(Oracle { continuation: plain.clone(), acceptance, seed: 11 }),
            ..Default::default()
        };
        let out = generate(&m, &prompt, &opts, &mut |_| Control::Continue).unwrap();
        assert_eq!(out.tokens, plain, "oracle {acceptance}, depth {depth}");
        let s = out.stats.spec.expect("spec stats");
        assert!(s.drafted > 0, "{s:?}");
        if acceptance == 1.0 {
            assert_eq!(s.accepted, s.drafted, "oracle 1, depth {depth}: {s:?}");
        } else if acceptance == 0.0 {
            assert_eq!(s.accepted, 0, "oracle 0: {s:?}");
        } else {
            // Depth-1 drafts are right half of the time: 12+ cycles make 0 and all unlikely.
            let first = &s.by_depth[0];
            assert!(first.accepted > 0 && first.accepted < first.drafted, "{s:?}");
        }
    }
    // Out of range: an error that names it.
    let bad = GenerateOptions {
        oracle: Some(Oracle { continuation: plain.clone(), acceptance: 1.5, seed: 0 }),
        ..Default::default()
    };
    let e = generate(&m, &prompt, &bad, &mut |_| Control::Continue).unwrap_err().to_string();
    assert!(e.contains("1.5"), "{e}");
}

/// Pipelined decoding (each step built and started before the previous token is read) samples
/// exactly what synchronous steps do: for the same seed, the same tokens, greedy or sampled. The
/// reference reads every token before building the next step, as decoding did before pipelining.
#[test]
fn pipelined_decoding_gives_the_tokens_of_synchronous_steps() {
    use tandem::generate::step::{sample_last, step};
    use tandem::generate::{generate, prefill, Control, GenerateOptions, Sampler, SamplingParams};
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let prompt: Vec<u32> = (0..16).map(|i| 30 + (i * 53) % 300).collect();
    let n = 40;
    let cases = [
        SamplingParams::greedy(),
        SamplingParams { temperature: 0.9, seed: Some(5), ..Default::default() },
        SamplingParams { temperature: 0.7, top_p: 0.9, seed: Some(8), ..Default::default() },
    ];
    for params in cases {
        let mut sampler = Sampler::new(params.clone()).unwrap();
        let mut cache = m.make_cache();
        let hidden = prefill(&m, &prompt, &mut cache, 512).unwrap();
        let mut history = prompt.clone();
        let mut token = sample_last(&m, &mut sampler, &hidden, &history).unwrap();
        let mut want = vec![token];
        while want.len() < n {
            token = step(&m, &mut cache, &mut sampler, &mut history, token).unwrap().1;
            want.push(token);
        }
        let opts = GenerateOptions {
            max_tokens: n,
            sampling: params.clone(),
            mtp: MtpOptions { enabled: false, ..Default::default() },
            ..Default::default()
        };
        let got = generate(&m, &prompt, &opts, &mut |_| Control::Continue).unwrap().tokens;
        assert_eq!(got, want, "{params:?}");
    }
}

/// Which plain steps price plain decoding for the adaptive controller (`Pipeline::steady`): in a pipelined
/// run, those started ahead that start the next; a run's first step (two graphs built) and last (only a
/// wait) do not, nor a lone step. Where sampling cannot pipeline (a repetition penalty), every step does.
/// The tokens are the synchronous steps' either way.
#[test]
fn only_a_pipelined_runs_middle_steps_are_steady() {
    use tandem::generate::step::{sample_last, step, Pipeline};
    use tandem::generate::{prefill, Sampler, SamplingParams};
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let prompt: Vec<u32> = (0..16).map(|i| 30 + (i * 53) % 300).collect();
    // Whether each step starts the next: runs of 4, 1 and 2 steps.
    let start_next = [true, true, true, false, false, true, false];
    let cases = [
        (SamplingParams::greedy(), vec![false, true, true, false, false, false, false]),
        (SamplingParams { repetition_penalty: 1.2, ..SamplingParams::greedy() }, vec![true; 7]),
    ];
    for (params, want) in cases {
        let run = |pipelined: bool| {
            let mut sampler = Sampler::new(params.clone()).unwrap();
            let mut cache = m.make_cache();
            let hidden = prefill(&m, &prompt, &mut cache, 512).unwrap();
            let mut history = prompt.clone();
            let mut token = sample_last(&m, &mut sampler, &hidden, &history).unwrap();
            let (mut pipeline, mut tokens, mut steady) = (Pipeline::default(), vec![], vec![]);
            for &next in &start_next {
                token = match pipelined {
                    true => pipeline.step(&m, &mut cache, &mut sampler, &mut history, token, next).unwrap().1,
                    false => step(&m, &mut cache, &mut sampler, &mut history, token).unwrap().1,
                };
                tokens.push(token);
                steady.push(pipeline.steady());
            }
            (tokens, steady)
        };
        let (tokens, steady) = run(true);
        assert_eq!(steady, want, "{params:?}");
        assert_eq!(tokens, run(false).0, "{params:?}");
    }
}

/// A seed pins the tokens, not only their distribution: each position draws with its own key, and
/// a verify draws each verified position with the key plain decoding uses there. So a seeded
/// sampled generation gives plain decoding's tokens with MTP at any depth, adaptive or not, with
/// or without the repetition penalty (the f32 model: verify logits match plain ones to rounding).
#[test]
fn a_seed_gives_the_same_tokens_with_mtp_at_any_depth() {
    use tandem::generate::{generate, Control, GenerateOptions, SamplingParams};
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let prompt: Vec<u32> = (0..16).map(|i| 30 + (i * 53) % 300).collect();
    let cases = [
        SamplingParams { temperature: 0.8, seed: Some(3), ..Default::default() },
        SamplingParams { temperature: 0.6, top_k: 20, seed: Some(12), ..Default::default() },
        SamplingParams { temperature: 0.7, repetition_penalty: 1.2, seed: Some(21), ..Default::default() },
    ];
    let run = |sampling: &SamplingParams, mtp: MtpOptions| {
        let opts = GenerateOptions { max_tokens: 40, sampling: sampling.clone(), mtp, ..Default::default() };
        let out = generate(&m, &prompt, &opts, &mut |_| Control::Continue).unwrap();
        (out.tokens, out.stats.spec.map_or((0, 0), |s| (s.accepted, s.cycles)))
    };
    for sampling in &cases {
        let (plain, _) = run(sampling, MtpOptions { enabled: false, ..Default::default() });
        let (other_seed, _) =
            run(&SamplingParams { seed: sampling.seed.map(|s| s + 1), ..sampling.clone() }, MtpOptions::default());
        assert_ne!(plain, other_seed, "the seed decides the tokens: {sampling:?}");
        for (depth, adaptive) in [(1, false), (3, false), (5, false), (3, true)] {
            let mtp = MtpOptions { enabled: true, depth, adaptive, ..Default::default() };
            let (tokens, (accepted, cycles)) = run(sampling, mtp);
            assert_eq!(tokens, plain, "depth {depth}, adaptive {adaptive}: {sampling:?}");
            // The adaptive controller may park after its first cycles if their drafts miss (which positions it
            // drafts depends on its timings): cycles ran between plain steps, and at fixed depths drafts landed.
            assert!(cycles > 0, "cycles ran: {sampling:?}");
            assert!(adaptive || accepted > 0, "drafts were accepted, so the verify's draws were used: {sampling:?}");
        }
    }
}

/// Catching the head up in chunks (what CUDA does after a long park, so that the attention's shape
/// repeats) drafts exactly what one pass over all pending pairs drafts.
#[test]
fn a_chunked_catch_up_drafts_what_one_pass_drafts() {
    use tandem::generate::mtp::drafter::Drafter;
    use tandem::generate::prefill;
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    let prompt: Vec<u32> = (0..48).map(|i| 30 + (i * 37) % 300).collect();
    let mut cache = m.make_cache();
    let hidden = prefill(&m, &prompt[..8], &mut cache, 512).unwrap();
    // The rest of the prompt as if decoded while parked: one position at a time, queued.
    let decoded = prefill(&m, &prompt[8..], &mut cache, 512).unwrap();
    let drafts = |chunk: Option<usize>| {
        let mut d = Drafter::new(&m, &hidden, &prompt[..8], prompt[8]);
        if let Some(n) = chunk {
            d = d.with_catch_up_chunk(n);
        }
        let queued: Vec<Array> = (0..40).map(|i| decoded.slice_axis(1, i, i + 1).unwrap()).collect();
        let mut next: Vec<u32> = prompt[9..].to_vec();
        next.push(7);
        d.queue(queued, &next);
        d.draft(&m, 3, 3).unwrap().to_vec::<u32>().unwrap()
    };
    let whole = drafts(None);
    for n in [1, 5, 16] {
        assert_eq!(drafts(Some(n)), whole, "catch-up in chunks of {n}");
    }
}

/// Decodes `n` tokens of `prompt` with an MTP decoder driven directly (so its cycles built ahead can
/// be counted); `first` is the plain greedy token after the prompt. Tokens, statistics, and (cycles
/// built ahead, kept).
fn decode_counting_ahead(
    m: &tandem::model::Qwen35,
    prompt: &[u32],
    first: u32,
    n: usize,
    opts: &MtpOptions,
    oracle: Option<&tandem::generate::Oracle>,
) -> (Vec<u32>, tandem::generate::Stats, (usize, usize)) {
    use tandem::generate::mtp::drafter::Drafter;
    use tandem::generate::mtp::MtpDecoder;
    use tandem::generate::{prefill, Sampler, SamplingParams, Stats};
    let mut cache = m.make_cache();
    let hidden = prefill(m, prompt, &mut cache, 512).unwrap();
    let drafter = Drafter::new(m, &hidden, prompt, first);
    let mut d = MtpDecoder::new(m, opts, cache, drafter, first, &[]);
    if let Some(o) = oracle {
        d = d.with_oracle(o);
    }
    let (mut sampler, mut stats) = (Sampler::new(SamplingParams::greedy()).unwrap(), Stats::default());
    let (mut history, mut out) = (prompt.to_vec(), vec![first]);
    while out.len() < n {
        let new = d.step(&mut sampler, &mut history, n - out.len(), &mut stats, true).unwrap();
        out.extend(new);
    }
    (out, stats, d.cycles_ahead())
}

/// A cycle built while the one before it was verified (on the guess that all its drafts are kept)
/// drafts and verifies exactly what the cycle built after the decision would: the tokens, and every
/// cycle's drafts and acceptance, are those of decoding without it, in bf16 (the trained head's drafts,
/// mixed acceptance) and f32, and with oracle drafts (all kept; about half kept).
#[test]
fn cycles_built_ahead_give_the_tokens_and_acceptance_of_cycles_built_after() {
    use tandem::generate::{CycleAhead, Oracle};
    let prompt = crate::common::probe_tokens(48, 0);
    let n = 64;
    for dtype in [mlx::Dtype::BF16, mlx::Dtype::F32] {
        let m = model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(dtype), probe: false, ..Default::default() })
            .unwrap();
        let (plain, _) = greedy(&m, &prompt, n, None);
        crate::common::assert_varies(&plain, &format!("{dtype:?}"));
        let oracles = [None, Some(1.0), Some(0.5)];
        for (depth, acceptance) in [1, 2, 3].into_iter().flat_map(|d| oracles.map(move |o| (d, o))) {
            let oracle = acceptance.map(|acceptance| Oracle { continuation: plain.clone(), acceptance, seed: 3 });
            let run = |cycle_ahead| {
                let opts = MtpOptions { enabled: true, depth, adaptive: false, exact_verify: false, cycle_ahead };
                decode_counting_ahead(&m, &prompt, plain[0], n, &opts, oracle.as_ref())
            };
            let what = format!("{dtype:?}, depth {depth}, oracle {acceptance:?}");
            let (after, after_stats, none) = run(CycleAhead::Off);
            let (ahead, ahead_stats, (built, kept)) = run(CycleAhead::Always);
            assert_eq!(none, (0, 0), "{what}: built ahead while off");
            assert_eq!(&after[..n], &plain[..], "{what}: cycles built after");
            assert_eq!(&ahead[..n], &plain[..], "{what}: cycles built ahead");
            let (a, b) = (after_stats.spec.expect("spec stats"), ahead_stats.spec.expect("spec stats"));
            assert_eq!(
                (a.cycles, a.drafted, &a.accepted_hist),
                (b.cycles, b.drafted, &b.accepted_hist),
                "{what}: the same cycles"
            );
            assert!(built > 0 && kept > 0, "{what}: {built} built ahead, {kept} kept");
            // A cycle built ahead is kept exactly when the one before it kept every draft (and another of
            // the same depth follows).
            let all_kept = b.accepted_hist[depth];
            assert!(kept <= all_kept && kept + 2 >= all_kept.min(built), "{what}: kept {kept}, all kept {all_kept}");
            if acceptance == Some(1.0) {
                assert_eq!(b.accepted, b.drafted, "{what}");
                assert!(kept + 2 >= built, "{what}: every guess is right: {kept} of {built} kept");
            } else if acceptance == Some(0.5) {
                assert!(kept < built, "{what}: some guess is wrong: {kept} of {built} kept");
            }
        }
    }
}

/// The adaptive controller probes a park with shadow drafts (the head drafting beside a plain step, its
/// drafts checked against the tokens plain decoding produces), not with a verify cycle: where drafts stop
/// landing, no cycle runs after the first park; where they land again, drafting resumes and pays. Oracle
/// drafts make both happen on tandem-tiny: wrong for the first 120 positions, right after. The tokens stay
/// plain decoding's.
#[test]
fn shadow_probes_replace_losing_probe_cycles_and_resume_drafting() {
    use tandem::generate::Oracle;
    let m = model::load(&tiny_model_dir(), &LoadOptions { probe: false, ..Default::default() }).unwrap();
    let prompt = crate::common::probe_tokens(48, 1);
    // Long enough for two probes after the drafts start landing (parks double: the probes after 120 end
    // parks of 128 and 256 steps), so one probe a loaded machine's timings misjudge does not end the test.
    let n = 640;
    let (plain, _) = greedy(&m, &prompt, n, None);
    let vocab = m.config.text.vocab_size as u32;
    let continuation: Vec<u32> =
        plain.iter().enumerate().map(|(i, &t)| if i < 120 { (t + 1) % vocab } else { t }).collect();
    let oracle = Oracle { continuation, acceptance: 1.0, seed: 1 };
    let opts = MtpOptions { enabled: true, depth: 3, adaptive: true, exact_verify: false, ..Default::default() };
    let (out, stats, _) = decode_counting_ahead(&m, &prompt, plain[0], n, &opts, Some(&oracle));
    assert_eq!(&out[..n], &plain[..], "tokens");
    let s = stats.spec.expect("spec stats");
    // The two cycles the controller judges before its first park lose (a third where a loaded machine's
    // timings delay that judgement); its probes after that are shadows. Probing by cycles would add one for
    // each of the parks of 16, 32 and 64 steps that end while the drafts are wrong: five.
    assert!(s.accepted_hist[0] <= 3, "losing cycles: {s:?}");
    assert!(s.parked_cycles >= 16, "never parked: {s:?}");
    assert!(s.accepted >= 30, "drafting did not resume once drafts landed: {s:?}");
}

/// With MTP, prefill runs the head over each chunk's pairs as it goes (so the first draft has only the
/// prompt's last pair to run, not a catch-up over the whole prompt), and the head's cache then holds
/// what one pass over the whole prompt leaves, bit for bit on the CPU (where a row's results never
/// depend on the pass's other rows). Without MTP the pairs wait (for a snapshot, if one is taken); on
/// CUDA they wait too for head sizes up to 128 (`Drafter::runs_in_prefill`).
#[test]
fn prefill_runs_the_head_chunk_by_chunk() {
    use tandem::generate::mtp::drafter::Drafter;
    use tandem::generate::sequence::Sequence;
    use tandem::generate::{prefill, GenerateOptions, Resume, SamplingParams};
    let m =
        model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32), ..Default::default() }).unwrap();
    if !Drafter::runs_in_prefill(&m) {
        println!("prefill_runs_the_head_chunk_by_chunk: SKIPPED: here tandem-tiny's pairs wait for the first draft");
        return;
    }
    let prompt: Vec<u32> = (0..300).map(|i| 30 + (i * 37) % 300).collect();
    let opts = |enabled: bool| GenerateOptions {
        max_tokens: 8,
        prefill_chunk: 64,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled, ..Default::default() },
        ..Default::default()
    };
    for mtp in [true, false] {
        let mut s = Sequence::begin(&m, &prompt, &[], opts(mtp), Resume::default()).unwrap();
        while s.left() > 0 {
            s.advance().unwrap();
            let fed = prompt.len() - s.left();
            let waiting = if mtp { 0 } else { fed.min(prompt.len() - 1) };
            assert_eq!(s.drafter().pending(), waiting, "MTP {mtp}, after {fed} prompt tokens");
        }
        if !mtp {
            continue;
        }
        let mut cache = m.make_cache();
        let hidden = prefill(&m, &prompt, &mut cache, 512).unwrap();
        let mut one_pass = Drafter::new(&m, &hidden, &prompt, 7);
        assert!(one_pass.settle(&m, true).unwrap().is_some(), "the last pair waits for the first token");
        let (k1, v1) = one_pass.cache().contents().unwrap().expect("head keys");
        let (k2, v2) = s.drafter().cache().contents().unwrap().expect("head keys after prefill");
        assert_eq!(k2.shape(), vec![1, k1.dim(1), prompt.len() as i32 - 1, k1.dim(3)]);
        assert!(k1.to_bytes().unwrap() == k2.to_bytes().unwrap(), "head keys differ from one pass's");
        assert!(v1.to_bytes().unwrap() == v2.to_bytes().unwrap(), "head values differ from one pass's");
    }
}

/// tandem-tiny in `dtype` and the head's 40 pairs of a 41-token prompt (`token(i)` its i-th token): the
/// prompt's hidden states `[1, 40, D]` before the last and the tokens after each, `[1, 40]`.
fn head_pairs(dtype: mlx::Dtype, token: impl Fn(u32) -> u32) -> (tandem::model::Qwen35, Array, Array) {
    let m = model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(dtype), ..Default::default() }).unwrap();
    let prompt: Vec<u32> = (0..41).map(token).collect();
    let mut cache = m.make_cache();
    let hidden = tandem::generate::prefill(&m, &prompt, &mut cache, 512).unwrap();
    let n = prompt.len() as i32 - 1;
    let ids: Vec<i32> = prompt[1..].iter().map(|&t| t as i32).collect();
    (m, hidden.slice_axis(1, 0, n).unwrap(), Array::from_slice(&ids, &[1, n]).unwrap())
}

/// A catch-up (and prefill's pass over the prompt's pairs) writes every pair but the last straight into
/// the head's cache, computing no attention or MLP for them: the cache and the last pair's output must be
/// the bits of one whole head pass over every pair, in f32 and bf16.
#[test]
fn head_cache_writes_match_a_whole_pass() {
    for dtype in [mlx::Dtype::F32, mlx::Dtype::BF16] {
        let (m, h, x) = head_pairs(dtype, |i| 30 + (i * 37) % 300);
        let n = x.dim(1);
        let mut whole = m.make_mtp_cache().expect("tandem-tiny has a head");
        let out = m.mtp_forward(&h, &x, &mut whole).unwrap();
        let mut written = m.make_mtp_cache().unwrap();
        let first = |a: &Array| a.slice_axis(1, 0, n - 1).unwrap();
        let last = |a: &Array| a.slice_axis(1, n - 1, n).unwrap();
        m.mtp_write_cache(&first(&h), &first(&x), &mut written).unwrap();
        let out_last = m.mtp_forward(&last(&h), &last(&x), &mut written).unwrap();
        assert_eq!(written.offset, whole.offset, "{dtype:?}");
        let (k1, v1) = whole.contents().unwrap().unwrap();
        let (k2, v2) = written.contents().unwrap().unwrap();
        assert!(k1.to_bytes().unwrap() == k2.to_bytes().unwrap(), "{dtype:?}: head keys differ from a whole pass's");
        assert!(v1.to_bytes().unwrap() == v2.to_bytes().unwrap(), "{dtype:?}: head values differ from a whole pass's");
        assert!(
            last(&out).to_bytes().unwrap() == out_last.to_bytes().unwrap(),
            "{dtype:?}: the last pair's output differs from a whole pass's"
        );
    }
}

/// A head with no pair pending is settled already (a prefix snapshot taken while a parked step runs ahead can
/// find it so): settling writes nothing and returns no pending state, where it failed in MLX's `concatenate`
/// ("No arrays provided") and the chat lost its prefix-cache entry.
#[test]
fn settling_a_caught_up_head_is_a_no_op() {
    let (m, h, x) = head_pairs(mlx::Dtype::F32, |i| 30 + i);
    let mut cache = m.make_mtp_cache().unwrap();
    m.mtp_forward(&h, &x, &mut cache).unwrap();
    let held = cache.offset;
    let mut drafter = tandem::generate::mtp::drafter::Drafter::primed(cache);
    for keep_last in [false, true] {
        assert!(drafter.settle(&m, keep_last).unwrap().is_none(), "keep_last {keep_last}");
        assert_eq!(drafter.cache().offset, held, "keep_last {keep_last}: nothing written");
    }
}

/// CUDA's shape of a catch-up: pairs written in passes of at most 16 (`write_chunk` there) against whole head
/// passes of at most 16 queries (as catch-ups ran before session 27). Both stay within the widths the
/// verify-width kernels serve on CUDA, so there too the cache must hold the same bits; on the CPU this is the
/// chunked form of the test above.
#[test]
fn head_cache_writes_in_16_pair_passes_match_16_query_passes() {
    for dtype in [mlx::Dtype::F32, mlx::Dtype::BF16] {
        let (m, hidden, x) = head_pairs(dtype, |i| 40 + (i * 53) % 300);
        let n = x.dim(1);
        let (mut whole, mut written) = (m.make_mtp_cache().unwrap(), m.make_mtp_cache().unwrap());
        for start in (0..n).step_by(16) {
            let end = (start + 16).min(n);
            let (h, t) = (hidden.slice_axis(1, start, end).unwrap(), x.slice_axis(1, start, end).unwrap());
            m.mtp_forward(&h, &t, &mut whole).unwrap();
            m.mtp_write_cache(&h, &t, &mut written).unwrap();
        }
        assert_eq!((written.offset, whole.offset), (n, n), "{dtype:?}");
        let (k1, v1) = whole.contents().unwrap().unwrap();
        let (k2, v2) = written.contents().unwrap().unwrap();
        assert!(k1.to_bytes().unwrap() == k2.to_bytes().unwrap(), "{dtype:?}: 16-pair writes' keys differ");
        assert!(v1.to_bytes().unwrap() == v2.to_bytes().unwrap(), "{dtype:?}: 16-pair writes' values differ");
    }
}
