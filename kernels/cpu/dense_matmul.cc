// y = x @ w^T on the CPU (dense_matmul.h), on matmul_core.h's dot products. On x86-64 Linux the hot loop is
// also built for x86-64-v3 (AVX2) and picked at load time (target_clones); arm64's NEON is its baseline.
#include "dense_matmul.h"

#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

// y (m x n, f32) = xf (m x k, f32) @ w^T for weight rows [j0, j1), w pointing at row j0. Rows of x go in
// blocks that stay in cache while every group of weight rows passes over them. For three rows or more, a
// bf16 group is widened to f32 once (in `wf`, 4 * k floats) rather than once per pair of rows: the same
// values, so the same bits, at a fraction of the conversions. Two rows (a two-stream batch's step, its
// drafts) widen in registers: storing and reloading the group for one pair cost more than converting it
// (4096 x 256: 39 -> 67 GFLOP/s alone; two plain streams of tandem-tiny +12 %, docs/PERF.md session 27).
template <class W>
TANDEM_INLINE void rows(const float* xf, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                        int64_t j1, float* wf) {
  constexpr int64_t kBlock = 16;
  for (int64_t i0 = 0; i0 < m; i0 += kBlock) {
    const int64_t i1 = std::min(m, i0 + kBlock);
    for (int64_t j = j0; j < j1; j += kRows) {
      const W* wj = w + (j - j0) * k;
      const int64_t rr = std::min<int64_t>(kRows, j1 - j);
      if constexpr (sizeof(W) == 2) {
        if (i1 - i0 > 2) {
          widen(wj, rr * k, wf);
          group_pass(xf, static_cast<const float*>(wf), y, i0, i1, n, k, j, rr);
          continue;
        }
      }
      group_pass(xf, wj, y, i0, i1, n, k, j, rr);
    }
  }
}

TANDEM_CLONES void rows_f32(const float* xf, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                            int64_t j0, int64_t j1) {
  rows(xf, w, y, m, n, k, j0, j1, nullptr);
}

TANDEM_CLONES void rows_bf16(const float* xf, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                             int64_t j0, int64_t j1, float* wf) {
  rows(xf, w, y, m, n, k, j0, j1, wf);
}

} // namespace

void dense_matmul_nt(Elem e, const void* x, const void* w, void* out, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  // x in f32, once for every weight row; the products in f32 before one rounding to the output dtype.
  std::vector<float> xs, ys;
  const float* xf = widen_rows(e, x, m * k, xs);
  float* y = f32_results(e, out, m * n, ys);
  switch (e) {
    case Elem::F32: rows_f32(xf, static_cast<const float*>(w), y, m, n, k, 0, n); break;
    case Elem::BF16: {
      std::vector<float> wf(m > 2 ? kRows * k : 0);
      rows_bf16(xf, static_cast<const uint16_t*>(w), y, m, n, k, 0, n, wf.data());
      break;
    }
    case Elem::F16: {
      // f16 has no cheap vector conversion everywhere: a group of weight rows at a time goes to f32 first.
      const auto* wh = static_cast<const uint16_t*>(w);
      constexpr int64_t kGroup = 64;
      std::vector<float> wf(kGroup * k);
      for (int64_t j = 0; j < n; j += kGroup) {
        const int64_t j1 = std::min(n, j + kGroup);
        for (int64_t t = 0; t < (j1 - j) * k; ++t) wf[t] = f16_to_f32(wh[j * k + t]);
        rows_f32(xf, wf.data(), y, m, n, k, j, j1);
      }
      break;
    }
  }
  store_rows(e, y, out, m * n);
}

} // namespace tandem_kernels
