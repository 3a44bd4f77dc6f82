use super::*;
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
        let (a, next) = accept(&mut sampler, &logits, &drafts, &[]).unwrap();
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

/// Each verified position draws with the key plain decoding uses there: the emitted token is the
/// plain sampler's, the accepted count is the longest prefix of drafts equal to the plain draws,
/// and afterwards the sampler stands at the position after the last emitted token.
#[test]
fn a_verify_draws_what_plain_sampling_draws_at_each_position() {
    let v = 16;
    let rows: Vec<Vec<f32>> = (0..4).map(|r| (0..v).map(|i| ((i * 7 + r * 5) % 11) as f32 * 0.3).collect()).collect();
    let logits = Array::from_slice(&rows.concat(), &[4, v]).unwrap();
    let prior = [2u32, 9, 9];
    for (seed, penalty) in (0..12).map(|s| (s, if s % 2 == 0 { 1.0 } else { 1.4 })) {
        let params =
            SamplingParams { temperature: 0.9, repetition_penalty: penalty, seed: Some(seed), ..Default::default() };
        // Plain decoding: one row at a time, the drawn tokens joining the penalty's history.
        let mut plain = Sampler::new(params.clone()).unwrap();
        let mut history = prior.to_vec();
        let mut want = Vec::new();
        for row in &rows {
            let l = plain.penalize(&Array::from_slice(row, &[v]).unwrap(), &history).unwrap();
            let t = plain.sample(&l).unwrap().item::<u32>().unwrap();
            want.push(t);
            history.push(t);
        }
        let after = Array::from_slice(&rows[0], &[v]).unwrap();
        for miss in 0..=3 {
            // Drafts equal to the plain draws up to `miss`, then a different token.
            let mut drafts = want[..3].to_vec();
            if miss < 3 {
                drafts[miss] = (want[miss] + 1) % v as u32;
            }
            let mut sampler = Sampler::new(params.clone()).unwrap();
            let (a, next) = accept(&mut sampler, &logits, &drafts, &prior).unwrap();
            assert_eq!((a, next), (miss, want[miss]), "seed {seed}, penalty {penalty}, drafts {drafts:?}");
            let mut reference = Sampler::new(params.clone()).unwrap();
            reference.advance(miss + 1);
            let (x, y) = (sampler.sample(&after).unwrap(), reference.sample(&after).unwrap());
            assert_eq!(x.item::<u32>().unwrap(), y.item::<u32>().unwrap(), "position after the verify");
        }
    }
}
