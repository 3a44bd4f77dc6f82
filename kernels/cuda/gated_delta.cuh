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

namespace tandem_gdn {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, off);
  }
  return x;
}

template <int DK, int DV>
__device__ __forceinline__ void recurrence(const float* q, const float* k, const float* v, const float* g,
                                           const float* beta, const float* state, float* y, float* states,
                                           int B, int T, int HK, int HV) {
  static_assert(DK % 32 == 0 && DK <= 256, "DK: a multiple of 32, at most 256");
  constexpr int PER = DK / 32;
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z;  // b * HV + h
  if (dv >= DV || n >= B * HV) {
    return;
  }
  const int b = n / HV, h = n % HV, hk = h / (HV / HK);
  const size_t row = (static_cast<size_t>(n) * DV + dv) * DK;
  const size_t per_step = static_cast<size_t>(B) * HV * DV * DK;

  float s[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    s[i] = state[row + lane + 32 * i];
  }
  for (int t = 0; t < T; ++t) {
    const size_t bt = static_cast<size_t>(b) * T + t;
    const float* qt = q + (bt * HK + hk) * DK;
    const float* kt = k + (bt * HK + hk) * DK;
    const float gt = g[bt * HV + h];
    const float betat = beta[bt * HV + h];
    const float vt = v[(bt * HV + h) * DV + dv];
    float kk[PER];
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      kk[i] = kt[lane + 32 * i];
      s[i] = s[i] * gt;
      kv = fmaf(s[i], kk[i], kv);
    }
    kv = warp_sum(kv);
    const float delta = (vt - kv) * betat;
    float out = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      s[i] = fmaf(kk[i], delta, s[i]);
      out = fmaf(s[i], qt[lane + 32 * i], out);
    }
    out = warp_sum(out);
    if (lane == 0) {
      y[(bt * HV + h) * DV + dv] = out;
    }
    float* st = states + t * per_step + row;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      st[lane + 32 * i] = s[i];
    }
  }
}

}  // namespace tandem_gdn
