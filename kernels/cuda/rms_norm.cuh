// RMSNorm of bf16/f16/f32 rows in fp32, optionally after the residual add, for every layer's norms:
//   y = w * (x * rsqrt(mean(x^2) + eps))                  (rms_norm.cu)
//   h' = h + m (rounded to h's dtype); y = the same of h'  (add_rms_norm.cu)
// with the scale w in fp32 and y rounded once to x's dtype.
//
// Why: MLX computes Tandem's fp32 norm of a bf16 row as three launches (the cast to fp32, the norm, the cast
// back) and the residual add before it as a fourth; a decode step of the 27B-shaped slice spent 79 of its 434
// kernel launches on such casts, and on CUDA a step is bound by MLX's host cost per launch (docs/PERF.md,
// session 15). This is one launch for all four.
//
// Exactness: a row is one block; each thread sums its strided elements in order, a warp's lanes meet by a
// butterfly whose lane 0 result is kept, and the warps' sums are added in warp order, so a row's result
// depends on nothing but the row: bit-identical whether it is normalised alone, in a verify or in a batch.
// h' is float(h) + float(m) rounded once, which for two bf16 or f16 values is the correctly rounded sum,
// what MLX's add gives.
//
// Inputs: rows of D elements, row-contiguous; w [D] fp32; eps as the template integer EPS (its fp32 bits).
// Launch: one block of THREADS threads per row. The bodies are rms_norm.cu and add_rms_norm.cu; the Rust glue
// src/kernels/norm.rs.

namespace tandem_norm {

constexpr int THREADS = 256;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_float(float v, float* out) { *out = v; }
__device__ __forceinline__ void from_float(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_float(float v, __half* out) { *out = __float2half_rn(v); }

// h[j] (+ m[j], rounded to T) as fp32.
template <bool ADD, typename T>
__device__ __forceinline__ float element(const T* h, const T* m, size_t j) {
  if (!ADD) {
    return to_float(h[j]);
  }
  T s;
  from_float(to_float(h[j]) + to_float(m[j]), &s);
  return to_float(s);
}

// One row per block: blockIdx.x is the row. `h_out` is written only when ADD.
template <bool ADD, typename T>
__device__ __forceinline__ void rms_norm(const T* h, const T* m, const float* w, T* h_out, T* y, int D, float eps) {
  __shared__ float warp_sums[THREADS / 32];
  const size_t row = static_cast<size_t>(blockIdx.x) * D;
  float acc = 0.0f;
  for (int j = threadIdx.x; j < D; j += THREADS) {
    const float v = element<ADD>(h, m, row + j);
    if (ADD) {
      from_float(v, &h_out[row + j]);
    }
    acc = fmaf(v, v, acc);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    warp_sums[threadIdx.x >> 5] = acc;
  }
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < THREADS / 32; ++i) {
    total += warp_sums[i];
  }
  const float inv = rsqrtf(total / static_cast<float>(D) + eps);
  for (int j = threadIdx.x; j < D; j += THREADS) {
    from_float(w[j] * (element<ADD>(h, m, row + j) * inv), &y[row + j]);
  }
}

// A Gated DeltaNet layer's gated norm (gated_norm.cu): each value head of the recurrence's output o [B, T, H, D]
// (f32) RMS-normalised with the f32 scale w [D], times silu(z) for z [B, T, H·D] (bf16, f16 or f32: a slice of
// the in-projection), rounded once to z's dtype into y [B, T, H·D] (row-contiguous). The inputs are read
// through their strides (the kernel is built with MLX's row-contiguity copy off), so z's slice is not copied.
// One warp per (row, head), GATED_HEADS heads a block; a head's sum of squares is its lanes' in-order sums met
// by the warp butterfly, so a head's result depends on that head only (a token alone, in a verify or a batch).
constexpr int GATED_HEADS = 4;

template <typename Shape, typename Strides, typename T>
__device__ __forceinline__ void gated_norm(const float* o, const Shape& o_shape, const Strides& os, const T* z,
                                           const Strides& zs, const float* w, const Strides& ws, T* y, float eps) {
  const int tokens = o_shape[1], heads = o_shape[2], d = o_shape[3];
  const long long warp = static_cast<long long>(blockIdx.x) * GATED_HEADS + (threadIdx.x >> 5);
  if (warp >= static_cast<long long>(o_shape[0]) * tokens * heads) {
    return;  // a whole warp: no barrier waits on it
  }
  const int lane = threadIdx.x & 31, h = static_cast<int>(warp % heads);
  const long long row = warp / heads;
  const long long b = row / tokens, t = row % tokens;
  const long long o0 = b * os[0] + t * os[1] + h * os[2];
  const long long z0 = b * zs[0] + t * zs[1] + static_cast<long long>(h) * d * zs[2];
  float acc = 0.0f;
  for (int j = lane; j < d; j += 32) {
    const float v = o[o0 + j * os[3]];
    acc = fmaf(v, v, acc);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  const float inv = rsqrtf(acc / static_cast<float>(d) + eps);
  T* out = y + warp * d;
  for (int j = lane; j < d; j += 32) {
    const float n = w[j * ws[0]] * (o[o0 + j * os[3]] * inv);
    const float g = to_float(z[z0 + j * zs[2]]);
    from_float(n * (g / (1.0f + expf(-g))), &out[j]);
  }
}

}  // namespace tandem_norm
