//! Per-sequence decoding state: KV caches for attention layers and the conv window and recurrent
//! state of linear-attention layers, with the snapshots that make speculative rollback exact.
//!
//! The model is read-only; every sequence owns one `LayerCache` per layer (and one KV cache per MTP
//! layer). Rolling back is a property of these types: `KvCache::trim` and `LinearState::rollback`.

use mlx::{concatenate, Array};

pub type Result<T> = std::result::Result<T, mlx::Error>;

/// Keys and values `[B, H, L, D]` of one attention layer.
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
    /// Appends `k`, `v` (`[B, H, T, D]`) and returns all keys and values so far.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let (keys, values) = match (&self.keys, &self.values) {
            (Some(pk), Some(pv)) => (concatenate(&[pk, k], 2)?, concatenate(&[pv, v], 2)?),
            _ => (k.clone(), v.clone()),
        };
        self.offset += k.dim(2);
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        Ok((keys, values))
    }

    /// Drops the last `n` positions.
    pub fn trim(&mut self, n: i32) -> Result<()> {
        let n = n.min(self.offset);
        if n == 0 {
            return Ok(());
        }
        self.offset -= n;
        let keep = self.offset;
        self.keys = self.keys.take().map(|k| k.slice_axis(2, 0, keep)).transpose()?;
        self.values = self.values.take().map(|v| v.slice_axis(2, 0, keep)).transpose()?;
        Ok(())
    }

    pub fn state(&self) -> Option<(&Array, &Array)> {
        self.keys.as_ref().zip(self.values.as_ref())
    }
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
    /// The recurrence's `q, k, v, decay, beta` for the pass's tokens (`[B, T, ...]`).
    pub inputs: [Array; 5],
    /// The recurrent state before the pass.
    pub initial: Array,
    /// The recurrent state after the whole pass.
    pub final_state: Array,
}

impl Recording {
    /// Tokens in the recorded pass.
    pub fn len(&self) -> usize {
        self.inputs[0].dim(1).max(0) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The recurrent state after the first `keep` tokens (`1 <= keep <= len`).
    fn state_after(&self, keep: usize) -> Result<Array> {
        if keep == self.len() {
            return Ok(self.final_state.clone());
        }
        let k = keep as i32;
        let [q, kk, v, decay, beta] = &self.inputs;
        let at = |a: &Array| a.slice_axis(1, 0, k);
        let (_, state) = mlx::fast::gated_delta_update(&at(q)?, &at(kk)?, &at(v)?, &at(decay)?, &at(beta)?, Some(&self.initial))?;
        Ok(state)
    }
}

/// The conv window `[B, K-1, C]` and recurrent state `[B, Hv, Dk, Dv]` (f32) of one Gated DeltaNet layer.
#[derive(Clone, Default)]
pub struct LinearState {
    pub conv: Option<Array>,
    pub ssm: Option<Array>,
    /// When set, the next forward pass records per-position snapshots here.
    pub recording: Option<Recording>,
    pub record_next: bool,
}

impl LinearState {
    /// Keeps the state after the first `keep` tokens of the recorded pass (`keep >= 1`).
    pub fn rollback(&mut self, keep: usize, kernel: i32) -> Result<()> {
        let rec = self.recording.take().ok_or_else(|| mlx::Error::Invalid("rollback without a recorded pass".into()))?;
        if keep == 0 || keep > rec.len() {
            return Err(mlx::Error::Invalid(format!("rollback to {keep} of {} recorded tokens", rec.len())));
        }
        let k = keep as i32;
        // After tokens 0..keep, the window is the K-1 rows ending at that pass's row keep-1,
        // i.e. conv_input[keep : keep + K - 1].
        self.conv = Some(rec.conv_input.slice_axis(1, k, k + kernel - 1)?);
        self.ssm = Some(rec.state_after(keep)?);
        Ok(())
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
}
