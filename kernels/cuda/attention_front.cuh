// The two ends of a gated full-attention layer around its attention, each in one launch (after rms_norm.cuh,
// whose conversions and norm order they share):
//   front (attention_front.cu): the fused projection's query, key and value parts [B, T, ·] to q [B, Hq, T, D]
//     and k [B, Hkv, T, D], each head RMS-normalised with its fp32 scale and rounded to the dtype, then rotated
//     (RoPE, rotate-half form, on the first ROPE_DIMS features, at position pos[b] + t) and rounded again, and
//     v [B, Hkv, T, D]: the layer's reshapes, split, two norms, three transposes and two RoPEs (about a dozen
//     MLX operations) in one launch.
//   gate (attention_gate.cu): o [B, Hq, T, D] (the attention's output) times sigmoid(gate) as [B, T, Hq·D], the
//     gate read where it lies in the query projection (head h's gate is columns 2hD+D .. 2hD+2D): the gate's
//     split and copy, o's transpose and reshape and the gated product, four operations, in one.
//
// Why: a decode step of the 27B-shaped slice is bound by MLX's host cost per operation on CUDA (docs/PERF.md);
// an attention layer was ~22 operations, 9 with these two.
//
// Exactness: a head's sum of squares follows the norm kernel's order (rms_norm.cuh, one block of THREADS per
// row): lane l of warp w there holds the elements w·32 + l + k·THREADS, summed by fmaf in order, the warp's
// lanes meet by the butterfly, and the warps' sums are added in warp order. Here one warp holds a head and
// forms those THREADS / 32 sums one after another, so its normed values are the norm kernel's bits. The
// rotation is MLX's formula (inverse frequency exp2(-(i / half) · log2(base)), angle position · frequency,
// x1·cos − x2·sin and x1·sin + x2·cos in fp32): its bits can differ from MLX's where the compilers contract
// differently, hence a tolerance (src/kernels/attention_front.rs). Each head depends on nothing but its own
// row: a token's result is the same alone, in a verify or in a batch.
//
// Inputs are read through their strides (the kernels are built with MLX's row-contiguity copy off), so the
// projection's parts are not copied. Launch: front, one warp per (row, head) over Hq + 2·Hkv heads, HEADS warps
// a block; gate, one thread per output element. Rust glue: src/kernels/attention_front.rs.

namespace tandem_front {

using tandem_norm::from_float;
using tandem_norm::to_float;

constexpr int HEADS = 4;
constexpr int NORM_WARPS = tandem_norm::THREADS / 32;

// 1 / rms of the d elements x[base + j·stride] in the norm kernel's summation order (every lane gets it).
template <typename T>
__device__ __forceinline__ float inv_rms(const T* x, long long base, long long stride, int d, float eps, int lane) {
  float total = 0.0f;
  for (int w = 0; w < NORM_WARPS; ++w) {
    float acc = 0.0f;
    for (int j = w * 32 + lane; j < d; j += tandem_norm::THREADS) {
      const float v = to_float(x[base + j * stride]);
      acc = fmaf(v, v, acc);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    }
    total += acc;
  }
  return rsqrtf(total / static_cast<float>(d) + eps);
}

// Element j of the normed head, rounded to T as the norm's output is, as fp32.
template <typename T>
__device__ __forceinline__ float normed(const T* x, long long base, long long stride, const float* w, long long ws,
                                        int j, float inv) {
  T r;
  from_float(w[j * ws] * (to_float(x[base + j * stride]) * inv), &r);
  return to_float(r);
}

template <typename Shape, typename Strides, typename T>
__device__ __forceinline__ void front(const T* qg, const Shape& qg_shape, const Strides& qs, const T* k,
                                      const Shape& k_shape, const Strides& ks, const T* v, const Strides& vs,
                                      const float* qw, const Shape& qw_shape, const Strides& qws, const float* kw,
                                      const Strides& kws, const int* pos, const Strides& ps, T* q_out, T* k_out,
                                      T* v_out, int rope_dims, float eps, float base_log2) {
  const int d = qw_shape[0], tokens = qg_shape[1];
  const int hq = qg_shape[2] / (2 * d), hkv = k_shape[2] / d, heads = hq + 2 * hkv;
  const long long warp = static_cast<long long>(blockIdx.x) * HEADS + (threadIdx.x >> 5);
  if (warp >= static_cast<long long>(qg_shape[0]) * tokens * heads) {
    return;  // a whole warp: no shuffle waits on it
  }
  const int lane = threadIdx.x & 31, h = static_cast<int>(warp % heads);
  const long long row = warp / heads, b = row / tokens, t = row % tokens;
  if (h >= hq + hkv) {  // a value head: moved to its place
    const int vh = h - hq - hkv;
    const long long base = b * vs[0] + t * vs[1] + static_cast<long long>(vh) * d * vs[2];
    T* out = v_out + ((b * hkv + vh) * tokens + t) * d;
    for (int j = lane; j < d; j += 32) {
      out[j] = v[base + j * vs[2]];
    }
    return;
  }
  const bool query = h < hq;
  const int kh = h - hq;
  const T* x = query ? qg : k;
  const long long stride = query ? qs[2] : ks[2];
  const long long base = query ? b * qs[0] + t * qs[1] + 2LL * h * d * qs[2]
                               : b * ks[0] + t * ks[1] + static_cast<long long>(kh) * d * ks[2];
  const float* w = query ? qw : kw;
  const long long ws = query ? qws[0] : kws[0];
  T* out = query ? q_out + ((b * hq + h) * tokens + t) * d : k_out + ((b * hkv + kh) * tokens + t) * d;
  const float inv = inv_rms(x, base, stride, d, eps, lane);
  const int half = rope_dims / 2;
  const float position = static_cast<float>(pos[b * ps[0]] + static_cast<int>(t));
  for (int j = lane; j < d; j += 32) {
    const float n = normed(x, base, stride, w, ws, j, inv);
    float r = n;
    if (j < rope_dims) {
      const int i = j < half ? j : j - half;
      const float inv_freq = exp2f(-(static_cast<float>(i) / static_cast<float>(half)) * base_log2);
      const float theta = position * inv_freq;
      const float c = cosf(theta), s = sinf(theta);
      if (j < half) {
        r = n * c - normed(x, base, stride, w, ws, j + half, inv) * s;
      } else {
        r = normed(x, base, stride, w, ws, j - half, inv) * s + n * c;
      }
    }
    from_float(r, &out[j]);
  }
}

template <typename Shape, typename Strides, typename T>
__device__ __forceinline__ void gate(const T* o, const Shape& o_shape, const Strides& os, const T* qg,
                                     const Strides& qs, T* y) {
  const int hq = o_shape[1], tokens = o_shape[2], d = o_shape[3];
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(o_shape[0]) * hq * tokens * d) {
    return;
  }
  const int j = static_cast<int>(i % d), h = static_cast<int>((i / d) % hq);
  const long long row = i / (static_cast<long long>(d) * hq), b = row / tokens, t = row % tokens;
  const float g = to_float(qg[b * qs[0] + t * qs[1] + (2LL * h * d + d + j) * qs[2]]);
  T sg;
  from_float(1.0f / (1.0f + expf(-g)), &sg);
  from_float(to_float(o[b * os[0] + h * os[1] + t * os[2] + j * os[3]]) * to_float(sg), &y[i]);
}

}  // namespace tandem_front
