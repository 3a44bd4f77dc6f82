// The linear-attention layers' causal depthwise conv and the SiLU after it, for a decode step or an MTP verify
// (T = 1..16 new positions), in fp32:
//   y[b, t, c] = silu(sum_{i < K} w[c, i] * x[b, t + i, c])
// over x = [conv window (K - 1 rows) ++ the T new rows].
//
// Why: MLX 0.32.4's CUDA conv runs through cuDNN, which builds a graph per exact input shape (cached, but a
// build costs ~100-300 ms on the H200): every new batch size and verify width met one, several times in a
// short batched run as streams finish and depths change (docs/PERF.md, session 14). It is also three MLX
// operations (the cast of x to fp32, the conv, the SiLU) where this is one launch.
//
// Exactness across T and B: an output depends only on its own K inputs and weights, summed in the order
// i = 0..K-1, so a position's result is bit-identical whether it is decoded alone or inside a verify or a
// batch.
//
// Inputs: x [B, K - 1 + T, C] (bf16, f16 or f32, row-contiguous), w [C, K, 1] (fp32). Output y [B, T, C]
// (fp32). Launch: one thread per output, threads (C, T, B) in blocks of (256, 1, 1). The body is
// conv_silu.cu; the Rust glue src/kernels/conv.rs.

namespace tandem_conv {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <int K, typename T>
__device__ __forceinline__ void conv_silu(const T* x, const float* w, float* y, int B, int L, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  const int b = blockIdx.z;
  const int steps = L - K + 1;
  if (c >= C || t >= steps || b >= B) {
    return;
  }
  const T* xs = x + (static_cast<size_t>(b) * L + t) * C + c;
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    acc = fmaf(w[c * K + i], to_float(xs[static_cast<size_t>(i) * C]), acc);
  }
  y[(static_cast<size_t>(b) * steps + t) * C + c] = acc / (1.0f + expf(-acc));
}

// The same conv read from the window and the new rows where they lie, for a decode step or a verify
// (conv_window.cu): x = [prev (K - 1 rows) ++ new (T rows)] is never built as an array. Besides y it writes the
// next window (the last K - 1 rows of x, in the rows' dtype) and, where RECORD, x itself (what a verify's
// rollback reads, `cache::Recording::conv_input`): a layer's concatenation, its window slice and the conv are
// one launch. prev and new are read through their strides (the kernel is built with MLX's row-contiguity copy
// off: new is a slice of the in-projection; w too). Threads (C, T + R, B): rows t < T compute y exactly as conv_silu
// does (the same products in the same order, so the same bits); rows T + j copy: without RECORD, window row j
// (R = K - 1); with it, x's row j (R = K - 1 + T), which for j >= T is also window row j - T.
template <typename T, typename Strides>
__device__ __forceinline__ const T& row_at(const T* prev, const Strides& ps, const T* next, const Strides& ns, int b,
                                           int s, int c, int K) {
  return s < K - 1 ? prev[b * ps[0] + s * ps[1] + c * ps[2]] : next[b * ns[0] + (s - (K - 1)) * ns[1] + c * ns[2]];
}

template <int K, bool RECORD, typename T, typename Shape, typename Strides>
__device__ __forceinline__ void conv_window(const T* prev, const Strides& ps, const T* next, const Shape& next_shape,
                                            const Strides& ns, const float* w, const Strides& ws, float* y, T* window,
                                            T* input) {
  const int B = next_shape[0], steps = next_shape[1], C = next_shape[2];
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  const int b = blockIdx.z;
  if (c >= C || b >= B) {
    return;
  }
  if (t < steps) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      acc = fmaf(w[c * ws[0] + i * ws[1]], to_float(row_at(prev, ps, next, ns, b, t + i, c, K)), acc);
    }
    y[(static_cast<size_t>(b) * steps + t) * C + c] = acc / (1.0f + expf(-acc));
    return;
  }
  const int j = t - steps;
  if (RECORD) {
    if (j >= K - 1 + steps) {
      return;
    }
    const T v = row_at(prev, ps, next, ns, b, j, c, K);
    input[(static_cast<size_t>(b) * (K - 1 + steps) + j) * C + c] = v;
    if (j >= steps) {
      window[(static_cast<size_t>(b) * (K - 1) + j - steps) * C + c] = v;
    }
  } else if (j < K - 1) {
    window[(static_cast<size_t>(b) * (K - 1) + j) * C + c] = row_at(prev, ps, next, ns, b, steps + j, c, K);
  }
}

}  // namespace tandem_conv
