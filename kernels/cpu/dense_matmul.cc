// y = x @ w^T on the CPU (dense_matmul.h). Plain C++ the compiler vectorizes: each output keeps eight
// fp32 partial sums (lane l takes elements l, l + 8, ...), added in one fixed tree, then the K tail; four
// weight rows share each pass over a row of x. Which rows share a pass depends on N only, so a row's bits
// never depend on M. On x86-64 Linux the hot loop is also built for x86-64-v3 (AVX2, FMA) and picked at
// load time (target_clones); arm64's NEON is its baseline.
#include "dense_matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "mlx/types/half_types.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define TANDEM_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TANDEM_CLONES
#endif
#define TANDEM_INLINE inline __attribute__((always_inline))

namespace tandem_kernels {
namespace {

constexpr int kLanes = 8;
constexpr int kRows = 4;

TANDEM_INLINE float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as MLX's bfloat16 does; a NaN stays a NaN.
TANDEM_INLINE uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t b) {
  mlx::core::float16_t h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

uint16_t f32_to_f16(float f) {
  mlx::core::float16_t h(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

TANDEM_INLINE float load(const float* p, int64_t i) {
  return p[i];
}
TANDEM_INLINE float load(const uint16_t* p, int64_t i) {
  return bf16_to_f32(p[i]);
}

// dots[r] = xr . w[r] for RR consecutive weight rows of k elements (f32, or bf16 bits).
template <int RR, class W>
TANDEM_INLINE void dots(const float* xr, const W* w, int64_t k, float* out) {
  float acc[RR][kLanes] = {};
  const int64_t kv = k - k % kLanes;
  for (int64_t c = 0; c < kv; c += kLanes) {
    for (int r = 0; r < RR; ++r) {
      for (int l = 0; l < kLanes; ++l) acc[r][l] += xr[c + l] * load(w + r * k, c + l);
    }
  }
  for (int r = 0; r < RR; ++r) {
    const float* a = acc[r];
    float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    for (int64_t c = kv; c < k; ++c) s += xr[c] * load(w + r * k, c);
    out[r] = s;
  }
}

// y (m x n, f32) = xf (m x k, f32) @ w^T for weight rows [j0, j1), w pointing at row j0. Rows of x go in blocks so a block
// stays in cache while every group of weight rows passes over it.
template <class W>
TANDEM_INLINE void rows(const float* xf, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                        int64_t j1) {
  constexpr int64_t kBlock = 16;
  for (int64_t i0 = 0; i0 < m; i0 += kBlock) {
    const int64_t i1 = std::min(m, i0 + kBlock);
    for (int64_t j = j0; j < j1; j += kRows) {
      const W* wj = w + (j - j0) * k;
      float d[kRows];
      for (int64_t i = i0; i < i1; ++i) {
        const float* xr = xf + i * k;
        switch (std::min<int64_t>(kRows, j1 - j)) {
          case 4: dots<4>(xr, wj, k, d); break;
          case 3: dots<3>(xr, wj, k, d); break;
          case 2: dots<2>(xr, wj, k, d); break;
          default: dots<1>(xr, wj, k, d); break;
        }
        for (int r = 0; r < kRows && j + r < j1; ++r) y[i * n + j + r] = d[r];
      }
    }
  }
}

TANDEM_CLONES void rows_f32(const float* xf, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                            int64_t j0, int64_t j1) {
  rows(xf, w, y, m, n, k, j0, j1);
}

TANDEM_CLONES void rows_bf16(const float* xf, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                             int64_t j0, int64_t j1) {
  rows(xf, w, y, m, n, k, j0, j1);
}

} // namespace

void dense_matmul_nt(Elem e, const void* x, const void* w, void* out, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  const int64_t mk = m * k, mn = m * n;
  // x in f32, once for every weight row; the products in f32 before one rounding to the output dtype.
  std::vector<float> xs, ys;
  const float* xf = static_cast<const float*>(x);
  float* y = static_cast<float*>(out);
  if (e != Elem::F32) {
    const auto* xb = static_cast<const uint16_t*>(x);
    xs.resize(mk);
    for (int64_t i = 0; i < mk; ++i) xs[i] = e == Elem::BF16 ? bf16_to_f32(xb[i]) : f16_to_f32(xb[i]);
    xf = xs.data();
    ys.resize(mn);
    y = ys.data();
  }
  switch (e) {
    case Elem::F32: rows_f32(xf, static_cast<const float*>(w), y, m, n, k, 0, n); break;
    case Elem::BF16: rows_bf16(xf, static_cast<const uint16_t*>(w), y, m, n, k, 0, n); break;
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
  if (e == Elem::F32) return;
  auto* o = static_cast<uint16_t*>(out);
  for (int64_t t = 0; t < mn; ++t) o[t] = e == Elem::BF16 ? f32_to_bf16(y[t]) : f32_to_f16(y[t]);
}

} // namespace tandem_kernels
