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

pub struct Drafter {
    cache: KvCache,
    /// Hidden states `[1, T, D]` and the tokens that follow them, not yet run through the head.
    pending_hidden: Vec<Array>,
    pending_tokens: Vec<u32>,
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
            catch_up_ms: 0.0,
            chunk: queries_per_varying_pass().unwrap_or(usize::MAX),
        }
    }

    /// Runs the pending pairs through the head, all of them or all but the last, so that its cache
    /// holds one entry per pair up to there (a snapshot's); returns the last pair's hidden state
    /// when it stays pending.
    pub fn settle(&mut self, model: &Qwen35, keep_last: bool) -> Result<Option<Array>> {
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

    pub fn catch_up_ms(&self) -> f64 {
        self.catch_up_ms
    }

    /// Drafts `k` tokens greedily, chaining through the head's normed output, as an array `[k]`
    /// (`u32`) still to be computed: the verify pass is built on it without waiting. `depth` is the
    /// configured depth: more pending pairs than a cycle leaves mean the head is catching up.
    pub fn draft(&mut self, model: &Qwen35, k: usize, depth: usize) -> Result<Array> {
        let catching_up = self.pending_tokens.len() > depth + 1;
        let t = Instant::now();
        let mut hm = self.flush(model)?;
        self.catch_up_ms = if catching_up {
            hm.eval()?;
            (Instant::now() - t).as_secs_f64() * 1e3
        } else {
            0.0
        };
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

    /// Runs the pending pairs through the head; returns its normed output at the last pair. After a
    /// long park the pairs are many and their number differs each time: where such passes are costly
    /// (CUDA builds an attention graph per shape) they run in chunks of a length that stays cheap.
    fn flush(&mut self, model: &Qwen35) -> Result<Array> {
        let chunk = self.chunk;
        let hidden = concatenate(&self.pending_hidden.iter().collect::<Vec<_>>(), 1)?;
        let ids: Vec<i32> = self.pending_tokens.iter().map(|&t| t as i32).collect();
        debug_assert_eq!(hidden.dim(1) as usize, ids.len());
        self.pending_hidden.clear();
        self.pending_tokens.clear();
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
