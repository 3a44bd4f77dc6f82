//! A sequence's state after its first `len` tokens, copied out of its caches and restored into
//! fresh ones: what the engine's prefix cache keeps (docs/MODEL.md §4.6).
//!
//! Attention KV can be cut at any length, the Gated DeltaNet state cannot: a snapshot is usable at
//! exactly `len`. The KV rows are cut into `block`-token segments so that a store can keep each
//! whole block once for every snapshot of a conversation that shares it.

use mlx::{concatenate, Array};

use super::{KvCache, LayerCache, LinearState, Result, KV_STEP};

/// Rows `[B, H, n, D]` of one KV cache, in segments: `whole` segments of one block each, then the
/// rest when there is one.
#[derive(Clone, Debug)]
pub struct Rows {
    pub keys: Vec<Array>,
    pub values: Vec<Array>,
    pub rope_delta: i32,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.keys.iter().map(|k| k.dim(2).max(0) as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A KV cache holding these rows, in a new buffer with room for the next tokens: decoding
    /// after a restore writes into that buffer, never into the stored segments.
    pub fn restore(&self) -> Result<KvCache> {
        let offset = self.len() as i32;
        let Some(first) = self.keys.first() else {
            return Ok(KvCache { rope_delta: self.rope_delta, ..KvCache::default() });
        };
        let capacity = (offset / KV_STEP + 1) * KV_STEP;
        let buffer = |parts: &[Array]| -> Result<Array> {
            let spare = Array::zeros(&[first.dim(0), first.dim(1), capacity - offset, first.dim(3)], first.dtype())?;
            let mut refs: Vec<&Array> = parts.iter().collect();
            refs.push(&spare);
            concatenate(&refs, 2)
        };
        Ok(KvCache::from_buffers(buffer(&self.keys)?, buffer(&self.values)?, offset, self.rope_delta))
    }
}

/// What one decoder layer contributes to a snapshot.
#[derive(Clone, Debug)]
pub enum LayerSnapshot {
    Kv(Rows),
    /// The conv window and recurrent state after exactly `len` tokens.
    Linear {
        conv: Array,
        ssm: Array,
    },
}

/// A sequence's state after `len` tokens.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub len: usize,
    /// Tokens per KV segment (see [`Rows`]).
    pub block: usize,
    pub layers: Vec<LayerSnapshot>,
    /// The MTP head's KV cache: one entry per pair (h_i, x_{i+1}) inside the prefix, so `len - 1`,
    /// cut where the pairs' next tokens cross a block boundary (entry i lies in block
    /// `(i + 1) / block`). None when taken without MTP.
    pub mtp: Option<Rows>,
    /// The post-norm hidden state `[1, 1, D]` at the last position: it samples the next token when
    /// the whole prompt is cached, and pairs with the next token for the MTP head.
    pub last_hidden: Array,
}

impl Snapshot {
    /// Copies the state of `cache` (and of the MTP head's cache `mtp`, which must hold `len - 1`
    /// entries) after `len` tokens. The copies share nothing with the live buffers: decoding goes
    /// on writing into those in place.
    pub fn take(
        cache: &[LayerCache],
        mtp: Option<&KvCache>,
        last_hidden: &Array,
        len: usize,
        block: usize,
    ) -> Result<Snapshot> {
        Snapshot::take_after(None, cache, mtp, last_hidden, len, block)
    }

    /// [`Snapshot::take`] that shares `prev`'s whole KV segments (the same sequence, shorter,
    /// taken by this call too: prefill never rewrites rows it has written) and copies only the rows
    /// after them, so snapshots along one prompt cost its KV once, not once per snapshot.
    pub fn take_after(
        prev: Option<&Snapshot>,
        cache: &[LayerCache],
        mtp: Option<&KvCache>,
        last_hidden: &Array,
        len: usize,
        block: usize,
    ) -> Result<Snapshot> {
        let prev = prev.filter(|p| p.block == block.max(1) && p.len <= len && p.layers.len() == cache.len());
        let block = block.max(1);
        let invalid = |what: String| mlx::Error::Invalid(format!("prefix snapshot at {len} tokens: {what}"));
        let mut layers = Vec::with_capacity(cache.len());
        for (i, c) in cache.iter().enumerate() {
            layers.push(match c {
                LayerCache::Kv(kv) => {
                    if kv.offset as usize != len {
                        return Err(invalid(format!("an attention layer holds {} positions", kv.offset)));
                    }
                    let before = prev.and_then(|p| match &p.layers[i] {
                        LayerSnapshot::Kv(rows) => Some(rows),
                        LayerSnapshot::Linear { .. } => None,
                    });
                    LayerSnapshot::Kv(cut_after(kv, &bounds(len, block, 0), before)?)
                }
                LayerCache::Linear(s) => {
                    let (Some(conv), Some(ssm)) = (&s.conv, &s.ssm) else {
                        return Err(invalid("a linear-attention layer has no state".into()));
                    };
                    LayerSnapshot::Linear { conv: detach(conv)?, ssm: detach(ssm)? }
                }
            });
        }
        let mtp = match mtp {
            Some(head) if head.offset as usize + 1 == len => {
                Some(cut_after(head, &bounds(len - 1, block, 1), prev.and_then(|p| p.mtp.as_ref()))?)
            }
            Some(head) => return Err(invalid(format!("the MTP head holds {} entries", head.offset))),
            None => None,
        };
        let snapshot = Snapshot { len, block, layers, mtp, last_hidden: detach(last_hidden)? };
        mlx::device::eval(&snapshot.arrays())?;
        Ok(snapshot)
    }

    /// Fresh caches holding this state: the body's, and the MTP head's when the snapshot has it.
    pub fn restore(&self) -> Result<(Vec<LayerCache>, Option<KvCache>)> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    LayerSnapshot::Kv(rows) => LayerCache::Kv(rows.restore()?),
                    // Shared, not copied: the next forward reads them and writes new arrays.
                    LayerSnapshot::Linear { conv, ssm } => {
                        LayerCache::Linear(LinearState::with_state(conv.clone(), ssm.clone()))
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mtp = self.mtp.as_ref().map(Rows::restore).transpose()?;
        Ok((layers, mtp))
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = vec![&self.last_hidden];
        for l in &self.layers {
            match l {
                LayerSnapshot::Kv(rows) => out.extend(rows.keys.iter().chain(&rows.values)),
                LayerSnapshot::Linear { conv, ssm } => out.extend([conv, ssm]),
            }
        }
        if let Some(rows) = &self.mtp {
            out.extend(rows.keys.iter().chain(&rows.values));
        }
        out
    }

    /// Bytes held (every array is its own buffer).
    pub fn bytes(&self) -> usize {
        self.arrays().iter().map(|a| a.nbytes()).sum()
    }

    /// Bytes of the linear states, the last hidden state and the KV rows past the last whole block:
    /// what belongs to this snapshot alone.
    pub fn own_bytes(&self) -> usize {
        let whole = self.len / self.block;
        let tail = |rows: &Rows| -> usize {
            rows.keys.iter().skip(whole).chain(rows.values.iter().skip(whole)).map(|a| a.nbytes()).sum()
        };
        let mut n = self.last_hidden.nbytes();
        for l in &self.layers {
            n += match l {
                LayerSnapshot::Kv(rows) => tail(rows),
                LayerSnapshot::Linear { conv, ssm } => conv.nbytes() + ssm.nbytes(),
            };
        }
        n + self.mtp.as_ref().map_or(0, tail)
    }

    /// Whether it holds the MTP head's cache.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }
}

/// Segment bounds over `n` rows: whole blocks, shifted `shift` rows earlier (the MTP head's entry
/// i belongs with token i + 1), then the rest.
fn bounds(n: usize, block: usize, shift: usize) -> Vec<usize> {
    let mut b = vec![0];
    let mut next = block - shift.min(block - 1);
    while next < n {
        b.push(next);
        next += block;
    }
    if n > 0 {
        b.push(n);
    }
    b
}

/// The rows of `kv` between consecutive `bounds`, each copied into its own buffer.
fn cut(kv: &KvCache, bounds: &[usize]) -> Result<Rows> {
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    if let Some((k, v)) = kv.state() {
        for w in bounds.windows(2) {
            let (a, b) = (w[0] as i32, w[1] as i32);
            keys.push(detach(&k.slice_axis(2, a, b)?)?);
            values.push(detach(&v.slice_axis(2, a, b)?)?);
        }
    }
    Ok(Rows { keys, values, rope_delta: kv.rope_delta })
}

/// [`cut`], sharing the segments of `prev` (rows of the same cache, cut along the same `bounds`
/// up to its length) and copying only the rows after them; all of it when `prev`'s length is not
/// one of `bounds`.
fn cut_after(kv: &KvCache, bounds: &[usize], prev: Option<&Rows>) -> Result<Rows> {
    let Some((p, at)) = prev.and_then(|p| bounds.iter().position(|&b| b == p.len()).map(|at| (p, at))) else {
        return cut(kv, bounds);
    };
    if p.keys.len() != at {
        return cut(kv, bounds);
    }
    let rest = cut(kv, &bounds[at..])?;
    let keys = p.keys.iter().cloned().chain(rest.keys).collect();
    let values = p.values.iter().cloned().chain(rest.values).collect();
    Ok(Rows { keys, values, rope_delta: kv.rope_delta })
}

/// A copy of `a` in a new buffer. A slice is a view of its source (it would keep the whole buffer
/// alive, and stop MLX from updating that buffer in place); an elementwise op writes a new one
/// while the source is still referenced, and multiplying by one changes no value.
fn detach(a: &Array) -> Result<Array> {
    a.multiply(&Array::scalar(1.0, a.dtype())?)
}

#[cfg(test)]
mod tests;
