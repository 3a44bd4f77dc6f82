//! The drafter: the model's own MTP head, its KV cache, and the pairs (hidden state, next token) it
//! has not run yet.
//!
//! Invariant between cycles: the head's cache holds one entry per pair (h_i, x_{i+1}) already run
//! through it; the pairs not yet run wait in `pending` and are flushed in one batched head forward
//! before drafting. Drafting chains through the head's own output (docs/MODEL.md §4.2); those chained entries
//! are speculative and leave the cache when the drafts are made.

use std::time::Instant;

use mlx::{concatenate, Array};

use crate::cache::KvCache;
use crate::generate::error::Result;
use crate::model::layers::queries_per_varying_pass;
use crate::model::Qwen35;

#[derive(Clone)]
pub struct Drafter {
    cache: KvCache,
    /// Hidden states `[1, T, D]` and the tokens that follow them, not yet run through the head.
    pending_hidden: Vec<Array>,
    pending_tokens: Vec<u32>,
    /// Tokens still on the device (`[1, T]`) that follow `pending_tokens`: a cycle built ahead pairs
    /// its hidden states with drafts and a guess not read yet ([`Drafter::queue_lazy`]).
    pending_lazy: Option<Array>,
    /// Time the latest draft spent catching the head up on positions decoded while parked: a
    /// one-off cost of having parked, kept out of the controller's judgement of drafting.
    catch_up_ms: f64,
    /// Pairs per head pass when catching up (see [`Drafter::flush`]).
    chunk: usize,
}

impl Drafter {
    /// Starts after prefill: the prompt's hidden states `[1, P, D]` pair with the prompt's tokens
    /// shifted by one, the last with `first`, the token sampled after the prompt.
    pub fn new(model: &Qwen35, hidden: &Array, prompt: &[u32], first: u32) -> Drafter {
        let mut tokens: Vec<u32> = prompt[1..].to_vec();
        tokens.push(first);
        Drafter::resume(model.make_mtp_cache().unwrap_or_default(), hidden, tokens)
    }

    /// Starts from a head cache that already holds the pairs before the first of `hidden`
    /// (`[1, T, D]`), which pair with the T `next_tokens` (a restored prefix: see `cache::Snapshot`).
    pub fn resume(cache: KvCache, hidden: &Array, next_tokens: Vec<u32>) -> Drafter {
        let mut drafter = Drafter::primed(cache);
        drafter.queue([hidden.clone()], &next_tokens);
        drafter
    }

    /// Starts from a head cache with no pair pending yet: prefill queues them ([`Drafter::queue`]).
    pub fn primed(cache: KvCache) -> Drafter {
        Drafter {
            cache,
            pending_hidden: Vec::new(),
            pending_tokens: Vec::new(),
            pending_lazy: None,
            catch_up_ms: 0.0,
            chunk: queries_per_varying_pass().unwrap_or(usize::MAX),
        }
    }

    /// Runs the pending pairs through the head, all of them or all but the last, so that its cache
    /// holds one entry per pair up to there (a snapshot's); returns the last pair's hidden state
    /// when it stays pending. With no pair pending the cache is settled already: None.
    pub fn settle(&mut self, model: &Qwen35, keep_last: bool) -> Result<Option<Array>> {
        if self.pending_hidden.is_empty() {
            // A snapshot taken while a parked step runs ahead can find the head caught up.
            return Ok(None);
        }
        let hidden = concatenate(&self.pending_hidden.iter().collect::<Vec<_>>(), 1)?;
        let n = hidden.dim(1);
        let run = if keep_last { n - 1 } else { n };
        let last = keep_last.then(|| hidden.slice_axis(1, n - 1, n)).transpose()?;
        if run > 0 {
            let tokens = self.pending_tokens.clone();
            self.pending_hidden = vec![hidden.slice_axis(1, 0, run)?];
            self.pending_tokens.truncate(run as usize);
            self.flush(model)?;
            if let Some(h) = &last {
                self.queue([h.clone()], &tokens[run as usize..]);
            }
        }
        Ok(last)
    }

    /// The head's cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Catches up at most `n` pairs per head pass (the backend decides by default).
    pub fn with_catch_up_chunk(mut self, n: usize) -> Drafter {
        self.chunk = n.max(1);
        self
    }

    /// Queues committed pairs: hidden states (`[1, T, D]` each, T in all) and the T tokens after them.
    pub fn queue(&mut self, hidden: impl IntoIterator<Item = Array>, tokens: &[u32]) {
        self.pending_hidden.extend(hidden);
        self.pending_tokens.extend_from_slice(tokens);
    }

    /// Queues pairs whose tokens are still on the device (`ids` `[1, T]`, T the hidden states' total),
    /// after every pair queued so far; nothing may be queued after them until they are flushed.
    pub fn queue_lazy(&mut self, hidden: impl IntoIterator<Item = Array>, ids: Array) {
        self.pending_hidden.extend(hidden);
        self.pending_lazy = Some(ids);
    }

    /// Whether prefill runs the head over each chunk's prompt pairs ([`Drafter::run_pending`]): where a pass
    /// of any length is cheap (CPU, Metal), and on CUDA for head sizes over 128, whose attention MLX does not
    /// send to cuDNN (no graph built per shape): the pass is then one layer of the body's own prefill chunk.
    /// Elsewhere the pairs wait for the first draft's catch-up. `TANDEM_HEAD_PREFILL=0` makes them wait
    /// everywhere, to measure what this earns.
    pub fn runs_in_prefill(model: &Qwen35) -> bool {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let off = *OFF.get_or_init(|| std::env::var_os("TANDEM_HEAD_PREFILL").is_some_and(|v| v == "0"));
        !off && (queries_per_varying_pass().is_none() || model.config.text.head_dim > 128)
    }

    /// Runs every pending pair through the head in one pass and evaluates its cache: prefill calls it after
    /// each chunk where [`Drafter::runs_in_prefill`], so the head's pass over a prompt is part of prefill
    /// (chunk by chunk, as the body's, and between a running batch's steps) instead of one catch-up over the
    /// whole prompt at the first draft. A no-op with nothing pending.
    pub fn run_pending(&mut self, model: &Qwen35) -> Result<()> {
        if self.pending() == 0 {
            return Ok(());
        }
        // No pair's output is read here: where a pass of any length is cheap (CPU, Metal) the pairs go straight
        // into the head's cache, with no attention, MLP or norm computed for them; else (CUDA) one whole pass, as
        // the body's chunk: a prompt chunk in 16-pair writes would be many small passes, not measured there.
        match self.can_write(model) && queries_per_varying_pass().is_none() {
            true => self.write_pairs(model, self.pending_tokens.len())?,
            false => {
                self.flush_in(model, usize::MAX)?;
            }
        }
        if let Some((keys, values)) = self.cache.state() {
            mlx::device::eval(&[keys, values])?;
        }
        Ok(())
    }

    /// Pairs waiting to run through the head.
    pub fn pending(&self) -> usize {
        self.pending_tokens.len() + self.pending_lazy.as_ref().map_or(0, |ids| ids.dim(1).max(0) as usize)
    }

    pub fn catch_up_ms(&self) -> f64 {
        self.catch_up_ms
    }

    /// Drafts `k` tokens greedily, chaining through the head's normed output, as an array `[k]`
    /// (`u32`) still to be computed: the verify pass is built on it without waiting. `depth` is the
    /// configured depth: more pending pairs than a cycle leaves mean the head is catching up.
    pub fn draft(&mut self, model: &Qwen35, k: usize, depth: usize) -> Result<Array> {
        if !model.drafts_here() {
            // A split model's rank without the head: rank 0 drafts for it.
            self.pending_hidden.clear();
            self.pending_tokens.clear();
            self.pending_lazy = None;
            self.catch_up_ms = 0.0;
            return Ok(model.share_drafts(&Array::zeros(&[k as i32], mlx::Dtype::U32)?)?);
        }
        let hm = self.flush_timed(model, depth)?;
        Ok(model.share_drafts(&self.chain(model, hm, k)?)?)
    }

    /// Every pending pair but the last written into the head's cache, where they can be ([`Drafter::write_pairs`]):
    /// a catch-up, whose pairs' outputs no draft reads. A shadow probe's is untimed, so nothing waits for the
    /// device, and leaves its draft one pair to run (a group's then run together).
    pub fn write_catch_up(&mut self, model: &Qwen35) -> Result<()> {
        match self.pending_tokens.len() {
            n @ 2.. if self.can_write(model) => self.write_pairs(model, n - 1),
            _ => Ok(()),
        }
    }

    /// `k` drafts chained through the head from its output `hm` `[1, 1, D]` at the last pair, `[k]`; the
    /// chained entries leave its cache.
    fn chain(&mut self, model: &Qwen35, mut hm: Array, k: usize) -> Result<Array> {
        let mut drafts: Vec<Array> = Vec::with_capacity(k);
        for j in 0..k {
            let d = model.logits(&hm)?.argmax(-1, false)?; // [1, 1]
            if j + 1 < k {
                hm = model.mtp_forward(&hm, &d, &mut self.cache)?;
            }
            drafts.push(d);
        }
        let refs: Vec<&Array> = drafts.iter().collect();
        let all = concatenate(&refs, 1)?.reshape(&[-1])?;
        // The k-1 chained entries were speculative.
        self.cache.trim(k as i32 - 1)?;
        Ok(all)
    }

    /// Drafts `k` tokens for each of several sequences at once (`depths[i]`: drafter i's configured
    /// depth, as [`Drafter::draft`] takes it), one array `[k]` each, still to be computed. Each step
    /// runs the output head, the argmax and the head once for the whole group, each row against its
    /// own head cache at its own offset, so the graph does not grow by a head pass per sequence (the
    /// head's attention alone runs per row). One drafter drafts alone, with [`Drafter::draft`]'s ops.
    pub fn draft_batch(
        model: &Qwen35,
        drafters: &mut [&mut Drafter],
        k: usize,
        depths: &[usize],
    ) -> Result<Vec<Array>> {
        if drafters.len() != depths.len() {
            let n = (drafters.len(), depths.len());
            return Err(mlx::Error::Invalid(format!("batched drafts: {} drafters, {} depths", n.0, n.1)).into());
        }
        match drafters {
            [] => return Ok(Vec::new()),
            [one] => return Ok(vec![one.draft(model, k, depths[0])?]),
            // A split model's drafts cross the group one sequence at a time (it serves one at a time).
            _ if model.splits_drafting() => {
                return drafters.iter_mut().zip(depths).map(|(d, &depth)| d.draft(model, k, depth)).collect();
            }
            _ => {}
        }
        let mut hm = flush_batch(model, drafters, depths)?; // [B, 1, D]
        let mut drafts: Vec<Array> = Vec::with_capacity(k);
        {
            let mut caches: Vec<&mut KvCache> = drafters.iter_mut().map(|d| &mut d.cache).collect();
            for j in 0..k {
                let d = model.logits(&hm)?.argmax(-1, false)?; // [B, 1]
                if j + 1 < k {
                    hm = model.mtp_forward_batch(&hm, &d, &mut caches)?;
                }
                drafts.push(d);
            }
        }
        let all = concatenate(&drafts.iter().collect::<Vec<_>>(), 1)?; // [B, k]
        for d in drafters.iter_mut() {
            // The k-1 chained entries were speculative.
            d.cache.trim(k as i32 - 1)?;
        }
        (0..all.dim(0)).map(|i| Ok(all.slice_axis(0, i, i + 1)?.reshape(&[-1])?)).collect()
    }

    /// [`Drafter::flush`], timed as a catch-up when more pairs wait than a cycle leaves (`depth` is
    /// the configured depth): that time is a one-off cost of having parked, not of drafting. Catching up,
    /// every pair but the last only fills the head's cache ([`Drafter::write_pairs`]): only the last
    /// one's output feeds the draft.
    fn flush_timed(&mut self, model: &Qwen35, depth: usize) -> Result<Array> {
        let catching_up = self.catching_up(depth);
        let t = Instant::now();
        if catching_up {
            self.write_catch_up(model)?;
        }
        let hm = self.flush(model)?;
        self.catch_up_ms = if catching_up {
            hm.eval()?;
            (Instant::now() - t).as_secs_f64() * 1e3
        } else {
            0.0
        };
        Ok(hm)
    }

    /// Whether pending pairs can go straight into the head's cache: the head is here and every pending token is
    /// on the host (none of a cycle built ahead). On CUDA (catch-ups only, see `run_pending`) in passes of at
    /// most [`write_chunk`] pairs (one pass of any length built per length there: 0.14-0.24x plain at
    /// oracle 0.0, docs/PERF.md session 26); `TANDEM_HEAD_WRITES=0` keeps CUDA on whole head passes.
    fn can_write(&self, model: &Qwen35) -> bool {
        model.drafts_here() && self.pending_lazy.is_none() && !self.pending_tokens.is_empty() && write_chunk().is_some()
    }

    /// The first `n` pending pairs written into the head's cache in one pass, on CUDA in passes of at most
    /// [`write_chunk`] pairs (`Qwen35::mtp_write_cache`:
    /// their keys and values, the bits a whole pass writes, with none of the outputs only a draft reads);
    /// the rest stay pending.
    fn write_pairs(&mut self, model: &Qwen35, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let hidden = concatenate(&self.pending_hidden.iter().collect::<Vec<_>>(), 1)?;
        let total = hidden.dim(1);
        if total as usize != self.pending_tokens.len() || n > self.pending_tokens.len() {
            let counts = (total, self.pending_tokens.len());
            return Err(
                mlx::Error::Invalid(format!("MTP head: {} hidden states for {} tokens", counts.0, counts.1)).into()
            );
        }
        let ids: Vec<i32> = self.pending_tokens.drain(..n).map(|t| t as i32).collect();
        let n = n as i32;
        let step = write_chunk().map_or(n, |c| c.min(n as usize) as i32);
        for start in (0..n).step_by(step as usize) {
            let end = (start + step).min(n);
            let written = if (start, end) == (0, total) { hidden.clone() } else { hidden.slice_axis(1, start, end)? };
            let ids = Array::from_slice(&ids[start as usize..end as usize], &[1, end - start])?;
            model.mtp_write_cache(&written, &ids, &mut self.cache)?;
        }
        self.pending_hidden.clear();
        if n < total {
            self.pending_hidden.push(hidden.slice_axis(1, n, total)?);
        }
        Ok(())
    }

    /// Whether more pairs wait than a cycle of the configured `depth` leaves (the head catches up).
    fn catching_up(&self, depth: usize) -> bool {
        self.pending() > depth + 1
    }

    /// Runs the pending pairs through the head; returns its normed output at the last pair. After a
    /// long park the pairs are many and their number differs each time: where such passes are costly
    /// (CUDA builds an attention graph per shape) they run in chunks of a length that stays cheap.
    fn flush(&mut self, model: &Qwen35) -> Result<Array> {
        self.flush_in(model, self.chunk)
    }

    /// [`Drafter::flush`] with at most `chunk` pairs per head pass.
    fn flush_in(&mut self, model: &Qwen35, chunk: usize) -> Result<Array> {
        let hidden = concatenate(&self.pending_hidden.iter().collect::<Vec<_>>(), 1)?;
        let ids: Vec<i32> = self.pending_tokens.iter().map(|&t| t as i32).collect();
        self.pending_hidden.clear();
        self.pending_tokens.clear();
        if let Some(lazy) = self.pending_lazy.take() {
            // A cycle built ahead: its few pairs run in one pass, the tokens read on the device.
            let x = match ids.is_empty() {
                true => lazy,
                false => concatenate(
                    &[&Array::from_slice(&ids, &[1, ids.len() as i32])?, &lazy.as_dtype(mlx::Dtype::I32)?],
                    1,
                )?,
            };
            debug_assert_eq!(hidden.dim(1), x.dim(1));
            let out = model.mtp_forward(&hidden, &x, &mut self.cache)?;
            let t = out.dim(1);
            return Ok(out.slice_axis(1, t - 1, t)?);
        }
        debug_assert_eq!(hidden.dim(1) as usize, ids.len());
        if !model.drafts_here() {
            // No head here (a split model's rank but 0): nothing to run; the pairs are rank 0's to keep.
            let t = hidden.dim(1);
            return Ok(hidden.slice_axis(1, t - 1, t)?);
        }
        let mut out = None;
        for (i, ids) in ids.chunks(chunk).enumerate() {
            let start = (i * chunk) as i32;
            let h = if ids.len() == hidden.dim(1) as usize {
                hidden.clone()
            } else {
                hidden.slice_axis(1, start, start + ids.len() as i32)?
            };
            let x = Array::from_slice(ids, &[1, ids.len() as i32])?;
            out = Some(model.mtp_forward(&h, &x, &mut self.cache)?);
        }
        let out = out.ok_or_else(|| mlx::Error::Invalid("the MTP head has no pending pair to draft from".into()))?;
        let t = out.dim(1);
        Ok(out.slice_axis(1, t - 1, t)?)
    }
}

/// Runs every drafter's pending pairs through the head; returns the head's output at each one's last
/// pair, `[B, 1, D]`. A drafter catching up (the prompt's pairs, or positions decoded while parked)
/// flushes alone, so that its catch-up time is its own and a long catch-up pads no other row; the
/// others share one head forward ([`flush_together`]).
fn flush_batch(model: &Qwen35, drafters: &mut [&mut Drafter], depths: &[usize]) -> Result<Array> {
    let mut out: Vec<Option<Array>> = vec![None; drafters.len()];
    let mut shared = Vec::new();
    for (i, d) in drafters.iter_mut().enumerate() {
        if d.catching_up(depths[i]) || d.pending_tokens.len() > d.chunk {
            out[i] = Some(d.flush_timed(model, depths[i])?);
        } else {
            d.catch_up_ms = 0.0;
            shared.push(i);
        }
    }
    if let [i] = shared[..] {
        out[i] = Some(drafters[i].flush(model)?);
    } else if !shared.is_empty() {
        let mut group: Vec<&mut Drafter> =
            drafters.iter_mut().enumerate().filter(|(i, _)| shared.contains(i)).map(|(_, d)| &mut **d).collect();
        let last = flush_together(model, &mut group)?;
        for (row, &i) in shared.iter().enumerate() {
            let row = row as i32;
            out[i] = Some(last.slice_axis(0, row, row + 1)?);
        }
    }
    let rows = out.into_iter().flatten().collect::<Vec<_>>();
    Ok(concatenate(&rows.iter().collect::<Vec<_>>(), 0)?)
}

/// One head forward over every drafter's pending pairs `[B, T, D]`; returns each one's output at its
/// last pair, `[B, 1, D]`. Pending lengths differ after a cycle (each sequence accepted its own
/// number of drafts): shorter rows are padded at the end to the longest and their pad entries trimmed
/// from their caches after. Attention is causal, so a row's real positions never see its padding.
fn flush_together(model: &Qwen35, drafters: &mut [&mut Drafter]) -> Result<Array> {
    let lens: Vec<usize> = drafters.iter().map(|d| d.pending_tokens.len()).collect();
    let t = lens.iter().copied().max().unwrap_or(0);
    if lens.contains(&0) {
        return Err(mlx::Error::Invalid("the MTP head has no pending pair to draft from".into()).into());
    }
    let (mut rows, mut ids) = (Vec::with_capacity(lens.len()), Vec::with_capacity(lens.len() * t));
    for (d, &n) in drafters.iter_mut().zip(&lens) {
        let mut parts = std::mem::take(&mut d.pending_hidden);
        if let (true, Some(h)) = (n < t, parts.first()) {
            parts.push(Array::zeros(&[1, (t - n) as i32, h.dim(2)], h.dtype())?);
        }
        rows.push(concatenate(&parts.iter().collect::<Vec<_>>(), 1)?);
        ids.extend(d.pending_tokens.drain(..).map(|x| x as i32));
        ids.resize(ids.len() + t - n, 0);
    }
    let (b, t) = (lens.len() as i32, t as i32);
    let hidden = concatenate(&rows.iter().collect::<Vec<_>>(), 0)?;
    let out = {
        let mut caches: Vec<&mut KvCache> = drafters.iter_mut().map(|d| &mut d.cache).collect();
        model.mtp_forward_batch(&hidden, &Array::from_slice(&ids, &[b, t])?, &mut caches)?
    };
    if lens.iter().all(|&n| n as i32 == t) {
        return Ok(out.slice_axis(1, t - 1, t)?);
    }
    for (d, &n) in drafters.iter_mut().zip(&lens) {
        d.cache.trim(t - n as i32)?;
    }
    let last: Vec<i32> = lens.iter().map(|&n| n as i32 - 1).collect();
    let at = Array::from_slice(&last, &[b, 1, 1])?.broadcast_to(&[b, 1, out.dim(2)])?;
    Ok(out.take_along_axis(&at, 1)?)
}

/// Pairs per pass where pending pairs are written into the head's cache: `usize::MAX` (one pass) where a pass
/// of any length is cheap (CPU, Metal); on CUDA `TANDEM_HEAD_WRITES=N` (0: None, no writes there, whole head
/// passes as before session 27), else the short-query length (16). Passes of at most 16 stay within the widths
/// the verify-width kernels already serve, so a catch-up builds nothing new; the whole passes it replaces ran the
/// head's attention over 16 queries, whose first use cost 4.2 s at the first catch-up of each process on an H100
/// (docs/PERF.md, session 27), and one pass of any length built per length (session 26).
fn write_chunk() -> Option<usize> {
    static SET: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let Some(short) = queries_per_varying_pass() else { return Some(usize::MAX) };
    match *SET.get_or_init(|| std::env::var("TANDEM_HEAD_WRITES").ok().and_then(|v| v.trim().parse().ok())) {
        Some(0) => None,
        Some(n) => Some(n),
        None => Some(short),
    }
}
