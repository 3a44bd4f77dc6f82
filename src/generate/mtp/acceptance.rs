//! Which drafts a verify pass accepts: the pure rule over verify logits, greedy or by speculative
//! sampling, with the test that the sampled output keeps the target distribution.

use mlx::{random, Array, Dtype};

use crate::generate::error::Result;
use crate::generate::sampler::Sampler;

/// Decides how many drafts to accept from verify logits `[k+1, V]` and the token that follows them.
/// Greedy: the longest prefix where the target's argmax equals the draft, then the target's argmax.
/// Sampling (drafts are argmax, so q is one-hot): accept d_j with probability p_j(d_j); on rejection
/// draw from p_j with d_j removed; after all k, draw the bonus from p_k. This keeps the output
/// distribution exactly the target's (speculative sampling).
/// `history` holds the tokens before the verified ones (the repetition penalty's context); it is
/// not changed: the caller appends what was accepted.
pub fn accept(sampler: &mut Sampler, logits: &Array, drafts: &[u32], history: &[u32]) -> Result<(usize, u32)> {
    let k = drafts.len();
    // The penalty looks at the most recent tokens only: those, and the drafts as they are accepted.
    let mut history: Vec<u32> = history[history.len().saturating_sub(sampler.params.repetition_context)..].to_vec();
    let row = |sampler: &Sampler, j: usize, hist: &[u32]| -> Result<Array> {
        let l = logits.slice_axis(0, j as i32, j as i32 + 1)?.reshape(&[-1])?;
        Ok(sampler.penalize(&l, hist)?)
    };
    if sampler.is_greedy() && sampler.params.repetition_penalty == 1.0 {
        let targets = logits.argmax(-1, false)?.to_vec::<u32>()?;
        let a = (0..k).take_while(|&j| targets[j] == drafts[j]).count();
        return Ok((a, targets[a]));
    }
    for (j, &d) in drafts.iter().enumerate() {
        let l = row(sampler, j, &history)?;
        if sampler.is_greedy() {
            let t = l.argmax(-1, false)?.item::<u32>()?;
            if t != d {
                return Ok((j, t));
            }
        } else {
            let lp = sampler.logprobs(&l)?;
            let p = lp.exp()?;
            let pd = p.take(&Array::from_slice(&[d as i32], &[1])?, 0)?.item::<f32>()?;
            let u = random::uniform(&[1], Dtype::F32, &sampler.next_key()?)?.item::<f32>()?;
            if u >= pd {
                // Residual max(0, p - q) with q one-hot at d_j: p without d_j, renormalised.
                let mask =
                    Array::arange(0.0, p.dim(0) as f64, 1.0, Dtype::I32)?.equal(&Array::scalar(d, Dtype::I32)?)?;
                let resid = mlx::where_(&mask, &Array::f32(f32::NEG_INFINITY), &lp)?;
                let t = random::categorical(&resid, -1, &sampler.next_key()?)?.item::<u32>()?;
                return Ok((j, t));
            }
        }
        history.push(d);
    }
    let l = row(sampler, k, &history)?;
    let t = sampler.sample(&l)?.item::<u32>()?;
    Ok((k, t))
}

#[cfg(test)]
mod tests {
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
}
