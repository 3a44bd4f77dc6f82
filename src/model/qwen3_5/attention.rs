//! Gated full attention of Qwen3.5 (docs/MODEL.md §3.3): per-head interleaved query and gate, q/k
//! norms, partial RoPE (or explicit M-RoPE after images), GQA.

use mlx::Array;

use super::{mlx_err, Config};
use crate::cache::KvCache;
use crate::kernels::{attention, attention_front as front, rope};
use crate::model::layers::{causal_attention, Fused, Linear, MRope, Result, RmsNorm, Tap};
use crate::model::parallel::{Cut, Parallel};
use crate::model::store::Store;
use crate::model::LoadError;

/// Gated full attention: per-head interleaved query and gate, q/k norms, partial RoPE, GQA.
pub struct Attention {
    /// q_proj (query and gate), k_proj, v_proj over the same input.
    qkv: Fused,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    hd: i32,
    rope_dims: i32,
    rope_theta: f32,
    /// Shows calibration the projections' inputs (`layers.3.self_attn.*`).
    tap: Tap,
}

impl Attention {
    pub(super) fn load(
        s: &Store,
        p: &str,
        c: &Config,
        norms: &dyn Fn(&str, i32) -> std::result::Result<RmsNorm, LoadError>,
        tap: Tap,
        tp: Option<&Parallel>,
    ) -> std::result::Result<Self, LoadError> {
        let (d, hq, hkv, hd) =
            (c.text.hidden_size, c.text.num_attention_heads, c.text.num_key_value_heads, c.text.head_dim);
        // With `tp`, this rank's query heads (query and gate rows, interleaved per head) and the
        // key/value heads they read: contiguous blocks, as GQA maps query head j to key head j / (hq / hkv).
        let ((q0, q1), (k0, k1)) = match tp {
            Some(tp) => (tp.share(hq, "num_attention_heads")?, tp.share(hkv, "num_key_value_heads")?),
            None => ((0, hq), (0, hkv)),
        };
        let (q_cut, kv_cut, o_cut) = match tp {
            Some(_) => (
                Cut::Rows(vec![(2 * q0 * hd, 2 * q1 * hd)]),
                Cut::Rows(vec![(k0 * hd, k1 * hd)]),
                Cut::Cols(q0 * hd, q1 * hd),
            ),
            None => (Cut::All, Cut::All, Cut::All),
        };
        let q = s.linear_cut(&format!("{p}.q_proj"), 2 * hq * hd, d, &q_cut)?;
        let k = s.linear_cut(&format!("{p}.k_proj"), hkv * hd, d, &kv_cut)?;
        let v = s.linear_cut(&format!("{p}.v_proj"), hkv * hd, d, &kv_cut)?;
        let o_proj = s.linear_cut(&format!("{p}.o_proj"), d, hq * hd, &o_cut)?;
        Ok(Attention {
            qkv: Fused::new(vec![q, k, v]).map_err(|e| mlx_err(p, e))?,
            o_proj,
            q_norm: norms(&format!("{p}.q_norm.weight"), hd)?,
            k_norm: norms(&format!("{p}.k_norm.weight"), hd)?,
            hd,
            rope_dims: c.rope_dims,
            rope_theta: c.rope_theta,
            tap,
        })
    }

    /// Attention over `x` `[B, T, D]` for B sequences, each with its own cache (`caches[i]` is row
    /// i's): the projections run once over all rows, and text RoPE too (each row at its own
    /// position); the cache write and the attention itself are each sequence's own (their lengths
    /// differ).
    pub(super) fn forward(&self, x: &Array, caches: &mut [&mut KvCache], rope: Option<&MRope>) -> Result<Array> {
        let b = x.dim(0);
        if caches.len() != b as usize {
            return Err(mlx::Error::Invalid(format!("attention: {} caches for {b} sequences", caches.len())));
        }
        self.tap.see_all(&["q_proj", "k_proj", "v_proj"], x);
        let mut proj = self.qkv.forward(x)?.into_iter();
        let mut next =
            || proj.next().ok_or_else(|| mlx::Error::Invalid("fused projection returned too few parts".into()));
        let (qg, k, v) = (next()?, next()?, next()?);
        // Text positions: the norms, RoPE (each row at its own position) and the moves to heads in one place
        // (kernels::attention_front: one launch on CUDA); after images, M-RoPE per sequence.
        let front::Heads { q, k, v, gate } = if rope.is_none() {
            // After images, text positions run `rope_delta` behind (or ahead of) the token count.
            let pos: Vec<i32> = caches.iter().map(|c| c.offset + c.rope_delta).collect();
            front::front(&qg, &k, &v, &Array::from_slice(&pos, &[b])?, &self.front())?
        } else {
            front::heads(&qg, &k, &v, &self.front())?
        };
        let o = if let [cache] = caches {
            let (q, k) = match rope {
                Some(r) => (r.apply(&q)?, r.apply(&k)?),
                None => (q, k),
            };
            self.attend(&q, &k, &v, cache)?
        } else {
            // Each tensor's rows by one split (one operation, where a slice per row was one each).
            let (qs, ks, vs) = (q.split(b, 0)?, k.split(b, 0)?, v.split(b, 0)?);
            let rows = caches
                .iter_mut()
                .zip(qs.iter().zip(&ks).zip(&vs))
                .map(|(cache, ((q, k), v))| match rope {
                    Some(r) => self.attend(&r.apply(q)?, &r.apply(k)?, v, cache),
                    None => self.attend(q, k, v, cache),
                })
                .collect::<Result<Vec<_>>>()?;
            mlx::concatenate(&rows.iter().collect::<Vec<_>>(), 0)?
        };
        let o = front::gate(&o, &qg, gate.as_ref())?;
        self.tap.see("o_proj", &o);
        self.o_proj.forward(&o)
    }

    /// The cache's part of [`Attention::forward`] alone, for one sequence and text positions: the keys and
    /// values of `x` `[1, T, D]` written at the cache's next positions, the bits the whole pass writes (the
    /// same rows of the same products, norm and RoPE), with no attention or output (and no queries, unless the
    /// front kernel is taken). For positions whose output nobody reads (the MTP head catching up on them).
    pub(super) fn write_cache(&self, x: &Array, cache: &mut KvCache) -> Result<()> {
        self.tap.see_all(&["q_proj", "k_proj", "v_proj"], x);
        let pos = Array::from_slice(&[cache.offset + cache.rope_delta], &[1])?;
        if front::taken(x.dtype()) {
            // Where whole passes take the front kernel, its keys: the query projection is computed too (a
            // device cost of one more product, against the ~10 operations of the fallback's keys).
            let mut proj = self.qkv.forward(x)?.into_iter();
            let mut next =
                || proj.next().ok_or_else(|| mlx::Error::Invalid("fused projection returned too few parts".into()));
            let (qg, k, v) = (next()?, next()?, next()?);
            let heads = front::front(&qg, &k, &v, &pos, &self.front())?;
            return cache.append(&heads.k, &heads.v);
        }
        let mut proj = self.qkv.forward_tail(x, 1)?.into_iter();
        let mut next =
            || proj.next().ok_or_else(|| mlx::Error::Invalid("fused projection returned too few parts".into()));
        let (k, v) = (next()?, next()?);
        let (k, v) = front::key_value_heads(&k, &v, &self.front())?;
        cache.append(&rope::rope(&k, self.rope_dims, self.rope_theta, &pos)?, &v)
    }

    /// What [`front::front`] needs of this layer.
    fn front(&self) -> front::Front<'_> {
        front::Front {
            q_scale: &self.q_norm.scale,
            k_scale: &self.k_norm.scale,
            eps: self.q_norm.eps,
            rope_dims: self.rope_dims,
            rope_theta: self.rope_theta,
        }
    }

    /// One sequence's part after RoPE: its cache extended, attention over its keys.
    fn attend(&self, q: &Array, k: &Array, v: &Array, cache: &mut KvCache) -> Result<Array> {
        cache.append(k, v)?;
        let scale = 1.0 / (self.hd as f32).sqrt();
        // On CUDA and on MLX's CPU a kernel reads the cache's buffers where they lie (kernels::attention);
        // elsewhere attention reads views of the valid positions.
        match cache.state() {
            Some((kb, vb)) if attention::selected(q, kb, vb, cache.offset) => {
                attention::cuda(q, kb, vb, cache.offset, scale)
            }
            Some((kb, vb)) if attention::host_selected(q, kb, vb, cache.offset) => {
                attention::host(q, kb, vb, cache.offset, scale)
            }
            _ => {
                let (keys, values) =
                    cache.contents()?.ok_or_else(|| mlx::Error::Invalid("attention: an empty KV cache".into()))?;
                causal_attention(q, &keys, &values, scale)
            }
        }
    }
}
