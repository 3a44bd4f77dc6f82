//! Strict access to a checkpoint's tensors under canonical names. Every tensor an architecture asks
//! for is checked for shape; every tensor left unused at the end is an error naming it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use mlx::{Array, Dtype, QuantMode, Quantized};

use super::layers::{Embedding, Linear, NormConvention, RmsNorm};
use super::parallel::Cut;
use super::weights::{Checkpoint, Layout, Shard, TensorRef};
use super::LoadError;

/// Whose conventions a tensor's values follow, from how it was named and the checkpoint's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provenance {
    /// Raw Hugging Face (zero-centred norms): `model.language_model.*`, top-level `mtp.*`, and the
    /// flat `model.*` / `lm_head.*` names of a raw text-only checkpoint.
    Hf,
    /// MLX conversion (norms shifted by +1): `language_model.*`, `vision_tower.*`, and flat names
    /// in a checkpoint whose layout is MLX.
    Mlx,
}

pub struct Store {
    pub layout: Layout,
    /// What decided the layout (a file and tensor), for messages.
    pub layout_reason: String,
    tensors: BTreeMap<String, (String, Provenance, TensorRef)>,
    used: RefCell<BTreeSet<String>>,
    /// Floating arrays handed out and not yet checked for NaN/Inf, by canonical name (see
    /// [`check_finite`](Self::check_finite)).
    unchecked: RefCell<BTreeMap<String, Array>>,
    /// Floating weights are cast to this dtype (None keeps the checkpoint's).
    pub dtype: Option<Dtype>,
}

/// An architecture's name mapping (e.g. `qwen3_5::sanitize`): a stored key and the checkpoint's
/// layout to (canonical name, provenance).
pub type Sanitize = fn(&str, Layout) -> (String, Provenance);

impl Store {
    /// Every tensor of `ckpt` under the canonical name the architecture's `sanitize` gives it.
    pub fn new(ckpt: Checkpoint, dtype: Option<Dtype>, sanitize: Sanitize) -> Result<Store, LoadError> {
        let evidence = ckpt.layout_evidence()?;
        let layout = evidence.layout;
        let mut tensors = BTreeMap::new();
        for (key, t) in ckpt.tensors {
            let (name, prov) = sanitize(&key, layout);
            if let Some((other, _, _)) = tensors.insert(name.clone(), (key.clone(), prov, t)) {
                return Err(LoadError::Conflict { a: other, b: key });
            }
        }
        Ok(Store {
            layout,
            layout_reason: evidence.reason,
            tensors,
            used: RefCell::new(BTreeSet::new()),
            unchecked: RefCell::new(BTreeMap::new()),
            dtype,
        })
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn provenance(&self, name: &str) -> Option<Provenance> {
        self.tensors.get(name).map(|(_, p, _)| *p)
    }

    /// The stored shape of a tensor.
    pub fn shape(&self, name: &str) -> Option<&[i32]> {
        self.tensors.get(name).map(|(_, _, t)| t.shape.as_slice())
    }

    /// The key in the file and the file of a tensor (for messages).
    pub fn origin(&self, name: &str) -> Option<(&str, &std::path::Path)> {
        self.tensors.get(name).map(|(k, _, t)| (k.as_str(), t.file.path.as_path()))
    }

    /// Every tensor as (canonical name, provenance, file).
    pub fn entries(&self) -> impl Iterator<Item = (&str, Provenance, &Shard)> {
        self.tensors.iter().map(|(n, (_, p, t))| (n.as_str(), *p, t.file.as_ref()))
    }

    /// Canonical names starting with `prefix`.
    pub fn names_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.tensors
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Marks tensors as deliberately unused (e.g. an MTP head that cannot run).
    pub fn skip_prefix(&self, prefix: &str) {
        self.used.borrow_mut().extend(self.names_with_prefix(prefix));
    }

    fn get(&self, name: &str) -> Result<&(String, Provenance, TensorRef), LoadError> {
        let t = self.tensors.get(name).ok_or_else(|| LoadError::Missing(name.to_string()))?;
        self.used.borrow_mut().insert(name.to_string());
        Ok(t)
    }

    /// A tensor as stored, after checking its shape.
    pub fn raw(&self, name: &str, shape: &[i32]) -> Result<Array, LoadError> {
        let (key, _, t) = self.get(name)?;
        if t.shape != shape {
            return Err(LoadError::Shape {
                name: key.clone(),
                file: t.file.path.clone(),
                actual: t.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        let a = t.to_array()?;
        if a.dtype().is_float() {
            self.unchecked.borrow_mut().entry(name.to_string()).or_insert_with(|| a.clone());
        }
        Ok(a)
    }

    /// Fails naming the first tensor handed out so far that holds a NaN or an infinity (a corrupt
    /// file or a diverged training run; such a model loads but answers nothing). Floats and
    /// quantization scales and biases are what `raw` hands out; packed weights are integers. Each
    /// tensor costs one elementwise op and one reduction (`sum(x * 0)` is 0 exactly when every
    /// element is finite, and cannot overflow), evaluated a batch at a time so that MLX reads the
    /// files in a few large passes and only one batch's temporaries live at once.
    pub fn check_finite(&self) -> Result<(), LoadError> {
        const BATCH_BYTES: usize = 256 << 20;
        let t0 = std::time::Instant::now();
        let pending = std::mem::take(&mut *self.unchecked.borrow_mut());
        let total: usize = pending.values().map(Array::nbytes).sum();
        let mut batch: Vec<(&str, &Array)> = Vec::new();
        let mut bytes = 0;
        let mut items = pending.iter().peekable();
        while let Some((name, a)) = items.next() {
            batch.push((name, a));
            bytes += a.nbytes();
            if bytes >= BATCH_BYTES || items.peek().is_none() {
                self.check_batch(&batch)?;
                batch.clear();
                bytes = 0;
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        tracing::debug!("checked {} tensors ({total} bytes) for NaN/Inf in {seconds:.3} s", pending.len());
        Ok(())
    }

    fn check_batch(&self, batch: &[(&str, &Array)]) -> Result<(), LoadError> {
        let err = |name: &str, e: mlx::Error| LoadError::Mlx {
            context: format!("checking tensor `{name}` for NaN/Inf"),
            error: e,
        };
        let sums = batch
            .iter()
            .map(|(name, a)| {
                let zero = Array::scalar(0.0, a.dtype()).map_err(|e| err(name, e))?;
                a.multiply(&zero)
                    .and_then(|z| z.sum(&[], false))
                    .and_then(|z| z.as_dtype(Dtype::F32))
                    .map_err(|e| err(name, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let first = batch.first().map_or("", |(n, _)| n);
        let all = mlx::stack(&sums.iter().collect::<Vec<_>>(), 0).map_err(|e| err(first, e))?;
        let values = all.to_vec::<f32>().map_err(|e| err(first, e))?;
        let Some(i) = values.iter().position(|v| !v.is_finite()) else {
            return Ok(());
        };
        let (name, a) = batch[i];
        let nan = a.isnan().and_then(|m| m.any(&[], false)).and_then(|m| m.item::<bool>()).unwrap_or(true);
        let (key, file) = self
            .origin(name)
            .map_or((name.to_string(), String::new()), |(k, f)| (k.to_string(), format!("{}: ", f.display())));
        Err(LoadError::NotFinite {
            tensor: format!("{file}tensor `{key}`"),
            what: if nan { "NaN" } else { "an infinity" },
        })
    }

    /// A tensor cast to the load dtype when it is floating.
    pub fn tensor(&self, name: &str, shape: &[i32]) -> Result<Array, LoadError> {
        let a = self.raw(name, shape)?;
        self.cast(a, name)
    }

    fn cast(&self, a: Array, name: &str) -> Result<Array, LoadError> {
        match self.dtype {
            Some(dt) if a.dtype().is_float() && a.dtype() != dt => {
                a.as_dtype(dt).map_err(|e| LoadError::Mlx { context: name.to_string(), error: e })
            }
            _ => Ok(a),
        }
    }

    /// A linear layer `[out, in]`, dense or affine-quantized (detected by `{prefix}.scales`).
    pub fn linear(&self, prefix: &str, out: i32, inp: i32, bias: bool) -> Result<Linear, LoadError> {
        let bias = if bias { Some(self.tensor(&format!("{prefix}.bias"), &[out])?) } else { None };
        if !self.has(&format!("{prefix}.scales")) {
            return Ok(Linear::Dense { weight: self.tensor(&format!("{prefix}.weight"), &[out, inp])?, bias });
        }
        Ok(Linear::Quantized { q: self.quantized(prefix, out, inp)?, bias })
    }

    /// What `cut` keeps of a linear layer `[out, in]` without a bias (a tensor-parallel rank's rows or
    /// columns). Only that part is checked for NaN/Inf, so only its bytes are read from the files: the
    /// whole tensor is a view of the mapped file until a part of it is copied out.
    pub fn linear_cut(&self, prefix: &str, out: i32, inp: i32, cut: &Cut) -> Result<Linear, LoadError> {
        let whole = self.linear(prefix, out, inp, false)?;
        if *cut == Cut::All {
            return Ok(whole);
        }
        let part = cut.apply(&whole).map_err(|e| LoadError::Mlx { context: prefix.to_string(), error: e })?;
        let mut unchecked = self.unchecked.borrow_mut();
        let dot = format!("{prefix}.");
        // The part's arrays replace the whole ones `raw` registered under the same names.
        let arrays: Vec<(&str, &Array)> = match &part {
            Linear::Dense { weight, .. } => vec![("weight", weight)],
            Linear::Quantized { q, .. } => [("scales", Some(&q.scales)), ("biases", q.biases.as_ref())]
                .into_iter()
                .filter_map(|(n, a)| Some((n, a?)))
                .collect(),
        };
        for (suffix, a) in arrays.into_iter().filter(|(_, a)| a.dtype().is_float()) {
            unchecked.insert(format!("{dot}{suffix}"), a.clone());
        }
        Ok(part)
    }

    fn quantized(&self, prefix: &str, out: i32, inp: i32) -> Result<Quantized, LoadError> {
        let wname = format!("{prefix}.weight");
        let (key, _, w) = self.get(&wname)?;
        let (_, _, s) = self.get(&format!("{prefix}.scales"))?;
        let shape_err = |what: &str| LoadError::Quantization { name: key.clone(), message: what.to_string() };
        if w.dtype != Dtype::U32 || w.shape.len() != 2 || s.shape.len() != 2 || w.shape[0] != out || s.shape[0] != out {
            return Err(shape_err(&format!(
                "packed weight {:?} {} with scales {:?} does not fit a [{out}, {inp}] layer",
                w.shape, w.dtype, s.shape
            )));
        }
        // From the expected input width: bits = 32 * packed / in, group = in / groups.
        let (packed, groups) = (w.shape[1], s.shape[1]);
        if groups == 0 || inp % groups != 0 || (packed * 32) % inp != 0 {
            return Err(shape_err(&format!(
                "packed width {packed} and {groups} groups do not divide input width {inp}"
            )));
        }
        let (bits, group_size) = (packed * 32 / inp, inp / groups);
        if !matches!(bits, 2..=8) || !matches!(group_size, 16 | 32 | 64 | 128) {
            return Err(shape_err(&format!(
                "inferred {bits} bits with group size {group_size}, not a supported setting"
            )));
        }
        let weight = self.raw(&wname, &[out, packed])?;
        let scales = self.cast(self.raw(&format!("{prefix}.scales"), &[out, groups])?, prefix)?;
        let biases = self.cast(self.raw(&format!("{prefix}.biases"), &[out, groups])?, prefix)?;
        Ok(Quantized { weight, scales, biases: Some(biases), group_size, bits, mode: QuantMode::Affine })
    }

    pub fn embedding(&self, prefix: &str, vocab: i32, dim: i32) -> Result<Embedding, LoadError> {
        Ok(Embedding { table: self.linear(prefix, vocab, dim, false)? })
    }

    /// An RMSNorm whose convention follows the tensor's provenance.
    pub fn norm(&self, name: &str, dim: i32, eps: f32) -> Result<RmsNorm, LoadError> {
        let conv = match self.provenance(name) {
            Some(Provenance::Hf) => NormConvention::ZeroCentred,
            _ => NormConvention::Shifted,
        };
        self.norm_with(name, dim, eps, conv)
    }

    pub fn norm_with(&self, name: &str, dim: i32, eps: f32, conv: NormConvention) -> Result<RmsNorm, LoadError> {
        let w = self.raw(name, &[dim])?;
        RmsNorm::new(&w, conv, eps).map_err(|e| LoadError::Mlx { context: name.to_string(), error: e })
    }

    /// An RMSNorm whose scale is the stored weight plus `add` (see [`RmsNorm::with_added`]).
    pub fn norm_added(&self, name: &str, dim: i32, eps: f32, add: f32) -> Result<RmsNorm, LoadError> {
        let w = self.raw(name, &[dim])?;
        RmsNorm::with_added(&w, add, eps).map_err(|e| LoadError::Mlx { context: name.to_string(), error: e })
    }

    /// The mean of a stored 1-D tensor (for norm-convention checks).
    pub fn mean(&self, name: &str) -> Result<f32, LoadError> {
        let (_, _, t) = self.tensors.get(name).ok_or_else(|| LoadError::Missing(name.to_string()))?;
        let a = t.to_array()?;
        a.as_dtype(Dtype::F32)
            .and_then(|a| a.mean(&[], false))
            .and_then(|m| m.item::<f32>())
            .map_err(|e| LoadError::Mlx { context: name.to_string(), error: e })
    }

    /// Fails if any tensor was neither used nor deliberately skipped.
    pub fn finish(&self) -> Result<(), LoadError> {
        let used = self.used.borrow();
        let extra: Vec<String> =
            self.tensors.iter().filter(|(k, _)| !used.contains(*k)).map(|(_, (key, _, _))| key.clone()).collect();
        if extra.is_empty() {
            Ok(())
        } else {
            Err(LoadError::Unexpected(extra))
        }
    }
}
