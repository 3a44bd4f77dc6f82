//! Which drafts a verify pass accepts: the pure rule over verify logits, greedy or by speculative
//! sampling, with the test that the sampled output keeps the target distribution.

use mlx::Array;

use crate::generate::error::Result;
use crate::generate::sampler::Sampler;

/// Decides how many drafts to accept from verify logits `[k+1, V]` and the token that follows them.
/// Greedy: the longest prefix where the target's argmax equals the draft, then the target's argmax.
/// Sampling (drafts are argmax, so q is one-hot): draw t_j from p_j with the key plain decoding
/// would use at that position, accept d_j when t_j = d_j, else emit t_j; after all k, draw the bonus
/// from p_k. d_j is kept with probability p_j(d_j), and a rejection gives p_j without d_j,
/// renormalised: exactly speculative sampling's rule, so the output distribution is the target's.
/// And because each position's draw is the one plain decoding makes, the tokens are too.
/// `history` holds the tokens before the verified ones (the repetition penalty's context); it is
/// not changed: the caller appends what was accepted.
pub fn accept(sampler: &mut Sampler, logits: &Array, drafts: &[u32], history: &[u32]) -> Result<(usize, u32)> {
    accept_drawn(sampler, logits, drafts, history, None)
}

/// The targets of a verify drawn before its logits are read, where [`accept`] will not need the
/// drafts or the history to draw them (no penalties, no grammar): lazy, so the caller evaluates them
/// with the logits and the cycle waits for the device once. None where the rows must wait.
pub fn draw_ahead(sampler: &Sampler, logits: &Array) -> Result<Option<Array>> {
    if !sampler.draws_ahead() {
        return Ok(None);
    }
    Ok(Some(sampler.sample_rows(logits)?))
}

/// [`accept`] with the targets [`draw_ahead`] drew (the same draws: nothing advances the sampler
/// in between), or None to draw them here.
pub fn accept_drawn(
    sampler: &mut Sampler,
    logits: &Array,
    drafts: &[u32],
    history: &[u32],
    drawn: Option<&Array>,
) -> Result<(usize, u32)> {
    let k = drafts.len();
    if !sampler.params.uses_history() {
        // The rows do not depend on each other: every position's token at once, one wait. Under a
        // grammar each row is masked with the state after the drafts before it.
        let targets = match drawn.filter(|_| !sampler.is_constrained()) {
            Some(t) => t.to_vec::<u32>()?,
            None => {
                let masked = sampler.mask_verify(logits, drafts)?;
                sampler.sample_rows(&masked)?.to_vec::<u32>()?
            }
        };
        let a = (0..k).take_while(|&j| targets[j] == drafts[j]).count();
        if sampler.records_logprobs() {
            sampler.record(&logits.slice_axis(0, 0, a as i32 + 1)?, &targets[..=a])?;
        }
        sampler.advance(a + 1);
        sampler.consumed(&targets[..=a])?;
        return Ok((a, targets[a]));
    }
    // Penalties read the tokens before each position: the drafts join the history as they are
    // accepted, and each position is drawn (and masked) as plain decoding draws it.
    let mut history = history.to_vec();
    for (j, &d) in drafts.iter().enumerate() {
        let l = logits.slice_axis(0, j as i32, j as i32 + 1)?.reshape(&[-1])?;
        let t = sampler.sample(&sampler.penalize(&l, &history)?)?.item::<u32>()?;
        if t != d {
            return Ok((j, t));
        }
        history.push(d);
    }
    let l = logits.slice_axis(0, k as i32, k as i32 + 1)?.reshape(&[-1])?;
    let t = sampler.sample(&sampler.penalize(&l, &history)?)?.item::<u32>()?;
    Ok((k, t))
}

#[cfg(test)]
mod tests;
