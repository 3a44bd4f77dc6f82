//! The plain step: one token through the model, the next one sampled. Plain decoding, a parked
//! MTP decoder and the token-by-token verify all take this one step.

use mlx::{Array, Dtype};

use super::error::Result;
use super::sampler::Sampler;
use crate::cache::LayerCache;
use crate::model::Qwen35;

/// Feeds `token` (appending it to `history`) and samples the token after it; returns the post-norm
/// hidden state `[1, 1, D]` at `token` and the sampled token.
pub fn step(
    model: &Qwen35,
    cache: &mut [LayerCache],
    sampler: &mut Sampler,
    history: &mut Vec<u32>,
    token: u32,
) -> Result<(Array, u32)> {
    history.push(token);
    let hidden = model.forward(&Array::from_slice(&[token as i32], &[1, 1])?, cache)?;
    let next = sample_last(model, sampler, &hidden, history)?;
    Ok((hidden, next))
}

/// Samples the token after the last position of `hidden` `[1, T, D]`.
pub fn sample_last(model: &Qwen35, sampler: &mut Sampler, hidden: &Array, history: &[u32]) -> Result<u32> {
    let t = hidden.dim(1);
    let logits = model.logits(&hidden.slice_axis(1, t - 1, t)?)?.reshape(&[-1])?.as_dtype(Dtype::F32)?;
    let logits = sampler.penalize(&logits, history)?;
    Ok(sampler.sample(&logits)?.item::<u32>()?)
}
