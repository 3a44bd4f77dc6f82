//! Turning logits into tokens: repetition penalty, temperature, top-k, top-p and min-p filters,
//! then greedy or seeded categorical sampling. The processed distribution is exposed too, because
//! speculative sampling must accept and resample against exactly the distribution it would sample.
//!
//! Random draws are keyed by the position of the token they pick (the n-th generated token always
//! uses the n-th key), not by how many draws came before. Speculative sampling draws each verified
//! position with that position's key, so a seeded generation gives the same tokens with MTP or
//! without, at any depth, whatever the adaptive controller chooses (docs/MODEL.md §4.3).

use mlx::{random, where_, Array, Dtype};

use super::constraint::Constraint;

pub type Result<T> = std::result::Result<T, mlx::Error>;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 1 disables nucleus filtering.
    pub top_p: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 0 disables min-p.
    pub min_p: f32,
    /// 1 disables the penalty.
    pub repetition_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repetition_context: usize,
    /// OpenAI's penalties, over the generated tokens (not the prompt): subtracted once from the
    /// logit of every token already generated (presence), and once per time it was (frequency).
    /// 0 disables them.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_context: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
    /// Whether a token's logits depend on the tokens before it (a penalty is on).
    pub fn uses_history(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
    /// Checks ranges; the message names the field and value.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let bad = |f: &str, v: f32| Err(format!("{f} = {v} is out of range"));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", self.repetition_penalty);
        }
        // OpenAI's range.
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty", self.presence_penalty);
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty", self.frequency_penalty);
        }
        Ok(())
    }
}

/// A sampler with its own random stream (seeded for reproducible runs), and the grammar that
/// constrains what it draws, if any.
pub struct Sampler {
    pub params: SamplingParams,
    seed: u64,
    /// Tokens drawn so far: the position of the next one.
    drawn: u64,
    /// How many tokens of the history are the prompt: presence and frequency penalties count
    /// only what follows.
    prompt_len: usize,
    constraint: Option<Constraint>,
    /// When set, each drawn token's log-probability and this many alternatives are recorded.
    logprobs: Option<usize>,
    recorded: Vec<TokenLogprob>,
}

/// A drawn token's log-probability under the model's distribution at its position (log-softmax
/// of the logits after penalties, before temperature, filters and grammar), with the most likely
/// alternatives, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        let seed = params.seed.unwrap_or_else(fresh_seed);
        Ok(Sampler { params, seed, drawn: 0, prompt_len: 0, constraint: None, logprobs: None, recorded: Vec::new() })
    }

    /// Records log-probabilities with `top` alternatives for every drawn token (see
    /// [`TokenLogprob`]).
    pub fn with_logprobs(mut self, top: Option<usize>) -> Sampler {
        self.logprobs = top;
        self
    }

    pub fn records_logprobs(&self) -> bool {
        self.logprobs.is_some()
    }

    /// The records since the last call, one per token drawn, in order.
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.recorded)
    }

    /// Records rows `[n, V]` of logits for the tokens drawn from them.
    pub fn record(&mut self, logits: &Array, tokens: &[u32]) -> Result<()> {
        let Some(top) = self.logprobs else { return Ok(()) };
        let x = logits.reshape(&[-1, logits.dim(-1)])?.as_dtype(Dtype::F32)?;
        let lp = x.subtract(&x.logsumexp(&[-1], true)?)?;
        let width = lp.dim(-1) as usize;
        for (i, &t) in tokens.iter().enumerate() {
            let row = lp.slice_axis(0, i as i32, i as i32 + 1)?.reshape(&[-1])?.to_vec::<f32>()?;
            let mut best: Vec<(u32, f32)> = Vec::new();
            if top > 0 {
                let mut order: Vec<usize> = (0..width).collect();
                let k = top.min(width);
                order.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]));
                order.truncate(k);
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                best = order.into_iter().map(|j| (j as u32, row[j])).collect();
            }
            self.recorded.push(TokenLogprob {
                token: t,
                logprob: row.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY),
                top: best,
            });
        }
        Ok(())
    }

    /// Counts the first `n` tokens of every history as the prompt.
    pub fn with_prompt_len(mut self, n: usize) -> Sampler {
        self.prompt_len = n;
        self
    }

    /// Draws only what `constraint` allows.
    pub fn with_constraint(mut self, constraint: Option<Constraint>) -> Sampler {
        self.constraint = constraint;
        self
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// Whether a row's token depends on that row alone (no penalty over the history, no grammar), so
    /// a verify's targets can be drawn before its logits are read.
    pub fn draws_ahead(&self) -> bool {
        !self.params.uses_history() && !self.is_constrained()
    }

    /// Whether this sampler's pick from a row of logits is that row's argmax and nothing else happens:
    /// greedy, [`Self::draws_ahead`], no log-probabilities recorded. A batch of such samplers can take
    /// one argmax over all their rows (an exact operation: each row's index is the one its own gives).
    pub fn argmax_only(&self) -> bool {
        self.is_greedy() && self.draws_ahead() && self.logprobs.is_none()
    }

    /// The key of the draw `ahead` positions after the next token's. Every emitted token has exactly
    /// one position, whether plain decoding or a verify picked it.
    fn key_at(&self, ahead: u64) -> Result<Array> {
        random::key(mix(self.seed, self.drawn + ahead))
    }

    /// Moves past `n` emitted tokens.
    pub fn advance(&mut self, n: usize) {
        self.drawn += n as u64;
    }

    /// Applies the penalties for `history` (the prompt, then the generated tokens) to one row of
    /// logits `[V]` (f32).
    pub fn penalize(&self, logits: &Array, history: &[u32]) -> Result<Array> {
        let logits = self.penalize_generated(logits, history.get(self.prompt_len..).unwrap_or_default())?;
        let p = self.params.repetition_penalty;
        if p == 1.0 || history.is_empty() {
            return Ok(logits);
        }
        let start = history.len().saturating_sub(self.params.repetition_context);
        let mut recent: Vec<u32> = history[start..].to_vec();
        recent.sort_unstable();
        recent.dedup();
        let idx = Array::from_slice(&recent, &[recent.len() as i32])?;
        let picked = logits.take(&idx, -1)?;
        let penalty = Array::f32(p);
        // transformers' rule: divide positive logits, multiply negative ones.
        let scaled =
            where_(&picked.greater(&Array::f32(0.0))?, &picked.divide(&penalty)?, &picked.multiply(&penalty)?)?;
        logits.put_along_axis(&idx, &scaled, -1)
    }

    /// Presence and frequency penalties over the generated tokens.
    fn penalize_generated(&self, logits: &Array, generated: &[u32]) -> Result<Array> {
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        if (presence == 0.0 && frequency == 0.0) || generated.is_empty() {
            return Ok(logits.clone());
        }
        let mut counts = std::collections::BTreeMap::<u32, u32>::new();
        for &t in generated {
            *counts.entry(t).or_default() += 1;
        }
        let ids: Vec<u32> = counts.keys().copied().collect();
        let minus: Vec<f32> = counts.values().map(|&n| presence + frequency * n as f32).collect();
        let idx = Array::from_slice(&ids, &[ids.len() as i32])?;
        let picked = logits.take(&idx, -1)?;
        let lowered = picked.subtract(&Array::from_slice(&minus, &[minus.len() as i32])?)?;
        logits.put_along_axis(&idx, &lowered, -1)
    }

    /// Log-probabilities `[.., V]` of the distribution this sampler draws from: temperature, then
    /// top-k, top-p and min-p filters (filtered entries are -inf). Greedy callers use argmax instead.
    pub fn logprobs(&self, logits: &Array) -> Result<Array> {
        let p = &self.params;
        let neg_inf = Array::f32(f32::NEG_INFINITY);
        let mut x = logits.as_dtype(Dtype::F32)?;
        if p.temperature > 0.0 {
            x = x.multiply(&Array::f32(1.0 / p.temperature))?;
        }
        let vocab = x.dim(-1) as usize;
        if p.top_k > 0 && p.top_k < vocab {
            let kth = x.topk(p.top_k as i32, -1)?.min(&[-1], true)?;
            x = where_(&x.less(&kth)?, &neg_inf, &x)?;
        }
        let mut lp = x.subtract(&x.logsumexp(&[-1], true)?)?;
        if p.top_p < 1.0 {
            // Keep the smallest set of most likely tokens whose mass reaches top_p: a token stays when
            // the mass strictly before it (in descending order) is below top_p.
            let probs = lp.exp()?;
            let sorted = probs.negative()?.sort(-1)?.negative()?;
            let before = sorted.cumsum(-1, false, false)?;
            let kept = where_(&before.less(&Array::f32(p.top_p))?, &sorted, &Array::f32(f32::INFINITY))?;
            let threshold = kept.min(&[-1], true)?;
            lp = where_(&probs.less(&threshold)?, &neg_inf, &lp)?;
        }
        if p.min_p > 0.0 {
            let max = lp.max(&[-1], true)?;
            let cut = max.add(&Array::f32(p.min_p.ln()))?;
            lp = where_(&lp.less(&cut)?, &neg_inf, &lp)?;
        }
        lp.subtract(&lp.logsumexp(&[-1], true)?)
    }

    /// Picks the next token from logits `[V]`: argmax when greedy, else a draw from
    /// [`Self::logprobs`] with the next position's key. Advances one position either way.
    /// Under a constraint the logits are masked first and the grammar moves past the token (which
    /// is then read).
    pub fn sample(&mut self, logits: &Array) -> Result<Array> {
        let unmasked = logits.reshape(&[1, -1])?;
        let mut logits = unmasked.clone();
        if let Some(c) = self.constraint.as_mut() {
            let width = logits.dim(-1) as usize;
            logits = logits.add(&c.bias(width).map_err(grammar_error)?)?;
        }
        let masked = logits;
        let token = self.sample_rows(&masked)?.reshape(&[])?;
        self.advance(1);
        if self.logprobs.is_some() {
            let t = token.item::<u32>()?;
            self.record(&unmasked, &[t])?;
        }
        if let Some(c) = self.constraint.as_mut() {
            c.consume(&[token.item::<u32>()?]).map_err(grammar_error)?;
        }
        Ok(token)
    }

    /// Masks verify logits `[k + 1, V]`: row j with the grammar after drafts 0..j (unchanged
    /// without a constraint).
    pub fn mask_verify(&mut self, logits: &Array, drafts: &[u32]) -> Result<Array> {
        match self.constraint.as_mut() {
            None => Ok(logits.clone()),
            Some(c) => {
                let width = logits.dim(-1) as usize;
                logits.add(&c.biases_along(drafts, width).map_err(grammar_error)?)
            }
        }
    }

    /// Moves the grammar past tokens emitted without [`Sampler::sample`] (a verify's).
    pub fn consumed(&mut self, tokens: &[u32]) -> Result<()> {
        match self.constraint.as_mut() {
            None => Ok(()),
            Some(c) => c.consume(tokens).map_err(grammar_error),
        }
    }

    /// Picks one token per row of `[n, V]`, row i with the key of the position i ahead, without
    /// advancing: the caller advances by as many as it keeps. Lazy: one wait reads them all.
    pub fn sample_rows(&self, logits: &Array) -> Result<Array> {
        if self.is_greedy() {
            return logits.argmax(-1, false);
        }
        let lp = self.logprobs(logits)?;
        let rows = (0..lp.dim(0))
            .map(|i| random::categorical(&lp.slice_axis(0, i, i + 1)?.reshape(&[-1])?, -1, &self.key_at(i as u64)?))
            .collect::<Result<Vec<_>>>()?;
        mlx::stack(&rows.iter().collect::<Vec<_>>(), 0)
    }
}

fn grammar_error(message: String) -> mlx::Error {
    mlx::Error::Invalid(format!("constrained decoding: {message}"))
}

/// A seed for a generation that asked for none (the clock's nanoseconds).
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A 64-bit seed for the draw at `position` (SplitMix64's finalizer over seed and position), so
/// that neighbouring positions and seeds get unrelated keys.
fn mix(seed: u64, position: u64) -> u64 {
    let mut z = seed ^ position.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
