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
    let hidden = model.forward(&token_input(token)?, cache)?;
    let next = sample_last(model, sampler, &hidden, history)?;
    Ok((hidden, next))
}

/// A step that is built and running but not read yet: its token is an array still being computed.
pub struct Started {
    /// The post-norm hidden state `[1, 1, D]` at the fed token.
    pub hidden: Array,
    /// The sampled token, a scalar `u32` array.
    pub token: Array,
    /// Where this is one row of a batched step (`generate::batch`): which batch and row.
    pub batch: Option<BatchRow>,
}

/// A sequence's row of a batched plain step started ahead: the next batched step of the same
/// sequences, in the same order, takes every row of it at once; a sequence that steps otherwise takes
/// its row alone ([`Pipeline::step`] reads `token`, a slice of the batch's tokens).
#[derive(Clone)]
pub struct BatchRow {
    /// Which batched step (distinct for every batched step started ahead in the process).
    pub id: u64,
    pub row: usize,
    pub size: usize,
    /// Every row's sampled token, `[size]` `u32`, read at once.
    pub tokens: Array,
}

/// Whether steps can be pipelined: the next step's graph is built from the previous step's token
/// before that token is read. Sampling must then not need the token on the host; penalties read
/// the history and a grammar reads each token, so they keep steps synchronous.
/// `TANDEM_NO_PIPELINE=1` turns pipelining off, to measure what it earns.
pub fn can_pipeline(sampler: &Sampler) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var_os("TANDEM_NO_PIPELINE").is_some_and(|v| v != "0"));
    !off && !sampler.params.uses_history() && !sampler.is_constrained() && !sampler.records_logprobs()
}

/// Whether a plain step's wall time is what a plain step costs in a row of them ([`Pipeline::steady`]): steps
/// are not `pipelined` at all, or this one was `started_ahead` by the step before and `starts_next`.
pub(crate) fn steady(pipelined: bool, started_ahead: bool, starts_next: bool) -> bool {
    !pipelined || (started_ahead && starts_next)
}

/// Builds the step that feeds `token` (`[1, 1]`, possibly still being computed) and starts
/// computing it (MLX `async_eval`), so that the host can build the following step meanwhile.
/// Samples exactly as [`step`] does when [`can_pipeline`] holds (the same random keys, in order).
pub fn start(model: &Qwen35, cache: &mut [LayerCache], sampler: &mut Sampler, token: &Array) -> Result<Started> {
    let hidden = model.forward(token, cache)?;
    let logits = model.logits(&hidden)?.reshape(&[-1])?.as_dtype(Dtype::F32)?;
    let token = sampler.sample(&logits)?;
    let t0 = std::time::Instant::now();
    mlx::device::async_eval(&[&token])?;
    // Traced: MLX's host time for the step (building and launching its kernels), to set against
    // the device's (`pipelined step` below).
    tracing::trace!(launch = t0.elapsed().as_secs_f64() * 1e3, "step started (ms)");
    Ok(Started { hidden, token, batch: None })
}

/// Plain steps in a row, pipelined where sampling allows: the step after this one is built and
/// started before this one's token is read, so the host builds a graph while the device computes.
/// Plain decoding and a parked MTP decoder both step through this.
#[derive(Default)]
pub struct Pipeline {
    /// The step that feeds the next `last`, already running.
    ahead: Option<Started>,
    /// The latest step's [`Pipeline::steady`].
    steady: bool,
}

impl Pipeline {
    /// Feeds `last` (appending it to `history`); returns the post-norm hidden state `[1, 1, D]` at
    /// it and the token sampled after it. `start_next`: the following step will be plain too, so it
    /// may be started now.
    pub fn step(
        &mut self,
        model: &Qwen35,
        cache: &mut [LayerCache],
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        last: u32,
        start_next: bool,
    ) -> Result<(Array, u32)> {
        if !can_pipeline(sampler) {
            self.steady = steady(false, false, false);
            return step(model, cache, sampler, history, last);
        }
        self.steady = steady(true, self.ahead.is_some(), start_next);
        let current = match self.ahead.take() {
            Some(s) => s,
            None => start(model, cache, sampler, &token_input(last)?)?,
        };
        history.push(last);
        let t0 = std::time::Instant::now();
        if start_next {
            let token = current.token.reshape(&[1, 1])?;
            self.ahead = Some(start(model, cache, sampler, &token)?);
        }
        let t1 = std::time::Instant::now();
        let token = current.token.item::<u32>()?;
        // Traced: building and starting the next step, then waiting for this one (near zero when
        // the host is the slower side).
        tracing::trace!(
            next = (t1 - t0).as_secs_f64() * 1e3,
            wait = t1.elapsed().as_secs_f64() * 1e3,
            "pipelined step (ms)"
        );
        Ok((current.hidden, token))
    }

    /// Whether the latest step's wall time is what a plain step costs in a row of them: it was started
    /// ahead and started the next (or steps are not pipelined at all). A pipeline's first step builds
    /// two graphs, one with the device idle, and its last only waits for the device: a probe's two
    /// steps priced plain decoding at 1.5x and the second alone at 0.3x its cost (tandem-tiny, two
    /// streams on the CPU: docs/PERF.md, session 31).
    pub fn steady(&self) -> bool {
        self.steady
    }

    /// The hidden state at the token the step running ahead fed (the caches already hold it).
    pub fn ahead_hidden(&self) -> Option<&Array> {
        self.ahead.as_ref().map(|s| &s.hidden)
    }

    /// Whether a step is already running.
    pub fn is_running(&self) -> bool {
        self.ahead.is_some()
    }

    /// The batched step the step running ahead is a row of, if it is one.
    pub fn batch_row(&self) -> Option<&BatchRow> {
        self.ahead.as_ref().and_then(|s| s.batch.as_ref())
    }

    /// The step running ahead, taken to be read by its batch (`generate::batch`).
    pub(crate) fn take(&mut self) -> Option<Started> {
        self.ahead.take()
    }

    /// A row of a batched step started ahead for this sequence (`generate::batch`).
    pub(crate) fn run_ahead(&mut self, row: Started) {
        self.ahead = Some(row);
    }
}

/// A token id as the `[1, 1]` input of a step.
pub fn token_input(token: u32) -> Result<Array> {
    Ok(Array::from_slice(&[token as i32], &[1, 1])?)
}

/// Samples the token after the last position of `hidden` `[1, T, D]`.
pub fn sample_last(model: &Qwen35, sampler: &mut Sampler, hidden: &Array, history: &[u32]) -> Result<u32> {
    let t = hidden.dim(1);
    let logits = model.logits(&hidden.slice_axis(1, t - 1, t)?)?.reshape(&[-1])?.as_dtype(Dtype::F32)?;
    let logits = sampler.penalize(&logits, history)?;
    Ok(sampler.sample(&logits)?.item::<u32>()?)
}

/// What MLX runs for one greedy forward of `width` tokens after `prompt` (a plain step at width 1, a
/// depth-d verify at d + 1): its operations (launches on a GPU) by MLX primitive name, counted before
/// anything is evaluated, and how many more one MTP draft after it adds (None without a head).
/// `tandem bench` reports it.
pub struct GraphOps {
    pub by_op: Vec<(String, usize)>,
    pub draft: Option<usize>,
}

pub fn graph_ops(model: &Qwen35, prompt: &[u32], width: usize) -> Result<GraphOps> {
    let Some(&last) = prompt.last() else {
        return Err(mlx::Error::Invalid("counting operations needs a prompt".into()).into());
    };
    let mut cache = model.make_cache();
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let h = model.forward(&Array::from_slice(&ids, &[1, ids.len() as i32])?, &mut cache)?;
    {
        let mut prefilled: Vec<&Array> = cache.iter().flat_map(|c| c.arrays()).collect();
        prefilled.push(&h);
        mlx::device::eval(&prefilled)?;
    }
    let hidden = model.forward(&Array::from_slice(&vec![last as i32; width], &[1, width as i32])?, &mut cache)?;
    let sampled = model.logits(&hidden)?.argmax(-1, false)?;
    let by_op = mlx::compile::graph_op_histogram(&[&sampled]);
    let draft = match model.make_mtp_cache() {
        None => None,
        Some(mut mtp) => {
            let t = hidden.dim(1);
            let (h_last, next) = (hidden.slice_axis(1, t - 1, t)?, sampled.slice_axis(1, t - 1, t)?);
            let drafted = model.logits(&model.mtp_forward(&h_last, &next, &mut mtp)?)?.argmax(-1, false)?;
            let forward: usize = by_op.iter().map(|(_, n)| n).sum();
            Some(mlx::compile::graph_ops(&[&sampled, &drafted]) - forward)
        }
    };
    Ok(GraphOps { by_op, draft })
}
