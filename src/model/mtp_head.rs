//! The MTP head of a Qwen3.5 checkpoint, in one place for the loader, the catalog and the converter:
//! which tensors it has ([`MTP_TENSORS`]), whether the files hold one that can run ([`HeadFiles`],
//! the one verdict on presence), how its seven norms are stored (`convention`, from provenance facts
//! and statistics), the head itself ([`MtpHead`]) and the probe that measures it (`probe`).
//!
//! Math (docs/MODEL.md §4.1): `u = fc([pre_fc_norm_embedding(E[x_{t+1}]), pre_fc_norm_hidden(h_t)])`,
//! one full-attention decoder layer with its own KV cache, then `mtp.norm`; logits through the body's
//! head. `h_t` is the body's post-final-norm hidden state.

pub mod convention;
pub mod probe;

use std::collections::BTreeMap;
use std::sync::Arc;

use mlx::{concatenate, Array};

use self::convention::{HeadDecision, HeadOrigin, NormStat, Reference, Stored};
use super::layers::{Linear, Observer, Result, RmsNorm, Tap};
use super::qwen3_5::{Config, DecoderLayer, TextConfig};
use super::store::{Provenance, Store};
use super::weights::{Layout, Shard};
use super::LoadError;
use crate::cache::{KvCache, LayerCache};

/// The names of the 15 logical tensors of a one-layer MTP head (docs/MODEL.md §2.5), without `mtp.`.
pub const MTP_TENSORS: [&str; 15] = [
    "fc.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
];

/// The 7 zero-centred norms of the MTP head.
pub const MTP_NORMS: [&str; 7] = [
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight",
];

/// What the files hold of the head, judged from the config and the tensor names alone.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadFiles {
    pub declared_layers: usize,
    /// How many of the 15 logical head tensors are present.
    pub tensors_found: usize,
    /// `mtp.*` tensors of any name (including scales and biases).
    pub tensors_present: usize,
    /// Why no head can run (None: the head is complete and supported).
    pub reason: Option<String>,
}

impl HeadFiles {
    /// `has` answers whether a canonical name (`mtp.fc.weight`) is stored; `present` counts the
    /// stored `mtp.*` tensors.
    pub fn judge(text: &TextConfig, has: &dyn Fn(&str) -> bool, present: usize) -> HeadFiles {
        let declared = text.mtp_num_hidden_layers;
        let missing: Vec<&str> = MTP_TENSORS.iter().filter(|n| !has(&format!("mtp.{n}"))).copied().collect();
        let reason = if declared == 0 && present > 0 {
            Some(format!("config declares no MTP layers; ignoring {present} mtp.* tensors"))
        } else if declared == 0 {
            Some("the model has no MTP head".into())
        } else if declared > 1 || text.mtp_use_dedicated_embeddings {
            Some(format!(
                "unsupported MTP head ({declared} layers, dedicated embeddings {})",
                text.mtp_use_dedicated_embeddings
            ))
        } else {
            missing.first().map(|first| {
                format!(
                    "config declares {declared} MTP layer(s) but the checkpoint lacks {} of its {} tensors (e.g. mtp.{first}); MTP is off",
                    missing.len(),
                    MTP_TENSORS.len()
                )
            })
        };
        HeadFiles {
            declared_layers: declared,
            tensors_found: MTP_TENSORS.len() - missing.len(),
            tensors_present: present,
            reason,
        }
    }

    pub fn complete(&self) -> bool {
        self.reason.is_none()
    }
}

/// How the head's seven norms are stored (see `convention`): the head's origin from names and
/// files (`entries`: canonical name, provenance, file of every tensor), the norms' statistics
/// (`stat` reads one stored norm by canonical name), and the body's final norm as the yardstick.
pub fn norm_decision<'a, E>(
    layout: Layout,
    entries: impl IntoIterator<Item = (&'a str, Provenance, &'a Shard)>,
    stat: &dyn Fn(&str) -> std::result::Result<NormStat, E>,
) -> std::result::Result<HeadDecision, E> {
    let origin = convention::head_origin(layout, entries);
    let body = stat("norm.weight")?;
    let scale = body.mean + 1.0 - Stored::declared_by(body.provenance).offset();
    let reference = Reference { key: body.key, file: body.file, scale };
    let norms = MTP_NORMS.iter().map(|n| stat(&format!("mtp.{n}"))).collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(convention::decide(origin, norms, &reference))
}

/// [`norm_decision`] over a loader's store.
pub fn store_decision(s: &Store) -> std::result::Result<HeadDecision, LoadError> {
    norm_decision(s.layout, s.entries(), &|name| {
        let (key, file) = s.origin(name).ok_or_else(|| LoadError::Missing(name.to_string()))?;
        let provenance = s.provenance(name).ok_or_else(|| LoadError::Missing(name.to_string()))?;
        Ok(NormStat {
            name: name.to_string(),
            key: key.to_string(),
            file: file.to_path_buf(),
            provenance,
            mean: s.mean(name)?,
        })
    })
}

/// Whether the head loaded, and if not, why; plus what the loader checked of its norms and what
/// the probe measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MtpStatus {
    pub declared_layers: usize,
    pub tensors_found: usize,
    pub loaded: bool,
    /// Why the head is not running (None when it loaded).
    pub reason: Option<String>,
    /// Set when a norm convention was repaired at load time.
    pub repaired: Option<String>,
    /// What the load-time probe measured (None when nothing was probed).
    pub probe: Option<probe::ProbeReport>,
    /// How the running head's norms are read (None when no head runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<NormPlan>,
}

/// How each of the head's seven norms is taken to be stored, by canonical name (`mtp.norm.weight`).
pub type NormPlan = BTreeMap<String, Stored>;

pub struct MtpHead {
    fc: Linear,
    pre_fc_norm_embedding: RmsNorm,
    pre_fc_norm_hidden: RmsNorm,
    layer: DecoderLayer,
    norm: RmsNorm,
    /// Shows calibration `mtp.fc`'s input.
    tap: Tap,
}

impl MtpHead {
    /// Loads the head with its norms read as `plan` says they are stored (zero-centred where it
    /// says nothing): the scale is the stored value plus `1 - offset`.
    pub fn load(
        s: &Store,
        c: &Config,
        plan: &NormPlan,
        observer: &Arc<Observer>,
    ) -> std::result::Result<Self, LoadError> {
        let eps = c.text.rms_norm_eps;
        let norms = |name: &str, dim: i32| {
            let stored = plan.get(name).copied().unwrap_or(Stored::ZeroCentred);
            s.norm_added(name, dim, eps, 1.0 - stored.offset())
        };
        let d = c.text.hidden_size;
        Ok(MtpHead {
            fc: s.linear("mtp.fc", d, 2 * d, false)?,
            pre_fc_norm_embedding: norms("mtp.pre_fc_norm_embedding.weight", d)?,
            pre_fc_norm_hidden: norms("mtp.pre_fc_norm_hidden.weight", d)?,
            // Replicated: every rank drafts the same tokens.
            layer: DecoderLayer::load(s, "mtp.layers.0", c, true, &norms, observer, None)?,
            norm: norms("mtp.norm.weight", d)?,
            tap: Tap::new(observer, "mtp"),
        })
    }

    /// One step: for the embedded token `x_{t+1}` and post-norm hidden `h_t`, the head's normed
    /// output (which both feeds the next draft and gives the logits).
    pub fn forward(&self, embedded: &Array, hidden: &Array, cache: &mut KvCache) -> Result<Array> {
        self.forward_batch(embedded, hidden, &mut [cache])
    }

    /// What [`forward`](Self::forward) over `[1, T, D]` leaves in `cache`, and nothing else: the pairs'
    /// keys and values, without the attention, MLP and norm whose output only the last pair's draft reads
    /// (a catch-up after a park, the prompt's pairs in prefill). The same rows through the same products, so
    /// the cache holds the bits a whole pass writes.
    pub fn write_cache(&self, embedded: &Array, hidden: &Array, cache: &mut KvCache) -> Result<()> {
        self.layer.write_cache(&self.fused_input(embedded, hidden)?, cache)
    }

    /// `fc` over the normed embedding and hidden state side by side: the layer's input.
    fn fused_input(&self, embedded: &Array, hidden: &Array) -> Result<Array> {
        let e = self.pre_fc_norm_embedding.forward(embedded)?;
        let hh = self.pre_fc_norm_hidden.forward(hidden)?;
        let cat = concatenate(&[&e, &hh], -1)?;
        self.tap.see("fc", &cat);
        self.fc.forward(&cat)
    }

    /// [`forward`](Self::forward) over `[B, T, D]` for B sequences, `caches[i]` being row i's own
    /// head cache (their lengths may differ): the projections run once for all rows, attention per
    /// row at its own offset, as the body's `forward_batch` does. One cache runs the single ops.
    pub fn forward_batch(&self, embedded: &Array, hidden: &Array, caches: &mut [&mut KvCache]) -> Result<Array> {
        let u = self.fused_input(embedded, hidden)?;
        // The layer takes layer caches: each row's cache moves in and back out, also on an error.
        let mut lcs: Vec<LayerCache> = caches.iter_mut().map(|c| LayerCache::Kv(std::mem::take(*c))).collect();
        let u = {
            let mut refs: Vec<&mut LayerCache> = lcs.iter_mut().collect();
            self.layer.forward_batch(&u, None, &mut refs, None)
        };
        for (cache, lc) in caches.iter_mut().zip(lcs) {
            if let LayerCache::Kv(c) = lc {
                **cache = c;
            }
        }
        let (h, m) = u?;
        Ok(self.norm.forward_residual(&h, &m)?.1)
    }
}

/// The plan the names and statistics decided.
pub fn plan_of(decision: &HeadDecision) -> NormPlan {
    decision.norms.iter().map(|n| (n.stat.name.clone(), n.stored)).collect()
}

/// Whether the head's provenance is a fact (written with its body, names and statistics agree) or
/// only a claim that the probe must check against the alternatives.
pub fn provenance_is_fact(decision: &HeadDecision) -> bool {
    matches!(decision.origin, HeadOrigin::WithBody) && decision.repaired.is_none() && decision.doubt.is_none()
}

/// A head as the loader found it.
pub struct Loaded {
    pub head: Option<MtpHead>,
    pub status: MtpStatus,
    /// What names and statistics decided of its norms (None without a complete head).
    pub decision: Option<HeadDecision>,
}

/// Loads the head if the config declares one and the files hold all of it, its norms as names and
/// statistics decide (see `convention`); a head shifted twice does not run. Tensors of a head that
/// does not load are marked as deliberately unused.
pub fn load(s: &Store, c: &Config, observer: &Arc<Observer>) -> std::result::Result<Loaded, LoadError> {
    let files = HeadFiles::judge(&c.text, &|n| s.has(n), s.names_with_prefix("mtp.").len());
    let mut status = MtpStatus {
        declared_layers: files.declared_layers,
        tensors_found: files.tensors_found,
        loaded: false,
        reason: files.reason.clone(),
        repaired: None,
        probe: None,
        plan: None,
    };
    if !files.complete() {
        s.skip_prefix("mtp.");
        return Ok(Loaded { head: None, status, decision: None });
    }
    let decision = store_decision(s)?;
    if let Some(why) = &decision.refused {
        status.reason = Some(format!("{why}; MTP is off (`tandem convert --repair` writes a fixed copy)"));
        tracing::warn!("{}", status.reason.as_deref().unwrap_or_default());
        s.skip_prefix("mtp.");
        return Ok(Loaded { head: None, status, decision: Some(decision) });
    }
    for note in [&decision.doubt, &decision.repaired].into_iter().flatten() {
        tracing::warn!("{note}");
    }
    status.repaired = decision.repaired.clone();
    let plan = plan_of(&decision);
    let head = MtpHead::load(s, c, &plan, observer)?;
    status.loaded = true;
    status.plan = Some(plan);
    Ok(Loaded { head: Some(head), status, decision: Some(decision) })
}
