//! Building blocks shared by architectures: linear layers that may be quantized, embeddings,
//! RMSNorm with an explicit norm convention, the SwiGLU MLP, rotate-half and M-RoPE rotary
//! embeddings, and the observer that shows calibration each linear layer's input.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlx::device::{backend, default_device, Backend, Device};
use mlx::fast::{self, Mask};
use mlx::{concatenate, Array, Dtype, Quantized};

pub type Result<T> = std::result::Result<T, mlx::Error>;

/// `y = x W^T (+ b)`, with W dense or affine-quantized.
#[derive(Clone)]
pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { q: Quantized, bias: Option<Array> },
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias } => {
                // MLX's matmul, or at verify widths on CUDA a kernel whose rows do not depend on M.
                let y = crate::kernels::dense_matmul(x, weight)?;
                bias.as_ref().map_or(Ok(y.clone()), |b| y.add(b))
            }
            Linear::Quantized { q, bias } => {
                let y = crate::kernels::quantized_matmul(x, q)?;
                bias.as_ref().map_or(Ok(y.clone()), |b| y.add(b))
            }
        }
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self, Linear::Quantized { .. })
    }

    /// (bits, group size) when quantized.
    pub fn quant_params(&self) -> Option<(i32, i32)> {
        match self {
            Linear::Quantized { q, .. } => Some((q.bits, q.group_size)),
            Linear::Dense { .. } => None,
        }
    }

    /// The weight as a dense matrix (dequantized when needed).
    pub fn dense_weight(&self) -> Result<Array> {
        match self {
            Linear::Dense { weight, .. } => Ok(weight.clone()),
            Linear::Quantized { q, .. } => q.dequantize(),
        }
    }
}

/// Token embeddings; a quantized table is dequantized row by row on lookup.
#[derive(Clone)]
pub struct Embedding {
    pub table: Linear,
}

impl Embedding {
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match &self.table {
            Linear::Dense { weight, .. } => weight.take(ids, 0),
            Linear::Quantized { q, .. } => {
                let rows = |a: &Array| a.take(ids, 0);
                let sub = Quantized {
                    weight: rows(&q.weight)?,
                    scales: rows(&q.scales)?,
                    biases: q.biases.as_ref().map(rows).transpose()?,
                    ..q.clone()
                };
                sub.dequantize()
            }
        }
    }

    /// Uses the table as an output projection (tied embeddings).
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        self.table.forward(x)
    }
}

/// How a stored RMSNorm weight relates to the scale it applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormConvention {
    /// Stored as `w`, applied as `1 + w` (raw Qwen3.5 checkpoints).
    ZeroCentred,
    /// Stored as the scale itself (MLX conversions, which added the 1 when converting).
    Shifted,
}

/// RMSNorm computed in f32 with an f32 effective scale, cast back to the input dtype (as
/// transformers' Qwen3.5 does). The scale `1 + w` is formed in f32 from the raw weight, so a raw
/// checkpoint loses nothing to rounding.
#[derive(Clone)]
pub struct RmsNorm {
    pub scale: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn new(stored: &Array, convention: NormConvention, eps: f32) -> Result<RmsNorm> {
        let w = stored.as_dtype(Dtype::F32)?;
        let scale = match convention {
            NormConvention::ZeroCentred => w.add(&Array::f32(1.0))?,
            NormConvention::Shifted => w,
        };
        Ok(RmsNorm { scale, eps })
    }

    /// The norm whose scale is the stored weight plus `add` (in f32): 1 for a zero-centred weight,
    /// 0 for a shifted one, -1 to undo a second shift.
    pub fn with_added(stored: &Array, add: f32, eps: f32) -> Result<RmsNorm> {
        let w = stored.as_dtype(Dtype::F32)?;
        let scale = if add == 0.0 { w } else { w.add(&Array::f32(add))? };
        Ok(RmsNorm { scale, eps })
    }

    /// In fp32, rounded once to x's dtype (`kernels::norm`: one launch on CUDA).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        crate::kernels::norm::rms_norm(x, &self.scale, self.eps)
    }

    /// The residual add before the norm: `(h + m, norm(h + m))`, the sum in h's dtype.
    pub fn forward_residual(&self, h: &Array, m: &Array) -> Result<(Array, Array)> {
        crate::kernels::norm::add_rms_norm(h, m, &self.scale, self.eps)
    }

    /// [`forward_residual`](Self::forward_residual) when a sum is pending, else `(h, norm(h))`.
    pub fn forward_pending(&self, h: &Array, pending: Option<&Array>) -> Result<(Array, Array)> {
        match pending {
            Some(m) => self.forward_residual(h, m),
            None => Ok((h.clone(), self.forward(h)?)),
        }
    }
}

/// `down(silu(gate(x)) * up(x))`, gate and up run as one matmul ([`Fused`]) where their formats agree.
#[derive(Clone)]
pub struct Mlp {
    gate_up: Fused,
    down_proj: Linear,
    /// Shows calibration the projections' inputs (`{prefix}.gate_proj`, ...).
    tap: Tap,
}

impl Mlp {
    pub fn new(gate_proj: Linear, up_proj: Linear, down_proj: Linear, tap: Tap) -> Result<Mlp> {
        Ok(Mlp { gate_up: Fused::new(vec![gate_proj, up_proj])?, down_proj, tap })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.tap.see_all(&["gate_proj", "up_proj"], x);
        let parts = self.gate_up.forward(x)?;
        let [gate, up] = parts.as_slice() else {
            return Err(mlx::Error::Invalid(format!("MLP: {} gate/up outputs, expected 2", parts.len())));
        };
        let inner = crate::kernels::fused::swiglu(gate, up)?;
        self.tap.see("down_proj", &inner);
        self.down_proj.forward(&inner)
    }
}

/// Records the input of every linear layer of one model while recording is on (quantization
/// calibration), named by canonical module name (`layers.3.mlp.down_proj`). The model's layers share
/// it through their [`Tap`]s, so no forward pass takes an extra argument for it; while off it costs
/// one atomic load per layer. It records every forward pass of the model while on: calibration
/// runs on a model of its own.
#[derive(Default)]
pub struct Observer {
    on: AtomicBool,
    seen: parking_lot::Mutex<Vec<(String, Array)>>,
}

impl Observer {
    /// Starts recording (forgetting anything recorded before).
    pub fn start(&self) {
        self.seen.lock().clear();
        self.on.store(true, Ordering::SeqCst);
    }

    /// Stops recording and returns what was seen, in the order the forward passes saw it. The
    /// arrays are lazy: evaluating one computes the model up to that layer.
    pub fn finish(&self) -> Vec<(String, Array)> {
        self.on.store(false, Ordering::SeqCst);
        std::mem::take(&mut *self.seen.lock())
    }

    fn record(&self, name: String, x: &Array) {
        self.seen.lock().push((name, x.clone()));
    }
}

/// A component's view of its model's [`Observer`]: the component's canonical module prefix.
#[derive(Clone, Default)]
pub struct Tap {
    prefix: String,
    observer: Option<Arc<Observer>>,
}

impl Tap {
    pub fn new(observer: &Arc<Observer>, prefix: &str) -> Tap {
        Tap { prefix: prefix.to_string(), observer: Some(observer.clone()) }
    }

    /// Shows the observer the input `x` of the linear layer `{prefix}.{name}`, when it records.
    pub fn see(&self, name: &str, x: &Array) {
        if let Some(o) = self.observer.as_ref().filter(|o| o.on.load(Ordering::Relaxed)) {
            o.record(format!("{}.{name}", self.prefix), x);
        }
    }

    /// [`see`](Self::see) for several layers that read the same input.
    pub fn see_all(&self, names: &[&str], x: &Array) {
        for name in names {
            self.see(name, x);
        }
    }
}

/// `[-x2, x1]` for the halves x1, x2 of the last axis: the rotate-half (NeoX) rotary pairing.
pub fn rotate_half(x: &Array) -> Result<Array> {
    let halves = x.split(2, -1)?;
    concatenate(&[&halves[1].negative()?, &halves[0]], -1)
}

/// Explicit M-RoPE rotation for one pass (docs/MODEL.md §3.3): cos and sin `[T, dims]` built from position ids
/// `[3, T]` (t, h, w), each of the `dims / 2` frequencies taking its position from the axis that
/// `section` assigns it (interleaved as transformers does, or in consecutive blocks).
pub struct MRope {
    cos: Array,
    sin: Array,
    dims: i32,
}

impl MRope {
    pub fn new(
        dims: i32,
        theta: f32,
        section: &[i32],
        interleaved: bool,
        position_ids: &Array,
        dtype: Dtype,
    ) -> Result<MRope> {
        let half = dims / 2;
        let t = position_ids.dim(1);
        if position_ids.shape() != [3, t] {
            return Err(mlx::Error::Invalid(format!(
                "M-RoPE position ids have shape {:?}, expected [3, T]",
                position_ids.shape()
            )));
        }
        let inv: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / dims as f32)).collect();
        let sec = |i: usize| section.get(i).copied().unwrap_or(0);
        let axis: Vec<i32> = (0..half)
            .map(|i| {
                if interleaved {
                    // transformers: all t, then h at 1, 4, .. < 3*sec[1], w at 2, 5, .. < 3*sec[2].
                    match i % 3 {
                        1 if i < 3 * sec(1) => 1,
                        2 if i < 3 * sec(2) => 2,
                        _ => 0,
                    }
                } else if i < sec(0) {
                    0
                } else if i < sec(0) + sec(1) {
                    1
                } else {
                    2
                }
            })
            .collect();
        let freqs =
            position_ids.as_dtype(Dtype::F32)?.expand_dims(&[2])?.multiply(&Array::from_slice(&inv, &[1, 1, half])?)?;
        let pick = Array::from_slice(&axis, &[1, 1, half])?.broadcast_to(&[1, t, half])?;
        let f = freqs.take_along_axis(&pick, 0)?.squeeze(&[0])?; // [T, half]
        let emb = concatenate(&[&f, &f], -1)?;
        Ok(MRope { cos: emb.cos()?.as_dtype(dtype)?, sin: emb.sin()?.as_dtype(dtype)?, dims })
    }

    /// Rotate-half rotation of the first `dims` features of x `[B, H, T, hd]`.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        let hd = x.dim(-1);
        let parts = x.split_at(&[self.dims], -1)?;
        let y = parts[0].multiply(&self.cos)?.add(&rotate_half(&parts[0])?.multiply(&self.sin)?)?;
        if self.dims == hd {
            Ok(y)
        } else {
            concatenate(&[&y, &parts[1]], -1)
        }
    }
}

/// Several linear layers that read the same input, run as one matmul over their concatenated rows
/// (fewer, larger kernels per token). Falls back to separate matmuls when their formats differ.
#[derive(Clone)]
pub enum Fused {
    One { linear: Linear, splits: Vec<i32> },
    Separate(Vec<Linear>),
}

impl Fused {
    pub fn new(parts: Vec<Linear>) -> Result<Fused> {
        let rows = |l: &Linear| match l {
            Linear::Dense { weight, .. } => weight.dim(0),
            Linear::Quantized { q, .. } => q.weight.dim(0),
        };
        let mut splits = Vec::new();
        let mut acc = 0;
        for p in &parts[..parts.len().saturating_sub(1)] {
            acc += rows(p);
            splits.push(acc);
        }
        let cat = |f: &dyn Fn(&Linear) -> Option<Array>| -> Result<Option<Array>> {
            let arrays: Option<Vec<Array>> = parts.iter().map(f).collect();
            arrays.map(|a| mlx::concatenate(&a.iter().collect::<Vec<_>>(), 0)).transpose()
        };
        let no_bias =
            parts.iter().all(|p| matches!(p, Linear::Dense { bias: None, .. } | Linear::Quantized { bias: None, .. }));
        if !no_bias || parts.len() < 2 {
            return Ok(Fused::Separate(parts));
        }
        let fused = match &parts[0] {
            Linear::Dense { weight, .. } => {
                let dt = weight.dtype();
                cat(&|l| match l {
                    Linear::Dense { weight, .. } if weight.dtype() == dt => Some(weight.clone()),
                    _ => None,
                })?
                .map(|weight| Linear::Dense { weight, bias: None })
            }
            Linear::Quantized { q: q0, .. } => {
                let same = |l: &Linear| match l {
                    Linear::Quantized { q, .. }
                        if q.bits == q0.bits
                            && q.group_size == q0.group_size
                            && q.mode == q0.mode
                            && q.biases.is_some() == q0.biases.is_some() =>
                    {
                        Some(q.clone())
                    }
                    _ => None,
                };
                match (cat(&|l| same(l).map(|q| q.weight))?, cat(&|l| same(l).map(|q| q.scales))?) {
                    (Some(weight), Some(scales)) => {
                        let biases = if q0.biases.is_some() { cat(&|l| same(l).and_then(|q| q.biases))? } else { None };
                        Some(Linear::Quantized { q: Quantized { weight, scales, biases, ..q0.clone() }, bias: None })
                    }
                    _ => None,
                }
            }
        };
        Ok(match fused {
            Some(linear) => Fused::One { linear, splits },
            None => Fused::Separate(parts),
        })
    }

    /// The outputs of each part, in order.
    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Fused::One { linear, splits } => linear.forward(x)?.split_at(splits, -1),
            Fused::Separate(parts) => parts.iter().map(|p| p.forward(x)).collect(),
        }
    }

    /// The outputs of parts `from..` only, in order: one matmul over the fused weight's rows from part
    /// `from` on (a view of them, no copy). Each output row is its dot product in the full matmul too.
    pub fn forward_tail(&self, x: &Array, from: usize) -> Result<Vec<Array>> {
        match self {
            Fused::Separate(parts) => parts.iter().skip(from).map(|p| p.forward(x)).collect(),
            Fused::One { .. } if from == 0 => self.forward(x),
            Fused::One { linear, splits } => {
                let first = *splits
                    .get(from - 1)
                    .ok_or_else(|| mlx::Error::Invalid(format!("fused linear: no part {from}")))?;
                let rows = |a: &Array| a.slice_axis(0, first, a.dim(0));
                let tail = match linear {
                    Linear::Dense { weight, .. } => Linear::Dense { weight: rows(weight)?, bias: None },
                    Linear::Quantized { q, .. } => Linear::Quantized {
                        q: Quantized {
                            weight: rows(&q.weight)?,
                            scales: rows(&q.scales)?,
                            biases: q.biases.as_ref().map(rows).transpose()?,
                            ..q.clone()
                        },
                        bias: None,
                    },
                };
                let at: Vec<i32> = splits[from..].iter().map(|s| s - first).collect();
                tail.forward(x)?.split_at(&at, -1)
            }
        }
    }
}

/// Queries per pass up to which attention on CUDA is computed query by query (see [`causal_attention`]).
const SHORT_QUERIES: i32 = 16;

/// The most queries a pass should carry when its shape changes from call to call (a pass over a
/// varying number of positions at a growing key length): on CUDA a longer one builds a cuDNN graph
/// for its exact shape, seconds on an H200, while up to [`SHORT_QUERIES`] run query by query. None
/// where any length is cheap (Metal, CPU).
pub fn queries_per_varying_pass() -> Option<usize> {
    (backend() == Backend::Cuda && default_device() == Device::Gpu).then_some(SHORT_QUERIES as usize)
}

/// Causal attention of the last `T` positions (q `[B, Hq, T, D]`) over all `L` keys (`[B, Hkv, L, D]`,
/// the cache included): query `i` sees keys `0..=L-T+i`.
///
/// MLX's CUDA backend runs multi-query attention with head_dim <= 128 through cuDNN, whose graphs are
/// built and cached per exact shape: an MTP verify (T = depth + 1) meets a new key length every cycle
/// and paid a graph build each time (59 ms against a 3.4 ms decode step on an H200, docs/PERF.md). Short
/// query blocks there run query by query instead, through the one-query kernel that plain decoding
/// uses, so a verify computes exactly what decoding would. Metal and CPU keep MLX's fused kernel.
pub fn causal_attention(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    let t = q.dim(2);
    if t > 1 && t <= SHORT_QUERIES && backend() == Backend::Cuda && default_device() == Device::Gpu {
        return per_query_causal_attention(q, k, v, scale);
    }
    fast::scaled_dot_product_attention(q, k, v, scale, if t > 1 { Mask::Causal } else { Mask::None })
}

/// [`causal_attention`] as `T` one-query attentions over growing key prefixes.
pub fn per_query_causal_attention(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    let (t, l) = (q.dim(2), k.dim(2));
    if t > l {
        return Err(mlx::Error::Invalid(format!("attention: {t} queries over {l} keys")));
    }
    let rows = (0..t)
        .map(|i| {
            let seen = l - t + i + 1;
            fast::scaled_dot_product_attention(
                &q.slice_axis(2, i, i + 1)?,
                &k.slice_axis(2, 0, seen)?,
                &v.slice_axis(2, 0, seen)?,
                scale,
                Mask::None,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    concatenate(&rows.iter().collect::<Vec<_>>(), 2)
}

/// A random f32 array (tests).
#[cfg(test)]
fn random(shape: &[i32], seed: u64) -> Array {
    let key = mlx::random::key(seed).unwrap();
    mlx::random::normal(shape, Dtype::F32, &key).unwrap()
}

#[cfg(test)]
mod attention_tests {
    use super::*;

    /// The per-query path equals MLX's fused causal attention (bottom-right aligned) for every shape
    /// the engine produces: prefill (T = L), verify and catch-up (T < L), GQA and plain heads.
    #[test]
    fn per_query_attention_matches_fused() {
        for (hq, hkv, t, l) in [(4, 2, 2, 9), (4, 2, 4, 4), (8, 2, 5, 37), (2, 2, 3, 3), (4, 1, 16, 70)] {
            let q = random(&[1, hq, t, 64], 1);
            let k = random(&[1, hkv, l, 64], 2);
            let v = random(&[1, hkv, l, 64], 3);
            let fused = fast::scaled_dot_product_attention(&q, &k, &v, 0.125, Mask::Causal).unwrap();
            let ours = per_query_causal_attention(&q, &k, &v, 0.125).unwrap();
            assert_eq!(ours.shape(), fused.shape());
            let (a, b) = (ours.to_f32_vec().unwrap(), fused.to_f32_vec().unwrap());
            let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "hq {hq} hkv {hkv} t {t} l {l}: max |diff| {diff}");
        }
    }

    #[test]
    fn per_query_attention_rejects_more_queries_than_keys() {
        let q = random(&[1, 2, 5, 8], 1);
        let k = random(&[1, 2, 4, 8], 2);
        let err = per_query_causal_attention(&q, &k, &k, 1.0).unwrap_err().to_string();
        assert!(err.contains("5 queries over 4 keys"), "{err}");
    }
}

#[cfg(test)]
mod fused_tests {
    use super::*;
    use mlx::quantized::quantize;
    use mlx::QuantMode;

    /// A tail of a fused projection (the MTP head's keys and values without its queries) gives the bits of
    /// the same parts of the whole projection, dense and quantized; a part past the end is an error.
    #[test]
    fn a_fused_tail_is_the_whole_projections_parts() {
        let x = random(&[1, 5, 128], 1).as_dtype(Dtype::BF16).unwrap();
        let weights = [random(&[96, 128], 2), random(&[32, 128], 3), random(&[64, 128], 4)];
        let dense = weights.iter().map(|w| Linear::Dense { weight: w.as_dtype(Dtype::BF16).unwrap(), bias: None });
        let quantized = weights.iter().map(|w| Linear::Quantized {
            q: quantize(&w.as_dtype(Dtype::BF16).unwrap(), 64, 4, QuantMode::Affine).unwrap(),
            bias: None,
        });
        for (kind, parts) in [("dense", dense.collect::<Vec<_>>()), ("quantized", quantized.collect())] {
            let fused = Fused::new(parts).unwrap();
            assert!(matches!(fused, Fused::One { .. }), "{kind}: the parts fuse");
            let whole = fused.forward(&x).unwrap();
            for from in 0..3 {
                let tail = fused.forward_tail(&x, from).unwrap();
                assert_eq!(tail.len(), 3 - from, "{kind} from {from}");
                for (a, b) in tail.iter().zip(&whole[from..]) {
                    assert_eq!(a.shape(), b.shape(), "{kind} from {from}");
                    assert!(a.to_bytes().unwrap() == b.to_bytes().unwrap(), "{kind} from {from}: other bits");
                }
            }
            let err = fused.forward_tail(&x, 4).unwrap_err().to_string();
            assert!(err.contains("no part 4"), "{kind}: {err}");
        }
    }
}
