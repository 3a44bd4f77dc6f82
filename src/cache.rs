//! Per-sequence decoding state: KV caches for attention layers and the conv window and recurrent
//! state of linear-attention layers, with the snapshots that make speculative rollback exact.
//!
//! The model is read-only; every sequence owns one `LayerCache` per layer (and one KV cache per MTP
//! layer). Rolling back is a property of these types: a verify pass is a transaction ([`Verify`]:
//! begun before the forward, committed with the number of tokens kept), and `KvCache::trim` drops
//! a KV cache's newest positions.

use std::sync::Arc;

use mlx::{concatenate, Array};

pub mod snapshot;

pub use snapshot::Snapshot;

pub type Result<T> = std::result::Result<T, mlx::Error>;

/// Positions a KV buffer grows by: appending a token writes into spare room instead of copying the
/// whole cache (as a concatenation would, every token), and trimming moves nothing.
pub const KV_STEP: i32 = 256;

/// Keys and values of one attention layer, in buffers `[B, H, capacity, D]` of which the first
/// `offset` positions are valid.
#[derive(Clone, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Number of positions held (the next token's position).
    pub offset: i32,
    /// Added to `offset` to get the next token's RoPE position: 0 for text, and after images the
    /// M-RoPE delta (text after an image resumes at the image's largest position + 1).
    pub rope_delta: i32,
}

impl KvCache {
    /// Appends `k`, `v` (`[B, H, T, D]`) and returns all keys and values so far (views of the buffers).
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        self.append(k, v)?;
        self.contents()?.ok_or_else(|| mlx::Error::Invalid("KV cache: no buffers after an append".into()))
    }

    /// Appends `k`, `v` (`[B, H, T, D]`) without the views of [`KvCache::update`]: for a reader of the
    /// buffers themselves (the attention kernel), which would leave those views unevaluated, each an
    /// operation the host built for nothing.
    pub fn append(&mut self, k: &Array, v: &Array) -> Result<()> {
        let (start, end) = (self.offset, self.offset + k.dim(2));
        self.keys = Some(write(self.keys.take(), k, start, end)?);
        self.values = Some(write(self.values.take(), v, start, end)?);
        self.offset = end;
        Ok(())
    }

    /// A cache over `keys` and `values` buffers (`[B, H, capacity, D]`) whose first `offset`
    /// positions are valid (a restored prefix, see [`Snapshot::restore`]).
    pub fn from_buffers(keys: Array, values: Array, offset: i32, rope_delta: i32) -> KvCache {
        KvCache { keys: Some(keys), values: Some(values), offset, rope_delta }
    }

    /// Drops the last `n` positions (their rows are overwritten by the next update).
    pub fn trim(&mut self, n: i32) -> Result<()> {
        self.offset -= n.clamp(0, self.offset);
        Ok(())
    }

    /// The buffers (spare room included), e.g. to evaluate them.
    pub fn state(&self) -> Option<(&Array, &Array)> {
        self.keys.as_ref().zip(self.values.as_ref())
    }

    /// The valid keys and values `[B, H, offset, D]`.
    pub fn contents(&self) -> Result<Option<(Array, Array)>> {
        self.state().map(|(k, v)| Ok((k.slice_axis(2, 0, self.offset)?, v.slice_axis(2, 0, self.offset)?))).transpose()
    }
}

/// Writes `x` (`[B, H, T, D]`) at positions `start..end` of `buffer`, first growing the buffer by
/// whole `KV_STEP`s when it is too short (its valid rows `..start` carried over).
fn write(buffer: Option<Array>, x: &Array, start: i32, end: i32) -> Result<Array> {
    let (b, h, d) = (x.dim(0), x.dim(1), x.dim(3));
    let buffer = match buffer {
        Some(buf) if buf.dim(2) >= end => buf,
        old => {
            let capacity = (end + KV_STEP - 1) / KV_STEP * KV_STEP;
            match old {
                Some(buf) if start > 0 => {
                    let spare = Array::zeros(&[b, h, capacity - start, d], x.dtype())?;
                    concatenate(&[&buf.slice_axis(2, 0, start)?, &spare], 2)?
                }
                _ => Array::zeros(&[b, h, capacity, d], x.dtype())?,
            }
        }
    };
    buffer.slice_update(x, &[0, 0, start, 0], &[b, h, end, d], &[1, 1, 1, 1])
}

/// What a linear-attention layer records during a verify pass so it can be rolled back to any
/// accepted prefix: the conv input rows, and the recurrence's inputs and starting state. The pass runs
/// the recurrence once over all its tokens; a rollback to a shorter prefix re-runs it over that prefix
/// from the starting state (the same sequential f32 arithmetic, so the state is the one a pass that
/// only saw the prefix would have), and a full acceptance costs nothing extra.
#[derive(Clone)]
pub struct Recording {
    /// `old conv state (K-1 rows) ++ the pass's pre-conv rows`, `[B, K-1+T, C]`.
    pub conv_input: Array,
    /// The recurrence's `q, k, v, decay, beta` for the pass's tokens (`[B, T, ...]`), where MLX's operations
    /// made q, k and v; None where one kernel read them from the conv's output (`kernels::gated_delta_qkv`),
    /// which also gives `steps`.
    pub inputs: Option<[Array; 5]>,
    /// The recurrent state before the pass.
    pub initial: Array,
    /// The recurrent state after the whole pass.
    pub final_state: Array,
    /// The state after each of the pass's tokens, `[T, B, Hv, Dv, Dk]`, where the recurrence computed
    /// them (the CUDA and host kernels, `kernels::gated_delta`): a rollback then slices instead of re-running.
    pub steps: Option<Array>,
}

impl Recording {
    /// Tokens in the recorded pass.
    pub fn len(&self) -> usize {
        let tokens = match (&self.inputs, &self.steps) {
            (Some(inputs), _) => inputs[0].dim(1),
            (None, Some(steps)) => steps.dim(0),
            (None, None) => 0,
        };
        tokens.max(0) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The recurrent state after the first `keep` tokens (`keep <= len`).
    fn state_after(&self, keep: usize) -> Result<Array> {
        if keep == self.len() {
            return Ok(self.final_state.clone());
        }
        if keep == 0 {
            return Ok(self.initial.clone());
        }
        if let Some(steps) = &self.steps {
            return crate::kernels::gated_delta::step_state(steps, keep);
        }
        let k = keep as i32;
        let Some([q, kk, v, decay, beta]) = &self.inputs else {
            return Err(mlx::Error::Invalid("a verify's recording has neither its inputs nor its steps".into()));
        };
        let at = |a: &Array| a.slice_axis(1, 0, k);
        // The forward's own selection (kernels::gated_delta), so the prefix gets a decode step's bits.
        let update = crate::kernels::gated_delta::gated_delta_update(
            &at(q)?,
            &at(kk)?,
            &at(v)?,
            &at(decay)?,
            &at(beta)?,
            &self.initial,
        )?;
        Ok(update.state)
    }

    /// Row `i` of a batched pass's recording: what that sequence's pass alone would have recorded.
    fn row(&self, i: usize) -> Result<Recording> {
        let i = i as i32;
        let row = |a: &Array| a.slice_axis(0, i, i + 1);
        let inputs = match &self.inputs {
            Some([q, k, v, decay, beta]) => Some([row(q)?, row(k)?, row(v)?, row(decay)?, row(beta)?]),
            None => None,
        };
        Ok(Recording {
            conv_input: row(&self.conv_input)?,
            inputs,
            initial: row(&self.initial)?,
            final_state: row(&self.final_state)?,
            steps: self.steps.as_ref().map(|s| s.slice_axis(1, i, i + 1)).transpose()?,
        })
    }

    /// Every row's conv window and recurrent state after its own `kept[b]` tokens (each `1..=len`), as
    /// whole `[B, ...]` arrays gathered at once from the pass's per-token states; `None` where the pass
    /// has none (MLX's op computed it), or a row keeps nothing (its state is the one before the pass).
    fn kept_rows(&self, kept: &[usize]) -> Result<Option<(Array, Array)>> {
        let Some(steps) = &self.steps else { return Ok(None) };
        let (t, b) = (self.len(), self.conv_input.dim(0));
        if kept.len() != b as usize || steps.dim(0) != t as i32 || kept.iter().any(|&k| k == 0 || k > t) {
            return Ok(None);
        }
        // Whole rows taken from the arrays with their two leading axes merged: a copy per row, where
        // `take_along_axis` gathered element by element (on the CPU, 1.1 ms a two-stream cycle at depth 3
        // for tandem-tiny's states, more than the verify's matmuls grew by).
        // After tokens 0..keep the window is conv_input[keep : keep + K - 1] (as in `LinearState::keep`).
        let (span, channels) = (self.conv_input.dim(1), self.conv_input.dim(2));
        let window = span - t as i32;
        let rows: Vec<i32> =
            (0..b).zip(kept).flat_map(|(i, &k)| (0..window).map(move |j| i * span + k as i32 + j)).collect();
        let conv = self
            .conv_input
            .reshape(&[b * span, channels])?
            .take(&Array::from_slice(&rows, &[b * window])?, 0)?
            .reshape(&[b, window, channels])?;
        // The state after `keep` tokens is the pass's state number keep - 1 (`gated_delta::step_state`).
        let at: Vec<i32> = (0..b).zip(kept).map(|(i, &k)| (k as i32 - 1) * b + i).collect();
        let mut merged = steps.shape();
        merged.splice(0..2, [t as i32 * b]);
        let ssm = steps.reshape(&merged)?.take(&Array::from_slice(&at, &[b])?, 0)?;
        Ok(Some((conv, ssm)))
    }
}

/// The conv window `[B, K-1, C]` and recurrent state `[B, Hv, Dk, Dv]` (f32) of one Gated DeltaNet layer.
#[derive(Clone, Default)]
pub struct LinearState {
    conv: Option<Array>,
    ssm: Option<Array>,
    /// Set where `conv` and `ssm` are one row of arrays a batched forward computed for its whole batch:
    /// the next batched forward over the same sequences in the same order takes those arrays as they are
    /// instead of concatenating the rows again (one copy per sequence and layer). Every other write of the
    /// state drops it, so it never describes a state that changed since.
    batch: Option<BatchRow>,
    /// Whether a verify is open on this layer and what its forward recorded: set and cleared only by
    /// [`Verify`], so no caller flips a flag inside the cache.
    verify: VerifyRecord,
}

/// Row `index` of a batch's conv windows and recurrent states (`rows` sequences; `group` tells one batched
/// forward from another).
#[derive(Clone)]
struct BatchRow {
    conv: Array,
    ssm: Array,
    index: usize,
    rows: usize,
    group: Arc<()>,
}

#[derive(Clone, Default)]
enum VerifyRecord {
    #[default]
    Closed,
    /// A verify is open and the layer's next forward is its pass.
    Open,
    Recorded(Recording),
    /// Row `index` of a batched pass's recording (the whole batch's arrays; `group` tells one pass from
    /// another).
    Row {
        batch: Recording,
        index: usize,
        group: Arc<()>,
    },
    /// Settled already, by [`Verify::commit_all`] for the whole batch.
    Kept,
}

impl LinearState {
    /// A layer's state after some tokens: its conv window and recurrent state (a restored prefix).
    pub fn with_state(conv: Array, ssm: Array) -> LinearState {
        LinearState { conv: Some(conv), ssm: Some(ssm), batch: None, verify: VerifyRecord::Closed }
    }

    /// The conv window, once the layer has seen a token.
    pub fn conv(&self) -> Option<&Array> {
        self.conv.as_ref()
    }

    /// The recurrent state, once the layer has seen a token.
    pub fn ssm(&self) -> Option<&Array> {
        self.ssm.as_ref()
    }

    /// The state after a forward of this sequence alone.
    pub fn set(&mut self, conv: Array, ssm: Array) {
        (self.conv, self.ssm, self.batch) = (Some(conv), Some(ssm), None);
    }

    /// After a forward over `states` (one sequence, or a batch): every sequence's state is its row of
    /// `conv` `[B, K-1, C]` and `ssm` `[B, ...]`; for a batch, the next batched forward over the same
    /// sequences in the same order can take the batch's arrays whole ([`LinearState::batched`]).
    pub fn set_rows(states: &mut [&mut LinearState], conv: &Array, ssm: &Array) -> mlx::Result<()> {
        if let [st] = states {
            st.set(conv.clone(), ssm.clone());
            return Ok(());
        }
        let group = Arc::new(());
        let rows = states.len();
        for (index, st) in states.iter_mut().enumerate() {
            let i = index as i32;
            st.conv = Some(conv.slice_axis(0, i, i + 1)?);
            st.ssm = Some(ssm.slice_axis(0, i, i + 1)?);
            st.batch = Some(BatchRow { conv: conv.clone(), ssm: ssm.clone(), index, rows, group: group.clone() });
        }
        Ok(())
    }

    /// The whole batch's conv windows and recurrent states where `states` are, in order, every row of one
    /// batched forward's result and none has changed since; `None` otherwise (the caller concatenates).
    pub fn batched(states: &[&mut LinearState]) -> Option<(Array, Array)> {
        let first = states.first()?.batch.as_ref()?;
        let whole = states.len() == first.rows
            && in_order(states, &first.group, |st| st.batch.as_ref().map(|b| (b.index, &b.group)));
        whole.then(|| (first.conv.clone(), first.ssm.clone()))
    }

    /// Whether the forward running now is a verify pass, whose inputs [`Self::record`] must keep.
    pub fn verifying(&self) -> bool {
        matches!(self.verify, VerifyRecord::Open)
    }

    /// Keeps what a verify pass over `states` (one sequence, or a batch: `[B, ...]`, B = `states.len()`)
    /// computed, once for all: each state whose verify is open records the pass, or its row of it (ignored
    /// where no verify is open, or the pass already recorded).
    pub fn record(states: &mut [&mut LinearState], recording: Recording) {
        if let [st] = states {
            if st.verifying() {
                st.verify = VerifyRecord::Recorded(recording);
            }
            return;
        }
        let group = Arc::new(());
        for (index, st) in states.iter_mut().enumerate() {
            if st.verifying() {
                st.verify = VerifyRecord::Row { batch: recording.clone(), index, group: group.clone() };
            }
        }
    }

    /// The batched recording `states` are, in order, every row of (none where they are not).
    fn recorded_batch(states: &[&mut LinearState]) -> Option<Recording> {
        let VerifyRecord::Row { batch, group, .. } = &states.first()?.verify else { return None };
        let whole = batch.conv_input.dim(0) as usize == states.len()
            && in_order(states, group, |st| match &st.verify {
                VerifyRecord::Row { index, group, .. } => Some((*index, group)),
                _ => None,
            });
        whole.then(|| batch.clone())
    }

    /// Keeps the state after the first `keep` tokens of the recorded pass (`0..=len`).
    fn keep(&mut self, keep: usize) -> Result<()> {
        let rec = match std::mem::take(&mut self.verify) {
            VerifyRecord::Recorded(rec) => rec,
            VerifyRecord::Row { batch, index, .. } => batch.row(index)?,
            VerifyRecord::Kept => return Ok(()),
            _ => return Err(mlx::Error::Invalid("verify commit: a linear-attention layer recorded no pass".into())),
        };
        if keep > rec.len() {
            return Err(mlx::Error::Invalid(format!("verify commit: keep {keep} of {} recorded tokens", rec.len())));
        }
        // conv_input holds the old window (K-1 rows) and then the pass's rows: after tokens 0..keep
        // the window is the K-1 rows ending at the pass's row keep-1, i.e. conv_input[keep : keep + K - 1].
        let (k, window) = (keep as i32, rec.conv_input.dim(1) - rec.len() as i32);
        self.set(rec.conv_input.slice_axis(1, k, k + window)?, rec.state_after(keep)?);
        Ok(())
    }
}

/// Whether `states` are, in order, the rows 0, 1, ... of the one batch `group` names, as `link` reads a
/// state's row and batch.
fn in_order(
    states: &[&mut LinearState],
    group: &Arc<()>,
    link: impl Fn(&LinearState) -> Option<(usize, &Arc<()>)>,
) -> bool {
    states.iter().enumerate().all(|(i, st)| link(st).is_some_and(|(index, g)| index == i && Arc::ptr_eq(g, group)))
}

/// A verify pass over a sequence's caches, of which only a prefix may be kept: opened before the
/// forward of `n` tokens, settled after it by [`Verify::commit`] with the number kept. Attention
/// layers go back to their length at the start plus `kept`; linear-attention layers recompute
/// their state from what the pass recorded. Dropped without a commit (an error on the way), it
/// closes the recordings and leaves the caches as the forward left them.
pub struct Verify<'c> {
    cache: &'c mut [LayerCache],
    open: Open,
    /// Set by [`Verify::suspend`]: the recordings stay open for a later [`Open::resume`].
    suspended: bool,
}

/// A verify whose forward has been built but which is not settled yet, apart from the caches it
/// runs on ([`Verify::suspend`]): a cycle built ahead keeps it beside its own copy of the caches.
pub struct Open {
    tokens: usize,
    /// Each attention layer's offset at the start.
    starts: Vec<Option<i32>>,
}

impl<'c> Verify<'c> {
    /// Opens a verify of `tokens` tokens on `cache`.
    pub fn begin(cache: &'c mut [LayerCache], tokens: usize) -> Verify<'c> {
        let starts = cache
            .iter_mut()
            .map(|c| match c {
                LayerCache::Kv(kv) => Some(kv.offset),
                LayerCache::Linear(s) => {
                    s.verify = VerifyRecord::Open;
                    None
                }
            })
            .collect();
        Verify { cache, open: Open { tokens, starts }, suspended: false }
    }

    /// The caches, for the verify forward.
    pub fn cache(&mut self) -> &mut [LayerCache] {
        self.cache
    }

    /// Lets go of the caches after the forward, keeping the pass open: [`Open::resume`] over the same
    /// caches (or a copy of them) settles it later.
    pub fn suspend(mut self) -> Open {
        self.suspended = true;
        Open { tokens: self.open.tokens, starts: std::mem::take(&mut self.open.starts) }
    }
    /// Commits the verifies of one batched pass, `kept[i]` tokens for `verifies[i]`, as each one's
    /// [`Verify::commit`] would; where a linear-attention layer's recordings are the rows of one batched
    /// recording, in order, every row's state is gathered at once and left as one batch's rows (so the next
    /// batched forward takes it whole, [`LinearState::batched`]) instead of being sliced out row by row.
    pub fn commit_all(mut verifies: Vec<Verify<'_>>, kept: &[usize]) -> Result<()> {
        if kept.len() != verifies.len() {
            return Err(mlx::Error::Invalid(format!(
                "verify commit: {} counts for {} verifies",
                kept.len(),
                verifies.len()
            )));
        }
        for l in 0..verifies.first().map_or(0, |v| v.cache.len()) {
            let mut states: Vec<&mut LinearState> =
                verifies.iter_mut().filter_map(|v| v.cache.get_mut(l)?.as_linear()).collect();
            let Some(shared) = LinearState::recorded_batch(&states) else { continue };
            if let Some((conv, ssm)) = shared.kept_rows(kept)? {
                LinearState::set_rows(&mut states, &conv, &ssm)?;
                for st in states.iter_mut() {
                    st.verify = VerifyRecord::Kept;
                }
            }
        }
        for (verify, &k) in verifies.into_iter().zip(kept) {
            verify.commit(k)?;
        }
        Ok(())
    }

    /// Keeps the first `kept` tokens of the pass (`0..=tokens`) in every layer.
    pub fn commit(self, kept: usize) -> Result<()> {
        if kept > self.open.tokens {
            return Err(mlx::Error::Invalid(format!("verify commit: keep {kept} of {} tokens", self.open.tokens)));
        }
        for (c, start) in self.cache.iter_mut().zip(&self.open.starts) {
            match (c, start) {
                (LayerCache::Kv(kv), Some(start)) => {
                    if kv.offset != start + self.open.tokens as i32 {
                        return Err(mlx::Error::Invalid(format!(
                            "verify commit: an attention layer holds {} positions after a pass of {} from {start}",
                            kv.offset, self.open.tokens
                        )));
                    }
                    kv.offset = start + kept as i32;
                }
                (LayerCache::Linear(s), _) => s.keep(kept)?,
                (LayerCache::Kv(_), None) => {
                    return Err(mlx::Error::Invalid("verify commit: the cache changed kind".into()));
                }
            }
        }
        Ok(())
    }
}

impl Open {
    /// The verify again, over `cache`: the caches it was suspended from, or a copy of them.
    pub fn resume(self, cache: &mut [LayerCache]) -> Verify<'_> {
        Verify { cache, open: self, suspended: false }
    }

    /// A copy of `cache` (the caches this pass was built on) with every token of the pass kept and the
    /// pass closed: what [`Verify::commit`] of all of them leaves, while `cache` itself stays open.
    pub fn all_kept(&self, cache: &[LayerCache]) -> Result<Vec<LayerCache>> {
        let mut copy = cache.to_vec();
        Open { tokens: self.tokens, starts: self.starts.clone() }.resume(&mut copy).commit(self.tokens)?;
        Ok(copy)
    }
}

impl Drop for Verify<'_> {
    fn drop(&mut self) {
        if self.suspended {
            return;
        }
        for c in self.cache.iter_mut() {
            if let LayerCache::Linear(s) = c {
                s.verify = VerifyRecord::Closed;
            }
        }
    }
}

/// The state one decoder layer keeps.
#[derive(Clone)]
pub enum LayerCache {
    Kv(KvCache),
    Linear(LinearState),
}

impl LayerCache {
    pub fn as_kv(&mut self) -> Option<&mut KvCache> {
        match self {
            LayerCache::Kv(c) => Some(c),
            LayerCache::Linear(_) => None,
        }
    }
    pub fn as_linear(&mut self) -> Option<&mut LinearState> {
        match self {
            LayerCache::Linear(c) => Some(c),
            LayerCache::Kv(_) => None,
        }
    }
    /// Arrays held, for evaluating them together.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            LayerCache::Kv(c) => c.state().map(|(k, v)| vec![k, v]).unwrap_or_default(),
            LayerCache::Linear(s) => s.conv.iter().chain(s.ssm.iter()).collect(),
        }
    }

    /// What the layer remembers: valid keys and values, or the conv window and recurrent state.
    pub fn contents(&self) -> Result<Vec<Array>> {
        Ok(match self {
            LayerCache::Kv(c) => c.contents()?.map(|(k, v)| vec![k, v]).unwrap_or_default(),
            LayerCache::Linear(s) => s.conv.iter().chain(s.ssm.iter()).cloned().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx::Dtype;

    /// `[1, 2, t, 4]` rows numbered from `first`, so every position is told apart.
    fn rows(first: i32, t: i32) -> Array {
        let data: Vec<f32> = (0..2 * t * 4).map(|i| (first * 10_000 + i) as f32).collect();
        Array::from_slice(&data, &[1, 2, t, 4]).unwrap()
    }

    /// The batch's arrays are handed back whole only for every row of one batched forward, in order, none
    /// changed since; each state's own parts are its rows either way.
    #[test]
    fn batch_rows_are_taken_whole_only_when_unchanged_and_in_order() {
        let (conv, ssm) = (rows(1, 3).reshape(&[2, 1, 12]).unwrap(), rows(2, 1).reshape(&[2, 4, 1]).unwrap());
        let (mut a, mut b) = (LinearState::default(), LinearState::default());
        assert!(LinearState::batched(&[&mut a, &mut b]).is_none(), "no state yet");
        LinearState::set_rows(&mut [&mut a, &mut b], &conv, &ssm).unwrap();
        let values = |x: &Array| x.to_f32_vec().unwrap();
        let (c, s) = LinearState::batched(&[&mut a, &mut b]).expect("the whole batch, in order");
        assert_eq!((values(&c), values(&s)), (values(&conv), values(&ssm)));
        assert_eq!(values(b.conv().unwrap()), values(&conv.slice_axis(0, 1, 2).unwrap()));
        assert_eq!(values(b.ssm().unwrap()), values(&ssm.slice_axis(0, 1, 2).unwrap()));
        assert!(LinearState::batched(&[&mut b, &mut a]).is_none(), "another order");
        assert!(LinearState::batched(&[&mut a]).is_none(), "a sequence left");
        let mut c2 = LinearState::default();
        LinearState::set_rows(&mut [&mut c2, &mut LinearState::default()], &conv, &ssm).unwrap();
        assert!(LinearState::batched(&[&mut a, &mut c2]).is_none(), "rows of two batches");
        b.set(rows(5, 3).reshape(&[1, 1, 24]).unwrap(), rows(6, 1).reshape(&[1, 8, 1]).unwrap());
        assert!(LinearState::batched(&[&mut a, &mut b]).is_none(), "a state written since");
    }

    /// A batched pass of 3 sequences over 4 tokens (conv window 3, 2 channels; states 2×2×2) with its
    /// per-token states, every value distinct.
    fn batched_recording(with_steps: bool) -> Recording {
        let seq = |shape: &[i32], first: f32| {
            let n: i32 = shape.iter().product();
            Array::from_slice(&(0..n).map(|i| first + i as f32).collect::<Vec<_>>(), shape).unwrap()
        };
        let steps = seq(&[4, 3, 2, 2, 2], 1000.0);
        let zeros = Array::zeros(&[3, 4, 1, 1], Dtype::F32).unwrap();
        Recording {
            conv_input: seq(&[3, 7, 2], 0.0),
            inputs: Some([zeros.clone(), zeros.clone(), zeros.clone(), zeros.clone(), zeros]),
            initial: seq(&[3, 2, 2, 2], 500.0),
            final_state: steps.slice_axis(0, 3, 4).unwrap().squeeze(&[0]).unwrap(),
            steps: with_steps.then_some(steps),
        }
    }

    /// A pass whose kernel read q, k and v from the conv's output (`kernels::gated_delta_qkv`) records no inputs:
    /// its per-token states alone roll it back, to the states a recording with inputs gives; a recording with
    /// neither cannot roll back part of a pass.
    #[test]
    fn a_recording_without_inputs_rolls_back_by_its_steps() {
        let values = |x: Array| x.to_f32_vec().unwrap();
        let with = batched_recording(true);
        let without = Recording { inputs: None, ..batched_recording(true) };
        assert_eq!(without.len(), 4);
        for keep in 0..=4 {
            assert_eq!(values(without.state_after(keep).unwrap()), values(with.state_after(keep).unwrap()), "{keep}");
        }
        let row = without.row(1).unwrap();
        assert_eq!((row.len(), row.inputs.is_none()), (4, true));
        assert_eq!(values(row.state_after(2).unwrap()), values(with.row(1).unwrap().state_after(2).unwrap()));
        let neither = Recording { inputs: None, ..batched_recording(false) };
        assert!(neither.state_after(2).is_err());
    }

    /// Committing a batch's verifies at once leaves each sequence the state its own commit leaves, and
    /// (where the pass kept per-token states) as one batch's rows that the next forward takes whole.
    #[test]
    fn a_batched_commit_keeps_what_each_row_keeps_alone() {
        let values = |x: &Array| x.to_f32_vec().unwrap();
        for kept in [[1, 4, 2], [4, 4, 4], [3, 1, 1]] {
            for with_steps in [true, false] {
                // Each row alone: its own recording, its own commit.
                let rec = batched_recording(with_steps);
                let alone: Vec<(Vec<f32>, Vec<f32>)> = (0..3)
                    .map(|i| {
                        let verify = VerifyRecord::Recorded(rec.row(i).unwrap());
                        let mut st = LinearState { verify, ..Default::default() };
                        st.keep(kept[i]).unwrap();
                        (values(st.conv().unwrap()), values(st.ssm().unwrap()))
                    })
                    .collect();
                let mut caches: Vec<Vec<LayerCache>> =
                    (0..3).map(|_| vec![LayerCache::Linear(LinearState::default())]).collect();
                let mut verifies: Vec<Verify<'_>> = caches.iter_mut().map(|c| Verify::begin(c, 4)).collect();
                {
                    let mut states: Vec<&mut LinearState> =
                        verifies.iter_mut().map(|v| v.cache()[0].as_linear().unwrap()).collect();
                    LinearState::record(&mut states, batched_recording(with_steps));
                }
                Verify::commit_all(verifies, &kept).unwrap();
                let mut states: Vec<&mut LinearState> = caches.iter_mut().map(|c| c[0].as_linear().unwrap()).collect();
                for (i, st) in states.iter().enumerate() {
                    let got = (values(st.conv().unwrap()), values(st.ssm().unwrap()));
                    assert_eq!(got, alone[i], "kept {kept:?}, row {i}, per-token states {with_steps}");
                    assert!(matches!(st.verify, VerifyRecord::Closed));
                }
                // Gathered at once only from per-token states; otherwise each row was sliced alone.
                assert_eq!(LinearState::batched(&states).is_some(), with_steps, "kept {kept:?}");
                states.clear();
            }
        }
        // A row that keeps nothing goes back to the state before the pass: not gathered.
        assert!(batched_recording(true).kept_rows(&[0, 2, 2]).unwrap().is_none());
    }

    /// Across buffer growth, trims and rewrites, the cache holds exactly what a list of the written
    /// rows would (the reference is built by concatenation, the scheme the buffers replaced).
    #[test]
    fn kv_buffers_hold_exactly_the_kept_rows() {
        let mut cache = KvCache::default();
        let mut reference: Vec<Array> = Vec::new();
        let ops: &[(i32, i32)] = &[(7, 0), (1, 0), (240, 0), (4, 3), (20, 0), (1, 1), (300, 0), (3, 2), (1, 0)];
        for (i, &(t, trim)) in ops.iter().enumerate() {
            let x = rows(i as i32, t);
            let (k, v) = cache.update(&x, &x.multiply(&Array::f32(-1.0)).unwrap()).unwrap();
            reference.push(x);
            let want = concatenate(&reference.iter().collect::<Vec<_>>(), 2).unwrap();
            assert_eq!(k.shape(), want.shape(), "after op {i}");
            assert_eq!(k.to_f32_vec().unwrap(), want.to_f32_vec().unwrap(), "keys after op {i}");
            assert_eq!(
                v.to_f32_vec().unwrap(),
                want.multiply(&Array::f32(-1.0)).unwrap().to_f32_vec().unwrap(),
                "values after op {i}"
            );
            let (buf, _) = cache.state().unwrap();
            assert_eq!(buf.dim(2) % KV_STEP, 0, "capacity is whole steps");
            assert!(buf.dim(2) >= cache.offset);
            if trim > 0 {
                cache.trim(trim).unwrap();
                let whole = concatenate(&reference.iter().collect::<Vec<_>>(), 2).unwrap();
                let kept = whole.dim(2) - trim;
                reference = vec![whole.slice_axis(2, 0, kept).unwrap()];
                let (ck, _) = cache.contents().unwrap().unwrap();
                assert_eq!(ck.to_f32_vec().unwrap(), reference[0].to_f32_vec().unwrap(), "after trimming op {i}");
            }
        }
        assert_eq!(cache.offset, reference.iter().map(|a| a.dim(2)).sum::<i32>());
        assert_eq!(cache.state().unwrap().0.dtype(), Dtype::F32);
    }
}
