//! Qwen3.5 (`qwen3_5`): a hybrid of Gated DeltaNet (linear attention) and gated full-attention
//! layers, with an optional MTP head. Like an mlx-lm model file, this module owns everything
//! particular to the architecture: its config (`config`), the checkpoint name mapping
//! ([`sanitize`], [`mlx_key`]), what each tensor is ([`role`]), the quantization policy
//! ([`quant_predicate`]), the dtype policy ([`cast_predicate`]), the cache layout
//! ([`Qwen35::make_cache`]) and the forward pass. The MTP head lives in `model::mtp_head`.
//! Math: docs/MODEL.md §3; the MTP head: §2.5 and §4.

mod attention;
mod config;
mod decoder_layer;
mod gated_deltanet;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use mlx::{Array, Dtype};

pub use self::config::{Config, RopeParameters, TextConfig};
pub use self::decoder_layer::DecoderLayer;
use super::launch;
use super::layers::{Embedding, Linear, MRope, Observer, Result, RmsNorm};
use super::mtp_head::convention::HeadDecision;
use super::mtp_head::{self, probe, MtpHead, MtpStatus, MTP_NORMS};
use super::parallel::{Parallel, Split};
use super::store::{Provenance, Store};
use super::vision::{GridThw, VisionConfig, VisionTower};
use super::weights::{Checkpoint, Layout};
use super::{LoadError, LoadOptions};
use crate::cache::{KvCache, LayerCache, LinearState};

// ---------------------------------------------------------------------------------------------
// Checkpoint names

/// Maps a stored key to (canonical name, provenance). Canonical names are the text model's names
/// without prefix (`layers.0.mlp.up_proj.weight`), plus `lm_head.*`, `mtp.*` and `visual.*`.
///
/// Names that only one kind of writer uses decide the provenance themselves. The flat names of a
/// text-only checkpoint (`model.layers.*`, `model.norm.weight`, `model.mtp.*`, `lm_head.weight`)
/// are written both by transformers' `Qwen3_5ForCausalLM` (raw) and by MLX tools, so they take
/// the checkpoint's `layout`, which `Checkpoint::layout_evidence` decides from facts. A top-level
/// `mtp.*` is the raw head's own name, also when it was re-attached to an MLX conversion.
pub fn sanitize(key: &str, layout: Layout) -> (String, Provenance) {
    const RULES: &[(&str, &str, Provenance)] = &[
        ("model.language_model.", "", Provenance::Hf),
        ("model.visual.", "visual.", Provenance::Hf),
        ("language_model.model.", "", Provenance::Mlx),
        ("language_model.lm_head.", "lm_head.", Provenance::Mlx),
        ("language_model.mtp.", "mtp.", Provenance::Mlx),
        ("vision_tower.", "visual.", Provenance::Mlx),
    ];
    for (prefix, repl, prov) in RULES {
        if let Some(rest) = key.strip_prefix(prefix) {
            return (format!("{repl}{rest}"), *prov);
        }
    }
    let of_layout = match layout {
        Layout::Hf => Provenance::Hf,
        Layout::Mlx => Provenance::Mlx,
    };
    if let Some(rest) = key.strip_prefix("model.") {
        return (rest.to_string(), of_layout);
    }
    let prov = if key.starts_with("mtp.") { Provenance::Hf } else { of_layout };
    (key.to_string(), prov)
}

/// The key (or module path) a canonical name gets in the MLX layout that mlx-lm and mlx-vlm load.
pub fn mlx_key(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("visual.") {
        format!("vision_tower.{rest}")
    } else if name == "lm_head" || name.starts_with("lm_head.") || name.starts_with("mtp.") {
        format!("language_model.{name}")
    } else {
        format!("language_model.model.{name}")
    }
}

// ---------------------------------------------------------------------------------------------
// What each tensor is: the quantization and dtype policies

/// Which family a quantizable linear belongs to (for recipes and reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinearKind {
    Embedding,
    LmHead,
    AttnQ,
    AttnK,
    AttnV,
    AttnO,
    /// Gated DeltaNet's fused q|k|v input projection (it holds the value projection).
    GdnQkv,
    GdnZ,
    GdnB,
    GdnA,
    GdnOut,
    MlpGate,
    MlpUp,
    MlpDown,
    /// `mtp.fc`: the head's fusion projection, always kept in full precision.
    MtpFc,
}

impl LinearKind {
    /// The module group `inspect` reports.
    pub fn group(self) -> &'static str {
        use LinearKind::*;
        match self {
            Embedding => "embed_tokens",
            LmHead => "lm_head",
            AttnQ | AttnK | AttnV | AttnO => "self_attn",
            GdnQkv | GdnZ | GdnB | GdnA | GdnOut => "linear_attn",
            MlpGate | MlpUp | MlpDown => "mlp",
            MtpFc => "mtp",
        }
    }
}

/// What a tensor is, which decides how it is converted.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// The weight `[out, in]` of a linear layer or embedding whose module is `module`.
    Linear { module: String, kind: LinearKind },
    /// A zero-centred RMSNorm weight in raw checkpoints (`1 + w` is the scale).
    ZeroCentredNorm,
    /// Gated DeltaNet's depthwise conv weight (`[C,1,K]` raw, `[C,K,1]` MLX).
    Conv1d,
    /// Gated DeltaNet's `A_log`, kept in float32.
    ALog,
    /// A vision-tower tensor, kept as it is (cast to the dtype only).
    Vision,
    /// Anything else (biases, `dt_bias`, the gated norm): cast to the dtype.
    Other,
}

const LINEARS: &[(&str, LinearKind)] = &[
    ("self_attn.q_proj", LinearKind::AttnQ),
    ("self_attn.k_proj", LinearKind::AttnK),
    ("self_attn.v_proj", LinearKind::AttnV),
    ("self_attn.o_proj", LinearKind::AttnO),
    ("linear_attn.in_proj_qkv", LinearKind::GdnQkv),
    ("linear_attn.in_proj_z", LinearKind::GdnZ),
    ("linear_attn.in_proj_b", LinearKind::GdnB),
    ("linear_attn.in_proj_a", LinearKind::GdnA),
    ("linear_attn.out_proj", LinearKind::GdnOut),
    ("mlp.gate_proj", LinearKind::MlpGate),
    ("mlp.up_proj", LinearKind::MlpUp),
    ("mlp.down_proj", LinearKind::MlpDown),
];

/// The zero-centred norms inside a decoder layer (the gated `linear_attn.norm` is standard).
const LAYER_NORMS: &[&str] = &[
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
];

/// The part of a Qwen3.5 checkpoint a canonical tensor name belongs to: the quantizer, the catalog
/// and inspect ask this instead of matching prefixes themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The text model (embedding, decoder layers, final norm, `lm_head`).
    Body,
    /// The MTP head (`mtp.*`).
    Mtp,
    /// The vision tower (`visual.*`).
    Vision,
}

/// Which part `name` (canonical) belongs to.
pub fn part(name: &str) -> Part {
    if name.starts_with("mtp.") {
        Part::Mtp
    } else if name.starts_with("visual.") {
        Part::Vision
    } else {
        Part::Body
    }
}

/// Whether `name` (canonical) is the MTP head's.
pub fn is_mtp(name: &str) -> bool {
    part(name) == Part::Mtp
}

/// Whether `name` (canonical) is the output head's (`lm_head.*`, absent when embeddings are tied).
pub fn is_lm_head(name: &str) -> bool {
    name.starts_with("lm_head.")
}

/// Classifies a canonical tensor name.
pub fn role(name: &str) -> Role {
    if part(name) == Part::Vision {
        return Role::Vision;
    }
    let linear = |module: &str, kind| Role::Linear { module: module.into(), kind };
    match name {
        "embed_tokens.weight" => return linear("embed_tokens", LinearKind::Embedding),
        "lm_head.weight" => return linear("lm_head", LinearKind::LmHead),
        "mtp.fc.weight" => return linear("mtp.fc", LinearKind::MtpFc),
        "norm.weight" => return Role::ZeroCentredNorm,
        _ => {}
    }
    if name.strip_prefix("mtp.").is_some_and(|short| MTP_NORMS.contains(&short)) {
        return Role::ZeroCentredNorm;
    }
    // `layers.{i}.…` or `mtp.layers.{i}.…`
    let in_layer = name.strip_prefix("mtp.").unwrap_or(name);
    let Some((idx, tail)) = in_layer.strip_prefix("layers.").and_then(|r| r.split_once('.')) else {
        return Role::Other;
    };
    if idx.parse::<usize>().is_err() {
        return Role::Other;
    }
    match tail {
        t if LAYER_NORMS.contains(&t) => Role::ZeroCentredNorm,
        "linear_attn.conv1d.weight" => Role::Conv1d,
        "linear_attn.A_log" => Role::ALog,
        t => match t.strip_suffix(".weight").and_then(|m| LINEARS.iter().find(|(l, _)| *l == m)) {
            Some((_, kind)) => linear(name.strip_suffix(".weight").unwrap_or(name), *kind),
            None => Role::Other,
        },
    }
}

/// The decoder layer a canonical name belongs to (None for the MTP head and global tensors).
pub fn layer_index(name: &str) -> Option<usize> {
    name.strip_prefix("layers.")?.split_once('.')?.0.parse().ok()
}

/// How the quantizer may store a linear module (mlx-lm's `quant_predicate`, and what its mixed
/// recipes match by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantClass {
    /// Always full precision: `mtp.fc` (oMLX's MTP-aware rule).
    Never,
    /// The output head (`lm_head`): the high width of mixed recipes.
    OutputHead,
    /// The token embedding: the head's width when tied (it is the output head then).
    Embedding,
    /// Holds a value or down projection (`v_proj`, `down_proj`, the GDN `in_proj_qkv`): the high
    /// width of mixed recipes in the layers that get more bits.
    Sensitive,
    /// Everything else: the low width.
    Plain,
}

pub fn quant_predicate(kind: LinearKind) -> QuantClass {
    match kind {
        LinearKind::MtpFc => QuantClass::Never,
        LinearKind::LmHead => QuantClass::OutputHead,
        LinearKind::Embedding => QuantClass::Embedding,
        LinearKind::AttnV | LinearKind::MlpDown | LinearKind::GdnQkv => QuantClass::Sensitive,
        _ => QuantClass::Plain,
    }
}

/// The dtype a tensor keeps whatever the model's dtype (mlx-lm's `cast_predicate`): `A_log` in
/// float32 (the recurrence's decay is computed from it in float32).
pub fn cast_predicate(role: &Role) -> Option<Dtype> {
    matches!(role, Role::ALog).then_some(Dtype::F32)
}

// ---------------------------------------------------------------------------------------------
// Model

pub struct Qwen35 {
    pub config: Config,
    pub layout: Layout,
    embed_tokens: Embedding,
    /// The decoder layers this process runs: all of them, or its pipeline stage's.
    layers: Vec<DecoderLayer>,
    /// In a pipeline, the group and which layers of the model `layers` are (model::parallel).
    stage: Option<(Parallel, Range<usize>)>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    mtp: Option<MtpHead>,
    /// In a split model, the group whose rank 0 alone keeps the MTP head (model::parallel): it drafts,
    /// and every rank verifies its drafts ([`Qwen35::share_drafts`]).
    drafts_from: Option<Parallel>,
    pub mtp_status: MtpStatus,
    vision: Option<VisionTower>,
    /// Why a vision tower declared by the config is not loaded (None when loaded or not declared).
    pub vision_status: Option<String>,
    /// The model folder's name, for messages.
    name: String,
    /// Sees every linear layer's input while it records (calibration).
    observer: Arc<Observer>,
}

fn mlx_err(context: &str, e: mlx::Error) -> LoadError {
    LoadError::Mlx { context: context.to_string(), error: e }
}

impl Qwen35 {
    pub fn load(dir: &Path, config: &serde_json::Value, opts: &LoadOptions) -> std::result::Result<Qwen35, LoadError> {
        let mut c = Config::from_json(config)?;
        let store = Store::new(Checkpoint::open(dir)?, opts.dtype, sanitize)?;
        if let Some(note) = c.resolve_tie(store.has("lm_head.weight")) {
            tracing::warn!("{}: {note}", dir.display());
        }
        let (d, v, eps) = (c.text.hidden_size, c.text.vocab_size, c.text.rms_norm_eps);
        let norms = |name: &str, dim: i32| store.norm(name, dim, eps);
        let observer = Arc::new(Observer::default());
        let embed_tokens = store.embedding("embed_tokens", v, d)?;
        let all = 0..c.text.num_hidden_layers;
        let stage = match &opts.parallel {
            Some(p) if p.split() == Split::Pipeline => Some((p.clone(), p.stage(all.len())?)),
            _ => None,
        };
        let mine = stage.as_ref().map_or(all.clone(), |(_, r)| r.clone());
        let tp = opts.parallel.as_ref().and_then(Parallel::tensor);
        let mut layers = Vec::with_capacity(mine.len());
        for i in all {
            let p = format!("layers.{i}");
            if !mine.contains(&i) {
                // Another rank's: never read from the files.
                store.skip_prefix(&format!("{p}."));
                continue;
            }
            opts.check_cancelled()?;
            layers.push(DecoderLayer::load(&store, &p, &c, c.full_attention[i], &norms, &observer, tp)?);
        }
        let norm = norms("norm.weight", d)?;
        let lm_head = if c.tie_word_embeddings {
            if store.has("lm_head.weight") {
                // Some exports keep a copy of the tied head; it must equal the embedding, so it is unused.
                store.skip_prefix("lm_head.");
            }
            None
        } else {
            Some(store.linear("lm_head", v, d, false)?)
        };
        let mtp_head::Loaded { head: mtp, status: mtp_status, decision } = mtp_head::load(&store, &c, &observer)?;
        // A tower whose tensors are all there loads strictly; a text-only conversion (mlx-lm drops
        // `visual.*` but keeps `vision_config`) or an unsupported vision config loads as text only.
        let has_tensors = !store.names_with_prefix("visual.").is_empty();
        let (vision, vision_status) = match VisionConfig::from_json(config) {
            Ok(Some(vc)) if has_tensors => (Some(VisionTower::load(&store, &vc)?), None),
            Ok(Some(_)) => (None, Some("the checkpoint has no visual.* tensors (a text-only conversion)".to_string())),
            Ok(None) => (None, has_tensors.then(|| "visual.* tensors but no vision_config in config.json".to_string())),
            Err(e) => (None, Some(e.to_string())),
        };
        if let Some(why) = &vision_status {
            tracing::warn!("{}: vision tower not loaded: {why}", dir.display());
            store.skip_prefix("visual.");
        }
        store.finish()?;
        opts.check_cancelled()?;
        store.check_finite()?;
        let name =
            dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string());
        let mut model = Qwen35 {
            config: c,
            layout: store.layout,
            embed_tokens,
            layers,
            stage,
            norm,
            lm_head,
            mtp,
            drafts_from: None,
            mtp_status,
            vision,
            vision_status,
            name,
            observer,
        };
        if let (true, Some(decision)) = (opts.probe, decision) {
            opts.check_cancelled()?;
            model.probe_mtp(&store, &decision, dir)?;
        }
        if let (Some(p), true) = (&opts.parallel, model.mtp.is_some()) {
            // Every rank probed the same head the same way (the probe's forwards are collectives too);
            // from here only rank 0 keeps it.
            model.drafts_from = Some(p.clone());
            if p.rank() != 0 {
                model.mtp = None;
            }
        }
        Ok(model)
    }

    /// Measures the head before it is trusted (`mtp_head::probe`): keeps it, swaps in the
    /// convention that probes best, or turns MTP off with the figures.
    fn probe_mtp(&mut self, store: &Store, decision: &HeadDecision, dir: &Path) -> std::result::Result<(), LoadError> {
        let current = self.mtp.take();
        let j = probe::judge(self, current, store, &self.config, decision, dir)?;
        let status = &mut self.mtp_status;
        if let Some(why) = &j.refused {
            tracing::warn!("{}: {why}", dir.display());
            status.reason = Some(why.clone());
        }
        if let Some(fix) = &j.repaired {
            tracing::warn!("{}: {fix}", dir.display());
            status.repaired = Some(fix.clone());
            status.reason = None;
        }
        status.loaded = j.head.is_some();
        status.probe = Some(j.report);
        status.plan = j.plan;
        self.mtp = j.head;
        Ok(())
    }

    /// Fresh per-sequence state: one cache per decoder layer this process runs.
    pub fn make_cache(&self) -> Vec<LayerCache> {
        let full = &self.config.full_attention;
        let mine = self.stage.as_ref().map_or(&full[..], |(_, r)| &full[r.clone()]);
        mine.iter()
            .map(
                |&full| {
                    if full {
                        LayerCache::Kv(KvCache::default())
                    } else {
                        LayerCache::Linear(LinearState::default())
                    }
                },
            )
            .collect()
    }

    /// The MTP head's own KV cache (None when the model has no head).
    pub fn make_mtp_cache(&self) -> Option<KvCache> {
        self.has_mtp().then(KvCache::default)
    }

    /// Whether generation can draft with an MTP head: this process's, or rank 0's in a split model.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some() || self.drafts_from.is_some()
    }

    /// Whether the drafts are made here: the head is in this process (false on a split model's ranks
    /// but 0, which take rank 0's drafts from [`Qwen35::share_drafts`]).
    pub fn drafts_here(&self) -> bool {
        self.mtp.is_some()
    }

    /// Whether drafts cross a group (a split model): then each sequence drafts on its own.
    pub fn splits_drafting(&self) -> bool {
        self.drafts_from.is_some()
    }

    /// Drafts `[k]` (u32) as every rank of a split model uses them: rank 0's, given to all by a sum in
    /// which the others give zeros (token ids are exact in f32); elsewhere `drafts` itself.
    pub fn share_drafts(&self, drafts: &Array) -> Result<Array> {
        match &self.drafts_from {
            Some(p) => p.from_rank0(drafts),
            None => Ok(drafts.clone()),
        }
    }

    pub fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    /// Runs the decoder over `tokens` `[B, T]` and returns the post-final-norm hidden states `[B, T, D]`.
    pub fn forward(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        self.forward_embeddings(&self.embed(tokens)?, cache)
    }

    pub fn forward_embeddings(&self, h: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        self.forward_layers(h, cache, None)
    }

    /// [`forward_embeddings`](Self::forward_embeddings) at explicit M-RoPE position ids `[3, T]`
    /// (t, h, w), for a pass over a prompt that holds images. Later passes without explicit ids run
    /// at `offset + rope_delta` of each KV cache (see [`set_rope_delta`]).
    pub fn forward_embeddings_at(&self, h: &Array, cache: &mut [LayerCache], position_ids: &Array) -> Result<Array> {
        let c = &self.config;
        let rope =
            MRope::new(c.rope_dims, c.rope_theta, &c.mrope_section, c.mrope_interleaved, position_ids, h.dtype())?;
        self.forward_layers(h, cache, Some(&rope))
    }

    /// The folder the model was loaded from (its name), for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn has_vision(&self) -> bool {
        self.vision.is_some()
    }

    pub fn vision(&self) -> Option<&VisionTower> {
        self.vision.as_ref()
    }

    /// The vision tower's merged features `[tokens, hidden]` for images stacked in `pixel_values`
    /// `[patches, C*T*P*P]` with grids `[t, h, w]` (see `model::vision_input`).
    pub fn encode_images(&self, pixel_values: &Array, grid_thw: &[GridThw]) -> Result<Array> {
        let v = self.vision.as_ref().ok_or_else(|| {
            let why = self.vision_status.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
            mlx::Error::Invalid(format!("model `{}` has no vision tower: it cannot read images{why}", self.name))
        })?;
        v.encode(pixel_values, grid_thw)
    }

    /// Sees the input of every linear layer, by canonical module name, while it records: start
    /// it, run forward passes, finish it (quantization calibration).
    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    fn forward_layers(&self, h: &Array, cache: &mut [LayerCache], rope: Option<&MRope>) -> Result<Array> {
        let (h, pending) = self.through_layers(h, |h| {
            let (mut h, mut pending) = (h.clone(), None);
            let n = self.layers.len();
            for (i, (layer, c)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
                let (next, m) = layer.forward(&h, pending.as_ref(), c, rope)?;
                launch::after_layer(i, n, &[&next, &m])?;
                (h, pending) = (next, Some(m));
            }
            Ok((h, pending))
        })?;
        Ok(self.norm.forward_pending(&h, pending.as_ref())?.1)
    }

    /// `run` (this process's layers over `h`, returning the stream and the last layer's output not yet
    /// added to it) as the model's whole stack: alone, or as this rank's turn of a pipeline
    /// (`Parallel::chain`, which passes on the sum).
    fn through_layers(
        &self,
        h: &Array,
        run: impl FnOnce(&Array) -> Result<(Array, Option<Array>)>,
    ) -> Result<(Array, Option<Array>)> {
        match &self.stage {
            Some((p, _)) => {
                let h = p.chain(h, |h| match run(h)? {
                    (h, Some(m)) => h.add(&m),
                    (h, None) => Ok(h),
                })?;
                Ok((h, None))
            }
            None => run(h),
        }
    }

    /// Runs the decoder over `tokens` `[B, T]` for B sequences at once, `caches[i]` being row i's
    /// own state (their lengths may differ): the weights are read once for all of them, while
    /// each sequence's attention and recurrence see only its own past. Returns `[B, T, D]`.
    pub fn forward_batch(&self, tokens: &Array, caches: &mut [&mut [LayerCache]]) -> Result<Array> {
        if caches.len() != tokens.dim(0) as usize || caches.iter().any(|c| c.len() != self.layers.len()) {
            return Err(mlx::Error::Invalid(format!(
                "batched forward: {} token rows for {} sequences of {} layers",
                tokens.dim(0),
                caches.len(),
                self.layers.len()
            )));
        }
        let (h, pending) = self.through_layers(&self.embed(tokens)?, |h| {
            let (mut h, mut pending) = (h.clone(), None);
            for (i, layer) in self.layers.iter().enumerate() {
                let mut per: Vec<&mut LayerCache> = caches.iter_mut().map(|c| &mut c[i]).collect();
                let (next, m) = layer.forward_batch(&h, pending.as_ref(), &mut per, None)?;
                launch::after_layer(i, self.layers.len(), &[&next, &m])?;
                (h, pending) = (next, Some(m));
            }
            Ok((h, pending))
        })?;
        Ok(self.norm.forward_pending(&h, pending.as_ref())?.1)
    }

    /// Logits from post-norm hidden states (the untied `lm_head`, or the tied embedding).
    pub fn logits(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.as_linear(hidden),
        }
    }

    /// One MTP step: for post-norm hidden `h_t` and the token `x_{t+1}` that follows position t,
    /// returns the head's normed output (which both feeds the next draft and gives the logits).
    pub fn mtp_forward(&self, hidden: &Array, next_tokens: &Array, cache: &mut KvCache) -> Result<Array> {
        self.mtp_forward_batch(hidden, next_tokens, &mut [cache])
    }

    /// Only the head cache's part of [`mtp_forward`](Self::mtp_forward) (`MtpHead::write_cache`).
    pub fn mtp_write_cache(&self, hidden: &Array, next_tokens: &Array, cache: &mut KvCache) -> Result<()> {
        let head = self.mtp.as_ref().ok_or_else(|| mlx::Error::Invalid("this model has no MTP head loaded".into()))?;
        head.write_cache(&self.embed(next_tokens)?, hidden, cache)
    }

    /// [`mtp_forward`](Self::mtp_forward) for B sequences (`[B, T]`), `caches[i]` being row i's head cache.
    pub fn mtp_forward_batch(&self, hidden: &Array, next_tokens: &Array, caches: &mut [&mut KvCache]) -> Result<Array> {
        let head = self.mtp.as_ref().ok_or_else(|| mlx::Error::Invalid("this model has no MTP head loaded".into()))?;
        head.forward_batch(&self.embed(next_tokens)?, hidden, caches)
    }

    pub fn layers_len(&self) -> usize {
        self.layers.len()
    }

    pub fn linear_kernel(&self) -> i32 {
        self.config.text.linear_conv_kernel_dim
    }
}

/// Sets the M-RoPE delta of every KV cache of a sequence: text after images sits at `index + delta`.
pub fn set_rope_delta(cache: &mut [LayerCache], delta: i32) {
    for kv in cache.iter_mut().filter_map(LayerCache::as_kv) {
        kv.rope_delta = delta;
    }
}

#[cfg(test)]
mod tests;
