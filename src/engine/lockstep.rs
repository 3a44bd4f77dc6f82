//! Serving a model split over several processes (`model::parallel`, docs/MODEL.md §7): rank 0's
//! engine takes the requests; every other rank runs `tandem worker`, which follows rank 0's
//! [`Command`]s. A load is announced first with the model's name and [`identity`](crate::model::identity):
//! a rank that serves another model, or would load it in another dtype or split, refuses before any
//! collective of the model's own runs (ranks that build different graphs would meet in the wrong
//! collectives and hang or compute garbage), and rank 0's load fails naming why. For each request rank
//! 0 sends the prompt and the options to all ranks, and every rank runs the same `generate` (its
//! collectives must meet in the same order everywhere, so nothing may depend on timing: the adaptive
//! controller is off and a seed is fixed); after every step the ranks agree whether to stop (rank 0's
//! caller left, cancelled, or a stop sequence matched). An unload on rank 0 unloads everywhere. One
//! request at a time; images and grammars are not sent across yet.

use serde::{Deserialize, Serialize};

use mlx::Array;

use std::path::Path;

use crate::generate::{
    generate, Control, GenerateError, GenerateOptions, MtpOptions, Output, Progress, SamplingParams,
};
use crate::model::parallel::Parallel;
use crate::model::{self, LoadError, LoadOptions, Qwen35};

/// What rank 0 tells the others, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Load `model` (by name), whose [`identity`](crate::model::identity) on rank 0 is `identity`.
    Load {
        model: String,
        identity: String,
    },
    Generate(LockstepJob),
    /// Drop the loaded model.
    Unload,
}

/// What every rank needs to run a request's generation as rank 0 does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockstepJob {
    /// The model rank 0 runs it on, by name: a rank without it loaded refuses it (the load's
    /// identity already covered its files, dtype and split).
    pub model: String,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub mtp: MtpOptions,
    pub stop_ids: Vec<u32>,
    pub prefill_chunk: usize,
}

impl LockstepJob {
    /// The job for `prompt` under `opts` on `model`, made timing-free: fixed depth, and a seed.
    pub fn new(model: &str, prompt: &[u32], opts: &GenerateOptions) -> LockstepJob {
        let mut sampling = opts.sampling.clone();
        sampling.seed.get_or_insert_with(crate::generate::sampler::fresh_seed);
        LockstepJob {
            model: model.to_owned(),
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
    let len = tp.from_rank0(&Array::from_slice(&[mine.len() as i32], &[1])?)?.to_vec::<i32>()?;
    let len = len.first().copied().unwrap_or(0).max(0);
    if len == 0 {
        return Ok(Vec::new());
    }
    let words: Vec<i32> =
        if tp.rank() == 0 { mine.iter().map(|&b| i32::from(b)).collect() } else { vec![0; len as usize] };
    let sum = tp.from_rank0(&Array::from_slice(&words, &[len])?)?.to_vec::<i32>()?;
    Ok(sum.into_iter().map(|b| b.clamp(0, 255) as u8).collect())
}

fn send(tp: &Parallel, command: &Command) -> mlx::Result<()> {
    let bytes =
        serde_json::to_vec(command).map_err(|e| mlx::Error::Invalid(format!("cannot encode a command: {e}")))?;
    share_bytes(tp, &bytes).map(|_| ())
}

/// The other ranks: rank 0's next command (an unreadable one is an error: the ranks are out of step).
fn receive(tp: &Parallel) -> mlx::Result<Command> {
    let bytes = share_bytes(tp, &[])?;
    serde_json::from_slice(&bytes)
        .map_err(|e| mlx::Error::Invalid(format!("an unreadable command from rank 0 ({} bytes): {e}", bytes.len())))
}

/// Rank 0: loads `model` from `dir` on every rank. Every other rank must serve a model of that name
/// and load it as this rank does (its identity), or all refuse before loading; a load that fails on
/// any rank fails on all (the others drop theirs).
pub fn load(tp: &Parallel, model: &str, dir: &Path, opts: &LoadOptions) -> Result<Qwen35, LoadError> {
    let identity = model::identity(dir, opts)?;
    let collective = |e: mlx::Error| LoadError::Mlx { context: "the group's agreement on a load".into(), error: e };
    send(tp, &Command::Load { model: model.to_owned(), identity }).map_err(collective)?;
    if agree_stop(tp, false).map_err(collective)? {
        return Err(LoadError::Config(format!(
            "another rank of the group does not serve model `{model}` as this one loads it (every rank must run \
             `tandem worker --model {model}` over the same files, dtype and --split {})",
            tp.split()
        )));
    }
    let loaded = model::load(dir, opts);
    if agree_stop(tp, loaded.is_err()).map_err(collective)? && loaded.is_ok() {
        return Err(LoadError::Config(format!(
            "another rank of the group failed to load `{model}` (its log says why)"
        )));
    }
    loaded
}

/// Rank 0: the other ranks drop the model (best effort: a lost group has nothing to drop).
pub fn unload(tp: &Parallel) {
    if let Err(e) = send(tp, &Command::Unload) {
        tracing::warn!("cannot tell the other ranks to unload: {e}");
    }
}

/// Rank 0: hands every rank the next job.
pub fn send_job(tp: &Parallel, job: &LockstepJob) -> Result<(), GenerateError> {
    send(tp, &Command::Generate(job.clone()))?;
    if agree_stop(tp, false)? {
        return Err(GenerateError::OtherRank(format!(
            "another rank of the group has no model `{}` loaded (it refused or failed the load)",
            job.model
        )));
    }
    Ok(())
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

/// A follower rank (`tandem worker`): serves model `name` from `dir` as rank 0 commands (loads,
/// generations, unloads) until rank 0 is gone (the error says so).
pub fn follow(name: &str, dir: &Path, opts: &LoadOptions, tp: &Parallel) -> Result<(), GenerateError> {
    let mine = model::identity(dir, opts).map_err(|e| GenerateError::OtherRank(format!("{}: {e}", dir.display())))?;
    let mut loaded: Option<Qwen35> = None;
    loop {
        match receive(tp)? {
            Command::Load { model, identity } => {
                loaded = None;
                let ours = model == name && identity == mine;
                if !ours {
                    tracing::warn!(
                        "rank 0 loads `{model}` ({identity}); this rank serves `{name}` ({mine}): refused (the files, \
                         dtype or --split differ)"
                    );
                }
                if agree_stop(tp, !ours)? {
                    continue;
                }
                let result = model::load(dir, opts);
                if let Err(e) = &result {
                    tracing::error!("cannot load {}: {e}", dir.display());
                }
                let failed = agree_stop(tp, result.is_err())?;
                loaded = result.ok().filter(|_| !failed);
                tracing::info!(model = name, loaded = loaded.is_some(), "load from rank 0");
            }
            Command::Generate(job) => {
                let ready = loaded.as_ref().filter(|_| job.model == name);
                if agree_stop(tp, ready.is_none())? {
                    continue;
                }
                let Some(m) = ready else { continue };
                tracing::info!(prompt = job.prompt.len(), max_tokens = job.max_tokens, "job from rank 0");
                let out = run(m, tp, &job, None, &mut |_| Control::Continue)?;
                tracing::info!(tokens = out.tokens.len(), "job done");
            }
            Command::Unload => {
                loaded = None;
                tracing::info!(model = name, "unloaded by rank 0");
            }
        }
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
            mtp: MtpOptions { enabled: true, depth: 2, adaptive: true, exact_verify: false, ..Default::default() },
            stop_ids: vec![5],
            ..Default::default()
        };
        let job = LockstepJob::new("m", &[1, 2, 3], &opts);
        assert!(job.sampling.seed.is_some(), "a seed is fixed so every rank draws the same");
        assert!(!job.mtp.adaptive, "the adaptive controller decides by timing");
        let back: LockstepJob = serde_json::from_slice(&serde_json::to_vec(&job).unwrap()).unwrap();
        assert_eq!(back, job);
        let o = back.options(None);
        assert_eq!((o.max_tokens, o.stop_ids.clone(), o.mtp.depth), (9, vec![5], 2));
        for c in [Command::Load { model: "m".into(), identity: "ab12".into() }, Command::Generate(job), Command::Unload]
        {
            let back: Command = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
            assert_eq!(back, c);
        }
    }
}
