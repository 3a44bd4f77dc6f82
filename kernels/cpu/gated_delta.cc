// The gated-delta recurrence on the CPU (gated_delta.h). Each state row is updated in its output slot: with
// every step's state kept, token t's row starts as a copy of token t - 1's.
#include "gated_delta.h"

#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

// a . b in the matmul kernels' fixed order (eight lanes, one tree, the tail).
TANDEM_INLINE float dot(const float* a, const float* b, int64_t n) {
  float out;
  dots<1>(a, b, n, &out);
  return out;
}

TANDEM_CLONES void rows(const float* q, const float* k, const float* v, const float* g, const float* beta,
                        const float* state, float* y, float* states, int64_t B, int64_t T, int64_t HK,
                        int64_t HV, int64_t DK, int64_t DV, bool all_steps) {
  const int64_t per_step = B * HV * DV * DK;
  const int64_t group = HV / HK;
  for (int64_t n = 0; n < B * HV; ++n) {
    const int64_t b = n / HV, h = n % HV, hk = h / group;
    for (int64_t dv = 0; dv < DV; ++dv) {
      const int64_t row = (n * DV + dv) * DK;
      float* s = states + row;
      std::memcpy(s, state + row, DK * sizeof(float));
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bt = b * T + t;
        if (all_steps && t > 0) {
          float* next = s + per_step;
          std::memcpy(next, s, DK * sizeof(float));
          s = next;
        }
        const float* kt = k + (bt * HK + hk) * DK;
        const float* qt = q + (bt * HK + hk) * DK;
        const float gt = g[bt * HV + h];
        for (int64_t i = 0; i < DK; ++i) s[i] = s[i] * gt;
        const float delta = (v[(bt * HV + h) * DV + dv] - dot(s, kt, DK)) * beta[bt * HV + h];
        for (int64_t i = 0; i < DK; ++i) s[i] = s[i] + kt[i] * delta;
        y[(bt * HV + h) * DV + dv] = dot(s, qt, DK);
      }
    }
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
