// Gated-delta recurrence over T = 1..9 tokens with the state after every step (MTP verify and rollback).
//
// For each batch b, value head h (key head h / (HV / HK)) and token t, with the state S [DV, DK] in fp32:
//   S     = S * g[t]                        (the decay gate, one scalar per head)
//   kv    = S k[t]                          ([DV], a dot product over DK per row)
//   delta = (v[t] - kv) * beta[t]
//   S     = S + delta k[t]^T                (rank-one update)
//   y[t]  = S q[t]
// as MLX's gated_delta_update computes it (docs/MODEL.md §3.2). MLX 0.32.4's CUDA backend runs T > 1 as
// a loop of ops (about seven a token); a rollback after a partly accepted verify then ran the recurrence
// again over the kept prefix. Here one launch runs all T steps and writes the state after each step to
// states[t], so a rollback to any prefix is a slice.
//
// Work split: one warp per state row (b, h, dv), lane l holding S[dv][l + 32 i] for i < DK / 32 in
// registers (each load and store of a row is 128 contiguous bytes per instruction). The two dot products
// are butterfly sums over the warp (every lane ends with the same bits). Nothing depends on T or on other
// rows, so a token's output and state are bit-identical whether it is the only token of the call (a
// plain decode step) or one of a verify's T: a verify's recurrence is decoding's own, and states[t - 1]
// is the state a decode of the first t tokens would hold.
//
// Inputs (fp32, row-contiguous): q, k [B, T, HK, DK]; v [B, T, HV, DV]; g, beta [B, T, HV]; state
// [B, HV, DV, DK]. Outputs: y [B, T, HV, DV]; states [T, B, HV, DV, DK]. Launch: threads (32, DV, B * HV),
// blocks of (32, ROWS, 1). The body is gated_delta.cu; the Rust glue src/kernels/gated_delta.rs.
// recurrence_qkv (body gated_delta_qkv.cu, glue src/kernels/gated_delta_qkv.rs) takes the layer's conv output
// instead of q, k and v, and normalises q and k itself.

namespace tandem_gdn {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, off);
  }
  return x;
}

// One token's update of a warp's state row s (lane l holding elements l + 32 i) from its key and query
// elements kk, qq, the gate gt, the row's value vt and beta: returns y = S q (the same in every lane).
template <int PER>
__device__ __forceinline__ float token_step(float (&s)[PER], const float (&kk)[PER], const float (&qq)[PER],
                                            float gt, float vt, float betat) {
  float kv = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    s[i] = s[i] * gt;
    kv = fmaf(s[i], kk[i], kv);
  }
  kv = warp_sum(kv);
  const float delta = (vt - kv) * betat;
  float out = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    s[i] = fmaf(kk[i], delta, s[i]);
    out = fmaf(s[i], qq[i], out);
  }
  return warp_sum(out);
}

// L2 normalisation of a warp's row of DK = 32 PER elements, times scale [DK]: what MLX's rms_norm(x, scale,
// eps) computes in fp32 (x * rsqrt(mean(x^2) + eps) * scale), the squares summed in a fixed order (each lane
// its elements in turn, then the butterfly), so every warp that reads the row gets the same bits.
template <int PER>
__device__ __forceinline__ void normalise(float (&x)[PER], const float* scale, float eps, int lane) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    ss = fmaf(x[i], x[i], ss);
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(32 * PER) + eps);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    x[i] = (x[i] * r) * scale[lane + 32 * i];
  }
}

// Where a warp's state row lies: its batch b, value head h (and key head hk), value row dv, and the row's
// offset in the state; false for a thread past the last row.
struct Row {
  int b, h, hk, dv;
  size_t at, per_step;
};

template <int DV>
__device__ __forceinline__ bool locate(Row& r, int B, int HK, int HV, int DK) {
  r.dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z;  // b * HV + h
  if (r.dv >= DV || n >= B * HV) {
    return false;
  }
  r.b = n / HV, r.h = n % HV, r.hk = r.h / (HV / HK);
  r.at = (static_cast<size_t>(n) * DV + r.dv) * DK;
  r.per_step = static_cast<size_t>(B) * HV * DV * DK;
  return true;
}

// Token t's output and the state after it, stored.
template <int PER, int DV>
__device__ __forceinline__ void store_step(const float (&s)[PER], float out, const Row& r, size_t bt, int t,
                                           int HV, float* y, float* states) {
  const int lane = threadIdx.x;
  if (lane == 0) {
    y[(bt * HV + r.h) * DV + r.dv] = out;
  }
  float* st = states + t * r.per_step + r.at;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    st[lane + 32 * i] = s[i];
  }
}

template <int DK, int DV>
__device__ __forceinline__ void recurrence(const float* q, const float* k, const float* v, const float* g,
                                           const float* beta, const float* state, float* y, float* states,
                                           int B, int T, int HK, int HV) {
  static_assert(DK % 32 == 0 && DK <= 256, "DK: a multiple of 32, at most 256");
  constexpr int PER = DK / 32;
  const int lane = threadIdx.x;
  Row r;
  if (!locate<DV>(r, B, HK, HV, DK)) {
    return;
  }
  float s[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    s[i] = state[r.at + lane + 32 * i];
  }
  for (int t = 0; t < T; ++t) {
    const size_t bt = static_cast<size_t>(r.b) * T + t;
    const float* qt = q + (bt * HK + r.hk) * DK;
    const float* kt = k + (bt * HK + r.hk) * DK;
    float kk[PER], qq[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      kk[i] = kt[lane + 32 * i];
      qq[i] = qt[lane + 32 * i];
    }
    const float vt = v[(bt * HV + r.h) * DV + r.dv];
    const float out = token_step(s, kk, qq, g[bt * HV + r.h], vt, beta[bt * HV + r.h]);
    store_step<PER, DV>(s, out, r, bt, t, HV, y, states);
  }
}

// The same recurrence read straight from the causal conv's output qkv [B, T, 2 HK DK + HV DV] (the q, k and v
// channels in that order), with q and k L2-normalised here, each times its scale (qs [DK]: 1 / DK, which also
// takes q's 1 / sqrt(DK); ks [DK]: 1 / sqrt(DK)) under eps: the split, three reshapes and two norms a Gated
// DeltaNet layer otherwise runs as MLX operations before the recurrence, six launches a layer. A token's
// results still depend on that token's inputs and the state before it only.
template <int DK, int DV, int HK>
__device__ __forceinline__ void recurrence_qkv(const float* qkv, const float* qs, const float* ks, float eps,
                                               const float* g, const float* beta, const float* state, float* y,
                                               float* states, int B, int T, int HV) {
  static_assert(DK % 32 == 0 && DK <= 256, "DK: a multiple of 32, at most 256");
  constexpr int PER = DK / 32;
  const int lane = threadIdx.x;
  Row r;
  if (!locate<DV>(r, B, HK, HV, DK)) {
    return;
  }
  const size_t channels = static_cast<size_t>(2 * HK * DK) + static_cast<size_t>(HV) * DV;
  float s[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    s[i] = state[r.at + lane + 32 * i];
  }
  for (int t = 0; t < T; ++t) {
    const size_t bt = static_cast<size_t>(r.b) * T + t;
    const float* row = qkv + bt * channels;
    const float* qt = row + r.hk * DK;
    const float* kt = row + (HK + r.hk) * DK;
    float kk[PER], qq[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      kk[i] = kt[lane + 32 * i];
      qq[i] = qt[lane + 32 * i];
    }
    normalise(kk, ks, eps, lane);
    normalise(qq, qs, eps, lane);
    const float vt = row[2 * HK * DK + r.h * DV + r.dv];
    const float out = token_step(s, kk, qq, g[bt * HV + r.h], vt, beta[bt * HV + r.h]);
    store_step<PER, DV>(s, out, r, bt, t, HV, y, states);
  }
}

}  // namespace tandem_gdn
