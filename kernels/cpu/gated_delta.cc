// The gated-delta recurrence on the CPU (gated_delta.h). Each state row is updated in its output slot: with
// every step's state kept, token t's row starts as a copy of token t - 1's.
#include "gated_delta.h"

#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

// One token's update of R consecutive state rows s (R x DK, rows dv.. of one head): decay, the delta rule,
// and their outputs y[0..R). The R rows go through each stage together, so their dot products with k and q
// run as one pass of the matmul kernels' dots<R> (each row's dot in their fixed order: eight lanes, one
// tree, the tail; the same bits as a row alone, where one row's chain of dependent adds was the cost).
template <int R>
TANDEM_INLINE void step_rows(float* s, const float* kt, const float* qt, float gt, const float* vt, float bt,
                             float* yt, int64_t DK) {
  for (int64_t i = 0; i < R * DK; ++i) s[i] = s[i] * gt;
  float kd[R];
  dots<R>(kt, s, DK, kd);
  for (int r = 0; r < R; ++r) {
    const float delta = (vt[r] - kd[r]) * bt;
    float* sr = s + r * DK;
    for (int64_t i = 0; i < DK; ++i) sr[i] = sr[i] + kt[i] * delta;
  }
  dots<R>(qt, s, DK, yt);
}

// Rows dv0 .. dv0 + R of head n (of B * HV) through every token.
template <int R>
TANDEM_INLINE void head_rows(const float* q, const float* k, const float* v, const float* g, const float* beta,
                             const float* state, float* y, float* states, int64_t n, int64_t dv0, int64_t T,
                             int64_t HK, int64_t HV, int64_t DK, int64_t DV, int64_t per_step, bool all_steps) {
  const int64_t b = n / HV, h = n % HV, hk = h / (HV / HK);
  const int64_t row = (n * DV + dv0) * DK;
  float* s = states + row;
  std::memcpy(s, state + row, R * DK * sizeof(float));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t bt = b * T + t;
    if (all_steps && t > 0) {
      float* next = s + per_step;
      std::memcpy(next, s, R * DK * sizeof(float));
      s = next;
    }
    const int64_t at = (bt * HV + h) * DV + dv0;
    step_rows<R>(s, k + (bt * HK + hk) * DK, q + (bt * HK + hk) * DK, g[bt * HV + h], v + at, beta[bt * HV + h],
                 y + at, DK);
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

} // namespace tandem_kernels
