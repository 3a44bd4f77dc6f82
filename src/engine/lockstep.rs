//! Serving a model split over several processes (`model::parallel`, docs/MODEL.md §7): rank 0's
//! engine takes the requests; every other rank runs `tandem worker`, which follows. For each request
//! rank 0 sends the prompt and the options to all ranks, and every rank runs the same `generate`
//! (its collectives must meet in the same order everywhere, so nothing may depend on timing: the
//! adaptive controller is off and a seed is fixed); after every step the ranks agree whether to stop
//! (rank 0's caller left, cancelled, or a stop sequence matched). One request at a time; images and
//! grammars are not sent across yet.

use serde::{Deserialize, Serialize};

use mlx::Array;

use crate::generate::{generate, Control, GenerateOptions, MtpOptions, Output, Progress, SamplingParams};
use crate::model::parallel::{Parallel, Split};
use crate::model::Qwen35;

/// What every rank needs to run a request's generation as rank 0 does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockstepJob {
    /// The model rank 0 runs it on, by name, and how it is split: a rank serving another model, or
    /// the same split another way, refuses it.
    pub model: String,
    #[serde(default)]
    pub split: Split,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub mtp: MtpOptions,
    pub stop_ids: Vec<u32>,
    pub prefill_chunk: usize,
}

impl LockstepJob {
    /// The job for `prompt` under `opts` on `model` split as `split`, made timing-free: fixed depth,
    /// and a seed.
    pub fn new(model: &str, split: Split, prompt: &[u32], opts: &GenerateOptions) -> LockstepJob {
        let mut sampling = opts.sampling.clone();
        sampling.seed.get_or_insert_with(crate::generate::sampler::fresh_seed);
        LockstepJob {
            model: model.to_owned(),
            split,
            prompt: prompt.to_vec(),
            max_tokens: opts.max_tokens,
            sampling,
            mtp: MtpOptions { adaptive: false, ..opts.mtp.clone() },
            stop_ids: opts.stop_ids.clone(),
            prefill_chunk: opts.prefill_chunk,
        }
    }

    /// The options every rank generates with (`logprobs`: rank 0's own, they add no collective).
    pub fn options(&self, logprobs: Option<usize>) -> GenerateOptions {
        GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: self.sampling.clone(),
            stop_ids: self.stop_ids.clone(),
            mtp: self.mtp.clone(),
            prefill_chunk: self.prefill_chunk,
            logprobs,
            ..Default::default()
        }
    }
}

/// Rank 0's bytes, on every rank (a sum where the others give zeros).
fn share_bytes(tp: &Parallel, mine: &[u8]) -> mlx::Result<Vec<u8>> {
    let len = Array::from_slice(&[mine.len() as i32], &[1])?;
    let len = tp.reduce(&len)?.to_vec::<i32>()?.first().copied().unwrap_or(0).max(0);
    if len == 0 {
        return Ok(Vec::new());
    }
    let words: Vec<i32> =
        if tp.rank() == 0 { mine.iter().map(|&b| i32::from(b)).collect() } else { vec![0; len as usize] };
    let sum = tp.reduce(&Array::from_slice(&words, &[len])?)?.to_vec::<i32>()?;
    Ok(sum.into_iter().map(|b| b.clamp(0, 255) as u8).collect())
}

/// Rank 0: hands every rank the next job; fails when a rank serves another model (it refuses).
pub fn send_job(tp: &Parallel, job: &LockstepJob) -> Result<(), crate::generate::GenerateError> {
    let bytes = serde_json::to_vec(job).map_err(|e| mlx::Error::Invalid(format!("cannot encode a job: {e}")))?;
    share_bytes(tp, &bytes)?;
    if agree_stop(tp, false)? {
        return Err(crate::generate::GenerateError::OtherRank(format!(
            "another rank of the group does not serve model `{}` {} parallel (every rank must run `tandem worker` \
             with it and the same --split)",
            job.model, job.split
        )));
    }
    Ok(())
}

/// The other ranks: the next job for `model` (a job for another model is refused, and so is not
/// returned; rank 0 then fails that request).
pub fn receive_job(tp: &Parallel, model: &str) -> mlx::Result<LockstepJob> {
    loop {
        let bytes = share_bytes(tp, &[])?;
        let job: Option<LockstepJob> = serde_json::from_slice(&bytes).ok();
        let ours = job.as_ref().is_some_and(|j| j.model == model && j.split == tp.split());
        agree_stop(tp, !ours)?;
        match job {
            Some(job) if ours => return Ok(job),
            Some(job) => tracing::warn!(
                "rank 0 asked for model `{}` ({} parallel); this rank serves `{model}` ({} parallel)",
                job.model,
                job.split,
                tp.split()
            ),
            None => tracing::warn!("an unreadable job from rank 0 ({} bytes)", bytes.len()),
        }
    }
}

/// Whether any rank wants to stop (in practice rank 0): every rank gets the same answer.
pub fn agree_stop(tp: &Parallel, stop: bool) -> mlx::Result<bool> {
    let flag = Array::from_slice(&[i32::from(stop)], &[1])?;
    Ok(tp.reduce(&flag)?.to_vec::<i32>()?.first().is_some_and(|&n| n > 0))
}

/// Runs `job` on this rank in step with the others; `on_progress` is rank 0's streaming (the
/// others pass one that always continues). A failed agreement (a rank lost) stops it with that error.
pub fn run(
    model: &Qwen35,
    tp: &Parallel,
    job: &LockstepJob,
    logprobs: Option<usize>,
    on_progress: &mut dyn FnMut(Progress<'_>) -> Control,
) -> Result<Output, crate::generate::GenerateError> {
    let mut lost = None;
    let out = generate(model, &job.prompt, &job.options(logprobs), &mut |p| {
        let mine = on_progress(p) == Control::Stop;
        match agree_stop(tp, mine) {
            Ok(true) => Control::Stop,
            Ok(false) => Control::Continue,
            Err(e) => {
                lost = Some(e);
                Control::Stop
            }
        }
    })?;
    match lost {
        Some(e) => Err(e.into()),
        None => Ok(out),
    }
}

/// A follower rank (`tandem worker`): runs rank 0's jobs for the model it serves (`name`), until
/// rank 0 is gone (the error says so).
pub fn follow(model: &Qwen35, name: &str, tp: &Parallel) -> Result<(), crate::generate::GenerateError> {
    loop {
        let job = receive_job(tp, name)?;
        tracing::info!(prompt = job.prompt.len(), max_tokens = job.max_tokens, "job from rank 0");
        let out = run(model, tp, &job, None, &mut |_| Control::Continue)?;
        tracing::info!(tokens = out.tokens.len(), "job done");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_timing_free_and_round_trips() {
        let opts = GenerateOptions {
            max_tokens: 9,
            sampling: SamplingParams { temperature: 0.7, ..Default::default() },
            mtp: MtpOptions { enabled: true, depth: 2, adaptive: true, exact_verify: false },
            stop_ids: vec![5],
            ..Default::default()
        };
        let job = LockstepJob::new("m", Split::Pipeline, &[1, 2, 3], &opts);
        assert!(job.sampling.seed.is_some(), "a seed is fixed so every rank draws the same");
        assert!(!job.mtp.adaptive, "the adaptive controller decides by timing");
        let back: LockstepJob = serde_json::from_slice(&serde_json::to_vec(&job).unwrap()).unwrap();
        assert_eq!(back, job);
        let o = back.options(None);
        assert_eq!((o.max_tokens, o.stop_ids.clone(), o.mtp.depth), (9, vec![5], 2));
    }
}
