//! `tandem bench --streams N,…`: N generations decoded together, as the engine batches concurrent
//! requests (one forward over every stream's tokens a step), plain and with MTP at each depth:
//! the aggregate speed beside one stream's, and each stream's own.

use std::time::Instant;

use anyhow::{bail, Result};
use serde::Serialize;
use tandem::generate::batch::step_batch;
use tandem::generate::{Control, GenerateOptions, Oracle, Output, Resume, Sequence};
use tandem::model::Qwen35;

use super::{BenchArgs, WARM_ACCEPTANCE, WARM_TOKENS};

#[derive(Serialize)]
pub struct StreamRun {
    pub depth: usize,
    pub streams: usize,
    /// Tokens decoded by all streams together per second (each stream's first token, which
    /// prefill samples, left out).
    pub aggregate_tok_s: f64,
    /// Aggregate over one stream's at the same depth.
    pub speedup: f64,
    /// Aggregate over one stream's plain decoding.
    pub vs_plain: f64,
    /// Each stream's own decode speed.
    pub per_stream_tok_s: Vec<f64>,
    /// Drafts accepted over drafted, over all streams (None for plain decoding).
    pub acceptance: Option<f64>,
}

/// Every (streams, depth) pair of the plan: plain decoding first at each size (an oracle drafts
/// from the plain continuation of the same batch), then each MTP depth.
pub fn run(
    a: &BenchArgs,
    model: &Qwen35,
    prompts: &[Vec<u32>],
    opts_for: &dyn Fn(usize) -> GenerateOptions,
) -> Result<Vec<StreamRun>> {
    if a.streams.contains(&0) {
        bail!("--streams: 0 streams");
    }
    let mut depths: Vec<usize> = a.depths.clone();
    depths.sort_unstable();
    depths.dedup();
    if depths.first() != Some(&0) {
        depths.insert(0, 0);
    }
    let mut sizes = a.streams.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.first() != Some(&1) {
        sizes.insert(0, 1);
    }
    let mut runs: Vec<StreamRun> = Vec::new();
    for &n in &sizes {
        let prompts = &prompts[..n];
        let mut plain: Vec<Vec<u32>> = Vec::new();
        for &depth in &depths {
            let opts = |i: usize, max_tokens: usize, acceptance: Option<f64>| GenerateOptions {
                max_tokens,
                oracle: acceptance.filter(|_| depth > 0).and_then(|p| {
                    plain.get(i).map(|c| Oracle { continuation: c.clone(), acceptance: p, seed: i as u64 })
                }),
                ..opts_for(depth)
            };
            // Untimed first: a GPU backend builds kernels per shape, and batched shapes are new.
            let warm: Vec<GenerateOptions> =
                (0..n).map(|i| opts(i, WARM_TOKENS.min(a.gen_tokens), Some(WARM_ACCEPTANCE))).collect();
            decode_together(model, prompts, &warm)?;
            let timed: Vec<GenerateOptions> = (0..n).map(|i| opts(i, a.gen_tokens, a.oracle_acceptance)).collect();
            let (seconds, outs) = decode_together(model, prompts, &timed)?;
            if depth == 0 {
                plain = outs.iter().map(|o| o.tokens.clone()).collect();
            }
            let decoded: usize = outs.iter().map(|o| o.tokens.len().saturating_sub(1)).sum();
            let aggregate_tok_s = decoded as f64 / seconds.max(1e-9);
            let one =
                runs.iter().find(|r| r.streams == 1 && r.depth == depth).map_or(aggregate_tok_s, |r| r.aggregate_tok_s);
            let plain_one =
                runs.iter().find(|r| r.streams == 1 && r.depth == 0).map_or(aggregate_tok_s, |r| r.aggregate_tok_s);
            let (drafted, accepted) = outs
                .iter()
                .filter_map(|o| o.stats.spec.as_ref())
                .fold((0, 0), |(d, acc), s| (d + s.drafted, acc + s.accepted));
            let run = StreamRun {
                depth,
                streams: n,
                aggregate_tok_s,
                speedup: aggregate_tok_s / one.max(1e-9),
                vs_plain: aggregate_tok_s / plain_one.max(1e-9),
                per_stream_tok_s: outs.iter().map(|o| o.stats.decode_tok_s).collect(),
                acceptance: (depth > 0 && drafted > 0).then(|| accepted as f64 / drafted as f64),
            };
            if !a.json {
                let each: Vec<String> = run.per_stream_tok_s.iter().map(|t| format!("{t:.1}")).collect();
                let acc = run.acceptance.map(|p| format!("  acceptance {:.1}%", p * 100.0)).unwrap_or_default();
                eprintln!(
                    "streams {n} depth {depth}: aggregate {:>8.1} tok/s  {:.2}x one stream  {:.2}x plain alone  each [{}]{acc}",
                    run.aggregate_tok_s,
                    run.speedup,
                    run.vs_plain,
                    each.join(", ")
                );
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// Starts one sequence per prompt (each prefilled alone), then decodes them together until every
/// one ends, as the engine's worker does (one stream alone steps pipelined). Returns the decoding
/// time and each one's output.
fn decode_together(model: &Qwen35, prompts: &[Vec<u32>], opts: &[GenerateOptions]) -> Result<(f64, Vec<Output>)> {
    let mut on = |_: tandem::generate::Progress<'_>| Control::Continue;
    let mut seqs = Vec::with_capacity(prompts.len());
    for (p, o) in prompts.iter().zip(opts) {
        seqs.push(Sequence::start(model, p, &[], o.clone(), Resume::default(), &mut on)?);
    }
    let t = Instant::now();
    let mut ended: Vec<Option<f64>> = vec![None; seqs.len()];
    loop {
        let mut live: Vec<&mut Sequence<'_>> = seqs.iter_mut().filter(|s| !s.is_done()).collect();
        match live.as_mut_slice() {
            [] => break,
            [one] => one.step(true, &mut on)?,
            group => {
                step_batch(group, true)?;
                for s in group.iter_mut() {
                    s.report(&mut on);
                }
            }
        }
        for (end, s) in ended.iter_mut().zip(&seqs) {
            if end.is_none() && s.is_done() {
                *end = Some(t.elapsed().as_secs_f64());
            }
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    let mut outs: Vec<Output> = seqs.into_iter().map(Sequence::finish).collect();
    // Each stream's speed over the same window (from the first batched step to its end), not from
    // its own first token, which came before the later streams' prefill.
    for (o, end) in outs.iter_mut().zip(ended) {
        o.stats.decode_tok_s = o.tokens.len().saturating_sub(1) as f64 / end.unwrap_or(seconds).max(1e-9);
    }
    Ok((seconds, outs))
}
