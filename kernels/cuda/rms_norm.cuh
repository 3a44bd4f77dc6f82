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

}  // namespace tandem_norm
