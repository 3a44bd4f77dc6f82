//! The two ends of a gated full-attention layer (docs/MODEL.md §3.3) around the attention itself, for text
//! positions:
//! - [`front`]: the fused projection's parts (`qg [B, T, Hq·2D]`, each query head's D features then its gate's;
//!   `k`, `v [B, T, Hkv·D]`) to the attention's inputs: q and k per head RMS-normalised and rotated (RoPE at
//!   row b's positions `pos[b] + t`), v by heads, each `[B, H, T, D]`. Through MLX that is about a dozen
//!   operations a layer ([`fallback`]: reshapes, a split, two norms, three transposes, two RoPEs);
//! - [`gate`]: the attention's output `o [B, Hq, T, D]` times `sigmoid(gate)` as `[B, T, Hq·D]` for the
//!   out-projection, the gate read where it lies in `qg` ([`gate_fallback`]: the gate's split and copy, o's
//!   transpose and reshape, the gated product).
//!
//! On CUDA, where a decode step is bound by MLX's host cost per operation (docs/PERF.md), each is one launch of
//! kernels/cuda/attention_front.cuh, built strided so the projection's parts are read in place. The front's
//! norm sums in the norm kernel's order; its rotation is MLX's formula in fp32, whose bits can differ from
//! MLX's kernel where the compilers contract differently; the gate's sigmoid is `1 / (1 + expf(-g))`. So the
//! tolerance against the fallback is the host kernels' ([`host_tolerance`]: half an ulp of a bf16 or f16
//! output, 1e-5 of an f32 one). A head's result depends on its own row only (a token alone, in a verify or in a
//! batch: the same bits). Selected on the classes in [`TESTED_CLASSES`] / [`GATE_TESTED_CLASSES`] (none yet:
//! their GPU parity tests have not run) or under `TANDEM_KERNELS=on`; `-attention_front` and `-attention_gate`
//! turn them off. Their source is checked on every machine by a CPU emulation
//! (tests/it/emulate/attention_front.cpp).

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx::kernel::{Kernel, KernelBackend, Launch};
use mlx::{random, Array, Dtype};

use super::quantized_matmul::{host_tolerance, relative_error};
use super::{fused, norm, probe_verdict, with_cached, KernelCache};

type Result<T> = std::result::Result<T, mlx::Error>;

/// The front kernel's name for `TANDEM_KERNELS=-attention_front`.
pub const NAME: &str = "attention_front";
/// The gate kernel's name for `TANDEM_KERNELS=-attention_gate`.
pub const GATE_NAME: &str = "attention_gate";
/// Compute capabilities (major, minor) where the front kernel's parity test passed: none yet.
pub const TESTED_CLASSES: &[(u32, u32)] = &[];
/// Compute capabilities (major, minor) where the gate kernel's parity test passed: none yet.
pub const GATE_TESTED_CLASSES: &[(u32, u32)] = &[];

const HEADER: &str =
    concat!(include_str!("../../kernels/cuda/rms_norm.cuh"), include_str!("../../kernels/cuda/attention_front.cuh"));
const FRONT_BODY: &str = include_str!("../../kernels/cuda/attention_front.cu");
const GATE_BODY: &str = include_str!("../../kernels/cuda/attention_gate.cu");
/// Heads a front block (`tandem_front::HEADS`), one warp each.
const HEADS_PER_BLOCK: i32 = 4;
/// Threads of a gate block.
const GATE_THREADS: i32 = 256;

/// What a layer's front needs besides the projection's parts.
#[derive(Clone, Copy)]
pub struct Front<'a> {
    /// The q and k norms' fp32 scales `[D]`.
    pub q_scale: &'a Array,
    pub k_scale: &'a Array,
    pub eps: f32,
    /// Features RoPE rotates (the first ones of each head) and its base.
    pub rope_dims: i32,
    pub rope_theta: f32,
}

/// The attention's inputs `[B, H, T, D]`, and the gates `[B, T, Hq·D]` where the fallback split them out (for
/// [`gate`], which otherwise reads them in `qg`).
pub struct Heads {
    pub q: Array,
    pub k: Array,
    pub v: Array,
    pub gate: Option<Array>,
}

/// q, k and v as the attention reads them, q and k normed and rotated at positions `pos [B]` (int32, row b's
/// first) + t: the kernel where [`selected`], MLX's operations otherwise.
pub fn front(qg: &Array, k: &Array, v: &Array, pos: &Array, f: &Front) -> Result<Heads> {
    if selected(qg, k, v, pos, f) {
        let (q, k, v) = cuda(qg, k, v, pos, f)?;
        return Ok(Heads { q, k, v, gate: None });
    }
    fallback_heads(qg, k, v, pos, f)
}

/// The query heads `[B, T, Hq, D]` and their gates `[B, T, Hq·D]` of `qg` (a strided view and a copy).
pub fn query_and_gate(qg: &Array, d: i32) -> Result<(Array, Array)> {
    let (b, t, hq) = (qg.dim(0), qg.dim(1), qg.dim(2) / (2 * d));
    let halves = qg.reshape(&[b, t, hq, 2 * d])?.split(2, 3)?;
    let gate = halves[1].reshape(&[b, t, hq * d])?;
    Ok((halves[0].clone(), gate))
}

/// MLX's operations the front kernel replaces: the norms (`norm::rms_norm`, itself a kernel where one is
/// selected), the transposes to heads and RoPE at each row's positions.
pub fn fallback(qg: &Array, k: &Array, v: &Array, pos: &Array, f: &Front) -> Result<(Array, Array, Array)> {
    let Heads { q, k, v, .. } = fallback_heads(qg, k, v, pos, f)?;
    Ok((q, k, v))
}

fn fallback_heads(qg: &Array, k: &Array, v: &Array, pos: &Array, f: &Front) -> Result<Heads> {
    let Heads { q, k, v, gate } = heads(qg, k, v, f)?;
    let rope = |x: &Array| super::rope::rope(x, f.rope_dims, f.rope_theta, pos);
    Ok(Heads { q: rope(&q)?, k: rope(&k)?, v, gate })
}

/// The fallback's heads before RoPE: q and k normed (`norm::rms_norm`, itself a kernel where one is selected),
/// v, each `[B, H, T, D]`, and the gates: what M-RoPE after images rotates.
pub fn heads(qg: &Array, k: &Array, v: &Array, f: &Front) -> Result<Heads> {
    let (q, gate) = query_and_gate(qg, f.q_scale.dim(0))?;
    let q = norm::rms_norm(&q, f.q_scale, f.eps)?.swapaxes(1, 2)?;
    let (k, v) = key_value_heads(k, v, f)?;
    Ok(Heads { q, k, v, gate: Some(gate) })
}

/// The projected keys (normed) and values `[B, T, Hkv·D]` as heads `[B, Hkv, T, D]`, before RoPE.
pub fn key_value_heads(k: &Array, v: &Array, f: &Front) -> Result<(Array, Array)> {
    let d = f.k_scale.dim(0);
    let (b, t, hkv) = (k.dim(0), k.dim(1), k.dim(2) / d);
    let k = norm::rms_norm(&k.reshape(&[b, t, hkv, d])?, f.k_scale, f.eps)?.swapaxes(1, 2)?;
    Ok((k, v.reshape(&[b, t, hkv, d])?.swapaxes(1, 2)?))
}

/// Whether a call takes the front kernel: MLX on a CUDA GPU whose class passed the parity test (or
/// `TANDEM_KERNELS=on`), not `-attention_front`, [`applicable`] arrays, and this machine's probe passed for
/// the dtype.
pub fn selected(qg: &Array, k: &Array, v: &Array, pos: &Array, f: &Front) -> bool {
    taken(qg.dtype()) && applicable(qg, k, v, pos, f)
}

/// Whether the front kernel is taken for projections of `dtype` whose shapes it serves ([`selected`] before the
/// shapes): a layer's writes of keys alone ask this, to write the bits its whole passes write.
pub fn taken(dtype: Dtype) -> bool {
    super::cuda_allows(Some(NAME), TESTED_CLASSES) && front_probe_passed(dtype)
}

/// What the front kernel computes: qg `[B, T, Hq·2D]`, k and v `[B, T, Hkv·D]` of one dtype (bf16, f16, f32),
/// the scales `[D]` f32, pos `[B]` int32, RoPE on an even number of features from 2 to D (MLX's RoPE refuses 0).
pub fn applicable(qg: &Array, k: &Array, v: &Array, pos: &Array, f: &Front) -> bool {
    let dt = qg.dtype();
    let d = if f.q_scale.ndim() == 1 { f.q_scale.dim(0) } else { 0 };
    d > 0
        && matches!(dt, Dtype::BF16 | Dtype::F16 | Dtype::F32)
        && qg.ndim() == 3
        && qg.size() > 0
        && k.dtype() == dt
        && v.dtype() == dt
        && f.q_scale.dtype() == Dtype::F32
        && f.k_scale.dtype() == Dtype::F32
        && f.k_scale.shape() == [d]
        && pos.dtype() == Dtype::I32
        && pos.shape() == [qg.dim(0)]
        && (2..=d).contains(&f.rope_dims)
        && f.rope_dims % 2 == 0
        && {
            let (qs, ks) = (qg.shape(), k.shape());
            qs[2] % (2 * d) == 0
                && ks.len() == 3
                && ks[..2] == qs[..2]
                && ks[2] % d == 0
                && ks[2] > 0
                && v.shape() == ks
        }
}

/// Runs the front kernel (elsewhere MLX reports an error when the result is evaluated). The parity tests call
/// this.
pub fn cuda(qg: &Array, k: &Array, v: &Array, pos: &Array, f: &Front) -> Result<(Array, Array, Array)> {
    if !applicable(qg, k, v, pos, f) {
        let arrays = super::arrays_text(&[("qg", qg), ("k", k), ("v", v), ("pos", pos), ("q scale", f.q_scale)]);
        return Err(mlx::Error::Invalid(format!("attention front kernel: {arrays}, {} RoPE dims", f.rope_dims)));
    }
    let d = f.q_scale.dim(0);
    let (b, t, hq, hkv) = (qg.dim(0), qg.dim(1), qg.dim(2) / (2 * d), k.dim(2) / d);
    let heads = b * t * (hq + 2 * hkv);
    let blocks = (heads + HEADS_PER_BLOCK - 1) / HEADS_PER_BLOCK;
    let (q_shape, kv_shape) = ([b, hq, t, d], [b, hkv, t, d]);
    let dt = qg.dtype();
    let mut out = with_kernel(Stage::Front, dt, |kernel| {
        kernel.call(
            &[qg, k, v, f.q_scale, f.k_scale, pos],
            &Launch {
                outputs: &[(&q_shape[..], dt), (&kv_shape[..], dt), (&kv_shape[..], dt)],
                grid: [blocks * 32 * HEADS_PER_BLOCK, 1, 1],
                threadgroup: [32 * HEADS_PER_BLOCK, 1, 1],
                template: &[
                    ("ROPE_DIMS", f.rope_dims),
                    ("EPS", f.eps.to_bits() as i32),
                    // MLX passes its RoPE kernels log2 of the base computed in fp32.
                    ("BASE", f.rope_theta.log2().to_bits() as i32),
                ],
            },
        )
    })?
    .into_iter();
    match (out.next(), out.next(), out.next()) {
        (Some(q), Some(k), Some(v)) => Ok((q, k, v)),
        _ => Err(mlx::Error::Invalid("attention front kernel: too few outputs".into())),
    }
}

/// `o · sigmoid(gate)` as `[B, T, Hq·D]` for `o [B, Hq, T, D]` and the query projection `qg [B, T, Hq·2D]`:
/// the kernel where [`gate_selected`], MLX's operations otherwise (over `split`, the gates where already split
/// out of `qg`).
pub fn gate(o: &Array, qg: &Array, split: Option<&Array>) -> Result<Array> {
    if gate_selected(o, qg) {
        return gate_cuda(o, qg);
    }
    match split {
        Some(gate) => gated(o, gate),
        None => gate_fallback(o, qg),
    }
}

/// MLX's operations the gate kernel replaces: the gate's copy out of `qg`, o's transpose and reshape, the
/// compiled gated product.
pub fn gate_fallback(o: &Array, qg: &Array) -> Result<Array> {
    gated(o, &query_and_gate(qg, o.dim(3))?.1)
}

fn gated(o: &Array, gate: &Array) -> Result<Array> {
    let (b, hq, t, d) = (o.dim(0), o.dim(1), o.dim(2), o.dim(3));
    fused::sigmoid_gate(&o.swapaxes(1, 2)?.reshape(&[b, t, hq * d])?, gate)
}

/// Whether a call takes the gate kernel (as [`selected`], for `-attention_gate` and [`GATE_TESTED_CLASSES`]).
pub fn gate_selected(o: &Array, qg: &Array) -> bool {
    super::cuda_allows(Some(GATE_NAME), GATE_TESTED_CLASSES) && gate_applicable(o, qg) && gate_probe_passed(o.dtype())
}

/// What the gate kernel computes: o `[B, Hq, T, D]` and qg `[B, T, Hq·2D]` of one dtype (bf16, f16, f32).
pub fn gate_applicable(o: &Array, qg: &Array) -> bool {
    o.ndim() == 4
        && o.size() > 0
        && matches!(o.dtype(), Dtype::BF16 | Dtype::F16 | Dtype::F32)
        && qg.dtype() == o.dtype()
        && qg.shape() == [o.dim(0), o.dim(2), 2 * o.dim(1) * o.dim(3)]
}

/// Runs the gate kernel (elsewhere MLX reports an error when the result is evaluated).
pub fn gate_cuda(o: &Array, qg: &Array) -> Result<Array> {
    if !gate_applicable(o, qg) {
        let arrays = super::arrays_text(&[("o", o), ("qg", qg)]);
        return Err(mlx::Error::Invalid(format!("attention gate kernel: {arrays}")));
    }
    let (b, hq, t, d) = (o.dim(0), o.dim(1), o.dim(2), o.dim(3));
    let n = b * hq * t * d;
    let shape = [b, t, hq * d];
    let mut out = with_kernel(Stage::Gate, o.dtype(), |kernel| {
        kernel.call(
            &[o, qg],
            &Launch {
                outputs: &[(&shape[..], o.dtype())],
                grid: [(n + GATE_THREADS - 1) / GATE_THREADS * GATE_THREADS, 1, 1],
                threadgroup: [GATE_THREADS, 1, 1],
                template: &[],
            },
        )
    })?;
    out.pop().ok_or_else(|| mlx::Error::Invalid("attention gate kernel: no output".into()))
}

#[derive(Clone, Copy, PartialEq)]
enum Stage {
    Front,
    Gate,
}

/// The kernel object for a stage and dtype, made once per thread; strided, so the projection's parts are read
/// where they lie.
fn with_kernel<R>(stage: Stage, dtype: Dtype, f: impl FnOnce(&Kernel) -> Result<R>) -> Result<R> {
    thread_local! {
        static KERNELS: KernelCache<(u8, Dtype)> = const { RefCell::new(Vec::new()) };
    }
    let make = || {
        let suffix = super::dtype_suffix(dtype);
        match stage {
            Stage::Front => Kernel::strided(
                KernelBackend::Cuda,
                &format!("tandem_attention_front_{suffix}"),
                &["qg", "k", "v", "qw", "kw", "pos"],
                &["q", "k_rot", "v_heads"],
                FRONT_BODY,
                HEADER,
            ),
            Stage::Gate => Kernel::strided(
                KernelBackend::Cuda,
                &format!("tandem_attention_gate_{suffix}"),
                &["o", "qg"],
                &["y"],
                GATE_BODY,
                HEADER,
            ),
        }
    };
    with_cached(&KERNELS, (stage as u8, dtype), make, f)
}

fn front_probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)].get_or_init(|| {
        probe_verdict(&format!("attention front kernel ({dtype:?})"), front_probe(dtype), host_tolerance(dtype))
    })
}

fn gate_probe_passed(dtype: Dtype) -> bool {
    static PROBES: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    *PROBES[super::dtype_slot(dtype)].get_or_init(|| {
        probe_verdict(&format!("attention gate kernel ({dtype:?})"), gate_probe(dtype), host_tolerance(dtype))
    })
}

/// Random inputs of one layer: `(qg, k, v, pos, q_scale, k_scale)`, the parts sliced from one wider projection
/// `[b, t, (2·hq + 2·hkv)·d + 5]` of `dtype` as the fused projection's split gives them, the scales ~ N(1, 0.1),
/// row i's first position `offset + 7·i`.
#[allow(clippy::type_complexity)]
pub fn random_inputs(
    (b, t, hq, hkv, d): (i32, i32, i32, i32, i32),
    offset: i32,
    dtype: Dtype,
    seed: u64,
) -> Result<(Array, Array, Array, Array, Array, Array)> {
    let keys = random::split(&random::key(seed)?, 3)?;
    let (nq, nk) = (2 * hq * d, hkv * d);
    let wide = random::normal(&[b, t, nq + 2 * nk + 5], Dtype::F32, &keys[0])?.multiply(&Array::f32(2.0))?;
    let wide = wide.as_dtype(dtype)?;
    let parts = wide.split_at(&[nq, nq + nk, nq + 2 * nk], 2)?;
    let scale = |key: &Array| -> Result<Array> {
        random::normal(&[d], Dtype::F32, key)?.multiply(&Array::f32(0.1))?.add(&Array::f32(1.0))
    };
    let pos: Vec<i32> = (0..b).map(|i| offset + 7 * i).collect();
    let pos = Array::from_slice(&pos, &[b])?;
    Ok((parts[0].clone(), parts[1].clone(), parts[2].clone(), pos, scale(&keys[1])?, scale(&keys[2])?))
}

/// Relative error of the front kernel's q, k and v (concatenated) against the fallback's: two sequences of three
/// tokens, four query heads and one key head of 64 features (the last front block part-filled), RoPE on 16 at
/// positions past 1,000, the parts sliced from a wider projection.
pub fn front_probe(dtype: Dtype) -> Result<f32> {
    let (qg, k, v, pos, qw, kw) = random_inputs((2, 3, 4, 1, 64), 1_000, dtype, 0x6174_6672)?;
    let f = Front { q_scale: &qw, k_scale: &kw, eps: 1e-6, rope_dims: 16, rope_theta: 1e7 };
    let flat = |(q, k, v): (Array, Array, Array)| -> Result<Array> {
        mlx::concatenate(&[&q.reshape(&[-1])?, &k.reshape(&[-1])?, &v.reshape(&[-1])?], 0)
    };
    relative_error(&flat(cuda(&qg, &k, &v, &pos, &f)?)?, &flat(fallback(&qg, &k, &v, &pos, &f)?)?)
}

/// Relative error of the gate kernel's output against the fallback's, o transposed (as a strided view).
pub fn gate_probe(dtype: Dtype) -> Result<f32> {
    let (qg, _, _, _, _, _) = random_inputs((2, 3, 4, 1, 64), 0, dtype, 0x6174_6761)?;
    let o = random::normal(&[2, 3, 4, 64], Dtype::F32, &random::key(0x6f)?)?.as_dtype(dtype)?.swapaxes(1, 2)?;
    relative_error(&gate_cuda(&o, &qg)?, &gate_fallback(&o, &qg)?)
}
