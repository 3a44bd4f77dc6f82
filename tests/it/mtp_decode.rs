//! MTP speculative decoding on a random checkpoint: greedy output identical to plain decoding at
//! every depth, and caches after rollback equal to those of a run that never saw the drafts.

use crate::common::*;
use mlx::Array;
use tandem::generate::MtpOptions;
use tandem::model::{self, LoadOptions};

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
            let opts = MtpOptions { enabled: true, depth, adaptive: false, exact_verify };
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
        let opts = MtpOptions { enabled: true, depth, adaptive: true, exact_verify: false };
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
    for keep in 1..=verify.len() {
        // Run prompt + all verify tokens with recording, then roll back to `keep` of them.
        let mut cache = m.make_cache();
        m.forward(&Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap(), &mut cache).unwrap();
        for c in cache.iter_mut() {
            if let Some(s) = c.as_linear() {
                s.record_next = true;
            }
        }
        m.forward(&Array::from_slice(&verify, &[1, verify.len() as i32]).unwrap(), &mut cache).unwrap();
        for c in cache.iter_mut() {
            match c {
                tandem::cache::LayerCache::Kv(kv) => kv.trim((verify.len() - keep) as i32).unwrap(),
                tandem::cache::LayerCache::Linear(s) => s.rollback(keep, m.linear_kernel()).unwrap(),
            }
        }
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
    let m = model::load(&tiny_model_dir(), &LoadOptions { dtype: Some(mlx::Dtype::F32) }).unwrap();
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
