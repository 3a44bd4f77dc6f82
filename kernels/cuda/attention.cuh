// Causal attention of T queries over the first L keys of a KV cache buffer: a decode step (T = 1) and an MTP
// verify (T = depth + 1), query t seeing keys 0 .. L - T + t. Two launches: `partial` per key-value head and
// chunk of C keys, `combine` per query head and query.
//
// Why: MLX 0.32.4's CUDA attention has no one-query kernel for head_dim 256 (Qwen3.5's), so each call ran
// its op-by-op fallback (scale, expand, matmul, softmax, matmul: ~10 operations, the matmuls meeting a new
// key length every step), and a batched verify ran one such call per stream and query. Host time, not
// the GPU, was what a batched cycle waited on (docs/PERF.md).
//
// Exactness across T: a query's result depends only on its own row of q and the keys it sees. Chunks are
// fixed by absolute key position (c * C .. c * C + C); inside a chunk each key's score is a warp's dot
// product in a fixed order, masked positions are exact zeros in every sum (a query of a verify with a key
// it must not see adds 0 where decoding's call, which stops at its last key, adds nothing: the same
// bits), and the combine runs over chunks in order (a chunk a query sees none of adds exact zeros). So a
// verify's query t is bit-identical to a decode step over L - T + t + 1 keys: a verify scores drafts
// with decoding's own attention.
//
// Inputs: q [Hq, T, D] (bf16, f16 or f32; row-contiguous), k and v [Hkv, CAP, D] (the cache's buffers,
// q's dtype), params f32 [2] = (L, scale). Outputs: parts [Hq, T, NC, D] and stats [Hq, T, NC, 2] (max and
// sum of the chunk's exponentials) in fp32, then o [Hq, T, D] in q's dtype. Launch: partial with blocks
// (NC, Hkv) of 256 threads; combine with blocks (1, Hq * T) of D threads. The bodies are
// attention_partial.cu and attention_combine.cu; the Rust glue src/kernels/attention.rs.

namespace tandem_attn {

constexpr int C = 64;        // keys per chunk
constexpr int THREADS = 256; // threads of a partial block
constexpr int WARPS = THREADS / 32;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, off);
  }
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  }
  return x;
}

// One block: key-value head g = blockIdx.y, chunk c = blockIdx.x, all ROWS >= rep * T rows of q that read
// head g (row r = local query head * T + query).
template <int D, int ROWS, typename T>
__device__ __forceinline__ void partial(const T* q, const T* k, const T* v, const float* params, float* parts,
                                        float* stats, int HQ, int HKV, int NT, int CAP) {
  static_assert(D % 32 == 0 && D <= THREADS, "D: a multiple of 32, at most 256");
  constexpr int PER = D / 32;
  __shared__ float qs[ROWS][D];
  __shared__ float s[ROWS][C];
  const int g = blockIdx.y, c = blockIdx.x, nc = gridDim.x;
  const int rep = HQ / HKV, rows = rep * NT;
  const int L = static_cast<int>(params[0]);
  const float scale = params[1];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const T* qg = q + static_cast<size_t>(g) * rows * D;
  for (int i = tid; i < rows * D; i += THREADS) {
    qs[i / D][i % D] = to_float(qg[i]);
  }
  __syncthreads();

  // Scores: warp w takes the chunk's keys w, w + WARPS, ...; lane l holds elements l + 32 i of the key.
  for (int jj = warp; jj < C; jj += WARPS) {
    const int j = c * C + jj;
    float kk[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      kk[i] = j < L ? to_float(k[(static_cast<size_t>(g) * CAP + j) * D + lane + 32 * i]) : 0.0f;
    }
    for (int r = 0; r < rows; ++r) {
      const int seen = L - NT + (r % NT) + 1;  // keys query r sees
      float dot = -INFINITY;
      if (j < seen) {  // the same for the whole warp
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
          acc = fmaf(qs[r][lane + 32 * i], kk[i], acc);
        }
        dot = warp_sum(acc) * scale;
      }
      if (lane == 0) {
        s[r][jj] = dot;
      }
    }
  }
  __syncthreads();

  // Per row: the chunk's max, exponentials (0 where masked, and for a chunk the row sees none of), sum.
  for (int r = warp; r < rows; r += WARPS) {
    const float a = s[r][lane], b = s[r][lane + 32];
    const float m = warp_max(fmaxf(a, b));
    const float pa = m == -INFINITY ? 0.0f : expf(a - m);
    const float pb = m == -INFINITY ? 0.0f : expf(b - m);
    s[r][lane] = pa;
    s[r][lane + 32] = pb;
    const float l = warp_sum(pa + pb);
    if (lane == 0) {
      float* st = stats + ((static_cast<size_t>(g) * rows + r) * nc + c) * 2;
      st[0] = m;
      st[1] = l;
    }
  }
  __syncthreads();

  // Values: thread d sums p_j v_j[d] over the chunk's keys in order, for every row.
  if (tid < D) {
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      acc[r] = 0.0f;
    }
    const int end = min(C, L - c * C);
    for (int jj = 0; jj < end; ++jj) {
      const float vj = to_float(v[(static_cast<size_t>(g) * CAP + c * C + jj) * D + tid]);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (r < rows) {
          acc[r] = fmaf(s[r][jj], vj, acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r < rows) {
        parts[((static_cast<size_t>(g) * rows + r) * nc + c) * D + tid] = acc[r];
      }
    }
  }
}

// One block per (query head, query) = blockIdx.y, thread d: the chunks' partial sums weighed by
// exp(max_c - max), in chunk order, over the sum of exponentials.
template <typename T>
__device__ __forceinline__ void combine(const float* parts, const float* stats, T* o, int NC, int D) {
  const int row = blockIdx.y, d = threadIdx.x;
  if (d >= D) {
    return;
  }
  const float* st = stats + static_cast<size_t>(row) * NC * 2;
  float m = -INFINITY;
  for (int c = 0; c < NC; ++c) {
    m = fmaxf(m, st[2 * c]);
  }
  float l = 0.0f, acc = 0.0f;
  for (int c = 0; c < NC; ++c) {
    const float w = st[2 * c] == -INFINITY ? 0.0f : expf(st[2 * c] - m);
    l = fmaf(w, st[2 * c + 1], l);
    acc = fmaf(w, parts[(static_cast<size_t>(row) * NC + c) * D + d], acc);
  }
  o[static_cast<size_t>(row) * D + d] = from_float<T>(acc / l);
}

}  // namespace tandem_attn
