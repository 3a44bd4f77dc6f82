//! One Qwen3.5 decoder layer: a mixer (Gated DeltaNet or gated attention) and the SwiGLU MLP, each
//! behind its RMSNorm with a residual. The MTP head's layer is one of these (full attention).

use std::sync::Arc;

use mlx::Array;

use super::attention::Attention;
use super::gated_deltanet::GatedDeltaNet;
use super::{mlx_err, Config};
use crate::cache::{KvCache, LayerCache};
use crate::model::layers::{MRope, Mlp, Observer, Result, RmsNorm, Tap};
use crate::model::parallel::{Cut, Parallel};
use crate::model::store::Store;
use crate::model::LoadError;

enum Mixer {
    Linear(GatedDeltaNet),
    Attention(Attention),
}

pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    mixer: Mixer,
    mlp: Mlp,
    /// Set when the layer holds one rank's share: the MLP's down_proj output is a partial sum.
    tp: Option<Parallel>,
}

impl DecoderLayer {
    /// Loads layer `p` (`layers.3`, `mtp.layers.0`); `norms` loads its RMSNorms in the convention
    /// the caller decided, and `observer` sees its linear layers' inputs; with `tp`, only this
    /// rank's share of its heads and MLP columns is kept (`model::parallel`).
    pub fn load(
        s: &Store,
        p: &str,
        c: &Config,
        full: bool,
        norms: &dyn Fn(&str, i32) -> std::result::Result<RmsNorm, LoadError>,
        observer: &Arc<Observer>,
        tp: Option<&Parallel>,
    ) -> std::result::Result<Self, LoadError> {
        let (d, i) = (c.text.hidden_size, c.text.intermediate_size);
        let mixer = if full {
            let p = format!("{p}.self_attn");
            Mixer::Attention(Attention::load(s, &p, c, norms, Tap::new(observer, &p), tp)?)
        } else {
            let p = format!("{p}.linear_attn");
            Mixer::Linear(GatedDeltaNet::load(s, &p, c, Tap::new(observer, &p), tp)?)
        };
        let (rows, cols) = match tp {
            Some(tp) => {
                let (i0, i1) = tp.share(i, "intermediate_size")?;
                (Cut::Rows(vec![(i0, i1)]), Cut::Cols(i0, i1))
            }
            None => (Cut::All, Cut::All),
        };
        let mlp = Mlp::new(
            s.linear_cut(&format!("{p}.mlp.gate_proj"), i, d, &rows)?,
            s.linear_cut(&format!("{p}.mlp.up_proj"), i, d, &rows)?,
            s.linear_cut(&format!("{p}.mlp.down_proj"), d, i, &cols)?,
            Tap::new(observer, &format!("{p}.mlp")),
        )
        .map_err(|e| mlx_err(p, e))?;
        Ok(DecoderLayer {
            input_layernorm: norms(&format!("{p}.input_layernorm.weight"), d)?,
            post_attention_layernorm: norms(&format!("{p}.post_attention_layernorm.weight"), d)?,
            mixer,
            mlp,
            tp: tp.cloned(),
        })
    }

    pub fn forward(
        &self,
        h: &Array,
        pending: Option<&Array>,
        cache: &mut LayerCache,
        rope: Option<&MRope>,
    ) -> Result<(Array, Array)> {
        self.forward_batch(h, pending, &mut [cache], rope)
    }

    /// The layer over the residual stream `h` `[B, T, D]` for B sequences, `caches[i]` holding row i's
    /// state. `pending` is a sum not yet added to `h` (the previous layer's MLP output): its add runs in
    /// this layer's input norm's launch. Returns the stream after the mixer's residual, and this
    /// layer's MLP output, pending in turn (the caller adds it: [`RmsNorm::forward_pending`]).
    pub fn forward_batch(
        &self,
        h: &Array,
        pending: Option<&Array>,
        caches: &mut [&mut LayerCache],
        rope: Option<&MRope>,
    ) -> Result<(Array, Array)> {
        let (h, x) = self.input_layernorm.forward_pending(h, pending)?;
        let mismatch = || mlx::Error::Invalid("cache kind does not match the layer kind".into());
        let mixed = match &self.mixer {
            Mixer::Attention(a) => {
                let mut kv = caches.iter_mut().map(|c| c.as_kv()).collect::<Option<Vec<_>>>().ok_or_else(mismatch)?;
                a.forward(&x, &mut kv, rope)?
            }
            Mixer::Linear(l) => {
                let mut st =
                    caches.iter_mut().map(|c| c.as_linear()).collect::<Option<Vec<_>>>().ok_or_else(mismatch)?;
                l.forward(&x, &mut st)?
            }
        };
        let (h, x) = self.post_attention_layernorm.forward_residual(&h, &self.reduced(mixed)?)?;
        Ok((h, self.reduced(self.mlp.forward(&x)?)?))
    }

    /// Only what [`DecoderLayer::forward`] leaves in an attention layer's cache for the residual stream `h`
    /// `[1, T, D]` (see [`Attention::write_cache`]); nothing for its output.
    pub fn write_cache(&self, h: &Array, cache: &mut KvCache) -> Result<()> {
        let (_, x) = self.input_layernorm.forward_pending(h, None)?;
        match &self.mixer {
            Mixer::Attention(a) => a.write_cache(&x, cache),
            Mixer::Linear(_) => Err(mlx::Error::Invalid("write_cache: a linear-attention layer".into())),
        }
    }

    /// A sublayer's output, summed over the ranks when each holds a partial one.
    fn reduced(&self, out: Array) -> Result<Array> {
        match &self.tp {
            Some(tp) => tp.reduce(&out),
            None => Ok(out),
        }
    }
}
