//! Batched decoding: one forward over several sequences' next tokens, so the weights are read once
//! for all of them (a decode step is bound by reading the weights). Each sequence keeps its own
//! caches, sampler and decoder; the forward stacks what it needs along the batch axis
//! (`Qwen35::forward_batch`), so no sequence sees another's state (docs/MODEL.md §4.7).
//!
//! A step of the batch: sequences whose next step is plain (plain decoders and parked MTP ones)
//! share one forward of one token each; sequences drafting draft together (their heads run as one,
//! each row against its own head cache: [`draft`]) and share one verify forward of `k + 1` tokens
//! each, `k` the smallest depth their controllers chose, and each keeps its own accepted prefix (its
//! own [`Verify`] transaction). While some MTP sequences are parked, those that would draft step
//! plainly with them (one forward, not two). A sequence that cannot share a forward this step (a
//! pipelined step still to be taken, token-by-token verify) steps alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mlx::{Array, Dtype};

use super::decoder::Decoder;
use super::error::Result;
use super::mtp::{decide, draft_batch, draw_ahead, ms, start_shadows, verify_input, Drafted, MtpDecoder, Verified};
use super::sequence::Sequence;
use super::step::{self, can_pipeline, BatchRow, Started};
use crate::cache::{LayerCache, Verify};
use crate::model::launch;

/// How a sequence takes part in this step.
enum Part {
    Alone,
    Plain,
    /// An MTP decoder taking a plain step (its controller parked drafting, or too few tokens are left).
    Parked,
    Cycle(usize),
}

/// `together`: the sequences run ahead as the rows of one batched step of exactly them, in order
/// ([`ahead_together`]); otherwise a step running ahead is taken alone.
fn part(seq: &Sequence<'_>, together: bool) -> Part {
    if seq.decoder.running_ahead() && !together {
        return Part::Alone;
    }
    match &seq.decoder {
        Decoder::Plain(_) => Part::Plain,
        Decoder::Mtp(m) if m.verifies_exactly() => Part::Alone,
        Decoder::Mtp(m) => m.cycle_depth(seq.remaining()).map_or(Part::Parked, Part::Cycle),
    }
}

/// Whether every sequence runs ahead as its row of one batched step of exactly these sequences, in
/// this order (the batched step before started it: [`plain_step`]).
fn ahead_together(seqs: &[&mut Sequence<'_>]) -> bool {
    let first = seqs.first().and_then(|s| s.decoder.steps().batch_row()).map(|r| r.id);
    first.is_some()
        && seqs.iter().enumerate().all(|(i, s)| {
            s.decoder.steps().batch_row().is_some_and(|r| Some(r.id) == first && r.row == i && r.size == seqs.len())
        })
}

/// Steps every sequence once (none may be done); each one's new tokens wait for
/// [`Sequence::report`]. An error fails the step for all of them. `run_ahead`: the same sequences
/// will step together next (nothing joins before then), so where all of them will step plainly
/// again their next batched step may be started before this one's tokens are read (as one
/// sequence's [`super::step::Pipeline`] does).
pub fn step_batch(seqs: &mut [&mut Sequence<'_>], run_ahead: bool) -> Result<()> {
    let batch = seqs.len();
    let together = ahead_together(seqs);
    for seq in seqs.iter_mut() {
        seq.decoder.set_batch(batch);
    }
    let parts: Vec<Part> = seqs.iter().map(|s| part(s, together)).collect();
    let mut depth = parts.iter().filter_map(|p| if let Part::Cycle(k) = p { Some(*k) } else { None }).min();
    let drafting = parts.iter().filter(|p| matches!(p, Part::Cycle(_))).count();
    // Drafting sequences beside parked ones step plainly with them: one forward for the batch, where a
    // step of both would take two (a plain one and a cycle), each sequence's controller judging its own
    // drafting on times that include the other forward. Each controller then parks and probes in step with
    // its neighbours (tandem-tiny on the CPU, 2 adaptive MTP streams: docs/PERF.md, session 22). A plain
    // decoder (MTP off for its request) is not parked and does not hold drafting back.
    if parts.iter().any(|p| matches!(p, Part::Parked)) {
        depth = None;
    }
    // The verify's rows must stay where matmul rows are bit-identical to a plain step's (the
    // verify-width kernels on CUDA): fewer drafts each, or a plain step for all, rather than drafts
    // scored with other bits than plain decoding would score them (docs/MODEL.md §4.7).
    if let (Some(width), Some(k), 2..) = (crate::kernels::row_invariant_width(), depth, drafting) {
        depth = Some(k.min((width / drafting).saturating_sub(1))).filter(|&k| k > 0);
    }
    // The plain group keeps the batch's order, so that a step it starts ahead is the next batched step's
    // rows in order (`ahead_together`) where every sequence steps plainly.
    let (mut plain, mut cycle) = (Vec::new(), Vec::new());
    for (seq, part) in seqs.iter_mut().zip(parts) {
        match part {
            Part::Alone => step_alone(seq)?,
            Part::Cycle(_) if depth.is_some() => cycle.push(&mut **seq),
            _ => plain.push(&mut **seq),
        }
    }
    match plain.as_mut_slice() {
        [] => {}
        [one] => step_alone(one)?,
        group => plain_step(group, together, run_ahead && cycle.is_empty())?,
    }
    match (cycle.as_mut_slice(), depth) {
        ([one], _) => step_alone(one)?,
        (group @ [_, _, ..], Some(k)) => cycle_step(group, k)?,
        _ => {} // none drafts this step
    }
    Ok(())
}

fn step_alone(seq: &mut Sequence<'_>) -> Result<()> {
    let remaining = seq.remaining();
    let new = seq.decoder.step(&mut seq.sampler, &mut seq.history, remaining, &mut seq.stats, false)?;
    seq.produced(new);
    Ok(())
}

/// The caches of each sequence, in order, for one batched forward.
fn caches<'a>(group: &'a mut [&mut Sequence<'_>]) -> Vec<&'a mut [LayerCache]> {
    group.iter_mut().map(|s| s.decoder.cache_mut()).collect()
}

/// The batched plain steps started ahead so far (each one's [`BatchRow::id`]).
static BATCHES_AHEAD: AtomicU64 = AtomicU64::new(0);

/// One token each: every sequence's newest token fed, the next sampled with its own sampler. `ahead`:
/// the step was started by the previous one (every sequence's row of it, in order: [`ahead_together`]).
/// `run_ahead`: where every sequence's next step is plain too and sampling needs no token on the host,
/// the next step is built from this one's tokens on the device and started before they are read, so
/// the host builds it while the device computes this one (the same operations in the same order: the
/// same tokens).
fn plain_step(group: &mut [&mut Sequence<'_>], ahead: bool, run_ahead: bool) -> Result<()> {
    let t0 = Instant::now();
    let b = group.len() as i32;
    let lasts: Vec<u32> = group.iter().map(|s| s.decoder.last()).collect();
    let since: Vec<Instant> = group
        .iter()
        .map(|s| match &s.decoder {
            Decoder::Mtp(m) => m.since(t0),
            Decoder::Plain(_) => t0,
        })
        .collect();
    for (seq, &fed) in group.iter_mut().zip(&lasts) {
        seq.history.push(fed);
    }
    let (rows, tokens) = if ahead {
        let started: Vec<Started> = group.iter_mut().filter_map(|s| s.decoder.steps_mut().take()).collect();
        let tokens = match started.first().and_then(|s| s.batch.as_ref()) {
            Some(row) if started.len() == group.len() => row.tokens.clone(),
            _ => return Err(mlx::Error::Invalid("a batched step started ahead lost a row".into()).into()),
        };
        (started.into_iter().map(|s| s.hidden).collect::<Vec<_>>(), tokens)
    } else {
        let (hidden, tokens) = build_step(group, &Array::from_slice(&lasts, &[b, 1])?)?;
        let rows = (0..b).map(|i| hidden.slice_axis(0, i, i + 1)).collect::<mlx::Result<Vec<_>>>()?;
        if split_traced() {
            let built = ms(t0, Instant::now());
            let [(ops, launch, wait), _] = split_eval(&[&tokens], &[])?;
            tracing::debug!(streams = group.len(), ops, built, launch, wait, "batched plain step (ms)");
        }
        (rows, tokens)
    };
    let pipelined = group.iter().all(|s| can_pipeline(&s.sampler));
    // The next step is plain for all where each steps plainly next on its own, or where an MTP sequence will
    // still be parked: its neighbours' drafting then waits (`step_batch`). Without the second, a batch whose
    // controllers parked out of step took every step unpipelined (tandem-tiny, two streams on the CPU, ~20 %
    // dearer: docs/PERF.md, session 31).
    let held = group.iter().any(|s| s.remaining() > 1 && s.decoder.parked_next(s.remaining()));
    let next_plain =
        pipelined && group.iter().all(|s| s.remaining() > 1 && (held || s.decoder.next_two_plain(s.remaining())));
    let steady = step::steady(pipelined, ahead, run_ahead && next_plain);
    if run_ahead && next_plain {
        if !ahead {
            mlx::device::async_eval(&[&tokens])?;
        }
        let (hidden, next) = build_step(group, &tokens.reshape(&[b, 1])?)?;
        mlx::device::async_eval(&[&next])?;
        let (id, size) = (BATCHES_AHEAD.fetch_add(1, Ordering::Relaxed), group.len());
        for (i, seq) in group.iter_mut().enumerate() {
            let r = i as i32;
            let batch = Some(BatchRow { id, row: i, size, tokens: next.clone() });
            let token = next.slice_axis(0, r, r + 1)?.reshape(&[])?;
            let started = Started { hidden: hidden.slice_axis(0, r, r + 1)?, token, batch };
            seq.decoder.steps_mut().run_ahead(started);
        }
    }
    mlx::device::eval(&[&tokens])?;
    let tokens = tokens.to_vec::<u32>()?;
    // Parks that end at this step end in shadow probes, started together by depth: (depth, sequence).
    let mut shadows: Vec<(usize, usize)> = Vec::new();
    for (i, ((seq, &next), h)) in group.iter_mut().zip(&tokens).zip(rows).enumerate() {
        let new = match &mut seq.decoder {
            Decoder::Plain(p) => p.after_step(h, next),
            Decoder::Mtp(m) => {
                let new = m.after_plain_step(h, next, since[i], steady, &mut seq.stats)?;
                shadows.extend(m.shadow_due().map(|k| (k, i)));
                new
            }
        };
        seq.produced(new);
    }
    shadows.sort_unstable();
    for due in shadows.chunk_by(|a, b| a.0 == b.0) {
        let mut decoders: Vec<&mut MtpDecoder<'_>> = group
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| due.iter().any(|&(_, j)| j == *i))
            .filter_map(|(_, seq)| match &mut seq.decoder {
                Decoder::Mtp(m) => Some(&mut **m),
                Decoder::Plain(_) => None,
            })
            .collect();
        start_shadows(&mut decoders, due[0].0)?;
    }
    Ok(())
}

/// The batched forward of `input` `[B, 1]` (each sequence's fed token, its history already holding
/// it) over the group's caches, and each row's next token drawn by its own sampler: the post-norm
/// hidden states `[B, 1, D]` and the tokens `[B]` (`u32`), still on the device.
fn build_step(group: &mut [&mut Sequence<'_>], input: &Array) -> Result<(Array, Array)> {
    let model = group[0].model;
    let b = group.len() as i32;
    let hidden = launching(|| model.forward_batch(input, &mut caches(group)))?;
    let logits = model.logits(&hidden)?;
    // Where every sampler only takes its row's argmax, one argmax for the batch (one operation, not a
    // slice, cast and argmax per sequence); otherwise each sequence's sampler draws from its row.
    if group.iter().all(|s| s.sampler.argmax_only()) {
        for seq in group.iter_mut() {
            seq.sampler.advance(1);
        }
        return Ok((hidden, logits.reshape(&[b, -1])?.argmax(-1, false)?));
    }
    let mut drawn = Vec::with_capacity(group.len());
    for (i, seq) in group.iter_mut().enumerate() {
        let i = i as i32;
        let row = logits.slice_axis(0, i, i + 1)?.reshape(&[-1])?.as_dtype(Dtype::F32)?;
        let row = seq.sampler.penalize(&row, &seq.history)?;
        drawn.push(seq.sampler.sample(&row)?.reshape(&[1])?);
    }
    let tokens = mlx::concatenate(&drawn.iter().collect::<Vec<_>>(), 0)?.as_dtype(Dtype::U32)?;
    Ok((hidden, tokens))
}

/// The MTP decoders of a group (an error for a plain one).
fn mtp_decoders<'a, 'm>(group: &'a mut [&mut Sequence<'m>]) -> Result<Vec<&'a mut MtpDecoder<'m>>> {
    group
        .iter_mut()
        .map(|seq| match &mut seq.decoder {
            Decoder::Mtp(m) => Ok(&mut **m),
            Decoder::Plain(_) => Err(mlx::Error::Invalid("a batched cycle over a plain decoder".into()).into()),
        })
        .collect()
}

/// The drafts of a cycle of depth `k` for each sequence of `group` (all MTP decoders), their heads
/// run together: one output head, argmax and head pass per draft step for the whole group, each
/// row against its own head cache (`mtp::draft_batch`). Still on the device. This is the first half
/// of a batched cycle: drafted and not verified, the sequences cannot step again (tests count its
/// operations and compare its drafts with each sequence's own).
pub fn draft(group: &mut [&mut Sequence<'_>], k: usize) -> Result<Vec<Drafted>> {
    draft_batch(&mut mtp_decoders(group)?, k)
}

/// One speculative cycle of depth `k` each (all MTP decoders): the drafts of all heads together,
/// one verify forward over all of them, each sequence's acceptance and rollback its own.
fn cycle_step(group: &mut [&mut Sequence<'_>], k: usize) -> Result<()> {
    let t0 = Instant::now();
    let model = group[0].model;
    let since: Vec<Instant> = mtp_decoders(group)?.iter().map(|m| m.since(t0)).collect();
    let drafted = draft(group, k)?;
    if !split_traced() {
        launch::start(&drafted.iter().flat_map(|d| [&d.drafts, &d.head]).collect::<Vec<_>>())?;
    }
    let lasts: Vec<u32> = group.iter().map(|s| s.decoder.last()).collect();
    let rows =
        lasts.iter().zip(&drafted).map(|(&last, d)| verify_input(last, &d.drafts)).collect::<Result<Vec<_>>>()?;
    let t1 = Instant::now();
    let input = mlx::concatenate(&rows.iter().collect::<Vec<_>>(), 0)?;
    // Each sequence's caches, sampler and history, borrowed apart for the verify transactions.
    let (mut caches, mut samplers, mut histories, mut stops) = (vec![], vec![], vec![], vec![]);
    for seq in group.iter_mut() {
        let Sequence { decoder, sampler, history, opts, .. } = &mut **seq;
        caches.push(decoder.cache_mut());
        samplers.push(sampler);
        histories.push(history);
        stops.push(&opts.stop_ids[..]);
    }
    let mut verifies: Vec<Verify<'_>> = caches.iter_mut().map(|c| Verify::begin(c, k + 1)).collect();
    let hidden = {
        let mut open: Vec<&mut [LayerCache]> = verifies.iter_mut().map(|v| v.cache()).collect();
        launching(|| model.forward_batch(&input, &mut open))?
    };
    let logits = model.logits(&hidden)?.as_dtype(Dtype::F32)?;
    // Each sequence's rows of logits `[k+1, V]` and its targets, where they can be drawn before the
    // logits are read: evaluated with them, so the cycle waits for the device once (not once more per
    // sequence).
    let logit_rows = (0..lasts.len() as i32)
        .map(|i| logits.slice_axis(0, i, i + 1)?.squeeze(&[0]))
        .collect::<mlx::Result<Vec<_>>>()?;
    // Where every sampler would draw its rows' argmax ahead (greedy), one argmax for the whole batch
    // (exact, as each row's own), read as each sequence's rows.
    let drawn = if samplers.iter().all(|s| s.is_greedy() && s.draws_ahead()) {
        let all = logits.argmax(-1, false)?;
        (0..lasts.len() as i32)
            .map(|i| Ok(Some(all.slice_axis(0, i, i + 1)?.squeeze(&[0])?)))
            .collect::<Result<Vec<_>>>()?
    } else {
        samplers.iter().zip(&logit_rows).map(|(s, row)| draw_ahead(s, row)).collect::<Result<Vec<_>>>()?
    };
    let built = Instant::now();
    let mut wait: Vec<&Array> = vec![&logits];
    wait.extend(drafted.iter().flat_map(|d| [&d.drafts, &d.head]));
    wait.extend(drawn.iter().flatten());
    // Traced: the drafts and the verify evaluated apart, each as MLX's host work (until
    // `async_eval` returns: building and launching its kernels) and the wait after it (the device).
    let split = split_traced()
        .then(|| split_eval(&wait[1..1 + 2 * drafted.len()], &[&wait[..1], &wait[1 + 2 * drafted.len()..]].concat()))
        .transpose()?;
    mlx::device::eval(&wait)?;
    let t2 = Instant::now();
    let mut decided = Vec::with_capacity(lasts.len());
    for (i, (sampler, history)) in samplers.iter_mut().zip(histories.iter_mut()).enumerate() {
        decided.push(decide(
            sampler,
            history,
            lasts[i],
            &logit_rows[i],
            &drafted[i].drafts,
            stops[i],
            drawn[i].as_ref(),
        )?);
    }
    let t3 = Instant::now();
    let kept: Vec<usize> = decided.iter().map(|(_, accepted, _)| accepted + 1).collect();
    Verify::commit_all(verifies, &kept)?;
    let t4 = Instant::now();
    for (i, (seq, (drafts, accepted, next))) in group.iter_mut().zip(decided).enumerate() {
        let i = i as i32;
        let h = hidden.slice_axis(0, i, i + 1)?.slice_axis(1, 0, accepted as i32 + 1)?;
        let v = Verified { drafts, accepted, next, hidden: vec![h], ms: [ms(t1, t2), ms(t2, t3), ms(t3, t4)] };
        let Decoder::Mtp(m) = &mut seq.decoder else {
            return Err(mlx::Error::Invalid("a batched cycle over a plain decoder".into()).into());
        };
        let new = m.after_cycle(k, v, [since[i as usize], t0, t1], &mut seq.stats);
        seq.produced(new);
    }
    // Where a batched cycle's time goes (`RUST_LOG=tandem::generate::batch=debug`): building the
    // drafts' and the verify's graphs, waiting for both, the sequences' decisions, their rollbacks,
    // and their bookkeeping.
    tracing::debug!(
        streams = group.len(),
        k,
        draft_build = ms(t0, t1),
        verify_build = ms(t1, built),
        eval = ms(built, t2),
        decide = ms(t2, t3),
        commit = ms(t3, t4),
        after = ms(t4, Instant::now()),
        "batched cycle (ms)"
    );
    if let Some([(draft_ops, draft_launch, draft_wait), (verify_ops, verify_launch, verify_wait)]) = split {
        tracing::debug!(
            streams = group.len(),
            k,
            draft_ops,
            draft_launch,
            draft_wait,
            verify_ops,
            verify_launch,
            verify_wait,
            "batched cycle split (ms)"
        );
    }
    Ok(())
}

/// Whether steps and cycles are traced with their evaluation split (drafts, verify): their graphs then
/// stay whole until evaluated, so the split's operation counts and host times cover all of them.
fn split_traced() -> bool {
    tracing::enabled!(tracing::Level::DEBUG)
}

/// `f` with the forward's layers launched as they are built ([`launch::early`]), unless the split
/// is traced.
fn launching<R>(f: impl FnOnce() -> R) -> R {
    if split_traced() {
        f()
    } else {
        launch::early(f)
    }
}

/// `first` then `second` evaluated apart: for each, its operations, MLX's host time (until
/// `async_eval` returns) and the wait for the device after it, in ms (the debug trace's split).
fn split_eval(first: &[&Array], second: &[&Array]) -> Result<[(usize, f64, f64); 2]> {
    let timed = |arrays: &[&Array]| -> Result<(usize, f64, f64)> {
        let ops = mlx::compile::graph_ops(arrays);
        if tracing::enabled!(tracing::Level::TRACE) {
            let top: Vec<String> =
                mlx::compile::graph_op_histogram(arrays).iter().take(16).map(|(n, c)| format!("{n} {c}")).collect();
            tracing::trace!(ops, "operations: {}", top.join(", "));
        }
        let t0 = Instant::now();
        mlx::device::async_eval(arrays)?;
        let t1 = Instant::now();
        mlx::device::eval(arrays)?;
        Ok((ops, ms(t0, t1), ms(t1, Instant::now())))
    };
    Ok([timed(first)?, timed(second)?])
}
