// The gated-delta recurrence on the CPU (gated_delta.h). Each state row is updated in its output slot: with
// every step's state kept, token t's rows are read from token t - 1's slot and written to their own.
#include "gated_delta.h"

#include <vector>

#include "elementwise.h"
#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

// One token's update of R consecutive state rows (R x DK, rows dv.. of one head), read from `prev` and written
// to `s` (the same rows in place, or the next step's slot): decay, the delta rule, and their outputs y[0..R).
// Two passes over the rows: the decayed rows are stored and dotted with k as they go, the updated rows stored and
// dotted with q. Each dot product is the matmul kernels' dots<R> arithmetic (eight lanes summing elements l, l +
// 8, ... in order, one tree, the tail), each element's decay and update the same products and sums: the bits of
// the separate passes (decay all, dot, update all, dot) this replaces, with a third of the loads and stores.
template <int R>
TANDEM_INLINE void step_rows(const float* prev, float* s, const float* kt, const float* qt, float gt,
                             const float* vt, float bt, float* yt, int64_t DK) {
  const int64_t kv = DK - DK % kLanes;
  const f8 gv = {gt, gt, gt, gt, gt, gt, gt, gt};
  f8 acc[R];
  zero<R>(acc);
  for (int64_t c = 0; c < kv; c += kLanes) {
    const f8 kc = load8(kt + c);
    for (int r = 0; r < R; ++r) {
      const f8 sv = load8(prev + r * DK + c) * gv;
      std::memcpy(s + r * DK + c, &sv, sizeof sv);
      acc[r] += kc * sv;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t c = kv; c < DK; ++c) s[r * DK + c] = prev[r * DK + c] * gt;
  }
  float kd[R];
  finish_all<R>(acc, kt, s, kv, DK, kd);
  f8 delta[R];
  for (int r = 0; r < R; ++r) {
    const float d = (vt[r] - kd[r]) * bt;
    delta[r] = f8{d, d, d, d, d, d, d, d};
  }
  zero<R>(acc);
  for (int64_t c = 0; c < kv; c += kLanes) {
    const f8 kc = load8(kt + c), qc = load8(qt + c);
    for (int r = 0; r < R; ++r) {
      const f8 sv = load8(s + r * DK + c) + kc * delta[r];
      std::memcpy(s + r * DK + c, &sv, sizeof sv);
      acc[r] += qc * sv;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t c = kv; c < DK; ++c) s[r * DK + c] = s[r * DK + c] + kt[c] * delta[r][0];
  }
  finish_all<R>(acc, qt, s, kv, DK, yt);
}

// Rows dv0 .. dv0 + R of head n (of B * HV) through every token.
template <int R>
TANDEM_INLINE void head_rows(const float* q, const float* k, const float* v, const float* g, const float* beta,
                             const float* state, float* y, float* states, int64_t n, int64_t dv0, int64_t T,
                             int64_t HK, int64_t HV, int64_t DK, int64_t DV, int64_t per_step, bool all_steps) {
  const int64_t b = n / HV, h = n % HV, hk = h / (HV / HK);
  const int64_t row = (n * DV + dv0) * DK;
  const float* prev = state + row;
  float* s = states + row;
  if (T == 0) std::memcpy(s, prev, R * DK * sizeof(float));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t bt = b * T + t;
    if (t > 0) {
      prev = s;
      if (all_steps) s += per_step;
    }
    const int64_t at = (bt * HV + h) * DV + dv0;
    step_rows<R>(prev, s, k + (bt * HK + hk) * DK, q + (bt * HK + hk) * DK, g[bt * HV + h], v + at,
                 beta[bt * HV + h], y + at, DK);
  }
}

TANDEM_CLONES void rows(const float* q, const float* k, const float* v, const float* g, const float* beta,
                        const float* state, float* y, float* states, int64_t B, int64_t T, int64_t HK,
                        int64_t HV, int64_t DK, int64_t DV, bool all_steps) {
  const int64_t per_step = B * HV * DV * DK;
  for (int64_t n = 0; n < B * HV; ++n) {
    int64_t dv = 0;
    for (; dv + 4 <= DV; dv += 4)
      head_rows<4>(q, k, v, g, beta, state, y, states, n, dv, T, HK, HV, DK, DV, per_step, all_steps);
    for (; dv < DV; ++dv)
      head_rows<1>(q, k, v, g, beta, state, y, states, n, dv, T, HK, HV, DK, DV, per_step, all_steps);
  }
}

} // namespace

void gated_delta(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 const float* state, float* y, float* states, int64_t B, int64_t T, int64_t HK, int64_t HV,
                 int64_t DK, int64_t DV, bool all_steps) {
  if (B <= 0 || HK <= 0 || HV <= 0 || DK <= 0 || DV <= 0 || (all_steps && T <= 0)) return;
  rows(q, k, v, g, beta, state, y, states, B, T, HK, HV, DK, DV, all_steps);
}

void gated_delta_qkv(const float* qkv, const float* qs, const float* ks, float eps, float inv_d, const float* g,
                     const float* beta, const float* state, float* y, float* states, int64_t B, int64_t T, int64_t HK,
                     int64_t HV, int64_t DK, int64_t DV) {
  if (B <= 0 || T <= 0 || HK <= 0 || HV <= 0 || DK <= 0 || DV <= 0) return;
  const int64_t kd = HK * DK, vd = HV * DV, channels = 2 * kd + vd;
  std::vector<float> q(B * T * kd), k(B * T * kd), v(B * T * vd);
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* row = qkv + bt * channels;
    rms_norm(Elem::F32, row, DK, qs, q.data() + bt * kd, HK, DK, eps, inv_d);
    rms_norm(Elem::F32, row + kd, DK, ks, k.data() + bt * kd, HK, DK, eps, inv_d);
    std::memcpy(v.data() + bt * vd, row + 2 * kd, vd * sizeof(float));
  }
  gated_delta(q.data(), k.data(), v.data(), g, beta, state, y, states, B, T, HK, HV, DK, DV, true);
}

} // namespace tandem_kernels
